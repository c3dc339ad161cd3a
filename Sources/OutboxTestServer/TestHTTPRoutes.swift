import OutboxModel

/// The paths the server answers without any script, so a test server in another process
/// (CLI tests, the demo) can be steered by URL alone.
///
/// - `/status/{code}[?retry_after=N]`: that status (`Retry-After: N` when asked).
/// - `/delay/{ms}`: 200 after `ms` milliseconds.
/// - `/reset`: connection reset after the request. `/close`: clean close, no response.
///   `/stall`: no response until the client or server gives up.
/// - `/echo`: 200 with JSON of the method, path, headers (lowercased names) and body.
/// - `/bearer/{token}[/...]`: 200 when the request carries `Authorization: Bearer {token}`, else 401.
/// - `/bytes/{n}`: an n-byte generated body (`TestResponse.patternByte`), streamed from a
///   63 KiB block (memory stays flat for any n).
///   `/reset-mid-body/{n}`: headers and n/2 of those bytes, then a reset.
///   `/slow/{n}[?chunk=B&interval_ms=M]`: n bytes sent B at a time (1024), M ms apart (100).
/// - `/seq/{name}/{c1},{c2},...`: the k-th request for `name` gets c_k; the last repeats.
/// - `/redirect/{n}`: 302 to `/redirect/{n-1}`; `/redirect/0` is 200.
///   `/redirect-to?url=U[&code=C]`: C (any 300–399, default 302) to the percent-decoded U.
///   Another host on the same server: `localhost` instead of `127.0.0.1` (libcurl compares
///   host names as written); `TestHTTPServer(host: "127.0.0.2")` is another server.
/// - Faults (`TestHTTPFaults.swift`):
///   `/reset-mid-request/{n}`: reset once n request body bytes arrived (the whole body, if shorter).
///   `/stall-after-headers[/{n}]`: 200 headers announcing n body bytes (1000), then silence.
///   `/storm/{name}/{n}/{code}[?retry_after=V]`: the first n requests for `name` get `code`
///   (with `Retry-After: V`), later ones 200.
///   `/first/{name}/{n}/{rest}`: the first n requests answer as `/{rest}` would, later ones 200
///   (`/first/a/1/malformed/garbage`).
///   `/endless[?chunk=B]`: 200 with a chunked body that never ends (B-byte chunks, 16384).
///   `/malformed/{name}`: raw bytes, then a close (`MalformedResponses.names`): `status-not-a-number`,
///   `status-four-digits`, `status-below-100`, `garbage`, `version-9.9`, `status-line-only` (no CRLF),
///   `header-no-colon`, `header-1mib`, `header-nul`, `obs-fold`, `headers-10000`,
///   `length-shorter`, `length-longer`, `length-two` (two different values), `length-negative`.
///   `/status/429?retry_after=V` passes any percent-encoded V through (`%20`, empty, `-1`).
/// - `/put/...`: 201 with JSON `{stored, body_size, body_sha256}` and an `ETag`.
/// - `/hold/{name}/{rest}`: waits at the hold `name` until released, then answers as
///   `/{rest}` would (`/hold/a/status/201`); `/hold/{name}` alone answers like any path.
/// - `/_stats[?prefix=P]`: JSON `{connections_accepted, expect_continue, count, requests}`
///   (the /_stats connection itself counts). `/_reset`: what `reset()` does.
/// - `/_control/release/{name}[?count=N]`: what `release(name, count:)` does; JSON
///   `{released, held}`. `/_control/held/{name}`: JSON `{held}`, the requests waiting there.
/// - Neither `/_stats`, `/_reset` nor `/_control/...` is recorded or scriptable.
/// - Anything else, any method: 200 JSON `{method, path, body_size, body_sha256}` with an
///   `ETag` (so PUT/POST elsewhere are recorded and answered 200), except that a body whose
///   SHA-256 is not its `x-amz-checksum-sha256` is refused as S3 does (400 `BadDigest`).
enum BuiltinRoutes {
    static func response(for request: RecordedRequest, core: ServerCore) -> TestResponse {
        let pieces = request.path.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        let path = String(pieces[0])
        let query = parseQuery(pieces.count > 1 ? String(pieces[1]) : "")
        let segments = path.split(separator: "/", omittingEmptySubsequences: false).dropFirst().map(String.init)
        let first = segments.first ?? ""
        let rest = Array(segments.dropFirst())

        switch (first, rest.count) {
        case ("status", 1):
            guard let code = Int(rest[0]), (100...999).contains(code) else { return badRoute("bad status code") }
            var headers: [(String, String)] = []
            if let retryAfter = query["retry_after"] { headers.append(("Retry-After", retryAfter)) }
            return .json(code, #"{"status":\#(code)}"#, headers: headers)
        case ("delay", 1):
            guard let ms = Int(rest[0]), ms >= 0 else { return badRoute("bad delay") }
            var response = TestResponse.json(200, #"{"delayed_ms":\#(ms)}"#)
            response.delayMs = ms
            return response
        case ("reset", 0):
            return .reset
        case ("close", 0):
            return .closeWithoutResponse
        case ("stall", 0):
            return .stall
        case ("echo", _):
            return .json(200, echoJSON(request))
        case ("bearer", 1...):
            // A server that takes one token: 200 for `Authorization: Bearer TOKEN`, else 401.
            let ok = request.header("authorization") == "Bearer \(rest[0])"
            return .json(ok ? 200 : 401, #"{"authorized":\#(ok)}"#)
        case ("bytes", 1):
            guard let count = Int64(rest[0]), count >= 0 else { return badRoute("bad byte count") }
            return .bytes(count)
        case ("reset-mid-body", 1):
            guard let count = Int64(rest[0]), count >= 0 else { return badRoute("bad byte count") }
            return .resetMidBody(bodySize: count)
        case ("slow", 1):
            guard let count = Int64(rest[0]), count >= 0,
                let chunk = Int(query["chunk"] ?? "1024"), chunk > 0,
                let interval = Int(query["interval_ms"] ?? "100"), interval >= 0
            else { return badRoute("bad slow parameters") }
            return .slowBody(bodySize: count, bytesPerChunk: chunk, intervalMs: interval)
        case ("seq", 2):
            let codes = rest[1].split(separator: ",").compactMap { Int($0) }
            guard !codes.isEmpty, codes.allSatisfy({ (100...999).contains($0) }) else { return badRoute("bad code list") }
            let name = rest[0]
            let call = core.state.withLock { state -> Int in
                let call = state.sequences[name, default: 0]
                state.sequences[name] = call + 1
                return call
            }
            let code = codes[min(call, codes.count - 1)]
            return .json(code, #"{"seq":\#(jsonString(name)),"call":\#(call + 1),"status":\#(code)}"#)
        case ("redirect", 1):
            guard let n = Int(rest[0]), n >= 0 else { return badRoute("bad redirect count") }
            if n == 0 { return .json(200, #"{"redirects_left":0}"#) }
            return TestResponse(status: 302, headers: [("Location", "/redirect/\(n - 1)")])
        case ("redirect-to", 0):
            guard let url = query["url"], !url.isEmpty else { return badRoute("missing url") }
            guard let code = Int(query["code"] ?? "302"), (300...399).contains(code) else { return badRoute("bad redirect code") }
            return TestResponse(status: code, headers: [("Location", url)])
        case ("hold", _) where !rest.isEmpty && !rest[0].isEmpty:
            var inner = request
            inner.path = "/" + rest.dropFirst().joined(separator: "/") + (pieces.count > 1 ? "?" + pieces[1] : "")
            return response(for: inner, core: core).held(rest[0])
        case ("_control", 2) where rest[0] == "release" && !rest[1].isEmpty:
            var count: Int?
            if let text = query["count"] {
                guard let n = Int(text), n >= 0 else { return badRoute("bad count") }
                count = n
            }
            let (released, held) = core.state.withLock { state in
                (state.release(rest[1], count: count), state.holds[rest[1]]?.waiting.count ?? 0)
            }
            return .json(200, #"{"released":\#(released),"held":\#(held)}"#)
        case ("_control", 2) where rest[0] == "held" && !rest[1].isEmpty:
            let held = core.state.withLock { $0.holds[rest[1]]?.waiting.count ?? 0 }
            return .json(200, #"{"held":\#(held)}"#)
        case ("_stats", 0):
            return .json(200, statsJSON(core: core, prefix: query["prefix"]))
        case ("_reset", 0):
            core.state.withLock { $0.clear() }
            return .json(200, #"{"reset":true}"#)
        default:
            if let fault = faultResponse(first: first, rest: rest, query: query, request: request, core: core) { return fault }
            if first == "put" && rest.count >= 1 {
                return .json(
                    201,
                    #"{"stored":true,"body_size":\#(request.bodySize),"body_sha256":"\#(request.bodySHA256)"}"#,
                    headers: [("ETag", etag(request))]
                )
            }
            if let refusal = S3DigestCheck.refusal(request) { return refusal }
            return .json(
                200,
                #"{"method":\#(jsonString(request.method)),"path":\#(jsonString(request.path)),"body_size":\#(request.bodySize),"body_sha256":"\#(request.bodySHA256)"}"#,
                headers: [("ETag", etag(request))]
            )
        }
    }

    /// An S3-like quoted ETag derived from the body hash, so part uploads get one back.
    static func etag(_ request: RecordedRequest) -> String {
        "\"" + String(request.bodySHA256.prefix(32)) + "\""
    }

    static func badRoute(_ message: String) -> TestResponse {
        .json(400, #"{"error":\#(jsonString(message))}"#)
    }

    static func echoJSON(_ request: RecordedRequest) -> String {
        var bodyJSON = "null"
        if let body = request.body, let text = String(validating: body, as: UTF8.self) {
            bodyJSON = jsonString(text)
        }
        return
            #"{"method":\#(jsonString(request.method)),"path":\#(jsonString(request.path)),"headers":\#(headersJSON(request.headers, only: nil)),"body_size":\#(request.bodySize),"body_sha256":"\#(request.bodySHA256)","body":\#(bodyJSON)}"#
    }

    /// Headers statistics show: the ones outbox's behaviour is checked by.
    static let statsHeaders: Set<String> = [
        "x-request-id", "idempotency-key", "content-type", "content-length", "content-range",
        "user-agent", "transfer-encoding", "expect",
    ]

    static func statsJSON(core: ServerCore, prefix: String?) -> String {
        let (records, connections, expects) = core.state.withLock {
            ($0.records, $0.connectionsAccepted, $0.expectContinueCount)
        }
        let items = records.filter { prefix == nil || $0.path.hasPrefix(prefix!) }.map { record in
            #"{"method":\#(jsonString(record.method)),"path":\#(jsonString(record.path)),"headers":\#(headersJSON(record.headers, only: statsHeaders)),"body_size":\#(record.bodySize),"body_sha256":"\#(record.bodySHA256)","connection_id":\#(record.connectionID),"completed":\#(record.completed)}"#
        }
        return
            #"{"connections_accepted":\#(connections),"expect_continue":\#(expects),"count":\#(items.count),"requests":[\#(items.joined(separator: ","))]}"#
    }

    /// A JSON object of lowercased header names (first-seen order); repeats joined ", ".
    static func headersJSON(_ headers: [(String, String)], only: Set<String>?) -> String {
        var order: [String] = []
        var values: [String: String] = [:]
        for (name, value) in headers {
            let lower = asciiLowercased(name)
            if let only, !only.contains(lower) { continue }
            if let existing = values[lower] {
                values[lower] = existing + ", " + value
            } else {
                order.append(lower)
                values[lower] = value
            }
        }
        return "{" + order.map { "\(jsonString($0)):\(jsonString(values[$0]!))" }.joined(separator: ",") + "}"
    }

    static func parseQuery(_ query: String) -> [String: String] {
        var result: [String: String] = [:]
        for pair in query.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let key = URLCheck.percentDecoded(String(parts[0]))
            result[key] = parts.count > 1 ? URLCheck.percentDecoded(String(parts[1])) : ""
        }
        return result
    }
}

/// A JSON string literal for `text`, escaping quotes, backslashes and control characters.
func jsonString(_ text: String) -> String {
    var out: [UInt8] = [UInt8(ascii: "\"")]
    let digits = Array("0123456789abcdef".utf8)
    for byte in text.utf8 {
        switch byte {
        case UInt8(ascii: "\""): out += Array(#"\""#.utf8)
        case UInt8(ascii: "\\"): out += Array(#"\\"#.utf8)
        case 10: out += Array(#"\n"#.utf8)
        case 13: out += Array(#"\r"#.utf8)
        case 9: out += Array(#"\t"#.utf8)
        case 0..<32:
            out += Array(#"\u00"#.utf8)
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 15)])
        default: out.append(byte)
        }
    }
    out.append(UInt8(ascii: "\""))
    return String(decoding: out, as: UTF8.self)
}
