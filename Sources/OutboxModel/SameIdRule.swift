/// What `enqueue --id` finds already stored under that id.
package struct ExistingEntry: Sendable {
    package var state: EntryState
    /// SHA-256 hex of the entry's canonical body (method, URL, body kind and content).
    package var bodyHash: String
    /// True when no unacknowledged outcome is pending for the current generation.
    package var outcomeAcknowledged: Bool

    package init(state: EntryState, bodyHash: String, outcomeAcknowledged: Bool) {
        self.state = state
        self.bodyHash = bodyHash
        self.outcomeAcknowledged = outcomeAcknowledged
    }
}

/// What an enqueue with an id that may already exist must do.
package enum SameIdDecision: Sendable, Equatable {
    /// No entry with this id (or it was forgotten): create one.
    case create
    /// Same body, live entry: keep bytes and progress; update headers, vars and expiry.
    case resume
    /// Different body on a non-running live entry or an error entry: replace the body, reopen as queued, reset progress.
    case replace
    /// Different body on a running entry: E_RUNNING.
    case rejectRunning
    /// Cancelled but not yet acknowledged: start a new generation with the new body.
    case newGeneration
    /// Completed, not yet acknowledged, same body: re-deliver the outcome, no new attempt.
    case redeliver
    /// Completed, not yet acknowledged, different body: replace and reopen once the old outcome is acknowledged.
    case replaceAfterDelivery
    /// Error entry, same body: reopen as queued.
    case reopen
}

/// The "same id again" rule of `enqueue --id` as one pure decision.
///
/// | state                          | same body      | different body        |
/// |--------------------------------|----------------|-----------------------|
/// | none (or forgotten)            | create         | create                |
/// | queued, paused, awaiting-auth  | resume         | replace               |
/// | running                        | resume         | rejectRunning         |
/// | error                          | reopen         | replace               |
/// | completed, not acknowledged    | redeliver      | replaceAfterDelivery  |
/// | completed, acknowledged        | create         | create                |
/// | cancelled, not acknowledged    | newGeneration  | newGeneration         |
/// | cancelled, acknowledged        | create         | create                |
///
/// Why:
/// - `running` + same body resumes without restarting: the attempt in flight carries on
///   and the new headers, vars and expiry apply from the next attempt.
/// - Live and error entries ignore `outcomeAcknowledged`: live ones have no outcome in
///   their generation, and an error entry stays until cancel or a same-id enqueue whether
///   or not its outcome was delivered (the journal keys outcomes by generation, so an
///   older outcome is still delivered and acknowledged on its own).
/// - A completed or cancelled entry whose outcome was acknowledged is forgotten, so the
///   row normally does not exist; if the store still shows one, it is treated as gone.
/// - A cancelled entry not yet acknowledged starts a new generation whatever the body:
///   the new generation simply takes the body it is given.
/// - Whether a replaced paused entry stays paused is the store's concern (pause is a
///   flag on the queue or key, not a body property).
package enum SameIdRule {
    /// Decides what an enqueue of `newBodyHash` under an id that holds `existing` does.
    package static func decide(existing: ExistingEntry?, newBodyHash: String) -> SameIdDecision {
        guard let existing else { return .create }
        let same = existing.bodyHash == newBodyHash
        switch existing.state {
        case .queued, .paused, .awaitingAuth:
            return same ? .resume : .replace
        case .running:
            return same ? .resume : .rejectRunning
        case .error:
            return same ? .reopen : .replace
        case .completed:
            if existing.outcomeAcknowledged { return .create }
            return same ? .redeliver : .replaceAfterDelivery
        case .cancelled:
            return existing.outcomeAcknowledged ? .create : .newGeneration
        }
    }
}
