import Foundation
import OutboxModel
import OutboxStore
import Testing

extension StoreConformance {
    /// The runner's changes: settles with their outcomes and follow-ups, and the changes on the way there.
    struct Settle {
        // The state change and its outcome are one change: both or neither.
        @Test(arguments: StoreUnderTest.all, [Outcome.completed, .error])
        func aSettleJournalsItsOutcome(_ sut: StoreUnderTest, outcome: Outcome) throws {
            let c = try Conformance(sut)
            let held = try c.bring("x", to: .running)
            let state: EntryState = outcome == .completed ? .completed : .error
            let reason: String? = outcome == .completed ? nil : "http"
            try c.settle(held, state, outcome, hook: true, reason: reason, now: t0 + 10)
            let e = try c.get("x")
            #expect(e.state == state)
            #expect(e.reason == reason)
            let outcomes = try c.store.outcomes(entryID: "x")
            #expect(outcomes.count == 1)
            let o = try #require(outcomes.first)
            #expect(o.entryID == "x")
            #expect(o.key == "note")
            #expect(o.generation == 1)
            #expect(o.outcome == outcome)
            #expect(o.payload == c.payload(held, outcome))
            #expect(o.deliveries == 0)
            #expect(!o.acknowledged)
            #expect(o.nextDeliveryAt == nil)
            #expect(o.createdAt == t0 + 10)
            #expect(try c.pendingJournal() == ["x g1 \(outcome.rawValue) pending"])
            #expect(try c.store.runningGenerations(seqs: [held.seq]) == [:])
        }

        // With no hook to hear it, a completed or cancelled entry is forgotten as it settles.
        @Test(arguments: StoreUnderTest.all, [EntryState.completed, .cancelled])
        func withoutAHookASettledEntryIsForgotten(_ sut: StoreUnderTest, state: EntryState) throws {
            let c = try Conformance(sut)
            let held = try c.bring("x", to: .running)
            try c.bring("keep", to: .queued)
            try c.settle(held, state, state == .completed ? .completed : .error, hook: false)
            #expect(try c.store.entry(id: "x") == nil)
            #expect(try c.journal("x") == [])
            #expect(try c.pendingJournal() == [])
            #expect(try c.ids() == ["keep"])
        }

        // With no hook, an error entry stays (until cancel or a same-id enqueue) and its outcome is acknowledged at once.
        @Test(arguments: StoreUnderTest.all)
        func withoutAHookAnErrorEntryStaysWithItsOutcomeAcknowledged(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let held = try c.bring("x", to: .running)
            try c.settle(held, .error, .error, hook: false, reason: "http")
            #expect(try c.get("x").state == .error)
            #expect(try c.journal("x") == ["x g1 error acknowledged"])
            #expect(try c.store.outcomes(entryID: "x").first?.deliveries == 0)
            #expect(try c.pendingJournal() == [])
        }

        // Follow-ups are enqueued with the settle that makes them, in the same transaction.
        @Test(arguments: StoreUnderTest.all)
        func followUpsAppearWithTheirSettle(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let held = try c.bring("x", to: .running)
            let followUps = [
                try c.entry("f-1", "note", #"{"n": 11}"#, parent: "x"),
                try c.entry("f-2", "text", #"{"t": "done"}"#, parent: "x"),
            ]
            #expect(try c.ids() == ["x"])
            try c.settle(held, .completed, .completed, followUps: followUps, now: t0 + 3)
            #expect(try c.ids() == ["x", "f-1", "f-2"])
            let f1 = try c.get("f-1")
            #expect(f1.state == .queued)
            #expect(f1.generation == 1)
            #expect(f1.parent == "x")
            #expect(f1.createdAt == t0 + 3)
            #expect(try c.get("f-2").parent == "x")
            #expect(try c.journal("x") == ["x g1 completed pending"])
            #expect(try c.dueIDs(at: t0 + 3) == ["f-1", "f-2"])
        }

        // A batch that fails (a follow-up that cannot be written: a fresh id that is taken)
        // applies nothing: no settle, no follow-up, no attempt.
        @Test(arguments: StoreUnderTest.all)
        func aFailedBatchAppliesNothing(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let held = try c.bring("x", to: .running)
            let busy = try c.bring("busy", "note", #"{"n": 1}"#, to: .running)
            var taken = try c.entry("busy", "note", #"{"n": 2}"#, parent: "x")
            taken.idWasMinted = true
            let followUps = [try c.entry("f-1", parent: "x"), taken]
            #expect(throws: OutboxError.self) {
                try c.store.apply(
                    [
                        .attempt(entryID: "x", generation: 1, at: t0 + 1, payload: .object([("n", .int(1))]), requestID: "r1"),
                        .progress(entryID: "x", bytesSent: 7),
                        .settle(c.settlement(held, .completed, .completed, followUps: followUps)),
                    ], now: t0 + 2)
            }
            let x = try c.get("x")
            #expect(x.state == .running)
            #expect(x.attempts == 0)
            #expect(x.bytesSent == 0)
            #expect(try c.store.attempts(entryID: "x") == [])
            #expect(try c.journal("x") == [])
            #expect(try c.ids() == ["x", "busy"])
            #expect(try c.get("busy").bodyHash == busy.bodyHash)
        }

        // A follow-up the same-id rules refuse (its id is being sent with another body): the
        // settle applies, none of its chain is enqueued now, and its outcome waits for a
        // delivery that builds the chain again (also without a hook: the entry is kept).
        @Test(arguments: StoreUnderTest.all.flatMap { sut in [true, false].map { (sut, $0) } })
        func aChainTheSameIdRulesRefuseWaitsForTheDelivery(_ sut: StoreUnderTest, hook: Bool) throws {
            let c = try Conformance(sut)
            let held = try c.bring("x", to: .running)
            let busy = try c.bring("busy", "note", #"{"n": 1}"#, to: .running)
            let followUps = [try c.entry("f-1", parent: "x"), try c.entry("busy", "note", #"{"n": 2}"#, parent: "x")]
            let settlement = c.settlement(held, .completed, .completed, hook: hook, followUps: followUps)
            let applied = try c.store.apply([.settle(settlement)], now: t0 + 2)
            #expect(applied.followUpConflicts == ["x": "entry busy is being sent now and the new body differs"])
            #expect(try c.get("x").state == .completed)
            #expect(try c.journal("x") == ["x g1 completed pending"])
            let payload = try c.pending("x").payload
            #expect(Settlement.thenWaitsForDelivery(payload))
            let message = payload["follow_up_errors"]?.arrayValue?.first?["message"]?.stringValue ?? ""
            #expect(message.hasPrefix("entry busy is being sent now and the new body differs; "), "\(message)")
            #expect(try c.ids() == ["x", "busy"])
            #expect(try c.get("busy").bodyHash == busy.bodyHash)
            #expect(try c.get("busy").state == .running)
        }

        // A follow-up naming the settling entry's own id is no conflict: its settle ends the run.
        @Test(arguments: StoreUnderTest.all)
        func aFollowUpOfTheSameIdIsNoConflict(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let held = try c.bring("x", to: .running)
            let again = try c.entry("x", "note", #"{"n": 9}"#, parent: "x")
            let applied = try c.store.apply([.settle(c.settlement(held, .completed, .completed, followUps: [again]))], now: t0 + 2)
            #expect(applied.followUpConflicts.isEmpty)
            #expect(!Settlement.thenWaitsForDelivery(try c.pending("x").payload))
        }

        // A gone entry's settle changes nothing, and its follow-ups are not enqueued either.
        @Test(arguments: StoreUnderTest.all)
        func aSettleOfACancelledEntryChangesNothing(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let held = try c.bring("x", to: .running)
            #expect(try c.store.cancel(ids: ["x"], key: nil, now: t0 + 1) == ["x"])
            try c.settle(held, .completed, .completed, followUps: [try c.entry("f-1", parent: "x")], now: t0 + 2)
            #expect(try c.store.entry(id: "x") == nil)
            #expect(try c.journal("x") == [])
            #expect(try c.ids() == [])
        }

        // Fencing by generation: a settle of a generation that was replaced meanwhile changes nothing.
        @Test(arguments: StoreUnderTest.all)
        func aSettleOfAReplacedGenerationChangesNothing(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let held = try c.bring("x", to: .running)
            try c.settle(held, .error, .error, reason: "http")
            #expect(try c.enqueue("x", "note", #"{"n": 2}"#, now: t0 + 1) == .replace)
            // The same settle again, as the runner holds it and as read from the store (no snapshot).
            var unread = c.settlement(held, .completed, .completed)
            unread.snapshot = nil
            try c.store.apply([.settle(c.settlement(held, .completed, .completed)), .settle(unread)], now: t0 + 2)
            let e = try c.get("x")
            #expect(e.state == .queued)
            #expect(e.generation == 2)
            #expect(e.request.url == "https://x.example/notes/2")
            #expect(try c.journal("x") == ["x g1 error pending"])
        }

        // A reschedule puts a running entry back in the queue until its next attempt, with the reason.
        @Test(arguments: StoreUnderTest.all)
        func rescheduleQueuesTheEntryForLater(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .running)
            try c.store.apply([.reschedule(entryID: "x", nextAttemptAt: t0 + 9_000, reason: "http 503")], now: t0 + 1)
            let e = try c.get("x")
            #expect(e.state == .queued)
            #expect(e.nextAttemptAt == t0 + 9_000)
            #expect(e.reason == "http 503")
            #expect(e.updatedAt == t0 + 1)
            #expect(try c.dueIDs(at: t0 + 8_999) == [])
            #expect(try c.dueIDs(at: t0 + 9_000) == ["x"])
            #expect(try c.pendingJournal() == [])
        }

        // A parked entry awaits new credentials: not due at any time.
        @Test(arguments: StoreUnderTest.all)
        func parkMakesAnEntryAwaitAuth(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .running)
            try c.store.apply([.park(entryID: "x")], now: t0 + 1)
            let e = try c.get("x")
            #expect(e.state == .awaitingAuth)
            #expect(e.reason == "auth")
            #expect(try c.ids(ListFilter(state: "awaiting-auth")) == ["x"])
            #expect(try c.dueIDs(at: t0 + 100_000_000) == [])
        }

        // A requeue (the runner stopping) makes the entry due again at once, with no outcome.
        @Test(arguments: StoreUnderTest.all)
        func requeuePutsARunningEntryBack(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .running)
            try c.store.apply([.requeue(entryID: "x")], now: t0 + 1)
            #expect(try c.get("x").state == .queued)
            #expect(try c.dueIDs(at: t0 + 1) == ["x"])
            #expect(try c.journal("x") == [])
        }

        // Progress records the bytes sent so far.
        @Test(arguments: StoreUnderTest.all)
        func progressRecordsBytesSent(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", "text", #"{"t": "0123456789"}"#, to: .running)
            try c.store.apply([.progress(entryID: "x", bytesSent: 4)], now: t0 + 1)
            #expect(try c.get("x").bytesSent == 4)
            try c.store.apply([.progress(entryID: "x", bytesSent: 10)], now: t0 + 2)
            #expect(try c.get("x").bytesSent == 10)
        }

        // Every attempt counts; the log keeps the last 20, oldest first, and the last request id.
        @Test(arguments: StoreUnderTest.all)
        func attemptsCountAndTheLogKeepsTheLastTwenty(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .running)
            try c.bring("y", to: .running)
            for n in 1...25 {
                try c.store.apply(
                    [
                        .attempt(
                            entryID: "x", generation: 1, at: t0 + Int64(n), payload: .object([("n", .int(n))]),
                            requestID: "req-\(n)")
                    ], now: t0 + Int64(n))
            }
            try c.store.apply(
                [.attempt(entryID: "y", generation: 1, at: t0, payload: .object([("n", .int(0))]), requestID: "y-1")], now: t0)
            let x = try c.get("x")
            #expect(x.attempts == 25)
            #expect(x.lastRequestID == "req-25")
            #expect(try c.store.attempts(entryID: "x").map { $0["n"]?.int64Value } == (6...25).map { Int64($0) })
            #expect(try c.store.attempts(entryID: "y") == [.object([("n", .int(0))])])
        }

        // An entry dropped without an outcome (another account's) is gone, owing nothing.
        @Test(arguments: StoreUnderTest.all)
        func aDroppedEntryIsGoneWithoutAnOutcome(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("x")
            try c.enqueue("keep")
            try c.store.apply([.drop(entryID: "x", reason: "other-account")], now: t0 + 1)
            #expect(try c.store.entry(id: "x") == nil)
            #expect(try c.pendingJournal() == [])
            #expect(try c.ids() == ["keep"])
        }
    }
}
