#if canImport(Glibc)
import Glibc
#endif

/// The stable error codes (docs/states-and-exit-codes.md), each with its process exit status.
package enum ErrorCode: String, Sendable, Equatable, CaseIterable {
    case usage = "E_USAGE"
    case invalid = "E_INVALID"
    case fileMissing = "E_FILE_MISSING"
    case storage = "E_STORAGE"
    case running = "E_RUNNING"
    case config = "E_CONFIG"

    package var exitStatus: Int32 {
        switch self {
        case .usage: return 64
        case .invalid: return 65
        case .fileMissing: return 66
        case .storage: return 74
        case .running: return 75
        case .config: return 78
        }
    }
}

/// An error a user sees: a stable code and a message that names the field, value or file.
package struct OutboxError: Error, Sendable, Equatable, CustomStringConvertible {
    package var code: ErrorCode
    package var message: String
    /// Compiler-style problems in config or definition files (for E_CONFIG).
    package var diagnostics: [Diagnostic]
    /// The same input may succeed later, unlike a template or value that is wrong: a plugin
    /// failed to answer (exit status, timeout, no or bad JSON), or the definition it names has
    /// errors the user may fix.
    package var mayPassLater = false
    /// A plugin could not even start for want of fds, memory or processes (the plugin itself
    /// may be fine): tried again shortly, not judged.
    package var couldNotStart = false
    /// The entry a refused enqueue found being sent (E_RUNNING): the caller may say more of
    /// why, from what the store knows of its runner.
    package var runningEntryID: String?

    package init(_ code: ErrorCode, _ message: String, diagnostics: [Diagnostic] = []) {
        self.code = code
        self.message = message
        self.diagnostics = diagnostics
    }

    package static func usage(_ m: String) -> OutboxError { OutboxError(.usage, m) }
    package static func invalid(_ m: String) -> OutboxError { OutboxError(.invalid, m) }
    package static func fileMissing(_ m: String) -> OutboxError { OutboxError(.fileMissing, m) }
    package static func storage(_ m: String) -> OutboxError { OutboxError(.storage, m) }

    /// A file of the user's that could not be read: E_FILE_MISSING, unless the cause is this
    /// process's own limits (open files, memory), which say nothing of the file: a script that
    /// skips a missing file must not skip one that is there.
    package static func unreadable(_ m: String, errno code: Int32) -> OutboxError {
        [EMFILE, ENFILE, ENOMEM, ENOBUFS].contains(code) ? OutboxError(.storage, m) : OutboxError(.fileMissing, m)
    }
    package static func running(_ m: String) -> OutboxError { OutboxError(.running, m) }

    package var description: String { "\(code.rawValue): \(message)" }
}

/// One problem in a YAML file, printed like a compiler.
package struct Diagnostic: Sendable, Equatable {
    package var path: String
    package var line: Int
    package var column: Int
    package var message: String

    package init(path: String, line: Int, column: Int, message: String) {
        self.path = path
        self.line = line
        self.column = column
        self.message = message
    }

    /// A file's first byte that is not UTF-8, at its line and column (the bytes before it decode).
    package static func invalidUTF8(path: String, bytes: [UInt8], offset: Int) -> Diagnostic {
        let before = bytes[..<offset]
        let lineStart = before.lastIndex(of: 0x0A).map { $0 + 1 } ?? 0
        let column = String(decoding: bytes[lineStart..<offset], as: UTF8.self).unicodeScalars.count + 1
        return Diagnostic(
            path: path, line: before.filter { $0 == 0x0A }.count + 1, column: column,
            message: "the file is not valid UTF-8 (at byte \(offset + 1))")
    }

    /// `path:line:col: error: message`, then the source line (around the column when it is
    /// long, control characters shown as escapes) and a caret under the column.
    package func rendered(source: String?) -> String {
        rendered(lines: source.map(Self.lines))
    }

    /// The same with the source already split by `lines(_:)`: many errors of one file
    /// split it once, not once each.
    package func rendered(lines: [Substring.UTF8View.SubSequence]?) -> String {
        // One line whatever the file's name holds (a newline in it would split the line).
        var out = TerminalText.cell("\(path):\(line):\(column): error: \(message)")
        if let lines, line >= 1, line <= lines.count {
            let bytes = lines[line - 1]
            let text = String(decoding: bytes, as: UTF8.self)
            let lineText = Self.secretValueHidden(
                text.utf8.last == 0x0D ? String(decoding: bytes.dropLast(), as: UTF8.self) : text,
                inHeaders: Self.isInHeaders(lines, index: line - 1))
            let escapedColumn = TerminalText.visible(String(lineText.prefix(max(0, column - 1)))).count + 1
            let shown = TerminalText.excerpt(TerminalText.visible(lineText), column: escapedColumn)
            let caretPad = String(shown.text.prefix(shown.column - 1).map { $0 == "\t" ? "\t" : " " })
            out += "\n" + shown.text + "\n" + caretPad + "^"
        }
        return out
    }

    /// A file's lines as bytes: split on the byte, since in a String "\r\n" is one Character
    /// and never equals "\n".
    package static func lines(_ source: String) -> [Substring.UTF8View.SubSequence] {
        // Split where libyaml counts a line: LF, CR LF, CR alone, NEL, LS and PS, so that a
        // mark's line number finds its line.
        let utf8 = Substring(source).utf8
        var lines: [Substring.UTF8View.SubSequence] = []
        var start = utf8.startIndex
        var i = start
        // The break at `i`, if one starts there: the index after it.
        func breakEnd(_ i: Substring.UTF8View.Index) -> Substring.UTF8View.Index? {
            let b = utf8[i]
            guard b == 0x0A || b == 0x0D || b == 0xC2 || b == 0xE2 else { return nil }
            let rest = utf8[i...].prefix(3)
            switch (b, rest.dropFirst().first, rest.dropFirst(2).first) {
            case (0x0A, _, _): return utf8.index(after: i)
            case (0x0D, 0x0A, _): return utf8.index(i, offsetBy: 2)
            case (0x0D, _, _): return utf8.index(after: i)
            case (0xC2, 0x85, _): return utf8.index(i, offsetBy: 2)
            case (0xE2, 0x80, 0xA8), (0xE2, 0x80, 0xA9): return utf8.index(i, offsetBy: 3)
            default: return nil
            }
        }
        while i != utf8.endIndex {
            guard let next = breakEnd(i) else {
                i = utf8.index(after: i)
                continue
            }
            lines.append(utf8[start..<i])
            (start, i) = (next, next)
        }
        lines.append(utf8[start...])
        return lines
    }

    /// A source line with its secrets shown as `[redacted]`: a URL's password (a PostgreSQL
    /// store's), a credential header's value (`Authorization: Bearer ...`), and every value
    /// inside a `headers` mapping (any header may be a secret, `redact_headers` included, and a
    /// value may go on over several lines): the error print goes to terminals and logs.
    static func secretValueHidden(_ text: String, inHeaders: Bool = false) -> String {
        let line = URLCheck.redactingPasswords(inText: text)
        let indent = line.prefix { $0 == " " || $0 == "\t" || $0 == "-" }
        let trimmed = line.dropFirst(indent.count)
        let colon = trimmed.firstIndex(of: ":")
        let name = colon.map { trimmed[..<$0].filter { $0 != "\"" && $0 != "'" }.lowercased() } ?? ""
        // A header name is one token; anything else before a colon is part of a value.
        let isKey = !name.isEmpty && HeaderRules.isToken(name)
        guard let colon, isKey else {
            return inHeaders && !trimmed.isEmpty && !trimmed.hasPrefix("#") ? indent + "[redacted]" : line
        }
        guard inHeaders || ["authorization", "cookie", "proxy-authorization"].contains(name) else { return line }
        if trimmed[trimmed.index(after: colon)...].allSatisfy({ $0 == " " || $0 == "\t" }) { return line }
        return String(line[..<colon]) + ": [redacted]"
    }

    /// Whether line `index` is in a `headers` mapping or gives one: its own key, or a key of
    /// a line above with less indentation (the blocks that hold it), is `headers`.
    static func isInHeaders(_ lines: [Substring.UTF8View.SubSequence], index: Int) -> Bool {
        func indentation(_ line: Substring.UTF8View.SubSequence) -> Int { line.prefix { $0 == 0x20 || $0 == 0x2D }.count }
        func isHeadersKey(_ line: Substring.UTF8View.SubSequence) -> Bool {
            let text = String(decoding: line, as: UTF8.self).lowercased()
            let key = text.drop { $0 == " " || $0 == "-" || $0 == "\t" }.prefix { $0 != ":" }
            if key.filter({ $0 != "\"" && $0 != "'" && $0 != "{" && $0 != " " }) == "headers" { return true }
            // A `headers` key inside a flow mapping on this line (not `redact_headers`).
            return text.ranges(of: "headers:").contains { range in
                range.lowerBound == text.startIndex || " {,\"'".contains(text[text.index(before: range.lowerBound)])
            }
        }
        guard index >= 0, index < lines.count else { return false }
        if isHeadersKey(lines[index]) { return true }
        var indent = indentation(lines[index])
        var i = index - 1
        while i >= 0, indent > 0 {
            let line = lines[i]
            let content = line.drop { $0 == 0x20 || $0 == 0x09 }
            i -= 1
            if content.isEmpty || content.first == UInt8(ascii: "#") || content.allSatisfy({ $0 == 0x0D }) { continue }
            let level = indentation(line)
            guard level < indent else { continue }
            if isHeadersKey(line) { return true }
            indent = level
        }
        return false
    }
}
