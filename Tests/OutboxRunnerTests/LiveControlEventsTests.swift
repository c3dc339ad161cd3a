import Foundation
import OutboxModel
import TestSupport
import Testing

/// A pause, resume or headers update typed in another shell shows in a running runner's event stream.
struct LiveControlEventsTests {
    @Test func pauseAndResumeByAnotherProcessAreStateEvents() async throws {
        let p = try Project(config: fastConfig + "concurrency: 1\n", definitions: ["a": definition("a"), "b": definition("b")])
        defer { p.server.release("a") }
        try await p.enqueue("a", path: "/hold/a", id: "first")
        // Due in an hour: queued all along, so only the pause and the resume change how it shows.
        try await p.enqueue("b", path: "/status/200", id: "waiting", extra: ["--delay", "1h"])
        let runner = try p.start(["run", "--events", "-"])
        #expect(await p.server.waitForHeld("a"))

        #expect(try await p.outbox(["pause", "--key", "b"]).exitCode == 0)
        await eventually("a paused state event") {
            runner.stdoutSoFar.contains(#""type":"state""#) && Self.states(runner.stdoutSoFar, "waiting") == ["paused"]
        }
        #expect(try await p.outbox(["resume", "--key", "b"]).exitCode == 0)
        await eventually("a queued state event") { Self.states(runner.stdoutSoFar, "waiting") == ["paused", "queued"] }
        // Pausing a key with nothing queued says nothing.
        #expect(try await p.outbox(["pause", "--key", "nothing.here"]).exitCode == 0)
        #expect(try await p.outbox(["pause"]).exitCode == 0)
        await eventually("the queue pause reported") { Self.states(runner.stdoutSoFar, "waiting") == ["paused", "queued", "paused"] }

        runner.signal(SIGTERM)
        p.server.release("a")
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0, "\(finished.description)")
        #expect(Self.states(finished.stdout, "first").allSatisfy { $0 != "paused" }, "a running entry is not reported paused")
    }

    /// An entry waiting as a standby request when the queue is paused goes back as `paused`:
    /// its state event says what `list --json` says then.
    @Test func aStandbyWithdrawnByAPauseIsReportedPaused() async throws {
        let p = try Project(config: fastConfig + "concurrency: 1\n", definitions: ["a": definition("a")])
        defer { p.server.release("a") }
        try await p.enqueue("a", path: "/hold/a", id: "first")
        let runner = try p.start(["run", "--events", "-"])
        #expect(await p.server.waitForHeld("a"))
        try await p.enqueue("a", path: "/status/200", id: "second")
        await eventually("the second waits as a standby request") { (try? await p.states()["second"]) == "running" }

        #expect(try await p.outbox(["pause"]).exitCode == 0)
        await eventually("the standby withdrawn") { (try? await p.states()["second"]) == "paused" }
        await eventually("its state event") { Self.states(runner.stdoutSoFar, "second").last == "paused" }
        #expect(Self.states(runner.stdoutSoFar, "second").last == "paused", "\(runner.stdoutSoFar)")

        #expect(try await p.outbox(["resume"]).exitCode == 0)
        p.server.release("a")
        await eventually("both delivered") { p.deliveries("first").count == 1 && p.deliveries("second").count == 1 }
        runner.signal(SIGTERM)
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0, "\(finished.description)")
    }

    /// A standby request built before a headers update, or before `wifi-only on`, is withdrawn
    /// and built again: it goes with the new headers, or waits for Wi-Fi (it went as built).
    @Test(arguments: [["headers", "update", "X-New: n1"], ["wifi-only", "on"]])
    func aStandbyBuiltBeforeAControlChangeIsBuiltAgain(_ command: [String]) async throws {
        let wifi = command[0] == "wifi-only"
        let p = try Project(
            config: fastConfig + "concurrency: 1\nnetwork: { wifi_check: hooks/wifi.sh, wifi_interval: 1s }\n",
            definitions: ["a": definition("a")], hooks: ["wifi.sh": "#!/bin/sh\ntest -e hooks/on-wifi\n"])
        defer { p.server.release("a") }
        try await p.enqueue("a", path: "/hold/a", id: "first")
        let runner = try p.start(["run", "--events", "-"])
        #expect(await p.server.waitForHeld("a"))
        try await p.enqueue("a", path: "/status/200", id: "second")
        await eventually("the second waits as a standby request") { (try? await p.states()["second"]) == "running" }

        #expect(try await p.outbox(command).exitCode == 0)
        await eventually("the standby withdrawn") { Self.states(runner.stdoutSoFar, "second").contains("queued") }
        p.server.release("a")
        await eventually("the first delivered") { p.deliveries("first").count == 1 }
        if wifi {
            // Off Wi-Fi: it waits, unsent, until the check says otherwise.
            #expect(p.server.requests(path: "/status/200").isEmpty)
            p.touch("hooks/on-wifi")
        }
        await eventually("the second delivered") { p.deliveries("second").count == 1 }
        runner.signal(SIGTERM)
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0, "\(finished.description)")
        let sent = p.server.requests(path: "/status/200")
        #expect(sent.count == 1)
        if !wifi { #expect(sent.first?.header("x-new") == "n1", "sent with the headers it was built with") }
    }

    @Test func aHeadersUpdateByAnotherProcessIsAStateEvent() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        p.server.script("/auth", [.status(401), .status(200)])
        try await p.enqueue("t", path: "/auth", id: "a")
        let runner = try p.start(["run", "--events", "-"])
        await eventually("parked awaiting-auth") { Self.states(runner.stdoutSoFar, "a").last == "awaiting-auth" }
        #expect(try await p.outbox(["headers", "update", "Authorization: Bearer fresh"]).exitCode == 0)
        await eventually("sent again and delivered") { p.deliveries("a").count == 1 }
        runner.signal(SIGTERM)
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0, "\(finished.description)")
        #expect(Self.states(finished.stdout, "a") == ["running", "awaiting-auth", "queued", "running", "completed"], "\(finished.stdout)")
        let resumed = finished.stdout.split(separator: "\n").compactMap { try? JSON.parse(String($0)) }
            .first { $0["type"] == .string("state") && $0["state"] == .string("queued") }
        #expect(resumed?.string("reason") == "headers updated")
        // A parked or settled row has no next attempt, as `list --json` shows it.
        let parkedAndDone = finished.stdout.split(separator: "\n").compactMap { try? JSON.parse(String($0)) }
            .filter { $0["type"] == .string("state") && ["awaiting-auth", "completed"].contains($0.string("state")) }
        #expect(parkedAndDone.count == 2)
        #expect(parkedAndDone.allSatisfy { $0.at("next_attempt_at") == .null }, "\(parkedAndDone)")
        #expect(p.server.requests(path: "/auth").map { $0.header("authorization") } == [nil, "Bearer fresh"])
    }

    static func states(_ stdout: String, _ id: String) -> [String] {
        stdout.split(separator: "\n").compactMap { line in
            guard let json = try? JSON.parse(String(line)), json["type"] == .string("state"), json["id"] == .string(id) else { return nil }
            return json["state"]?.stringValue
        }
    }
}
