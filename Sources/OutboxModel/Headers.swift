/// Header names and values: validation, merging and redaction.
package enum HeaderRules {
    /// Why a header name is not an RFC 9110 token, or nil.
    package static func nameProblem(_ name: String) -> String? {
        if name.isEmpty { return "a header name is empty" }
        // Framing is libcurl's, from the body it sends: a second length would corrupt the request.
        if ["content-length", "transfer-encoding"].contains(name.lowercased()) {
            return "header \(name) cannot be set: outbox frames the body itself"
        }
        for byte in name.utf8 {
            let ok: Bool
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"):
                ok = true
            default:
                // RFC 9110 token characters besides letters and digits
                ok = "!#$%&'*+-.^_`|~".utf8.contains(byte)
            }
            if !ok { return "header name \"\(name.prefix(64))\" has a character not allowed in header names" }
        }
        return nil
    }

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
        for (name, value) in overrides {
            let lower = name.lowercased()
            if let index = result.firstIndex(where: { $0.0.lowercased() == lower }) {
                result[index] = (name, value)
            } else {
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

    /// Headers with secret values replaced, for printing.
    package static func redacted(_ headers: [(String, String)], names: Set<String>) -> [(String, String)] {
        headers.map { names.contains($0.0.lowercased()) ? ($0.0, redactedMark) : $0 }
    }

    package static func json(_ headers: [(String, String)]) -> JSON {
        .object(headers.map { ($0.0, .string($0.1)) })
    }

    /// The headers a plugin printed: an object of names to strings, each a header that can
    /// be sent, no name twice (in any case); anything else is refused, naming the plugin.
    package static func fromPlugin(_ answer: JSON, plugin: String) throws(OutboxError) -> [(String, String)] {
        guard case let .object(members) = answer else {
            throw .invalid("\(plugin) must print a JSON object of headers, not \(answer.typeName)")
        }
        var seen: Set<String> = []
        var headers: [(String, String)] = []
        for (name, value) in members {
            guard let text = value.stringValue else {
                throw .invalid("\(plugin): header \(name.prefix(64)) must be a string, not \(value.typeName)")
            }
            if let problem = nameProblem(name) { throw .invalid("\(plugin): \(problem)") }
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
