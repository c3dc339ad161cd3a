import Foundation
import Glibc
import OutboxModel
import OutboxRunner
import TestSupport
import Testing

/// `events.command` through a live runner: it gets the event lines, and what it prints goes
/// to the log, escaped and cut, never to stdout.
struct EventsPluginTests {
    /// Keeps every line it reads, answers each on stdout, and prints a terminal escape and a
    /// 10,000-byte line on stderr first.
    static let plugin = #"""
        #!/bin/sh
        printf '\033[2Jcleared\n' >&2
        head -c 10000 /dev/zero | tr '\0' y >&2
        printf '\n' >&2
        : > hooks/plugin-ready
        while IFS= read -r line; do
          printf '%s\n' "$line" >> hooks/events.jsonl
          echo "seen one"
        done

        """#

    /// Key `t`, whose hook is `hooks/gate.sh` (see `gate`).
    static let gated = ["t": definition("t", top: "on_success: hooks/gate.sh\non_error: hooks/gate.sh", hooks: false)]

    /// A hook that waits until the plugin wrote `marker`, then records as usual: the run cannot
    /// end, and close the plugin (which then has 2 s to finish), before the plugin got that
    /// far, however slowly a busy machine starts it.
    static func gate(_ marker: String) -> String {
        "#!/bin/sh\nwhile [ ! -e \(marker) ]; do sleep 0.05; done\nexec hooks/record.sh\n"
    }

    @Test func thePluginGetsTheEventsAndItsOutputIsLoggedNotPrinted() async throws {
        let p = try Project(
            config: fastConfig + "events: { command: hooks/events.sh }\n", definitions: Self.gated,
            hooks: ["events.sh": Self.plugin, "gate.sh": Self.gate("hooks/plugin-ready")])
        try await p.enqueue("t", path: "/status/200", id: "a")
        let run = try await p.drain(["--json"], failures: 0)
        // Stdout is the summary document alone.
        let summary = try #require(run.json, "stdout: \(run.stdout)")
        #expect(summary.int("completed") == 1)
        #expect(!run.stdout.contains("seen one"))
        // The plugin got the attempt of `a` (it was closed, and so finished, before the run ended).
        let events = jsonLines(p.root + "/hooks/events.jsonl")
        #expect(events.contains { $0.string("type") == "attempt" && $0.string("id") == "a" }, "\(events)")
        // Its output is in the log: a line each, the escape shown, the long line cut at 4 KiB.
        #expect(run.stderr.contains("events.command: seen one"), "\(run.stderr)")
        #expect(run.stderr.contains(#"events.command: \x1b[2Jcleared"#), "\(run.stderr)")
        #expect(!run.stderr.contains("\u{1B}[2J"))
        #expect(run.stderr.contains("events.command: " + String(repeating: "y", count: 4096) + " [...]"))
        #expect(!run.stderr.contains(String(repeating: "y", count: 4097)))
    }

    /// A plugin that fails is logged as failed (not as too slow), and its last words come
    /// before the run's summary line.
    @Test func aPluginThatExitsEarlyIsLoggedAsFailed() async throws {
        let p = try Project(
            config: fastConfig + "events: { command: hooks/events.sh }\n", definitions: Self.gated,
            hooks: ["events.sh": "#!/bin/sh\necho going away\n: > hooks/plugin-done\nexit 3\n", "gate.sh": Self.gate("hooks/plugin-done")])
        for n in 0..<3 { try await p.enqueue("t", path: "/status/200?\(n)", id: "e\(n)") }
        let run = try await p.drain(failures: 0)
        #expect(run.stderr.contains("outbox: events.command exited 3"), "\(run.stderr)")
        #expect(!run.stderr.contains("did not keep up"), "\(run.stderr)")
        let lines = run.stderr.split(separator: "\n")
        let said = try #require(lines.firstIndex { $0.contains("events.command: going away") }, "\(run.stderr)")
        let summary = try #require(lines.lastIndex { $0.contains("completed") }, "\(run.stderr)")
        #expect(said < summary, "\(run.stderr)")
    }

    /// A plugin still running 2 s after its input ended is stopped, and the log says so: it may
    /// not have handled the last events it read.
    @Test func aPluginThatOutstaysItsGraceIsStoppedAndLogged() async throws {
        let p = try Project(
            config: fastConfig + "events: { command: hooks/events.sh }\n", definitions: ["t": definition("t")],
            hooks: ["events.sh": "#!/bin/sh\ncat > /dev/null\nexec sleep 600\n"])
        try await p.enqueue("t", path: "/status/200", id: "a")
        let run = try await p.drain(failures: 0)
        #expect(
            run.stderr.contains("outbox: events.command did not exit within 2s of its input's end and was stopped"),
            "\(run.stderr)")
        #expect(!run.stderr.contains("events.command exited"), "\(run.stderr)")
    }

    /// A reload that replaces `events.command` does not wait for the old plugin: it ends on a
    /// thread of its own. The old one reads to its end, writes its pid, and waits to be
    /// released, with an hour to do so: a reload that waited would hang here.
    @Test func aReloadDoesNotWaitForTheReplacedPlugin() throws {
        let folder = TemporaryFolder(prefix: "events-reload")
        let old = try folder.write(
            "old.sh",
            "#!/bin/sh\ncat > /dev/null\necho $$ > \(folder.path)/old.pid\nwhile [ ! -e \(folder.path)/release ]; do sleep 0.05; done\n",
            mode: 0o755)
        let lines = Locked<[String]>([])
        let config = Config(root: folder.path)
        let sink = EventSink(
            console: nil, command: .argv([old]), config: config, environment: ProcessInfo.processInfo.environment,
            log: { line in lines.withLock { $0.append(line) } }, closeGraceMs: 3_600_000)
        sink.send(.object([("type", .string("state"))]))
        #expect(sink.reload(command: .argv(["/bin/cat"]), config: config, environment: [:]))
        // Back from the reload: the old plugin read its input's end and is still there.
        let oldPID = try #require(Self.pid(writtenTo: folder.path + "/old.pid"))
        #expect(kill(oldPID, 0) == 0, "the old plugin is still running")
        _ = FileManager.default.createFile(atPath: folder.path + "/release", contents: nil)
        sink.close()
    }

    /// Lines the plugin never read by the end of its grace are lost, and counted as such.
    @Test func linesAPluginNeverReadAreCountedLost() throws {
        let folder = TemporaryFolder(prefix: "events-lost")
        let lines = Locked<[String]>([])
        let sink = EventSink(
            console: nil, command: .argv(["/bin/sleep", "600"]), config: Config(root: folder.path), environment: [:],
            log: { line in lines.withLock { $0.append(line) } }, closeGraceMs: 200)
        // Far more than a pipe holds: the plugin never reads, so most stay in outbox's buffer.
        let event = JSON.object([("type", .string("state")), ("pad", .string(String(repeating: "x", count: 1000)))])
        for _ in 0..<500 { sink.send(event) }
        sink.close()
        let logged = lines.withLock { $0 }
        #expect(logged.contains { $0.contains("events.command did not exit within 200ms") }, "\(logged)")
        #expect(logged.contains { $0.hasPrefix("outbox: events.command did not keep up: ") && $0.hasSuffix(" dropped") }, "\(logged)")
    }

    /// A plugin a reload replaced does not outlive the run: the sink's last close waits for its
    /// end (its group killed after the grace), though the reload did not.
    @Test func aReplacedPluginEndsBeforeTheSinkCloses() throws {
        let folder = TemporaryFolder(prefix: "events-replaced")
        let old = try folder.write(
            "old.sh", "#!/bin/sh\necho $$ > \(folder.path)/old.pid\ncat > /dev/null\nwhile :; do sleep 0.05; done\n", mode: 0o755)
        let config = Config(root: folder.path)
        let sink = EventSink(
            console: nil, command: .argv([old]), config: config, environment: ProcessInfo.processInfo.environment,
            log: { _ in }, closeGraceMs: 200)
        let oldPID = try #require(Self.pid(writtenTo: folder.path + "/old.pid"))
        #expect(sink.reload(command: .argv(["/bin/cat"]), config: config, environment: [:]))
        sink.close()
        #expect(kill(oldPID, 0) != 0, "the replaced plugin was stopped and reaped by the close")
    }

    /// The pid a plugin wrote to `path`, once it has (up to a minute); nil if it never did.
    static func pid(writtenTo path: String) -> Int32? {
        for _ in 0..<6000 {
            if let text = try? String(contentsOfFile: path, encoding: .utf8),
                let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines))
            {
                return pid
            }
            usleep(10_000)
        }
        return nil
    }
}
