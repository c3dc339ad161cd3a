/// A dotted path such as `vars.items.0.id`; the first segment is the root.
struct TemplatePath: Sendable, Equatable {
    let segments: [String]
    var root: String { segments[0] }
    var text: String { segments.joined(separator: ".") }
}

/// One `| filter` of a substitution.
enum TemplateFilter: Sendable, Equatable {
    case raw
    /// In a URL or a header (which may name one): encode each `/`-separated segment, keeping
    /// the slashes (a relative path).
    case path
    case json
    case xml
    case defaultValue(String)

    /// json and xml turn any value into text, so the substitution is no longer "whole".
    var producesString: Bool {
        switch self {
        case .json, .xml: return true
        case .raw, .path, .defaultValue: return false
        }
    }

    var display: String {
        switch self {
        case .raw: return "raw"
        case .path: return "path"
        case .json: return "json"
        case .xml: return "xml"
        case let .defaultValue(text):
            // Long defaults would flood error messages; the path is what identifies the tag.
            if text.count > 40 { return "default(\"…\")" }
            var escaped = ""
            for c in text.unicodeScalars {
                if c == "\"" || c == "\\" { escaped += "\\" }
                escaped.unicodeScalars.append(c)
            }
            return "default(\"\(escaped)\")"
        }
    }
}

/// `{{ path | filter | ... }}`.
struct TemplateSubstitution: Sendable, Equatable {
    let path: TemplatePath
    let filters: [TemplateFilter]

    var isRaw: Bool { filters.contains(.raw) }
    var keepsSlashes: Bool { filters.contains(.path) }
    var producesString: Bool { filters.contains { $0.producesString } }

    /// The tag as it would be written, normalized, for error messages.
    var display: String {
        "{{ " + ([path.text] + filters.map(\.display)).joined(separator: " | ") + " }}"
    }
}

indirect enum TemplateNode: Sendable {
    case text(String)
    case substitution(TemplateSubstitution)
    case loop(variable: String, path: TemplatePath, body: [TemplateNode])
}

struct TemplateSyntaxError: Error, Sendable {
    let message: String
}

/// Turns template text into nodes in one linear pass over its UTF-8 bytes.
enum TemplateParser {
    /// Roots a definition may name; a for-variable may not reuse them.
    static let knownRoots: [String] = TemplateVocabulary.roots.map(\.name)
    static let filterList = TemplateVocabulary.filters.map(\.usage).joined(separator: ", ")

    private enum Token {
        case text(String)
        case substitution(TemplateSubstitution)
        case forStart(variable: String, path: TemplatePath, offset: Int)
        case end(offset: Int)

        var isBlockTag: Bool {
            switch self {
            case .forStart, .end: return true
            default: return false
            }
        }
    }

    static func parse(_ template: String) throws(TemplateSyntaxError) -> [TemplateNode] {
        let bytes = Array(template.utf8)
        // No tag at all is the common case (literal headers, URLs): skip the token work.
        if !containsOpen(bytes) { return bytes.isEmpty ? [] : [.text(template)] }
        var tokens = try tokenize(bytes)
        trimStandaloneBlockLines(&tokens)
        return try buildTree(tokens, bytes: bytes)
    }

    private static func containsOpen(_ bytes: [UInt8]) -> Bool {
        var i = 0
        while i + 1 < bytes.count {
            if bytes[i] == UInt8(ascii: "{") && bytes[i + 1] == UInt8(ascii: "{") { return true }
            i += 1
        }
        return false
    }

    /// 1-based character position of a byte offset, computed only for error messages.
    static func position(_ offset: Int, in bytes: [UInt8]) -> Int {
        String(decoding: bytes[0..<offset], as: UTF8.self).count + 1
    }

    private static func tokenize(_ bytes: [UInt8]) throws(TemplateSyntaxError) -> [Token] {
        let open = UInt8(ascii: "{"), close = UInt8(ascii: "}"), quote = UInt8(ascii: "\""), backslash = UInt8(ascii: "\\")
        var tokens: [Token] = []
        let n = bytes.count
        var i = 0
        var literalStart = 0
        while i < n {
            guard bytes[i] == open, i + 1 < n, bytes[i + 1] == open else { i += 1; continue }
            if literalStart < i {
                tokens.append(.text(String(decoding: bytes[literalStart..<i], as: UTF8.self)))
            }
            var j = i + 2
            var inQuote = false
            var closed = false
            while j < n {
                let c = bytes[j]
                if inQuote {
                    if c == backslash { j += 2; continue }
                    if c == quote { inQuote = false }
                    j += 1
                    continue
                }
                if c == quote { inQuote = true; j += 1; continue }
                if c == close, j + 1 < n, bytes[j + 1] == close { closed = true; break }
                // A second "{{" before any "}}" means the first one was never closed.
                if c == open, j + 1 < n, bytes[j + 1] == open { break }
                j += 1
            }
            guard closed else {
                let at = position(i, in: bytes)
                if inQuote {
                    throw TemplateSyntaxError(message: "unterminated quoted string in the tag opened by \"{{\" at character \(at)")
                }
                throw TemplateSyntaxError(message: "\"{{\" at character \(at) is never closed by \"}}\"")
            }
            let content = String(decoding: bytes[(i + 2)..<j], as: UTF8.self)
            tokens.append(try parseTag(content, offset: i, bytes: bytes))
            i = j + 2
            literalStart = i
        }
        if literalStart < n {
            tokens.append(.text(String(decoding: bytes[literalStart..<n], as: UTF8.self)))
        }
        return tokens
    }

    private static func isSpace(_ c: Character) -> Bool {
        c == " " || c == "\t" || c == "\n" || c == "\r"
    }

    private static func parseTag(_ content: String, offset: Int, bytes: [UInt8]) throws(TemplateSyntaxError) -> Token {
        let trimmed = trimSpace(content)
        if trimmed.isEmpty {
            throw TemplateSyntaxError(message: "empty \"{{ }}\" at character \(position(offset, in: bytes))")
        }
        if trimmed == "end" { return .end(offset: offset) }
        if trimmed == "for" || (trimmed.hasPrefix("for") && trimmed.dropFirst(3).first.map(isSpace) == true) {
            let words = trimmed.split(whereSeparator: isSpace).map(String.init)
            guard words.count == 4, words[2] == "in" else {
                throw TemplateSyntaxError(message: "\"{{ \(trimmed) }}\" should read {{ for NAME in PATH }}")
            }
            let name = words[1]
            guard isIdentifier(name) else {
                throw TemplateSyntaxError(message: "\"\(name)\" in {{ \(trimmed) }} is not a valid loop variable name")
            }
            guard name != "loop", !knownRoots.contains(name) else {
                throw TemplateSyntaxError(message: "loop variable \"\(name)\" in {{ \(trimmed) }} hides a root; pick another name")
            }
            let path = try parsePath(words[3], tag: trimmed)
            return .forStart(variable: name, path: path, offset: offset)
        }
        guard trimmed.utf8.contains(UInt8(ascii: "|")) else {
            return .substitution(TemplateSubstitution(path: try parsePath(trimmed, tag: trimmed), filters: []))
        }
        let pieces = splitFilters(trimmed)
        let path = try parsePath(trimSpace(pieces[0]), tag: trimmed)
        var filters: [TemplateFilter] = []
        for piece in pieces.dropFirst() {
            filters.append(try parseFilter(trimSpace(piece), tag: trimmed))
        }
        return .substitution(TemplateSubstitution(path: path, filters: filters))
    }

    static func trimSpace(_ s: String) -> String {
        let utf8 = s.utf8
        func space(_ b: UInt8) -> Bool { b == 0x20 || b == 0x09 || b == 0x0A || b == 0x0D }
        guard let first = utf8.firstIndex(where: { !space($0) }) else { return "" }
        let last = utf8.lastIndex(where: { !space($0) })!
        if first == utf8.startIndex, last == utf8.index(before: utf8.endIndex) { return s }
        return String(s[first...last])
    }

    /// Splits at `|` outside double quotes, so `default("a|b")` stays one piece.
    private static func splitFilters(_ s: String) -> [String] {
        var pieces: [String] = []
        var current = ""
        var inQuote = false
        var escaped = false
        for c in s.unicodeScalars {
            if inQuote {
                if escaped { escaped = false } else if c == "\\" { escaped = true } else if c == "\"" { inQuote = false }
                current.unicodeScalars.append(c)
                continue
            }
            if c == "\"" { inQuote = true }
            if c == "|" {
                pieces.append(current)
                current = ""
                continue
            }
            current.unicodeScalars.append(c)
        }
        pieces.append(current)
        return pieces
    }

    private static func isIdentifier(_ s: String) -> Bool {
        guard let first = s.unicodeScalars.first, first == "_" || isASCIILetter(first) else { return false }
        return s.unicodeScalars.allSatisfy { $0 == "_" || isASCIILetter($0) || isASCIIDigit($0) }
    }

    private static func isASCIILetter(_ c: Unicode.Scalar) -> Bool {
        ("a"..."z").contains(c) || ("A"..."Z").contains(c)
    }

    private static func isASCIIDigit(_ c: Unicode.Scalar) -> Bool {
        ("0"..."9").contains(c)
    }

    static func parsePath(_ s: String, tag: String) throws(TemplateSyntaxError) -> TemplatePath {
        let segments = s.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        let valid =
            !s.isEmpty
            && segments.allSatisfy { segment in
                !segment.isEmpty && segment.unicodeScalars.allSatisfy { $0 == "_" || $0 == "-" || isASCIILetter($0) || isASCIIDigit($0) }
            }
        guard valid else {
            let shown = s.isEmpty ? "an empty path" : "\"\(s)\" is not a valid path"
            throw TemplateSyntaxError(message: "\(shown) in {{ \(tag) }} (expected a dotted path like vars.items.0.id)")
        }
        return TemplatePath(segments: segments)
    }

    private static func parseFilter(_ f: String, tag: String) throws(TemplateSyntaxError) -> TemplateFilter {
        if f.isEmpty { throw TemplateSyntaxError(message: "empty filter after \"|\" in {{ \(tag) }}") }
        if let known = TemplateVocabulary.filters.first(where: { $0.name == f }), let filter = known.filter { return filter }
        let name = String(f.unicodeScalars.prefix { $0 == "_" || isASCIILetter($0) || isASCIIDigit($0) })
        guard name == "default" else {
            let shown = name.isEmpty ? f : name
            throw TemplateSyntaxError(message: "unknown filter \"\(shown)\" in {{ \(tag) }} (filters: \(filterList))")
        }
        let usage = "default needs one double-quoted argument, like default(\"x\"), in {{ \(tag) }}"
        let rest = trimSpace(String(f.dropFirst(name.count)))
        guard rest.hasPrefix("("), rest.hasSuffix(")"), rest.count >= 2 else { throw TemplateSyntaxError(message: usage) }
        let inner = trimSpace(String(rest.dropFirst().dropLast()))
        var scalars = inner.unicodeScalars.makeIterator()
        guard scalars.next() == "\"" else { throw TemplateSyntaxError(message: usage) }
        var value = ""
        var closed = false
        while let c = scalars.next() {
            if closed { throw TemplateSyntaxError(message: usage) }
            if c == "\\" {
                guard let e = scalars.next(), e == "\"" || e == "\\" else {
                    throw TemplateSyntaxError(message: "default(\"...\") allows only \\\" and \\\\ escapes, in {{ \(tag) }}")
                }
                value.unicodeScalars.append(e)
            } else if c == "\"" {
                closed = true
            } else {
                value.unicodeScalars.append(c)
            }
        }
        guard closed else { throw TemplateSyntaxError(message: usage) }
        return .defaultValue(value)
    }

    /// A for/end tag alone on its line takes the whole line with it (as in Mustache),
    /// so a block laid out on its own lines adds no blank lines to a CSV or XML body.
    private static func trimStandaloneBlockLines(_ tokens: inout [Token]) {
        // Decide on the original text first: trimming for one tag must not change the verdict for the next.
        var dropLeading = [Int](repeating: 0, count: tokens.count)
        var dropTrailing = [Int](repeating: 0, count: tokens.count)
        for k in tokens.indices where tokens[k].isBlockTag {
            var before: (index: Int, drop: Int)? = nil
            if k > 0 {
                guard case let .text(prev) = tokens[k - 1], let drop = trailingLineSpace(prev, startsTemplate: k - 1 == 0) else { continue }
                before = (k - 1, drop)
            }
            var after: (index: Int, drop: Int)? = nil
            if k + 1 < tokens.count {
                guard case let .text(next) = tokens[k + 1], let drop = leadingLineSpace(next, endsTemplate: k + 2 == tokens.count) else {
                    continue
                }
                after = (k + 1, drop)
            }
            if let before { dropTrailing[before.index] = before.drop }
            if let after { dropLeading[after.index] = after.drop }
        }
        for k in tokens.indices {
            guard case let .text(s) = tokens[k], dropLeading[k] > 0 || dropTrailing[k] > 0 else { continue }
            let utf8 = Array(s.utf8)
            let start = min(dropLeading[k], utf8.count)
            let end = max(start, utf8.count - dropTrailing[k])
            tokens[k] = .text(String(decoding: utf8[start..<end], as: UTF8.self))
        }
    }

    /// Bytes of spaces/tabs after the last newline, if that is all the line holds before the tag.
    private static func trailingLineSpace(_ s: String, startsTemplate: Bool) -> Int? {
        var count = 0
        for b in s.utf8.reversed() {
            if b == UInt8(ascii: "\n") { return count }
            guard b == UInt8(ascii: " ") || b == UInt8(ascii: "\t") else { return nil }
            count += 1
        }
        return startsTemplate ? count : nil
    }

    /// Bytes of spaces/tabs plus the newline after the tag, if nothing else follows on its line.
    private static func leadingLineSpace(_ s: String, endsTemplate: Bool) -> Int? {
        var count = 0
        var iterator = s.utf8.makeIterator()
        while let b = iterator.next() {
            count += 1
            if b == UInt8(ascii: "\n") { return count }
            if b == UInt8(ascii: "\r") {
                return iterator.next() == UInt8(ascii: "\n") ? count + 1 : nil
            }
            guard b == UInt8(ascii: " ") || b == UInt8(ascii: "\t") else { return nil }
        }
        return endsTemplate ? count : nil
    }

    private static func buildTree(_ tokens: [Token], bytes: [UInt8]) throws(TemplateSyntaxError) -> [TemplateNode] {
        struct Open { let variable: String; let path: TemplatePath; let offset: Int; var parent: [TemplateNode] }
        var stack: [Open] = []
        var current: [TemplateNode] = []
        for token in tokens {
            switch token {
            case let .text(s):
                if !s.isEmpty { current.append(.text(s)) }
            case let .substitution(sub):
                current.append(.substitution(sub))
            case let .forStart(variable, path, offset):
                stack.append(Open(variable: variable, path: path, offset: offset, parent: current))
                current = []
            case let .end(offset):
                guard let open = stack.popLast() else {
                    throw TemplateSyntaxError(message: "{{ end }} at character \(position(offset, in: bytes)) has no matching {{ for }}")
                }
                let body = current
                current = open.parent
                current.append(.loop(variable: open.variable, path: open.path, body: body))
            }
        }
        if let open = stack.last {
            throw TemplateSyntaxError(
                message:
                    "{{ for \(open.variable) in \(open.path.text) }} at character \(position(open.offset, in: bytes)) is never closed by {{ end }}"
            )
        }
        return current
    }
}
