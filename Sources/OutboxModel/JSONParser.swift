/// Why a JSON text could not be read, with the byte offset where reading stopped.
package struct JSONParseError: Error, Sendable, Equatable, CustomStringConvertible {
    package var offset: Int
    package var message: String
    package var description: String { "\(message) at byte \(offset + 1)" }
}

extension JSON {
    /// How deep input may nest (vars, responses, plugin output).
    package static let maxDepth = 512
    /// How deep a document the store wrote may nest: it wraps input a few levels deeper (an
    /// outcome holds the response and the vars, a follow-up's vars the outcome), and what the
    /// store wrote must read back.
    package static let storedMaxDepth = 1024

    /// Parses one JSON document (RFC 8259); trailing non-space text is an error.
    package static func parse(_ text: String, maxDepth: Int = maxDepth) throws(JSONParseError) -> JSON {
        var text = text
        return try text.withUTF8 { utf8 in Result { () throws(JSONParseError) in try parse(utf8: utf8, maxDepth: maxDepth) } }.get()
    }

    package static func parse(bytes: inout [UInt8]) throws(JSONParseError) -> JSON {
        try bytes.withUnsafeBufferPointer { buffer throws(JSONParseError) in try parse(utf8: buffer) }
    }

    /// Parses UTF-8 text the caller keeps alive for the call (unchecked indexing: the
    /// reader tests every index against the count itself).
    static func parse(utf8: UnsafeBufferPointer<UInt8>, maxDepth: Int = maxDepth) throws(JSONParseError) -> JSON {
        var parser = JSONReader(bytes: utf8, maxDepth: maxDepth)
        parser.skipSpace()
        let value = try parser.readValue(depth: 0)
        parser.skipSpace()
        if parser.index != parser.bytes.count {
            throw JSONParseError(offset: parser.index, message: "unexpected text after the JSON value")
        }
        return value
    }
}

extension JSON {
    /// Where the values of the named members of a top-level object lie in `utf8`, found
    /// without building any value (nil for a name that is absent); nil when the text is
    /// not an object this scan can walk. It checks structure only: the caller parses what it uses.
    /// A name is matched as written: a member whose name is written with escapes is not found.
    package static func memberValueRanges(in utf8: UnsafeBufferPointer<UInt8>, named names: [String]) -> [Range<Int>?]? {
        var reader = JSONReader(bytes: utf8)
        let wanted = names.map { Array($0.utf8) }
        var ranges = [Range<Int>?](repeating: nil, count: names.count)
        do throws(JSONParseError) {
            reader.skipSpace()
            guard reader.index < utf8.count, utf8[reader.index] == UInt8(ascii: "{") else { return nil }
            reader.index += 1
            reader.skipSpace()
            if reader.index < utf8.count, utf8[reader.index] == UInt8(ascii: "}") { return ranges }
            while true {
                reader.skipSpace()
                guard reader.index < utf8.count, utf8[reader.index] == UInt8(ascii: "\"") else { return nil }
                let keyStart = reader.index + 1
                try reader.skipString()
                let key = UnsafeBufferPointer(rebasing: utf8[keyStart..<reader.index - 1])
                reader.skipSpace()
                guard reader.index < utf8.count, utf8[reader.index] == UInt8(ascii: ":") else { return nil }
                reader.index += 1
                reader.skipSpace()
                let valueStart = reader.index
                try reader.skipValue(depth: 1)
                // Raw bytes with a backslash spell another name than they read (`"\\"` is one backslash).
                if !key.contains(UInt8(ascii: "\\")), let n = wanted.firstIndex(where: { $0.elementsEqual(key) }) {
                    guard ranges[n] == nil else { return nil }
                    ranges[n] = valueStart..<reader.index
                }
                reader.skipSpace()
                guard reader.index < utf8.count else { return nil }
                if utf8[reader.index] == UInt8(ascii: ",") { reader.index += 1; continue }
                guard utf8[reader.index] == UInt8(ascii: "}") else { return nil }
                reader.index += 1
                reader.skipSpace()
                return reader.index == utf8.count ? ranges : nil
            }
        } catch {
            return nil
        }
    }
}

extension JSON {
    /// Where the JSON value that starts at `start` ends (just past it), walked without
    /// building it; nil when no valid value starts there.
    package static func valueEnd(in utf8: UnsafeBufferPointer<UInt8>, at start: Int) -> Int? {
        var reader = JSONReader(bytes: utf8)
        reader.index = start
        do { try reader.skipValue(depth: 1) } catch { return nil }
        return reader.index
    }

    /// Whether `utf8` is one stored JSON value (with spaces around it), checked without building it.
    package static func isWellFormed(utf8: UnsafeBufferPointer<UInt8>) -> Bool {
        // As deep as stored values may be (their reader's limit), not only as input may.
        var reader = JSONReader(bytes: utf8, maxDepth: storedMaxDepth)
        reader.skipSpace()
        do { try reader.skipValue(depth: 0) } catch { return false }
        reader.skipSpace()
        return reader.index == utf8.count
    }
}

private struct JSONReader {
    let bytes: UnsafeBufferPointer<UInt8>
    var index = 0
    let maxDepth: Int

    init(bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int = JSON.maxDepth) {
        self.bytes = bytes
        self.maxDepth = maxDepth
    }

    mutating func skipSpace() {
        while index < bytes.count, bytes[index] == 0x20 || bytes[index] == 0x0A || bytes[index] == 0x0D || bytes[index] == 0x09 {
            index += 1
        }
    }

    func fail(_ message: String) -> JSONParseError { JSONParseError(offset: index, message: message) }

    mutating func readValue(depth: Int) throws(JSONParseError) -> JSON {
        guard depth < maxDepth else { throw fail("nesting deeper than \(maxDepth)") }
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

    /// Walks over one value without building it.
    mutating func skipValue(depth: Int) throws(JSONParseError) {
        guard depth < maxDepth else { throw fail("nesting deeper than \(maxDepth)") }
        guard index < bytes.count else { throw fail("unexpected end of JSON") }
        let open = bytes[index]
        switch open {
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            let close = open == UInt8(ascii: "{") ? UInt8(ascii: "}") : UInt8(ascii: "]")
            index += 1
            skipSpace()
            if index < bytes.count, bytes[index] == close { index += 1; return }
            while true {
                skipSpace()
                if open == UInt8(ascii: "{") {
                    guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a string key") }
                    try skipString()
                    skipSpace()
                    guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
                    index += 1
                    skipSpace()
                }
                try skipValue(depth: depth + 1)
                skipSpace()
                guard index < bytes.count else { throw fail("unexpected end of JSON") }
                if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
                guard bytes[index] == close else { throw fail("expected ',' or a closing bracket") }
                index += 1
                return
            }
        case UInt8(ascii: "\""): try skipString()
        case UInt8(ascii: "t"): try expectWord("true")
        case UInt8(ascii: "f"): try expectWord("false")
        case UInt8(ascii: "n"): try expectWord("null")
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): _ = try scanNumber()
        default: throw fail("unexpected character")
        }
    }

    /// Walks over a string, its opening quote at `index`; escapes are checked, not decoded.
    mutating func skipString() throws(JSONParseError) {
        index += 1
        while index < bytes.count {
            switch bytes[index] {
            case UInt8(ascii: "\""): index += 1; return
            case UInt8(ascii: "\\"):
                guard index + 1 < bytes.count else { throw fail("unterminated string") }
                switch bytes[index + 1] {
                case UInt8(ascii: "u"):
                    index += 2
                    _ = try readHex4()
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
                    UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    index += 2
                default:
                    index += 1
                    throw fail("invalid escape")
                }
            case ..<0x20: throw fail("control character in string")
            default: index += 1
            }
        }
        throw fail("unterminated string")
    }

    mutating func readNumber() throws(JSONParseError) -> String {
        String(decoding: bytes[try scanNumber()], as: UTF8.self)
    }

    mutating func scanNumber() throws(JSONParseError) -> Range<Int> {
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
        return start..<index
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
        let contentStart = index
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
                    return try validated(run, from: contentStart)
                }
                buffer.append(contentsOf: bytes[runStart..<index])
                index += 1
                break
            }
            if c < 0x20 { throw fail("control character in string") }
            if c >= 0x80 { ascii = false }
            if c != UInt8(ascii: "\\") { index += 1; continue }
            escaped = true
            if runStart < index { buffer.append(contentsOf: bytes[runStart..<index]) }
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
                // Encoded in place: a body of escaped control bytes has one escape a byte.
                UTF8.encode(scalar) { buffer.append($0) }
            default:
                throw fail("bad escape")
            }
            runStart = index
        }
        return try validated(buffer[...], from: contentStart)
    }

    /// The string's text, or the error at its first byte that is not UTF-8: found in the
    /// source from `start` (escapes are ASCII, so it is the same byte the text stops at).
    private func validated(_ utf8: some Collection<UInt8>, from start: Int) throws(JSONParseError) -> String {
        guard let text = String(validating: utf8, as: UTF8.self) else {
            let at = Paths.invalidUTF8Offset(bytes[start..<index]).map { start + $0 } ?? index
            throw JSONParseError(offset: at, message: "string is not valid UTF-8")
        }
        return text
    }
}
