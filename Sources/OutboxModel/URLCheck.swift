/// Request URL checks done by hand: Foundation's `URL` silently re-encodes and decodes `%2F`
/// (`URL(string:)` and `.path`), which would break presigned URLs and let bad input through.
package enum URLCheck {
    /// libcurl's limit on a string option (`CURL_MAX_INPUT_LENGTH`).
    package static let maxLength = 8_000_000

    /// Validates an absolute request URL: scheme http or https only (case-insensitive), a non-empty host, no spaces / control characters / characters outside RFC 3986 (a `%` must start a valid %XX). Returns the URL unchanged (never re-encodes). Errors are E_INVALID naming `field` and the scheme or problem; never echo a full URL that may carry secrets in query strings: truncate to scheme+host.
    package static func validate(_ url: String, field: String) throws(OutboxError) -> String {
        let bytes = Array(url.utf8)
        guard !bytes.isEmpty else { throw .invalid("\(field): the URL is empty") }
        // libcurl refuses a longer one at every attempt: it could only ever fail.
        guard bytes.count <= maxLength else {
            throw .invalid("\(field): the URL is \(bytes.count) bytes, over the \(maxLength) libcurl takes")
        }

        // scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) ":"
        var i = 0
        while i < bytes.count, isSchemeByte(bytes[i], first: i == 0) { i += 1 }
        guard i > 0, i < bytes.count, bytes[i] == UInt8(ascii: ":") else {
            throw .invalid("\(field): the URL has no scheme (expected http:// or https://)")
        }
        let scheme = String(decoding: bytes[0..<i], as: UTF8.self)
        let lower = scheme.lowercased()
        guard lower == "http" || lower == "https" else {
            let shown = scheme.count > 16 ? String(scheme.prefix(16)) + "…" : scheme
            throw .invalid("\(field): scheme \"\(shown)\" is not allowed (http or https only)")
        }
        guard bytes.count >= i + 3, bytes[i + 1] == UInt8(ascii: "/"), bytes[i + 2] == UInt8(ascii: "/") else {
            throw .invalid("\(field): expected \"//\" and a host after \"\(scheme):\"")
        }

        let authorityStart = i + 3
        var authorityEnd = authorityStart
        while authorityEnd < bytes.count, !isAuthorityEnd(bytes[authorityEnd]) { authorityEnd += 1 }
        let authority = bytes[authorityStart..<authorityEnd]

        var hostStart = authorityStart
        if let at = authority.lastIndex(of: UInt8(ascii: "@")) {
            // Userinfo may hold a password: describe problems, never show it.
            for k in authorityStart..<at {
                if let problem = problem(bytes, k, allowed: isUserinfoByte) {
                    throw .invalid("\(field): the user info before \"@\" \(problem)")
                }
            }
            hostStart = at + 1
        }

        var hostEnd: Int
        if hostStart < authorityEnd, bytes[hostStart] == UInt8(ascii: "[") {
            guard let close = bytes[hostStart..<authorityEnd].firstIndex(of: UInt8(ascii: "]")) else {
                throw .invalid("\(field): the IPv6 host has no closing \"]\"")
            }
            guard isIPv6(bytes[(hostStart + 1)..<close]) else {
                throw .invalid("\(field): the host is not a valid IPv6 address in [...]")
            }
            hostEnd = close + 1
            guard hostEnd == authorityEnd || bytes[hostEnd] == UInt8(ascii: ":") else {
                throw .invalid("\(field): unexpected text after the IPv6 host's \"]\"")
            }
        } else {
            hostEnd = hostStart
            while hostEnd < authorityEnd, bytes[hostEnd] != UInt8(ascii: ":") { hostEnd += 1 }
            guard hostEnd > hostStart else { throw .invalid("\(field): the URL has an empty host") }
            for k in hostStart..<hostEnd {
                // Percent-encoded or international hosts must come as punycode: keep the host plain.
                guard isUnreserved(bytes[k]) else {
                    throw .invalid("\(field): the host name contains \(describe(bytes, k, quoted: true))")
                }
            }
        }

        if hostEnd < authorityEnd {
            // bytes[hostEnd] is ":" here.
            let digits = bytes[(hostEnd + 1)..<authorityEnd]
            guard !digits.isEmpty, digits.count <= 5, digits.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }),
                let port = Int(String(decoding: digits, as: UTF8.self)), (1...65535).contains(port)
            else {
                // An "@" further on: a password holding a raw "/", "?" or "#" ended the host
                // early, and this "port" is part of it, never shown.
                if bytes[authorityEnd...].contains(UInt8(ascii: "@")) {
                    throw .invalid(
                        "\(field): the text after the host's \":\" is no port, and an \"@\" follows: a password holding a raw \"/\", \"?\" or \"#\" must write them as %2F, %3F and %23"
                    )
                }
                throw .invalid(
                    "\(field): the port must be a number from 1 to 65535, not \"\(String(decoding: digits.prefix(12), as: UTF8.self))\"")
            }
        }

        let shown = "\(scheme)://\(String(decoding: bytes[hostStart..<authorityEnd], as: UTF8.self))"
        for k in authorityEnd..<bytes.count {
            if let problem = problem(bytes, k, allowed: isURIByte) {
                throw .invalid("\(field) (\(shown)/…): the URL \(problem) at character \(characterPosition(bytes, k))")
            }
        }
        return url
    }

    /// The host (lowercased, with port if given) for per-host scheduling.
    ///
    /// User info is dropped; "" when the URL has no `scheme://`.
    package static func hostKey(_ url: String) -> String {
        let bytes = Array(url.utf8)
        var start: Int? = nil
        var i = 0
        while i + 2 < bytes.count {
            if bytes[i] == UInt8(ascii: ":"), bytes[i + 1] == UInt8(ascii: "/"), bytes[i + 2] == UInt8(ascii: "/") { start = i + 3; break }
            if isAuthorityEnd(bytes[i]) { break }
            i += 1
        }
        guard let start else { return "" }
        var end = start
        while end < bytes.count, !isAuthorityEnd(bytes[end]) { end += 1 }
        var hostStart = start
        if let at = bytes[start..<end].lastIndex(of: UInt8(ascii: "@")) { hostStart = at + 1 }
        return String(decoding: bytes[hostStart..<end], as: UTF8.self).lowercased()
    }

    /// A relative path for a URL (`| path`): each `/`-separated segment encoded as by
    /// `encodeComponent`, so `.` and `..` segments still cannot climb; the slashes stay.
    package static func encodePath(_ s: String) -> String {
        s.split(separator: "/", omittingEmptySubsequences: false).map { encodeComponent(String($0)) }.joined(separator: "/")
    }

    /// Percent-encodes everything but RFC 3986 unreserved characters (A-Z a-z 0-9 - . _ ~); "." → "%2E", ".." → "%2E%2E".
    ///
    /// Any all-dots value is fully encoded, so it can never form a dot segment that
    /// libcurl would squash (`/x/../y` becomes `/y`), even next to another substitution.
    package static func encodeComponent(_ s: String) -> String {
        let utf8 = s.utf8
        let allDots = !utf8.isEmpty && utf8.allSatisfy { $0 == UInt8(ascii: ".") }
        var out: [UInt8] = []
        out.reserveCapacity(utf8.count)
        for b in utf8 {
            if isUnreserved(b), !(allDots && b == UInt8(ascii: ".")) {
                out.append(b)
            } else {
                out.append(UInt8(ascii: "%"))
                out.append(hexDigits[Int(b >> 4)])
                out.append(hexDigits[Int(b & 0x0F)])
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    private static let hexDigits: [UInt8] = Array("0123456789ABCDEF".utf8)

    private static func isSchemeByte(_ b: UInt8, first: Bool) -> Bool {
        let letter = (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A)
        if first { return letter }
        return letter || (b >= 0x30 && b <= 0x39) || b == UInt8(ascii: "+") || b == UInt8(ascii: "-") || b == UInt8(ascii: ".")
    }

    private static func isAuthorityEnd(_ b: UInt8) -> Bool {
        b == UInt8(ascii: "/") || b == UInt8(ascii: "?") || b == UInt8(ascii: "#")
    }

    static func isUnreserved(_ b: UInt8) -> Bool {
        (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || (b >= 0x30 && b <= 0x39)
            || b == UInt8(ascii: "-") || b == UInt8(ascii: ".") || b == UInt8(ascii: "_") || b == UInt8(ascii: "~")
    }

    private static func isSubDelim(_ b: UInt8) -> Bool {
        switch b {
        case UInt8(ascii: "!"), UInt8(ascii: "$"), UInt8(ascii: "&"), UInt8(ascii: "'"), UInt8(ascii: "("),
            UInt8(ascii: ")"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: ","), UInt8(ascii: ";"),
            UInt8(ascii: "="):
            return true
        default:
            return false
        }
    }

    private static func isUserinfoByte(_ b: UInt8) -> Bool {
        isUnreserved(b) || isSubDelim(b) || b == UInt8(ascii: ":")
    }

    /// Path, query and fragment: the RFC 3986 character set. Brackets are gen-delims that
    /// many APIs take literally in queries (`filter[name]=x`), and curl sends them as is.
    private static func isURIByte(_ b: UInt8) -> Bool {
        if isUnreserved(b) || isSubDelim(b) { return true }
        switch b {
        case UInt8(ascii: ":"), UInt8(ascii: "/"), UInt8(ascii: "?"), UInt8(ascii: "#"),
            UInt8(ascii: "["), UInt8(ascii: "]"), UInt8(ascii: "@"):
            return true
        default:
            return false
        }
    }

    private static func isHex(_ b: UInt8) -> Bool {
        (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x46) || (b >= 0x61 && b <= 0x66)
    }

    /// What is wrong with the byte at `k`, or nil; `%` must start a %XX escape.
    private static func problem(_ bytes: [UInt8], _ k: Int, allowed: (UInt8) -> Bool) -> String? {
        let b = bytes[k]
        if b == UInt8(ascii: "%") {
            if k + 2 < bytes.count, isHex(bytes[k + 1]), isHex(bytes[k + 2]) { return nil }
            return "has a \"%\" that does not start a %XX escape"
        }
        if allowed(b) { return nil }
        return "contains \(describe(bytes, k))"
    }

    private static func describe(_ bytes: [UInt8], _ k: Int, quoted: Bool = false) -> String {
        let b = bytes[k]
        if b == 0x20 { return "a space" }
        if b < 0x20 || b == 0x7F { return "a control character (0x\(String(b, radix: 16, uppercase: true)))" }
        if b >= 0x80 { return "a non-ASCII character (percent-encode it)" }
        let char = "\"\(Character(Unicode.Scalar(b)))\""
        return quoted ? char : "\(char), which must be percent-encoded"
    }

    private static func characterPosition(_ bytes: [UInt8], _ k: Int) -> Int {
        String(decoding: bytes[0..<k], as: UTF8.self).count + 1
    }

    /// RFC 3986 IPv6address: up to 8 groups of 1-4 hex digits, one `::`, an optional IPv4 tail.
    private static func isIPv6(_ s: ArraySlice<UInt8>) -> Bool {
        let text = String(decoding: s, as: UTF8.self)
        guard !text.isEmpty else { return false }
        let halves = text.splitAtDoubleColons()
        guard halves.count <= 2 else { return false }
        var groups = 0
        for (h, half) in halves.enumerated() {
            if half.isEmpty { continue }
            let parts = half.split(separator: ":", omittingEmptySubsequences: false)
            for (p, part) in parts.enumerated() {
                let isLast = h == halves.count - 1 && p == parts.count - 1
                if isLast, part.contains(".") {
                    guard isIPv4(part) else { return false }
                    groups += 2
                    continue
                }
                guard (1...4).contains(part.utf8.count), part.utf8.allSatisfy(isHex) else { return false }
                groups += 1
            }
        }
        return halves.count == 2 ? groups <= 7 : groups == 8
    }

    private static func isIPv4(_ s: Substring) -> Bool {
        let parts = s.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4
            && parts.allSatisfy { part in
                (1...3).contains(part.utf8.count) && part.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 } && Int(part)! <= 255
            }
    }
}

private extension String {
    /// Splits at each "::" (without Foundation's `components(separatedBy:)`).
    func splitAtDoubleColons() -> [String] {
        var out: [String] = []
        var current = ""
        var previousColon = false
        for c in self {
            if c == ":" {
                if previousColon {
                    current.removeLast()
                    out.append(current)
                    current = ""
                    previousColon = false
                    continue
                }
                previousColon = true
            } else {
                previousColon = false
            }
            current.append(c)
        }
        out.append(current)
        return out
    }
}

extension URLCheck {
    /// The URL with a password in its userinfo (`https://user:secret@host/`) shown as
    /// `[redacted]`, or the user when there is no password (`https://sk_live_key@host/`: an API
    /// key given as the user name), for anything printed (render, show, events).
    package static func redactingPassword(_ url: String) -> String {
        guard let range = passwordRange(url) else { return url }
        return String(url[..<range.lowerBound]) + "[redacted]" + String(url[range.upperBound...])
    }

    /// The URL as anything printed shows it (render, show, events): with its password
    /// redacted, or, when it came from `env` (`secret`), only its scheme, host and port followed by
    /// `/[redacted]`: which part of it was the secret is not known once it is rendered.
    package static func shown(_ url: String, secret: Bool) -> String {
        guard secret else { return redactingPassword(url) }
        let bytes = Array(url.utf8)
        guard let mark = bytes.indices.dropLast(2).first(where: { bytes[$0] == UInt8(ascii: ":") && bytes[$0 + 1] == UInt8(ascii: "/") }),
            bytes[mark + 2] == UInt8(ascii: "/")
        else { return "[redacted]" }
        let start = mark + 3
        var end = start
        while end < bytes.count, !isAuthorityEnd(bytes[end]) { end += 1 }
        let host = bytes[start..<end].lastIndex(of: UInt8(ascii: "@")).map { $0 + 1 } ?? start
        return String(decoding: bytes[..<start] + bytes[host..<end], as: UTF8.self) + "/[redacted]"
    }

    /// What an echo of a request to a URL from `env` would show of the secret in it (a token in
    /// its path or query): the text after its authority, its path alone, and both decoded.
    package static func secretPathTexts(_ url: String) -> [String] {
        let bytes = Array(url.utf8)
        guard let mark = bytes.indices.dropLast(2).first(where: { bytes[$0] == UInt8(ascii: ":") && bytes[$0 + 1] == UInt8(ascii: "/") }),
            bytes[mark + 2] == UInt8(ascii: "/")
        else { return [] }
        var end = mark + 3
        while end < bytes.count, !isAuthorityEnd(bytes[end]) { end += 1 }
        let rest = String(decoding: bytes[end...], as: UTF8.self)
        let path = String(rest.prefix { $0 != "?" && $0 != "#" })
        return Array(Set([rest, path, percentDecoded(rest), percentDecoded(path)]).filter { $0.utf8.count > 1 })
    }

    /// A line of text (a config file's) with the password of every URL in it shown as
    /// `[redacted]`: a URL there ends at a quote, a space, a comma or a brace too.
    package static func redactingPasswords(inText text: String) -> String {
        var bytes = Array(text.utf8)
        var i = 0
        while i + 2 < bytes.count {
            guard bytes[i] == UInt8(ascii: ":"), bytes[i + 1] == UInt8(ascii: "/"), bytes[i + 2] == UInt8(ascii: "/") else {
                i += 1
                continue
            }
            let start = i + 3
            var end = start
            while end < bytes.count, !isAuthorityEnd(bytes[end]), !" \t\"',}]".utf8.contains(bytes[end]) { end += 1 }
            if let at = bytes[start..<end].lastIndex(of: UInt8(ascii: "@")) {
                // The password; for http(s) without one, the user, which libcurl sends as the credential.
                let scheme = String(decoding: bytes[..<i].reversed().prefix { isSchemeByte($0, first: false) }.reversed(), as: UTF8.self)
                let colon = bytes[start..<at].firstIndex(of: UInt8(ascii: ":"))
                if let from = colon.map({ $0 + 1 }) ?? (["http", "https"].contains(scheme.lowercased()) && at > start ? start : nil) {
                    bytes.replaceSubrange(from..<at, with: Array("[redacted]".utf8))
                    end = from + "[redacted]".utf8.count
                }
            }
            i = end
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The URL's password as written and decoded, and the `Authorization: Basic` value libcurl
    /// makes of its userinfo: what an echo of the request would show (none without a password).
    package static func credentialValues(_ url: String) -> [String] {
        guard let range = passwordRange(url) else { return [] }
        let written = String(url[range])
        // Without a password the range is the user (no `:` before it), which libcurl sends as `user:`.
        if !url[..<range.lowerBound].hasSuffix(":") {
            let user = percentDecoded(written)
            return [written, user, S3Checksum.base64(Array("\(user):".utf8))]
        }
        // The user runs from the `//` before it to the `:` before the password.
        let beforeColon = url[..<url.index(before: range.lowerBound)]
        let user = percentDecoded(String(beforeColon[(beforeColon.lastIndex(of: "/").map(url.index(after:)) ?? beforeColon.startIndex)...]))
        let password = percentDecoded(written)
        return [written, password, S3Checksum.base64(Array("\(user):\(password)".utf8))]
    }

    /// `%XX` sequences as the bytes they stand for; a malformed one stays as written.
    package static func percentDecoded(_ text: String) -> String {
        let bytes = Array(text.utf8)
        var out: [UInt8] = []
        var i = 0
        while i < bytes.count {
            if bytes[i] == UInt8(ascii: "%"), i + 2 < bytes.count, let high = hexValue(bytes[i + 1]), let low = hexValue(bytes[i + 2]) {
                out.append(high << 4 | low)
                i += 3
            } else {
                out.append(bytes[i])
                i += 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The value of a hex digit, nil for any other byte.
    package static func hexValue(_ b: UInt8) -> UInt8? {
        switch b {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): b - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): b - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): b - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    /// The texts a var holding this URL would show its password by: the password (6 bytes or
    /// more, as every secret value; the user when there is no password), and the userinfo with
    /// it (`user:secret@`, whatever its length, which finds a short password in a var holding
    /// the whole URL).
    package static func passwordTexts(_ url: String) -> [[UInt8]] {
        guard let range = passwordRange(url), let userinfo = userinfoRange(Array(url.utf8)) else { return [] }
        let bytes = Array(url.utf8)
        // `user:secret@` is a credential by its shape, however short: no other value looks like it.
        let password = Array(url[range].utf8)
        return (password.count >= 6 ? [password] : []) + [Array(bytes[userinfo.lowerBound...userinfo.upperBound])]
    }

    /// Whether the URL has a userinfo (`user@`, `user:secret@`): libcurl sends it as
    /// `Authorization: Basic`, so the request carries credentials.
    package static func hasUserinfo(_ url: String) -> Bool {
        userinfoRange(Array(url.utf8)) != nil
    }

    /// The userinfo's bytes, from after `//` to before the `@` that ends it; nil without one.
    private static func userinfoRange(_ bytes: [UInt8]) -> Range<Int>? {
        let slash = UInt8(ascii: "/")
        guard
            let scheme = bytes.indices.dropLast(2).first(where: {
                bytes[$0] == UInt8(ascii: ":") && bytes[$0 + 1] == slash && bytes[$0 + 2] == slash
            })
        else { return nil }
        let authority = bytes[(scheme + 3)...].prefix { !isAuthorityEnd($0) }
        guard let at = authority.lastIndex(of: UInt8(ascii: "@")) else { return nil }
        return (scheme + 3)..<at
    }

    /// Works on the UTF-8 bytes (every delimiter is ASCII): `String.firstRange(of:)` cost more
    /// than the rest of an entry's rendering.
    /// The password of the userinfo, or the whole userinfo when it has no password: the user
    /// is then the credential (libcurl sends it as `Authorization: Basic` all the same).
    private static func passwordRange(_ url: String) -> Range<String.Index>? {
        let bytes = Array(url.utf8)
        guard let userinfo = userinfoRange(bytes), !userinfo.isEmpty else { return nil }
        let start = bytes[userinfo].firstIndex(of: UInt8(ascii: ":")).map { $0 + 1 } ?? userinfo.lowerBound
        let utf8 = url.utf8
        return utf8.index(utf8.startIndex, offsetBy: start)..<utf8.index(utf8.startIndex, offsetBy: userinfo.upperBound)
    }
}
