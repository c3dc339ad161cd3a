/// How an entry's generation ended, as its hook hears it.
public enum Outcome: String, Sendable, CaseIterable {
    case completed, error

    /// The definition's hook field for this outcome, and the `then` list's name.
    public var hookField: String { self == .completed ? "on_success" : "on_error" }
}

/// The `kind` of an outcome's `error` object.
public enum ErrorKind: String, Sendable, CaseIterable {
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
public struct OutcomeRecord: Sendable {
    public var seq: Int64
    public var entryID: String
    public var key: String
    public var generation: Int64
    public var outcome: Outcome
    /// The hook's JSON without `meta.deliveries` (added at delivery).
    public var payload: JSON
    public var deliveries: Int64
    public var acknowledged: Bool
    public var nextDeliveryAt: Int64?
    public var reason: String?
    public var hookPgid: Int32?
    public var hookStart: UInt64?
    public var createdAt: Int64

    public init(seq: Int64, entryID: String, key: String, generation: Int64, outcome: Outcome, payload: JSON, deliveries: Int64,
                acknowledged: Bool, nextDeliveryAt: Int64?, reason: String?, hookPgid: Int32?, hookStart: UInt64?, createdAt: Int64) {
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
