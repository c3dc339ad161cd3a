import OutboxHTTP
import OutboxModel
import OutboxProcess

/// Response parsers: a definition's `response: {command: ...}` runs on a thread of its own,
/// so a slow parser holds its own entry (and that entry's slot) until it answers, never the
/// rest of the queue. Its answer comes back as an event and the entry settles with it.
extension Runner {
    /// Whether this success is read by the definition's parser command before it settles.
    static func needsParser(_ entry: Entry, result: HTTPResult) -> Bool {
        guard case .command = entry.request.response else { return false }
        // A body cut at max_response_bytes is not parsed: the outcome says so at once.
        return !result.bodyTruncated
    }

    /// Starts the parser of a success; the entry stays held until `parserFinished`.
    func startParser(_ waiting: PendingParse) {
        var pending = waiting
        pending.token = flights.nextToken
        flights.nextToken += 1
        let entry = pending.entry
        flights.running[entry.id] = flights.running[entry.id] ?? entry
        flights.parsing[entry.id] = pending
        let (mailbox, stop, cancelled, token) = (mailbox, pluginsStop, pending.cancelled, pending.token)
        let (body, mode, vars, config, environment) = (pending.result.body, entry.request.response, entry.vars, config, environment)
        Threads.detach {
            let killed = Locked(false)
            // Made on this thread, it is looked at here: a stop at once, or the entry gone, kills the parser.
            let heartbeat = Heartbeat(
                everyMs: Int64(Int32.max),
                abandon: {
                    guard stop.withLock({ $0 }) || cancelled.withLock({ $0 }) else { return false }
                    killed.withLock { $0 = true }
                    return true
                }, beat: {})
            let parsed = Runner.parse(body, mode: mode, vars: vars, config: config, environment: environment, heartbeat: heartbeat)
            mailbox.post(.parsed(entryID: entry.id, token: token, result: parsed, abandoned: killed.withLock { $0 }))
        }
    }

    /// A parser's answer: the entry settles with it, unless it was cancelled or lost meanwhile
    /// (said when that was noticed), or the parser was killed by a stop at once (then the
    /// entry goes back to the queue).
    func parserFinished(entryID: String, token: UInt64, result: Result<JSON, OutboxError>, abandoned: Bool) {
        guard let pending = flights.parsing[entryID], pending.token == token else { return }
        flights.parsing[entryID] = nil
        guard let held = flights.running[entryID] else { return }
        var entry = pending.entry
        // A same-body enqueue meanwhile gave it new vars: its outcome and follow-ups use them.
        entry.vars = held.vars
        if abandoned {
            keepUnsettled(entry, plugin: "response parser")
            return
        }
        settleSuccess(
            entry, result: pending.result, parts: pending.parts, requestID: pending.requestID, s3Parts: pending.s3Parts,
            skipped: pending.skipped, parsed: result)
    }

    /// Kills the parser of an entry cancelled or lost meanwhile and lets the entry go; false
    /// when no parser runs for it.
    @discardableResult
    func stopParser(_ entryID: String) -> Bool {
        guard let pending = flights.parsing.removeValue(forKey: entryID) else { return false }
        pending.cancelled.withLock { $0 = true }
        flights.running[entryID] = nil
        return true
    }
}
