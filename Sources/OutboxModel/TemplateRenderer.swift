/// Renders parsed template nodes against a context in one mode.
struct TemplateRenderer {
    /// The most a template may render to (a text body built by loops, or one var used many times).
    static let maxRenderedBytes = 16 << 20
    /// Loop bodies one render may run, nested loops counted together.
    static let maxLoopRepeats = 1_000_000

    let mode: TemplateMode
    let field: String

    /// A substitution's value as filters transform it.
    private enum Piece {
        /// The path did not resolve; the reason says where it stopped.
        case missing(String)
        case value(JSON)
        /// Text made by a string-producing filter (json, xml).
        case text(String)
    }

    /// What a substitution finally yields.
    private enum Output {
        case value(JSON)
        case text(String)
    }

    private enum Lookup {
        case found(JSON)
        /// The reason names the deepest part of the path that did resolve.
        case missing(String)
    }

    func render(_ nodes: [TemplateNode], roots: [String: JSON]) throws(OutboxError) -> JSON {
        if mode == .value || mode == .url, nodes.count == 1, case let .substitution(sub) = nodes[0], !sub.producesString {
            return try renderWhole(sub, roots: roots)
        }
        var out = ""
        var position = URLPosition()
        var repeats = 0
        try append(nodes, roots: roots, to: &out, position: &position, repeats: &repeats)
        switch mode {
        case .url:
            position.finish()
            try checkClimb(position)
            return .string(try URLCheck.validate(out, field: field))
        case .header:
            if out.utf8.contains(where: { $0 == 0x0A || $0 == 0x0D || $0 == 0x00 }) {
                throw .invalid("\(field): header value contains CR, LF or NUL")
            }
            return .string(out)
        case .value, .text:
            return .string(out)
        }
    }

    /// Servers such as nginx decode `%2E%2E` back to `..`, so an encoded dot segment would still climb.
    private func checkClimb(_ position: URLPosition) throws(OutboxError) {
        guard let tag = position.climbingTag else { return }
        // A plugin's answer is read through hidden references: name the plugin, not those.
        let what = tag.hasPrefix(PluginAnswer.root + ".") ? "the value request_command gave" : "{{ \(tag) }}"
        throw .invalid("\(field): \(what) gives a \".\" or \"..\" path segment, which could climb the URL's path")
    }

    /// A template that is exactly one substitution keeps the value's JSON type.
    private func renderWhole(_ sub: TemplateSubstitution, roots: [String: JSON]) throws(OutboxError) -> JSON {
        let value: JSON
        switch try evaluate(sub, roots: roots) {
        case let .value(v): value = v
        case let .text(s): value = .string(s)
        }
        guard mode == .url else { return value }
        guard case let .string(url) = value else {
            throw .invalid("\(field): {{ \(sub.path.text) }} is \(article(value.typeName)); a URL must be a string")
        }
        let checked = try URLCheck.validate(url, field: field)
        // A whole URL from a var is sent as it is: a dot segment in it would still climb.
        var position = URLPosition()
        position.feed(checked, tag: sub.path.text)
        position.finish()
        try checkClimb(position)
        return .string(checked)
    }

    /// `repeats` counts the loop bodies rendered so far, across nested loops.
    private func append(
        _ nodes: [TemplateNode], roots: [String: JSON], to out: inout String, position: inout URLPosition, repeats: inout Int
    ) throws(OutboxError) {
        for node in nodes {
            switch node {
            case let .text(s):
                out += s
                if mode == .url { position.feed(s) }
            case let .substitution(sub):
                var text: String
                switch try evaluate(sub, roots: roots) {
                case let .value(v): text = try self.text(of: v, sub)
                case let .text(s): text = s
                }
                if mode == .url {
                    // A value of just `.` or `..` goes as `%2E` or `%2E%2E`, a segment of its own.
                    let onlyDots = !sub.isRaw && !sub.keepsSlashes && (text == "." || text == "..")
                    if !sub.isRaw {
                        // An encoded value cannot move the host, but it could still pick it.
                        guard position.part == .path || position.part == .query else {
                            throw .invalid(Template.inSchemeOrHost(sub, field: field))
                        }
                        text = sub.keepsSlashes ? URLCheck.encodePath(text) : URLCheck.encodeComponent(text)
                    }
                    position.feed(text, tag: text.isEmpty ? nil : sub.path.text, onlyDots: onlyDots)
                    try checkClimb(position)
                }
                out += text
                // One var used many times could render far more than the vars' own cap.
                if out.utf8.count > Self.maxRenderedBytes {
                    throw .invalid("\(field): renders more than \(Self.maxRenderedBytes >> 20) MiB (at {{ \(sub.path.text) }})")
                }
            case let .loop(variable, path, body):
                let tag = "{{ for \(variable) in \(path.text) }}"
                guard mode == .text else {
                    throw .invalid("\(field): \(tag) blocks are allowed only in a text body")
                }
                let items: [JSON]
                switch resolve(path, roots: roots) {
                case let .missing(reason):
                    throw .invalid("\(field): {{ \(path.text) }} does not resolve (\(reason))")
                case let .found(.array(list)):
                    items = list
                case let .found(other):
                    throw .invalid("\(field): \(tag): \(path.text) is \(article(other.typeName)), not a list")
                }
                for (i, item) in items.enumerated() {
                    // Loops whose inside renders nothing never reach the size cap, yet still
                    // multiply: three nested over 500 items would run for minutes.
                    repeats += 1
                    if repeats > Self.maxLoopRepeats {
                        throw .invalid("\(field): \(tag) repeats a loop's inside more than \(Self.maxLoopRepeats) times in all")
                    }
                    var inner = roots
                    inner[variable] = item
                    inner["loop"] = .object([("index", .int(i)), ("number", .int(i + 1))])
                    try append(body, roots: inner, to: &out, position: &position, repeats: &repeats)
                    // Nested loops multiply: a few hundred bytes of vars could render gigabytes.
                    if out.utf8.count > Self.maxRenderedBytes {
                        throw .invalid("\(field): \(tag) renders more than \(Self.maxRenderedBytes >> 20) MiB")
                    }
                }
            }
        }
    }

    /// Resolves the path, then applies filters left to right.
    private func evaluate(_ sub: TemplateSubstitution, roots: [String: JSON]) throws(OutboxError) -> Output {
        var piece: Piece
        switch resolve(sub.path, roots: roots) {
        case let .found(v): piece = .value(v)
        case let .missing(reason): piece = .missing(reason)
        }
        for filter in sub.filters {
            switch filter {
            case .raw:
                continue
            case .path:
                // In a URL the tag is encoded and its segments checked as the URL is rendered; a
                // value (an s3 key) is encoded where its request is made.
                guard mode == .header else { continue }
                piece = .text(try encodedPath(piece, sub))
            case let .defaultValue(fallback):
                switch piece {
                case .missing, .value(.null): piece = .value(.string(fallback))
                default: break
                }
            case .json:
                switch piece {
                case let .missing(reason): throw unresolved(sub.path, reason)
                case let .value(v): piece = .text(v.serialized())
                case let .text(s): piece = .text(JSON.string(s).serialized())
                }
            case .xml:
                switch piece {
                case let .missing(reason): throw unresolved(sub.path, reason)
                case let .value(v): piece = .text(try xmlEscaped(try text(of: v, sub), sub))
                case let .text(s): piece = .text(try xmlEscaped(s, sub))
                }
            }
        }
        switch piece {
        case let .missing(reason): throw unresolved(sub.path, reason)
        case let .value(v): return .value(v)
        case let .text(s): return .text(s)
        }
    }

    /// `| path` in a header (WebDAV's `Destination` names a URL): the value's
    /// segments percent-encoded, its slashes kept, and a `.` or `..` segment refused, as in a
    /// URL, since the server resolves them (a backslash ends a segment for this check too).
    private func encodedPath(_ piece: Piece, _ sub: TemplateSubstitution) throws(OutboxError) -> String {
        let raw: String
        switch piece {
        case let .missing(reason): throw unresolved(sub.path, reason)
        case let .value(v): raw = try text(of: v, sub)
        case let .text(s): raw = s
        }
        let segments = raw.utf8.split(omittingEmptySubsequences: false) { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "\\") }
        if segments.contains(where: { $0.elementsEqual(".".utf8) || $0.elementsEqual("..".utf8) }) {
            throw .invalid("\(field): {{ \(sub.path.text) }} gives a \".\" or \"..\" path segment, which could climb the path it names")
        }
        return URLCheck.encodePath(raw)
    }

    private func unresolved(_ path: TemplatePath, _ reason: String) -> OutboxError {
        .invalid("\(field): {{ \(path.text) }} does not resolve (\(reason))")
    }

    /// Follows a path through objects (by key) and lists (by index).
    private func resolve(_ path: TemplatePath, roots: [String: JSON]) -> Lookup {
        guard var current = roots[path.root] else {
            return .missing("no root \"\(path.root)\" here; roots: \(roots.keys.sorted().joined(separator: ", "))")
        }
        var prefix = path.root
        for segment in path.segments.dropFirst() {
            switch current {
            case let .object(members):
                guard let next = members.first(where: { $0.0 == segment })?.1 else {
                    return .missing("\(prefix) has no \"\(segment)\"")
                }
                current = next
            case let .array(items):
                guard segment.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let index = Int(segment) else {
                    return .missing("\(prefix) is a list; \"\(segment)\" is not an index")
                }
                guard index < items.count else {
                    return .missing("\(prefix) has \(items.count) item\(items.count == 1 ? "" : "s"), no index \(index)")
                }
                current = items[index]
            case .null:
                if prefix == "vars" { return .missing("the entry has no vars") }
                return .missing("\(prefix) is null")
            default:
                return .missing("\(prefix) is \(article(current.typeName)), it has no \"\(segment)\"")
            }
            prefix += "." + segment
        }
        return .found(current)
    }

    /// A value as text inside a longer string; null and containers are refused, never guessed.
    private func text(of value: JSON, _ sub: TemplateSubstitution) throws(OutboxError) -> String {
        switch value {
        case let .string(s): return s
        case let .number(n): return n
        case let .bool(b): return b ? "true" : "false"
        case .null:
            throw .invalid("\(field): {{ \(sub.path.text) }} is null; write {{ \(sub.path.text) | default(\"...\") }} to give a fallback")
        case .array, .object:
            throw .invalid(
                "\(field): {{ \(sub.path.text) }} is \(article(value.typeName)), which cannot be inserted as text; write {{ \(sub.path.text) | json }}"
            )
        }
    }

    private func xmlEscaped(_ s: String, _ sub: TemplateSubstitution) throws(OutboxError) -> String {
        var out = ""
        out.reserveCapacity(s.utf8.count)
        for scalar in s.unicodeScalars {
            switch scalar {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&apos;"
            default:
                // XML 1.0 cannot carry these even as character references.
                let v = scalar.value
                if (v < 0x20 && v != 0x09 && v != 0x0A && v != 0x0D) || v == 0xFFFE || v == 0xFFFF {
                    throw .invalid("\(field): {{ \(sub.path.text) | xml }} contains U+\(hex4(v)), which XML cannot carry")
                }
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    private func hex4(_ v: UInt32) -> String {
        let h = String(v, radix: 16, uppercase: true)
        return String(repeating: "0", count: max(0, 4 - h.count)) + h
    }

    private func article(_ typeName: String) -> String {
        switch typeName {
        case "null": return "null"
        case "object": return "an object"
        default: return "a \(typeName)"
        }
    }
}

/// Where the URL built so far ends: scheme (before `://`), authority, or path and beyond.
/// Fed each appended piece once, so tracking it stays linear in the URL's length.
struct URLPosition {
    /// `query` also covers the fragment: neither is resolved against the path.
    enum Part { case scheme, authority, path, query }
    private(set) var part = Part.scheme
    /// The substitution that made a path segment decode to `.` or `..`, once one did.
    private(set) var climbingTag: String?
    private var last1: UInt8 = 0
    private var last2: UInt8 = 0
    /// The current path segment: how many dots it decodes to while it holds nothing else.
    private var segmentDots: Int? = 0
    /// The last substitution in the current path segment (nil: the template's own text).
    private var segmentTag: String?
    /// The substitution whose text is being fed (nil: the template's own text).
    private var feeding: String?
    /// The dots of a segment that is one value of only dots, encoded (`%2E`, `%2E%2E`):
    /// the contract sends it so; 0 when the segment is anything else.
    private var wholeDotsValue = 0
    /// A `%XX` escape being read, possibly across pieces: its hex digits so far.
    private var escape: [UInt8]?

    /// Follows the URL through a piece of rendered text; `tag` names the substitution that made
    /// it, and `onlyDots` says its value was exactly `.` or `..` (encoded).
    mutating func feed(_ s: String, tag: String? = nil, onlyDots: Bool = false) {
        guard part != .query else { return }
        feeding = tag
        if part == .path, let tag { segmentTag = tag }
        let startsSegment = part == .path && segmentDots == 0 && escape == nil
        defer { if onlyDots && startsSegment, let dots = segmentDots { wholeDotsValue = dots } }
        for b in s.utf8 {
            switch part {
            case .scheme:
                if last2 == UInt8(ascii: ":"), last1 == UInt8(ascii: "/"), b == UInt8(ascii: "/") { part = .authority }
                last2 = last1
                last1 = b
            case .authority:
                if b == UInt8(ascii: "/") { part = .path; segmentTag = tag }
                if b == UInt8(ascii: "?") || b == UInt8(ascii: "#") { part = .query; return }
            case .path:
                if b == UInt8(ascii: "?") || b == UInt8(ascii: "#") {
                    endSegment()
                    part = .query
                    return
                }
                readPathByte(b)
            case .query:
                return
            }
        }
    }

    /// The end of the URL ends its last segment.
    mutating func finish() {
        if part == .path { endSegment() }
    }

    private mutating func readPathByte(_ b: UInt8) {
        if var digits = escape {
            digits.append(b)
            guard digits.count == 2 else { escape = digits; return }
            escape = nil
            guard let high = URLCheck.hexValue(digits[0]), let low = URLCheck.hexValue(digits[1]) else {
                return countSegmentByte(isDot: false)
            }
            readDecodedByte(high << 4 | low)
        } else if b == UInt8(ascii: "%") {
            escape = []
        } else {
            readDecodedByte(b)
        }
    }

    /// Servers such as nginx decode `%2F` before they resolve dot segments, so an encoded
    /// slash (or backslash, a separator to some) ends a segment here too.
    private mutating func readDecodedByte(_ b: UInt8) {
        if b == UInt8(ascii: "/") || b == UInt8(ascii: "\\") {
            endSegment()
            segmentTag = feeding
        } else {
            countSegmentByte(isDot: b == UInt8(ascii: "."))
        }
    }

    private mutating func countSegmentByte(isDot: Bool) {
        guard let dots = segmentDots else { return }
        segmentDots = isDot ? dots + 1 : nil
    }

    private mutating func endSegment() {
        if climbingTag == nil, let segmentTag, let dots = segmentDots, dots == 1 || dots == 2, dots != wholeDotsValue {
            climbingTag = segmentTag
        }
        wholeDotsValue = 0
        segmentDots = 0
        segmentTag = nil
        escape = nil
    }
}
