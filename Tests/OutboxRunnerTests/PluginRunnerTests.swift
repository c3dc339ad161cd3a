import Foundation
import OutboxModel
import TestSupport
import Testing

/// Plugins through a live runner: `auth_refresh_command` in a drain, and a hook's
/// `warn_after` and `timeout`.
struct PluginRunnerTests {
    @Test func anAuthRefreshInADrainSendsTheParkedEntryInTheSameRun() async throws {
        let refresh = #"""
            #!/bin/sh
            cat > hooks/refresh-input.json
            printf '{"Authorization": "Bearer fresh"}'

            """#
        let p = try Project(
            config: fastConfig + "auth_refresh_command: [hooks/refresh.sh]\nheaders: { Authorization: \"Bearer stale\" }\n",
            definitions: ["t": definition("t")], hooks: ["refresh.sh": refresh])
        p.server.script("/auth", [.status(401), .status(200)])
        try await p.enqueue("t", path: "/auth", id: "a")
        // The park is a failure of the run (exit 2), though the entry completes in it.
        let run = try await p.drain(["--json"], failures: 2)
        #expect(run.json?.int("completed") == 1, "\(run.stdout)")
        #expect(run.json?.at("failed.awaiting_auth") == .array([.string("a")]), "\(run.stdout)")
        let requests = p.server.requests(path: "/auth")
        #expect(requests.map { $0.header("authorization") } == ["Bearer stale", "Bearer fresh"])
        let input = try #require(p.read("hooks/refresh-input.json"))
        #expect(try JSON.parse(input)["entries"]?.arrayValue?.first?["id"] == .string("a"))
        #expect(p.deliveries("a").first?.string("stdin.outcome") == "completed")
    }

    /// A project whose entry `a` is refused once (401) with the stale token, and whose
    /// auth_refresh_command says it runs (`hooks/refreshing`) and answers once `hooks/go` exists.
    static func slowRefreshProject(function: String = #function) async throws -> Project {
        let refresh =
            "#!/bin/sh\ncat > /dev/null\ntouch hooks/refreshing\nwhile [ ! -e hooks/go ]; do sleep 0.05; done\nprintf '{\"Authorization\": \"Bearer fresh\"}'\n"
        let p = try Project(
            config: fastConfig
                + "auth_refresh_command: [hooks/refresh.sh]\nplugins: { timeout: 1h }\nheaders: { Authorization: \"Bearer stale\" }\n",
            definitions: ["t": definition("t")], hooks: ["refresh.sh": refresh], function: function)
        p.server.script("/auth", [.status(401), .status(200)])
        try await p.enqueue("t", path: "/auth", id: "a")
        return p
    }

    /// The drain ends (the park counts as a failure) with `a` sent again with the fresh token and delivered.
    static func expectSentAgainWithTheFreshToken(
        _ p: Project, _ runner: RunningProcess, sourceLocation: SourceLocation = #_sourceLocation
    ) async throws {
        let finished = await runner.wait(timeout: 60)
        #expect(
            finished.exitCode == 2 && !finished.timedOut, "the park is a failure of the run: \(finished)", sourceLocation: sourceLocation)
        #expect(
            p.server.requests(path: "/auth").map { $0.header("authorization") } == ["Bearer stale", "Bearer fresh"], "\(finished.stderr)",
            sourceLocation: sourceLocation)
        #expect(p.deliveries("a").map { $0.string("stdin.outcome") } == ["completed"], sourceLocation: sourceLocation)
        #expect(try await p.list().isEmpty, sourceLocation: sourceLocation)
    }

    /// A slow auth server holds only the parked entries: while auth_refresh_command waits,
    /// other entries are sent and delivered; its answer then resumes the parked one.
    @Test func aSlowAuthRefreshDoesNotHoldTheQueue() async throws {
        let p = try await Self.slowRefreshProject()
        defer { p.touch("hooks/go") }
        // Sent again after the refresh however long the test takes on a busy machine: the
        // retry of an entry the drain sent before is due within its horizon.
        let runner = try p.start(["run", "--drain", "--horizon", "1h"])
        await eventually("the refresh runs") { p.exists("hooks/refreshing") }
        try await p.enqueue("t", path: "/status/200?b", id: "b")
        await eventually("b delivered while the refresh waits") { p.deliveries("b").count == 1 }
        #expect(try await p.states()["a"] == "awaiting-auth")

        p.touch("hooks/go")
        try await Self.expectSentAgainWithTheFreshToken(p, runner)
    }

    /// A drain waits for its own auth refresh to send the parked entry again: when the refresh
    /// answers after the drain's horizon, the entry it resumed is still sent before the drain ends.
    @Test func aDrainSendsWhatItsRefreshResumedPastItsHorizon() async throws {
        let p = try await Self.slowRefreshProject()
        defer { p.touch("hooks/go") }
        // A horizon of 0 has passed before the refresh starts: only the resumed entry's own
        // claim on the drain sends it again.
        let runner = try p.start(["run", "--drain", "--horizon", "0s"])
        await eventually("the refresh runs") { p.exists("hooks/refreshing") }
        p.touch("hooks/go")
        try await Self.expectSentAgainWithTheFreshToken(p, runner)
    }

    /// A slow Wi-Fi check plugin holds only the wifi-only entries: while it runs, other entries
    /// are sent and delivered; its answer "on Wi-Fi" lets the held ones go at once.
    @Test func aSlowWifiCheckDoesNotHoldTheQueue() async throws {
        let check = "#!/bin/sh\ntouch hooks/checking\nwhile [ ! -e hooks/go ]; do sleep 0.05; done\nexit 0\n"
        let p = try Project(
            config: fastConfig + "plugins: { timeout: 1h }\nnetwork: { wifi_check: hooks/wifi.sh, wifi_interval: 1h }\n",
            definitions: ["w": definition("w", request: "wifi_only: true"), "t": definition("t")], hooks: ["wifi.sh": check])
        defer { p.touch("hooks/go") }
        try await p.enqueue("w", path: "/status/200?w", id: "w1")
        let runner = try p.start(["run", "--drain"])
        await eventually("the Wi-Fi check runs") { p.exists("hooks/checking") }
        try await p.enqueue("t", path: "/status/200?b", id: "b")
        await eventually("b delivered while the check runs") { p.deliveries("b").count == 1 }
        #expect(p.server.requests(path: "/status/200?w").isEmpty, "held until the check answers")

        p.touch("hooks/go")
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished)")
        #expect(p.deliveries("w1").map { $0.string("stdin.outcome") } == ["completed"], "\(p.hookLog)")
        #expect(p.server.requests(path: "/status/200?w").count == 1)
        #expect(try await p.list().isEmpty)
    }

    /// Many requests refused at once: those parked in the very turn the refresh runs are
    /// resumed with the others, and the drain sends every one again (exit 2: they parked).
    @Test func anAuthRefreshResumesEveryEntryParkedBeforeIt() async throws {
        let refresh = "#!/bin/sh\ncat > /dev/null\nprintf '{\"Authorization\": \"Bearer fresh\"}'\n"
        let p = try Project(
            config: fastConfig + "auth_refresh_command: [hooks/refresh.sh]\nheaders: { Authorization: \"Bearer stale\" }\n",
            definitions: ["t": definition("t", hooks: false)], hooks: ["refresh.sh": refresh])
        for n in 1...40 { try await p.enqueue("t", path: "/bearer/fresh/\(n)", id: "e\(n)") }
        let run = try await p.drain(["--concurrency", "16", "--json"], failures: 2)
        #expect(run.json?.int("completed") == 40, "\(run.stdout)\n\(run.stderr)")
        #expect(try await p.list().isEmpty)
    }

    /// A refresh that prints an Idempotency-Key or X-Request-Id patches nothing, as `headers
    /// update` refuses them: the entry's key stays its own, and it stays parked.
    @Test(arguments: ["Idempotency-Key", "x-request-id"])
    func anAuthRefreshCannotPatchOutboxsOwnHeaders(_ name: String) async throws {
        let refresh = "#!/bin/sh\ncat > /dev/null\nprintf '{\"Authorization\": \"Bearer fresh\", \"\(name)\": \"mine\"}'\n"
        let p = try Project(
            config: fastConfig + "auth_refresh_command: [hooks/refresh.sh]\nheaders: { Authorization: \"Bearer stale\" }\n",
            definitions: ["t": definition("t", hooks: false)], hooks: ["refresh.sh": refresh])
        try await p.enqueue("t", path: "/bearer/fresh/1", id: "e1")
        let run = try await p.drain(failures: 2)
        #expect(run.stderr.contains("auth_refresh_command: header \(name) cannot be patched"), "\(run.stderr)")
        #expect(try await p.states() == ["e1": "awaiting-auth"])
        #expect(p.server.requests.map { $0.header("authorization") } == ["Bearer stale"])
    }

    /// Every header auth_refresh_command prints is a credential, whatever its name: `show`
    /// prints it redacted, as it does headers_command's.
    @Test func headersFromAnAuthRefreshAreRedacted() async throws {
        let refresh = "#!/bin/sh\ncat > /dev/null\nprintf '{\"Authorization\": \"Bearer fresh-7\", \"X-Api-Key\": \"refresh-secret-8\"}'\n"
        let p = try Project(
            config: fastConfig + "auth_refresh_command: [hooks/refresh.sh]\n", definitions: ["t": definition("t")],
            hooks: ["refresh.sh": refresh])
        // Refused again after the refresh: the entry parks, and stays to be shown.
        p.server.script("/auth", [.status(401)])
        try await p.enqueue("t", path: "/auth", id: "a")
        try await p.drain(failures: 2)
        #expect(p.server.requests(path: "/auth").last?.header("x-api-key") == "refresh-secret-8", "sent as given")
        let shown = try await p.outbox(["show", "a", "--json"])
        #expect(shown.json?["request"]?["headers"]?["x-api-key"] == .string("[redacted]"), "\(shown.stdout)")
        #expect(!shown.stdout.contains("refresh-secret-8") && !shown.stdout.contains("fresh-7"), "\(shown.stdout)")
    }

    /// A refresh whose headers no request could carry (over 1,000) changes nothing: the runner
    /// says so, goes on, and the entry stays awaiting-auth.
    @Test func anAuthRefreshTooLargeToSendIsRefusedAndTheRunnerGoesOn() async throws {
        let refresh = #"""
            #!/bin/sh
            cat > /dev/null
            i=0; printf '{"X-0": "v"'
            while [ $i -lt 1000 ]; do i=$((i + 1)); printf ', "X-%d": "v"' $i; done
            printf '}'

            """#
        let p = try Project(
            config: fastConfig + "auth_refresh_command: [hooks/refresh.sh]\n", definitions: ["t": definition("t")],
            hooks: ["refresh.sh": refresh])
        p.server.script("/auth", [.status(401)])
        try await p.enqueue("t", path: "/auth", id: "a")
        let run = try await p.drain(failures: 2)
        #expect(
            run.stderr.contains(
                "auth_refresh_command: headers update: the patch would hold 1001 headers, over the 1000 a request may carry; entries stay awaiting-auth"
            ),
            "\(run.stderr)")
        #expect(try await p.states() == ["a": "awaiting-auth"])
        #expect(p.server.requests(path: "/auth").count == 1)
    }

    @Test func aSlowHookIsWarnedAboutAndWaitedFor() async throws {
        // Runs until the test lets it go, after the warning was seen.
        let slow = "#!/bin/sh\ncat > /dev/null\nwhile [ ! -e hooks/go ]; do sleep 0.05; done\n"
        let p = try Project(
            config: fastConfig + "hooks: { warn_after: 100ms }\n",
            definitions: ["t": definition("t", top: "on_success: hooks/slow.sh", hooks: false)], hooks: ["slow.sh": slow])
        try await p.enqueue("t", path: "/status/200", id: "a")
        let runner = try p.start(["run", "--drain"])
        await eventually("the warning") {
            runner.stderrSoFar.contains("the hook for a") && runner.stderrSoFar.contains("runs longer than 100ms")
        }
        _ = try p.write("hooks/go", "")
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0, "waited for, then acknowledged: \(finished.description)")
        #expect(try await p.list().isEmpty)
    }

    @Test func aHookPastItsTimeoutIsStoppedAndItsDeliveryFails() async throws {
        let p = try Project(
            config: fastConfig + "hooks: { timeout: 300ms }\n",
            definitions: ["t": definition("t", top: "on_success: hooks/hang.sh", hooks: false)],
            hooks: ["hang.sh": "#!/bin/sh\ncat > /dev/null\nexec sleep 600\n"])
        try await p.enqueue("t", path: "/status/200", id: "a")
        let run = try await p.drain(["--horizon", "0s", "--json"], failures: 4)
        #expect(run.stderr.contains("the hook ran past hooks.timeout and was stopped for a"), "\(run.stderr)")
        #expect(run.json?.at("failed")?["hook_failures"] == .array([.string("a")]))
        let row = try #require(try await p.list().first)
        #expect(row.string("state") == "completed", "sent once; its outcome waits for a hook that finishes")
    }
}
