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

    package init(_ code: ErrorCode, _ message: String, diagnostics: [Diagnostic] = []) {
        self.code = code
        self.message = message
        self.diagnostics = diagnostics
    }

    package static func usage(_ m: String) -> OutboxError { OutboxError(.usage, m) }
    package static func invalid(_ m: String) -> OutboxError { OutboxError(.invalid, m) }
    package static func fileMissing(_ m: String) -> OutboxError { OutboxError(.fileMissing, m) }
    package static func storage(_ m: String) -> OutboxError { OutboxError(.storage, m) }
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
        var out = TerminalText.visible("\(path):\(line):\(column): error: \(message)")
        if let lines, line >= 1, line <= lines.count {
            let bytes = lines[line - 1]
            let text = String(decoding: bytes, as: UTF8.self)
            let lineText = Self.secretValueHidden(text.utf8.last == 0x0D ? String(decoding: bytes.dropLast(), as: UTF8.self) : text)
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
        Substring(source).utf8.split(separator: 0x0A, omittingEmptySubsequences: false)
    }

    /// A source line that gives a credential header (`Authorization: Bearer ...`) with its value
    /// shown as `[redacted]`, and a URL's password too (a PostgreSQL store's): the error print
    /// goes to terminals and logs, where secrets never go.
    static func secretValueHidden(_ text: String) -> String {
        let line = URLCheck.redactingPasswords(inText: text)
        let trimmed = line.drop { $0 == " " || $0 == "\t" || $0 == "-" }
        guard let colon = trimmed.firstIndex(of: ":") else { return line }
        let name = trimmed[..<colon].filter { $0 != "\"" && $0 != "'" }.lowercased()
        guard ["authorization", "cookie", "proxy-authorization"].contains(name) else { return line }
        return String(line[..<colon]) + ": [redacted]"
    }
}
