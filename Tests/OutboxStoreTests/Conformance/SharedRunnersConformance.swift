import Foundation
import OutboxModel
import OutboxStore
import Testing
import TestSupport

extension StoreConformance {
    /// Claims committed before a transfer starts, leases renewed and lost, and leased hook
    /// deliveries: what keeps several runners on one store apart.
    struct SharedRunners {
        static let shared = StoreUnderTest.all.filter(\.sharedByRunners)

        // Claiming returns the entries as the store has them, now running; on one runner's store every one.
        @Test(arguments: StoreUnderTest.all)
        func aClaimReturnsTheEntriesNowRunning(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            for id in ["a", "b"] { try c.enqueue(id) }
            let got = try c.store.claim([try c.get("a"), try c.get("b")], lease: runnerA, now: t0)
            #expect(got.map(\.id) == ["a", "b"])
            #expect(try c.ids(ListFilter(state: "running")) == ["a", "b"])
            #expect(try c.dueIDs(at: t0) == [])
        }

        // Two runners that read the same entries: the second claim gets only what the first left.
        @Test(arguments: shared)
        func aSecondClaimOfTheSameEntriesGetsNothing(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            for id in ["a", "b", "c"] { try c.enqueue(id) }
            let read = try c.store.dueEntries(now: t0, limit: 10, excluding: [])
            let other = try c.instance.another()
            #expect(try c.store.claim(Array(read.prefix(2)), lease: runnerA, now: t0).map(\.id) == ["a", "b"])
            #expect(try other.claim(read, lease: runnerB, now: t0).map(\.id) == ["c"])
        }

        // An entry replaced or rescheduled since it was read is not claimed from the stale read.
        @Test(arguments: shared)
        func aStaleReadClaimsNothing(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("x")
            try c.enqueue("y")
            let read = try c.store.dueEntries(now: t0, limit: 10, excluding: [])
            let other = try c.instance.another()
            try c.claim("y", lease: runnerB, on: other)
            try other.apply([.reschedule(entryID: "y", nextAttemptAt: t0 + 5_000, reason: "http 503")], by: runnerB, now: t0)
            #expect(try c.store.claim(read, lease: runnerA, now: t0).map(\.id) == ["x"])
        }

        // A serial scope runs one entry at a time across runners, in enqueue order.
        @Test(arguments: shared)
        func aScopeRunsOneEntryAtATimeAcrossRunners(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("s1", "scoped", #"{"n": 1, "s": "s"}"#)
            try c.enqueue("s2", "scoped", #"{"n": 2, "s": "s"}"#)
            try c.enqueue("t1", "scoped", #"{"n": 3, "s": "t"}"#)
            let read = try c.store.dueEntries(now: t0, limit: 10, excluding: [])
            let other = try c.instance.another()
            // One claim of two entries of a scope gets the first only.
            #expect(try other.claim(read, lease: runnerB, now: t0).map(\.id) == ["s1", "t1"])
            // Another runner may not start the next one while the first runs.
            #expect(try c.store.claim([try c.get("s2")], lease: runnerA, now: t0).isEmpty)
            let s1 = try other.entry(id: "s1")!
            try other.apply([.settle(c.settlement(s1, .completed, .completed, hook: false))], by: runnerB, now: t0)
            #expect(try c.store.claim([try c.get("s2")], lease: runnerA, now: t0).map(\.id) == ["s2"])
        }

        // A renewal keeps a live claim; once another runner requeued it, the renewal reports it lost and its settle changes nothing.
        @Test(arguments: shared)
        func aLostLeaseIsReportedAndFencedOut(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("x")
            try c.enqueue("y")
            let held = try c.store.claim([try c.get("x"), try c.get("y")], lease: runnerA, now: t0)
            #expect(try c.store.renewLeases(runnerA) == [])
            let other = try c.instance.another()
            // The renewal ran on this host's clock: the requeue looks past that lease's end.
            let later = Int64(Date().timeIntervalSince1970 * 1000) + runnerA.durationMs + 1
            #expect(try other.requeueAbandoned(lease: runnerB, now: later) == 2)
            try c.claim("y", lease: runnerB, now: later, on: other)
            #expect(try c.store.renewLeases(runnerA) == ["x", "y"])
            let applied = try c.store.apply(
                held.map { .settle(c.settlement($0, .completed, .completed)) }, by: runnerA, now: later)
            #expect(applied.fencedOut == ["x", "y"])
            #expect(try c.get("x").state == .queued)
            #expect(try c.get("y").state == .running)
            #expect(try c.store.outcomes(entryID: "x").isEmpty && c.store.outcomes(entryID: "y").isEmpty)
        }

        // A delivery is one runner's at a time; once its lease runs out another takes it over and the first's acknowledgement changes nothing.
        @Test(arguments: shared)
        func aDeliveryIsLeased(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .completed)
            let seq = try c.pending("x").seq
            let other = try c.instance.another()
            let brief = Lease(owner: "runner-a", durationMs: 1)
            #expect(try c.store.claimDeliveries(seqs: [seq], lease: brief) == [seq: 1])
            #expect(try other.claimDeliveries(seqs: [seq], lease: runnerB) == [seq: 2] || waitForExpiry(other, seq))
            try c.store.acknowledge(seq: seq, followUps: [], now: t0)
            #expect(try c.pendingJournal() == ["x g1 completed pending"])
            try other.acknowledge(seq: seq, followUps: [], now: t0)
            #expect(try c.pendingJournal() == [])
        }

        // A live delivery lease holds the outcome out of every other runner's deliverable list.
        @Test(arguments: shared)
        func aLeasedDeliveryIsNotDeliverableElsewhere(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .completed)
            let seq = try c.pending("x").seq
            let other = try c.instance.another()
            let now = Int64(Date().timeIntervalSince1970 * 1000)
            #expect(try c.store.claimDeliveries(seqs: [seq], lease: runnerA) == [seq: 1])
            #expect(try other.deliverableOutcomes(now: now, keys: ["note"], excludingIDs: [], limit: nil).isEmpty)
            #expect(try other.claimDeliveries(seqs: [seq], lease: runnerB) == [:])
            try c.store.deliveryFailed(seq: seq, nextDeliveryAt: now, reason: "hook exited 1")
            #expect(try other.deliverableOutcomes(now: now, keys: ["note"], excludingIDs: [], limit: nil).map(\.seq) == [seq])
        }

        /// Claims the delivery for runner B once runner A's one-millisecond lease has ended.
        private func waitForExpiry(_ store: any Store, _ seq: Int64) throws -> Bool {
            let deadline = Date().addingTimeInterval(10 * testTimeScale)
            while Date() < deadline {
                if try store.claimDeliveries(seqs: [seq], lease: runnerB)[seq] != nil { return true }
                usleep(2_000)
            }
            return false
        }
    }
}
