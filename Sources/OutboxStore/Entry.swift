import OutboxModel

/// A form field as persisted: a value, or a file staged into the store.
public struct StoredFormField: Sendable, Equatable {
    public var name: String
    public var value: String?
    public var stagedFile: String?
    public var filename: String?
    public var contentType: String?
}

/// A part of a chunked upload as persisted, with its acceptance.
public struct StoredPart: Sendable {
    public var index: Int
    public var range: ByteRange
    public var url: String
    public var headers: [(String, String)]
    public var accepted: Bool
    public var status: Int?
    public var responseHeaders: JSON?
    public var attempts: Int
    public var nextAttemptAt: Int64?
}

/// The request an entry sends, fixed at enqueue (SPEC 7).
public struct StoredRequest: Sendable {
    public var method: String
    public var url: String?
    public var headers: [(String, String)]
    /// none, data, text, form, file or parts.
    public var bodyKind: String
    public var form: [StoredFormField]
    public var file: FileIdentity?
    public var ownership: Ownership?
    public var accept: [AcceptRule]
    public var retry: RetryRules
    public var response: ResponseMode
    public var followRedirects: Int
    public var wifiOnly: Bool?
    public var cancelScopeOnError: Bool

    public var json: JSON {
        var members: [(String, JSON)] = [
            ("method", .string(method)), ("url", .optionalString(url)),
            ("headers", .array(headers.map { .array([.string($0.0), .string($0.1)]) })),
            ("body_kind", .string(bodyKind)),
        ]
        if !form.isEmpty {
            members.append(("form", .array(form.map { f in
                .object([("name", .string(f.name)), ("value", .optionalString(f.value)), ("staged_file", .optionalString(f.stagedFile)),
                         ("filename", .optionalString(f.filename)), ("content_type", .optionalString(f.contentType))])
            })))
        }
        if let file {
            var fileJSON: JSON = .object([("path", .string(file.path)), ("size", .int64(file.size)),
                                          ("mtime_ns", .int64(file.mtimeNs)), ("inode", .number(String(file.inode)))])
            if let mode = file.mode { fileJSON.set("mode", .int64(Int64(mode))) }
            members.append(("file", fileJSON))
        }
        if let ownership { members.append(("ownership", .string(ownership.rawValue))) }
        members += [
            ("accept", .array(accept.map { .object([("status", .int($0.status)), ("body_includes", .optionalString($0.bodyIncludes))]) })),
            ("retry", retry.json), ("response", response.json), ("follow_redirects", .int(followRedirects)),
            ("wifi_only", wifiOnly.map { .bool($0) } ?? .null), ("cancel_scope_on_error", .bool(cancelScopeOnError)),
        ]
        return .object(members)
    }

    public init(json: JSON) {
        method = json["method"]?.stringValue ?? "POST"
        url = json["url"]?.stringValue
        headers = (json["headers"]?.arrayValue ?? []).compactMap { pair in
            guard let a = pair.arrayValue, a.count == 2, let n = a[0].stringValue, let v = a[1].stringValue else { return nil }
            return (n, v)
        }
        bodyKind = json["body_kind"]?.stringValue ?? "none"
        form = (json["form"]?.arrayValue ?? []).map { f in
            StoredFormField(name: f["name"]?.stringValue ?? "", value: f["value"]?.stringValue, stagedFile: f["staged_file"]?.stringValue,
                            filename: f["filename"]?.stringValue, contentType: f["content_type"]?.stringValue)
        }
        if let f = json["file"], let path = f["path"]?.stringValue {
            file = FileIdentity(path: path, size: f["size"]?.int64Value ?? 0, mtimeNs: f["mtime_ns"]?.int64Value ?? 0,
                                inode: f["inode"].flatMap { if case let .number(t) = $0 { UInt64(t) } else { nil } } ?? 0,
                                mode: f["mode"]?.int64Value.map { UInt32(truncatingIfNeeded: $0) })
        }
        ownership = json["ownership"]?.stringValue.flatMap(Ownership.init(rawValue:))
        accept = (json["accept"]?.arrayValue ?? []).compactMap { a in
            a["status"]?.int64Value.map { AcceptRule(status: Int($0), bodyIncludes: a["body_includes"]?.stringValue) }
        }
        retry = json["retry"].map(RetryRules.init(json:)) ?? RetryRules()
        response = json["response"].flatMap(ResponseMode.init(json:)) ?? .raw
        followRedirects = Int(json["follow_redirects"]?.int64Value ?? 0)
        wifiOnly = json["wifi_only"]?.boolValue
        cancelScopeOnError = json["cancel_scope_on_error"]?.boolValue ?? false
    }

    init(prepared p: PreparedRequest, form: [StoredFormField]) {
        method = p.method
        url = p.url
        headers = p.headers
        bodyKind = p.body.kind
        self.form = form
        switch p.body {
        case let .file(identity, own), let .parts(identity, own, _):
            file = identity
            ownership = own
        default:
            file = nil
            ownership = nil
        }
        accept = p.accept
        retry = p.retry
        response = p.response
        followRedirects = p.followRedirects
        wifiOnly = p.wifiOnly
        cancelScopeOnError = p.cancelScopeOnError
    }
}

/// One entry of the queue as stored.
public struct Entry: Sendable {
    public var seq: Int64
    public var id: String
    public var internalID: String
    public var key: String
    public var vars: JSON
    public var state: EntryState
    public var reason: String?
    public var generation: Int64
    public var request: StoredRequest
    public var bodyInline: [UInt8]?
    /// Absolute path of the staged body (or the user's file for `reference`).
    public var bodyFile: String?
    public var bodyHash: String
    public var totalBytes: Int64
    public var bytesSent: Int64
    public var attempts: Int64
    public var idempotencyKey: String?
    public var account: String?
    public var scope: String?
    public var parent: String?
    public var headerGeneration: Int64
    public var createdAt: Int64
    public var updatedAt: Int64
    public var expiresAt: Int64?
    public var notBefore: Int64?
    public var nextAttemptAt: Int64?
    public var leaseOwner: String?
    public var lastRequestID: String?
    /// A replaced completed entry waits until its old outcome is acknowledged.
    public var waitsForDelivery: Bool

    /// The row of `list --json` (SPEC 10): exactly these fields, with `state` as displayed
    /// (a queued entry of a paused queue or key shows `paused`). `show` adds the rest.
    public func listJSON(displayState: String? = nil) -> JSON {
        .object([
            ("id", .string(id)), ("key", .string(key)), ("vars", vars), ("state", .string(displayState ?? state.rawValue)),
            ("reason", .optionalString(reason)), ("bytes_sent", .int64(bytesSent)), ("total_bytes", .int64(totalBytes)),
            ("attempts", .int64(attempts)), ("created_at", .int64(createdAt)), ("updated_at", .int64(updatedAt)),
            ("next_attempt_at", .optionalInt(nextAttemptAt)), ("generation", .int64(generation)),
            ("parent", .optionalString(parent)),
        ])
    }
}

/// One journaled outcome and its delivery state.
public struct OutcomeRecord: Sendable {
    public var seq: Int64
    public var entryID: String
    public var key: String
    public var generation: Int64
    /// completed or error.
    public var outcome: String
    /// The hook's JSON without `meta.deliveries` (added at delivery).
    public var payload: JSON
    public var deliveries: Int64
    public var acknowledged: Bool
    public var nextDeliveryAt: Int64?
    public var reason: String?
    public var hookPgid: Int32?
    public var hookStart: UInt64?
    public var createdAt: Int64
}

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

public struct EnqueueResult: Sendable, Equatable {
    public var id: String
    public var decision: SameIdDecision
}
