import Foundation
import OutboxModel
import OutboxStore
import Testing

extension StoreConformance {
    /// What is due, claims, and entries left running by runners that are gone.
    struct ClaimAndDue {
        // Due entries come in enqueue order, at most `limit`.
        @Test(arguments: StoreUnderTest.all)
        func dueEntriesComeInEnqueueOrderUpToTheLimit(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            for id in ["c", "a", "d", "b"] { try c.enqueue(id) }
            #expect(try c.dueIDs(at: t0) == ["c", "a", "d", "b"])
            #expect(try c.dueIDs(at: t0, limit: 2) == ["c", "a"])
        }

        // `not_before` holds an entry until that time, to the millisecond.
        @Test(arguments: StoreUnderTest.all)
        func notBeforeHoldsAnEntry(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("later", notBefore: t0 + 1_000)
            try c.enqueue("now")
            #expect(try c.dueIDs(at: t0 + 999) == ["now"])
            #expect(try c.dueIDs(at: t0 + 1_000) == ["later", "now"])
        }

        // A rescheduled entry is due again at its next attempt time, not before.
        @Test(arguments: StoreUnderTest.all)
        func nextAttemptAtHoldsAnEntry(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .running)
            try c.store.apply([.reschedule(entryID: "x", nextAttemptAt: t0 + 5_000, reason: "http 503")], now: t0)
            #expect(try c.dueIDs(at: t0 + 4_999) == [])
            #expect(try c.dueIDs(at: t0 + 5_000) == ["x"])
        }

        // A paused queue holds every entry; resuming releases them.
        @Test(arguments: StoreUnderTest.all)
        func aPausedQueueHoldsEverything(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("n")
            try c.enqueue("t", "text", #"{"t": "x"}"#)
            try c.store.setQueuePaused(true)
            #expect(try c.dueIDs(at: t0) == [])
            try c.store.setQueuePaused(false)
            #expect(try c.dueIDs(at: t0) == ["n", "t"])
        }

        // A paused key holds its entries only.
        @Test(arguments: StoreUnderTest.all)
        func aPausedKeyHoldsItsEntries(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("n")
            try c.enqueue("t", "text", #"{"t": "x"}"#)
            try c.store.setPaused(keys: ["note"], paused: true)
            #expect(try c.dueIDs(at: t0) == ["t"])
            try c.store.setPaused(keys: ["note"], paused: false)
            #expect(try c.dueIDs(at: t0) == ["n", "t"])
        }

        // Head of line: a later entry of a scope waits while an earlier one is live, even one not due itself.
        @Test(arguments: StoreUnderTest.all, [EntryState.queued, .running, .awaitingAuth])
        func aLaterEntryOfAScopeWaitsWhileAnEarlierOneIsLive(_ sut: StoreUnderTest, earlier: EntryState) throws {
            let c = try Conformance(sut)
            if earlier == .queued {
                try c.enqueue("s-1", "scoped", #"{"n": 1, "s": "s"}"#, notBefore: t0 + 1_000_000)
            } else {
                try c.bring("s-1", "scoped", #"{"n": 1, "s": "s"}"#, to: earlier)
            }
            try c.enqueue("s-2", "scoped", #"{"n": 2, "s": "s"}"#)
            try c.enqueue("o-1", "scoped", #"{"n": 3, "s": "other"}"#)
            try c.enqueue("plain")
            #expect(try c.dueIDs(at: t0 + 10) == ["o-1", "plain"])
        }

        // Once the earlier entry settles, the next one of its scope is due.
        @Test(arguments: StoreUnderTest.all, [EntryState.error, .completed])
        func aSettledEarlierEntryReleasesItsScope(_ sut: StoreUnderTest, earlier: EntryState) throws {
            let c = try Conformance(sut)
            try c.bring("s-1", "scoped", #"{"n": 1, "s": "s"}"#, to: earlier)
            try c.enqueue("s-2", "scoped", #"{"n": 2, "s": "s"}"#)
            try c.enqueue("s-3", "scoped", #"{"n": 3, "s": "s"}"#)
            #expect(try c.dueIDs(at: t0 + 10) == ["s-2"])
        }

        // `excluding` leaves out entries the runner holds or has read already.
        @Test(arguments: StoreUnderTest.all)
        func excludedIdsAreNotReturned(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            for id in ["a", "b", "c", "d"] { try c.enqueue(id) }
            #expect(try c.dueIDs(at: t0, limit: 2, excluding: ["a", "c"]) == ["b", "d"])
        }

        // A claim makes the entries running and takes them out of the due list.
        @Test(arguments: StoreUnderTest.all)
        func markRunningClaimsEntries(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            for id in ["a", "b", "c"] { try c.enqueue(id) }
            try c.claim("a", "c", now: t0 + 7)
            #expect(try c.get("a").state == .running)
            #expect(try c.get("b").state == .queued)
            #expect(try c.get("c").state == .running)
            #expect(try c.dueIDs(at: t0 + 7) == ["b"])
            #expect(try c.ids(ListFilter(state: "running")) == ["a", "c"])
        }

        // A claim takes only queued entries: one parked meanwhile stays parked.
        @Test(arguments: StoreUnderTest.all)
        func markRunningLeavesAnEntryThatIsNoLongerQueued(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let parked = try c.bring("p", to: .awaitingAuth)
            let failed = try c.bring("e", to: .error)
            try c.store.apply([.markRunning(entrySeqs: [parked.seq, failed.seq], lease: runnerB)], now: t0 + 5)
            #expect(try c.get("p").state == .awaitingAuth)
            #expect(try c.get("e").state == .error)
        }

        // Running generations: present while running, absent once settled, requeued, cancelled or unknown.
        @Test(arguments: StoreUnderTest.all)
        func runningGenerationsNameOnlyRunningEntries(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let a = try c.bring("a", to: .running)
            let b = try c.bring("b", to: .running)
            let d = try c.bring("d", to: .running)
            let q = try c.bring("q", to: .queued)
            #expect(try c.store.runningGenerations(seqs: [a.seq, b.seq, d.seq, q.seq, 999_999]) == [a.seq: 1, b.seq: 1, d.seq: 1])
            try c.settle(a, .error, .error)
            try c.store.apply([.requeue(entryID: "b")], now: t0)
            _ = try c.store.cancel(ids: ["d"], key: nil, now: t0)
            #expect(try c.store.runningGenerations(seqs: [a.seq, b.seq, d.seq]) == [:])
            #expect(try c.store.runningGenerations(seqs: []) == [:])
        }

        // Entries of a runner whose lease ran out go back in the queue for another runner.
        @Test(arguments: StoreUnderTest.all)
        func requeueAbandonedTakesBackEntriesOfAGoneRunner(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            for id in ["a", "b", "c"] { try c.enqueue(id) }
            try c.claim("a", "b", lease: runnerA, now: t0)
            let other = try c.instance.another()
            #expect(try other.requeueAbandoned(lease: runnerB, now: t0 + runnerA.durationMs + 1) == 2)
            #expect(try c.ids(ListFilter(state: "queued")) == ["a", "b", "c"])
            #expect(try other.dueEntries(now: t0 + runnerA.durationMs + 1, limit: 10, excluding: []).map(\.id) == ["a", "b", "c"])
            #expect(try other.requeueAbandoned(lease: runnerB, now: t0 + runnerA.durationMs + 2) == 0)
        }

        // The earliest hold of a queued entry is when something is next due.
        @Test(arguments: StoreUnderTest.all)
        func dueTimesIsTheEarliestHold(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            #expect(try c.store.dueTimes(deliverableKeys: ["note"]).any == nil)
            try c.enqueue("late", notBefore: t0 + 5_000)
            try c.enqueue("soon", notBefore: t0 + 3_000)
            try c.bring("running", to: .running)
            try c.bring("parked", to: .awaitingAuth)
            #expect(try c.store.dueTimes(deliverableKeys: []).any == t0 + 3_000)
            try c.enqueue("now")
            #expect(try #require(try c.store.dueTimes(deliverableKeys: []).any) <= t0)
        }

        // Held entries of a paused key or a paused queue are not due at any time.
        @Test(arguments: StoreUnderTest.all)
        func dueTimesIgnoresPausedEntries(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("n", notBefore: t0 + 1_000)
            try c.enqueue("t", "text", #"{"t": "x"}"#, notBefore: t0 + 2_000)
            try c.store.setPaused(keys: ["note"], paused: true)
            #expect(try c.store.dueTimes(deliverableKeys: []).any == t0 + 2_000)
            try c.store.setQueuePaused(true)
            #expect(try c.store.dueTimes(deliverableKeys: []).any == nil)
        }

        // A postponed delivery counts for the keys the runner can deliver, and only for them.
        @Test(arguments: StoreUnderTest.all)
        func dueTimesCountsPostponedDeliveries(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .error)
            try c.store.deliveryFailed(seq: try c.pending("x").seq, nextDeliveryAt: t0 + 8_000, reason: "hook exit 1")
            try c.enqueue("later", "text", #"{"t": "x"}"#, notBefore: t0 + 9_000)
            #expect(try c.store.dueTimes(deliverableKeys: ["note"]).any == t0 + 8_000)
            #expect(try c.store.dueTimes(deliverableKeys: ["text"]).any == t0 + 9_000)
        }

        // The first wait to end after a time, a retry's backoff or a delay: when a runner
        // that found nothing due reads again. None is left once every wait has ended.
        @Test(arguments: StoreUnderTest.all)
        func nextWaitEndIsTheFirstWaitAfterATime(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            #expect(try c.store.nextWaitEnd(after: t0) == nil)
            try c.enqueue("late", notBefore: t0 + 5_000)
            _ = try c.bring("retried", to: .running)
            try c.store.apply([.reschedule(entryID: "retried", nextAttemptAt: t0 + 2_000, reason: "HTTP 503")], now: t0)
            try c.enqueue("now")
            #expect(try c.store.nextWaitEnd(after: t0) == t0 + 2_000)
            #expect(try c.store.nextWaitEnd(after: t0 + 2_000) == t0 + 5_000)
            #expect(try c.store.nextWaitEnd(after: t0 + 5_000) == nil)
        }

        // Work never tried (no attempt, no delivery) is due as fresh; a retry is not.
        @Test(arguments: StoreUnderTest.all)
        func dueTimesTellsFreshWorkFromRetries(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let held = try c.bring("retried", to: .running)
            try c.store.apply(
                [
                    .attempt(entryID: "retried", generation: held.generation, at: t0, payload: .object([]), requestID: "r"),
                    .reschedule(entryID: "retried", nextAttemptAt: t0 + 1_000, reason: "HTTP 503"),
                ], now: t0)
            #expect(try c.store.dueTimes(deliverableKeys: []) == DueTimes(any: t0 + 1_000, fresh: nil))
            try c.enqueue("new", notBefore: t0 + 2_000)
            #expect(try c.store.dueTimes(deliverableKeys: []) == DueTimes(any: t0 + 1_000, fresh: t0 + 2_000))
            try c.bring("done", to: .error)
            #expect(try c.store.dueTimes(deliverableKeys: ["note"]).fresh == 0)
        }

        // A held entry (off Wi-Fi, no account) stays queued with its reason, is not due until
        // its hold ends, and does not keep a drain waiting.
        @Test(arguments: StoreUnderTest.all, HoldReason.allCases)
        func aHeldEntryWaitsWithItsReason(_ sut: StoreUnderTest, _ reason: HoldReason) throws {
            let c = try Conformance(sut)
            try c.enqueue("w")
            try c.store.apply([.hold(entryID: "w", until: t0 + 30_000, reason: reason)], now: t0)
            let w = try c.get("w")
            #expect(w.state == .queued)
            #expect(w.reason == reason.rawValue)
            #expect(w.nextAttemptAt == t0 + 30_000)
            #expect(try c.store.dueEntries(now: t0 + 29_999, limit: 10, excluding: []).isEmpty)
            #expect(try c.store.dueEntries(now: t0 + 30_000, limit: 10, excluding: []).map(\.id) == ["w"])
            #expect(try c.store.dueTimes(deliverableKeys: []) == DueTimes(any: nil, fresh: nil))
        }

        // A hold applies only to a queued entry: a running one is the runner's.
        @Test(arguments: StoreUnderTest.all)
        func aHoldLeavesARunningEntryAlone(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("r", to: .running)
            try c.store.apply([.hold(entryID: "r", until: t0 + 30_000, reason: .wifi)], now: t0)
            #expect(try c.get("r").state == .running)
            #expect(try c.get("r").reason == nil)
        }

        // A new runner looks again at once at entries an earlier one held; a retry's wait stays.
        @Test(arguments: StoreUnderTest.all, HoldReason.allCases)
        func aNewRunnerReleasesTheHoldsOfEarlierOnes(_ sut: StoreUnderTest, _ reason: HoldReason) throws {
            let c = try Conformance(sut)
            try c.enqueue("w")
            let retried = try c.bring("retried", to: .running)
            try c.store.apply(
                [
                    .hold(entryID: "w", until: t0 + 30_000, reason: reason),
                    .attempt(entryID: "retried", generation: retried.generation, at: t0, payload: .object([]), requestID: "r"),
                    .reschedule(entryID: "retried", nextAttemptAt: t0 + 30_000, reason: "HTTP 503"),
                ], now: t0)
            try c.store.releaseHolds(now: t0 + 5, reasons: HoldReason.allCases)
            let w = try c.get("w")
            #expect(w.reason == nil)
            #expect(try c.store.dueEntries(now: t0 + 5, limit: 10, excluding: []).map(\.id) == ["w"])
            #expect(try c.get("retried").reason == "HTTP 503")
            #expect(try c.store.dueTimes(deliverableKeys: []) == DueTimes(any: t0 + 5, fresh: t0 + 5))
        }
    }

    /// `outbox retry`: due now with the backoff reset; error entries reopened.
    struct Retry {
        @Test(arguments: StoreUnderTest.all)
        func retryPutsEntriesBackDueNow(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let held = try c.bring("backing-off", to: .running)
            try c.store.apply(
                [
                    .attempt(entryID: "backing-off", generation: held.generation, at: t0, payload: .object([]), requestID: "r"),
                    .reschedule(entryID: "backing-off", nextAttemptAt: t0 + 60_000, reason: "HTTP 503"),
                ], now: t0)
            try c.bring("parked", to: .awaitingAuth)
            try c.bring("failed", to: .error)
            try c.bring("busy", to: .running)
            let retried = try c.store.retry(
                ids: ["backing-off", "parked", "failed", "busy", "unknown"], key: nil, errors: false, now: t0 + 5)
            #expect(retried == ["backing-off", "parked", "failed"])
            for id in retried {
                let e = try c.get(id)
                #expect(e.state == .queued, "\(id)")
                #expect(e.attempts == 0, "\(id)")
                #expect(e.nextAttemptAt == t0 + 5, "\(id)")
                #expect(e.reason == nil, "\(id)")
            }
            #expect(try c.get("busy").state == .running)
            #expect(try c.store.dueEntries(now: t0 + 5, limit: 10, excluding: []).map(\.id) == ["backing-off", "parked", "failed"])
            // The error outcome already journaled is still owed to its hook.
            #expect(try c.store.unacknowledgedOutcomes().map(\.entryID) == ["failed"])
        }

        // A retry acts on entries as it read them: one a runner claimed since is left alone
        // (put back in the queue under its runner, it was sent again by another).
        @Test(arguments: StoreUnderTest.all)
        func aRetryLeavesAnEntryClaimedSinceItWasRead(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("x")
            try c.enqueue("y")
            let read = [try c.get("x"), try c.get("y")]
            try c.claim("x", lease: runnerB)
            #expect(try c.store.retry(asRead: read, now: t0 + 1) == ["y"])
            #expect(try c.get("x").state == .running)
        }

        @Test(arguments: StoreUnderTest.all)
        func retryByKeyAndOfErrors(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("n1", to: .error)
            try c.bring("t1", "text", #"{"t": "x"}"#, to: .error)
            try c.enqueue("n2")
            #expect(try c.store.retry(ids: nil, key: "note", errors: false, now: t0 + 1) == ["n1", "n2"])
            #expect(try c.get("t1").state == .error)
            #expect(try c.store.retry(ids: nil, key: nil, errors: true, now: t0 + 2) == ["t1"])
            #expect(try c.store.retry(ids: nil, key: nil, errors: true, now: t0 + 3) == [])
        }
    }

    /// Several runners on several hosts: claims are held by leases. A store one runner uses at
    /// a time (`StoreUnderTest.sharedByRunners` false) keeps none, and each test says what it
    /// does instead.
    struct Leases {
        // A claim records its runner, and a second runner's claim does not take the entry from it.
        @Test(arguments: StoreUnderTest.all)
        func aClaimBelongsToItsRunner(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("x")
            let seq = try c.get("x").seq
            try c.claim("x", lease: runnerA, now: t0)
            let other = try c.instance.another()
            try other.apply([.markRunning(entrySeqs: [seq], lease: runnerB)], now: t0 + 1)
            #expect(try c.get("x").state == .running)
            let owner = try c.get("x").leaseOwner
            if sut.sharedByRunners {
                #expect(owner == runnerA.owner)
            } else {
                #expect(owner == nil, StoreConformance.oneRunner)
            }
        }

        // Entries whose lease is still live are not abandoned: neither another runner's nor the caller's own.
        @Test(arguments: StoreUnderTest.all)
        func requeueAbandonedLeavesLiveLeases(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("a")
            try c.enqueue("b")
            let other = try c.instance.another()
            try c.claim("a", lease: runnerA, now: t0)
            try c.claim("b", lease: runnerB, now: t0, on: other)
            let requeued = try other.requeueAbandoned(lease: runnerB, now: t0 + 1_000)
            if sut.sharedByRunners {
                #expect(requeued == 0)
            } else {
                #expect(requeued == 2, StoreConformance.oneRunner)
            }
            #expect(try c.ids() == ["a", "b"])
        }

        // A runner whose lease ran out and whose entry another runner took settles nothing.
        @Test(arguments: StoreUnderTest.all)
        func aGoneRunnersSettleChangesNothing(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("x")
            let heldByA = try c.claim("x", lease: runnerA, now: t0)[0]
            let other = try c.instance.another()
            let later = t0 + runnerA.durationMs + 1
            #expect(try other.requeueAbandoned(lease: runnerB, now: later) == 1)
            try c.claim("x", lease: runnerB, now: later, on: other)
            // Runner A comes back from a long stall and reports its old result.
            try c.settle(heldByA, .completed, .completed, hook: true, by: runnerA, now: later + 1)
            let state = try c.get("x").state
            let journal = try c.journal("x")
            if sut.sharedByRunners {
                #expect(state == .running)
                #expect(journal == [])
            } else {
                #expect(state == .completed, StoreConformance.oneRunner)
                #expect(journal.count == 1, StoreConformance.oneRunner)
            }
        }
    }
}
