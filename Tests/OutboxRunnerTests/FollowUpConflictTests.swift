import Foundation
import OutboxModel
import TestSupport
import Testing

/// Follow-ups (`then`, hook enqueue lines) that the same-id rules refuse, and lines of an
/// outcome forgotten while its hook ran: the runner goes on, nothing half-applied.
struct FollowUpConflictTests {
    /// A hook that prints one enqueue line for `b` with id `id` and URL `url`, after waiting
    /// (when `gate` is given) for that file to appear; `prefix` goes before the line.
    static func lineHook(id: String, url: String, gate: String? = nil, prefix: String = "") -> String {
        var script = "#!/bin/sh\ncat > /dev/null\n"
        if let gate {
            // The cap (20 min) only keeps a failed test from leaving the hook behind: the test opens the gate.
            script += "touch hooks/started\ni=0\nwhile [ ! -e \(gate) ] && [ $i -lt 12000 ]; do sleep 0.1; i=$((i+1)); done\n"
        }
        script +=
            "printf '%s\\n' '\(prefix){\"enqueue\": {\"key\": \"b\", \"id\": \"\(id)\", \"vars\": {\"url\": \"\(url)\", \"tag\": \"line\"}}}'\n"
        return script
    }

    /// Key `h`, whose hook is `hooks/line.sh`, and key `b`, which its lines enqueue.
    static func lineProject(function: String = #function) throws -> Project {
        let h = definition("h", hooks: false) + "on_success: hooks/line.sh\n"
        return try Project(definitions: ["h": h, "b": definition("b")], function: function)
    }

    /// Not lost: the outcome waits, its hook's acknowledgement is refused while `next` is in
    /// flight, and the delivery after `next` settled applies the chain.
    @Test func aThenFollowUpNamingAnEntryInFlightWithAnotherBodyIsAppliedOnceThatEntrySettled() async throws {
        let a = definition(
            "a",
            top: """
                then:
                  on_success:
                    - key: b
                      id: "next"
                      vars: { url: "{{ vars.next_url }}", tag: "from-then" }
                """)
        let p = try Project(definitions: ["a": a, "b": definition("b")])
        p.server.script("/held/next", [.hold("next")])
        try await p.enqueue("b", path: "/held/next", id: "next")
        let vars = JSON.object([
            ("url", .string(p.url("/first"))), ("tag", .string("a")), ("next_url", .string(p.url("/from-then"))),
        ]).serialized()
        #expect(try await p.outbox(["enqueue", "a", "--vars", vars, "--id", "first"]).exitCode == 0)
        let runner = try p.start(["run", "--drain", "--horizon", "1h"])
        #expect(await p.server.waitForHeld("next"))
        // The acknowledgement is refused while next is in flight: the outcome says why.
        try await eventually("the acknowledgement to be refused") {
            try await p.show("first")?["outcomes"]?.arrayValue?.first?.string("reason")?.contains("being sent now") == true
        }
        _ = p.server.release("next")
        let finished = await runner.wait()
        #expect(finished.exitCode == 4, "a delivery failed while next was in flight: \(finished.description)")
        #expect(
            finished.stderr.contains(
                "the follow-ups of first wait for its delivery: entry next is being sent now and the new body differs"),
            "\(finished.stderr)")
        let delivered = p.deliveries("first")
        #expect(delivered.count >= 2, "refused while next was in flight, then acknowledged")
        #expect(delivered.allSatisfy { $0["stdin"]?["follow_up_errors"] == nil }, "the hook is told of no error")
        #expect(p.server.requests(path: "/held/next").count == 1)
        #expect(p.server.requests(path: "/from-then").count == 1, "the chain, applied once next settled")
        #expect(try await p.list().isEmpty)
    }

    @Test func aHookLineNamingAnEntryInFlightWithAnotherBodyIsDeliveredAgainAfterItSettles() async throws {
        let p = try Self.lineProject()
        try p.writeHook("line.sh", Self.lineHook(id: "nextb", url: p.url("/from-line")))
        p.server.script("/held/nextb", [.hold("nextb")])
        try await p.enqueue("b", path: "/held/nextb", id: "nextb")
        try await p.enqueue("h", path: "/status/200", id: "parent")
        let runner = try p.start(["run", "--drain", "--horizon", "1h"])
        #expect(await p.server.waitForHeld("nextb"))
        // The line is refused while nextb is in flight: the outcome is not acknowledged.
        try await eventually("the line to be refused") {
            try await p.show("parent")?["outcomes"]?.arrayValue?.first?.string("reason") != nil
        }
        #expect(p.server.requests(path: "/from-line").isEmpty)
        _ = p.server.release("nextb")
        let finished = await runner.wait()
        #expect((0...7).contains(finished.exitCode), "\(finished.description)")
        #expect(
            finished.stderr.contains(
                "a follow-up (of then, or a line of the hook) was refused: entry nextb is being sent now and the new body differs"))
        // Once nextb settled, the redelivery applied the line: nextb again, with the line's body.
        #expect(p.server.requests(path: "/held/nextb").count == 1)
        #expect(p.server.requests(path: "/from-line").count == 1)
        #expect(try await p.list().isEmpty)
    }

    @Test func linesOfAnOutcomeCancelledWhileItsHookRanAreNotApplied() async throws {
        let p = try Self.lineProject()
        try p.writeHook("line.sh", Self.lineHook(id: "late", url: p.url("/from-cancelled"), gate: "hooks/go"))
        try await p.enqueue("h", path: "/status/200", id: "parent")
        let runner = try p.start(["run", "--drain"])
        await eventually("the hook to start") { p.exists("hooks/started") }
        #expect(try await p.outbox(["cancel", "parent"]).exitCode == 0)
        _ = try p.write("hooks/go", "")
        let finished = await runner.wait()
        #expect((0...7).contains(finished.exitCode), "\(finished.description)")
        #expect(p.server.requests(path: "/from-cancelled").isEmpty)
        #expect(try await p.list().isEmpty)
    }

    /// An indented enqueue line is not read, and not ignored either: the delivery fails, says
    /// why, and the outcome waits (it was acknowledged, and the follow-up lost without a word).
    @Test func anIndentedLineIsNotReadButRefused() async throws {
        let p = try Self.lineProject()
        try p.writeHook("line.sh", Self.lineHook(id: "indented", url: p.url("/from-indented"), prefix: "  "))
        try await p.enqueue("h", path: "/status/200", id: "parent")
        let run = try await p.drain(["--max-time", "3s"])
        #expect(run.stderr.contains("an enqueue line must start with { (this one is indented"), "\(run.stderr)")
        #expect(p.server.requests(path: "/from-indented").isEmpty)
        #expect(try await p.list().map { $0.string("id") ?? "" } == ["parent"])
    }
}
