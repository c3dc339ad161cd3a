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

    /// `visible`, with newline and tab escaped too: for one cell of a table, which a line
    /// break would split over two rows.
    package static func cell(_ s: String) -> String {
        visible(s).replacingNewlinesAndTabs()
    }

    /// Columns `s` takes on a terminal: East Asian wide characters and emoji take two,
    /// combining marks none; for aligning a table.
    package static func displayWidth(_ s: String) -> Int {
        var width = 0
        for scalar in s.unicodeScalars {
            switch scalar.value {
            case 0x0300...0x036F, 0x200B...0x200F, 0xFE00...0xFE0F: break
            case 0x1100...0x115F, 0x2E80...0x303E, 0x3041...0x33FF, 0x3400...0x4DBF, 0x4E00...0x9FFF, 0xA000...0xA4CF,
                0xAC00...0xD7A3, 0xF900...0xFAFF, 0xFE30...0xFE4F, 0xFF00...0xFF60, 0xFFE0...0xFFE6, 0x1F300...0x1F64F,
                0x1F900...0x1F9FF, 0x20000...0x3FFFD:
                width += 2
            default: width += 1
            }
        }
        return width
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

extension String {
    fileprivate func replacingNewlinesAndTabs() -> String {
        guard contains(where: { $0 == "\n" || $0 == "\t" || $0 == "\r\n" }) else { return self }
        var out = ""
        for scalar in unicodeScalars {
            switch scalar {
            case "\n": out += "\\x0a"
            case "\t": out += "\\x09"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }
}
