/// A JSON value that keeps object key order and number text exactly as written.
///
/// Foundation's JSON loses both (dictionary order varies per process; `1` can come
/// back as `true`; integers above 2^53 lose precision), and outbox hashes canonical
/// bytes of bodies, so it carries its own type.
package enum JSON: Sendable, Equatable {
    case null
    case bool(Bool)
    /// The number's text, validated as a JSON number.
    case number(String)
    case string(String)
    case array([JSON])
    /// Members in the order they were written; keys are unique.
    case object([(String, JSON)])

    package static func == (lhs: JSON, rhs: JSON) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): return true
        case let (.bool(a), .bool(b)): return a == b
        case let (.number(a), .number(b)): return a == b
        case let (.string(a), .string(b)): return a == b
        case let (.array(a), .array(b)): return a == b
        case let (.object(a), .object(b)):
            return a.count == b.count && zip(a, b).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        default: return false
        }
    }

    package static func int(_ value: Int) -> JSON { .number(String(value)) }
    package static func int64(_ value: Int64) -> JSON { .number(String(value)) }
    package static func optionalInt(_ value: Int64?) -> JSON { value.map { .number(String($0)) } ?? .null }
    package static func optionalString(_ value: String?) -> JSON { value.map { .string($0) } ?? .null }

    package subscript(key: String) -> JSON? {
        guard case let .object(members) = self else { return nil }
        return members.first { $0.0 == key }?.1
    }

    package var stringValue: String? {
        if case let .string(s) = self { return s }
        return nil
    }

    package var boolValue: Bool? {
        if case let .bool(b) = self { return b }
        return nil
    }

    package var int64Value: Int64? {
        if case let .number(text) = self { return Int64(text) }
        return nil
    }

    package var doubleValue: Double? {
        if case let .number(text) = self { return Double(text) }
        return nil
    }

    package var arrayValue: [JSON]? {
        if case let .array(a) = self { return a }
        return nil
    }

    package var objectValue: [(String, JSON)]? {
        if case let .object(o) = self { return o }
        return nil
    }

    package var isNull: Bool {
        if case .null = self { return true }
        return false
    }

    /// Whether arrays and objects nest more than `limit` levels deep (stops looking there).
    package func nests(deeperThan limit: Int) -> Bool {
        switch self {
        case let .array(items): return limit == 0 || items.contains { $0.nests(deeperThan: limit - 1) }
        case let .object(members): return limit == 0 || members.contains { $0.1.nests(deeperThan: limit - 1) }
        default: return false
        }
    }

    /// A short name of the value's type, for error messages.
    package var typeName: String {
        switch self {
        case .null: return "null"
        case .bool: return "boolean"
        case .number: return "number"
        case .string: return "string"
        case .array: return "list"
        case .object: return "object"
        }
    }

    /// Sets or replaces a member of an object (appending keeps order stable).
    package mutating func set(_ key: String, _ value: JSON) {
        guard case var .object(members) = self else { return }
        if let index = members.firstIndex(where: { $0.0 == key }) {
            members[index].1 = value
        } else {
            members.append((key, value))
        }
        self = .object(members)
    }

    package mutating func remove(_ key: String) {
        guard case var .object(members) = self else { return }
        members.removeAll { $0.0 == key }
        self = .object(members)
    }
}

// MARK: - Writing

extension JSON {
    /// Compact JSON text. With `sortedKeys`, object members are ordered by key
    /// (UTF-8 byte order), which gives the canonical form used for hashing.
    package func serialized(sortedKeys: Bool = false) -> String {
        String(decoding: serializedBytes(sortedKeys: sortedKeys), as: UTF8.self)
    }

    /// `serialized` as UTF-8 bytes, for a body, a hash or a child's stdin (no String between).
    package func serializedBytes(sortedKeys: Bool = false) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(128)
        write(to: &out, sortedKeys: sortedKeys)
        return out
    }

    /// JSON text indented by two spaces, for people.
    package func pretty() -> String {
        var out: [UInt8] = []
        writePretty(to: &out, indent: 0)
        return String(decoding: out, as: UTF8.self)
    }

    /// Compact JSON text appended as UTF-8 bytes (one String is made at the end, if any).
    func write(to out: inout [UInt8], sortedKeys: Bool) {
        switch self {
        case .null: out += "null".utf8
        case let .bool(b): out += (b ? "true" : "false").utf8
        case let .number(text): out += text.utf8
        case let .string(s): JSON.appendString(s, to: &out)
        case let .array(items):
            out.append(UInt8(ascii: "["))
            for (i, item) in items.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                item.write(to: &out, sortedKeys: sortedKeys)
            }
            out.append(UInt8(ascii: "]"))
        case let .object(members):
            out.append(UInt8(ascii: "{"))
            let ordered = sortedKeys ? members.sorted { $0.0.utf8.lexicographicallyPrecedes($1.0.utf8) } : members
            for (i, (key, value)) in ordered.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSON.appendString(key, to: &out)
                out.append(UInt8(ascii: ":"))
                value.write(to: &out, sortedKeys: sortedKeys)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    private func writePretty(to out: inout [UInt8], indent: Int) {
        let pad = Array(repeating: UInt8(ascii: " "), count: 2 * (indent + 1))
        let closePad = pad.dropLast(2)
        switch self {
        case let .array(items) where !items.isEmpty:
            out += "[\n".utf8
            for (i, item) in items.enumerated() {
                out += pad
                item.writePretty(to: &out, indent: indent + 1)
                out += (i == items.count - 1 ? "\n" : ",\n").utf8
            }
            out += closePad
            out.append(UInt8(ascii: "]"))
        case let .object(members) where !members.isEmpty:
            out += "{\n".utf8
            for (i, (key, value)) in members.enumerated() {
                out += pad
                JSON.appendString(key, to: &out)
                out += ": ".utf8
                value.writePretty(to: &out, indent: indent + 1)
                out += (i == members.count - 1 ? "\n" : ",\n").utf8
            }
            out += closePad
            out.append(UInt8(ascii: "}"))
        default:
            write(to: &out, sortedKeys: false)
        }
    }

    /// Appends `s` as a JSON string literal (quotes and escapes; `/` is not escaped).
    package static func appendString(_ s: String, to out: inout [UInt8]) {
        var text = s
        text.withUTF8 { appendString(utf8: $0, to: &out) }
    }

    /// Appends UTF-8 text as a JSON string literal: `"` `\\` and control characters
    /// escaped (short forms where JSON has them), and so are DEL, the C1 controls and the
    /// bidirectional overrides (JSON allows it; a terminal showing the text then cannot act
    /// on them); everything else copied as is.
    package static func appendString(utf8 text: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var start = 0
        var i = -1
        while true {
            // A table lookup per byte: most strings (paths, URLs) have nothing to escape.
            i = nextEscapeCandidate(text, after: i)
            guard i < text.count else { break }
            let byte = text[i]
            guard i >= start else { continue }
            let length = escapedLength(text, at: i)
            guard length > 0 else { continue }
            if start < i { out.append(contentsOf: UnsafeBufferPointer(rebasing: text[start..<i])) }
            start = i + length
            // Byte by byte, nothing allocated: a body of control bytes has one escape a byte.
            out.append(0x5C)
            switch byte {
            case 0x22: out.append(0x22)
            case 0x5C: out.append(0x5C)
            case 0x0A: out.append(UInt8(ascii: "n"))
            case 0x0D: out.append(UInt8(ascii: "r"))
            case 0x09: out.append(UInt8(ascii: "t"))
            case 0x08: out.append(UInt8(ascii: "b"))
            case 0x0C: out.append(UInt8(ascii: "f"))
            default:
                var scalar = UInt32(byte)
                if length == 2 { scalar = UInt32(text[i + 1]) }
                if length == 3 { scalar = 0x2000 | UInt32(text[i + 1] & 0x3F) << 6 | UInt32(text[i + 2] & 0x3F) }
                func hex(_ shift: UInt32) -> UInt8 {
                    let digit = UInt8(truncatingIfNeeded: scalar >> shift & 0xF)
                    return digit < 10 ? 0x30 + digit : 0x57 + digit
                }
                out.append(UInt8(ascii: "u"))
                out.append(hex(12))
                out.append(hex(8))
                out.append(hex(4))
                out.append(hex(0))
            }
        }
        out.append(contentsOf: UnsafeBufferPointer(rebasing: text[start...]))
        out.append(UInt8(ascii: "\""))
    }

    /// Whether UTF-8 text goes into a JSON string literal as it is, with no escape.
    package static func needsNoEscape(utf8 text: UnsafeBufferPointer<UInt8>) -> Bool {
        nextEscapeCandidate(text, after: -1) == text.count
    }

    /// The first byte after `i` that may need an escape (`text.count` if none): an ASCII
    /// control, `"`, `\\`, DEL, or the lead byte of a C1 control or a bidirectional override.
    private static func nextEscapeCandidate(_ text: UnsafeBufferPointer<UInt8>, after i: Int) -> Int {
        var j = i + 1
        escapeCandidates.withUnsafeBufferPointer { table in
            while j < text.count, !table[Int(text[j])] { j += 1 }
        }
        return j
    }

    private static let escapeCandidates: [Bool] = (0..<256).map { b in
        b < 0x20 || b == 0x22 || b == 0x5C || b == 0x7F || b == 0xC2 || b == 0xE2
    }

    /// How many bytes at `i` one escape replaces: 1 for an ASCII byte that needs one, 2 for a
    /// C1 control (C2 80–9F), 3 for a bidirectional override (U+202A–202E, U+2066–2069), 0
    /// for a lead byte of anything else.
    private static func escapedLength(_ text: UnsafeBufferPointer<UInt8>, at i: Int) -> Int {
        switch text[i] {
        case 0xC2: return i + 1 < text.count && (0x80...0x9F).contains(text[i + 1]) ? 2 : 0
        case 0xE2:
            guard i + 2 < text.count else { return 0 }
            let (b1, b2) = (text[i + 1], text[i + 2])
            return b1 == 0x80 && (0xAA...0xAE).contains(b2) || b1 == 0x81 && (0xA6...0xA9).contains(b2) ? 3 : 0
        default: return 1
        }
    }
}

/// An object's compact JSON text written member by member, with no tree of values built
/// and freed first: the bytes `JSON.object(members).serialized()` would make.
package struct JSONObjectText {
    package private(set) var bytes: [UInt8] = [UInt8(ascii: "{")]

    package init(capacity: Int = 64) { bytes.reserveCapacity(capacity) }

    /// A member whose value `write` appends as JSON text.
    package mutating func add(_ key: String, _ write: (inout [UInt8]) -> Void) {
        if bytes.count > 1 { bytes.append(UInt8(ascii: ",")) }
        JSON.appendString(key, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
        write(&bytes)
    }

    package mutating func add(_ key: String, _ value: JSON) { add(key) { value.write(to: &$0, sortedKeys: false) } }

    /// A string member, `null` for nil.
    package mutating func add(_ key: String, string: String?) {
        add(key) { out in
            if let string { JSON.appendString(string, to: &out) } else { out += "null".utf8 }
        }
    }

    package mutating func add(_ key: String, integer: Int64) { add(key) { JSONObjectText.appendDecimal(integer, to: &$0) } }

    package mutating func add(_ key: String, integer: UInt64) { add(key) { JSONObjectText.appendDecimal(integer, to: &$0) } }

    /// A boolean member, `null` for nil.
    package mutating func add(_ key: String, bool: Bool?) {
        add(key) { out in
            let word: StaticString = bool.map { $0 ? "true" : "false" } ?? "null"
            word.withUTF8Buffer { out.append(contentsOf: $0) }
        }
    }

    package mutating func add(_ key: String, object: JSONObjectText) { add(key) { $0 += object.closed } }

    /// The finished object's bytes.
    package var closed: [UInt8] { bytes + [UInt8(ascii: "}")] }

    package var text: String { String(decoding: closed, as: UTF8.self) }

    /// Appends the decimal digits of `value` (what `String(value)` spells, without making one).
    package static func appendDecimal(_ value: Int64, to out: inout [UInt8]) {
        if value < 0 { out.append(UInt8(ascii: "-")) }
        appendDecimal(value.magnitude, to: &out)
    }

    package static func appendDecimal(_ value: UInt64, to out: inout [UInt8]) {
        var rest = value
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // 24 bytes: room for the 20 digits of any UInt64
        withUnsafeMutableBytes(of: &digits) { buffer in
            var at = buffer.count
            repeat {
                at -= 1
                buffer[at] = UInt8(ascii: "0") + UInt8(rest % 10)
                rest /= 10
            } while rest > 0
            out.append(contentsOf: buffer[at...])
        }
    }
}
