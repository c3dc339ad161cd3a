import OutboxEnqueue
import OutboxModel
import OutboxStore

extension Runner {
    /// Runs `auth_refresh_command` when entries are parked awaiting-auth: it gets
    /// `{"entries": [{id, key}]}` and prints a header patch, applied like `outbox headers update`
    /// (which resumes the parked entries). At most once a minute, so a server that keeps
    /// refusing cannot turn it into a loop. It runs beside this thread (the auth server may be
    /// slow): the queue goes on meanwhile, and `authRefreshed` applies its answer.
    func refreshAuthIfNeeded(now: Int64) throws(OutboxError) {
        guard let command = config.authRefreshCommand, !authRefreshRunning, now - lastAuthRefresh >= 60_000 else { return }
        // Entries this turn parked are committed first, so the command hears of them too.
        if changes.contains(where: { if case .park = $0 { true } else { false } }) { try flush(now: now) }
        let parked = try store.list(ListFilter(state: EntryState.awaitingAuth.rawValue))
        guard !parked.isEmpty else { return }
        lastAuthRefresh = now
        authRefreshRunning = true
        let input = JSON.object([("entries", .array(parked.map { .object([("id", .string($0.id)), ("key", .string($0.key))]) }))])
        let (config, environment, mailbox) = (config, environment, mailbox)
        runBeside(cancelled: Locked(false)) { heartbeat in
            Result { () throws(OutboxError) in
                try Plugin.runJSON(
                    command, input: input, name: "auth_refresh_command", config: config, environment: environment, heartbeat: heartbeat)
            }
        } done: { answer, abandoned in
            mailbox.post(.authRefreshed(answer, abandoned: abandoned))
        }
    }

    /// The answer of `auth_refresh_command`: its header patch is applied, and the parked
    /// entries go back in the queue with it.
    func authRefreshed(_ answer: Result<JSON, OutboxError>, abandoned: Bool) throws(OutboxError) {
        authRefreshRunning = false
        // Killed by a stop at once: the next run refreshes.
        guard !abandoned else { return }
        let now = Identifiers.nowMs()
        let patch: JSON
        switch answer {
        case let .success(value): patch = value
        case let .failure(error):
            log("outbox: \(error.message); the entries awaiting-auth stay so", level: .warn)
            return
        }
        let headers: [(String, String)]
        do {
            headers = try HeaderRules.fromPlugin(patch, plugin: "auth_refresh_command", patch: true)
        } catch {
            log("outbox: \(error.message); entries stay awaiting-auth", level: .warn)
            return
        }
        guard !headers.isEmpty else {
            log("outbox: auth_refresh_command printed no headers; entries stay awaiting-auth", level: .warn)
            return
        }
        // Entries parked meanwhile are committed first: the update resumes them with the
        // others (committed after it, they would stay parked with headers it replaced).
        if changes.contains(where: { if case .park = $0 { true } else { false } }) { try flush(now: now) }
        let generation: Int64
        do {
            generation = try store.updateHeaders(headers, now: now)
        } catch  where error.code == .invalid {
            // A patch too large for some request changes nothing; the runner goes on.
            log("outbox: auth_refresh_command: \(error.message); entries stay awaiting-auth", level: .warn)
            return
        }
        control.headerGeneration = generation
        // A drain waited for this refresh to send its parked entries again: they are sent even
        // when its horizon passed while the command ran (their next failure is past it).
        if let horizon = drainHorizon { drainHorizon = max(horizon, now) }
        try reportHeadersUpdate()
        readAhead.discard()  // parked entries are queued again, with the new headers
        log("outbox: auth_refresh_command updated \(headers.map(\.0).joined(separator: ", ")) (header generation \(generation))")
    }

    /// Entries parked awaiting-auth past their expiry settle error `expired`, as queued ones do
    /// (no header update could make them sendable in time): at the run's first turn, then at
    /// most once a minute while any are parked. On a store several runners share, where this
    /// runner holds no claim on them, they expire once a header update queues them again.
    func expireParked(now: Int64) throws(OutboxError) {
        guard !store.sharesRunners, now - lastParkedExpiry >= 60_000 else { return }
        lastParkedExpiry = now
        for entry in try store.parkedPastExpiry(now: now) where flights.running[entry.id] == nil {
            settleError(
                entry, kind: .expired, message: OutcomePayloads.expiredMessage(attempts: entry.attempts, lastReason: entry.reason),
                state: .error, reason: "expired")
        }
    }

    /// Whether `refreshAuthIfNeeded` runs, or would run now: a command, parked entries, and the
    /// once-a-minute limit passed.
    func authRefreshDue(now: Int64) throws(OutboxError) -> Bool {
        if authRefreshRunning { return true }
        guard config.authRefreshCommand != nil, now - lastAuthRefresh >= 60_000 else { return false }
        return (try store.counts().states[.awaitingAuth] ?? 0) > 0
    }
}
