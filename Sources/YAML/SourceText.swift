/// Maps between libyaml's 0-based character marks and the UTF-8 source; used only on
/// rare paths (errors, template checks), so a linear scan is fine.
enum SourceText {
    /// Byte offset of a 1-based mark, counting line breaks and columns as libyaml does.
    static func byteOffset(in source: UnsafeBufferPointer<UInt8>, of mark: Mark) -> Int? {
        guard var index = lineStart(mark.line, in: source) else { return nil }
        var column = 1
        while column < mark.column {
            guard index < source.count, !isBreak(source, at: index) else { return nil }
            index += scalarLength(source[index])
            column += 1
        }
        return index
    }

    /// The 1-based mark of a byte offset.
    static func mark(in source: UnsafeBufferPointer<UInt8>, atByte offset: Int) -> Mark {
        var line = 1, column = 1, index = 0
        let end = min(offset, source.count)
        while index < end {
            if let width = breakWidth(source, at: index) {
                line += 1
                column = 1
                index += width
            } else {
                column += 1
                index += scalarLength(source[index])
            }
        }
        return Mark(line: line, column: column)
    }

    /// The text of a 1-based line, without its break; empty past the end.
    static func line(_ number: Int, in source: UnsafeBufferPointer<UInt8>) -> String {
        guard let start = lineStart(number, in: source) else { return "" }
        var end = start
        while end < source.count, !isBreak(source, at: end) { end += 1 }
        return String(decoding: UnsafeBufferPointer(rebasing: source[start..<end]), as: UTF8.self)
    }

    private static func lineStart(_ number: Int, in source: UnsafeBufferPointer<UInt8>) -> Int? {
        var line = 1, index = 0
        while line < number {
            guard index < source.count else { return nil }
            if let width = breakWidth(source, at: index) {
                line += 1
                index += width
            } else {
                index += 1
            }
        }
        return index
    }

    private static func isBreak(_ source: UnsafeBufferPointer<UInt8>, at index: Int) -> Bool {
        breakWidth(source, at: index) != nil
    }

    /// Width in bytes of the line break at `index` (CRLF, CR, LF, NEL, LS, PS), if any.
    private static func breakWidth(_ s: UnsafeBufferPointer<UInt8>, at i: Int) -> Int? {
        switch s[i] {
        case 0x0A: return 1
        case 0x0D: return i + 1 < s.count && s[i + 1] == 0x0A ? 2 : 1
        case 0xC2: return i + 1 < s.count && s[i + 1] == 0x85 ? 2 : nil
        case 0xE2: return i + 2 < s.count && s[i + 1] == 0x80 && (s[i + 2] == 0xA8 || s[i + 2] == 0xA9) ? 3 : nil
        default: return nil
        }
    }

    private static func scalarLength(_ lead: UInt8) -> Int {
        switch lead {
        case 0..<0x80: 1
        case 0xC0..<0xE0: 2
        case 0xE0..<0xF0: 3
        case 0xF0...: 4
        default: 1
        }
    }
}
