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
}
