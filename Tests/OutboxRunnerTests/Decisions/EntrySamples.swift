import OutboxModel

/// Entries built in memory for the decision tables: only the fields a decision reads vary.
enum Sample {
    static let now: Int64 = 1_800_000_000_000

    static func entry(
        _ id: String, host: String = "a.example", key: String = "k", chunked: Bool = false,
        expiresIn: Int64? = nil, createdAt: Int64 = now - 1000, account: String? = nil, scope: String? = nil,
        wifiOnly: Bool? = nil, attempts: Int64 = 0
    ) -> Entry {
        let request = try! StoredRequest(
            json: .object([
                ("method", .string("POST")), ("url", .string("https://\(host)/x")), ("headers", .array([])),
                ("body_kind", .string(chunked ? "parts" : "data")), ("accept", .array([])), ("retry", RetryRules().json),
                ("response", .string("raw")), ("follow_redirects", .int(0)), ("wifi_only", wifiOnly.map { .bool($0) } ?? .null),
                ("cancel_scope_on_error", .bool(false)),
            ]))
        return Entry(
            seq: 1, id: id, internalID: id, key: key, vars: .null, state: .queued, reason: nil, generation: 1, request: request,
            body: chunked ? .parts(path: "/tmp/\(id)") : .bytes([]), bodyHash: "", totalBytes: 0, bytesSent: 0, attempts: attempts,
            idempotencyKey: nil, account: account, scope: scope, parent: nil, headerGeneration: 0, createdAt: createdAt,
            updatedAt: createdAt, expiresAt: expiresIn.map { now + $0 }, notBefore: nil, nextAttemptAt: nil, leaseOwner: nil,
            lastRequestID: nil, waitsForDelivery: false)
    }

    static func part(_ index: Int, host: String = "a.example", accepted: Bool = false, retryIn: Int64? = nil) -> StoredPart {
        StoredPart(
            index: index, range: ByteRange(start: Int64(index) * 10, end: Int64(index + 1) * 10), url: "https://\(host)/p\(index)",
            headers: [], accepted: accepted, status: accepted ? 200 : nil, responseHeaders: nil, attempts: retryIn == nil ? 0 : 1,
            nextAttemptAt: retryIn.map { now + $0 })
    }
}
