import Foundation
import OutboxModel
import TestSupport
import Testing

/// `run --drain` always ends: work that cannot start before the horizon (an entry behind a
/// parked, delayed or backing-off one of its scope; an outcome behind an older one of its id
/// whose hook keeps failing) does not keep it going.
struct DrainEndsTests {
    static let scoped = definition("s", top: "scope: \"sc-{{ vars.tag }}\"")

    @Test func anEntryBehindAParkedOneOfItsScopeWaitsForTheNextRun() async throws {
        let p = try Project(definitions: ["s": Self.scoped])
        try await p.enqueue("s", path: "/status/401", id: "x1", tag: "x")
        try await p.enqueue("s", path: "/behind/x2", id: "x2", tag: "x")
        try await p.drain(failures: 2)
        #expect(try await p.states() == ["x1": "awaiting-auth", "x2": "queued"])
        #expect(p.server.requests(path: "/behind/").isEmpty)
    }

    @Test func anEntryBehindADelayedOneOfItsScopeWaitsForTheNextRun() async throws {
        let p = try Project(definitions: ["s": Self.scoped])
        try await p.enqueue("s", path: "/status/200", id: "z1", tag: "z", extra: ["--delay", "1h"])
        try await p.enqueue("s", path: "/behind/z2", id: "z2", tag: "z")
        try await p.drain(failures: 0)
        #expect(try await p.states() == ["z1": "queued", "z2": "queued"])
        #expect(p.server.requests(path: "/").isEmpty)
    }

    /// The one ahead keeps failing: it is retried until the horizon, and the drain ends there.
    @Test func anEntryBehindOneThatBacksOffEndsAtTheHorizon() async throws {
        let p = try Project(definitions: ["s": Self.scoped])
        try await p.enqueue("s", path: "/status/503", id: "y1", tag: "y")
        try await p.enqueue("s", path: "/behind/y2", id: "y2", tag: "y")
        try await p.drain(["--horizon", "1s"], failures: 0)
        #expect(try await p.states() == ["y1": "queued", "y2": "queued"])
        #expect(!p.server.requests(path: "/status/503").isEmpty)
        #expect(p.server.requests(path: "/behind/").isEmpty)
    }

    /// While another request is in flight past the horizon, a failing entry is not retried
    /// and a failing hook not run again once their next turn falls after the horizon.
    /// Backoffs of 50, 100, 200, 200... ms allow at most 7 attempts within 1 s on any machine.
    @Test func noRetryOrRedeliveryDuePastTheHorizonWhileARequestIsInFlight() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        _ = try p.write("hooks/fail", "")
        p.server.script("/slow", [.hold("slow")])
        try await p.enqueue("t", path: "/slow", id: "slow")
        try await p.enqueue("t", path: "/status/404", id: "missing")
        try await p.enqueue("t", path: "/status/200", id: "done")
        let started = nowMs()
        let runner = try p.start(["run", "--drain", "--horizon", "1s"])
        #expect(await p.server.waitForHeld("slow"))
        await eventually("the first hook to fail") { !p.deliveries("done").isEmpty }
        // The fact to wait for: a retry of `missing` fell due after the horizon and its time
        // has passed; a runner that claimed it would have sent it by now.
        try await eventually("a retry due past the horizon", timeout: 120) {
            guard let next = try await p.show("missing")?["next_attempt_at"]?.int64Value else { return false }
            return next > started + 1_000 && nowMs() > next + 500
        }
        _ = p.server.release("slow")
        let finished = await runner.wait()
        #expect(finished.exitCode == 4, "\(finished.description)")
        let attempts = p.server.requests(path: "/status/404").count
        #expect((1...7).contains(attempts), "\(attempts) attempts")
        #expect((1...7).contains(p.deliveries("done").count), "\(p.deliveries("done").count) deliveries")
        #expect(try await p.states()["missing"] == "queued")
    }

    /// A hook that failed is delivered again by the next run, however long the backoff it
    /// was given in the run before.
    @Test func aFailedDeliveryIsTriedAgainAtTheNextRun() async throws {
        let slow = "retry:\n  backoff: { base: 1h, max: 2h, jitter: 0 }\n"
        let p = try Project(config: slow, definitions: ["t": definition("t")])
        _ = try p.write("hooks/fail", "")
        try await p.enqueue("t", path: "/status/200", id: "once")
        try await p.drain(failures: 4)
        #expect(p.deliveries("once").count == 1)
        try FileManager.default.removeItem(atPath: p.path("hooks/fail"))
        try await p.drain(failures: 0)
        #expect(p.deliveries("once").map { $0.string("env.deliveries") } == ["1", "2"])
        #expect(try await p.list().isEmpty)
        #expect(p.server.requests(path: "/status/200").count == 1)
    }

    /// A second replace of a completed entry whose outcome is not acknowledged still waits
    /// for that outcome: the new body is sent only after the old outcome's hook exits 0.
    @Test func aSecondReplaceStillWaitsForTheOldOutcome() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        _ = try p.write("hooks/fail", "")
        try await p.enqueue("t", path: "/put/gk", id: "gk", tag: "one")
        try await p.drain(["--horizon", "0s"], failures: 4)
        try await p.enqueue("t", path: "/put/gk", id: "gk", tag: "two")
        try await p.enqueue("t", path: "/put/gk", id: "gk", tag: "three")
        // Whether the old outcome is due again when this starts is the machine's timing: 0 or 4.
        try await p.drain(["--horizon", "0s"])
        #expect(p.server.requests(path: "/put/gk").count == 1, "the new body waits")
        try FileManager.default.removeItem(atPath: p.root + "/hooks/fail")
        try await p.drain(failures: 0)
        let sent = p.server.requests(path: "/put/gk")
        #expect(sent.count == 2)
        #expect(try sent.last.map { try JSON.parse(String(decoding: $0.body ?? [], as: UTF8.self))["tag"] } == .string("three"))
        // Generation 1's outcome until its hook exits 0, then generation 2's, once.
        let generations = p.deliveries("gk").map { $0.int("stdin.meta.generation") }
        #expect(generations.last == 2 && generations.dropLast().allSatisfy { $0 == 1 }, "\(generations)")
    }

    /// A reopened entry's new outcome waits behind the old one, whose hook keeps failing: the
    /// old one's next delivery falls after the horizon, so the drain ends.
    @Test func anOutcomeBehindAFailingOneOfItsIdDoesNotHoldTheDrain() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        _ = try p.write("hooks/fail", "")
        try await p.enqueue("t", path: "/seq/gl/400,200", id: "gl")
        try await p.drain(["--horizon", "0s"], failures: 5)
        try await p.enqueue("t", path: "/seq/gl/400,200", id: "gl")
        try await p.drain(["--horizon", "0s"])
        #expect(p.server.requests(path: "/seq/gl/").count == 2)
        let outcomes = try #require(try await p.show("gl")?["outcomes"]?.arrayValue)
        #expect(outcomes.map { $0.string("outcome") } == ["error", "completed"])
        #expect(outcomes.last?.int("deliveries") == 0)
        #expect(outcomes.map { $0["acknowledged"] } == [.bool(false), .bool(false)])
    }
}
