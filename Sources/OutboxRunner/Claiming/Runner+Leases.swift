import OutboxModel
import OutboxProcess
import OutboxStore

/// Leases on a store several runners share: this runner's claims are renewed every third
/// of the lease, and any runner puts back the entries of runners whose lease ran out.
extension Runner {
    /// Renews this runner's leases and requeues expired ones when a third of the lease has
    /// passed since the last time (by the monotonic clock). An entry whose renewal fails is
    /// another runner's now: it is stopped here and its result is never recorded.
    func keepLeases() throws(OutboxError) {
        guard store.sharesRunners else { return }
        if try renewLeasesIfDue() {
            let requeued = try store.requeueAbandoned(lease: lease, now: Identifiers.nowMs())
            if requeued > 0 {
                log("outbox: put \(requeued) entr\(requeued == 1 ? "y" : "ies") whose runner's lease ran out back in the queue")
                readAhead.discard()
            }
        }
        let lost = leasesLost
        leasesLost = []
        for id in lost.sorted() {
            if cancelledWhileHeld.remove(id) != nil {
                // Reported once: the turn's look at running entries may have seen the cancel first.
                guard flights.withdrawn[id] == nil, let entry = flights.running[id] else { continue }
                log("outbox: \(id) was cancelled while it was being sent; its transfer is stopped", fields: [("id", .string(id))])
                stopLost(entry)
                reportCancelled(entry)
                continue
            }
            log(
                "outbox: lost the lease on \(id) (another runner may send it); its transfer is stopped and its result not recorded",
                level: .warn, fields: [("id", .string(id))])
            if let entry = flights.running[id] { stopLost(entry) }
        }
    }

    /// Looks once a second whether the runner lock is still this runner's (its file can be
    /// removed from outside); taken again, it is logged; taken by another runner, this run ends.
    func keepRunnerLock() throws(OutboxError) {
        let mono = Identifiers.monotonicMs()
        guard let runnerLock, mono >= nextLockCheck else { return }
        nextLockCheck = mono + 1_000
        if try runnerLock.keep() {
            log("outbox: the store's runner.lock was removed; this runner locked it again", level: .warn)
        }
    }

    /// Renews every claim of this runner once a third of the lease has passed since the last
    /// renewal; entries whose renewal failed join `leasesLost`. Returns whether it renewed.
    func renewLeasesIfDue() throws(OutboxError) -> Bool {
        let mono = Identifiers.monotonicMs()
        guard mono >= nextLeaseTick else { return false }
        // Looked at before renewing: a runner stopped past its lease finds its claims gone.
        let ranOut = leasesRanOut
        let lost = try store.renewLeases(lease)
        for id in lost {
            // Gone while this runner's lease held: another process cancelled it (a row that
            // does not read back is there, not gone).
            let gone = !ranOut && ((try? store.entry(id: id) == nil) ?? false)
            if gone { cancelledWhileHeld.insert(id) } else { leaseLostIDs.insert(id) }
        }
        leasesLost.formUnion(lost)
        nextLeaseTick = mono + max(lease.durationMs / 3, 1)
        leasesRenewedAt = mono
        return true
    }

    /// Whether an entry this runner held, and can no longer settle, was taken from it rather
    /// than cancelled: its row (same generation) is another runner's now, or it went after
    /// this runner's lease ran out (another runner may have sent and settled it).
    func lostToAnotherRunner(_ entry: Entry) -> Bool {
        guard store.sharesRunners else { return false }
        let lost = leaseLostIDs.remove(entry.id) != nil
        guard let now = (try? store.entry(id: entry.id)) ?? nil else { return lost || leasesRanOut }
        return now.generation == entry.generation
    }

    /// Whether this runner went a whole lease without renewing (stopped, or starved of CPU):
    /// then an entry it held that is gone may have been sent and settled by another runner.
    var leasesRanOut: Bool { Identifiers.monotonicMs() - leasesRenewedAt >= lease.durationMs }

    /// What the control thread keeps doing while it waits for a plugin (a response parser, a
    /// Wi-Fi check, an auth refresh, a follow-up's headers command): renewing its leases on a
    /// shared store, so that a plugin slower than the lease does not hand this runner's entries
    /// to another runner, and heeding stop requests, so that a stop that must take effect at once
    /// does not wait for the plugin. Nothing else is touched mid-turn: lost entries are stopped
    /// at the next turn. Made on the control thread, it beats only there.
    func pluginHeartbeat() -> Heartbeat {
        let renews = store.sharesRunners
        return Heartbeat(
            everyMs: renews ? max(lease.durationMs / 6, 1) : Int64(Int32.max),
            abandon: { [unowned self] in pluginMustStop() },
            beat: { [unowned self] in if renews { _ = try? renewLeasesIfDue() } })
    }

    /// Whether the plugin this thread waits for must be killed now: the run is stopping at
    /// once (a second signal, or the grace is over). What the plugin was for is not settled:
    /// `settle` keeps the entry, and the run's end puts it back in the queue.
    func pluginMustStop() -> Bool {
        stepShutdown()
        guard shutdown.phase == .aborting else { return false }
        pluginsAbandoned += 1
        return true
    }

    /// Stops an entry whose claim is gone: its transfers or parts are aborted and their
    /// results dropped, as for an entry another process cancelled, without reporting one.
    func stopLost(_ entry: Entry) {
        if stopPlugin(entry.id) { return }
        if entry.isChunked {
            stopParts(entry.id)
            releaseStoppedParts(entry.id)
            return
        }
        let flying = flights.byToken.values.filter { $0.entryID == entry.id }
        guard !flying.isEmpty else {
            flights.running[entry.id] = nil
            return
        }
        flights.withdrawn[entry.id] = false
        for flight in flying { http?.cancel(flight.transferID) }
    }
}
