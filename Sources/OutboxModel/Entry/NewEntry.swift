/// What a text `list` shows of an entry; `state` as stored (a pause is shown by the caller).
package struct ListRow: Sendable {
    package var id: String
    package var key: String
    package var state: String
    /// The entry's reason, or `unhandled-key` while an outcome waits for a definition.
    package var reason: String?
    package var bytesSent: Int64
    package var totalBytes: Int64
    package var attempts: Int64
    package var updatedAt: Int64
    package var nextAttemptAt: Int64?
    /// Queued behind the delivery of its previous generation's outcome.
    package var waitsForDelivery = false
    /// Held until then (`--delay`, a follow-up's delay).
    package var notBefore: Int64?
    package init(
        id: String, key: String, state: String, reason: String?, bytesSent: Int64, totalBytes: Int64, attempts: Int64,
        updatedAt: Int64, nextAttemptAt: Int64?
    ) {
        (self.id, self.key, self.state, self.reason) = (id, key, state, reason)
        (self.bytesSent, self.totalBytes, self.attempts, self.updatedAt, self.nextAttemptAt) =
            (bytesSent, totalBytes, attempts, updatedAt, nextAttemptAt)
    }
}

/// Which entries `list` reads.
package struct ListFilter: Sendable {
    package var key: String?
    package var id: String?
    package var state: String?
    package var limit: Int?
    package var scope: String?
    package init(key: String? = nil, id: String? = nil, state: String? = nil, limit: Int? = nil, scope: String? = nil) {
        self.key = key
        self.id = id
        self.state = state
        self.limit = limit
        self.scope = scope
    }
}

/// One entry to enqueue, rendered and checked.
package struct NewEntry: Sendable {
    /// The least time between when an entry may be sent and its expiry: with less, it would
    /// expire unsent, and an enqueue that makes it so is refused.
    package static let shortestWindowMs: Int64 = 1000

    package var id: String
    package var key: String
    package var vars: JSON { didSet { encoded = nil } }
    package var prepared: PreparedRequest { didSet { encoded = nil } }
    package var account: String?
    package var parent: String?
    package var notBefore: Int64?
    /// Absolute expiry; nil means now + the request's expires_in.
    package var expiresAt: Int64?
    /// True when the id was minted for this entry (a time-ordered UUID, not the user's): no
    /// stored entry can have it, so enqueue skips the same-id lookups (the id's UNIQUE
    /// index still refuses a duplicate).
    package var idWasMinted = false
    /// A `then` follow-up naming the entry whose outcome it answers ("poll again"), applied
    /// while that outcome's delivery is still to come: a new send once it is delivered.
    package var resendsBeforeDelivery = false
    /// The hash of the body and the vars text, made by `encode()` where the entry is
    /// rendered (the render threads of a batch) instead of one at a time inside the write
    /// transaction. A change to `vars` or `prepared` drops them. (The stored request's
    /// text is not kept: piped lines are all held until their one write, and that text,
    /// 500 bytes an entry, made `enqueue --from` of 10,000 lines 8 MiB larger.)
    package private(set) var encoded: Encoded?

    package struct Encoded: Sendable {
        package var bodyHash: String
        package var vars: String
    }

    package mutating func encode() {
        encoded = Encoded(bodyHash: prepared.bodyHash, vars: vars.serialized())
    }

    /// The body's hash and the vars as stored: made ahead, or now.
    package var bodyHash: String { encoded?.bodyHash ?? prepared.bodyHash }
    package var varsText: String { encoded?.vars ?? vars.serialized() }

    package init(
        id: String, key: String, vars: JSON, prepared: PreparedRequest, account: String? = nil,
        parent: String? = nil, notBefore: Int64? = nil, expiresAt: Int64? = nil
    ) {
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

extension [NewEntry] {
    /// Positions of entries that a later entry of the same id replaces. Follow-ups of one
    /// transaction are enqueued as if one after another, so of one id only the last stays.
    package var supersededPositions: Set<Int> {
        var last: [String: Int] = [:]
        for (position, entry) in enumerated() { last[entry.id] = position }
        return Set(indices.filter { last[self[$0].id] != $0 })
    }

    /// The entries without those a later entry of the same id replaces.
    package var lastOfEachID: [NewEntry] {
        let superseded = supersededPositions
        return superseded.isEmpty ? self : enumerated().filter { !superseded.contains($0.offset) }.map(\.element)
    }
}

/// What an enqueue did with one entry.
package struct EnqueueResult: Sendable, Equatable {
    package var id: String
    package var decision: SameIdDecision

    package init(id: String, decision: SameIdDecision) {
        self.id = id
        self.decision = decision
    }
}
