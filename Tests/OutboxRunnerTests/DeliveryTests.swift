import Foundation
import Glibc
import OutboxModel
import TestSupport
import Testing

/// Hook delivery: journal before deliver, acknowledge on exit 0, redeliver after failures and crashes.
@Suite struct DeliveryTests {
    /// A completed entry enqueued again with another body waits for its old outcome's
    /// delivery: `list` says so in NEXT rather than "now", as `explain` does.
    @Test func anEntryWaitingForItsPreviousOutcomeShowsItInList() async throws {
        let failing = definition("w", top: "on_success: hooks/fail.sh", hooks: false)
        let p = try Project(definitions: ["w": failing], hooks: ["fail.sh": "#!/bin/sh\ncat > /dev/null\nexit 3\n"])
        try await p.enqueue("w", path: "/status/200", id: "w1")
        try await p.drain(["--horizon", "0s"], failures: 4)
        try await p.enqueue("w", path: "/status/200", id: "w1", tag: "other body")
        let table = try await p.outbox(["list"]).stdout
        let row = try #require(table.split(separator: "\n").first { $0.hasPrefix("w1 ") })
        #expect(row.contains("queued") && row.contains("after delivery"), "\(table)")
        let explain = try await p.outbox(["explain", "w1"]).stdout
        #expect(explain.contains("it waits until the outcome of its previous generation is acknowledged"), "\(explain)")
    }

    @Test func failingHookIsRedeliveredWithGrowingDeliveriesUntilItSucceeds() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        p.touch("hooks/fail")
        try await p.enqueue("t", path: "/status/200", id: "d1")
        // A failing delivery is due again within the horizon: drain would not return.
        try await p.runUntil { _ in p.deliveries("d1").count >= 3 }
        let failed = p.deliveries("d1")
        try #require(failed.count >= 3, "redelivered within the run: \(failed)")
        #expect(failed.map { $0.int("env.deliveries") ?? 0 } == (1...Int64(failed.count)).map { $0 })
        #expect(failed.map { $0.int("stdin.meta.deliveries") ?? 0 } == (1...Int64(failed.count)).map { $0 })
        #expect(failed.allSatisfy { $0.string("stdin.outcome") == "completed" })
        let show = try #require(try await p.show("d1"))
        #expect(show.string("state") == "completed")
        #expect(show.at("outcomes.0.acknowledged") == .bool(false))
        #expect(show.int("outcomes.0.deliveries") == Int64(failed.count))

        p.remove("hooks/fail")
        try await p.drain()
        let all = p.deliveries("d1")
        #expect(all.count == failed.count + 1)
        #expect(all.last?.int("env.deliveries") == Int64(failed.count) + 1)
        #expect(try await p.list().isEmpty, "acknowledged: the completed entry is forgotten")
        #expect(p.server.requests.count == 1)
    }

    @Test func killedHookIsRedelivered() async throws {
        let hook = #"""
            #!/bin/sh
            cat > /dev/null
            echo "$OUTBOX_DELIVERIES" >> hooks/killed.log
            if [ "$OUTBOX_DELIVERIES" = 1 ]; then kill -9 $$; fi
            exit 0

            """#
        let p = try Project(
            definitions: ["t": definition("t", top: "on_success: hooks/kill.sh", hooks: false)],
            hooks: ["kill.sh": hook])
        try await p.enqueue("t", path: "/status/200", id: "k1")
        // The redelivery is due 50 ms after the kill, which a busy machine may reach past the
        // default 10 s horizon (counted from the drain's start): this run must make it.
        let run = try await p.drain(["--horizon", "1h"])
        let log = try String(contentsOfFile: p.root + "/hooks/killed.log", encoding: .utf8)
        #expect(log == "1\n2\n")
        // sh -c reports its killed script as exit 137; either way the delivery failed.
        #expect(run.stderr.contains("for k1 (delivery 1)"), "\(run.stderr)")
        #expect(try await p.list().isEmpty)
    }

    /// A project whose hook logs each delivery's number and, the first time, writes its pid
    /// and runs `firstTime` (a wait the test ends); `id` is enqueued when given.
    static func projectWithSlowHook(_ firstTime: String, id: String?, function: String = #function) async throws -> Project {
        let hook = """
            #!/bin/sh
            payload=$(cat)
            printf '%s\\n' "$OUTBOX_DELIVERIES" >> hooks/deliveries.log
            if [ "$OUTBOX_DELIVERIES" = 1 ]; then
              echo $$ > hooks/hook.pid.new && mv hooks/hook.pid.new hooks/hook.pid
              \(firstTime)
            fi
            exit 0

            """
        let p = try Project(
            definitions: ["t": definition("t", top: "on_success: hooks/slow.sh", hooks: false)], hooks: ["slow.sh": hook],
            function: function)
        if let id { try await p.enqueue("t", path: "/status/200", id: id) }
        return p
    }

    /// The slow hook ran twice (the second delivery after a stop), and the request went once.
    static func expectRedeliveredOnce(_ p: Project, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let deliveries = try String(contentsOfFile: p.root + "/hooks/deliveries.log", encoding: .utf8)
        #expect(deliveries == "1\n2\n", sourceLocation: sourceLocation)
        #expect(p.server.requests.count == 1, "the outcome is redelivered, the request is not sent again", sourceLocation: sourceLocation)
        #expect(try await p.list().isEmpty, sourceLocation: sourceLocation)
    }

    /// The pid the slow hook's first delivery wrote.
    static func hookPID(_ p: Project) throws -> Int32 {
        try #require(
            Int32(try String(contentsOfFile: p.root + "/hooks/hook.pid", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)))
    }

    /// A runner that inherits more unacknowledged hooks than it has hook slots stops the earlier
    /// runner's groups, never its own: it killed its own live hook each time an inherited
    /// outcome took a freed slot (the stale groups were looked for among all recorded ones).
    @Test func aRunnerNeverStopsItsOwnHookWhenAnInheritedOutcomeGoesAgain() async throws {
        // Each hook says when it starts and ends, and waits for its go file.
        let hook = """
            #!/bin/sh
            cat > /dev/null
            echo "start $OUTBOX_ID $OUTBOX_DELIVERIES" >> hooks/runs.txt
            while [ ! -e "hooks/go-$OUTBOX_ID-$OUTBOX_DELIVERIES" ]; do sleep 0.02; done
            echo "end $OUTBOX_ID $OUTBOX_DELIVERIES" >> hooks/runs.txt

            """
        let ids = ["o1", "o2", "o3", "o4"]
        let p = try Project(
            config: fastConfig + "hooks: { concurrency: 4 }\n",
            definitions: ["t": definition("t", top: "on_success: hooks/wait.sh", hooks: false)], hooks: ["wait.sh": hook])
        for id in ids { try await p.enqueue("t", path: "/status/200?\(id)", id: id) }
        func runs() -> [String] { (p.read("hooks/runs.txt") ?? "").split(separator: "\n").map(String.init) }
        let first = try p.start(["run"])
        await eventually("the first runner's four hooks to start") { runs().count == 4 }
        await eventually("their groups to be recorded") {
            (try? p.sqlite("SELECT COUNT(*) FROM outcomes WHERE hook_pgid IS NOT NULL"))?.hasPrefix("4") == true
        }
        first.signal(SIGKILL)
        _ = await first.wait()

        try p.writeConfig(fastConfig + "hooks: { concurrency: 2 }\n")
        let second = try p.start(["run"])
        await eventually("two hooks of the second runner to start") { runs().filter { $0.hasSuffix(" 2") }.count == 2 }
        let started = runs().filter { $0.hasSuffix(" 2") }.map { String($0.split(separator: " ")[1]) }
        // One ends: an inherited outcome takes its slot while the other still runs.
        p.touch("hooks/go-\(started[0])-2")
        await eventually("a third delivery of the second runner to start") { runs().filter { $0.hasSuffix(" 2") }.count == 4 }
        for id in ids { p.touch("hooks/go-\(id)-2") }
        await eventually("every outcome to be acknowledged") {
            (try? p.sqlite("SELECT COUNT(*) FROM outcomes WHERE acknowledged = 0"))?.hasPrefix("0") == true
        }
        second.signal(SIGTERM)
        let ended = await second.wait()
        #expect(ended.exitCode == 0, "\(ended)")
        #expect(!ended.stderr.contains("killed by signal"), "\(ended.stderr)")
        // Every hook the second runner started ran to its end, once each.
        #expect(Set(runs().filter { $0.hasPrefix("end ") }) == Set(ids.map { "end \($0) 2" }), "\(runs())")
        #expect(!runs().contains { $0.hasSuffix(" 3") }, "no delivery went a third time: \(runs())")
    }

    @Test func runnerKilledBetweenJournalAndAcknowledgementRedeliversWithoutResending() async throws {
        // The first delivery writes its pid and hangs (until the next runner stops its group,
        // ten minutes at most); later ones record and succeed.
        let p = try await Self.projectWithSlowHook("sleep 600", id: "crash")
        let runner = try p.start(["run"])
        await eventually("the hook to start") { p.exists("hooks/hook.pid") }
        let hookPID = try Self.hookPID(p)
        let hookProcess = try #require(ObservedProcess(hookPID))
        // The hook is the `sh -c` leader's child, in its group.
        let hookGroup = getpgid(hookPID)
        #expect(hookGroup > 1 && hookGroup != getpgrp())
        // Killed once the runner has recorded the hook's group in the store.
        await eventually("the runner to record the hook's group") {
            (try? p.sqlite("SELECT hook_pgid FROM outcomes WHERE entry_id = 'crash'"))?
                .trimmingCharacters(in: .whitespacesAndNewlines) == "\(hookGroup)"
        }
        runner.signal(SIGKILL)
        let killed = await runner.wait()
        #expect(killed.exitCode == -SIGKILL)
        #expect(!hookProcess.hasEnded, "the orphaned hook still runs")
        let show = try #require(try await p.show("crash"))
        #expect(show.string("state") == "completed")
        #expect(show.at("outcomes.0.acknowledged") == .bool(false))

        let second = try await p.drain()
        #expect(second.stderr.contains("stopped hook process group \(hookGroup) "), "\(second.stderr)")
        #expect(
            second.stderr.components(separatedBy: "stopped hook process group").count == 2, "stopped and reported once: \(second.stderr)")
        await eventually("the stale hook group to be stopped") { hookProcess.hasEnded }
        try await Self.expectRedeliveredOnce(p)
    }

    // Killed between starting the hook and recording its group: no row names the group, and
    // the next runner finds the hook by its token and stops it before delivering again.
    @Test func runnerKilledBeforeRecordingItsHookLeavesNoHookBesideTheNextDelivery() async throws {
        let p = try await Self.projectWithSlowHook("sleep 600", id: "crash")
        let killed = try await p.outbox(["run"], environment: ["OUTBOX_FAULT": "hook.started"])
        #expect(killed.exitCode == -SIGKILL, "\(killed)")
        await eventually("the hook to start") { p.exists("hooks/hook.pid") }
        let hookPID = try Self.hookPID(p)
        let hookProcess = try #require(ObservedProcess(hookPID))
        let hookGroup = getpgid(hookPID)
        #expect(!hookProcess.hasEnded, "the orphaned hook runs")
        #expect(try p.sqlite("SELECT COALESCE(hook_pgid, 'none') FROM outcomes WHERE entry_id = 'crash'").contains("none"))

        let second = try await p.drain()
        #expect(
            second.stderr.contains("stopped hook process group \(hookGroup) left by a runner that stopped before recording it"),
            "\(second.stderr)")
        await eventually("the unrecorded hook to be stopped") { hookProcess.hasEnded }
        try await Self.expectRedeliveredOnce(p)
    }

    // A hook that exited 0 leaving a child in its group, its runner killed before the
    // acknowledgement: the next runner stops the child before delivering the outcome again
    // (two deliveries must not overlap), though the group's leader is gone.
    @Test func aChildLeftByAnUnacknowledgedHookIsStoppedBeforeTheNextDelivery() async throws {
        let p = try await Self.projectWithSlowHook(
            "sleep 600 </dev/null >/dev/null 2>&1 &\n  " + ObservedProcess.recordLastBackground(to: "hooks/child"), id: "left")
        let killed = try await p.outbox(["run"], environment: ["OUTBOX_FAULT": "hook.before-ack"])
        #expect(killed.exitCode == -SIGKILL, "\(killed)")
        let child = try #require(ObservedProcess(recorded: p.read("hooks/child") ?? ""))
        #expect(!child.hasEnded, "the hook's child runs on")
        let group = getpgid(child.pid)
        let recorded = try p.sqlite("SELECT hook_pgid FROM outcomes WHERE entry_id = 'left'")
        #expect(recorded.trimmingCharacters(in: .whitespacesAndNewlines) == "\(group)", "\(recorded)")

        let second = try await p.drain()
        #expect(second.stderr.contains("stopped hook process group \(group) "), "\(second.stderr)")
        await eventually("the child to be stopped") { child.hasEnded }
        try await Self.expectRedeliveredOnce(p)
    }

    // A copy of a store (a backup restored beside it) records the live original's hook
    // groups: the copy's runner leaves them alone, as they are not hooks of its store.
    @Test func aCopiedStoresRunnerLeavesTheOriginalsHookRunning() async throws {
        let original = try await Self.projectWithSlowHook("while [ ! -e hooks/release ]; do sleep 0.05; done", id: "held")
        let runner = try original.start(["run"])
        await eventually("the hook to start") { original.exists("hooks/hook.pid") }
        let hookPID = try Self.hookPID(original)
        let hookProcess = try #require(ObservedProcess(hookPID))
        await eventually("the runner to record the hook's group") {
            (try? original.sqlite("SELECT hook_pgid FROM outcomes WHERE entry_id = 'held'"))?
                .trimmingCharacters(in: .whitespacesAndNewlines) == "\(getpgid(hookPID))"
        }
        let copy = try await Self.projectWithSlowHook("true", id: nil)
        try FileManager.default.createDirectory(atPath: copy.storeFolder, withIntermediateDirectories: true)
        _ = try original.sqlite(".backup '\(copy.storeFolder)/outbox.db'")
        let copied = try await copy.drain()
        #expect(!copied.stderr.contains("stopped hook process group"), "\(copied.stderr)")
        #expect(!hookProcess.hasEnded, "the original's hook was stopped by the copy's runner")
        _ = try original.write("hooks/release", "")
        await eventually("the original's hook to end") { hookProcess.hasEnded }
        runner.signal(SIGTERM)
        let finished = await runner.wait()
        #expect(finished.exitCode == 0, "\(finished)")
        #expect(!finished.stderr.contains("killed by signal"), "\(finished.stderr)")
    }

    /// A running entry shows no reason (as its `running` event), not its last failure's: its
    /// second attempt is held at the server while `list` and `show` look.
    @Test func aRunningEntryShowsNoReasonOfItsLastFailure() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        p.server.script("/again", [.status(503), .hold("second"), .json(200, "{}")])
        try await p.enqueue("t", path: "/again", id: "r")
        let runner = try p.start(["run", "--drain"])
        #expect(await p.server.waitForHeld("second"))
        try await eventually("the second claim to be committed") {
            try await p.list().first.map { $0.string("state") == "running" && $0.int("attempts") == 1 } == true
        }
        #expect(try await p.list().first?.at("reason") == .null)
        #expect(try await p.show("r")?.at("reason") == .null)
        let text = try await p.outbox(["list"])
        #expect(!text.stdout.contains("503"), "\(text.stdout)")
        p.server.release("second")
        #expect(await runner.wait().exitCode == 0)
        #expect(p.deliveries("r").first?.string("stdin.outcome") == "completed")
    }

    /// A store on a full disk: the run sends nothing (each cron run sent the same first
    /// requests again, their answers never recorded), and says why; with room, it sends.
    @Test func aRunOnAFullDiskSendsNothing() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        for n in 0..<3 { try await p.enqueue("t", path: "/status/200?\(n)", id: "d\(n)") }
        for _ in 0..<2 {
            let full = try await p.outbox(["run", "--drain"], environment: ["OUTBOX_TEST_FREE_BYTES": "4096"])
            #expect(full.exitCode == 74, "\(full)")
            #expect(full.stderr.contains("the disk of the store has 4 KiB free, less than the 64 KiB a run needs"), "\(full.stderr)")
        }
        #expect(p.server.requests.isEmpty)
        #expect(try await p.states() == ["d0": "queued", "d1": "queued", "d2": "queued"])
        try await p.drain(failures: 0)
        #expect(p.server.requests.count == 3)
    }

    @Test func runnerKilledMidRequestLeavesTheEntryForTheNextRunner() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        // The first request is never answered: the runner is killed while it is in flight.
        p.server.script("/hang-once", [.hold("never"), .json(200, "{}")])
        try await p.enqueue("t", path: "/hang-once", id: "mid")
        let runner = try p.start(["run"])
        #expect(await p.server.waitForHeld("never"))
        // The claim is committed at the end of its turn, which may come after the request left.
        try await eventually("the claim to be committed") { try await p.list().first?.string("state") == "running" }
        runner.signal(SIGKILL)
        _ = await runner.wait()
        #expect(try await p.list().first?.string("state") == "running")

        let next = try await p.drain()
        #expect(next.stderr.contains("back in the queue"), "\(next.stderr)")
        #expect(p.server.requests(path: "/hang-once").count == 2)
        let hook = try #require(p.deliveries("mid").first)
        #expect(hook.string("stdin.outcome") == "completed")
        #expect(Set(p.server.requests(path: "/hang-once").compactMap { $0.header("Idempotency-Key") }).count == 1)
    }

    @Test func unhandledKeyWaitsForItsDefinition() async throws {
        let p = try Project(definitions: ["gone": definition("gone"), "next": definition("next")])
        try await p.enqueue("gone", path: "/status/200", id: "u1")
        let saved = try String(contentsOfFile: p.root + "/definitions/gone.yaml", encoding: .utf8)
        p.remove("definitions/gone.yaml")

        // Not deliverable: drain returns although the outcome is unacknowledged.
        try await p.drain()
        #expect(p.server.requests.count == 1, "the entry's request was fixed at enqueue and is sent")
        #expect(p.hookLog.isEmpty)
        let show = try #require(try await p.show("u1"))
        #expect(show.string("state") == "completed")
        #expect(show.at("outcomes.0.acknowledged") == .bool(false))
        #expect(show.string("outcomes.0.reason") == "unhandled-key")
        // `list` and `show` give it as the entry's reason too, in both forms.
        #expect(try await p.list().first?.string("reason") == "unhandled-key")
        #expect(show.string("reason") == "unhandled-key")
        #expect(try await p.outbox(["list"]).stdout.contains("completed (unhandled-key)"))
        try await p.drain()
        #expect(try await p.show("u1")?.string("outcomes.0.reason") == "unhandled-key")

        // Its then lists were not known when it settled; `show` says they wait for its delivery.
        let waiting = try await p.show("u1")?.at("outcomes.0.follow_up_errors.0.message")?.stringValue ?? ""
        #expect(waiting.contains("no definition of gone was loaded when the entry settled"), "\(waiting)")
        // Back, with a chain: it comes from the definition loaded at delivery, as the hook does,
        // and is applied with the acknowledgement; the hook is told of no error.
        let chain =
            "then:\n  on_success:\n    - key: next\n      id: \"after-{{ entry.id }}\"\n      vars: { url: \"\(p.url("/status/201"))\", tag: t }\n"
        try (saved + chain).write(toFile: p.root + "/definitions/gone.yaml", atomically: true, encoding: .utf8)
        try await p.drain()
        let delivered = p.deliveries("u1")
        #expect(delivered.count == 1)
        #expect(delivered.first?.string("stdin.outcome") == "completed")
        #expect(delivered.first?.at("stdin.follow_up_errors") == nil, "\(p.hookLog)")
        #expect(p.server.requests(path: "/status/201").count == 1, "the follow-up was sent")
        #expect(p.deliveries("after-u1").first?.string("stdin.outcome") == "completed")
        #expect(try await p.list().isEmpty)
        #expect(p.server.requests.count == 2)
    }

    /// An outcome journaled while its definition was missing, delivered by a definition with
    /// no hook for it: its `then` follow-ups are enqueued with the acknowledgement.
    @Test func thenOfAnOutcomeWithoutAHookIsBuiltAtDelivery() async throws {
        let p = try Project(definitions: ["gone": definition("gone", hooks: false), "next": definition("next", hooks: false)])
        try await p.enqueue("gone", path: "/status/200", id: "u2")
        let saved = try String(contentsOfFile: p.root + "/definitions/gone.yaml", encoding: .utf8)
        p.remove("definitions/gone.yaml")
        try await p.drain()
        #expect(try await p.show("u2")?.string("outcomes.0.reason") == "unhandled-key")
        let chain =
            "then:\n  on_success:\n    - key: next\n      id: \"after-{{ entry.id }}\"\n      vars: { url: \"\(p.url("/status/202"))\", tag: t }\n"
        try (saved + chain).write(toFile: p.root + "/definitions/gone.yaml", atomically: true, encoding: .utf8)
        try await p.drain()
        #expect(p.server.requests(path: "/status/202").count == 1, "the follow-up was sent")
        #expect(try await p.list().isEmpty)
    }

    @Test func outcomesOfOneIdAreDeliveredInOrder() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        p.server.script("/twice", [.status(422, body: "nope"), .json(200, "{}")])
        p.touch("hooks/fail")
        try await p.enqueue("t", path: "/twice", id: "o1")
        try await p.runUntil { _ in p.deliveries("o1").count >= 1 }
        // The error entry reopens with the same body and completes while its error outcome is still owed.
        try await p.enqueue("t", path: "/twice", id: "o1")
        let before = p.deliveries("o1").count
        // Redeliveries keep coming every 200 ms at most: wait for a few after the second request.
        try await p.runUntil { _ in
            p.server.requests(path: "/twice").count == 2 && p.deliveries("o1").count >= before + 3
        }
        #expect(p.server.requests(path: "/twice").count == 2)
        let whileFailing = p.deliveries("o1")
        #expect(!whileFailing.isEmpty)
        #expect(whileFailing.allSatisfy { $0.string("stdin.outcome") == "error" }, "the later outcome waits for the earlier one")
        let show = try #require(try await p.show("o1"))
        #expect(show.at("outcomes")?.arrayValue?.map { $0.string("outcome") ?? "" } == ["error", "completed"])

        p.remove("hooks/fail")
        try await p.drain()
        let delivered = p.deliveries("o1").dropFirst(whileFailing.count)
        #expect(delivered.map { $0.string("stdin.outcome") ?? "" } == ["error", "completed"])
        #expect(delivered.last?.int("env.deliveries") == 1)
        #expect(try await p.list().isEmpty, "both outcomes acknowledged: the completed entry is forgotten")
    }

    /// 24 held outcomes start in one turn, on several spawning threads: each hook's exit
    /// status settles its own outcome (odd ids fail their first delivery, even ids never).
    @Test func hooksStartedTogetherEachSettleTheirOwnOutcome() async throws {
        let hook = #"""
            #!/bin/sh
            cat > /dev/null
            echo "$OUTBOX_ID $OUTBOX_DELIVERIES" >> hooks/turn.log
            case "$OUTBOX_ID" in *[13579]) [ "$OUTBOX_DELIVERIES" = 1 ] && exit 1;; esac
            exit 0

            """#
        let p = try Project(
            definitions: ["t": definition("t", top: "on_success: hooks/turn.sh", hooks: false)], hooks: ["turn.sh": hook])
        let ids = (0..<24).map { "h\($0)" }
        for id in ids { try await p.enqueue("t", path: "/status/200", id: id) }
        let saved = try String(contentsOfFile: p.root + "/definitions/t.yaml", encoding: .utf8)
        p.remove("definitions/t.yaml")
        try await p.drain()
        try saved.write(toFile: p.root + "/definitions/t.yaml", atomically: true, encoding: .utf8)

        // The odd ids' second deliveries are due after their first ones failed, which 24 hooks
        // on a busy machine may reach past the default 10 s horizon: this run must make them.
        try await p.drain(["--horizon", "1h"])
        let log = try String(contentsOfFile: p.root + "/hooks/turn.log", encoding: .utf8)
        var deliveries: [String: [String]] = [:]
        for line in log.split(separator: "\n") {
            let fields = line.split(separator: " ").map(String.init)
            deliveries[fields[0], default: []].append(fields[1])
        }
        for (index, id) in ids.enumerated() {
            #expect(deliveries[id] == (index % 2 == 1 ? ["1", "2"] : ["1"]), "\(id): \(deliveries[id] ?? [])")
        }
        #expect(try await p.list().isEmpty, "every outcome acknowledged")
    }

    /// The store is private (0600 files), but a hook creates its files with the umask the
    /// runner was started with, as the user's other programs do.
    @Test func aHookGetsTheUmaskTheRunnerStartedWith() async throws {
        let hook = #"""
            #!/bin/sh
            cat > /dev/null
            umask > hooks/umask.txt
            : > hooks/made.txt
            exit 0

            """#
        let p = try Project(
            definitions: ["t": definition("t", top: "on_success: hooks/umask.sh", hooks: false)], hooks: ["umask.sh": hook])
        try await p.enqueue("t", path: "/status/200", id: "m1")
        // On a thread of its own: a blocking wait would hold one of the test pool's two threads.
        let run = try await offload {
            try runProcess(
                "/bin/sh", ["-c", "umask 027 && exec \"$0\" run --drain", p.executable], cwd: p.root,
                environment: p.processEnvironment())
        }
        #expect(run.exitCode == 0, "\(run.description)")
        #expect(try String(contentsOfFile: p.root + "/hooks/umask.txt", encoding: .utf8) == "0027\n")
        var made = stat()
        try #require(stat(p.root + "/hooks/made.txt", &made) == 0)
        #expect(made.st_mode & 0o777 == 0o640)
        var database = stat()
        try #require(stat(p.root + "/.outbox/outbox.db", &database) == 0)
        #expect(database.st_mode & 0o777 == 0o600, "the store stays private")
    }

    /// The runner raises its soft open-files limit to the hard one (a socket for each
    /// connection, a file for each body), and its hooks get the limit it was started with.
    @Test func aHookGetsTheOpenFilesLimitTheRunnerStartedWith() async throws {
        let hook = "#!/bin/sh\ncat > /dev/null\nulimit -Sn >> hooks/limits.txt\n"
        // Small numbers: the machine's hard limit holds them (it is over 150 anywhere).
        let p = try Project(
            config: fastConfig + "concurrency: 4\nhooks: { concurrency: 4 }\n",
            definitions: ["t": definition("t", top: "on_success: hooks/limit.sh", hooks: false)], hooks: ["limit.sh": hook])
        for n in 0..<5 { try await p.enqueue("t", path: "/status/200?\(n)", id: "l\(n)") }
        let run = try await offload {
            try runProcess(
                "/bin/sh", ["-c", "ulimit -Sn 100 && exec \"$0\" run --drain", p.executable], cwd: p.root,
                environment: p.processEnvironment())
        }
        #expect(run.exitCode == 0, "\(run.description)")
        #expect(!run.stderr.contains("open-files limit"), "raised to the hard limit, it leaves room: \(run.stderr)")
        #expect(try String(contentsOfFile: p.root + "/hooks/limits.txt", encoding: .utf8) == String(repeating: "100\n", count: 5))
    }

    /// A hard open-files limit too low for `concurrency` and `hooks.concurrency` lowers both,
    /// with a word in the log: every request is sent once and every outcome delivered, where
    /// cached connections used to take every fd, so no hook could start and connects failed.
    @Test func aLowOpenFilesLimitLowersConcurrencyInsteadOfStarvingHooks() async throws {
        let p = try Project(
            config: fastConfig + "concurrency: 64\nper_host: 64\nhooks: { concurrency: 64 }\n", definitions: ["t": definition("t")])
        let lines = (0..<300).map { n in
            JSON.object([
                ("id", .string("f\(n)")), ("vars", .object([("url", .string(p.url("/status/200?\(n)"))), ("tag", .string("a"))])),
            ])
            .serialized()
        }
        _ = try p.write("lines.jsonl", lines.joined(separator: "\n") + "\n")
        #expect(try await p.outbox(["enqueue", "t", "--from", "lines.jsonl"]).exitCode == 0)
        let run = try await offload {
            try runProcess(
                "/bin/sh", ["-c", "ulimit -n 90 && exec \"$0\" run --drain --json", p.executable], cwd: p.root,
                environment: p.processEnvironment())
        }
        #expect(run.exitCode == 0, "\(run.description)")
        #expect(
            run.stderr.contains("the open-files limit (90) leaves room for 3 entries in flight and 1 hook at once, not concurrency 64"),
            "\(run.stderr)")
        #expect(!run.stderr.contains("could not start"), "\(run.stderr)")
        #expect(run.json?.int("completed") == 300 && run.json?.int("delivered") == 300, "\(run.stdout)")
        #expect(run.json?.int("attempts") == 300, "no connect failed for want of fds: \(run.stdout)")
        #expect(Set(p.hookLog.compactMap { $0.string("env.id") }).count == 300)
        #expect(try await p.list().isEmpty)
    }

    /// Below the floor of open files a runner would send, then fail to start every hook and
    /// retry them forever: it refuses to start (78), and nothing is sent or changed.
    @Test func aRunnerDoesNotStartBelowTheFloorOfOpenFiles() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200", id: "a")
        // So low the store could not even be opened: said as the limit, not as a damaged store.
        for limit in [5, 20] {
            let run = try await offload {
                try runProcess(
                    "/bin/sh", ["-c", "ulimit -n \(limit) && exec \"$0\" run --drain", p.executable], cwd: p.root,
                    environment: p.processEnvironment())
            }
            #expect(run.exitCode == 78, "\(run.description)")
            #expect(
                run.stderr
                    == "outbox: E_CONFIG: the open-files limit (\(limit)) is below the 32 a runner needs; nothing was sent: raise it (ulimit -n, LimitNOFILE=)\n",
                "\(run.stderr)")
        }
        #expect(p.server.requests.isEmpty)
        #expect(try await p.states() == ["a": "queued"])
        #expect(try await p.show("a")?.at("attempts") == .int(0))
    }

    @Test func outcomeWithoutHookIsAcknowledgedAsItSettles() async throws {
        let p = try Project(definitions: ["quiet": definition("quiet", hooks: false)])
        try await p.enqueue("quiet", path: "/status/200", id: "ok")
        try await p.enqueue("quiet", path: "/status/422", id: "bad")
        let run = try await p.drain(["--json"])
        #expect(p.hookLog.isEmpty)
        #expect(run.json?.int("delivered") == 0)
        let rows = try await p.list()
        #expect(rows.map { $0.string("id") ?? "" } == ["bad"], "the completed entry is forgotten at once")
        let show = try #require(try await p.show("bad"))
        #expect(show.string("state") == "error")
        #expect(show.at("outcomes")?.arrayValue?.count == 1)
        #expect(show.at("outcomes.0.acknowledged") == .bool(true))
        #expect(show.int("outcomes.0.deliveries") == 0)
    }

    @Test func hookEnqueueLinesAreAppliedOnAcknowledgement() async throws {
        let hook = #"""
            #!/bin/sh
            cat > /dev/null
            echo "hello, not an enqueue line"
            printf '{"enqueue": {"key": "child", "id": "child-of-%s", "vars": {"url": "%s", "tag": "c"}}}\n' "$OUTBOX_ID" "$(cat hooks/child-url)"
            exit 0

            """#
        let p = try Project(
            definitions: [
                "parent": definition("parent", top: "on_success: hooks/spawn.sh", hooks: false),
                "child": definition("child"),
            ],
            hooks: ["spawn.sh": hook])
        try p.url("/child").write(toFile: p.root + "/hooks/child-url", atomically: true, encoding: .utf8)
        try await p.enqueue("parent", path: "/status/200", id: "p1")
        try await p.drain()
        let child = try #require(p.deliveries("child-of-p1").first)
        #expect(child.string("stdin.outcome") == "completed")
        #expect(child.string("stdin.meta.parent") == "p1")
        #expect(child.string("stdin.vars.tag") == "c")
        #expect(p.server.requests(path: "/child").count == 1)
        #expect(try await p.list().isEmpty)
    }

    /// Follow-ups of one commit may name one id more than once (a `then` with a fixed id
    /// after several settles, hooks that print the same id, one hook printing it twice):
    /// they are enqueued as if one after another, so the last stays, and the run goes on.
    @Test func followUpsThatRepeatAnIdAreEnqueuedOnce() async throws {
        let hook = #"""
            #!/bin/sh
            cat > /dev/null
            url=$(cat hooks/child-url)
            printf '{"enqueue": {"key": "child", "id": "shared", "vars": {"url": "%s", "tag": "a"}}}\n' "$url"
            printf '{"enqueue": {"key": "child", "id": "shared", "vars": {"url": "%s", "tag": "b"}}}\n' "$url"
            exit 0

            """#
        let parent = definition(
            "parent",
            top: """
                on_success: hooks/spawn.sh
                then:
                  on_success:
                    - key: child
                      id: nightly
                      vars: { url: "{{ vars.url }}", tag: "n" }
                """, hooks: false)
        let p = try Project(definitions: ["parent": parent, "child": definition("child")], hooks: ["spawn.sh": hook])
        try p.url("/child").write(toFile: p.root + "/hooks/child-url", atomically: true, encoding: .utf8)
        for n in 1...10 { try await p.enqueue("parent", path: "/status/200", id: "p\(n)") }
        // A refused line's redelivery must come in this run, however late the refusal was.
        let run = try await p.drain(["--json", "--horizon", "1h"])
        // A line refused while `shared` was in flight fails its delivery, which the run says (4).
        let failedDeliveries = run.json?.int("delivery_failures") ?? 0
        #expect(run.json?.int("failure_status") == (failedDeliveries > 0 ? 4 : 0), "\(run.stderr)")
        #expect(try await p.list().isEmpty, "every parent acknowledged, every child sent")
        #expect(p.deliveries("nightly").first?.string("stdin.outcome") == "completed")
        let shared = try #require(p.deliveries("shared").first)
        #expect(shared.string("stdin.vars.tag") == "b", "the later line of one hook wins")
        // The parents and each sending of `nightly` (whose vars carry the parent's URL).
        #expect(p.server.requests(path: "/status/200").count == 10 + p.deliveries("nightly").count, "no parent was sent twice")
    }

    /// A same-body enqueue of a running entry gives it new vars: the hook sees those, not
    /// the ones the runner read when it claimed the entry.
    @Test func aHookSeesTheVarsOfASameBodyEnqueueWhileItsEntryRan() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        let url = p.url("/hold/wr/status/200")
        func vars(_ note: String) -> String {
            JSON.object([("url", .string(url)), ("tag", .string("a")), ("note", .string(note))]).serialized()
        }
        #expect(try await p.outbox(["enqueue", "t", "--id", "wr", "--vars", vars("old")]).exitCode == 0)
        let runner = try p.start(["run"])
        #expect(await p.server.waitForHeld("wr"))
        #expect(try await p.outbox(["enqueue", "t", "--id", "wr", "--vars", vars("new")]).exitCode == 0)
        // The enqueue committed before the release, and a runner reads other processes'
        // commits before it handles the results of a turn: the order is a fact, not a race.
        _ = p.server.release("wr")
        await eventually("the hook ran") { !p.deliveries("wr").isEmpty }
        runner.signal(SIGTERM)
        _ = await runner.wait()
        #expect(p.deliveries("wr").first?.string("stdin.vars.note") == "new")
    }

    /// An invalid enqueue line (an unknown key; a field outbox does not know, such as a
    /// misspelt or misplaced `id`, which would enqueue again under a fresh id at each redelivery) leaves
    /// the outcome unacknowledged, says why, and enqueues nothing.
    @Test(arguments: [
        (#"{"key": "no-such-key", "vars": {}}"#, "invalid enqueue line"),
        (
            #"{"key": "parent", "idd": "child", "vars": {"url": "http://127.0.0.1:9/", "tag": "c"}}"#,
            #"enqueue has an unknown field "idd" (known: key, vars, id, delay)"#
        ),
        // The id one level too high, beside `enqueue`.
        (
            #"{"key": "parent", "vars": {"url": "http://127.0.0.1:9/", "tag": "c"}}, "id": "child""#,
            #"an enqueue line has a field "id" beside enqueue"#
        ),
    ])
    func anInvalidEnqueueLineIsNotAcknowledged(_ line: String, _ reason: String) async throws {
        let show = try await refusedDelivery(printing: "echo '{\"enqueue\": \(line)}'", reason: reason)
        #expect(show.int("outcomes.0.deliveries").map { $0 >= 2 } == true)
        #expect(show.string("outcomes.0.reason")?.contains(reason) == true)
    }

    /// An entry `p` whose hook runs `command`, exits 0 and fails its delivery for `reason`
    /// (said in the log) twice: nothing is enqueued, and its outcome is `show`n unacknowledged.
    private func refusedDelivery(printing command: String, reason: String) async throws -> JSON {
        let hook = "#!/bin/sh\ncat > /dev/null\n\(command)\necho \"$OUTBOX_DELIVERIES\" >> hooks/bad.log\nexit 0\n"
        let p = try Project(
            definitions: ["parent": definition("parent", top: "on_success: hooks/bad.sh", hooks: false)],
            hooks: ["bad.sh": hook])
        try await p.enqueue("parent", path: "/status/200", id: "p")
        let run = try await p.runUntil { _ in
            ((try? String(contentsOfFile: p.root + "/hooks/bad.log", encoding: .utf8)) ?? "").hasPrefix("1\n2\n")
        }
        #expect(run.stderr.contains(reason), "\(run.stderr)")
        #expect(try await p.list().map { $0.string("id") ?? "" } == ["p"], "nothing enqueued")
        let show = try #require(try await p.show("p"))
        #expect(show.at("outcomes.0.acknowledged") == .bool(false))
        return show
    }

    /// An enqueue request printed so that it would not be read (indented, after a byte order
    /// mark, spread over lines as `jq` prints by default) fails the delivery, saying why: it
    /// was ignored, the outcome acknowledged, and the follow-up lost without a word.
    @Test(arguments: [
        (#"  {\"enqueue\": {\"key\": \"parent\"}}\n"#, "an enqueue line must start with { (this one is indented"),
        (#"\357\273\277{\"enqueue\": {\"key\": \"parent\"}}\n"#, "or starts with a byte order mark)"),
        (
            #"{\n  \"enqueue\": {\n    \"key\": \"parent\"\n  }\n}\n"#,
            #"a line starts with "enqueue": print each enqueue request as one line"#
        ),
    ])
    func anEnqueueRequestPrintedUnreadablyIsNotAcknowledged(_ printed: String, _ reason: String) async throws {
        _ = try await refusedDelivery(printing: "printf \"\(printed)\"", reason: reason)
    }

    /// A hook script whose `#!` interpreter is missing: the shell says "not found", the
    /// delivery's reason names the interpreter.
    @Test func aHookWhoseInterpreterIsMissingSaysSo() async throws {
        let p = try Project(
            definitions: ["t": definition("t", top: "on_success: hooks/old.sh", hooks: false)],
            hooks: ["old.sh": "#!/usr/bin/no-such-python\nprint('hi')\n"])
        try await p.enqueue("t", path: "/status/200", id: "i1")
        let reason = "the hook exited 127 (on_success: hooks/old.sh names the interpreter /usr/bin/no-such-python, which does not exist)"
        // Waited for in the log: the outcome is delivered again every few hundred ms, and a
        // busy machine's `show` between a failure and the next delivery once never came in 120 s.
        let run = try await p.runUntil(until: "the hook's failure to be logged") { runner in runner.stderrSoFar.contains(reason) }
        #expect(run.stderr.contains(reason), "\(run.stderr)")
        #expect(try await p.show("i1")?.string("outcomes.0.reason") == reason)
    }

    /// A hook that failed (here killed by a signal) leaves nothing of its process group
    /// running: its outcome is delivered again, and two deliveries must not overlap.
    @Test func aFailedHooksProcessGroupIsStoppedBeforeItsOutcomeIsDeliveredAgain() async throws {
        let hook = #"""
            #!/bin/sh
            cat > /dev/null
            if [ "$OUTBOX_DELIVERIES" = 1 ]; then
              sleep 600 &
              \#(ObservedProcess.recordLastBackground(to: "hooks/child"))
              kill -9 $$
            fi
            echo "delivery $OUTBOX_DELIVERIES" >> hooks/log
            exit 0

            """#
        let p = try Project(
            config: fastConfig, definitions: ["t": definition("t", top: "on_success: hooks/die.sh", hooks: false)],
            hooks: ["die.sh": hook])
        try await p.enqueue("t", path: "/status/200", id: "k1")
        // A delivery failed in the run (exit 4), though the next one in it succeeded; the
        // horizon lets that next one come in this run however late the first one failed.
        let run = try await p.drain(["--horizon", "1h"], failures: 4)
        // The script died by SIGKILL; its `sh -c` parent reports that as exit 137.
        #expect(run.stderr.contains("the hook exited 137 for k1 (delivery 1)"), "\(run.stderr)")
        #expect(p.read("hooks/log") == "delivery 2\n")
        let child = try #require(ObservedProcess(recorded: p.read("hooks/child") ?? ""))
        // SIGKILLed before the redelivery (a zombie until init reaps it); a busy machine may
        // take a moment to carry the kill out, a sleep left running would take ten minutes.
        await eventually("the first delivery's child \(child.pid) is gone", timeout: 120) { child.hasEnded }
    }

    /// The control thread of `outbox run` runs as SCHED_BATCH (policy 3, field 41 of a task's
    /// stat) while no hook runs, and with the normal policy (0) while hooks run; the curl
    /// thread and the hooks keep the normal policy.
    @Test func theControlThreadIsBatchOnlyWhileNoHookRuns() async throws {
        let hook = #"""
            #!/bin/sh
            cat > /dev/null
            cut -d' ' -f41 /proc/self/stat > hooks/own.policy
            # The hook runs under `sh -c`: the runner is its parent's parent.
            runner=$(cut -d' ' -f4 /proc/$PPID/stat)
            cat /proc/$runner/comm > hooks/runner.comm
            for task in /proc/$runner/task/*/stat; do cut -d' ' -f41 "$task"; done | sort -u | tr '\n' ' ' > hooks/runner.policies
            exit 0

            """#
        let p = try Project(
            definitions: ["t": definition("t", top: "on_success: hooks/policy.sh", hooks: false)],
            hooks: ["policy.sh": hook])
        try await p.enqueue("t", path: "/hold/policy", id: "s1")
        let run = try p.start(["run", "--drain"])
        // While the request is held no hook runs.
        #expect(await p.server.waitForHeld("policy"))
        let sending = try Self.schedulingPolicies(of: run.pid)
        p.server.release("policy")
        let finished = await run.wait()
        #expect(finished.exitCode == 0, "\(finished.description)")
        #expect(sending == "0 3 ", "policies of the runner's threads while it sends: \(sending)")
        let own = try String(contentsOfFile: p.root + "/hooks/own.policy", encoding: .utf8)
        let runner = try String(contentsOfFile: p.root + "/hooks/runner.policies", encoding: .utf8)
        #expect(own == "0\n")
        #expect(try String(contentsOfFile: p.root + "/hooks/runner.comm", encoding: .utf8) == "outbox\n")
        #expect(runner == "0 ", "policies of the runner's threads while a hook runs: \(runner)")
    }

    /// The distinct scheduling policies of a process's threads, sorted, each followed by a space.
    static func schedulingPolicies(of pid: Int32) throws -> String {
        let tasks = try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")
        var policies = Set<String>()
        for task in tasks {
            let stat = try String(contentsOfFile: "/proc/\(pid)/task/\(task)/stat", encoding: .utf8)
            // Fields after the parenthesised name start at field 3.
            let fields = stat[try #require(stat.range(of: ")", options: .backwards)).upperBound...].split(separator: " ")
            policies.insert(String(fields[38]))
        }
        return policies.sorted().map { $0 + " " }.joined()
    }
}
