/// Text from outside (a definition's bytes, a server's reason phrase, vars) on its way to a
/// terminal or a text log: control characters are shown as escapes, never acted on.
package enum TerminalText {
    /// `s` with every control character but newline and tab (C0, DEL, C1) written as `\xhh`,
    /// and the bidirectional overrides as `\u{hhhh}`: a hostile file or server cannot move
    /// the cursor, recolour the screen, or make the text read differently from its bytes.
    package static func visible(_ s: String) -> String {
        guard s.unicodeScalars.contains(where: needsEscape) else { return s }
        var out = String.UnicodeScalarView()
        for scalar in s.unicodeScalars {
            guard needsEscape(scalar) else {
                out.append(scalar)
                continue
            }
            let hex = String(scalar.value, radix: 16)
            let escaped = scalar.value < 0x100 ? "\\x" + (hex.count < 2 ? "0" + hex : hex) : "\\u{" + hex + "}"
            out.append(contentsOf: escaped.unicodeScalars)
        }
        return String(out)
    }

    private static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x0A, 0x09: return false
        case 0x00...0x1F, 0x7F...0x9F: return true
        // Embedding, override and isolate controls: they reorder what is displayed.
        case 0x202A...0x202E, 0x2066...0x2069: return true
        default: return false
        }
    }

    /// At most `width` characters of `line` around `column` (1-based), with `…` where text was
    /// cut, and the column within what is returned: a minified file's one long line is not
    /// printed whole under an error.
    package static func excerpt(_ line: String, column: Int, width: Int = 120) -> (text: String, column: Int) {
        let characters = Array(line)
        guard characters.count > width else { return (line, column) }
        let at = min(max(0, column - 1), characters.count)
        let start = max(0, min(at - width / 2, characters.count - width))
        let end = min(characters.count, start + width)
        let head = start > 0 ? "…" : ""
        let tail = end < characters.count ? "…" : ""
        return (head + String(characters[start..<end]) + tail, at - start + head.count + 1)
    }
}
