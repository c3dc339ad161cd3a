/// The fault routes: answers that misbehave on purpose, steerable by URL alone (the list is
/// in the header comment of `BuiltinRoutes`).
extension BuiltinRoutes {
    /// The byte count of `/reset-mid-request/{n}`, which must be known before the body is read.
    static func resetMidRequestBytes(_ path: String) -> Int64? {
        let prefix = "/reset-mid-request/"
        guard path.hasPrefix(prefix), let n = Int64(path.dropFirst(prefix.utf8.count)), n >= 0 else { return nil }
        return n
    }

    /// The response of a fault route, or nil when `first` names none.
    static func faultResponse(
        first: String, rest: [String], query: [String: String], request: RecordedRequest, core: ServerCore
    ) -> TestResponse? {
        switch (first, rest.count) {
        case ("stall-after-headers", 0...1):
            guard let size = Int64(rest.first ?? "1000"), size > 0 else { return badRoute("bad byte count") }
            return .stallAfterHeaders(bodySize: size)
        case ("endless", 0):
            guard let chunk = Int(query["chunk"] ?? "16384"), chunk > 0 else { return badRoute("bad chunk size") }
            return .endless(bytesPerChunk: chunk)
        case ("storm", 3):
            guard let n = Int(rest[1]), n >= 0, let code = Int(rest[2]), (100...999).contains(code) else {
                return badRoute("bad storm parameters")
            }
            let call = nextCall(of: "storm/" + rest[0], core: core)
            let status = call <= n ? code : 200
            var headers: [(String, String)] = []
            if status == code, let retryAfter = query["retry_after"] { headers.append(("Retry-After", retryAfter)) }
            return .json(status, #"{"storm":\#(jsonString(rest[0])),"call":\#(call),"status":\#(status)}"#, headers: headers)
        case ("first", 3...):
            guard let n = Int(rest[1]), n >= 0, !rest[0].isEmpty else { return badRoute("bad first parameters") }
            let call = nextCall(of: "first/" + rest[0], core: core)
            guard call <= n else { return .json(200, #"{"first":\#(jsonString(rest[0])),"call":\#(call)}"#) }
            var inner = request
            let pieces = request.path.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
            inner.path = "/" + rest.dropFirst(2).joined(separator: "/") + (pieces.count > 1 ? "?" + pieces[1] : "")
            return response(for: inner, core: core)
        case ("malformed", 1):
            guard let bytes = MalformedResponses.bytes(rest[0]) else { return badRoute("unknown malformed response") }
            return .raw(bytes)
        default:
            return nil
        }
    }

    /// Counts requests for a named counter (1 for the first); `reset()` clears them.
    private static func nextCall(of name: String, core: ServerCore) -> Int {
        core.state.withLock { state -> Int in
            let call = state.sequences[name, default: 0] + 1
            state.sequences[name] = call
            return call
        }
    }
}

/// The bytes of `/malformed/{name}`: each breaks HTTP/1.1 framing or syntax in one way.
package enum MalformedResponses {
    /// Every name `/malformed/` answers.
    package static let names = [
        "status-not-a-number", "status-four-digits", "status-below-100", "garbage", "version-9.9", "status-line-only",
        "header-no-colon", "header-1mib", "header-nul", "obs-fold", "headers-10000",
        "length-shorter", "length-longer", "length-two", "length-negative",
    ]

    /// The response bytes for `name`, nil for an unknown name.
    package static func bytes(_ name: String) -> [UInt8]? {
        let ok = "HTTP/1.1 200 OK\r\n"
        let end = "Content-Length: 2\r\n\r\nok"
        switch name {
        case "status-not-a-number": return Array("HTTP/1.1 abc OK\r\n\(end)".utf8)
        case "status-four-digits": return Array("HTTP/1.1 2000 X\r\n\(end)".utf8)
        case "status-below-100": return Array("HTTP/1.1 099 X\r\n\(end)".utf8)
        case "garbage": return [0x00, 0xFF, 0xFE, 0x80] + Array("\u{7F}garbage\r\n\r\n".utf8)
        case "version-9.9": return Array("HTTP/9.9 200 OK\r\n\(end)".utf8)
        // No line ending at all, then the close.
        case "status-line-only": return Array("HTTP/1.1 200 OK".utf8)
        case "header-no-colon": return Array("\(ok)X-Fine: yes\r\nNo colon here\r\n\(end)".utf8)
        case "header-1mib":
            return Array("\(ok)X-Big: ".utf8) + [UInt8](repeating: UInt8(ascii: "a"), count: 1 << 20) + Array("\r\n\(end)".utf8)
        case "header-nul": return Array("\(ok)X-Nul: a".utf8) + [0] + Array("b\r\n\(end)".utf8)
        // Obsolete line folding: the value continues on the next line.
        case "obs-fold": return Array("\(ok)X-Folded: first\r\n  second\r\n\(end)".utf8)
        case "headers-10000":
            var text = ok
            for i in 0..<10_000 { text += "X-Header-\(i): \(i)\r\n" }
            return Array((text + end).utf8)
        // The body is longer than announced: the client reads 2 bytes, 5 are left over.
        case "length-shorter": return Array("\(ok)Content-Length: 2\r\n\r\nokEXTRA".utf8)
        // The close comes 8 bytes early.
        case "length-longer": return Array("\(ok)Content-Length: 10\r\n\r\nok".utf8)
        case "length-two": return Array("\(ok)Content-Length: 2\r\nContent-Length: 3\r\n\r\nok!".utf8)
        case "length-negative": return Array("\(ok)Content-Length: -1\r\n\r\nok".utf8)
        default: return nil
        }
    }
}
