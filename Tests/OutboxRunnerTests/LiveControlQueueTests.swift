import Foundation
import Glibc
import OutboxModel
import TestSupport
import Testing

// What holds queued entries back while `outbox run` runs, and what brings them back:
// Wi-Fi, the drain's horizon, accounts, `outbox retry`.

/// A `network.wifi_check` command: on Wi-Fi while `wifi-on` exists; each run appends its
/// answer to `wifi-checks.log`, so the test counts the checks.
let wifiCheckScript = """
    #!/bin/sh
    if [ -e wifi-on ]; then echo on >> wifi-checks.log; exit 0; fi
    echo off >> wifi-checks.log
    exit 1

    """

extension Project {
    /// The answers of the Wi-Fi check so far, one per run.
    var wifiChecks: [String] { (read("wifi-checks.log") ?? "").split(separator: "\n").map(String.init) }

    /// The `list --json` row of one entry.
    func row(_ id: String) async throws -> JSON? { try await list().first { $0.string("id") == id } }

    /// Enqueues `key` with vars `{url, tag}` from a process whose `ACCOUNT` is `account`.
    func enqueue(
        _ key: String, path: String, id: String, account: String,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws {
        let vars = JSON.object([("url", .string(url(path))), ("tag", .string(id))]).serialized()
        let result = try await outbox(["enqueue", key, "--vars", vars, "--id", id], environment: ["ACCOUNT": account])
        #expect(result.exitCode == 0, "enqueue: \(result.description)", sourceLocation: sourceLocation)
    }
}

@Suite struct LiveControlQueueTests {
    // MARK: Wi-Fi

    /// A check that gives no answer (here: it runs past plugins.timeout) counts as off Wi-Fi
    /// and is logged once, however often it is asked.
    @Test func aWifiCheckThatGivesNoAnswerIsLoggedOnce() async throws {
        let p = try Project(
            config: fastConfig + "plugins: { timeout: 300ms }\nnetwork: { wifi_check: hooks/wifi.sh, wifi_interval: 1ms }\n",
            definitions: ["t": definition("t")], hooks: ["wifi.sh": "#!/bin/sh\necho asked >> wifi-checks.log\nexec sleep 300\n"])
        try await expectLoggedOnceWhileAsked(
            p, "network.wifi_check ran past plugins.timeout (300ms) and was stopped; wifi-only entries wait as if off Wi-Fi")
    }

    /// Runs a wifi-only entry until the check was asked twice: `said` is logged once, and
    /// the entry waits with reason `wifi`, unsent.
    private func expectLoggedOnceWhileAsked(_ p: Project, _ said: String) async throws {
        #expect(try await p.outbox(["wifi-only", "on"]).exitCode == 0)
        try await p.enqueue("t", path: "/status/200", id: "w")
        let runner = try p.start(["run"])
        await eventually("a second check") { p.wifiChecks.count >= 2 }
        runner.signal(SIGTERM)
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished.description)")
        #expect(finished.stderr.components(separatedBy: said).count == 2, "once: \(finished.stderr)")
        #expect(try await p.row("w")?.string("reason") == "wifi")
        #expect(p.server.requests.isEmpty)
    }

    /// A shell line whose command is killed exits 128+N: that is no answer either, and is logged.
    @Test func aWifiCheckLineWhoseCommandIsKilledIsLogged() async throws {
        let config =
            fastConfig + """
                network:
                  wifi_check: "echo asked >> wifi-checks.log; sh -c 'kill -KILL $$'; exit $?"
                  wifi_interval: 1ms

                """
        let p = try Project(config: config, definitions: ["t": definition("t")])
        try await expectLoggedOnceWhileAsked(
            p, "network.wifi_check was killed by signal 9 (its shell exited 137); wifi-only entries wait as if off Wi-Fi")
    }

    /// A shell line whose command cannot start (the shell exits 127) gives no answer: it is
    /// logged with the reason, as the argv form's is, not taken for "off Wi-Fi" in silence.
    @Test func aWifiCheckLineThatCannotStartSaysWhy() async throws {
        let config =
            fastConfig + """
                network: { wifi_check: hooks/nope.sh, wifi_interval: 1ms }

                """
        let p = try Project(config: config, definitions: ["t": definition("t")])
        let said =
            "network.wifi_check could not start: it exited 127 (hooks/nope.sh does not exist); wifi-only entries wait as if off Wi-Fi"
        #expect(try await p.outbox(["wifi-only", "on"]).exitCode == 0)
        try await p.enqueue("t", path: "/status/200", id: "w")
        let runner = try p.start(["run"])
        await eventually("the check's failure to be logged") { runner.stderrSoFar.contains(said) }
        runner.signal(SIGTERM)
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished.description)")
        #expect(finished.stderr.components(separatedBy: said).count == 2, "once: \(finished.stderr)")
        #expect(try await p.row("w")?.string("reason") == "wifi")
        #expect(p.server.requests.isEmpty)
    }

    /// A background process the check started goes when the check ends: it would outlive the run.
    @Test func whatAWifiCheckLeftBehindIsStopped() async throws {
        let check = "#!/bin/sh\n(exec sleep 300) &\n\(ObservedProcess.recordLastBackground(to: "bg.pid"))\nexit 0\n"
        let p = try Project(
            config: fastConfig + "network: { wifi_check: hooks/wifi.sh }\n", definitions: ["t": definition("t")],
            hooks: ["wifi.sh": check])
        #expect(try await p.outbox(["wifi-only", "on"]).exitCode == 0)
        try await p.enqueue("t", path: "/status/200", id: "w")
        try await p.drain(failures: 0)
        #expect(p.deliveries("w").first?.string("stdin.outcome") == "completed", "on Wi-Fi: sent")
        let background = try #require(ObservedProcess(recorded: p.read("bg.pid") ?? ""))
        // Gone, or a zombie nobody reaps (this machine's init does not): not running.
        await eventually("the background process is stopped") { background.hasEnded }
        #expect(background.hasEnded, "still running: \(background.pid)")
    }

    /// One check answers for the whole queue for `wifi_interval`: many wifi-only entries,
    /// some enqueued while the runner runs (so it looks at them in later turns), one check.
    /// Held entries wait with their reason, and a drain returns instead of waiting for them.
    @Test func theWifiCheckRunsOncePerIntervalForTheWholeQueue() async throws {
        let p = try Project(
            config: fastConfig + "network: { wifi_check: hooks/wifi.sh, wifi_interval: 1h }\n",
            definitions: ["t": definition("t")], hooks: ["wifi.sh": wifiCheckScript])
        #expect(try await p.outbox(["wifi-only", "on"]).exitCode == 0)
        func heldForWifi() async throws -> Int {
            try await p.list().filter { $0.string("state") == "queued" && $0.string("reason") == "wifi" }.count
        }
        for i in 0..<4 { try await p.enqueue("t", path: "/status/200?w\(i)", id: "w\(i)") }
        let runner = try p.start(["run"])
        try await eventually("the runner to hold the entries for Wi-Fi") { try await heldForWifi() == 4 }
        for i in 4..<8 {
            try await p.enqueue("t", path: "/status/200?w\(i)", id: "w\(i)")
            try await eventually("the runner to hold w\(i) for Wi-Fi") { try await heldForWifi() == i + 1 }
        }
        #expect(p.wifiChecks == ["off"], "one check for eight entries and several turns")
        let explain = try await p.outbox(["explain", "w5", "--json"])
        #expect(explain.json?.at("reasons")?.arrayValue?.contains(.string("it is waiting for Wi-Fi")) == true, "\(explain.stdout)")
        runner.signal(SIGTERM)
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished.description)")

        // A horizon past the next check does not keep a drain waiting: a hold is like a pause.
        try await p.enqueue("t", path: "/status/200?w8", id: "w8")
        let drain = try await p.outbox(["run", "--drain", "--horizon", "2h"], timeout: 60)
        #expect(drain.exitCode == 0 && !drain.timedOut, "\(drain.description)")
        #expect(p.wifiChecks == ["off", "off"], "the drain's runner checks once too")
        #expect(try await heldForWifi() == 9)
        #expect(p.server.requests.isEmpty)
        #expect(p.hookLog.isEmpty)

        // `wifi-only off` ends the holds it made: due again, and `explain` says so at once.
        #expect(try await p.outbox(["wifi-only", "off"]).exitCode == 0)
        #expect(try await heldForWifi() == 0)
        let after = try await p.outbox(["explain", "w5", "--json"])
        #expect(after.json?.at("reasons")?.arrayValue == [.string("nothing holds it: the next `outbox run` sends it")], "\(after.stdout)")
    }

    /// An entry past its expiry is not said to be sent by the next run: it settles expired.
    @Test func explainSaysAnEntryPastItsExpiryIsNotSent() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200", id: "old")
        _ = try p.sqlite("UPDATE entries SET expires_at = 1000 WHERE id = 'old'")
        let explain = try await p.outbox(["explain", "old", "--json"])
        #expect(
            explain.json?.at("reasons")?.arrayValue == [
                .string("it expired at 1970-01-01T00:00:01.000Z: the next `outbox run` settles it error (expired), and sends it no more")
            ], "\(explain.stdout)")
        // Paused, a runner does not look at it: it settles only once resumed.
        #expect(try await p.outbox(["pause", "--key", "t"]).exitCode == 0)
        let paused = try await p.outbox(["explain", "old", "--json"])
        #expect(
            paused.json?.at("reasons")?.arrayValue?.first
                == .string(
                    "it expired at 1970-01-01T00:00:01.000Z: once resumed, the next `outbox run` settles it error (expired), and sends it no more"
                ), "\(paused.stdout)")
        _ = try await p.drain()
        #expect(try await p.states() == ["old": "paused"], "not settled while paused")
    }

    /// Between parts of a wifi-only upload the check is asked again (at most once per
    /// interval): off Wi-Fi, no new part starts and the entry waits in the queue with the
    /// part in flight accepted; back on Wi-Fi, the remaining parts are sent.
    @Test func aWifiOnlyUploadStopsBetweenPartsOffWifi() async throws {
        let interval = 200.0
        let p = try Project(
            config: fastConfig + "part_concurrency: 1\nnetwork: { wifi_check: hooks/wifi.sh, wifi_interval: 200ms }\n",
            definitions: [:], hooks: ["wifi.sh": wifiCheckScript])
        defer { p.server.release("parts") }
        try p.define("up", partsDefinition(p.server, min: "64KiB", max: "64KiB", ownership: "copy"))
        p.server.script("/put/", [TestResponse.status(201).held("parts")])
        #expect(try await p.outbox(["wifi-only", "on"]).exitCode == 0)
        p.touch("wifi-on")
        try PartFiles.make(p.path("wf.bin"), size: 3 * 65_536)
        #expect(try await p.outbox(["enqueue", "up", "--id", "wf", "--vars", #"{"path": "wf.bin"}"#]).exitCode == 0)
        let started = Date()
        let runner = try p.start(["run", "--events", "-"])
        #expect(await p.server.waitForHeld("parts"))
        p.remove("wifi-on")
        // Part 1 is in flight: the check is asked again once its last answer is older than the interval.
        await eventually("a check off Wi-Fi") { p.wifiChecks.contains("off") }
        #expect(p.server.release("parts", count: 1) == 1)
        var row: JSON?
        try await eventually("the upload to wait for Wi-Fi, or part 2 to start") {
            row = try await p.row("wf")
            return row?.string("reason") == "wifi" || p.server.requests(path: "/put/wf/").count > 1
        }
        #expect(row?.string("state") == "queued")
        #expect(row?.string("reason") == "wifi")
        #expect(p.server.requests(path: "/put/wf/").map(\.path) == ["/put/wf/1"], "no part starts off Wi-Fi")
        #expect(try await p.acceptedParts("wf") == [true, false, false])
        let checks = p.wifiChecks.count
        let elapsedMs = Date().timeIntervalSince(started) * 1000
        #expect(Double(checks) <= elapsedMs / interval + 1, "at most one check per interval: \(checks) in \(Int(elapsedMs)) ms")

        p.touch("wifi-on")
        p.server.release("parts")
        await eventually("the upload to complete on Wi-Fi") { p.exists("outcome.json") }
        runner.signal(SIGTERM)
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished.description)")
        let counts = Dictionary(grouping: p.server.requests(path: "/put/wf/"), by: { PartFiles.partNumber($0.path) ?? 0 })
            .mapValues(\.count)
        #expect(counts == [1: 1, 2: 1, 3: 1])
        #expect(finished.states(of: "wf").contains { $0.string("state") == "queued" && $0.string("reason") == "wifi" })
        #expect(PartFiles.readJSON(p.path("outcome.json"))?["outcome"] as? String == "completed")
    }

    // MARK: The drain's horizon

    /// An endpoint that always answers 503: the drain's horizon is fixed when it starts, so
    /// retries within the backoff's 400 ms do not keep it going; the entry stays queued.
    @Test func aDrainEndsAtItsHorizonWhileAnEntryKeepsFailing() async throws {
        let config = "retry:\n  backoff: { base: 100ms, max: 400ms, jitter: 0 }\n  terminal_http: { exempt: [404] }\n"
        let p = try Project(config: config, definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/503", id: "busy")
        // The first retry, due 100 ms after the first 503 settles, must fall within the horizon:
        // a busy machine can take seconds from the drain's start to that settle.
        let run = try await p.outbox(["run", "--drain", "--horizon", "5s", "--json"], timeout: 60)
        #expect(run.exitCode == 0 && !run.timedOut, "\(run.description)")
        let summary = try run.requireJSON()
        let attempts = try #require(summary.int("attempts"))
        #expect(attempts >= 2, "attempts were made: \(run.stdout)")
        #expect(summary.int("retried") == attempts)
        #expect(summary.int("remaining") == 1)
        #expect(p.server.requests(path: "/status/503").count == Int(attempts))
        let row = try #require(try await p.row("busy"))
        #expect(row.string("state") == "queued")
        #expect(row.string("reason") == "HTTP 503")
        #expect(p.hookLog.isEmpty)
    }

    /// A follow-up the run itself creates after its horizon passed, due at once, is still
    /// sent: the parent is held in flight until the horizon (0 s) is behind.
    @Test(arguments: [nil, "0s"] as [String?])
    func aDrainPastItsHorizonStillSendsAFollowUpDueNow(_ delay: String?) async throws {
        var then = """
            then:
              on_success:
                - key: receipt
                  id: "receipt-{{ entry.id }}"
                  vars: { url: "{{ vars.receipt_url }}", tag: "r" }
            """
        if let delay { then += "\n      delay: \(delay)" }
        // The parent has no hook: no delivery of its outcome is left to keep the drain going.
        let p = try Project(definitions: ["order": definition("order", top: then, hooks: false), "receipt": definition("receipt")])
        defer { p.server.release("order") }
        let vars = JSON.object([
            ("url", .string(p.url("/hold/order"))), ("tag", .string("o")),
            ("receipt_url", .string(p.url("/status/200?receipt"))),
        ]).serialized()
        #expect(try await p.outbox(["enqueue", "order", "--vars", vars, "--id", "o1"]).exitCode == 0)
        let runner = try p.start(["run", "--drain", "--horizon", "0s", "--events", "-"])
        #expect(await p.server.waitForHeld("order"))
        // The horizon is the drain's start, before this moment: once the clock moves on, it is past.
        let heldAt = nowMs()
        await eventually("the clock to move on") { nowMs() > heldAt }
        p.server.release("order")
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished.description)")
        #expect(p.server.requests(path: "/status/200?receipt").count == 1, "the follow-up was sent")
        #expect(finished.states(of: "receipt-o1").map { $0.string("state") ?? "" } == ["running", "completed"])
        #expect(p.deliveries("receipt-o1").first?.string("stdin.outcome") == "completed")
        #expect(try await p.list().isEmpty)
    }

    // MARK: Accounts

    /// With `account:` configured, an entry is sent only while its own account is current.
    /// A runner with none (unset or empty) leaves it queued with its reason, and its drain
    /// returns; then a runner of its account sends it and drops another account's entry.
    @Test func anEntryIsSentOnlyWhileItsAccountIsCurrent() async throws {
        let p = try Project(config: fastConfig + "account: \"{{ env.ACCOUNT }}\"\n", definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200?a1", id: "a1", account: "alice")
        try await p.enqueue("t", path: "/status/200?c1", id: "c1", account: "carol")
        #expect(try await p.show("a1")?.string("account") == "alice")
        func expectWaiting(_ ids: [String], sourceLocation: SourceLocation = #_sourceLocation) async throws {
            for id in ids {
                let row = try await p.row(id)
                #expect(row?.string("state") == "queued", "\(id)", sourceLocation: sourceLocation)
                #expect(row?.string("reason") == "waiting for its account", "\(id)", sourceLocation: sourceLocation)
            }
        }
        // A horizon past the next look at the entries does not keep these drains waiting.
        let empty = try await p.outbox(
            ["run", "--drain", "--horizon", "1h", "--events", "-"], environment: ["ACCOUNT": ""],
            timeout: 60)
        #expect(empty.exitCode == 0 && !empty.timedOut, "\(empty.description)")
        #expect(empty.jsonLines.filter { $0.string("type") == "state" }.isEmpty, "neither claimed nor dropped")
        try await expectWaiting(["a1", "c1"])
        try await p.enqueue("t", path: "/status/200?a2", id: "a2", account: "alice")
        let unset = try await p.outbox(["run", "--drain", "--horizon", "1h", "--events", "-"], timeout: 60)
        #expect(unset.exitCode == 0 && !unset.timedOut, "\(unset.description)")
        #expect(unset.jsonLines.filter { $0.string("type") == "state" }.isEmpty, "neither claimed nor dropped")
        try await expectWaiting(["a1", "c1", "a2"])
        let explain = try await p.outbox(["explain", "a2", "--json"])
        #expect(
            explain.json?.at("reasons")?.arrayValue?.contains(
                .string("it waits for its account alice to be the current one (config account)")) == true,
            "\(explain.stdout)")
        #expect(p.server.requests.isEmpty)

        let alice = try await p.outbox(["run", "--drain", "--events", "-"], environment: ["ACCOUNT": "alice"], timeout: 60)
        #expect(alice.exitCode == 0 && !alice.timedOut, "\(alice.description)")
        #expect(p.server.requests.map(\.path).sorted() == ["/status/200?a1", "/status/200?a2"])
        for id in ["a1", "a2"] {
            #expect(alice.states(of: id).map { $0.string("state") ?? "" } == ["running", "completed"], "\(id)")
        }
        #expect(alice.states(of: "c1").map { $0.string("state") ?? "" } == ["cancelled"])
        #expect(alice.states(of: "c1").first?.string("reason") == "other-account")
        #expect(Set(p.hookLog.map { $0.string("env.id") ?? "" }) == ["a1", "a2"], "a dropped entry runs no hook")
        #expect(try await p.list().isEmpty)
    }

    // MARK: outbox retry

    /// `outbox retry` typed while a runner runs: a backing-off entry (by id), an
    /// awaiting-auth one (by key) and an error one (`--errors`) are due again with their
    /// attempts reset, and the runner sends them. Unknown ids and bad calls change nothing.
    @Test func retryBringsEntriesBackToARunningRunner() async throws {
        // An hour's backoff: only `outbox retry` brings the failed entry back while the test runs.
        let config = "retry:\n  backoff: { base: 1h, max: 2h, jitter: 0 }\n  terminal_http: { exempt: [404] }\n"
        let p = try Project(config: config, definitions: ["a": definition("a"), "b": definition("b"), "c": definition("c")])
        try await p.enqueue("a", path: "/seq/a/503,200", id: "backoff")
        try await p.enqueue("b", path: "/seq/b/401,200", id: "auth")
        try await p.enqueue("c", path: "/seq/c/422,200", id: "failed")
        let runner = try p.start(["run"])
        try await eventually("each entry's first answer") {
            try await p.states() == ["backoff": "queued", "auth": "awaiting-auth", "failed": "error"] && p.deliveries("failed").count == 1
        }
        let before = try await p.list()
        #expect(try await p.outbox(["retry", "nope"]).exitCode == 0, "an unknown id is not an error")
        for arguments in [["retry"], ["retry", "backoff", "--errors"], ["retry", "--key", "a", "--errors"], ["retry", "--bogus"]] {
            let result = try await p.outbox(arguments)
            #expect(result.exitCode == 64, "\(arguments): \(result.description)")
        }
        for key in ["", "a b"] {
            let result = try await p.outbox(["retry", "--key", key])
            #expect(result.exitCode == 65, "retry --key \(key.debugDescription): \(result.description)")
            #expect(result.stderr.hasPrefix("outbox: E_INVALID: "), "\(result.stderr)")
        }
        #expect(try await p.list() == before, "nothing changed")
        #expect(p.server.requests.count == 3)

        #expect(try await p.outbox(["retry", "backoff"]).exitCode == 0)
        #expect(try await p.outbox(["retry", "--key", "b"]).exitCode == 0)
        #expect(try await p.outbox(["retry", "--errors"]).exitCode == 0)
        await eventually("the runner to send the three entries again") {
            ["backoff", "auth", "failed"].allSatisfy { p.deliveries($0).last?.string("stdin.outcome") == "completed" }
        }
        runner.signal(SIGTERM)
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished.description)")
        for name in ["a", "b", "c"] { #expect(p.server.requests(path: "/seq/\(name)/").count == 2, "\(name)") }
        for id in ["backoff", "auth", "failed"] {
            #expect(p.deliveries(id).last?.int("stdin.meta.attempts") == 1, "\(id): attempts were reset")
        }
        #expect(p.deliveries("failed").map { $0.string("stdin.outcome") ?? "" } == ["error", "completed"])
        #expect(try await p.list().isEmpty)
    }
}
