import OutboxModel

/// Events: state and progress lines for `--events` and `events.command`, and the live display.
extension Runner {
    /// Sends an event to the sink and to the live display.
    func publish(_ event: JSON) {
        emit(event)
        progressDisplay?.observe(event)
    }

    /// A state event: the entry's row as it is after the change.
    func emitState(_ entry: Entry, state: EntryState, reason: String?) {
        guard eventsEnabled || progressDisplay != nil else { return }
        var shown = entry
        // A parked or settled row has no next attempt (`list --json` shows null): the snapshot
        // may still hold the one it was sent at.
        if state.isSettled || state == .awaitingAuth { shown.nextAttemptAt = nil }
        publish(OutcomePayloads.stateEvent(shown, state: state.rawValue, reason: reason, at: Identifiers.nowMs()))
    }

    /// A progress event: bytes sent (accepted plus in flight) and bytes accepted, throttled.
    func emitProgress(_ entry: Entry, sent: Int64, accepted: Int64, force: Bool) {
        guard eventsEnabled || progressDisplay != nil,
            progressGate.allow(entry.id, now: Identifiers.monotonicMs(), force: force)
        else { return }
        publish(OutcomePayloads.progressEvent(entry, sent: sent, accepted: accepted))
    }
}
