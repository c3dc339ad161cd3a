import Foundation
import OutboxModel
import OutboxStore
import Testing

extension StoreConformance {
    /// `outbox cancel`, and the cancellation of a scope behind a failed entry.
    struct Cancel {
        // Cancel by ids returns the ids it cancelled; unknown ids are not errors.
        @Test(arguments: StoreUnderTest.all)
        func cancelByIdsReturnsTheIdsCancelled(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            for id in ["a", "b", "c"] { try c.enqueue(id) }
            #expect(Set(try c.store.cancel(ids: ["b", "unknown", "a"], key: nil, now: t0 + 1)) == ["a", "b"])
            #expect(try c.ids() == ["c"])
            #expect(try c.store.cancel(ids: ["unknown"], key: nil, now: t0 + 2) == [])
            #expect(try c.store.cancel(ids: [], key: nil, now: t0 + 3) == [])
            #expect(try c.ids() == ["c"])
        }

        // Cancel by key takes every entry of that key and no other.
        @Test(arguments: StoreUnderTest.all)
        func cancelByKeyTakesThatKeyOnly(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("n1")
            try c.enqueue("t1", "text", #"{"t": "x"}"#)
            try c.bring("n2", to: .running)
            #expect(Set(try c.store.cancel(ids: nil, key: "note", now: t0 + 1)) == ["n1", "n2"])
            #expect(try c.ids() == ["t1"])
            #expect(try c.store.cancel(ids: nil, key: "nothing", now: t0 + 2) == [])
        }

        // A cancelled live entry is gone: not running, owing no outcome, and its id is free again.
        @Test(arguments: StoreUnderTest.all, [EntryState.queued, .running, .awaitingAuth])
        func aCancelledLiveEntryIsGone(_ sut: StoreUnderTest, state: EntryState) throws {
            let c = try Conformance(sut)
            let e = try c.bring("x", to: state)
            #expect(try c.store.cancel(ids: ["x"], key: nil, now: t0 + 1) == ["x"])
            #expect(try c.store.entry(id: "x") == nil)
            #expect(try c.store.runningGenerations(seqs: [e.seq]) == [:])
            #expect(try c.journal("x") == [])
            #expect(try c.dueIDs(at: t0 + 1) == [])
            #expect(try c.enqueue("x", now: t0 + 2) == .create)
        }

        // A runner's attempt and settle of an entry cancelled meanwhile leave nothing behind:
        // a new entry of that id shows no attempt of the old one.
        @Test(arguments: StoreUnderTest.all)
        func aRunnersChangesToACancelledEntryLeaveNothing(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let e = try c.bring("x", to: .running)
            #expect(try c.store.cancel(ids: ["x"], key: nil, now: t0 + 1) == ["x"])
            let applied = try c.store.apply(
                [
                    .attempt(entryID: "x", generation: e.generation, at: t0 + 2, payload: .object([]), requestID: "late"),
                    .settle(
                        Settlement(
                            entryID: "x", generation: e.generation, state: .completed, reason: nil, outcome: .completed,
                            payload: .object([]), hookExists: true)),
                ], now: t0 + 2)
            #expect(applied.fencedOut == ["x"])
            #expect(try c.enqueue("x", now: t0 + 3) == .create)
            #expect(try c.store.attempts(entryID: "x") == [])
            #expect(try c.journal("x") == [])
        }

        // A settled entry is forgotten with its outcomes not yet delivered.
        @Test(arguments: StoreUnderTest.all, [EntryState.error, .completed, .cancelled])
        func aCancelledSettledEntryIsForgottenWithItsOutcome(_ sut: StoreUnderTest, state: EntryState) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: state)
            try c.bring("other", to: .error)
            #expect(try c.store.cancel(ids: ["x"], key: nil, now: t0 + 1) == ["x"])
            #expect(try c.store.entry(id: "x") == nil)
            #expect(try c.journal("x") == [])
            #expect(try c.pendingJournal() == ["other g1 error pending"])
        }

        // Entries behind a failed one in its scope are cancelled (reason scope), each with an error outcome.
        @Test(arguments: StoreUnderTest.all)
        func cancelScopeCancelsTheEntriesBehind(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("ahead", "scoped", #"{"n": 0, "s": "s"}"#)
            let failing = try c.claim(try c.bring("failing", "scoped", #"{"n": 1, "s": "s"}"#, to: .queued).id)[0]
            try c.enqueue("behind-1", "scoped", #"{"n": 2, "s": "s"}"#)
            try c.bring("behind-2", "scoped", #"{"n": 3, "s": "s"}"#, to: .awaitingAuth)
            try c.enqueue("elsewhere", "scoped", #"{"n": 4, "s": "other"}"#)
            let payloadFor: @Sendable (Entry) -> (JSON, Bool) = { e in (.object([("cancelled", .string(e.id))]), true) }
            try c.store.apply(
                [
                    .settle(c.settlement(failing, .error, .error, reason: "http")),
                    .cancelScope(scope: "s", afterSeq: failing.seq, payloadFor: payloadFor),
                ], now: t0 + 1)
            for id in ["behind-1", "behind-2"] {
                let e = try c.get(id)
                #expect(e.state == .cancelled)
                #expect(e.reason == "scope")
                let outcomes = try c.store.outcomes(entryID: id)
                #expect(outcomes.map(Conformance.line) == ["\(id) g1 error pending"])
                #expect(outcomes.first?.payload == .object([("cancelled", .string(id))]))
            }
            #expect(try c.get("failing").state == .error)
            #expect(try c.get("ahead").state == .queued)
            #expect(try c.get("elsewhere").state == .queued)
            #expect(try c.pendingJournal() == ["failing g1 error pending", "behind-1 g1 error pending", "behind-2 g1 error pending"])
        }

        // Entries cancelled by scope whose outcome no hook hears are forgotten at once.
        @Test(arguments: StoreUnderTest.all)
        func cancelScopeWithoutAHookForgetsTheEntries(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let failing = try c.claim(try c.bring("failing", "scoped", #"{"n": 1, "s": "s"}"#, to: .queued).id)[0]
            try c.enqueue("behind", "scoped", #"{"n": 2, "s": "s"}"#)
            let payloadFor: @Sendable (Entry) -> (JSON, Bool) = { _ in (.object([]), false) }
            try c.store.apply(
                [
                    .settle(c.settlement(failing, .error, .error, hook: false, reason: "http")),
                    .cancelScope(scope: "s", afterSeq: failing.seq, payloadFor: payloadFor),
                ], now: t0 + 1)
            #expect(try c.store.entry(id: "behind") == nil)
            #expect(try c.ids() == ["failing"])
            #expect(try c.pendingJournal() == [])
        }
    }
}
