import OutboxEnqueue
import OutboxModel
import OutboxStore

/// Claiming: reading due entries ahead, letting the scheduler decide, and carrying out
/// its decisions (start, hold, expire, drop, wait for Wi-Fi, refuse a changed file).
extension Runner {
    /// Another process committed (enqueue, cancel, pause, headers update): what was read
    /// ahead may be stale, and the pauses and header generation may have moved.
    func noticeOtherWriters() throws(OutboxError) {
        let version = try store.dataVersion()
        guard version != seenDataVersion else { return }
        // The first read is the state the run starts in, not a change to report.
        let firstRead = seenDataVersion == nil
        seenDataVersion = version
        readAhead.discard()
        delivery.due = true
        let before = control
        control = try store.control()
        if !firstRead, before != control, eventsEnabled || progressDisplay != nil {
            try reportControlChanges(from: before)
        }
        try dropWithdrawnStandby(wifiOnlySince: !before.wifiOnly && control.wifiOnly)
        if before.headerGeneration != control.headerGeneration { try takeUpdatedHeaders() }
    }

    /// A `headers update` reaches the entries this runner holds: what they send next (a chunked
    /// upload's later parts) carries the headers the store merged. What is in flight keeps its
    /// own (`Flight.headerGeneration`): a 401 to them is sent again, not parked.
    func takeUpdatedHeaders() throws(OutboxError) {
        for (id, held) in flights.running where held.headerGeneration < control.headerGeneration {
            guard let stored = try store.entry(id: id), stored.generation == held.generation else { continue }
            flights.running[id]?.request.headers = stored.request.headers
            flights.running[id]?.headerGeneration = stored.headerGeneration
            guard var job = flights.partJobs[id] else { continue }
            let merged = Dictionary(try store.parts(entrySeq: stored.seq).map { ($0.index, $0.headers) }, uniquingKeysWith: { a, _ in a })
            for i in job.parts.indices { if let headers = merged[job.parts[i].index] { job.parts[i].headers = headers } }
            job.entry.request.headers = stored.request.headers
            job.entry.headerGeneration = stored.headerGeneration
            flights.partJobs[id] = job
            log("outbox: \(id): its next parts carry the updated headers", level: .debug, fields: [("id", .string(id))])
        }
    }

    /// A pause or resume by another process shows in the event stream: one state event for
    /// each queued entry it holds or releases (`paused`, or `queued` again).
    func reportControlChanges(from before: QueueControl) throws(OutboxError) {
        if before.headerGeneration != control.headerGeneration { try reportHeadersUpdate() }
        var keys: Set<String>?
        if before.queuePaused == control.queuePaused {
            keys = before.pausedKeys.symmetricDifference(control.pausedKeys)
            guard !keys!.isEmpty else { return }
        }
        for entry in try store.list(ListFilter(state: EntryState.queued.rawValue)) where keys?.contains(entry.key) ?? true {
            let wasPaused = before.isPaused(key: entry.key)
            let isPaused = control.isPaused(key: entry.key)
            guard wasPaused != isPaused else { continue }
            emitState(entry, state: isPaused ? .paused : .queued, reason: isPaused ? "paused" : "resumed")
        }
    }

    /// Entries the last header update took out of awaiting-auth are queued again: one state
    /// event each.
    func reportHeadersUpdate() throws(OutboxError) {
        guard eventsEnabled || progressDisplay != nil else { return }
        for entry in try store.list(ListFilter(state: EntryState.queued.rawValue))
        where entry.reason == headersUpdatedReason && entry.headerGeneration == control.headerGeneration {
            emitState(entry, state: .queued, reason: headersUpdatedReason)
        }
    }

    /// What another process did to entries this runner holds. A cancelled one (its row is
    /// gone) stops at once: its transfer or parts in flight are aborted, and it is reported
    /// cancelled, with no outcome and no hook. A standby request that would no longer go as it
    /// was built is withdrawn and its entry goes back to the queue, to be built again: its key
    /// or queue was paused, `wifi-only` was turned on, the headers were updated, or a same-body
    /// enqueue gave it new vars (its headers may render from them). Transfers already sending finish.
    func dropWithdrawnStandby(wifiOnlySince: Bool = false) throws(OutboxError) {
        guard !flights.running.isEmpty else { return }
        let held = Array(flights.running.values)
        let current = try store.runningGenerations(seqs: held.map(\.seq))
        // A same-body enqueue of a running entry gives it new vars: its outcome and follow-ups use them.
        let vars = try store.currentVars(seqs: held.filter { current[$0.seq] == $0.generation }.map(\.seq))
        var newVars = Set<String>()
        for entry in held where vars[entry.seq].map({ $0 != entry.vars }) == true {
            flights.running[entry.id]?.vars = vars[entry.seq]!
            newVars.insert(entry.id)
        }
        let standbyByEntry = Dictionary(flights.standby.map { ($0.value.entryID, $0.key) }, uniquingKeysWith: { first, _ in first })
        for entry in held {
            if current[entry.seq] != entry.generation {
                guard flights.withdrawn[entry.id] == nil, flights.partJobs[entry.id]?.failed != true else { continue }
                if flights.pluginWaits[entry.id] != nil {
                    // Its request is over and a plugin works on its outcome: killed, and nothing is settled.
                    if !lostToAnotherRunner(entry) { reportCancelled(entry) }
                    stopPlugin(entry.id)
                    continue
                }
                if lostToAnotherRunner(entry) {
                    // Not cancelled: its lease ran out and another runner requeued, took or
                    // settled it (the renewal says so in the log).
                    stopLost(entry)
                    continue
                }
                reportCancelled(entry)
                if entry.isChunked {
                    stopParts(entry.id)
                    releaseStoppedParts(entry.id)
                } else {
                    flights.withdrawn[entry.id] = false
                    for flight in flights.byToken.values where flight.entryID == entry.id { http?.cancel(flight.transferID) }
                }
            } else if let transferID = standbyByEntry[entry.id],
                control.isPaused(key: entry.key) || entry.headerGeneration < control.headerGeneration || newVars.contains(entry.id)
                    || (wifiOnlySince && entry.request.wifiOnly == nil)
            {
                flights.withdrawn[entry.id] = true
                // Only if it has not started: one the curl thread began meanwhile finishes and settles.
                http?.withdraw(transferID)
            }
        }
    }

    /// Reads due entries ahead when fewer than `capacity` are at hand. Entries the runner
    /// holds or has read already are left out (a claim is committed at the end of its turn,
    /// so a held entry may still look queued in the store).
    func fillReadAhead(capacity: Int, now: Int64) throws(OutboxError) {
        let mono = Identifiers.monotonicMs()
        guard readAhead.ready.count < capacity, readAhead.mayFindMore(now: now, mono: mono, ownWrites: store.ownWrites) else { return }
        Fault.point("run.read-ahead")
        readAhead.readAt = mono
        let want = max(capacity + 2, min(256, scheduler.limits.concurrency * 4))
        var excluded = Set(flights.running.keys)
        for entry in readAhead.ready { excluded.insert(entry.id) }
        // Runners that all took the oldest entries would mostly claim the same ones: on a
        // shared store each reads a wider window and takes it in its own random order (a
        // scope has one due entry at a time, so its order holds; overall order roughly).
        let window = store.sharesRunners ? want * 4 : want
        let from = store.sharesRunners ? 0 : readAhead.startSeq(now: now, ownWrites: store.ownWrites)
        var more = try store.dueEntries(now: now, limit: window, excluding: excluded, horizon: drainHorizon, fromSeq: from)
        if more.count < window, from > 0 {
            // Short from the floor: the queue is read whole before it counts as exhausted (the
            // store did not change: what is known of its due times stays).
            readAhead.dropFloor()
            more = try store.dueEntries(now: now, limit: window, excluding: excluded, horizon: drainHorizon, fromSeq: 0)
        }
        readAhead.exhausted = more.count < window
        if readAhead.exhausted {
            readAhead.waitEnd = try store.nextWaitEnd(after: now)
            readAhead.ownWritesAtRead = store.ownWrites
        } else if !store.sharesRunners, let first = more.first {
            // Other runners' claims and settles commit quietly: the floor is for a sole runner.
            readAhead.setFloor(first.seq, waitEnd: try store.nextWaitEnd(after: now), ownWrites: store.ownWrites)
        }
        readAhead.ready += store.sharesRunners ? more.shuffled() : more
    }

    /// Claims due entries: into free slots first, then as standby transfers that the curl
    /// thread starts the moment a slot frees (at most `limits.standby` of them), so a finished
    /// request is followed at once, without a round trip through this thread.
    func claim(now: Int64) throws(OutboxError) {
        promoteStandby()
        returnStaleStandby()
        var slots = flights.currentSlots
        let capacity = scheduler.limits.concurrency + scheduler.limits.standby - slots.entriesInFlight - slots.standby
        guard capacity > 0 else { return }
        try fillReadAhead(capacity: capacity, now: now)
        guard !readAhead.ready.isEmpty else { return }
        var checks = ClaimChecks(now: now, control: control, currentAccount: account, busyScopes: flights.busyScopes)
        checks.onWifi = { [self] in isOnWifi(now: now) }
        checks.wifiRecheckAt = wifiGate.nextCheck(now: now)
        checks.heldHosts = hostHealth.held
        checks.payloadProblem = { [self] in Self.checkedWhenOpened($0) ? nil : payloadProblem($0) }
        checks.standbyAllowed = Identifiers.monotonicMs() >= standbyHeldUntil
        let plan = scheduler.claims(readAhead.ready, slots: &slots, checks: checks)
        flights.slots.hostLoad = slots.hostLoad
        flights.slots.hostStandby = slots.hostStandby
        var claimed: [(entry: Entry, host: String, standby: Bool)] = []
        for (position, decision) in plan.decisions {
            let entry = readAhead.ready[position]
            switch decision {
            case let .start(host, standby):
                claimed.append((entry, host, standby))
            case .hold, .paused:
                break
            case .expire:
                settleError(
                    entry, kind: .expired, message: OutcomePayloads.expiredMessage(attempts: entry.attempts, lastReason: entry.reason),
                    state: .error, reason: "expired")
            case let .dropOtherAccount(current):
                log(
                    "outbox: dropped \(entry.id): enqueued by account \(entry.account ?? ""), not the current account \(current)",
                    level: .warn, fields: [("id", .string(entry.id))])
                changes.append(.drop(entryID: entry.id, reason: "other-account"))
                emitState(entry, state: .cancelled, reason: "other-account")
                summary.cancelled += 1
            case let .holdBack(reason, until):
                // Until the next Wi-Fi check, not a fixed delay.
                let at = reason == .wifi ? wifiGate.nextCheck(now: now) : until
                changes.append(.hold(entryID: entry.id, until: max(at, now + 1), reason: reason))
            case let .fileProblem(problem):
                settleError(entry, kind: .file, message: problem, state: .error, reason: "file")
            }
        }
        readAhead.dropLeavers(taken: plan.taken, held: plan.held)
        guard !claimed.isEmpty else { return }
        if store.sharesRunners {
            claimed = try commitClaims(claimed, now: now)
        } else {
            // Committed with this turn's other changes: a crash before the commit leaves them
            // queued, after it `running`, and either way the next runner sends them again.
            changes.append(.markRunning(entrySeqs: claimed.map(\.entry.seq), lease: lease))
        }
        for (claimedEntry, host, isStandby) in claimed {
            var entry = claimedEntry
            entry.state = .running
            flights.running[entry.id] = entry
            // Queued again by a header update that committed after this turn's look at other
            // writers: the next look finds it running, so its queued event is said here.
            if claimedEntry.reason == headersUpdatedReason, claimedEntry.headerGeneration > control.headerGeneration {
                emitState(claimedEntry, state: .queued, reason: headersUpdatedReason)
            }
            emitState(entry, state: .running, reason: nil)
            if entry.isChunked {
                var job = PartJob(parts: try Self.checkedParts(try store.parts(entrySeq: entry.seq), of: entry), entry: entry)
                if entry.request.s3 != nil { job.s3UploadID = try store.s3UploadID(entrySeq: entry.seq) }
                flights.partJobs[entry.id] = job
            } else {
                startTransfer(entry, part: nil, host: host, standby: isStandby)
            }
        }
    }

    /// The parts of a chunked entry as stored, when they still tile its file in index order:
    /// a row lost or edited by hand would send other bytes than the file's, or none, and
    /// complete the entry (its moved file then forgotten).
    static func checkedParts(_ parts: [StoredPart], of entry: Entry) throws(OutboxError) -> [StoredPart] {
        let problem =
            parts.map(\.index) != Array(parts.indices)
            ? "are not numbered 0 to \(parts.count - 1)"
            : ChunkPlan.tilingProblem(parts.map(\.range), size: entry.totalBytes).map { "do not tile the file: \($0)" }
        guard let problem else { return parts }
        throw .storage("the stored entry \(entry.id) is damaged: its parts \(problem); `outbox cancel \(entry.id)` removes that entry")
    }

    /// On a store several runners share, the claim commits before any transfer starts: only
    /// the entries it got go on (as the store has them now); the slots the scheduler gave
    /// the others are handed back.
    func commitClaims(
        _ chosen: [(entry: Entry, host: String, standby: Bool)], now: Int64
    ) throws(OutboxError) -> [(entry: Entry, host: String, standby: Bool)] {
        let got = try store.claim(chosen.map(\.entry), lease: lease, now: now)
        Fault.point("run.claimed")
        let fresh = Dictionary(got.map { ($0.seq, $0) }, uniquingKeysWith: { first, _ in first })
        var kept: [(entry: Entry, host: String, standby: Bool)] = []
        for (entry, host, standby) in chosen {
            if let current = fresh[entry.seq] {
                kept.append((current, host, standby))
            } else if standby {
                flights.slots.hostStandby[host, default: 1] -= 1
            } else if !entry.isChunked {
                flights.slots.hostLoad[host, default: 1] -= 1
            }
        }
        if kept.count < chosen.count { contended = true }
        return kept
    }

    /// Free slots go first to standby transfers, oldest first, within per_host.
    func promoteStandby() {
        guard !flights.standby.isEmpty else { return }
        var slots = flights.currentSlots
        // A withdrawn one is on its way back to the queue (the curl thread starts promotions first).
        let waiting: [(transferID: UInt64, host: String)] = flights.standby.compactMap { transferID, transfer in
            flights.withdrawn[transfer.entryID] == nil ? (transferID, transfer.host) : nil
        }
        for transferID in scheduler.promotions(waiting, slots: &slots) {
            standbyStarted(transferID)
            http?.promote(transferID)
        }
    }

    /// On a store several runners share, a standby claim that waited a second for this
    /// runner's busy slots goes back to the queue for an idle runner, and this one claims
    /// no standby for a second (it would take the same entries again).
    func returnStaleStandby() {
        guard store.sharesRunners, !flights.standby.isEmpty else { return }
        let mono = Identifiers.monotonicMs()
        for (transferID, transfer) in flights.standby {
            guard let flight = flights.byToken[transfer.token], mono - flight.standbySince >= Self.standbyWaitMs,
                flights.withdrawn[flight.entryID] == nil
            else { continue }
            flights.withdrawn[flight.entryID] = true
            http?.withdraw(transferID)
            standbyHeldUntil = mono + Self.standbyWaitMs
            if let entry = flights.running[flight.entryID] { emitState(entry, state: .queued, reason: "returned") }
        }
    }

    static let standbyWaitMs: Int64 = 1_000

    /// A standby transfer started (promoted here, or by the curl thread in a slot that freed).
    func standbyStarted(_ transferID: UInt64) {
        guard let transfer = flights.standby.removeValue(forKey: transferID) else { return }
        let host = transfer.host
        flights.byToken[transfer.token]?.standby = false
        flights.slots.hostStandby[host, default: 1] -= 1
        flights.slots.hostLoad[host, default: 0] += 1
    }

    /// Whether this host is on Wi-Fi, as last checked (at most once per `wifi_interval`). The
    /// built-in check (a wireless interface that is up) is read here; the configured plugin
    /// runs beside this thread (`nmcli` may take seconds), and its answer comes as an event.
    func isOnWifi(now: Int64) -> Bool {
        guard let command = config.wifiCheck else { return wifiGate.isOnWifi(now: now, check: Self.wirelessInterfaceIsUp) }
        return wifiGate.isOnWifi(
            now: now,
            startingCheck: {
                let (config, environment, mailbox) = (config, environment, mailbox)
                runBeside(cancelled: Locked(false)) { heartbeat in
                    Result { () throws(OutboxError) in
                        try Plugin.check(
                            command, name: "network.wifi_check", config: config, environment: environment, heartbeat: heartbeat)
                    }
                } done: { answer, abandoned in
                    mailbox.post(.wifiChecked(answer, abandoned: abandoned))
                }
            })
    }

    /// The Wi-Fi check plugin's answer. One that gives none (cannot start, times out) counts as
    /// off Wi-Fi, and is logged once until it answers again. On Wi-Fi, the entries held for it go
    /// at once.
    func wifiChecked(_ answer: Result<Bool, OutboxError>, abandoned: Bool) throws(OutboxError) {
        let now = Identifiers.nowMs()
        var on = false
        switch answer {
        case let .success(value):
            on = value
            wifiCheckProblem = nil
        case let .failure(error):
            if !abandoned, wifiCheckProblem != error.message {
                log("outbox: \(error.message); wifi-only entries wait as if off Wi-Fi", level: .warn)
            }
            wifiCheckProblem = error.message
        }
        wifiGate.answered(on, now: now)
        guard on else { return }
        try store.releaseHolds(now: now, reasons: [.wifi])
        readAhead.discard()
    }

    /// The built-in Wi-Fi check: a wireless interface that is up.
    static func wirelessInterfaceIsUp() -> Bool {
        for name in Paths.list("/sys/class/net") ?? [] where Paths.isDirectory("/sys/class/net/\(name)/wireless") {
            if Paths.readText("/sys/class/net/\(name)/operstate")?.trimmingSpaces == "up" { return true }
        }
        return false
    }

    /// The identity a referenced file had at enqueue, which it must keep until it is sent.
    static func expectedFile(_ entry: Entry) -> FileIdentity? {
        entry.request.ownership == .reference ? entry.request.file : nil
    }

    /// Whether the curl thread's check as it opens the body file is the whole check before
    /// sending: a referenced file sent whole, opened with the identity it had at enqueue. Its
    /// path is not looked up here as well (a lookup a file); a problem found there settles
    /// the same error, with no attempt counted.
    static func checkedWhenOpened(_ entry: Entry) -> Bool {
        guard case .file = entry.body, entry.request.s3?.skipExisting != true else { return false }
        return expectedFile(entry) != nil
    }

    /// Whether the entry's file must keep its identity until sent (`identityToKeep`): checked
    /// again once its last byte is sent, as it may have changed while it was read.
    static func keepsFileIdentity(_ entry: Entry) -> Bool {
        entry.request.ownership == .reference || entry.request.ownership == .move
    }

    /// The identity `file` must keep until it is sent: a referenced file's, and a moved file's
    /// when the move was a rename (the same inode): a program that still holds it open (a log
    /// being written) would change the bytes the store holds, and what it wrote after enqueue
    /// would go with the staged file once sent. A file copied in is the store's own.
    static func identityToKeep(_ entry: Entry, file: String, inode: UInt64) -> FileIdentity? {
        guard let identity = entry.request.file, file == entry.bodyFile else { return nil }
        switch entry.request.ownership {
        case .reference: return identity
        case .move: return identity.inode == inode ? identity : nil
        case .copy, nil: return nil
        }
    }

    /// Why an entry's bytes cannot be sent (staged file gone, referenced or moved file
    /// changed), or nil. After a transfer, `bodyFileAtEnd` is the body file it read from as
    /// it ended: the bytes sent came from that file, whatever its path names by now.
    func payloadProblem(_ entry: Entry, bodyFileAtEnd: FileInfo? = nil) -> String? {
        for file in entry.body.files {
            guard let info = (file == entry.bodyFile ? bodyFileAtEnd : nil) ?? FileInfo.stat(file) else {
                let referenced = entry.request.ownership == .reference && file == entry.bodyFile
                return referenced ? FileIdentity.missing(file) : "the staged payload \(file) is missing"
            }
            if let expected = Self.identityToKeep(entry, file: file, inode: info.inode),
                !expected.matches(size: info.size, mtimeNs: info.mtimeNs, inode: info.inode)
            {
                return entry.request.ownership == .move
                    ? FileIdentity.writtenAfterMove(file, source: expected.path) : FileIdentity.changed(file)
            }
            // The store's own copy has the size enqueued; parts read ranges and would not see it.
            if file == entry.bodyFile, entry.request.ownership != .reference, let size = entry.request.file?.size, info.size != size {
                return "the staged payload \(file) has \(info.size) bytes, not the \(size) enqueued"
            }
        }
        return nil
    }
}
