import Foundation
import OutboxModel
import OutboxStore
import Testing

extension StoreConformance {
    /// Hook delivery: which outcomes are due, counting, postponing and acknowledging them.
    struct Delivery {
        private func deliverable(
            _ c: Conformance, at now: Int64, keys: Set<String> = ["note", "text"],
            excluding: Set<String> = [], limit: Int? = nil
        ) throws -> [String] {
            try c.store.deliverableOutcomes(now: now, keys: keys, excludingIDs: excluding, limit: limit).map(Conformance.line)
        }

        // One outcome per id at a time: the oldest pending, in journal order.
        @Test(arguments: StoreUnderTest.all)
        func theOldestPendingOutcomeOfEachIdIsDeliverable(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .error)
            try c.bring("y", to: .error)
            // x is reopened and completes: a second outcome of the same generation.
            #expect(try c.enqueue("x", now: t0 + 1) == .reopen)
            try c.settle(try c.claim("x", now: t0 + 2)[0], .completed, .completed, now: t0 + 3)
            #expect(try c.journal("x") == ["x g1 error pending", "x g1 completed pending"])
            #expect(try deliverable(c, at: t0 + 3) == ["x g1 error pending", "y g1 error pending"])
            try c.store.acknowledge(seq: try c.pending("x").seq, followUps: [], now: t0 + 4)
            #expect(try deliverable(c, at: t0 + 4) == ["y g1 error pending", "x g1 completed pending"])
        }

        // Only outcomes of the given keys are deliverable.
        @Test(arguments: StoreUnderTest.all)
        func onlyTheGivenKeysAreDeliverable(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("n", to: .error)
            try c.bring("t", "text", #"{"t": "x"}"#, to: .error)
            #expect(try deliverable(c, at: t0, keys: ["text"]) == ["t g1 error pending"])
            #expect(try deliverable(c, at: t0, keys: []) == [])
        }

        // Excluded ids (deliveries in progress) are skipped, and the limit counts what is left.
        @Test(arguments: StoreUnderTest.all)
        func excludedIdsAndTheLimitAreHonoured(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            for id in ["a", "b", "c"] { try c.bring(id, to: .error) }
            #expect(try deliverable(c, at: t0, excluding: ["a"], limit: 1) == ["b g1 error pending"])
            #expect(try deliverable(c, at: t0, excluding: ["a"]) == ["b g1 error pending", "c g1 error pending"])
            #expect(try deliverable(c, at: t0, limit: 2) == ["a g1 error pending", "b g1 error pending"])
        }

        // Each delivery is counted before the hook starts.
        @Test(arguments: StoreUnderTest.all)
        func beginDeliveryCountsDeliveries(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .completed)
            let seq = try c.pending("x").seq
            #expect(try c.store.beginDelivery(seq: seq) == 1)
            #expect(try c.store.beginDelivery(seq: seq) == 2)
            #expect(try c.instance.another().outcomes(entryID: "x").map(\.deliveries) == [2])
        }

        // A failed delivery is postponed with its reason, and due again at that time. A hook
        // that could not start reached no one: the delivery counted for it is taken back.
        @Test(arguments: StoreUnderTest.all, [true, false])
        func aFailedDeliveryIsPostponed(_ sut: StoreUnderTest, hookStarted: Bool) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .completed)
            let seq = try c.pending("x").seq
            _ = try c.store.beginDelivery(seq: seq)
            try c.store.deliveryFailed(
                seq: seq, nextDeliveryAt: t0 + 5_000, reason: "hook exited 3", hookStarted: hookStarted, hookFailed: true)
            let o = try c.pending("x")
            #expect(o.nextDeliveryAt == t0 + 5_000)
            #expect(o.reason == "hook exited 3")
            #expect(o.deliveries == (hookStarted ? 1 : 0))
            #expect(try deliverable(c, at: t0 + 4_999) == [])
            #expect(try deliverable(c, at: t0 + 5_000) == ["x g1 completed pending"])
        }

        // A running hook's process group is recorded for a later runner, and dropped once acknowledged.
        @Test(arguments: StoreUnderTest.all)
        func hookProcessesAreRecordedUntilAcknowledged(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .completed)
            try c.bring("y", to: .error)
            #expect(try c.store.recordedHookProcesses().isEmpty)
            try c.store.recordHookProcess(seq: try c.pending("x").seq, pgid: 4242, startTime: 987_654_321)
            try c.store.recordHookProcess(seq: try c.pending("y").seq, pgid: 4343, startTime: 5)
            let recorded = try c.instance.another().recordedHookProcesses()
            #expect(Set(recorded.map { "\($0.pgid)@\($0.startTime)" }) == ["4242@987654321", "4343@5"])
            #expect(try c.pending("x").hookPgid == 4242)
            #expect(try c.pending("x").hookStart == 987_654_321)
            try c.store.acknowledge(seq: try c.pending("x").seq, followUps: [], now: t0 + 1)
            #expect(try c.store.recordedHookProcesses().map { "\($0.pgid)@\($0.startTime)" } == ["4343@5"])
        }

        // Acknowledging a completed entry's outcome forgets the entry and enqueues the hook's follow-ups, together.
        @Test(arguments: StoreUnderTest.all, [EntryState.completed, .cancelled])
        func acknowledgeForgetsTheEntryAndAppliesFollowUps(_ sut: StoreUnderTest, state: EntryState) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: state)
            try c.store.acknowledge(seq: try c.pending("x").seq, followUps: [try c.entry("f-1", parent: "x")], now: t0 + 1)
            #expect(try c.store.entry(id: "x") == nil)
            #expect(try c.journal("x") == [])
            #expect(try c.pendingJournal() == [])
            #expect(try c.ids() == ["f-1"])
            #expect(try c.get("f-1").parent == "x")
            #expect(try c.dueIDs(at: t0 + 1) == ["f-1"])
        }

        // An acknowledgement whose follow-ups the same-id rules refuse applies nothing and is
        // refused: the outcome is still owed. The others of its batch are acknowledged.
        @Test(arguments: StoreUnderTest.all)
        func aRefusedAcknowledgementAppliesNothing(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .completed)
            try c.bring("y", to: .completed)
            try c.bring("busy", to: .running)
            let followUps = [try c.entry("f-1", parent: "x"), try c.entry("busy", "note", #"{"n": 2}"#, parent: "x")]
            let x = try c.pending("x").seq
            let refused = try c.store.acknowledge(
                [Acknowledgement(seq: x, followUps: followUps), Acknowledgement(seq: try c.pending("y").seq, followUps: [])], now: t0 + 1)
            #expect(refused == [x: "entry busy is being sent now and the new body differs"])
            #expect(try c.get("x").state == .completed)
            #expect(try c.journal("x") == ["x g1 completed pending"])
            #expect(try c.store.entry(id: "y") == nil)
            #expect(try c.ids() == ["x", "busy"])
        }

        // The lines of an outcome that is gone (its entry cancelled while the hook ran) are not applied.
        @Test(arguments: StoreUnderTest.all)
        func linesOfAForgottenOutcomeAreNotApplied(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .completed)
            let seq = try c.pending("x").seq
            #expect(try c.store.cancel(ids: ["x"], key: nil, now: t0 + 1) == ["x"])
            let refused = try c.store.acknowledge([Acknowledgement(seq: seq, followUps: [try c.entry("f-1", parent: "x")])], now: t0 + 2)
            #expect(refused.isEmpty)
            #expect(try c.ids() == [])
        }

        // An error entry stays after its outcome is acknowledged (until cancel or a same-id enqueue).
        @Test(arguments: StoreUnderTest.all)
        func acknowledgingAnErrorKeepsTheEntry(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .error)
            try c.store.acknowledge(seq: try c.pending("x").seq, followUps: [], now: t0 + 1)
            #expect(try c.get("x").state == .error)
            #expect(try c.journal("x") == ["x g1 error acknowledged"])
            #expect(try c.pendingJournal() == [])
        }

        // The old generation's acknowledgement lets the waiting new generation go, and does not forget it.
        @Test(arguments: StoreUnderTest.all)
        func anOldAcknowledgementReleasesTheWaitingGeneration(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .completed)
            #expect(try c.enqueue("x", "note", #"{"n": 2}"#, now: t0 + 1) == .replaceAfterDelivery)
            try c.store.acknowledge(seq: try c.pending("x").seq, followUps: [], now: t0 + 2)
            let e = try c.get("x")
            #expect(e.generation == 2)
            #expect(e.state == .queued)
            #expect(!e.waitsForDelivery)
            #expect(try c.dueIDs(at: t0 + 2) == ["x"])
        }

        // An older generation's acknowledgement never forgets a newer generation, even a completed one.
        @Test(arguments: StoreUnderTest.all)
        func anOldAcknowledgementNeverForgetsANewerGeneration(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .error)
            #expect(try c.enqueue("x", "note", #"{"n": 2}"#, now: t0 + 1) == .replace)
            try c.settle(try c.claim("x", now: t0 + 2)[0], .completed, .completed, now: t0 + 3)
            #expect(try c.journal("x") == ["x g1 error pending", "x g2 completed pending"])
            try c.store.acknowledge(seq: try c.pending("x").seq, followUps: [], now: t0 + 4)
            let e = try c.get("x")
            #expect(e.generation == 2)
            #expect(e.state == .completed)
            #expect(try c.journal("x").last == "x g2 completed pending")
            #expect(try deliverable(c, at: t0 + 4) == ["x g2 completed pending"])
        }

        // Outcomes of keys no definition handles are marked, never dropped.
        @Test(arguments: StoreUnderTest.all)
        func unhandledKeysAreMarkedNotDropped(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("n", to: .error)
            try c.bring("t", "text", #"{"t": "x"}"#, to: .error)
            try c.store.markUnhandled(keys: ["note"])
            #expect(try c.pending("t").reason == "unhandled-key")
            #expect(try c.pending("n").reason == "http")
            #expect(try c.pendingJournal() == ["n g1 error pending", "t g1 error pending"])
            #expect(try c.get("t").state == .error)
        }

        // Deliveries of several outcomes are counted together, each its own count.
        @Test(arguments: StoreUnderTest.all)
        func deliveriesAreCountedInABatch(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .completed)
            try c.bring("y", to: .error)
            let x = try c.pending("x").seq
            let y = try c.pending("y").seq
            _ = try c.store.beginDelivery(seq: x)
            #expect(try c.store.beginDeliveries(seqs: [x, y]) == [x: 2, y: 1])
            #expect(try c.store.beginDeliveries(seqs: []) == [:])
        }

        // Acknowledgements in one batch: each as alone, follow-ups of all of them enqueued;
        // a batch whose follow-up cannot be staged acknowledges none.
        @Test(arguments: StoreUnderTest.all)
        func acknowledgementsInABatchAreAllOrNothing(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .completed)
            try c.bring("y", to: .error)
            try c.bring("z", to: .completed)
            let (x, y, z) = (try c.pending("x").seq, try c.pending("y").seq, try c.pending("z").seq)
            let gone = try c.userFile("gone.txt", "g")
            let broken = try c.entry("fz", "copy", #"{"path": "\#(gone)"}"#, parent: "z")
            try FileManager.default.removeItem(atPath: gone)
            #expect(throws: OutboxError.self) {
                try c.store.acknowledge(
                    [Acknowledgement(seq: x, followUps: []), Acknowledgement(seq: z, followUps: [broken])], now: t0 + 1)
            }
            #expect(try c.pendingJournal() == ["x g1 completed pending", "y g1 error pending", "z g1 completed pending"])
            try c.store.acknowledge(
                [
                    Acknowledgement(seq: x, followUps: [try c.entry("fx", parent: "x")]),
                    Acknowledgement(seq: y, followUps: [try c.entry("fy", parent: "y")]),
                ], now: t0 + 2)
            #expect(try c.pendingJournal() == ["z g1 completed pending"])
            #expect(try c.store.entry(id: "x") == nil, "a completed entry is forgotten at its acknowledgement")
            #expect(try c.get("y").state == .error)
            #expect(try c.ids() == ["y", "z", "fx", "fy"])
        }
    }
}
