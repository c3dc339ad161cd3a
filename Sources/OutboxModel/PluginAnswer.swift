/// A plugin's answer (`request_command`) is data, never a template: a var whose value is
/// `{{ env.API_TOKEN }}` must not reach the wire as the secret. Its strings are moved into
/// a list the request builder reads as the `literal` root, and each is replaced by a
/// whole-value reference to itself, which renders to exactly that string. The one
/// exception is `{{ part.* }}` inside a parts plan's `url` and `headers`, rendered per
/// part; the rest of such a string is taken literally too.
package enum PluginAnswer {
    static let root = "literal"

    /// The answer with every string made literal, and the strings themselves (for `RenderInputs.literals`).
    package static func literalized(_ answer: JSON) -> (tree: JSON, literals: JSON) {
        var literals: [JSON] = []
        let tree = literalize(answer, path: [], literals: &literals)
        return (tree, .array(literals))
    }

    private static func literalize(_ value: JSON, path: [String], literals: inout [JSON]) -> JSON {
        switch value {
        case let .string(text):
            // Read as values, never rendered: left as they are.
            if let first = path.first, ["accept", "retry", "expires_in"].contains(first) { return value }
            // A parts plan's sizes too ("8MiB"): read as values.
            if path.count > 2, path[0] == "parts", path[1] == "plan" { return value }
            if isPerPart(path) { return partsURL(text, literals: &literals) }
            return .string(reference(text, literals: &literals))
        case let .array(items):
            return .array(items.enumerated().map { literalize($1, path: path + [String($0)], literals: &literals) })
        case let .object(members):
            return .object(members.map { ($0, literalize($1, path: path + [$0], literals: &literals)) })
        default:
            return value
        }
    }

    /// A parts plan's or listed part's `url`, or one of its `headers`: rendered per part.
    static func isPerPart(_ path: [String]) -> Bool {
        guard path.first == "parts" else { return false }
        var rest = path.dropFirst()
        if let index = rest.first, Int(index) != nil { rest = rest.dropFirst() }
        return rest == ["url"] || (rest.count == 2 && rest.first == "headers")
    }

    private static func reference(_ text: String, literals: inout [JSON], raw: Bool = false) -> String {
        literals.append(.string(text))
        return "{{ \(root).\(literals.count - 1)\(raw ? " | raw" : "") }}"
    }

    /// A per-part string: its `{{ part.NAME }}` tags stay, every other piece becomes a literal
    /// inserted as it is (not percent-encoded again).
    private static func partsURL(_ text: String, literals: inout [JSON]) -> JSON {
        var out = ""
        var rest = Substring(text)
        while let open = rest.firstRange(of: "{{") {
            guard let close = rest[open.upperBound...].firstRange(of: "}}") else { break }
            let inner = String(rest[open.upperBound..<close.lowerBound]).trimmingSpaces
            let isPart = inner.hasPrefix("part.") && inner.dropFirst(5).allSatisfy { $0.isLetter }
            guard isPart else {
                // Not a part tag: the text up to and including this "{{" is literal.
                let literal = rest[..<open.upperBound]
                out += reference(String(literal), literals: &literals, raw: true)
                rest = rest[open.upperBound...]
                continue
            }
            if open.lowerBound > rest.startIndex { out += reference(String(rest[..<open.lowerBound]), literals: &literals, raw: true) }
            out += "{{ " + inner + " }}"
            rest = rest[close.upperBound...]
        }
        if !rest.isEmpty { out += reference(String(rest), literals: &literals, raw: true) }
        return .string(out)
    }
}
