import Foundation
import OutboxModel
import OutboxStore
import OutboxTestServer
import Testing
import TestSupport

/// Several `outbox run` processes on one PostgreSQL schema, on the throwaway cluster and the
/// in-repo HTTP server: each entry is sent and delivered once, a killed or stopped runner's
/// work is taken over once its lease runs out, and its late result changes nothing.
@Suite(.serialized)
struct PostgresRunnersTests {
    /// A project on a schema of its own whose `note` hook appends a line to `hook.log` (the
    /// entry id, or with `payload` the outcome's whole JSON).
    /// `response` is the definition's (YAML, on one line).
    static func project(lease: String, payload: Bool = false, response: String = "json", config: String = "") throws -> TestProject {
        let cluster = try PostgresCluster.shared()
        let p = try TestProject(
            config: "lease: \(lease)\n" + config,
            definitions: [
                "note": """
                key: note
                request:
                  url: "{{ env.SERVER | raw }}/notes/{{ vars.n }}"
                  data:
                    n: "{{ vars.n }}"
                response: \(response)
                on_success: hooks/log.sh
                """
            ])
        let line = payload ? #"{ cat; echo; }"# : #"echo "$OUTBOX_ID""#
        try p.writeHook("log.sh", "#!/bin/sh\n\(line) >> '\(p.path("hook.log"))'\n")
        p.environment["OUTBOX_STORE"] = cluster.url(schema: PostgresCluster.uniqueSchema("runners"))
        p.environment["SERVER"] = p.server.baseURL
        return p
    }

    static func enqueue(_ p: TestProject, _ numbers: ClosedRange<Int>) async throws {
        let lines = numbers.map { #"{"vars": {"n": \#($0)}, "id": "e-\#($0)"}"# }.joined(separator: "\n") + "\n"
        let r = try await p.outbox(["enqueue", "note", "--from", "-"], stdin: lines)
        #expect(r.exitCode == 0, "\(r)")
    }

    static func hookLines(_ p: TestProject) -> [String] {
        (p.read("hook.log") ?? "").split(separator: "\n").map(String.init)
    }

    static func storeIsEmpty(_ p: TestProject) async throws -> Bool {
        let list = try await p.outbox(["list", "--json"])
        guard list.exitCode == 0 else { return false }
        return try JSON.parse(list.stdout).arrayValue?.isEmpty == true
    }

    /// A `--from` file of several batches on PostgreSQL (whose transaction may run again
    /// after a reconnect, so its batches are gathered before it): all or nothing, in order.
    @Test func aFromFileOfSeveralBatchesIsAllOrNothing() async throws {
        let p = try Self.project(lease: "10s")
        var lines = (1...2_100).map { #"{"vars": {"n": \#($0)}, "id": "e-\#($0)"}"# }
        let good = lines.joined(separator: "\n") + "\n"
        lines[2_049] = #"{"vars": {}, "id": "e-2050"}"#
        try p.write("bad.jsonl", lines.joined(separator: "\n") + "\n")
        try p.write("good.jsonl", good)
        let refused = try await p.outbox(["enqueue", "note", "--from", "bad.jsonl"])
        #expect(refused.exitCode == 65, "\(refused)")
        #expect(refused.stderr.contains("bad.jsonl:2050: "), "\(refused)")
        #expect(try await Self.storeIsEmpty(p))
        let r = try await p.outbox(["enqueue", "note", "--from", "good.jsonl"])
        #expect(r.exitCode == 0, "\(r)")
        let list = try await p.outbox(["list", "--json"])
        let ids = try JSON.parse(list.stdout).arrayValue?.compactMap { $0["id"]?.stringValue }
        #expect(ids == (1...2_100).map { "e-\($0)" })
    }

    // Four drains on one queue of 5,000: every request reaches the server once, every hook
    // runs once, and nothing is left in the store.
    @Test func fourRunnersSendEveryEntryOnce() async throws {
        // No runner dies here: a lease far longer than any stall of a loaded machine. With
        // 10 s, a runner starved of CPU for that long had its claims put back and sent again
        // by another (5,011 requests, 5,006 deliveries, beside a load of 70 on 2 cores).
        let p = try Self.project(lease: "10m")
        let count = 5_000
        try await Self.enqueue(p, 1...count)
        let runners = try (0..<4).map { _ in try p.start(["run", "--drain"]) }
        for runner in runners {
            let result = await runner.wait(timeout: 900)
            #expect(result.exitCode == 0 && !result.timedOut, "\(result)")
        }
        let paths = p.server.requests(path: "/notes/").map(\.path)
        #expect(paths.count == count)
        #expect(Set(paths).count == count)
        let delivered = Self.hookLines(p)
        #expect(delivered.count == count)
        #expect(Set(delivered) == Set((1...count).map { "e-\($0)" }))
        #expect(try await Self.storeIsEmpty(p))
    }

    // A runner killed with requests in flight: once its lease runs out another runner sends
    // them again and each completes once in the store.
    @Test func aKilledRunnersEntriesAreTakenOverAfterItsLease() async throws {
        let p = try Self.project(lease: "2s")
        p.server.script("/notes/", [.hold("killed"), .hold("killed"), .hold("killed"), .json(200, "{}")])
        try await Self.enqueue(p, 1...3)
        let first = try p.start(["run"])
        #expect(await p.server.waitForHeld("killed", count: 3))
        // The runner renews its 2 s lease every 0.7 s; starved of CPU for longer, its lease has
        // run out for a moment (explain says so, rightly), until its next renewal.
        try await eventually("explain sees the live runner") {
            try await p.outbox(["explain", "e-1"]).stdout.contains("it is running now on runner")
        }
        first.signal(SIGKILL)
        _ = await first.wait()
        // No runner is left to put it back: explain says why it still shows running.
        try await eventually("explain sees the lease run out") {
            try await p.outbox(["explain", "e-1"]).stdout.contains("let its lease run out")
        }
        let second = try p.start(["run"])
        await eventually("the second runner completes and delivers the three entries") {
            Self.hookLines(p).count >= 3
        }
        try await eventually("the store is empty") { try await Self.storeIsEmpty(p) }
        second.signal(SIGTERM)
        #expect(await second.wait().exitCode == 0)
        #expect(Self.hookLines(p).sorted() == ["e-1", "e-2", "e-3"])
        #expect(p.server.requests(path: "/notes/").count == 6)
        // At its start (the lease already over) or at a later renewal tick.
        #expect(second.stderrSoFar.contains("back in the queue"), "\(second.stderrSoFar)")
        _ = p.server.release("killed")
    }

    // A runner whose only slot is held by a slow request gives its standby claim back after a
    // second, so an idle runner sends that entry instead of waiting behind the slow one.
    @Test func aStandbyClaimGoesBackToTheQueueForAnIdleRunner() async throws {
        // The held request is never given up as stalled, however long a loaded machine takes.
        let p = try Self.project(lease: "30s", config: "timeouts: { stall: { for: 30m } }\n")
        p.server.script("/notes/1", [.hold("slow")])
        defer { _ = p.server.release("slow") }
        try await Self.enqueue(p, 1...1)
        let busy = try p.start(["run"], environment: ["OUTBOX_CONCURRENCY": "1"])
        #expect(await p.server.waitForHeld("slow"))
        try await Self.enqueue(p, 2...2)
        // Claimed by the busy runner, as its standby: no other runner exists yet.
        try await eventually("the busy runner claims e-2 as standby", timeout: 120) {
            let rows = try JSON.parse(try await p.outbox(["list", "--json", "--id", "e-2"]).stdout)
            return rows.arrayValue?.first?["state"] == .string("running")
        }
        #expect(p.server.requests(path: "/notes/2").isEmpty)
        let idle = try p.start(["run"])
        await eventually("the idle runner sends e-2", timeout: 120) { !p.server.requests(path: "/notes/2").isEmpty }
        #expect(p.server.heldCount("slow") == 1, "while the busy runner's slot is still held")
        await eventually("e-2 is delivered") { Self.hookLines(p) == ["e-2"] }
        _ = p.server.release("slow")
        await eventually("e-1 is delivered") { Self.hookLines(p).count == 2 }
        for runner in [busy, idle] { runner.signal(SIGTERM) }
        #expect(await busy.wait().exitCode == 0)
        #expect(await idle.wait().exitCode == 0)
        #expect(p.server.requests(path: "/notes/").count == 2, "each sent once")
    }

    // A runner killed while its hook runs: a runner that was already running takes the
    // delivery over once its lease is out, and stops the orphaned hook first, so two
    // deliveries of one outcome never overlap.
    @Test func aLiveRunnerStopsAKilledRunnersHookBeforeDeliveringAgain() async throws {
        let p = try Self.project(lease: "2s")
        let log = p.path("hook.log")
        try p.writeHook(
            "log.sh",
            "#!/bin/sh\necho \"start $OUTBOX_DELIVERIES $$\" >> '\(log)'\n"
                + "while [ ! -e '\(p.path("release"))' ]; do sleep 0.05; done\necho \"end $OUTBOX_DELIVERIES\" >> '\(log)'\n")
        try await Self.enqueue(p, 1...1)
        let first = try p.start(["run"])
        await eventually("the first delivery started") { Self.hookLines(p).first?.hasPrefix("start 1 ") == true }
        // Observed while it surely runs: once gone, its pid may be another process's.
        let hookPID = Self.hookLines(p).first.flatMap { $0.split(separator: " ").last }.flatMap { Int32($0) } ?? 0
        let orphan = try #require(ObservedProcess(hookPID), "the first hook \(hookPID) runs")
        // Killed once it has recorded its hook's group (it records a turn's groups just after starting them).
        await eventually("the first runner recorded its hook's group") {
            let store = try? PostgresStore(url: PostgresURL(p.environment["OUTBOX_STORE"] ?? ""), folder: p.path(".outbox"))
            return (try? store?.unacknowledgedOutcomes().first?.hookPgid) != nil
        }
        let second = try p.start(["run"])
        first.signal(SIGKILL)
        _ = await first.wait()
        await eventually("the second runner delivers again") { Self.hookLines(p).contains { $0.hasPrefix("start 2 ") } }
        // The first hook is gone (or a zombie) by the time the second starts.
        #expect(orphan.hasEnded, "the orphaned hook \(orphan.pid) still runs")
        _ = try p.write("release", "")
        await eventually("the second delivery ends") { Self.hookLines(p).contains("end 2") }
        try await eventually("the outcome is acknowledged") { try await Self.storeIsEmpty(p) }
        second.signal(SIGTERM)
        #expect(await second.wait().exitCode == 0)
        #expect(!Self.hookLines(p).contains("end 1"), "\(Self.hookLines(p))")
    }

    // A runner stopped past its lease while its request is held: another takes the entry and
    // completes it; resumed and answered, the first records nothing (one outcome, the second's).
    @Test func aStoppedRunnersLateResultIsRefused() async throws {
        let p = try Self.project(lease: "2s", payload: true)
        p.server.script("/notes/", [.hold("stopped"), .json(200, #"{"by": "second"}"#)])
        try await Self.enqueue(p, 1...1)
        let first = try p.start(["run", "--json"])
        #expect(await p.server.waitForHeld("stopped"))
        first.signal(SIGSTOP)
        let second = try p.start(["run"])
        await eventually("the second runner completes and delivers the entry") { !Self.hookLines(p).isEmpty }
        try await eventually("the store is empty") { try await Self.storeIsEmpty(p) }
        second.signal(SIGTERM)
        #expect(await second.wait().exitCode == 0)

        first.signal(SIGCONT)
        _ = p.server.release("stopped")
        await eventually("the first runner notices it lost its lease") { first.stderrSoFar.contains("lost the lease on e-1") }
        first.signal(SIGTERM)
        let late = await first.wait()
        #expect(late.exitCode == 0, "\(late)")
        // Nobody cancelled it: the first runner's summary says none was.
        #expect(late.json?["cancelled"]?.int64Value == 0, "\(late.stdout)")
        let outcomes = Self.hookLines(p)
        #expect(outcomes.count == 1)
        let outcome = try JSON.parse(outcomes.first ?? "")
        #expect(outcome["id"] == .string("e-1"))
        #expect(outcome["data"]?["by"] == .string("second"))
        let requests = p.server.requests(path: "/notes/1")
        #expect(requests.count == 2)
        #expect(try await Self.storeIsEmpty(p))
    }

    // A cancel while the runner holds the entry (its lease good) is reported as a cancel,
    // once, and is not mistaken in the log for a lease another runner took.
    @Test func aCancelWhileARequestIsInFlightIsReportedAsACancel() async throws {
        let p = try Self.project(lease: "3s")
        p.server.script("/notes/", [.hold("held")])
        try await Self.enqueue(p, 1...1)
        let runner = try p.start(["run", "--json"])
        #expect(await p.server.waitForHeld("held"))
        #expect(try await p.outbox(["cancel", "e-1"]).exitCode == 0)
        // The runner has seen the cancel once the server records the transfer it stopped.
        await eventually("the runner stops the cancelled transfer") { p.server.requests(path: "/notes/1").count == 1 }
        _ = p.server.release("held")
        runner.signal(SIGTERM)
        let finished = await runner.wait()
        #expect(finished.exitCode == 0, "\(finished)")
        #expect(finished.json?["cancelled"]?.int64Value == 1, "\(finished.stdout)")
        #expect(!finished.stderr.contains("lost the lease"), "\(finished.stderr)")
    }

    // A response parser that runs for three leases blocks the runner's turn, not its
    // leases: the second runner, checking for expired leases all along, takes nothing, and
    // the entry is sent once.
    @Test func aSlowResponseParserKeepsItsRunnersLeases() async throws {
        let lease = 3.0
        let p = try Self.project(lease: "\(Int(lease))s", response: "{ command: hooks/parse.sh }")
        try p.writeHook(
            "parse.sh",
            "#!/bin/sh\ntouch '\(p.path("parser.started"))'\nwhile [ ! -e '\(p.path("parser.release"))' ]; do sleep 0.05; done\necho '{}'\n"
        )
        try await Self.enqueue(p, 1...1)
        let first = try p.start(["run"])
        await eventually("the response parser starts") { FileManager.default.fileExists(atPath: p.path("parser.started")) }
        let parserStarted = Date()
        let second = try p.start(["run"])
        await eventually("three leases pass while the parser runs", timeout: 120) {
            Date().timeIntervalSince(parserStarted) >= 3 * lease
        }
        _ = try p.write("parser.release", "")
        await eventually("the entry is delivered") { !Self.hookLines(p).isEmpty }
        for runner in [first, second] { runner.signal(SIGTERM) }
        #expect(await first.wait().exitCode == 0)
        #expect(await second.wait().exitCode == 0)
        #expect(p.server.requests(path: "/notes/1").count == 1)
        #expect(Self.hookLines(p) == ["e-1"])
        #expect(!first.stderrSoFar.contains("lost the lease"), "\(first.stderrSoFar)")
        #expect(!second.stderrSoFar.contains("back in the queue"), "\(second.stderrSoFar)")
    }

    // An idle runner starts an entry another process enqueues while it waits.
    @Test func anIdleRunnerStartsANewEntry() async throws {
        let p = try Self.project(lease: "30s")
        let runner = try p.start(["run"])
        try await Self.enqueue(p, 1...1)
        await eventually("the first entry is sent") { p.server.requests(path: "/notes/1").count == 1 }
        try await Self.enqueue(p, 2...2)
        await eventually("the entry enqueued while the runner waited is sent") { p.server.requests(path: "/notes/2").count == 1 }
        await eventually("both are delivered") { Self.hookLines(p).count == 2 }
        runner.signal(SIGTERM)
        #expect(await runner.wait().exitCode == 0)
        // Sorted: e-1's hook may still be starting when e-2 is sent and delivered.
        #expect(Self.hookLines(p).sorted() == ["e-1", "e-2"])
    }

    // A runner that read an outcome as due while another runner claimed it and started its
    // hook leaves that hook running: it is the other runner's, alive. It was SIGKILLed as a
    // hook left by a runner that died before recording it.
    @Test func aHookAnotherRunnerJustStartedIsLeftRunning() async throws {
        let p = try Self.project(lease: "30s")
        // The first delivery fails, keeping the outcome's token.
        try p.writeHook("log.sh", "#!/bin/sh\necho \"$OUTBOX_HOOK_TOKEN\" > '\(p.path("token"))'\nexit 1\n")
        try await Self.enqueue(p, 1...1)
        let first = try await p.outbox(["run", "--drain"])
        #expect(first.exitCode == 4, "\(first)")
        let token = try #require(p.read("token")?.trimmingCharacters(in: .whitespacesAndNewlines))
        // Runner B reads the outcome as due again and waits there.
        let go = p.path("go")
        let b = try p.start(["run"], environment: ["OUTBOX_FAULT_HOLD": "deliver.chosen:\(go)"])
        await eventually("runner B chose the outcome") { FileManager.default.fileExists(atPath: go + ".reached") }
        // Runner A (this test) claims the delivery and starts its hook, a process group of its own.
        let url = try #require(p.environment["OUTBOX_STORE"])
        let store = try PostgresStore(url: try PostgresURL(url), folder: p.path(".outbox"))
        let outcome = try #require(try store.unacknowledgedOutcomes().first)
        #expect(try store.claimDeliveries(seqs: [outcome.seq], lease: Lease(owner: "runner-a", durationMs: 60_000)).count == 1)
        let hook = try RunningProcess(
            executable: "/bin/sleep", arguments: ["600"], cwd: p.root, environment: [HookEnvironment.tokenName: token])
        defer { hook.signal(SIGKILL) }
        _ = FileManager.default.createFile(atPath: go, contents: nil)
        b.signal(SIGTERM)
        let ended = await b.wait()
        #expect(ended.exitCode == 0, "\(ended)")
        #expect(!ended.stderr.contains("stopped hook process group"), "\(ended.stderr)")
        #expect(hook.isRunning, "runner A's hook was stopped")
    }
}
