@testable import OutboxRunner
import OutboxModel
import TestSupport
import Testing

/// What a hook prints reaches the runner's text log as escapes: a hook (or the server text it
/// echoes) cannot clear the terminal, retitle it or hide the lines before it.
struct LogTextTests {
    @Test func aHookCannotDriveTheTerminalThroughTheLog() async throws {
        let p = try Project(config: fastConfig, definitions: ["t": definition("t", hooks: false) + "on_success: hooks/loud.sh\n"])
        try p.writeHook("loud.sh", "#!/bin/sh\nprintf 'before\\033[2J\\033]0;owned\\007after\\n' >&2\n")
        try await p.enqueue("t", path: "/status/200", id: "a")
        let run = try await p.outbox(["run", "--drain"])
        #expect(run.exitCode == 0, "\(run.stderr)")
        #expect(run.stderr.contains("before\\x1b[2J\\x1b]0;owned\\x07after"), "\(run.stderr)")
        #expect(!run.stderr.unicodeScalars.contains { $0.value == 0x1B || $0.value == 0x07 }, "\(run.stderr)")
    }

    /// A hook's stderr line of 1 MiB reaches the log cut at 4 KiB: a log line stays a line.
    @Test func aLongHookStderrLineIsCut() async throws {
        let p = try Project(config: fastConfig, definitions: ["t": definition("t", hooks: false) + "on_success: hooks/long.sh\n"])
        try p.writeHook("long.sh", "#!/bin/sh\nhead -c 1048576 /dev/zero | tr '\\0' x >&2\necho >&2\n")
        try await p.enqueue("t", path: "/status/200", id: "a")
        let run = try await p.outbox(["run", "--drain"])
        #expect(run.exitCode == 0, "\(run.stderr.prefix(500))")
        let line = try #require(run.stderr.split(separator: "\n").first { $0.contains("hook a: ") })
        #expect(line.hasSuffix(String(repeating: "x", count: 100) + " [...]"))
        #expect(line.utf8.count < 4096 + 200, "\(line.utf8.count) bytes")
    }

    /// A line break in a logged message (a definition's key, a server's text) is written as
    /// an escape: it cannot start a second line that reads like a record of the runner.
    @Test func aLineBreakInAMessageCannotForgeARecord() {
        let lines = Locked<[String]>([])
        let logger = Logger(format: .text, clock: { 0 }) { line in lines.withLock { $0.append(line) } }
        logger.log(.warn, "key x\n1970-01-01T00:00:00.000Z info  outbox: 999 completed\r")
        #expect(
            lines.withLock { $0 } == [#"1970-01-01T00:00:00.000Z warn  key x\x0a1970-01-01T00:00:00.000Z info  outbox: 999 completed\x0d"#])
    }
}
