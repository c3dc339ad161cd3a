/// How an entry's generation ended, as its hook hears it.
package enum Outcome: String, Sendable, CaseIterable {
    case completed, error

    /// The definition's hook field for this outcome, and the `then` list's name.
    package var hookField: String { self == .completed ? "on_success" : "on_error" }
}

/// The `kind` of an outcome's `error` object.
package enum ErrorKind: String, Sendable, CaseIterable {
    /// The server answered with a status that is an error, or no answer came (the message says which).
    case http
    /// A staged file is missing, or a referenced file changed or went away.
    case file
    /// The entry's lifetime ended before it succeeded.
    case expired
    /// Cancelled because an entry ahead of it in its scope settled error.
    case cancelled
    /// The response was over `max_response_bytes` and was not parsed.
    case truncated
    /// The response could not be parsed.
    case unknown
}

/// One journaled outcome and its delivery state.
package struct OutcomeRecord: Sendable {
    package var seq: Int64
    package var entryID: String
    package var key: String
    package var generation: Int64
    package var outcome: Outcome
    /// The hook's JSON without `meta.deliveries` (added at delivery).
    package var payload: JSON
    package var deliveries: Int64
    package var acknowledged: Bool
    package var nextDeliveryAt: Int64?
    package var reason: String?
    package var hookPgid: Int32?
    package var hookStart: UInt64?
    package var createdAt: Int64

    package init(
        seq: Int64, entryID: String, key: String, generation: Int64, outcome: Outcome, payload: JSON, deliveries: Int64,
        acknowledged: Bool, nextDeliveryAt: Int64?, reason: String?, hookPgid: Int32?, hookStart: UInt64?, createdAt: Int64
    ) {
        self.seq = seq
        self.entryID = entryID
        self.key = key
        self.generation = generation
        self.outcome = outcome
        self.payload = payload
        self.deliveries = deliveries
        self.acknowledged = acknowledged
        self.nextDeliveryAt = nextDeliveryAt
        self.reason = reason
        self.hookPgid = hookPgid
        self.hookStart = hookStart
        self.createdAt = createdAt
    }
}
