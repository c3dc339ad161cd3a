import Foundation
import OutboxModel
import TestSupport
import Testing

/// SIGHUP makes a running `outbox run` read its config and definitions again; work in flight
/// carries on, a config with errors keeps the one in use, a definition with errors disables
/// its own key.
struct ReloadTests {
    /// A chain held because its follow-up's definition has errors is built as soon as a reload
    /// loads the fixed file, though another file still has errors and the failed delivery's
    /// backoff (10 minutes here) has not ended.
    @Test func aReloadThatFixesAFollowUpsDefinitionBuildsTheHeldChainAtOnce() async throws {
        let config = fastConfig.replacingOccurrences(of: "base: 50ms, max: 200ms", with: "base: 10m, max: 10m")
        let parent = definition(
            "a", top: "then:\n  on_success:\n    - key: b\n      id: \"b-{{ entry.id }}\"\n      vars: { url: \"{{ vars.url }}\", tag: t }")
        let p = try Project(
            config: config, definitions: ["a": parent, "b": "key: b\nrequest:\n  url: 5\n", "z": "key: z\nrequest:\n  methd: PUT\n"])
        try await p.enqueue("a", path: "/status/200", id: "a1")
        let runner = try p.start(["run"])
        await eventually("the chain held") { runner.stderrSoFar.contains("the follow-ups of a1 wait for its delivery") }
        await eventually("its first delivery failed") { runner.stderrSoFar.contains("it will be delivered again in 10m") }
        #expect(p.deliveries("a1").isEmpty)

        try p.define("b", definition("b"))
        runner.signal(SIGHUP)
        await eventually("the follow-up sent and delivered") { p.deliveries("b-a1").count == 1 }
        await eventually("the parent's hook run") { p.deliveries("a1").count == 1 }
        #expect(p.deliveries("a1").first?.at("stdin.follow_up_errors") == nil, "told of no error")
        #expect(runner.stderrSoFar.contains("the definition of z has errors"), "z stays disabled: \(runner.stderrSoFar)")
        runner.signal(SIGTERM)
        let finished = await runner.wait(timeout: 60)
        #expect(!finished.timedOut, "\(finished.description)")
        #expect(p.server.requests(path: "/status/200").count == 2, "a1 and its follow-up, once each")
    }

    @Test func sighupReloadsDefinitionsAndKeepsThemWhenTheNewOnesAreBroken() async throws {
        let p = try Project(definitions: ["t": definition("t", hooks: false)])
        defer { p.server.release("a") }
        try await p.enqueue("t", path: "/hold/a", id: "a")
        let runner = try p.start(["run"])
        #expect(await p.server.waitForHeld("a"))

        // A definition with a hook now: the outcome of the request in flight goes to it.
        try p.define("t", definition("t"))
        runner.signal(SIGHUP)
        await eventually("the reload logged") { runner.stderrSoFar.contains("outbox: reloaded") }

        // A broken definition: its errors are logged like `outbox check` and its key disabled,
        // as at a start; the other definitions are reloaded all the same.
        _ = try p.write("definitions/broken.yaml", "key: broken\nrequest:\n  methd: PUT\n")
        runner.signal(SIGHUP)
        await eventually("the broken key named") { runner.stderrSoFar.contains("the definition of broken has errors") }
        #expect(runner.stderrSoFar.contains("broken.yaml:3:3: error: unknown field \"methd\""), "\(runner.stderrSoFar)")
        #expect(runner.stderrSoFar.components(separatedBy: "outbox: reloaded").count == 3, "\(runner.stderrSoFar)")
        // One log line per error: the source line is not printed (it may hold a credential).
        try FileManager.default.removeItem(atPath: p.path("definitions/broken.yaml"))
        try p.writeConfig(fastConfig + "headers:\n  X-Key: \"RELOAD-SECRET-3 {{ vars.a\"\n")
        runner.signal(SIGHUP)
        await eventually("the refused config logged") { runner.stderrSoFar.contains("the config in use is kept") }
        #expect(!runner.stderrSoFar.contains("RELOAD-SECRET-3"), "\(runner.stderrSoFar)")

        // A definitions folder that is not there (a typo in its path) keeps the ones in use:
        // the outcome still finds its definition and hook.
        try p.writeConfig(fastConfig + "definitions: no-such-folder\n")
        runner.signal(SIGHUP)
        await eventually("the missing folder logged") {
            runner.stderrSoFar.contains("no-such-folder does not exist; the config and definitions in use are kept")
        }

        p.server.release("a")
        await eventually("the outcome delivered to the reloaded hook") { p.deliveries("a").count == 1 }
        runner.signal(SIGTERM)
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0, "SIGHUP no longer ends the runner: \(finished.description)")
        #expect(!finished.stderr.contains("unhandled"), "\(finished.stderr)")
    }
}

/// `events.command` is reloaded too: a changed one ends (its input closed, its lines all
/// written) and the new one gets the events after the reload; one added by a reload starts.
struct EventsReloadTests {
    static func plugin(_ name: String) -> String {
        "#!/bin/sh\n: > hooks/\(name)-ready\nwhile IFS= read -r line; do printf '%s\\n' \"$line\" >> hooks/\(name).jsonl; done\n"
    }

    static func ids(_ p: Project, _ name: String) -> Set<String> {
        Set(jsonLines(p.path("hooks/\(name).jsonl")).compactMap { $0["id"]?.stringValue })
    }

    @Test func aChangedEventsCommandIsEndedAndTheNewOneStarted() async throws {
        let p = try Project(
            definitions: ["t": definition("t", hooks: false)],
            hooks: ["a.sh": Self.plugin("a"), "b.sh": Self.plugin("b")])
        // A request held in flight: the runner is in its loop, its signal handlers installed.
        try await p.enqueue("t", path: "/hold/h", id: "h")
        let runner = try p.start(["run"])
        defer { p.server.release("h") }
        #expect(await p.server.waitForHeld("h"))

        // None at first; a reload adds one.
        try p.writeConfig(fastConfig + "events: { command: hooks/a.sh }\n")
        runner.signal(SIGHUP)
        await eventually("the plugin a to start") { p.exists("hooks/a-ready") }
        try await p.enqueue("t", path: "/status/200", id: "one")
        await eventually("a to get one's events") { Self.ids(p, "a").contains("one") }

        // Changed: a ends, b starts and gets what follows.
        try p.writeConfig(fastConfig + "events: { command: hooks/b.sh }\n")
        runner.signal(SIGHUP)
        await eventually("the plugin b to start") { p.exists("hooks/b-ready") }
        try await p.enqueue("t", path: "/status/200", id: "two")
        await eventually("b to get two's events") { Self.ids(p, "b").contains("two") }
        #expect(!Self.ids(p, "a").contains("two"), "the old plugin got none of them")
        #expect(!Self.ids(p, "b").contains("one"))
        p.server.release("h")
        runner.signal(SIGTERM)
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0, "\(finished.description)")
    }
}

/// Every line `outbox run` writes on stderr has a time and a level; `--log-format json`
/// makes each one a JSON object, the closing summary included.
struct RunLogTests {
    @Test func textLinesHaveATimeAndALevel() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200", id: "a")
        let run = try await p.drain()
        let lines = run.stderr.split(separator: "\n")
        #expect(!lines.isEmpty)
        for line in lines {
            #expect(line.wholeMatch(of: /\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (debug|info |warn |error) .+/) != nil, "\(line)")
        }
        #expect(lines.last?.contains("info  outbox: 1 completed") == true, "\(run.stderr)")
    }

    @Test func jsonLinesCarryTheEntryAndTheSummary() async throws {
        let p = try Project(
            definitions: ["t": definition("t", top: "on_success: hooks/noisy.sh", hooks: false)],
            hooks: ["noisy.sh": "#!/bin/sh\ncat > /dev/null\necho 'from the hook' >&2\n"])
        try await p.enqueue("t", path: "/status/200", id: "a")
        let run = try await p.drain(["--log-format", "json"])
        let lines = try run.stderr.split(separator: "\n").map { try JSON.parse(String($0)) }
        #expect(!lines.isEmpty)
        #expect(lines.allSatisfy { $0["time"]?.stringValue != nil && $0["level"]?.stringValue != nil && $0["message"]?.stringValue != nil })
        let hook = try #require(lines.first { $0["message"]?.stringValue?.contains("from the hook") == true })
        #expect(hook["id"] == .string("a"))
        #expect(lines.last?["summary"]?["completed"] == .int(1))
    }

    // A run that fails still ends with a JSON line: its code, for a log shipper to read.
    @Test func aFailedRunLogsItsErrorAsJSON() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200", id: "a")
        try p.write(".outbox/outbox.db", "")
        let run = try await p.outbox(["run", "--drain", "--log-format", "json"])
        #expect(run.exitCode == 74, "\(run)")
        let lines = try run.stderr.split(separator: "\n").map { try JSON.parse(String($0)) }
        let last = try #require(lines.last)
        #expect(last["level"] == .string("error"))
        #expect(last["code"] == .string("E_STORAGE"))
        #expect(last["message"]?.stringValue?.contains("outbox.db is empty") == true, "\(last)")
    }

    // A run that starts with a definition with errors says where they are, as a reload does,
    // and sends what the other definitions hold.
    @Test func aStartNamesTheErrorsOfABrokenDefinition() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        _ = try p.write("definitions/broken.yaml", "key: broken\nrequest:\n  methd: PUT\n")
        try await p.enqueue("t", path: "/status/200", id: "a")
        let run = try await p.drain()
        #expect(run.exitCode == 0, "\(run)")
        #expect(run.stderr.contains("broken.yaml:3:3: error: unknown field \"methd\""), "\(run.stderr)")
        #expect(run.stderr.contains("the definition of broken has errors"), "\(run.stderr)")
        #expect(p.deliveries("a").count == 1)
    }

    // A config with errors is logged as JSON lines too: one for each error, where it is, then the count.
    @Test func aConfigWithErrorsIsLoggedAsJSON() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try p.write("config/outbox.yaml", "concurrency: 0\n")
        let run = try await p.outbox(["run", "--drain", "--log-format", "json"])
        #expect(run.exitCode == 78, "\(run)")
        let lines = try run.stderr.split(separator: "\n").map { try JSON.parse(String($0)) }
        #expect(lines.count == 2, "\(run.stderr)")
        #expect(lines.first?["file"]?.stringValue?.hasSuffix("config/outbox.yaml") == true, "\(run.stderr)")
        #expect(lines.first?["line"] == .int(1) && lines.first?["code"] == .string("E_CONFIG"), "\(run.stderr)")
        #expect(lines.last?["message"] == .string("outbox: E_CONFIG: 1 error"), "\(run.stderr)")
    }

    @Test func quietKeepsOnlyWarningsAndErrors() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200", id: "a")
        let run = try await p.drain(["--quiet"])
        #expect(run.stderr.isEmpty, "\(run.stderr)")
    }

    @Test(arguments: [
        ["--log-format", "xml"], ["--concurrency", "0"], ["--concurrency", "many"], ["--per-host", "0"], ["--part-concurrency", "65"],
        ["--quiet", "-v"],
    ])
    func badRunFlagsAreUsageErrors(_ arguments: [String]) async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200", id: "a")
        let run = try await p.outbox(["run", "--drain"] + arguments)
        #expect(run.exitCode == 64, "\(run.description)")
        #expect(p.server.requests.isEmpty, "nothing was sent")
    }

    @Test func concurrencyOnTheCommandLineWins() async throws {
        let p = try Project(config: fastConfig + "concurrency: 8\n", definitions: ["t": definition("t")])
        defer { p.server.release("c") }
        for n in 1...5 { try await p.enqueue("t", path: "/hold/c?\(n)", id: "e\(n)") }
        let runner = try p.start(["run", "--concurrency", "1"])
        #expect(await p.server.waitForHeld("c"))
        // One in flight (and three standby): the fifth is never claimed while the first is held.
        try await eventually("four claimed") { try await p.states().values.filter { $0 == "running" }.count == 4 }
        #expect(p.server.heldCount("c") == 1)
        #expect(try await p.states()["e5"] == "queued")
        // A reload reads the config's concurrency: 8 again, and the flag still wins.
        runner.signal(SIGHUP)
        await eventually("reloaded") { runner.stderrSoFar.contains("outbox: reloaded") }
        #expect(try await p.states()["e5"] == "queued")
        #expect(p.server.heldCount("c") == 1)
        runner.signal(SIGTERM)
        p.server.release("c")
        #expect(await runner.wait(timeout: 60).exitCode == 0)
    }
}
