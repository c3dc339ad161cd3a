import Foundation
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
