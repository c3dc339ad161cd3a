import OutboxModel
import Testing

struct TerminalTextTests {
    @Test func controlCharactersAreShownNotActedOn() {
        #expect(TerminalText.visible("plain text, é and 名") == "plain text, é and 名")
        #expect(TerminalText.visible("a\tb\nc") == "a\tb\nc")
        #expect(TerminalText.visible("red\u{1B}[31mtext\u{07}") == "red\\x1b[31mtext\\x07")
        #expect(TerminalText.visible("\r\u{0}\u{7F}\u{9B}") == "\\x0d\\x00\\x7f\\x9b")
        #expect(TerminalText.visible("abc\u{202E}def\u{2066}") == "abc\\u{202e}def\\u{2066}")
    }

    @Test func aLongLineIsCutAroundTheColumn() {
        let line = String(repeating: "a", count: 500) + "X" + String(repeating: "b", count: 500)
        let shown = TerminalText.excerpt(line, column: 501, width: 40)
        #expect(shown.text == "…" + String(repeating: "a", count: 20) + "X" + String(repeating: "b", count: 19) + "…")
        #expect(Array(shown.text)[shown.column - 1] == "X")
        let start = TerminalText.excerpt(line, column: 1, width: 40)
        #expect(start.text == String(repeating: "a", count: 40) + "…")
        #expect(start.column == 1)
        let end = TerminalText.excerpt(line, column: 1002, width: 40)
        #expect(end.text == "…" + String(repeating: "b", count: 40))
        #expect(end.column == 42)
        #expect(TerminalText.excerpt("short", column: 3).text == "short")
    }

    @Test func aDiagnosticShowsALongOrHostileLineSafely() {
        let long = "x: " + String(repeating: "[", count: 100_000)
        let rendered = Diagnostic(path: "d.yaml", line: 2, column: 1004, message: "nesting deeper than 1000 levels")
            .rendered(source: "key: k\n" + long).split(separator: "\n").map(String.init)
        #expect(rendered.count == 3)
        #expect(rendered[1].count <= 122)
        #expect(rendered[2].count == rendered[1].prefix(while: { $0 != "[" }).count + 60 + 1)

        let hostile = Diagnostic(path: "d.yaml", line: 1, column: 10, message: "unknown field \"a\u{1B}[2Jb\"")
            .rendered(source: "\u{1B}[2J\u{1B}[H: 1\n")
        let expected = "d.yaml:1:10: error: unknown field \"a\\x1b[2Jb\"\n\\x1b[2J\\x1b[H: 1\n"
        #expect(hostile == expected + String(repeating: " ", count: 15) + "^")

        // A file's name may hold a newline or a tab: the error line stays one line.
        let named = Diagnostic(path: "definitions/a\nb\t.yaml", line: 1, column: 6, message: "m").rendered(source: nil)
        #expect(named == "definitions/a\\x0ab\\x09.yaml:1:6: error: m")
    }

    // A line is found as libyaml counts lines: CR alone, CR LF, NEL, LS and PS end one too.
    @Test(arguments: ["\n", "\r", "\r\n", "\u{85}", "\u{2028}", "\u{2029}"])
    func aDiagnosticFindsItsLineWhateverTheBreaks(_ br: String) {
        let source = ["key: a", "request:", "  url: http://x/", "  bogus: 1"].joined(separator: br) + br
        #expect(
            Diagnostic.lines(source).map { String(decoding: $0, as: UTF8.self) } == [
                "key: a", "request:", "  url: http://x/", "  bogus: 1", "",
            ])
        let rendered = Diagnostic(path: "a.yaml", line: 4, column: 3, message: "unknown field").rendered(source: source)
        #expect(rendered == "a.yaml:4:3: error: unknown field\n  bogus: 1\n  ^", "\(rendered)")
    }

    // The source line under an error goes to terminals and logs: a URL's password on it (a
    // PostgreSQL store's) is hidden, as a credential header's value is.
    @Test func aDiagnosticHidesAURLPasswordOnItsSourceLine() {
        let source = "store: x\nstore: \"postgres://u:topsecret@127.0.0.1:1/db?schema=q\"\n"
        let rendered = Diagnostic(path: "outbox.yaml", line: 2, column: 1, message: "duplicate key \"store\" (first at line 1)")
            .rendered(source: source)
        #expect(!rendered.contains("topsecret"), "\(rendered)")
        #expect(rendered.contains("store: \"postgres://u:[redacted]@127.0.0.1:1/db?schema=q\""), "\(rendered)")
        // Every URL of a line: two in one flow mapping.
        let flow = "{store: \"postgres://u:s3cret@h:1/db?schema=q\", store: \"postgres://u:s3cret@h:1/db?schema=q\"}\n"
        let twice = Diagnostic(path: "outbox.yaml", line: 1, column: 56, message: "duplicate key \"store\"").rendered(source: flow)
        #expect(!twice.contains("s3cret") && twice.components(separatedBy: "u:[redacted]@h:1").count == 3, "\(twice)")
        let header = Diagnostic(path: "d.yaml", line: 1, column: 1, message: "m").rendered(source: "Authorization: Bearer abcdef\n")
        #expect(header.contains("Authorization: [redacted]") && !header.contains("abcdef"))
    }

    // Any header may be a secret (`redact_headers` names more): under `headers` no value shows,
    // whether it sits on its key's line, goes on over lines of its own, or is in a flow mapping.
    @Test func aDiagnosticHidesEveryHeaderValueOnItsSourceLine() {
        func shown(_ source: String, line: Int, column: Int) -> String {
            Diagnostic(path: "d.yaml", line: line, column: column, message: "did not find expected key").rendered(source: source)
        }
        let own = shown("key: bad\nrequest:\n  headers:\n    X-Api-Key: \"TOPSECRET-A\" x\n", line: 4, column: 30)
        #expect(!own.contains("TOPSECRET") && own.contains("X-Api-Key: [redacted]"), "\(own)")
        let below = shown("request:\n  headers:\n    Authorization:\n      \"Bearer TOPSECRET-B\" x\n", line: 4, column: 28)
        #expect(!below.contains("TOPSECRET") && below.contains("      [redacted]"), "\(below)")
        let folded = shown("request:\n  headers:\n    X-A: >\n      Bearer: TOPSECRET-D\n", line: 4, column: 9)
        #expect(!folded.contains("TOPSECRET"), "\(folded)")
        let flow = shown("request:\n  headers: { Authorization: \"Bearer TOPSECRET-C\", X-B: [1] }\n", line: 2, column: 56)
        #expect(!flow.contains("TOPSECRET") && flow.contains("headers: [redacted]"), "\(flow)")
        // Outside `headers` a line shows whole, and a key with nothing after it too.
        let url = shown("request:\n  url: http://x/ x: y\n  headers:\n    X-A: b\n", line: 2, column: 19)
        #expect(url.contains("url: http://x/ x: y"), "\(url)")
        let names = shown("redact_headers: [X-Ok, \"bad name\"]\n", line: 1, column: 24)
        #expect(names.contains("redact_headers: [X-Ok, \"bad name\"]"), "header names are no secret: \(names)")
        let empty = shown("request:\n  headers:\n    X-A: b\n", line: 2, column: 3)
        #expect(empty.contains("  headers:\n"), "\(empty)")
    }

    // A table cell never breaks its row, and wide characters count as two columns.
    @Test func aCellStaysOnOneLineAndWideCharactersCountTwice() {
        #expect(TerminalText.cell("a\tb\nc\u{1B}") == "a\\x09b\\x0ac\\x1b")
        #expect(TerminalText.cell("plain") == "plain")
        #expect(TerminalText.displayWidth("注文.作成") == 9)
        #expect(TerminalText.displayWidth("café.naïve") == 10)
        #expect(TerminalText.displayWidth("e\u{301}") == 1)
    }
}
