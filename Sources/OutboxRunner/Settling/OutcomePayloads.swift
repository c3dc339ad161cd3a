import OutboxHTTP
import OutboxModel
import OutboxStore

/// The JSON documents a run produces from an entry and a result: the hook's stdin (the
/// outcome), and the event lines (state, progress, attempt). Pure functions of their
/// inputs and the time `at` they are given; docs/hooks-and-events.md lists every field.
package enum OutcomePayloads {
    /// The fields every outcome has; `response`, `data`, `error` and `parts` are set by the
    /// caller, and are `null` where they do not apply (a script may read any of them).
    package static func base(_ entry: Entry, outcome: Outcome, attempts: Int64, requestID: String, at: Int64) -> JSON {
        .object([
            ("outcome", .string(outcome.rawValue)), ("id", .string(entry.id)), ("key", .string(entry.key)), ("vars", entry.vars),
            ("data", .null), ("response", .null), ("parts", .null),
            (
                "meta",
                .object([
                    ("at", .int64(at)), ("attempts", .int64(attempts)),
                    ("request_id", .string(requestID)), ("idempotency_key", .optionalString(entry.idempotencyKey)),
                    ("generation", .int64(entry.generation)), ("header_generation", .int64(entry.headerGeneration)),
                    ("parent", .optionalString(entry.parent)),
                ])
            ),
        ])
    }

    /// The outcome of an accepted request: `completed` with its parsed data, or, when the
    /// response cannot be read (too large, the parser fails), an `error` outcome on an entry
    /// that is still completed and never sent again (`reason` is the error kind).
    package static func success(
        _ entry: Entry, result: HTTPResult?, parts: JSON?, attempts: Int64, requestID: String, at: Int64, maxResponseBytes: Int64,
        parse: (_ body: [UInt8], _ mode: ResponseMode, _ vars: JSON) -> Result<JSON, OutboxError>
    ) -> (payload: JSON, outcome: Outcome, reason: String?) {
        var payload = base(entry, outcome: .completed, attempts: attempts, requestID: requestID, at: at)
        var data: JSON = .null
        var parseError: JSON?
        if let result {
            payload.set("response", response(result))
            if entry.request.response != .raw {
                if result.bodyTruncated {
                    parseError = error(
                        .truncated, "the response is over max_response_bytes (\(maxResponseBytes)); it was not parsed",
                        status: result.status, body: result.body, bodyCut: true)
                } else {
                    switch parse(result.body, entry.request.response, entry.vars) {
                    case let .success(value): data = value
                    case let .failure(failure): parseError = error(.unknown, failure.message, status: result.status, body: result.body)
                    }
                }
            }
        }
        if let parts { payload.set("parts", parts) }
        if let parseError {
            payload.set("outcome", .string(Outcome.error.rawValue))
            payload.set("error", parseError)
            payload.set("data", .null)
            return (payload, .error, parseError["kind"]?.stringValue)
        }
        payload.set("data", data)
        return (payload, .completed, nil)
    }

    /// An outcome's `error` object.
    /// `bodyCut`: the body is the start of a longer one (`max_response_bytes`), so a character
    /// cut at its end is left out, as in `response.body`, and the body stays text.
    package static func error(
        _ kind: ErrorKind, _ message: String, status: Int? = nil, partIndex: Int? = nil, body: [UInt8]? = nil, bodyCut: Bool = false
    ) -> JSON {
        var error: JSON = .object([
            ("kind", .string(kind.rawValue)), ("message", .string(message)),
            ("status", status.map { .int($0) } ?? .null),
        ])
        if let partIndex { error.set("part_index", .int(partIndex)) }
        if let body {
            bodyJSON(Array(body.prefix(65536)), into: &error, cut: bodyCut || body.count > 65536)
        } else {
            error.set("body", .null)
        }
        return error
    }

    /// An error outcome: the base, the error, the response when there was one, and no data.
    package static func failed(_ entry: Entry, error: JSON, response: HTTPResult?, attempts: Int64, requestID: String, at: Int64) -> JSON {
        var payload = base(entry, outcome: .error, attempts: attempts, requestID: requestID, at: at)
        payload.set("error", error)
        if let response { payload.set("response", self.response(response)) }
        payload.set("data", .null)
        return payload
    }

    /// The outcome of an entry cancelled because `failed` (ahead of it in `scope`) settled error.
    static func cancelledByScope(_ behind: Entry, failed: String, scope: String, at: Int64) -> JSON {
        var payload: JSON = .object([
            ("outcome", .string(Outcome.error.rawValue)), ("id", .string(behind.id)), ("key", .string(behind.key)), ("vars", behind.vars),
            ("error", error(.cancelled, "cancelled because \(failed) in scope \(scope) settled error")),
            ("data", .null), ("response", .null), ("parts", .null),
            (
                "meta",
                .object([
                    ("at", .int64(at)), ("attempts", .int64(behind.attempts)), ("request_id", .null),
                    ("idempotency_key", .optionalString(behind.idempotencyKey)), ("generation", .int64(behind.generation)),
                ])
            ),
        ])
        payload.set("reason", .string("scope"))
        return payload
    }

    /// The `response` object: status, lowercased headers, body (UTF-8, or base64).
    package static func response(_ result: HTTPResult) -> JSON {
        var response: JSON = .object([("status", result.status.map { .int($0) } ?? .null), ("headers", headers(result.headers))])
        bodyJSON(result.body, into: &response, cut: result.bodyTruncated)
        response.set("body_truncated", .bool(result.bodyTruncated))
        return response
    }

    package static func headers(_ headers: [(name: String, value: String)]) -> JSON {
        .object(headers.map { ($0.name.lowercased(), .string($0.value)) })
    }

    /// The `parts` list of a chunked entry's outcome: each part's status and response headers.
    static func parts(_ parts: [StoredPart]) -> JSON {
        .array(
            parts.map { p in
                .object([
                    ("index", .int(p.index)), ("status", p.status.map { .int($0) } ?? .null), ("headers", p.responseHeaders ?? .object([])),
                ])
            })
    }

    /// What an expired entry's error says: that nothing was sent, or how the attempts went.
    static func expiredMessage(attempts: Int64, lastReason: String?) -> String {
        guard attempts > 0 else { return "the entry expired before it could be sent" }
        let tries = attempts == 1 ? "1 attempt" : "\(attempts) attempts"
        // A header update's reason is what became of the entry, not how its last attempt went.
        let last = lastReason == headersUpdatedReason ? "refused for its credentials (401/403), then the headers were updated" : lastReason
        return "the entry expired after \(tries) without success" + (last.map { "; the last: \($0)" } ?? "")
    }

    // MARK: Events

    /// An `attempt` event: one HTTP exchange and what it meant.
    static func attemptEvent(
        _ entry: Entry, requestID: String, attempt: Int64, url: String, method: String, partIndex: Int?,
        result: HTTPResult, outcome: AttemptOutcomeClass, at: Int64, secrets: () -> [[UInt8]]
    ) -> JSON {
        var event: JSON = .object([
            ("type", .string("attempt")), ("id", .string(entry.id)), ("key", .string(entry.key)), ("request_id", .string(requestID)),
            ("attempt", .int64(attempt)), ("url", .string(redactURL(url, secret: entry.request.secretURL))), ("method", .string(method)),
            ("part_index", partIndex.map { .int($0) } ?? .null), ("outcome", .string(outcome.name)),
            ("http_code", result.status.map { .int($0) } ?? .null),
        ])
        // Events and `show` print this excerpt: a server that echoes the request shows no
        // credentials. Redacted before it is cut, so no secret is cut into a visible prefix.
        let secrets = result.body.isEmpty ? [] : secrets()
        let longest = secrets.first?.count ?? 0
        let excerpt = HeaderRules.redactingValues(Array(result.body.prefix(4096 + longest)), secrets)
        bodyJSON(Array(excerpt.prefix(4096)), into: &event, cut: excerpt.count > 4096 || result.bodyTruncated)
        event.set("error_kind", .optionalString(result.failure?.kind.rawValue))
        event.set("error_message", .optionalString(result.failure?.message))
        event.set("at", .int64(at))
        return event
    }

    /// A `state` event: the entry's `list --json` row as it is after the change.
    static func stateEvent(_ entry: Entry, state: String, reason: String?, at: Int64) -> JSON {
        var row = entry.listJSON(displayState: state)
        row.set("reason", .optionalString(reason))
        row.set("updated_at", .int64(at))
        var event: JSON = .object([("type", .string("state"))])
        for (k, v) in row.objectValue ?? [] { event.set(k, v) }
        return event
    }

    /// A `progress` event: bytes sent (accepted plus in flight) and accepted.
    static func progressEvent(_ entry: Entry, sent: Int64, accepted: Int64) -> JSON {
        .object([
            ("type", .string("progress")), ("id", .string(entry.id)), ("bytes_sent", .int64(sent)),
            ("bytes_accepted", .int64(accepted)), ("total_bytes", .int64(entry.totalBytes)),
        ])
    }

    /// Query strings can carry presigned credentials and userinfo a password: events show the
    /// URL without them (and a URL from `env` by its origin alone).
    static func redactURL(_ url: String, secret: Bool) -> String {
        let url = URLCheck.shown(url, secret: secret)
        guard let q = url.firstIndex(of: "?") else { return url }
        return String(url[..<q]) + "?[redacted]"
    }
}

/// A body for JSON: UTF-8 text, or base64 when it is not valid UTF-8. `cut`: the bytes are
/// the start of a longer body, so a character the cut split at the end is left out (text
/// cut at a size limit stays text).
func bodyJSON(_ bytes: [UInt8], into object: inout JSON, field: String = "body", cut: Bool = false) {
    let bytes = cut ? Array(bytes[..<endOfWholeCharacters(bytes)]) : bytes
    if let text = String(validating: bytes, as: UTF8.self) {
        object.set(field, .string(text))
    } else {
        object.set(field, .string(Base64.encode(bytes)))
        object.set("\(field)_encoding", .string("base64"))
    }
}

/// Where the last UTF-8 sequence of `bytes` starts when it is incomplete (a lead byte with
/// fewer continuation bytes than it announces), else the end.
func endOfWholeCharacters(_ bytes: [UInt8]) -> Int {
    var start = bytes.count
    // A sequence is at most 4 bytes: its lead is within the last 3 when it is incomplete.
    while start > max(0, bytes.count - 3) {
        start -= 1
        let byte = bytes[start]
        if byte & 0xC0 == 0x80 { continue }  // a continuation byte: look further back
        let length = byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 1
        return bytes.count - start < length ? start : bytes.count
    }
    return bytes.count
}

enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    static func encode(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i + 2 < bytes.count {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], alphabet[Int(n & 63)]]
            i += 3
        }
        let rest = bytes.count - i
        if rest == 1 {
            let n = UInt32(bytes[i]) << 16
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)], 61, 61]
        } else if rest == 2 {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], 61]
        }
        return String(decoding: out, as: UTF8.self)
    }
}
