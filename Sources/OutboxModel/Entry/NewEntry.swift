/// Which entries `list` reads.
public struct ListFilter: Sendable {
    public var key: String?
    public var id: String?
    public var state: String?
    public var limit: Int?
    public init(key: String? = nil, id: String? = nil, state: String? = nil, limit: Int? = nil) {
        self.key = key
        self.id = id
        self.state = state
        self.limit = limit
    }
}

/// One entry to enqueue, rendered and checked.
public struct NewEntry: Sendable {
    public var id: String
    public var key: String
    public var vars: JSON
    public var prepared: PreparedRequest
    public var account: String?
    public var parent: String?
    public var notBefore: Int64?
    /// Absolute expiry; nil means now + the request's expires_in.
    public var expiresAt: Int64?
    /// True when the id was minted for this entry (a time-ordered UUID, not the user's): no
    /// stored entry can have it, so enqueue skips the same-id lookups (the id's UNIQUE
    /// index still refuses a duplicate).
    public var idWasMinted = false

    public init(id: String, key: String, vars: JSON, prepared: PreparedRequest, account: String? = nil,
                parent: String? = nil, notBefore: Int64? = nil, expiresAt: Int64? = nil) {
        self.id = id
        self.key = key
        self.vars = vars
        self.prepared = prepared
        self.account = account
        self.parent = parent
        self.notBefore = notBefore
        self.expiresAt = expiresAt
    }
}

/// What an enqueue did with one entry.
public struct EnqueueResult: Sendable, Equatable {
    public var id: String
    public var decision: SameIdDecision

    public init(id: String, decision: SameIdDecision) {
        self.id = id
        self.decision = decision
    }
}
