/// Header names and values: validation, merging and redaction.
package enum HeaderRules {
    /// Why a header name is not an RFC 9110 token, or nil.
    package static func nameProblem(_ name: String) -> String? {
        if name.isEmpty { return "a header name is empty" }
        // Framing is libcurl's, from the body it sends: a second length would corrupt the request.
        if isFraming(name) {
            return "header \(name) cannot be set: outbox frames the body itself"
        }
        if !isToken(name) { return "header name \(Units.quoted(name, limit: 64)) has a character not allowed in header names" }
        return nil
    }

    /// Content-Length or Transfer-Encoding, in any case. Compared byte by byte: every stored
    /// request's headers are checked as it is read.
    package static func isFraming(_ name: String) -> Bool {
        var name = name
        return name.withUTF8 { spells($0, contentLength) || spells($0, transferEncoding) }
    }

    private static let contentLength = Array("content-length".utf8)
    private static let transferEncoding = Array("transfer-encoding".utf8)
    private static let requestID = Array("x-request-id".utf8)
    private static let idempotencyKey = Array("idempotency-key".utf8)

    /// Why a header cannot be given in a definition, the config or a plugin's answer:
    /// X-Request-Id is outbox's, new at every attempt. One given too would go out beside it,
    /// and a server reading the first would see the same id on every retry.
    package static func givenProblem(_ name: String) -> String? {
        guard isAttemptOwn(name, idempotency: false) else { return nil }
        return "header \(name) cannot be set: outbox sends a new X-Request-Id with every attempt"
    }

    /// Why a header cannot be in a patch (`headers update`, `auth_refresh_command`): an entry
    /// keeps its Idempotency-Key for life, and each attempt gets a new X-Request-Id.
    package static func patchProblem(_ name: String) -> String? {
        guard isAttemptOwn(name) else { return nil }
        return
            "header \(name) cannot be patched: outbox sends the entry's own Idempotency-Key, given at enqueue, and a new X-Request-Id with every attempt"
    }

    /// X-Request-Id, and with `idempotency` Idempotency-Key, in any case: the headers outbox
    /// writes on every attempt, which a stored header of the same name must not double.
    package static func isAttemptOwn(_ name: String, idempotency: Bool = true) -> Bool {
        var name = name
        return name.withUTF8 { spells($0, requestID) || (idempotency && spells($0, idempotencyKey)) }
    }

    /// Whether `bytes` spell `lower` (lowercase ASCII) in any case; no lowercased copy is made,
    /// as this runs for header names on every request. Not generic: called from another
    /// module, a generic version ran unspecialized (40,000 instructions a request more).
    package static func spells(_ bytes: UnsafeBufferPointer<UInt8>, _ lower: [UInt8]) -> Bool {
        guard bytes.count == lower.count else { return false }
        for (b, l) in zip(bytes, lower) where (b >= 0x41 && b <= 0x5A ? b | 0x20 : b) != l { return false }
        return true
    }

    /// Whether `name` is made of RFC 9110 token characters only (what a header name is).
    package static func isToken(_ name: Substring) -> Bool {
        name.utf8.allSatisfy { byte in
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"):
                true
            default:
                // RFC 9110 token characters besides letters and digits
                "!#$%&'*+-.^_`|~".utf8.contains(byte)
            }
        }
    }

    package static func isToken(_ name: String) -> Bool { isToken(Substring(name)) }

    /// Lowercased names of the headers whose values are secrets whatever their names: those a
    /// template renders from the environment (the request's, or its parts'), and those
    /// headers_command gave.
    package static func secretNames(config: Config, commandHeaders: [(String, String)], request: JSON?) -> Set<String> {
        var names = Set(commandHeaders.map { $0.0.lowercased() })
        for (name, template) in config.headers where Template.readsEnvironment(template) { names.insert(name.lowercased()) }
        var written = [request?["headers"], request?["parts"]?["headers"]]
        if case let .array(items)? = request?["parts"] { written += items.map { $0["headers"] } }
        for case let .object(members)? in written {
            for (name, value) in members {
                if case let .string(template) = value, Template.readsEnvironment(template) { names.insert(name.lowercased()) }
            }
        }
        return names
    }

    /// Why a header value cannot be sent (CR, LF or NUL would split or cut the header; other
    /// control characters are not allowed in a field value), or nil.
    package static func valueProblem(_ value: String) -> String? {
        for byte in value.utf8 where byte == 0x0D || byte == 0x0A || byte == 0x00 {
            return "header value contains CR, LF or NUL"
        }
        for byte in value.utf8 where (byte < 0x20 && byte != 0x09) || byte == 0x7F {
            return "header value contains the control character 0x\(String(byte, radix: 16, uppercase: true))"
        }
        return nil
    }

    /// Merges `overrides` over `base`, names compared without regard to case; the override's
    /// spelling and position win.
    package static func merge(_ base: [(String, String)], _ overrides: [(String, String)]) -> [(String, String)] {
        var result = base
        // The first header of each name, by index: a scan per override made thousands of headers quadratic.
        var firstIndex: [String: Int] = [:]
        for (index, header) in base.enumerated() where firstIndex[header.0.lowercased()] == nil {
            firstIndex[header.0.lowercased()] = index
        }
        for (name, value) in overrides {
            let lower = name.lowercased()
            if let index = firstIndex[lower] {
                result[index] = (name, value)
            } else {
                firstIndex[lower] = result.count
                result.append((name, value))
            }
        }
        return result
    }

    package static func value(_ headers: [(String, String)], _ name: String) -> String? {
        let lower = name.lowercased()
        return headers.first { $0.0.lowercased() == lower }?.1
    }

    package static func removing(_ headers: [(String, String)], _ name: String) -> [(String, String)] {
        let lower = name.lowercased()
        return headers.filter { $0.0.lowercased() != lower }
    }

    package static let redactedMark = "[redacted]"
    /// The most headers one request may carry (servers take about 100).
    package static let maxHeaders = 1_000
    /// The most bytes of method, URL and headers: libcurl's request head holds 1 MiB, with
    /// room left for the headers it adds itself.
    package static let maxHeadBytes = 1_000_000

    /// A request head over what can be sent: libcurl builds it in a 1 MiB buffer and fails
    /// every attempt past it as "out of memory" (retried until expiry), so it is refused first.
    package enum HeadOverLimit: Error, Equatable {
        case headers(Int)
        case bytes(Int)

        /// The field to name in an error: the headers' count or the head as a whole.
        package var field: String {
            switch self {
            case .headers: "request.headers"
            case .bytes: "request"
            }
        }

        package var message: String {
            switch self {
            case let .headers(n): "\(n) headers, over the \(HeaderRules.maxHeaders) a request may carry"
            case let .bytes(n): "the URL and headers are \(n) bytes, over the \(HeaderRules.maxHeadBytes) of one request head"
            }
        }
    }

    /// Throws when a request of this method, URL and headers could not be sent.
    package static func checkHead(method: String, url: String?, headers: [(String, String)]) throws(HeadOverLimit) {
        if headers.count > maxHeaders { throw .headers(headers.count) }
        let bytes = method.utf8.count + (url?.utf8.count ?? 0) + headers.reduce(0) { $0 + $1.0.utf8.count + $1.1.utf8.count + 4 }
        if bytes > maxHeadBytes { throw .bytes(bytes) }
    }

    /// Each secret also as a JSON echo writes it (`"` and `\` escaped, and `/` as `\/`, as
    /// PHP's encoder does), longest first: an escaped echo would show it otherwise.
    package static func withEscapedForms(_ secrets: [[UInt8]]) -> [[UInt8]] {
        var all = Set(secrets)
        for secret in secrets {
            var quoted: [UInt8] = []
            secret.withUnsafeBufferPointer { JSON.appendString(utf8: $0, to: &quoted) }
            let escaped = Array(quoted.dropFirst().dropLast())
            all.insert(escaped)
            if escaped.contains(UInt8(ascii: "/")) {
                all.insert(escaped.flatMap { $0 == UInt8(ascii: "/") ? [UInt8(ascii: "\\"), $0] : [$0] })
            }
        }
        return all.sorted { $0.count > $1.count }
    }

    /// The values of secret headers as a response may echo them (an echo service, an error
    /// page): each whole value, the credentials after an auth scheme ("Bearer abc" gives
    /// "abc") and each cookie's value. Values under 6 bytes are left: they would mask ordinary text.
    package static func secretValues(_ headers: [(String, String)], names: Set<String>) -> [[UInt8]] {
        var values: Set<String> = []
        for (name, value) in headers where names.contains(name.lowercased()) {
            values.insert(value)
            if let space = value.firstIndex(of: " ") { values.insert(String(value[value.index(after: space)...])) }
            for pair in value.split(separator: ";") {
                if let equals = pair.firstIndex(of: "=") { values.insert(String(pair[pair.index(after: equals)...])) }
            }
        }
        // Longest first, so a whole value is masked before a piece of it.
        return values.map { Array($0.utf8) }.filter { $0.count >= 6 }.sorted { $0.count > $1.count }
    }

    /// `bytes` with every occurrence of a secret value replaced by the redacted mark.
    package static func redactingValues(_ bytes: [UInt8], _ secrets: [[UInt8]]) -> [UInt8] {
        guard !secrets.isEmpty, !bytes.isEmpty else { return bytes }
        var out: [UInt8] = []
        var i = 0
        var copiedTo = 0
        outer: while i < bytes.count {
            for secret in secrets where bytes[i] == secret[0] && bytes.count - i >= secret.count {
                if bytes[i..<i + secret.count].elementsEqual(secret) {
                    out += bytes[copiedTo..<i]
                    out += redactedMark.utf8
                    i += secret.count
                    copiedTo = i
                    continue outer
                }
            }
            i += 1
        }
        if copiedTo == 0 { return bytes }
        out += bytes[copiedTo...]
        return out
    }

    /// Headers with secret values replaced, for printing.
    package static func redacted(_ headers: [(String, String)], names: Set<String>) -> [(String, String)] {
        headers.map { names.contains($0.0.lowercased()) ? ($0.0, redactedMark) : $0 }
    }

    package static func json(_ headers: [(String, String)]) -> JSON {
        .object(headers.map { ($0.0, .string($0.1)) })
    }

    /// The headers a plugin printed: an object of names to strings, each a header that can
    /// be sent, no name twice (in any case); anything else is refused, naming the plugin.
    /// `patch`: the answer patches stored entries (`auth_refresh_command`), as `headers update` does.
    package static func fromPlugin(_ answer: JSON, plugin: String, patch: Bool = false) throws(OutboxError) -> [(String, String)] {
        guard case let .object(members) = answer else {
            throw .invalid("\(plugin) must print a JSON object of headers, not \(answer.typeName)")
        }
        var seen: Set<String> = []
        var headers: [(String, String)] = []
        for (name, value) in members {
            guard let text = value.stringValue else {
                throw .invalid("\(plugin): header \(name.prefix(64)) must be a string, not \(value.typeName)")
            }
            if let problem = nameProblem(name) ?? (patch ? patchProblem(name) : givenProblem(name)) {
                throw .invalid("\(plugin): \(problem)")
            }
            if let problem = valueProblem(text) { throw .invalid("\(plugin): header \(name): \(problem)") }
            guard seen.insert(name.lowercased()).inserted else {
                throw .invalid("\(plugin): header \(name) is given twice (names are compared without regard to case)")
            }
            headers.append((name, text))
        }
        return headers
    }

    package static func from(json: JSON?) -> [(String, String)] {
        guard let members = json?.objectValue else { return [] }
        return members.compactMap { name, value in value.stringValue.map { (name, $0) } }
    }
}
