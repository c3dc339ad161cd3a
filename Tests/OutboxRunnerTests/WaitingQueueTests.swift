import Foundation
import OutboxModel
import OutboxTestServer
import TestSupport
import Testing

/// A runner whose queued entries all wait (a delay, a retry's backoff, a hold) reads the
/// queue when a wait ends or the store changes, not every turn: each read of a queue with
/// nothing due looks at every queued entry. The count of reads is the fact checked: a debug
/// build kills itself at the n-th read when `OUTBOX_FAULT=run.read-ahead:n`.
struct WaitingQueueTests {
    /// Entries delayed an hour, or of a paused key: none is due, nor comes due during the run.
    @Test(arguments: ["delayed", "paused key"])
    func aRunnerWhoseEntriesAllWaitReadsTheQueueOnce(_ why: String) async throws {
        let p = try Project(definitions: ["t": definition("t")])
        let delay = why == "delayed" ? ["--delay", "1h"] : []
        for id in ["a", "b", "c"] { try await p.enqueue("t", path: "/status/200", id: id, extra: delay) }
        if why == "paused key" { #expect(try await p.outbox(["pause", "--key", "t"]).exitCode == 0) }
        // 2 s is 40 turns of the runner's 50 ms wait: reading each turn would reach the third read.
        let run = try await p.outbox(["run", "--max-time", "2s"], environment: ["OUTBOX_FAULT": "run.read-ahead:3"])
        #expect(run.exitCode == 0, "\(run)")
        let shown = why == "delayed" ? "queued" : "paused"
        #expect(try await p.states() == ["a": shown, "b": shown, "c": shown])
        #expect(p.server.requests(path: "/").isEmpty)
    }

    /// The wait ends with nothing else changing: the runner reads the queue then and sends
    /// the entry. A drain waits for it, as it is due within the horizon.
    @Test func anEntryIsSentWhenItsDelayEndsWithoutAnyOtherChange() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        let enqueuedAt = nowMs()
        try await p.enqueue("t", path: "/status/200", id: "later", extra: ["--delay", "1s"])
        // Reads: nothing due, then the delay's end, then one after each commit of the
        // claim, the result and the hook's acknowledgement; a read each turn would be 20.
        let run = try await p.outbox(["run", "--drain"], environment: ["OUTBOX_FAULT": "run.read-ahead:12"])
        #expect(run.exitCode == 0, "\(run)")
        #expect(p.server.requests(path: "/status/200").count == 1)
        #expect(p.deliveries("later").count == 1)
        #expect(nowMs() >= enqueuedAt + 1_000, "sent before its delay ended")
    }

    /// A drain reads on from the first entry its last full read returned (the entries before
    /// it were not due), and from the start again once a settle may have made one of them
    /// due: the second entry of a scope goes soon after the first settles, not after every
    /// later entry. The first one's response is held while later entries go through the
    /// other slot until the 30th of them is held too, so the reads have moved past the
    /// second one (blocked behind the first) when the first is released.
    @Test func anEntryItsScopeReleasesGoesBeforeTheLaterOnes() async throws {
        let p = try Project(
            config: fastConfig + "concurrency: 2\n",
            definitions: ["s": definition("s", top: "scope: \"sc\"", hooks: false), "t": definition("t", hooks: false)])
        p.server.script("/held/s1", [TestResponse.status(200).held("s1")])
        p.server.script("/held/u30", [TestResponse.status(200).held("u30")])
        try await p.enqueue("s", path: "/held/s1", id: "s1", tag: "s1")
        try await p.enqueue("s", path: "/status/200", id: "s2", tag: "s2")
        let lines = (1...100).map { n in
            let path = n == 30 ? "/held/u30" : "/status/200"
            return JSON.object([("id", .string("u\(n)")), ("vars", .object([("url", .string(p.url(path))), ("tag", .string("u\(n)"))]))])
                .serialized()
        }
        try lines.joined(separator: "\n").write(toFile: p.root + "/later.jsonl", atomically: false, encoding: .utf8)
        #expect(try await p.outbox(["enqueue", "t", "--from", "later.jsonl"]).exitCode == 0)
        let runner = try p.start(["run", "--drain"])
        // 29 requests go one after another before u30 is held: the server's own wait for held
        // requests (120 s), not a 30 s poll, however slow the machine.
        let s1Held = await p.server.waitForHeld("s1")
        let u30Held = await p.server.waitForHeld("u30")
        #expect(s1Held && u30Held, "s1 and u30 held")
        _ = p.server.release("s1")
        await eventually("s2 sent") { p.server.requests(path: "/status/200").contains { Self.tag($0) == "s2" } }
        _ = p.server.release("u30")
        let run = await runner.wait(timeout: 300)
        #expect(run.exitCode == 0, "\(run)")
        let order = p.server.requests(path: "/").compactMap(Self.tag)
        #expect(order.count == 102, "\(order)")
        // Ahead of s2 after the release: what was claimed (standby) or read ahead before s1
        // settled, 11 or 12 here; with the reads kept past it, s2 went last (98th).
        let position = order.firstIndex(of: "s2") ?? order.count
        #expect(position <= 30 + 30, "s2 at \(position): \(order)")
    }

    static func tag(_ request: RecordedRequest) -> String? {
        request.body.flatMap { try? JSON.parse(String(decoding: $0, as: UTF8.self)) }?["tag"]?.stringValue
    }

    /// A drain waiting for an entry due within its horizon asks when work comes due once,
    /// and again after the entry is sent (a read each turn would be 40 in 2 s).
    @Test func aDrainWaitingForADelayAsksWhenWorkIsDueOnlyAfterAChange() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200", id: "soon", extra: ["--delay", "2s"])
        let run = try await p.outbox(["run", "--drain", "--horizon", "1h"], environment: ["OUTBOX_FAULT": "run.due-times:5"])
        #expect(run.exitCode == 0, "\(run)")
        #expect(p.server.requests(path: "/status/200").count == 1)
        #expect(try await p.states().isEmpty)
    }
}
