import OutboxModel

/// How a failed command reports its error: one line on stderr, the compiler-style block of
/// a config's errors, or with `--json` the `{"error": ...}` document on stdout alone.
extension CLI {
    static func report(_ error: OutboxError, json: Bool, console: Console) {
        if !error.diagnostics.isEmpty {
            let n = error.diagnostics.count
            // With --json the document alone reports them: one format at a time.
            if !json {
                // Each file read once; one that cannot be read (gone, a folder) has no line to show.
                var sources: [String: [Substring.UTF8View.SubSequence]?] = [:]
                for d in error.diagnostics {
                    let lines = sources[d.path] ?? Paths.readText(d.path).map(Diagnostic.lines)
                    sources[d.path] = lines
                    console.err(d.rendered(lines: lines))
                }
                console.err("outbox: E_CONFIG: \(n) error\(n == 1 ? "" : "s")")
            } else {
                console.out(
                    JSON.object([
                        (
                            "error",
                            .object([
                                ("code", .string(error.code.rawValue)), ("message", .string("\(n) error\(n == 1 ? "" : "s")")),
                                ("diagnostics", .array(error.diagnostics.map(diagnosticJSON))),
                            ])
                        )
                    ]).serialized())
            }
            return
        }
        if json {
            console.out(
                JSON.object([("error", .object([("code", .string(error.code.rawValue)), ("message", .string(error.message))]))])
                    .serialized())
        } else {
            // One line: a newline from outside (an id, a key) would start a line of its own.
            console.err("outbox: \(error.code.rawValue): \(TerminalText.cell(error.message))")
        }
    }

    static func diagnosticJSON(_ d: Diagnostic) -> JSON {
        .object([("file", .string(d.path)), ("line", .int(d.line)), ("column", .int(d.column)), ("message", .string(d.message))])
    }
}
