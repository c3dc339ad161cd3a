import Foundation
import Glibc
import OutboxModel
import TestSupport
import Testing

/// The runner as a process: same-id rules while it runs, the lock, signals, events,
/// the summary, follow-ups and scopes.
@Suite struct RunnerControlTests {
    @Test func differentBodyForARunningEntryIsRejected() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/hold/busy", id: "busy", tag: "first")
        let runner = try p.start(["run", "--drain"])
        // The request is held: the entry runs while the replacement is tried.
        #expect(await p.server.waitForHeld("busy"), "the request never started")
        // The claim is committed at the end of its turn, which may come after the request left.
        try await eventually("the claim to be committed") { try await p.states()["busy"] == "running" }

        let vars = JSON.object([("url", .string(p.url("/hold/busy"))), ("tag", .string("second"))]).serialized()
        let replace = try await p.outbox(["enqueue", "t", "--vars", vars, "--id", "busy"])
        #expect(replace.exitCode == 75, "\(replace.description)")
        #expect(replace.stderr.hasPrefix("outbox: E_RUNNING: "), "\(replace.stderr)")

        p.server.release("busy")
        let finished = await runner.wait()
        #expect(finished.exitCode == 0, "\(finished.description)")
        let hook = try #require(p.deliveries("busy").first)
        #expect(hook.string("stdin.vars.tag") == "first")
        #expect(p.server.requests(path: "/hold/busy").count == 1)
        #expect(p.server.requests(path: "/hold/busy").first?.bodyText == #"{"tag":"first"}"#)
    }

    @Test func sameBodyForACompletedUnacknowledgedEntryRedeliversWithoutSending() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        p.touch("hooks/fail")
        try await p.enqueue("t", path: "/status/200", id: "done")
        try await p.runUntil { _ in p.deliveries("done").count >= 1 }
        let failed = p.deliveries("done").count
        #expect(failed >= 1)
        #expect(try await p.show("done")?.string("state") == "completed")

        try await p.enqueue("t", path: "/status/200", id: "done")
        #expect(try await p.show("done")?.string("state") == "completed", "not reopened")
        p.remove("hooks/fail")
        try await p.drain()
        let all = p.deliveries("done")
        #expect(all.count == failed + 1)
        #expect(all.last?.string("stdin.outcome") == "completed")
        #expect(p.server.requests.count == 1, "the outcome is delivered again, the request is not sent again")
        #expect(try await p.list().isEmpty)
    }

    @Test func aSecondRunnerExits75AndNamesTheHolder() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/delay/1500", id: "slow")
        let runner = try p.start(["run"])
        await eventually("the first runner's request") { p.server.requests(path: "/delay").count == 1 }

        let second = try await p.outbox(["run", "--drain"])
        #expect(second.exitCode == 75, "\(second.description)")
        #expect(second.stderr.contains("E_RUNNING"))
        #expect(second.stderr.contains("pid \(runner.pid)"), "the message names the holder: \(second.stderr)")
        let json = try await p.outbox(["run", "--drain", "--json"])
        #expect(json.exitCode == 75)
        #expect(json.json?.string("error.code") == "E_RUNNING")

        runner.signal(SIGTERM)
        let first = await runner.wait()
        #expect(first.exitCode == 0, "\(first.description)")
        // The lock is free again.
        try await p.drain()
    }

    /// A hook still running when the grace ends is stopped with the runner, not left to
    /// finish unseen; its outcome stays unacknowledged for the next run.
    /// A drain stopped that way says so in its exit status: an outcome is left unacknowledged.
    @Test(arguments: [false, true])
    func aHookStillRunningAtTheEndOfTheGraceIsStopped(drain: Bool) async throws {
        let hook =
            "#!/bin/sh\ncat > /dev/null\necho 'said before it was stopped' >&2\necho $$ > hooks/pid\nwhile [ ! -e hooks/never ]; do sleep 0.05; done\n"
        let p = try Project(definitions: ["t": definition("t", top: "on_success: hooks/wait.sh", hooks: false)], hooks: ["wait.sh": hook])
        try await p.enqueue("t", path: "/status/200", id: "w")
        let runner = try p.start(["run", "--grace", "1s"] + (drain ? ["--drain"] : []))
        await eventually("the hook runs") { (p.read("hooks/pid") ?? "").hasSuffix("\n") }
        let pid = try #require(Int32((p.read("hooks/pid") ?? "").trimmingCharacters(in: .whitespacesAndNewlines)))
        let hookProcess = try #require(ObservedProcess(pid))
        runner.signal(SIGTERM)
        let finished = await runner.wait()
        #expect(finished.exitCode == (drain ? 4 : 0), "\(finished.description)")
        #expect(finished.stderr.contains("at the end of the grace"), "\(finished.stderr)")
        // What it wrote on stderr is logged, as for a hook that ends.
        #expect(finished.stderr.contains("hook w: said before it was stopped"), "\(finished.stderr)")
        // The runner ends: the delivery is the next run's, not one due in a moment.
        #expect(finished.stderr.contains("(delivery 1); it will be delivered again by the next run (not before "), "\(finished.stderr)")
        #expect(hookProcess.hasEnded, "the hook \(pid) still runs")
        let outcomes = try #require(try await p.show("w")?["outcomes"]?.arrayValue)
        #expect(outcomes.first?["acknowledged"] == .bool(false))
        // `show` says why, as for a hook that failed.
        #expect(outcomes.first?["reason"] == .string("the hook was still running at the end of the grace and was stopped"))
    }

    /// SIGQUIT stops the run at once, as a second stop request does: a hook still running is
    /// stopped with it (its outcome is delivered again next run), not left behind.
    @Test func sigquitStopsTheRunAtOnceWithItsHooks() async throws {
        let hook = "#!/bin/sh\ncat > /dev/null\necho $$ > hooks/pid\nwhile [ ! -e hooks/never ]; do sleep 0.05; done\n"
        let p = try Project(definitions: ["t": definition("t", top: "on_success: hooks/wait.sh", hooks: false)], hooks: ["wait.sh": hook])
        try await p.enqueue("t", path: "/status/200", id: "q")
        let runner = try p.start(["run", "--grace", "1h"])
        await eventually("the hook runs") { (p.read("hooks/pid") ?? "").hasSuffix("\n") }
        let pid = try #require(Int32((p.read("hooks/pid") ?? "").trimmingCharacters(in: .whitespacesAndNewlines)))
        let hookProcess = try #require(ObservedProcess(pid))
        runner.signal(SIGQUIT)
        let finished = await runner.wait()
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished.description)")
        // Said as it is done: no grace is offered.
        #expect(finished.stderr.contains("outbox: stopping now; attempts in flight are stopped"), "\(finished.stderr)")
        #expect(!finished.stderr.contains("may finish within"), "\(finished.stderr)")
        #expect(hookProcess.hasEnded, "the hook \(pid) still runs")
        let outcomes = try #require(try await p.show("q")?["outcomes"]?.arrayValue)
        #expect(outcomes.first?["acknowledged"] == .bool(false))
    }

    /// `--max-time` stops as a first SIGTERM does: a signal after it is the second, which ends
    /// the grace at once (the held request is never released here).
    @Test func aSignalAfterMaxTimeEndsTheGraceAtOnce() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/hold/m", id: "m")
        // Long enough for the request to be sent first even on a busy machine.
        let runner = try p.start(["run", "--max-time", "8s", "--grace", "1h"])
        defer { p.server.release("m") }
        #expect(await p.server.waitForHeld("m"))
        await eventually("the grace to begin") { runner.stderrSoFar.contains("--max-time reached") }
        #expect(runner.stderrSoFar.contains("(signal to stop now)"), "\(runner.stderrSoFar)")
        runner.signal(SIGTERM)
        let finished = await runner.wait()
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished.description)")
        #expect(try await p.show("m")?.string("state") == "queued", "cut off, not answered: its entry stays queued")
    }

    /// A stop signal the parent had ignored (a script's `&` job ignores SIGINT) stays ignored
    /// by `run`; the others are taken.
    @Test func aSignalIgnoredByTheParentStaysIgnored() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/hold/i", id: "i")
        let runner = try RunningProcess(
            executable: "/bin/sh", arguments: ["-c", "trap '' INT; exec \"$0\" run --grace 1h", p.executable], cwd: p.root,
            environment: p.processEnvironment())
        // Sending, the runner has long installed its handlers.
        #expect(await p.server.waitForHeld("i"))
        func mask(_ name: String) -> UInt64 {
            let status = (try? String(contentsOfFile: "/proc/\(runner.pid)/status", encoding: .utf8)) ?? ""
            let line = status.split(separator: "\n").first { $0.hasPrefix(name + ":") } ?? ""
            return UInt64(line.dropFirst(name.count + 1).trimmingCharacters(in: .whitespaces), radix: 16) ?? 0
        }
        let bit = { (signal: Int32) in UInt64(1) << UInt64(signal - 1) }
        #expect(mask("SigIgn") & bit(SIGINT) != 0, "SIGINT is ignored still")
        #expect(mask("SigCgt") & bit(SIGTERM) != 0)
        runner.signal(SIGTERM)
        p.server.release("i")
        let finished = await runner.wait()
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished.description)")
    }

    /// A hook that exited 0 before the runner stops at once (a second signal) is
    /// acknowledged: the next run does not deliver its outcome again. The runner is held with
    /// the hook's exit seen while both stop requests reach it.
    @Test func aHookThatExitedBeforeAStopNowIsAcknowledged() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200", id: "h1")
        let go = p.path("go")
        let runner = try p.start(["run"], environment: ["OUTBOX_FAULT_HOLD": "run.hook-finished:" + go])
        await eventually("the runner held with the hook's exit seen") { p.exists("go.reached") }
        for stop in [SIGTERM, SIGINT] {
            runner.signal(stop)
            // Taken by the runner's handler: no longer pending for the process.
            await eventually("the stop request taken") { !Self.signalPending(runner.pid) }
        }
        p.touch("go")
        let stopped = await runner.wait()
        #expect(stopped.exitCode == 0 && !stopped.timedOut, "\(stopped)")
        #expect(p.deliveries("h1").count == 1)
        try await p.drain()
        #expect(p.deliveries("h1").count == 1, "delivered once: \(p.hookLog)")
        #expect(try await p.list().isEmpty)
    }

    /// An outcome whose entry is cancelled after the runner chose it for delivery, before the
    /// delivery is counted, is gone with its entry: no hook starts for it (one did, told it was
    /// delivery 0, and the summary counted it delivered).
    @Test func anOutcomeCancelledAsItsDeliveryIsChosenStartsNoHook() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200", id: "c1")
        let go = p.path("go")
        let runner = try p.start(["run", "--drain", "--json"], environment: ["OUTBOX_FAULT_HOLD": "deliver.chosen:" + go])
        await eventually("the runner held with the delivery chosen") { p.exists("go.reached") }
        #expect(try await p.outbox(["cancel", "c1"]).exitCode == 0)
        p.touch("go")
        let ended = await runner.wait()
        #expect(ended.exitCode == 0 && !ended.timedOut, "\(ended)")
        #expect(p.deliveries("c1").isEmpty, "\(p.hookLog)")
        #expect(ended.stdout.contains(#""delivered":0"#), "\(ended.stdout)")
        #expect(try await p.list().isEmpty)
    }

    /// A stop at once (a second signal) does not wait for a response parser that runs on:
    /// the parser's group is killed, the entry is not settled but put back in the queue, and
    /// the next run sends it again. The parser would run for an hour (`plugins.timeout`).
    @Test func aSecondStopKillsARunningResponseParserAndRequeuesItsEntry() async throws {
        let parser = "#!/bin/sh\ncat > /dev/null\necho $$ > hooks/parser.pid\nwhile [ ! -e hooks/go ]; do sleep 0.05; done\necho '{}'\n"
        let p = try Self.parserProject(parser, config: fastConfig + "plugins: { timeout: 1h }\n")
        try await p.enqueue("t", path: "/status/200", id: "p")
        let runner = try p.start(["run", "--grace", "1h"])
        let (stopped, parserProcess, pid) = try await Self.stopAtOnce(runner, whilePluginRuns: p, writingItsPidTo: "hooks/parser.pid")
        #expect(stopped.exitCode == 0 && !stopped.timedOut, "\(stopped)")
        #expect(stopped.stderr.contains("while the response parser of p ran; the plugin was killed"), "\(stopped.stderr)")
        #expect(parserProcess.hasEnded, "the parser \(pid) still runs")
        #expect(try await p.states()["p"] == "queued")
        #expect(p.deliveries("p").isEmpty)

        p.touch("hooks/go")
        try await p.drain()
        #expect(p.deliveries("p").map { $0.string("stdin.outcome") } == ["completed"])
        #expect(p.server.requests(path: "/status/200").count == 2, "sent again: its answer was never settled")
        #expect(try await p.list().isEmpty)
    }

    /// A runner killed while a response parser runs: the parser dies with it, and what the
    /// parser started in the background is stopped by the next runner before it sends the
    /// entry again (it would run on for ten minutes beside the new parser). A daemon it
    /// started in a session of its own left on purpose, and runs on.
    @Test func whatAPluginOfAKilledRunnerStartedIsStoppedByTheNextRunner() async throws {
        let parser = """
            #!/bin/sh
            cat > /dev/null
            if [ ! -e hooks/parsed-once ]; then
              touch hooks/parsed-once
              sleep 600 </dev/null >/dev/null 2>&1 &
              \(ObservedProcess.recordLastBackground(to: "hooks/child.new"))
              setsid sleep 600 </dev/null >/dev/null 2>&1 &
              \(ObservedProcess.recordLastBackground(to: "hooks/daemon"))
              mv hooks/child.new hooks/child
              exec sleep 600
            fi
            echo '{}'

            """
        let p = try Self.parserProject(parser, config: fastConfig + "plugins: { timeout: 1h }\n")
        try await p.enqueue("t", path: "/status/200", id: "p")
        let runner = try p.start(["run"])
        await eventually("the parser's background child to start") { p.exists("hooks/child") }
        let child = try #require(ObservedProcess(recorded: p.read("hooks/child") ?? ""))
        let daemon = try #require(ObservedProcess(recorded: p.read("hooks/daemon") ?? ""))
        defer { if !daemon.hasEnded { kill(daemon.pid, SIGKILL) } }
        runner.signal(SIGKILL)
        let killed = await runner.wait()
        #expect(killed.exitCode == -SIGKILL, "\(killed)")
        #expect(!child.hasEnded, "the background child outlives its runner")

        let second = try await p.drain()
        #expect(
            second.stderr.contains("stopped plugin processes left running by outbox process \(runner.pid), which has ended"),
            "\(second.stderr)")
        await eventually("the background child to be stopped") { child.hasEnded }
        #expect(!daemon.hasEnded, "the daemon in a session of its own runs on")
        #expect(p.deliveries("p").map { $0.string("stdin.outcome") } == ["completed"])
        #expect(try await p.list().isEmpty)
    }

    /// A response parser runs beside the runner: while one waits, entries enqueued after it
    /// started are sent, settled and delivered; the parsed entry keeps its slot and settles
    /// with the parser's answer once it comes, and the drain waits for it.
    @Test func aSlowResponseParserHoldsOnlyItsOwnEntry() async throws {
        let parser =
            "#!/bin/sh\ncat > /dev/null\ntouch hooks/parsing\nwhile [ ! -e hooks/go ]; do sleep 0.05; done\necho '{\"parsed\": true}'\n"
        let p = try Self.parserProject(parser, config: fastConfig + "plugins: { timeout: 1h }\n", more: ["plain": definition("plain")])
        defer { p.touch("hooks/go") }
        try await p.enqueue("t", path: "/status/200?slow", id: "slow")
        let runner = try p.start(["run", "--drain"])
        await eventually("the parser runs") { p.exists("hooks/parsing") }
        // Enqueued once the parser runs: only a runner that keeps turning sends them.
        for id in ["b1", "b2"] { try await p.enqueue("plain", path: "/status/200?\(id)", id: id) }
        await eventually("both delivered while the parser waits") { p.deliveries("b1").count == 1 && p.deliveries("b2").count == 1 }
        #expect(try await p.states()["slow"] == "running")
        #expect(p.deliveries("slow").isEmpty)
        let explain = try await p.outbox(["explain", "slow"])
        #expect(explain.stdout.contains("sending, answered and waiting for its response parser, or ready to start"), "\(explain.stdout)")

        p.touch("hooks/go")
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished)")
        let delivered = p.deliveries("slow")
        #expect(delivered.map { $0.string("stdin.outcome") } == ["completed"], "\(p.hookLog)")
        #expect(delivered.first?["stdin"]?["data"]?["parsed"] == .bool(true), "\(delivered)")
        #expect(p.server.requests(path: "/status/200?slow").count == 1)
        #expect(try await p.list().isEmpty)
    }

    /// A runner killed with SIGKILL while a response parser runs takes the parser along: no
    /// plugin runs on for a runner that is gone (the next run sends the entry again).
    @Test func aParserDiesWithARunnerKilledWhileItRuns() async throws {
        let parser =
            "#!/bin/sh\ncat > /dev/null\necho $$ > hooks/parser.pid\nwhile [ ! -e hooks/go ]; do sleep 0.05; done\necho '{}'\n"
        // A list runs the program itself (no shell between them), which is what dies with the runner.
        let p = try Project(
            config: fastConfig + "plugins: { timeout: 1h }\n",
            definitions: ["t": definition("t", top: "response: { command: [hooks/parse.sh] }")], hooks: ["parse.sh": parser])
        defer { p.touch("hooks/go") }
        try await p.enqueue("t", path: "/status/200?slow", id: "slow")
        let runner = try p.start(["run"])
        await eventually("the parser runs") {
            (try? String(contentsOfFile: p.path("hooks/parser.pid"), encoding: .utf8))?.hasSuffix("\n") == true
        }
        let pid = try #require(Int32((try String(contentsOfFile: p.path("hooks/parser.pid"), encoding: .utf8)).dropLast()))
        runner.signal(SIGKILL)
        _ = await runner.wait(timeout: 60)
        await eventually("the parser is gone") { Self.isGone(pid) }
        #expect(Self.isGone(pid), "the parser \(pid) outlived its runner")

        p.touch("hooks/go")
        let run = try await p.drain(failures: 0)
        #expect(p.deliveries("slow").map { $0.string("stdin.outcome") } == ["completed"], "\(run.stderr)")
        #expect(try await p.list().isEmpty)
    }

    /// Whether `pid` has ended: no such process, or one that is only waiting to be reaped.
    static func isGone(_ pid: Int32) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8) else { return true }
        // The state follows the name, which is in parentheses and may hold spaces.
        guard let close = stat.lastIndex(of: ")") else { return true }
        return stat[stat.index(after: close)...].trimmingCharacters(in: .whitespaces).hasPrefix("Z")
    }

    /// A parser keeps its entry's slot: with `concurrency: 1`, no request starts (not even one
    /// waiting as standby) while a response is being parsed, so no two parsers ever overlap.
    @Test func aParserKeepsItsSlot() async throws {
        let parser = "#!/bin/sh\ncat > /dev/null\necho start >> hooks/parsers.log\nsleep 0.3\necho end >> hooks/parsers.log\necho '{}'\n"
        let p = try Self.parserProject(parser, config: fastConfig + "concurrency: 1\n")
        for n in 1...4 { try await p.enqueue("t", path: "/status/200?\(n)", id: "p\(n)") }
        let run = try await p.drain(failures: 0)
        #expect(run.exitCode == 0)
        let log = (p.read("hooks/parsers.log") ?? "").split(separator: "\n")
        #expect(log == Array(repeating: ["start", "end"], count: 4).flatMap { $0 }, "parsers overlapped: \(log)")
        #expect(p.deliveries("p4").count == 1)
        #expect(try await p.list().isEmpty)
    }

    /// A parser the system had no fds or processes for is started again shortly: the answer
    /// in hand is parsed, never judged unread (an error outcome of a 2xx, for good).
    @Test func aParserThatCouldNotStartIsStartedAgain() async throws {
        let parser = "#!/bin/sh\ncat > /dev/null\necho '{\"parsed\": true}'\n"
        let p = try Self.parserProject(parser)
        try await p.enqueue("t", path: "/status/200", id: "a")
        let run = try await p.outbox(["run", "--drain"], environment: ["OUTBOX_FAULT_FAIL": "plugin.start:3"])
        #expect(run.exitCode == 0, "\(run)")
        #expect(!run.stderr.contains("its response was not read"), "\(run.stderr)")
        let delivered = p.deliveries("a")
        #expect(delivered.map { $0.string("stdin.outcome") } == ["completed"], "\(p.hookLog)")
        #expect(delivered.first?["stdin"]?["data"]?["parsed"] == .bool(true))
        #expect(p.server.requests(path: "/status/200").count == 1)
    }

    /// A cancel kills the parser of its entry, and a drain that has nothing else to do waits
    /// until the parser is gone: nothing the run started outlives it.
    @Test func aDrainEndsOnlyOnceTheParserOfACancelledEntryIsGone() async throws {
        let parser = "#!/bin/sh\ncat > /dev/null\necho $$ > hooks/parser.pid\nwhile [ ! -e hooks/go ]; do sleep 0.05; done\necho '{}'\n"
        let p = try Self.parserProject(parser, config: fastConfig + "plugins: { timeout: 1h }\n")
        defer { p.touch("hooks/go") }
        try await p.enqueue("t", path: "/status/200", id: "c")
        let runner = try p.start(["run", "--drain", "--events", "-"])
        await eventually("the parser runs") { (p.read("hooks/parser.pid") ?? "").hasSuffix("\n") }
        let pid = try #require(Int32((p.read("hooks/parser.pid") ?? "").trimmingCharacters(in: .whitespacesAndNewlines)))
        let parserProcess = try #require(ObservedProcess(pid))
        #expect(try await p.outbox(["cancel", "c"]).exitCode == 0)
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished)")
        #expect(parserProcess.hasEnded, "the parser \(pid) outlived the run")
        expectReportedCancelled(finished, "c", as: .events)
        #expect(p.hookLog.isEmpty)
    }

    /// Lets the plugin answer (`hooks/go`), and expects the drain to end with `o1` sent once,
    /// delivered `completed`, and its `receipt` follow-up `r-o1` sent and delivered once.
    static func releaseAndExpectTheChain(
        _ p: Project, _ runner: RunningProcess, sourceLocation: SourceLocation = #_sourceLocation
    )
        async throws
    {
        p.touch("hooks/go")
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished)", sourceLocation: sourceLocation)
        #expect(
            p.deliveries("o1").map { $0.string("stdin.outcome") } == ["completed"], "\(p.hookLog)", sourceLocation: sourceLocation)
        #expect(p.deliveries("r-o1").count == 1, "\(p.hookLog)", sourceLocation: sourceLocation)
        #expect(p.server.requests(path: "/status/200?order").count == 1, sourceLocation: sourceLocation)
        #expect(p.server.requests(path: "/status/201?receipt").count == 1, sourceLocation: sourceLocation)
        #expect(try await p.list().isEmpty, sourceLocation: sourceLocation)
    }

    /// A project whose entry `order` chains a `receipt` follow-up built by a request_command
    /// that says it runs (`hooks/building`) and answers once `hooks/go` exists.
    static func slowFollowUpProject() throws -> Project {
        let parent = definition("order", top: "then:\n  on_success:\n    - key: receipt\n      id: \"r-{{ entry.id }}\"\n")
        let receipt = "key: receipt\nrequest_command: hooks/receipt.sh\non_success: hooks/record.sh\n"
        let p = try Project(
            config: fastConfig + "plugins: { timeout: 1h }\n",
            definitions: ["order": parent, "receipt": receipt, "plain": definition("plain")])
        try p.write(
            "hooks/receipt.sh",
            "#!/bin/sh\ncat > /dev/null\necho $$ > hooks/building\nwhile [ ! -e hooks/go ]; do sleep 0.05; done\necho '{\"url\": \"\(p.url("/status/201?receipt"))\"}'\n",
            mode: 0o755)
        return p
    }

    /// A follow-up's request_command runs beside the runner: while it waits, entries enqueued
    /// after it started are sent and delivered; the parent keeps its slot, and settles with its
    /// chain once the plugin answers.
    @Test func aSlowFollowUpPluginHoldsOnlyItsOwnEntry() async throws {
        let p = try Self.slowFollowUpProject()
        defer { p.touch("hooks/go") }
        try await p.enqueue("order", path: "/status/200?order", id: "o1")
        let runner = try p.start(["run", "--drain"])
        await eventually("the follow-up's plugin runs") { p.exists("hooks/building") }
        try await p.enqueue("plain", path: "/status/200?b1", id: "b1")
        await eventually("b1 delivered while the plugin waits") { p.deliveries("b1").count == 1 }
        #expect(try await p.states()["o1"] == "running")
        #expect(p.deliveries("o1").isEmpty)

        try await Self.releaseAndExpectTheChain(p, runner)
    }

    /// A hook's enqueue line whose key has a slow request_command is read beside the runner:
    /// while the plugin waits, other entries are sent and delivered; the hook's delivery is
    /// acknowledged with its follow-up once the plugin answers.
    @Test func aSlowPluginOfAHookLineHoldsOnlyItsDelivery() async throws {
        let p = try Self.slowFollowUpProject()
        defer { p.touch("hooks/go") }
        try p.define("lines", "key: lines\nrequest:\n  url: \"{{ vars.url }}\"\non_success: hooks/lines.sh\n")
        try p.write(
            "hooks/lines.sh", "#!/bin/sh\ncat > /dev/null\necho '{\"enqueue\": {\"key\": \"receipt\", \"id\": \"r-line\"}}'\n", mode: 0o755)
        try await p.enqueue("lines", path: "/status/200?lines", id: "l1")
        let runner = try p.start(["run", "--drain"])
        await eventually("the line's plugin runs") { p.exists("hooks/building") }
        try await p.enqueue("plain", path: "/status/200?b1", id: "b1")
        await eventually("b1 delivered while the plugin waits") { p.deliveries("b1").count == 1 }
        #expect(try await p.show("l1")?.at("outcomes.0.acknowledged") == .bool(false))

        p.touch("hooks/go")
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished)")
        #expect(p.deliveries("r-line").count == 1, "\(p.hookLog)")
        #expect(p.server.requests(path: "/status/201?receipt").count == 1)
        #expect(p.server.requests(path: "/status/200?lines").count == 1)
        #expect(try await p.list().isEmpty)
    }

    /// A hook's enqueue line whose key's request_command fails is no invalid line: the delivery
    /// fails saying what could not be built, and succeeds once the plugin answers.
    @Test func aHookLineWhosePluginFailsIsNotCalledInvalid() async throws {
        let p = try Project(
            config: fastConfig,
            definitions: [
                "lines": "key: lines\nrequest:\n  url: \"{{ vars.url }}\"\non_success: hooks/lines.sh\n",
                "receipt": "key: receipt\nrequest_command: hooks/receipt.sh\non_success: hooks/record.sh\n",
            ])
        try p.write(
            "hooks/lines.sh", "#!/bin/sh\ncat > /dev/null\necho '{\"enqueue\": {\"key\": \"receipt\", \"id\": \"r-line\"}}'\n", mode: 0o755)
        try p.write(
            "hooks/receipt.sh",
            "#!/bin/sh\ncat > /dev/null\n[ -f hooks/up ] || { echo 'token service down' >&2; exit 3; }\necho '{\"url\": \"\(p.url("/status/201"))\"}'\n",
            mode: 0o755)
        try await p.enqueue("lines", path: "/status/200", id: "l1")
        let first = try await p.drain(["--horizon", "0s"], failures: 4)
        #expect(
            first.stderr.contains(
                "an enqueue line of the hook (key receipt) could not be built yet: request_command exited 3: token service down"),
            "\(first.stderr)")
        #expect(!first.stderr.contains("invalid enqueue line"), "\(first.stderr)")
        p.touch("hooks/up")
        try await p.drain(failures: 0)
        #expect(p.deliveries("r-line").count == 1)
        #expect(try await p.list().isEmpty)
    }

    /// A stop at once kills the plugin reading a hook's enqueue lines: nothing of them is
    /// applied, the delivery counts as failed, and the next run delivers the outcome again
    /// (its request is not sent again) and enqueues the follow-up once.
    @Test func aSecondStopKillsTheReadingOfAHooksLines() async throws {
        let p = try Self.slowFollowUpProject()
        defer { p.touch("hooks/go") }
        try p.define("lines", "key: lines\nrequest:\n  url: \"{{ vars.url }}\"\non_success: hooks/lines.sh\n")
        try p.write(
            "hooks/lines.sh",
            "#!/bin/sh\ncat > /dev/null\necho run >> hooks/lines.log\necho '{\"enqueue\": {\"key\": \"receipt\", \"id\": \"r-line\"}}'\n",
            mode: 0o755)
        try await p.enqueue("lines", path: "/status/200?lines", id: "l1")
        let runner = try p.start(["run", "--grace", "1h"])
        let (stopped, plugin, pid) = try await Self.stopAtOnce(runner, whilePluginRuns: p, writingItsPidTo: "hooks/building")
        #expect(!stopped.timedOut, "\(stopped)")
        #expect(stopped.stderr.contains("the run stopped at once while a plugin read the hook's enqueue lines"), "\(stopped.stderr)")
        #expect(plugin.hasEnded, "the plugin \(pid) still runs")
        #expect(try await p.show("l1")?.at("outcomes.0.acknowledged") == .bool(false))
        #expect(try await p.states()["r-line"] == nil, "nothing of the lines was applied")

        p.touch("hooks/go")
        try await p.drain()
        #expect(p.read("hooks/lines.log") == "run\nrun\n", "delivered again")
        #expect(p.server.requests(path: "/status/200?lines").count == 1, "not sent again")
        #expect(p.deliveries("r-line").count == 1)
        #expect(try await p.list().isEmpty)
    }

    /// A chain whose plugin failed at the settle waits for its delivery; built again then, a
    /// plugin that is slow this time runs beside the runner too: other entries are sent and
    /// delivered meanwhile, and the parent's outcome is delivered with its chain once built.
    /// On PostgreSQL too, where runners share the store and the chain is built before the
    /// delivery is claimed.
    @Test(arguments: [false, true])
    func aChainBuiltAgainAtDeliveryDoesNotHoldTheQueue(postgres: Bool) async throws {
        let parent = definition("order", top: "then:\n  on_success:\n    - key: receipt\n      id: \"r-{{ entry.id }}\"\n")
        let receipt = "key: receipt\nrequest_command: hooks/receipt.sh\non_success: hooks/record.sh\n"
        let p = try Project(
            config: fastConfig + "plugins: { timeout: 1h }\n",
            definitions: ["order": parent, "receipt": receipt, "plain": definition("plain")])
        if postgres {
            p.environment["OUTBOX_STORE"] = try PostgresCluster.shared().url(schema: PostgresCluster.uniqueSchema("chain"))
        }
        defer { p.touch("hooks/go") }
        try p.write(
            "hooks/receipt.sh",
            "#!/bin/sh\ncat > /dev/null\n[ -f hooks/up ] || { echo 'token service down' >&2; exit 3; }\ntouch hooks/building\nwhile [ ! -e hooks/go ]; do sleep 0.05; done\necho '{\"url\": \"\(p.url("/status/201?receipt"))\"}'\n",
            mode: 0o755)
        try await p.enqueue("order", path: "/status/200?order", id: "o1")
        let first = try await p.drain(["--horizon", "0s"], failures: 4)
        #expect(first.stderr.contains("the follow-ups of o1 wait for its delivery"), "\(first.stderr)")

        p.touch("hooks/up")
        let runner = try p.start(["run", "--drain", "--horizon", "1h"])
        await eventually("the chain's plugin runs") { p.exists("hooks/building") }
        try await p.enqueue("plain", path: "/status/200?b1", id: "b1")
        await eventually("b1 delivered while the chain is built") { p.deliveries("b1").count == 1 }
        #expect(p.deliveries("o1").isEmpty, "the parent's hook waits for its chain")

        try await Self.releaseAndExpectTheChain(p, runner)
    }

    /// A stop at once kills a follow-up's plugin as it does a parser: the parent is not settled
    /// but put back in the queue, and the next run sends it again and builds its chain.
    @Test func aSecondStopKillsAFollowUpPluginAndRequeuesItsEntry() async throws {
        let p = try Self.slowFollowUpProject()
        defer { p.touch("hooks/go") }
        try await p.enqueue("order", path: "/status/200?order", id: "o1")
        let runner = try p.start(["run", "--grace", "1h"])
        let (stopped, plugin, pid) = try await Self.stopAtOnce(runner, whilePluginRuns: p, writingItsPidTo: "hooks/building")
        #expect(stopped.exitCode == 0 && !stopped.timedOut, "\(stopped)")
        #expect(stopped.stderr.contains("while the follow-up's plugin of o1 ran; the plugin was killed"), "\(stopped.stderr)")
        #expect(plugin.hasEnded, "the plugin \(pid) still runs")
        #expect(try await p.states() == ["o1": "queued"])

        p.touch("hooks/go")
        try await p.drain()
        #expect(p.server.requests(path: "/status/200?order").count == 2, "sent again: its answer was never settled")
        #expect(p.deliveries("r-o1").count == 1)
        #expect(try await p.list().isEmpty)
    }

    /// Once a plugin runs (it writes its pid to `pidFile` in `p`), stops the runner at once
    /// with two signals; returns how the runner ended, and the plugin's process and pid.
    static func stopAtOnce(
        _ runner: RunningProcess, whilePluginRuns p: Project, writingItsPidTo pidFile: String
    ) async throws -> (
        CommandResult, ObservedProcess, Int32
    ) {
        await eventually("the plugin runs") { (p.read(pidFile) ?? "").hasSuffix("\n") }
        let pid = try #require(Int32((p.read(pidFile) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)))
        let plugin = try #require(ObservedProcess(pid))
        for stop in [SIGTERM, SIGINT] {
            runner.signal(stop)
            await eventually("the stop request taken") { !signalPending(runner.pid) }
        }
        return (await runner.wait(), plugin, pid)
    }

    /// A project whose key `t` has the response parser `parser` (hooks/parse.sh), beside `more`.
    static func parserProject(_ parser: String, config: String = fastConfig, more: [String: String] = [:]) throws -> Project {
        try Project(
            config: config, definitions: more.merging(["t": definition("t", top: "response: { command: hooks/parse.sh }")]) { $1 },
            hooks: ["parse.sh": parser])
    }

    /// Whether a signal waits for `pid` (any of its threads, or the process as a whole).
    static func signalPending(_ pid: Int32) -> Bool {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        let files = ["/proc/\(pid)/status"] + tasks.map { "/proc/\(pid)/task/\($0)/status" }
        return files.contains { file in
            let text = (try? String(contentsOfFile: file, encoding: .utf8)) ?? ""
            return text.split(separator: "\n").contains { line in
                (line.hasPrefix("SigPnd:") || line.hasPrefix("ShdPnd:"))
                    && line.dropFirst(7).contains { $0 != "0" && $0.isHexDigit }
            }
        }
    }

    /// A drain's live display counts what the drain sends: not an entry delayed past its
    /// horizon, nor a paused key's (it showed "1/3 entries" at the end of this drain).
    @Test func aDrainsProgressCountsOnlyWhatItSends() async throws {
        let p = try Project(config: fastConfig, definitions: ["t": definition("t"), "u": definition("u")])
        try await p.enqueue("t", path: "/status/200", id: "now")
        try await p.enqueue("t", path: "/status/200", id: "later", extra: ["--delay", "1h"])
        try await p.enqueue("u", path: "/status/200", id: "paused")
        #expect(try await p.outbox(["pause", "--key", "u"]).exitCode == 0)
        let run = try await p.drain(["--progress", "always"], failures: 0)
        let counts = run.stderr.split(separator: "\r").compactMap { line in
            line.range(of: " entries").map { String(line[line.index(line.startIndex, offsetBy: 4)..<$0.lowerBound]) }
        }
        #expect(!counts.isEmpty, "the display drew: \(run.stderr)")
        #expect(counts.allSatisfy { $0.hasSuffix("/1") }, "\(counts)")
        let states = try await p.states()
        #expect(states == ["later": "queued", "paused": "paused"], "\(states)")
    }

    /// The live line's "running" counts entries sending, not those claimed ahead as standby
    /// transfers waiting for a connection (it said "3 running" under `concurrency: 1`).
    @Test func theLiveLineCountsEntriesSendingNotThoseWaitingToStart() async throws {
        let p = try Project(config: fastConfig + "concurrency: 1\nper_host: 1\n", definitions: ["t": definition("t")])
        for id in ["a", "b", "c"] { try await p.enqueue("t", path: "/hold/\(id)", id: id) }
        let runner = try p.start(["run", "--drain", "--progress", "always"])
        #expect(await p.server.waitForHeld("a"))
        try await eventually("the others to be claimed ahead, as standby") {
            try await p.states().values.filter { $0 == "running" }.count == 3
        }
        let seen = runner.stderrSoFar.count
        await eventually("a line drawn since") { runner.stderrSoFar.dropFirst(seen).contains(" running") }
        let drawn = String(runner.stderrSoFar.dropFirst(seen))
        #expect(drawn.contains("· 1 running"), "\(drawn)")
        #expect(!drawn.contains("· 2 running") && !drawn.contains("· 3 running"), "\(drawn)")
        for id in ["a", "b", "c"] { p.server.release(id) }
        #expect(await runner.wait().exitCode == 0)
    }

    @Test func sigtermLetsTheAttemptInFlightFinishAndLeavesTheRestQueued() async throws {
        let p = try Project(config: fastConfig + "concurrency: 1\n", definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/hold/a", id: "a")
        try await p.enqueue("t", path: "/status/200", id: "b")
        try await p.enqueue("t", path: "/status/200", id: "c")
        // A long grace: the test ends the attempt itself, and a loaded machine may take longer
        // than 20 s to show the stop's turn (the grace then cut "a" off and it was sent again).
        let runner = try p.start(["run", "--grace", "10m", "--events", "-", "--progress", "always"])
        #expect(await p.server.waitForHeld("a"))
        runner.signal(SIGTERM)
        // The live display redraws below a log line at the end of that line's turn: drawn
        // after "stopping", the stop's turn is over and it withdrew the standby request.
        await eventually("the runner to finish the turn that stops it") {
            let stderr = runner.stderrSoFar
            guard let stop = stderr.range(of: "outbox: stopping") else { return false }
            return stderr[stop.upperBound...].contains("entries")
        }
        p.server.release("a")
        let finished = await runner.wait()
        #expect(finished.exitCode == 0, "\(finished.description)")
        #expect(!finished.timedOut)
        let attempts = finished.jsonLines.filter { $0.string("type") == "attempt" }
        #expect(attempts.map { $0.string("id") ?? "" } == ["a"])
        #expect(attempts.first?.string("outcome") == "success")
        #expect(attempts.first?.int("http_code") == 200)
        #expect(p.server.requests.count == 1, "nothing new starts after SIGTERM")

        let states = Dictionary(uniqueKeysWithValues: try await p.list().map { ($0.string("id") ?? "", $0.string("state") ?? "") })
        #expect(states["a"] == nil || states["a"] == "completed")
        #expect(states["b"] == "queued")
        #expect(states["c"] == "queued")

        try await p.drain()
        #expect(Set(p.hookLog.map { $0.string("env.id") ?? "" }) == ["a", "b", "c"])
        #expect(p.server.requests(path: "/hold/a").count == 1)
        #expect(try await p.list().isEmpty)
    }

    /// Standby transfers wait on the curl thread, so the server never sees more requests at
    /// once than `concurrency` and `per_host` allow. curl reuses an idle connection before it
    /// opens one, so the connections the server saw are the requests that overlapped.
    @Test(arguments: [(concurrency: 2, perHost: 4, connections: 2), (concurrency: 4, perHost: 1, connections: 1)])
    func requestsInFlightStayWithinConcurrencyAndPerHost(_ limits: (concurrency: Int, perHost: Int, connections: Int)) async throws {
        let p = try Project(
            config: fastConfig + "concurrency: \(limits.concurrency)\nper_host: \(limits.perHost)\n",
            definitions: ["t": definition("t")])
        for i in 0..<6 { try await p.enqueue("t", path: "/hold/e", id: "e\(i)") }
        let runner = try p.start(["run", "--drain"])
        // One request at a time goes on; each time, as many requests as the limits allow are
        // held: the overlap is counted, not guessed from timing.
        let limit = min(limits.concurrency, limits.perHost)
        var released = 0
        while released < 6 {
            let inFlight = min(limit, 6 - released)
            guard await p.server.waitForHeld("e", count: inFlight) else {
                Issue.record("\(inFlight) requests were never in flight at once (\(released) released)")
                break
            }
            #expect(p.server.requests(path: "/hold/e").count == released + inFlight, "more requests in flight than the limits allow")
            released += p.server.release("e", count: 1)
        }
        p.server.release("e")
        let finished = await runner.wait()
        #expect(finished.exitCode == 0, "\(finished.description)")
        let received = p.server.requests(path: "/hold/e")
        #expect(received.count == 6)
        #expect(Set(received.map(\.connectionID)).count == limits.connections)
        #expect(Set(p.hookLog.map { $0.string("env.id") ?? "" }) == Set((0..<6).map { "e\($0)" }))
    }

    /// Entries held back by `per_host` keep their place in the queue: with two servers, one
    /// request per host and most entries for the first, each server receives its entries
    /// once each and in the order they were enqueued.
    @Test func entriesHeldByPerHostKeepTheirPlace() async throws {
        let p = try Project(config: fastConfig + "concurrency: 4\nper_host: 1\n", definitions: ["t": definition("t", hooks: false)])
        let other = try TestHTTPServer(port: 0)
        defer { other.stop() }
        var lines = "", first: [String] = [], second: [String] = []
        for i in 0..<40 {
            let id = "e\(i)", toSecond = i % 5 == 4
            if toSecond { second.append(id) } else { first.append(id) }
            let url = (toSecond ? other : p.server).url("/status/200?\(id)")
            lines +=
                JSON.object([("id", .string(id)), ("vars", .object([("url", .string(url)), ("tag", .string(id))]))]).serialized() + "\n"
        }
        try lines.write(toFile: p.base + "/lines.jsonl", atomically: true, encoding: .utf8)
        #expect(try await p.outbox(["enqueue", "t", "--from", p.base + "/lines.jsonl"]).exitCode == 0)
        try await p.drain()
        #expect(p.server.requests(path: "/status").map(\.path) == first.map { "/status/200?\($0)" })
        #expect(other.requests(path: "/status").map(\.path) == second.map { "/status/200?\($0)" })
        #expect(try await p.list().isEmpty)
    }

    /// A runner with `concurrency: 1` sending `a` (held until the test releases it), with `b`,
    /// `c` and `d` claimed as its three standby requests (shown running) and `e` still queued.
    private func runnerWithStandby() async throws -> (Project, Running) {
        let p = try Project(config: fastConfig + "concurrency: 1\n", definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/hold/a", id: "a")
        for id in ["b", "c", "d", "e"] { try await p.enqueue("t", path: "/status/200?\(id)", id: id) }
        let runner = try p.start(["run", "--drain"])
        #expect(await p.server.waitForHeld("a"))
        var states: [String: String] = [:]
        try await eventually("b, c and d claimed as the standby requests") {
            states = try await p.states()
            return ["b", "c", "d"].allSatisfy { states[$0] == "running" }
        }
        #expect(states["e"] == "queued", "\(states)")
        return (p, runner)
    }

    /// A standby request (claimed, waiting for a slot on the curl thread) whose entry another
    /// process cancels is never sent, and its place goes to the next entry.
    @Test func cancellingAStandbyEntryKeepsItsRequestFromBeingSent() async throws {
        let (p, runner) = try await runnerWithStandby()
        let cancel = try await p.outbox(["cancel", "b"])
        #expect(cancel.exitCode == 0, "\(cancel.description)")
        // The standby places are full: e takes one only once the runner dropped b's request.
        try await eventually("e claimed in place of the cancelled standby request") { try await p.states()["e"] == "running" }
        p.server.release("a")
        let finished = await runner.wait()
        #expect(finished.exitCode == 0, "\(finished.description)")
        #expect(p.server.requests.map(\.path).sorted() == ["/hold/a", "/status/200?c", "/status/200?d", "/status/200?e"])
        #expect(Set(p.hookLog.map { $0.string("env.id") ?? "" }) == ["a", "c", "d", "e"])
        #expect(try await p.list().isEmpty)
    }

    /// Pausing the key of a standby request keeps it from being sent: the entry goes back to
    /// the queue at once and is sent after `resume`.
    @Test func pausingTheKeyOfAStandbyEntryRequeuesIt() async throws {
        let (p, runner) = try await runnerWithStandby()
        #expect(try await p.outbox(["pause", "--key", "t"]).exitCode == 0)
        // The standby entries show paused once the runner has put them back in the queue.
        try await eventually("the runner to requeue b, c and d") {
            let states = try await p.states()
            return ["b", "c", "d"].allSatisfy { states[$0] == "paused" }
        }
        p.server.release("a")
        let finished = await runner.wait()
        #expect(finished.exitCode == 0, "\(finished.description)")
        #expect(p.server.requests.map(\.path) == ["/hold/a"], "nothing of a paused key starts")
        // The withdrawn standby requests were never sent: not attempts of the run.
        #expect(finished.stderr.contains(", 1 attempt in "), "\(finished.stderr)")
        let states = Dictionary(uniqueKeysWithValues: try await p.list().map { ($0.string("id") ?? "", $0.string("state") ?? "") })
        #expect(states == ["b": "paused", "c": "paused", "d": "paused", "e": "paused"])

        #expect(try await p.outbox(["resume", "--key", "t"]).exitCode == 0)
        try await p.drain()
        #expect(p.server.requests.map(\.path) == ["/hold/a"] + ["b", "c", "d", "e"].map { "/status/200?\($0)" })
        #expect(try await p.list().isEmpty)
    }

    /// Expiry is checked before each attempt, and a standby request starts later than its
    /// claim: an entry expiring within 10 minutes waits in the queue for a free slot, and the
    /// entry behind it takes the standby place.
    @Test func entriesExpiringSoonAreNotClaimedAsStandby() async throws {
        let p = try Project(config: fastConfig + "concurrency: 1\n", definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/hold/a", id: "a")
        // Nine minutes: within the ten that keep it from waiting as standby, and far off for the test.
        try await p.enqueue("t", path: "/status/200?soon", id: "soon", extra: ["--expires-at", String(nowMs() + 540_000)])
        try await p.enqueue("t", path: "/status/200?later", id: "later")
        let runner = try p.start(["run", "--drain"])
        #expect(await p.server.waitForHeld("a"))
        // Claims go in queue order: the one that made `later` the standby request passed `soon` over.
        var states: [String: String] = [:]
        try await eventually("later claimed as the standby request") {
            states = try await p.states()
            return states["later"] == "running"
        }
        #expect(states["soon"] == "queued", "\(states)")
        p.server.release("a")
        let finished = await runner.wait()
        #expect(finished.exitCode == 0, "\(finished.description)")
        #expect(p.server.requests.map(\.path) == ["/hold/a", "/status/200?later", "/status/200?soon"])
    }

    /// A referenced file is checked before each attempt. An entry sending one may wait as a
    /// standby request; its file is checked again when the request starts: one whose file
    /// changed meanwhile settles error kind `file` and is never sent, one whose file did not
    /// is sent.
    @Test func aReferencedFileIsCheckedWhenItsStandbyRequestStarts() async throws {
        let p = try Project(
            config: fastConfig + "concurrency: 1\n",
            definitions: ["t": definition("t"), "f": fileDefinition("f", ownership: "reference")])
        try await p.enqueue("t", path: "/hold/a", id: "a")
        for name in ["changed", "same"] {
            try Data("referenced".utf8).write(to: URL(fileURLWithPath: p.base + "/\(name).bin"))
            let vars = JSON.object([("url", .string(p.url("/status/200?\(name)"))), ("path", .string(p.base + "/\(name).bin"))])
                .serialized()
            #expect(try await p.outbox(["enqueue", "f", "--vars", vars, "--id", name]).exitCode == 0)
        }
        let runner = try p.start(["run", "--drain"])
        #expect(await p.server.waitForHeld("a"))
        try await eventually("changed claimed as a standby request") { try await p.states()["changed"] == "running" }
        try Data("referenced, then changed".utf8).write(to: URL(fileURLWithPath: p.base + "/changed.bin"))
        p.server.release("a")
        let finished = await runner.wait()
        #expect(finished.exitCode == 1, "the changed file's entry settled error: \(finished.description)")
        #expect(p.server.requests.map(\.path) == ["/hold/a", "/status/200?same"])
        let changed = try #require(p.deliveries("changed").first)
        #expect(changed.string("stdin.outcome") == "error")
        #expect(changed.string("stdin.error.kind") == "file")
        #expect(changed.string("stdin.error.message")?.contains("changed since enqueue") == true, "\(changed)")
        #expect(p.deliveries("same").first?.string("stdin.outcome") == "completed")
    }

    /// A staged body cut short or replaced by a link settles error kind `file` at once: its
    /// bytes are gone, so it is neither retried as a network failure nor read through the link.
    @Test(arguments: ["truncated", "link"])
    func aDamagedStagedBodySettlesErrorKindFile(_ damage: String) async throws {
        let p = try Project(config: fastConfig, definitions: ["f": fileDefinition("f")])
        try Data(repeating: 0x61, count: 4096).write(to: URL(fileURLWithPath: p.base + "/a.bin"))
        try Data(repeating: 0x62, count: 4096).write(to: URL(fileURLWithPath: p.base + "/b.bin"))
        let vars = JSON.object([("url", .string(p.url("/status/200"))), ("path", .string(p.base + "/a.bin"))]).serialized()
        #expect(try await p.outbox(["enqueue", "f", "--vars", vars, "--id", "d"]).exitCode == 0)
        let staged = try p.sqlite("SELECT body_file FROM entries WHERE id = 'd'").trimmingCharacters(in: .whitespacesAndNewlines)
        if damage == "truncated" {
            #expect(truncate(staged, 100) == 0)
        } else {
            try FileManager.default.removeItem(atPath: staged)
            #expect(symlink(p.base + "/b.bin", staged) == 0)
        }
        let run = try await p.drain(["--events", "-"], failures: 1)
        #expect(p.server.requests.isEmpty, "nothing was sent")
        let hook = try #require(p.deliveries("d").first)
        #expect(hook.string("stdin.outcome") == "error")
        #expect(hook.string("stdin.error.kind") == "file", "\(hook.serialized())")
        // Nothing went out, so it was no attempt: not in the outcome, the events or the summary.
        #expect(hook.int("stdin.meta.attempts") == 0, "\(hook.serialized())")
        #expect(!run.jsonLines.contains { $0.string("type") == "attempt" }, "\(run.stdout)")
        let settled = try #require(run.jsonLines.first { $0.string("type") == "state" && $0.string("state") == "error" })
        #expect(settled.int("attempts") == 0, "\(settled.serialized())")
        #expect(run.stderr.contains(" 0 attempts "), "\(run.stderr)")
    }

    @Test func graceOverStopsTheAttemptAndRequeuesTheEntry() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        // Never released: only the grace deadline can end the attempt.
        try await p.enqueue("t", path: "/hold/long", id: "long")
        let runner = try p.start(["run", "--grace", "200ms", "--events", "-"])
        #expect(await p.server.waitForHeld("long"))
        runner.signal(SIGTERM)
        let finished = await runner.wait()
        #expect(finished.exitCode == 0, "\(finished.description)")
        let row = try #require(try await p.list().first)
        #expect(row.string("state") == "queued", "an attempt cut off by the grace deadline leaves the entry queued")
        // The event stream says so too: its last state event for the entry is queued.
        let states = finished.jsonLines.filter { $0.string("type") == "state" && $0.string("id") == "long" }
        #expect(states.last?.string("state") == "queued", "\(finished.stdout)")
        #expect(p.hookLog.isEmpty)
    }

    @Test func aRunningRunnerPicksUpNewEntries() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        let runner = try p.start(["run"])
        // Enqueue only once the runner holds the store, so the entry arrives while it runs.
        await eventually("the runner to hold the store") { p.exists(".outbox/runner.lock") }
        try await p.enqueue("t", path: "/status/200", id: "late")
        await eventually("the runner to notice the entry") { p.deliveries("late").count == 1 }
        runner.signal(SIGTERM)
        let finished = await runner.wait()
        #expect(finished.exitCode == 0, "\(finished.description)")
        #expect(p.server.requests.count == 1)
    }

    @Test func eventsCarryTheSpecFields() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        let long = String(repeating: "x", count: 10_000)
        p.server.script("/ev", [.status(503, body: "busy"), .status(200, body: long)])
        try await p.enqueue("t", path: "/ev?token=secret", id: "ev")
        let before = nowMs()
        let run = try await p.drain(["--events", "-"])
        let after = nowMs()
        let events = run.jsonLines
        #expect(events.count == run.stdout.split(separator: "\n").count, "every stdout line is JSON")
        #expect(Set(events.compactMap { $0.string("type") }) == ["state", "attempt", "progress"])

        let attempts = events.filter { $0.string("type") == "attempt" }
        #expect(attempts.count == 2)
        let attemptKeys = [
            "type", "id", "key", "request_id", "attempt", "url", "method", "part_index", "outcome", "http_code",
            "body", "error_kind", "error_message", "at",
        ]
        for a in attempts {
            #expect(Set(attemptKeys).isSubset(of: Set(a.keys)), "attempt fields: \(a.keys)")
            #expect(a.string("id") == "ev")
            #expect(a.string("key") == "t")
            #expect(a.string("method") == "POST")
            #expect(a.at("part_index") == .null)
            #expect(a.string("url") == p.url("/ev") + "?[redacted]", "query strings are not printed")
            #expect(a.int("at").map { (before...after).contains($0) } == true, "at: \(a)")
        }
        #expect(attempts.map { $0.int("attempt") ?? 0 } == [1, 2])
        #expect(attempts.map { $0.string("outcome") ?? "" } == ["retry", "success"])
        #expect(attempts.map { $0.int("http_code") ?? 0 } == [503, 200])
        #expect(attempts.first?.string("body") == "busy")
        #expect(attempts.last?.string("body")?.utf8.count == 4096, "the response body is capped at 4 KiB")
        let requestIDs = p.server.requests(path: "/ev").compactMap { $0.header("X-Request-Id") }
        #expect(attempts.map { $0.string("request_id") ?? "" } == requestIDs)

        let progress = events.filter { $0.string("type") == "progress" }
        #expect(!progress.isEmpty)
        for e in progress {
            #expect(Set(e.keys) == ["type", "id", "bytes_sent", "bytes_accepted", "total_bytes"])
            #expect(e.int("total_bytes") == Int64(#"{"tag":"a"}"#.utf8.count))
        }
        #expect(progress.last?.int("bytes_sent") == progress.last?.int("total_bytes"))

        let states = events.filter { $0.string("type") == "state" }
        #expect(states.map { $0.string("state") ?? "" } == ["running", "queued", "running", "completed"])
        let rowKeys = [
            "id", "key", "vars", "state", "reason", "bytes_sent", "total_bytes", "attempts", "created_at", "updated_at",
            "next_attempt_at", "generation", "parent",
        ]
        for s in states {
            #expect(Set(rowKeys).isSubset(of: Set(s.keys)), "state fields: \(s.keys)")
            #expect(s.string("vars.tag") == "a")
        }
        let retried = try #require(states.dropFirst().first)
        #expect(retried.string("reason") == "HTTP 503")
        // The backoff (50 ms, no jitter) counts from the attempt's end, not from when the line
        // was printed: a slow machine may print it after the next attempt is already due.
        let failedAt = try #require(attempts.first?.int("at"))
        #expect(retried.int("next_attempt_at").map { $0 >= failedAt + 50 } == true, "the backoff shows in the row: \(retried)")
        #expect(states.last?.at("reason") == .null)
        #expect(states.last?.at("next_attempt_at") == .null, "a settled row has no next attempt: \(states.last ?? .null)")
        #expect(states.last?.int("bytes_sent") == states.last?.int("total_bytes"))
        #expect(states.last?.int("attempts") == 2)
    }

    /// A reader of `--events -` (stdout) or of the log (stderr) that stops reading holds the
    /// runner only until it is asked to stop: the run then ends, dropping what finds no room,
    /// loses no queue work, and for events says what it lost and exits E_STORAGE. The pipe is
    /// full when the test stops the run (a fact: the test's own end of it has no room).
    @Test(arguments: [true, false])
    func aStalledReaderHoldsTheRunnerOnlyUntilAStop(events: Bool) async throws {
        // Each hook prints 80 KB to stderr; 300 entries' events are far more than a pipe holds (64 KiB).
        let hook =
            "#!/bin/sh\ncat > /dev/null\ni=0\nwhile [ $i -lt 20 ]; do head -c 4000 /dev/zero | tr '\\0' x >&2; echo >&2; i=$((i+1)); done\n"
        let p = try Project(
            definitions: ["t": definition("t", top: events ? "" : "on_success: hooks/loud.sh", hooks: false)], hooks: ["loud.sh": hook])
        let count = events ? 300 : 3
        let lines = (0..<count).map { n in
            JSON.object([("vars", .object([("url", .string(p.url("/status/200?\(n)"))), ("tag", .string("a"))]))]).serialized()
        }
        _ = try p.write("lines.jsonl", lines.joined(separator: "\n") + "\n")
        #expect(try await p.outbox(["enqueue", "t", "--from", "lines.jsonl"]).exitCode == 0)
        let fifo = p.path("out.fifo")
        #expect(mkfifo(fifo, 0o600) == 0)
        // Held open and never read: the runner's writes find the pipe full.
        let held = open(fifo, O_RDWR | O_CLOEXEC)
        #expect(held >= 0)
        defer { close(held) }
        // The live display draws on stderr too: it must not hold the run either.
        let redirect = events ? "--events - > out.fifo" : "--progress always 2> out.fifo"
        let runner = try RunningProcess(
            executable: "/bin/sh", arguments: ["-c", "exec \"$0\" run \(redirect)", p.executable], cwd: p.root,
            environment: p.processEnvironment())
        await eventually("the pipe to be full") {
            var end = pollfd(fd: held, events: Int16(POLLOUT), revents: 0)
            return poll(&end, 1, 0) == 0
        }
        runner.signal(SIGTERM)
        let run = await runner.wait()
        #expect(!run.timedOut, "\(run)")
        #expect(run.exitCode == (events ? 74 : 0), "\(run)")
        if events {
            #expect(run.stderr.contains("what it wrote to stdout was lost: its reader stopped reading"), "\(run.stderr)")
        }
        // Nothing of the queue is lost: what was not sent waits for the next run.
        #expect(try await p.outbox(["audit"]).exitCode == 0)
        try await p.drain()
        #expect(try await p.list().isEmpty)
        #expect(Set(p.server.requests.map(\.path)).count == count)
    }

    @Test func jsonSummaryWithDrain() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        p.server.script("/five-then-ok", [.status(500), .json(200, "{}")])
        try await p.enqueue("t", path: "/five-then-ok", id: "s1")
        try await p.enqueue("t", path: "/status/422", id: "s2")
        let run = try await p.drain(["--json"], failures: 1)
        #expect(run.stdout.split(separator: "\n").count == 1, "one document: \(run.stdout)")
        let doc = try #require(run.json)
        #expect(doc.int("attempts") == 3)
        #expect(doc.int("completed") == 1)
        #expect(doc.int("errors") == 1)
        #expect(doc.int("retried") == 1)
        #expect(doc.int("awaiting_auth") == 0)
        #expect(doc.int("delivered") == 2)
        #expect(doc.int("delivery_failures") == 0)
        #expect(doc.int("remaining") == 1, "the error entry stays")
        #expect(doc.int("elapsed_ms") != nil)
        #expect(doc.int("bytes_sent") != nil)
        #expect(doc.at("failed")?.serialized() == #"{"error":["s2"],"awaiting_auth":[],"hook_failures":[],"follow_up_failures":[]}"#)
        #expect(doc.int("failure_status") == 1)
    }

    /// `run --drain` tells cron and systemd what failed: 0 only when nothing did; otherwise
    /// bits for an entry that settled error (1), one left awaiting-auth (2), and a hook that
    /// failed and is still unacknowledged (4).
    @Test func aDrainsExitStatusSaysWhatFailed() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200", id: "ok")
        #expect(try await p.drain(failures: 0).exitCode == 0)

        try await p.enqueue("t", path: "/status/401", id: "parked")
        #expect(try await p.drain(failures: 2).exitCode == 2)
        // Still parked in the next run: a failure again, though nothing was sent.
        #expect(try await p.drain(failures: 2).exitCode == 2)
        _ = try await p.outbox(["cancel", "parked"])

        _ = try p.write("hooks/fail", "")
        try await p.enqueue("t", path: "/status/422", id: "refused")
        let both = try await p.drain(["--horizon", "0s", "--json"], failures: 5)
        #expect(
            both.json?.at("failed")?.serialized()
                == #"{"error":["refused"],"awaiting_auth":[],"hook_failures":["refused"],"follow_up_failures":[]}"#)
        p.remove("hooks/fail")
        // The hook works again: delivered, nothing failed in this run (the error entry stays, from before).
        #expect(try await p.drain(failures: 0).exitCode == 0)
    }

    /// A parked entry past its expiry settles expired when a runner looks at it, with its last
    /// attempt's reason: it stayed parked, each run exiting 2, until a header update.
    @Test func aParkedEntryPastItsExpirySettlesExpired() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/401", id: "parked")
        #expect(try await p.drain(failures: 2).exitCode == 2)
        _ = try p.sqlite("UPDATE entries SET expires_at = \(nowMs() - 1000) WHERE id = 'parked'")
        let run = try await p.drain(["--json"], failures: 1)
        #expect(run.json?.at("failed")?.at("error") == .array([.string("parked")]), "\(run.stdout)")
        #expect(p.server.requests.count == 1, "not sent again")
        let hook = try #require(p.deliveries("parked").last)
        #expect(hook.string("stdin.error.kind") == "expired")
        #expect(hook.string("stdin.error.message")?.hasPrefix("the entry expired after 1 attempt without success; the last: ") == true)
        #expect(try await p.row("parked")?.string("state") == "error")
    }

    @Test func jsonWithEventsIsAUsageError() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        let run = try await p.outbox(["run", "--drain", "--json", "--events", "-"])
        #expect(run.exitCode == 64, "\(run.description)")
        #expect(!p.exists(".outbox/runner.lock"), "nothing was started")
    }

    @Test func thenOnSuccessEnqueuesAFollowUpInTheSameTransaction() async throws {
        let parent = definition(
            "order",
            top: """
                then:
                  on_success:
                    - key: receipt
                      id: "receipt-{{ entry.id }}"
                      vars: { url: "{{ vars.receipt_url }}", tag: "{{ outcome.data.n }}" }
                response: json
                """)
        let p = try Project(definitions: ["order": parent, "receipt": definition("receipt")])
        p.server.script("/order", [.json(201, #"{"n":"r7"}"#)])
        let vars = JSON.object([
            ("url", .string(p.url("/order"))), ("tag", .string("o")),
            ("receipt_url", .string(p.url("/receipt"))),
        ]).serialized()
        #expect(try await p.outbox(["enqueue", "order", "--vars", vars, "--id", "o9"]).exitCode == 0)
        let run = try await p.drain(["--events", "-"])

        // The follow-up exists from the moment the parent settles: its first state row names the parent.
        let followUpStates = run.jsonLines.filter { $0.string("type") == "state" && $0.string("id") == "receipt-o9" }
        #expect(followUpStates.first?.string("parent") == "o9")
        #expect(followUpStates.map { $0.string("state") ?? "" } == ["running", "completed"])
        #expect(p.server.requests(path: "/receipt").count == 1)
        #expect(p.server.requests(path: "/receipt").first?.bodyText == #"{"tag":"r7"}"#)
        let hook = try #require(p.deliveries("receipt-o9").first)
        #expect(hook.string("stdin.meta.parent") == "o9")
        #expect(hook.string("stdin.vars.tag") == "r7")
        #expect(p.deliveries("o9").count == 1)
        #expect(try await p.list().isEmpty)
    }

    @Test func followUpIsListedWithItsParentBeforeItRuns() async throws {
        let parent = definition(
            "order",
            top: """
                then:
                  on_success:
                    - key: receipt
                      id: "receipt-{{ entry.id }}"
                      vars: { url: "{{ vars.url }}", tag: "later" }
                      delay: 1h
                """)
        let p = try Project(definitions: ["order": parent, "receipt": definition("receipt")])
        try await p.enqueue("order", path: "/status/200", id: "o1")
        try await p.drain()
        let rows = try await p.list()
        #expect(rows.count == 1)
        let row = try #require(rows.first)
        #expect(row.string("id") == "receipt-o1")
        #expect(row.string("parent") == "o1")
        #expect(row.string("state") == "queued")
        #expect(try await p.show("receipt-o1")?.at("chain") == .array([.string("o1")]))
    }

    @Test func cancelScopeCancelsTheEntriesBehindAFailedOne() async throws {
        let scoped = definition(
            "step",
            top: """
                scope: "job-{{ vars.job }}"
                on_rejected: cancel-scope
                """)
        let p = try Project(definitions: ["step": scoped])
        for (id, path) in [("s1", "/status/422"), ("s2", "/status/200"), ("s3", "/status/200")] {
            let vars = JSON.object([("url", .string(p.url(path))), ("tag", .string(id)), ("job", .string("j1"))]).serialized()
            #expect(try await p.outbox(["enqueue", "step", "--vars", vars, "--id", id]).exitCode == 0)
        }
        // Another scope is not affected.
        let other = JSON.object([("url", .string(p.url("/status/200"))), ("tag", .string("x")), ("job", .string("j2"))]).serialized()
        #expect(try await p.outbox(["enqueue", "step", "--vars", other, "--id", "x1"]).exitCode == 0)
        let run = try await p.drain(["--events", "-"])

        // Each cancelled entry has its state event, and the run counts it.
        let cancelled = run.jsonLines.filter { $0.string("type") == "state" && $0.string("state") == "cancelled" }
        #expect(cancelled.map { "\($0.string("id") ?? "") \($0.string("reason") ?? "")" } == ["s2 scope", "s3 scope"])
        #expect(run.stderr.contains("2 cancelled"), "\(run.stderr)")
        #expect(p.server.requests(path: "/status/422").count == 1)
        #expect(p.server.requests(path: "/status/200").count == 1, "only the other scope's entry is sent")
        let first = try #require(p.deliveries("s1").first)
        #expect(first.string("stdin.error.kind") == "http")
        for id in ["s2", "s3"] {
            let log = p.deliveries(id)
            #expect(log.count == 1)
            #expect(log.first?.string("env.outcome") == "error")
            #expect(log.first?.string("stdin.error.kind") == "cancelled")
            #expect(log.first?.string("stdin.id") == id)
            #expect(log.first?.string("stdin.vars.tag") == id)
        }
        #expect(p.deliveries("x1").first?.string("stdin.outcome") == "completed")
        let rows = try await p.list()
        #expect(rows.map { $0.string("id") ?? "" } == ["s1"], "cancelled entries are forgotten after acknowledgement")
        #expect(rows.first?.string("state") == "error")
    }
}
