import OutboxModel

/// A settled entry: its new state and the outcome journaled with it, in one transaction.
package struct Settlement: Sendable {
    package var entryID: String
    package var generation: Int64
    package var state: EntryState
    package var reason: String?
    package var outcome: Outcome
    package var payload: JSON
    /// False when no hook will run: the outcome is acknowledged as it settles (deliveries 0).
    package var hookExists: Bool
    /// `then` follow-ups, enqueued in the same transaction.
    package var followUps: [NewEntry]
    /// The entry as the runner holds it (nil: read it from the store).
    package var snapshot: Entry?

    package init(
        entryID: String, generation: Int64, state: EntryState, reason: String?, outcome: Outcome, payload: JSON,
        hookExists: Bool, followUps: [NewEntry] = []
    ) {
        self.entryID = entryID
        self.generation = generation
        self.state = state
        self.reason = reason
        self.outcome = outcome
        self.payload = payload
        self.hookExists = hookExists
        self.followUps = followUps
    }

    /// With no hook to read its outcome, a completed or cancelled entry is forgotten as it
    /// settles: its row, attempts and outcomes go in the same transaction.
    package var forgetsEntry: Bool { !hookExists && (state == .completed || state == .cancelled) }

    /// The one `follow_up_errors` item (index null) that says the `then` follow-ups are built
    /// at delivery, and why.
    package static func markThenForDelivery(_ payload: inout JSON, because message: String) {
        payload.set("follow_up_errors", .array([.object([("index", .null), ("key", .null), ("message", .string(message))])]))
    }

    /// Whether an outcome's `then` follow-ups wait for its delivery: it was journaled while no
    /// definition of its key was loaded, while a follow-up's plugin failed or its definition had
    /// errors, or while one named an entry being sent with another body.
    package static func thenWaitsForDelivery(_ payload: JSON) -> Bool {
        guard let errors = payload["follow_up_errors"]?.arrayValue, errors.count == 1 else { return false }
        return errors[0]["index"] == .null
    }
}

/// One change the runner makes; several are applied in one transaction when they coincide.
package enum RunnerChange: Sendable {
    /// Claimed entries, by seq (the row id: no index lookup).
    case markRunning(entrySeqs: [Int64], lease: Lease)
    case attempt(entryID: String, generation: Int64, at: Int64, payload: JSON, requestID: String)
    case reschedule(entryID: String, nextAttemptAt: Int64, reason: String?)
    case park(entryID: String)
    /// A queued entry the runner looked at and may not send now (off Wi-Fi, no account):
    /// it stays queued, not due before `until`, with the reason `list` and `explain` show.
    case hold(entryID: String, until: Int64, reason: HoldReason)
    case requeue(entryID: String)
    case progress(entryID: String, bytesSent: Int64)
    case partAccepted(entrySeq: Int64, index: Int, status: Int, headers: JSON)
    case partRetry(entrySeq: Int64, index: Int, nextAttemptAt: Int64, status: Int?)
    /// A part refused for good (its entry settles error): its attempt and status are kept for `show`.
    case partRefused(entrySeq: Int64, index: Int, status: Int?)
    case settle(Settlement)
    /// Entries behind a failed one in its scope: cancelled (reason scope) with an error outcome.
    case cancelScope(scope: String, afterSeq: Int64, payloadFor: @Sendable (Entry) -> (JSON, Bool))
    /// An entry dropped without an outcome to deliver (other-account).
    case drop(entryID: String, reason: String)
    /// Additions to the store's cumulative counters (attempts, bytes, durations).
    case count([CounterIncrement])
}

/// Why a queued entry waits that no retry or pause explains. A drain does not wait for
/// held entries: like a pause, only something outside the run releases them.
package enum HoldReason: String, Sendable, CaseIterable {
    case wifi = "wifi"
    case account = "waiting for its account"
    case host = "waiting for its host to answer"
}

/// One generation of an entry id.
private struct Generation: Hashable {
    let id: String
    let generation: Int64
}

extension [RunnerChange] {
    /// The batch without the attempt records of entries a settle in it forgets: they would
    /// be written and deleted in the same transaction (three statements and their pages).
    /// Only for a store one runner holds: on a shared one a settle can be fenced out by a
    /// runner that took the entry over, and the attempt then stays in its history.
    package func sparingForgottenAttempts() -> [RunnerChange] {
        // Most batches record no attempt (an entry forgotten at once logs none): nothing to spare.
        guard contains(where: { if case .attempt = $0 { true } else { false } }) else { return self }
        var forgotten: Set<Generation> = []
        for change in self {
            if case let .settle(s) = change, s.forgetsEntry { forgotten.insert(Generation(id: s.entryID, generation: s.generation)) }
        }
        guard !forgotten.isEmpty else { return self }
        return filter { change in
            guard case let .attempt(id, generation, _, _, _) = change else { return true }
            return !forgotten.contains(Generation(id: id, generation: generation))
        }
    }
}

/// What `apply` did that its caller cannot know in advance.
package struct AppliedChanges: Sendable {
    /// Entries whose settle changed nothing: another process cancelled or replaced them
    /// first, so their outcome is not journaled and their follow-ups not enqueued.
    package var fencedOut: Set<String> = []
    /// Entries a `cancelScope` settled cancelled, as they were before it.
    package var scopeCancelled: [Entry] = []
    /// Settled entries whose follow-ups were not enqueued, with why: one names an entry being
    /// sent now with another body (their outcomes carry `follow_up_errors`).
    package var followUpConflicts: [String: String] = [:]

    package init(fencedOut: Set<String> = []) { self.fencedOut = fencedOut }
}

/// When work comes due, for a drain to decide whether to wait for it.
package struct DueTimes: Sendable, Equatable {
    /// The earliest attempt, hold end or hook delivery.
    package var any: Int64?
    /// The earliest work never tried: an entry with no attempt yet, an outcome never delivered.
    package var fresh: Int64?

    package init(any: Int64?, fresh: Int64?) {
        self.any = any
        self.fresh = fresh
    }
}
