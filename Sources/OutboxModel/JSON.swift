/// A JSON value that keeps object key order and number text exactly as written.
///
/// Foundation's JSON loses both (dictionary order varies per process; `1` can come
/// back as `true`; integers above 2^53 lose precision), and outbox hashes canonical
/// bytes of bodies, so it carries its own type.
public enum JSON: Sendable, Equatable {
    case null
    case bool(Bool)
    /// The number's text, validated as a JSON number.
    case number(String)
    case string(String)
    case array([JSON])
    /// Members in the order they were written; keys are unique.
    case object([(String, JSON)])

    public static func == (lhs: JSON, rhs: JSON) -> Bool {
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

    public static func int(_ value: Int) -> JSON { .number(String(value)) }
    public static func int64(_ value: Int64) -> JSON { .number(String(value)) }
    public static func optionalInt(_ value: Int64?) -> JSON { value.map { .number(String($0)) } ?? .null }
    public static func optionalString(_ value: String?) -> JSON { value.map { .string($0) } ?? .null }

    public subscript(key: String) -> JSON? {
        guard case let .object(members) = self else { return nil }
        return members.first { $0.0 == key }?.1
    }

    public var stringValue: String? {
        if case let .string(s) = self { return s }
        return nil
    }

    public var boolValue: Bool? {
        if case let .bool(b) = self { return b }
        return nil
    }

    public var int64Value: Int64? {
        if case let .number(text) = self { return Int64(text) }
        return nil
    }

    public var doubleValue: Double? {
        if case let .number(text) = self { return Double(text) }
        return nil
    }

    public var arrayValue: [JSON]? {
        if case let .array(a) = self { return a }
        return nil
    }

    public var objectValue: [(String, JSON)]? {
        if case let .object(o) = self { return o }
        return nil
    }

    public var isNull: Bool {
        if case .null = self { return true }
        return false
    }

    /// A short name of the value's type, for error messages.
    public var typeName: String {
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
    public mutating func set(_ key: String, _ value: JSON) {
        guard case var .object(members) = self else { return }
        if let index = members.firstIndex(where: { $0.0 == key }) {
            members[index].1 = value
        } else {
            members.append((key, value))
        }
        self = .object(members)
    }

    public mutating func remove(_ key: String) {
        guard case var .object(members) = self else { return }
        members.removeAll { $0.0 == key }
        self = .object(members)
    }
}

// MARK: - Writing

extension JSON {
    /// Compact JSON text. With `sortedKeys`, object members are ordered by key
    /// (UTF-8 byte order), which gives the canonical form used for hashing.
    public func serialized(sortedKeys: Bool = false) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(128)
        write(to: &out, sortedKeys: sortedKeys)
        return String(decoding: out, as: UTF8.self)
    }

    /// JSON text indented by two spaces, for people.
    public func pretty() -> String {
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
    public static func appendString(_ s: String, to out: inout [UInt8]) {
        var text = s
        text.withUTF8 { appendString(utf8: $0, to: &out) }
    }

    /// Appends UTF-8 text as a JSON string literal: `"` `\\` and control characters
    /// escaped (short forms where JSON has them), everything else copied as is.
    public static func appendString(utf8 text: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var start = 0
        for (i, byte) in text.enumerated() where byte < 0x20 || byte == 0x22 || byte == 0x5C {
            out.append(contentsOf: UnsafeBufferPointer(rebasing: text[start..<i]))
            start = i + 1
            switch byte {
            case 0x22: out += [0x5C, 0x22]
            case 0x5C: out += [0x5C, 0x5C]
            case 0x0A: out += [0x5C, UInt8(ascii: "n")]
            case 0x0D: out += [0x5C, UInt8(ascii: "r")]
            case 0x09: out += [0x5C, UInt8(ascii: "t")]
            case 0x08: out += [0x5C, UInt8(ascii: "b")]
            case 0x0C: out += [0x5C, UInt8(ascii: "f")]
            default:
                let digits = Array("0123456789abcdef".utf8)
                out += [0x5C, UInt8(ascii: "u"), 0x30, 0x30, digits[Int(byte >> 4)], digits[Int(byte & 0x0F)]]
            }
        }
        out.append(contentsOf: UnsafeBufferPointer(rebasing: text[start...]))
        out.append(UInt8(ascii: "\""))
    }
}

// MARK: - Reading

/// Why a JSON text could not be read, with the byte offset where reading stopped.
public struct JSONParseError: Error, Sendable, Equatable, CustomStringConvertible {
    public var offset: Int
    public var message: String
    public var description: String { "\(message) at byte \(offset + 1)" }
}

extension JSON {
    /// Parses one JSON document (RFC 8259); trailing non-space text is an error.
    public static func parse(_ text: String) throws(JSONParseError) -> JSON {
        var text = text
        return try text.withUTF8 { utf8 in Result { () throws(JSONParseError) in try parse(utf8: utf8) } }.get()
    }

    public static func parse(bytes: inout [UInt8]) throws(JSONParseError) -> JSON {
        try bytes.withUnsafeBufferPointer { buffer throws(JSONParseError) in try parse(utf8: buffer) }
    }

    /// Parses UTF-8 text the caller keeps alive for the call (unchecked indexing: the
    /// reader tests every index against the count itself).
    static func parse(utf8: UnsafeBufferPointer<UInt8>) throws(JSONParseError) -> JSON {
        var parser = JSONReader(bytes: utf8)
        parser.skipSpace()
        let value = try parser.readValue(depth: 0)
        parser.skipSpace()
        if parser.index != parser.bytes.count {
            throw JSONParseError(offset: parser.index, message: "unexpected text after the JSON value")
        }
        return value
    }
}

private struct JSONReader {
    let bytes: UnsafeBufferPointer<UInt8>
    var index = 0
    static let maxDepth = 512

    init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

    mutating func skipSpace() {
        while index < bytes.count, bytes[index] == 0x20 || bytes[index] == 0x0A || bytes[index] == 0x0D || bytes[index] == 0x09 {
            index += 1
        }
    }

    func fail(_ message: String) -> JSONParseError { JSONParseError(offset: index, message: message) }

    mutating func readValue(depth: Int) throws(JSONParseError) -> JSON {
        guard depth < Self.maxDepth else { throw fail("nesting deeper than \(Self.maxDepth)") }
        guard index < bytes.count else { throw fail("unexpected end of JSON") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try readObject(depth: depth)
        case UInt8(ascii: "["): return try readArray(depth: depth)
        case UInt8(ascii: "\""): return .string(try readString())
        case UInt8(ascii: "t"): try expectWord("true"); return .bool(true)
        case UInt8(ascii: "f"): try expectWord("false"); return .bool(false)
        case UInt8(ascii: "n"): try expectWord("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try readNumber())
        default: throw fail("unexpected character")
        }
    }

    mutating func expectWord(_ word: StaticString) throws(JSONParseError) {
        let count = word.utf8CodeUnitCount
        guard index + count <= bytes.count else { throw fail("unexpected end of JSON") }
        let matches = word.withUTF8Buffer { buffer in
            (0..<count).allSatisfy { bytes[index + $0] == buffer[$0] }
        }
        guard matches else { throw fail("unexpected character") }
        index += count
    }

    mutating func readObject(depth: Int) throws(JSONParseError) -> JSON {
        index += 1
        var members: [(String, JSON)] = []
        // Objects are mostly small: scanning their keys beats hashing each into a Set.
        var seen: Set<String>?
        skipSpace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") { index += 1; return .object([]) }
        while true {
            skipSpace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a string key") }
            let key = try readString()
            if members.count < 16 {
                if members.contains(where: { $0.0 == key }) { throw fail("duplicate key \"\(key)\"") }
            } else {
                if seen == nil { seen = Set(members.map(\.0)) }
                guard seen!.insert(key).inserted else { throw fail("duplicate key \"\(key)\"") }
            }
            skipSpace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
            index += 1
            skipSpace()
            members.append((key, try readValue(depth: depth + 1)))
            skipSpace()
            guard index < bytes.count else { throw fail("unexpected end of JSON") }
            if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
            if bytes[index] == UInt8(ascii: "}") { index += 1; return .object(members) }
            throw fail("expected ',' or '}'")
        }
    }

    mutating func readArray(depth: Int) throws(JSONParseError) -> JSON {
        index += 1
        var items: [JSON] = []
        skipSpace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") { index += 1; return .array([]) }
        while true {
            skipSpace()
            items.append(try readValue(depth: depth + 1))
            skipSpace()
            guard index < bytes.count else { throw fail("unexpected end of JSON") }
            if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
            if bytes[index] == UInt8(ascii: "]") { index += 1; return .array(items) }
            throw fail("expected ',' or ']'")
        }
    }

    mutating func readNumber() throws(JSONParseError) -> String {
        let start = index
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        func digits(_ r: inout JSONReader) -> Int {
            let s = r.index
            while r.index < r.bytes.count, r.bytes[r.index] >= 0x30, r.bytes[r.index] <= 0x39 { r.index += 1 }
            return r.index - s
        }
        guard index < bytes.count else { throw fail("incomplete number") }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else if digits(&self) == 0 {
            throw fail("incomplete number")
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard digits(&self) > 0 else { throw fail("incomplete number") }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard digits(&self) > 0 else { throw fail("incomplete number") }
        }
        return String(decoding: bytes[start..<index], as: UTF8.self)
    }

    mutating func readHex4() throws(JSONParseError) -> UInt32 {
        guard index + 4 <= bytes.count else { throw fail("incomplete \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let c = bytes[index]
            let digit: UInt32
            switch c {
            case 0x30...0x39: digit = UInt32(c - 0x30)
            case 0x41...0x46: digit = UInt32(c - 0x41 + 10)
            case 0x61...0x66: digit = UInt32(c - 0x61 + 10)
            default: throw fail("bad \\u escape")
            }
            value = value << 4 | digit
            index += 1
        }
        return value
    }

    mutating func readString() throws(JSONParseError) -> String {
        index += 1
        var buffer: [UInt8] = []
        var escaped = false
        var ascii = true
        var runStart = index
        while true {
            guard index < bytes.count else { throw fail("unterminated string") }
            let c = bytes[index]
            if c == UInt8(ascii: "\"") {
                if !escaped {
                    // Most strings: no escape, so the text is the bytes as they are, and
                    // ASCII needs no validation (the generic validating initialiser costs
                    // more than the rest of the parse).
                    let run = UnsafeBufferPointer(rebasing: bytes[runStart..<index])
                    index += 1
                    if ascii { return String(decoding: run, as: UTF8.self) }
                    return try validated(run)
                }
                buffer.append(contentsOf: bytes[runStart..<index])
                index += 1
                break
            }
            if c < 0x20 { throw fail("control character in string") }
            if c >= 0x80 { ascii = false }
            if c != UInt8(ascii: "\\") { index += 1; continue }
            escaped = true
            buffer.append(contentsOf: bytes[runStart..<index])
            index += 1
            guard index < bytes.count else { throw fail("unterminated string") }
            let e = bytes[index]
            index += 1
            switch e {
            case UInt8(ascii: "\""): buffer.append(0x22)
            case UInt8(ascii: "\\"): buffer.append(0x5C)
            case UInt8(ascii: "/"): buffer.append(0x2F)
            case UInt8(ascii: "b"): buffer.append(0x08)
            case UInt8(ascii: "f"): buffer.append(0x0C)
            case UInt8(ascii: "n"): buffer.append(0x0A)
            case UInt8(ascii: "r"): buffer.append(0x0D)
            case UInt8(ascii: "t"): buffer.append(0x09)
            case UInt8(ascii: "u"):
                var code = try readHex4()
                if (0xD800...0xDBFF).contains(code) {
                    guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u") else {
                        throw fail("lone surrogate in \\u escape")
                    }
                    index += 2
                    let low = try readHex4()
                    guard (0xDC00...0xDFFF).contains(low) else { throw fail("lone surrogate in \\u escape") }
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                } else if (0xDC00...0xDFFF).contains(code) {
                    throw fail("lone surrogate in \\u escape")
                }
                guard let scalar = Unicode.Scalar(code) else { throw fail("bad \\u escape") }
                buffer.append(contentsOf: Array(String(Character(scalar)).utf8))
            default:
                throw fail("bad escape")
            }
            runStart = index
        }
        return try validated(buffer[...])
    }

    private func validated(_ utf8: some Collection<UInt8>) throws(JSONParseError) -> String {
        guard let text = String(validating: utf8, as: UTF8.self) else { throw fail("string is not valid UTF-8") }
        return text
    }
}
