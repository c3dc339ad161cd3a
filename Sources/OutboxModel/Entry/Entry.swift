/// Where an entry's body bytes are kept.
package enum StoredBody: Sendable, Equatable {
    case none
    /// A data or text body kept in the entry's row (large ones are staged as a `file`).
    case bytes([UInt8])
    /// Form fields; file fields are staged files.
    case form([StoredFormField])
    /// A file sent whole: a staged copy, a moved file, or the user's referenced file.
    case file(path: String)
    /// A file sent as parts (a chunked upload).
    case parts(path: String)

    /// The file of a `file` or `parts` body.
    package var file: String? {
        switch self {
        case let .file(path), let .parts(path): return path
        case .none, .bytes, .form: return nil
        }
    }

    /// Every file the body reads: its file, or the staged files of its form.
    package var files: [String] {
        if case let .form(fields) = self { return fields.compactMap(\.stagedFile) }
        return file.map { [$0] } ?? []
    }

    /// Builds the body from a stored row's columns; a row whose columns do not fit its kind is damage.
    package init(kind: BodyKind, inline: [UInt8]?, file: String?, form: [StoredFormField]) throws(OutboxError) {
        switch kind {
        case .none: self = .none
        case .data, .text:
            // Large data and text bodies are staged to a file like file bodies.
            if let inline { self = .bytes(inline) } else if let file { self = .file(path: file) } else { self = .none }
        case .form: self = .form(form)
        case .file, .parts:
            guard let file else { throw .storage("the stored entry is damaged: a \(kind.rawValue) body without its file") }
            self = kind == .file ? .file(path: file) : .parts(path: file)
        }
    }
}

/// One entry of the queue as stored.
package struct Entry: Sendable {
    /// The row's position in the queue (enqueue order).
    package var seq: Int64
    package var id: String
    /// The name staged files of this entry carry.
    package var internalID: String
    package var key: String
    package var vars: JSON
    package var state: EntryState
    package var reason: String?
    package var generation: Int64
    package var request: StoredRequest
    package var body: StoredBody
    package var bodyHash: String
    package var totalBytes: Int64
    package var bytesSent: Int64

    /// The body's share of `sent` bytes on the wire: a form's framing (boundaries, part
    /// headers) is not counted, so `bytes_sent` never passes `total_bytes`.
    package func bodyBytes(sent: Int64) -> Int64 {
        request.bodyKind == .form ? min(sent, totalBytes) : sent
    }
    package var attempts: Int64
    package var idempotencyKey: String?
    package var account: String?
    package var scope: String?
    package var parent: String?
    package var headerGeneration: Int64
    package var createdAt: Int64
    package var updatedAt: Int64
    package var expiresAt: Int64?
    package var notBefore: Int64?
    package var nextAttemptAt: Int64?
    package var leaseOwner: String?
    package var lastRequestID: String?
    /// A replaced completed entry waits until its old outcome is acknowledged.
    package var waitsForDelivery: Bool

    package init(
        seq: Int64, id: String, internalID: String, key: String, vars: JSON, state: EntryState, reason: String?,
        generation: Int64, request: StoredRequest, body: StoredBody, bodyHash: String, totalBytes: Int64,
        bytesSent: Int64, attempts: Int64, idempotencyKey: String?, account: String?, scope: String?, parent: String?,
        headerGeneration: Int64, createdAt: Int64, updatedAt: Int64, expiresAt: Int64?, notBefore: Int64?,
        nextAttemptAt: Int64?, leaseOwner: String?, lastRequestID: String?, waitsForDelivery: Bool
    ) {
        self.seq = seq
        self.id = id
        self.internalID = internalID
        self.key = key
        self.vars = vars
        self.state = state
        self.reason = reason
        self.generation = generation
        self.request = request
        self.body = body
        self.bodyHash = bodyHash
        self.totalBytes = totalBytes
        self.bytesSent = bytesSent
        self.attempts = attempts
        self.idempotencyKey = idempotencyKey
        self.account = account
        self.scope = scope
        self.parent = parent
        self.headerGeneration = headerGeneration
        self.createdAt = createdAt
        self.updatedAt = updatedAt
        self.expiresAt = expiresAt
        self.notBefore = notBefore
        self.nextAttemptAt = nextAttemptAt
        self.leaseOwner = leaseOwner
        self.lastRequestID = lastRequestID
        self.waitsForDelivery = waitsForDelivery
    }

    /// The staged body file, or the user's file for `reference`.
    package var bodyFile: String? { body.file }

    /// The file this entry holds in the store (moved or copied in), by its source path: a
    /// same-id enqueue naming that path means these bytes while nothing else is there.
    package var stagedSources: [String: FileIdentity] {
        guard let file = request.file, let staged = bodyFile, staged != file.path, request.ownership != .reference else { return [:] }
        return [file.path: file]
    }

    /// Whether the entry is sent as parts (a chunked upload).
    package var isChunked: Bool { request.bodyKind == .parts }

    /// The vars as output shows them (`show`, `list`, events): those that went into a secret
    /// header redacted. Hooks get them whole: they are the hook's data.
    package var shownVars: JSON { request.secretVars.isEmpty ? vars : SecretVars.masking(vars, request.secretVars) }

    /// The row of `list --json`: exactly these fields, with `state` as displayed (a queued
    /// entry of a paused queue or key shows `paused`; a running one no reason, as its `running`
    /// event). `show` adds the rest.
    package func listJSON(displayState: String? = nil) -> JSON {
        .object([
            ("id", .string(id)), ("key", .string(key)), ("vars", shownVars), ("state", .string(displayState ?? state.rawValue)),
            ("reason", .optionalString(state == .running ? nil : reason)), ("bytes_sent", .int64(bytesSent)),
            ("total_bytes", .int64(totalBytes)),
            ("attempts", .int64(attempts)), ("created_at", .int64(createdAt)), ("updated_at", .int64(updatedAt)),
            ("next_attempt_at", .optionalInt(nextAttemptAt)), ("generation", .int64(generation)),
            ("parent", .optionalString(parent)),
        ])
    }
}
