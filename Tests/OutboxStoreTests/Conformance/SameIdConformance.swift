import Foundation
import OutboxModel
import OutboxStore
import Testing

extension StoreConformance {
    /// Each row of the same-id table (SameIdRule), through the store: the decision and the row it leaves.
    struct SameId {
        // No entry with the id: a new one, generation 1.
        @Test(arguments: StoreUnderTest.all)
        func aNewIdIsCreated(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            #expect(try c.enqueue("x") == .create)
            let e = try c.get("x")
            #expect(e.state == .queued)
            #expect(e.generation == 1)
        }

        // A completed entry whose outcome nobody waits for is forgotten: its id starts afresh.
        @Test(arguments: StoreUnderTest.all)
        func aCompletedAcknowledgedIdIsCreatedAfresh(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let held = try c.claim(try c.bring("x", to: .queued).id)[0]
            try c.store.apply([.attempt(entryID: "x", generation: 1, at: t0, payload: .object([]), requestID: "r1")], now: t0)
            try c.settle(held, .completed, .completed, hook: false)
            #expect(try c.enqueue("x", now: t0 + 10) == .create)
            let e = try c.get("x")
            #expect(e.state == .queued)
            #expect(e.generation == 1)
            #expect(e.attempts == 0)
            #expect(e.createdAt == t0 + 10)
            #expect(try c.journal("x") == [])
        }

        // A cancelled entry whose outcome was delivered is forgotten too.
        @Test(arguments: StoreUnderTest.all)
        func aCancelledAcknowledgedIdIsCreatedAfresh(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .cancelled)
            try c.store.acknowledge(seq: try c.pending("x").seq, followUps: [], now: t0 + 1)
            #expect(try c.enqueue("x", "note", #"{"n": 2}"#, now: t0 + 2) == .create)
            let e = try c.get("x")
            #expect(e.state == .queued)
            #expect(e.generation == 1)
            #expect(e.request.url == "https://x.example/notes/2")
        }

        // Same body on a queued entry: the entry stays (progress, attempts) and takes the new vars, headers and expiry.
        @Test(arguments: StoreUnderTest.all)
        func sameBodyResumesAQueuedEntry(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            _ = try c.store.enqueue([try c.entry("x", "note", #"{"n": 1, "hv": "a"}"#, expiresAt: t0 + 50_000)], now: t0)
            try c.claim("x")
            try c.store.apply(
                [
                    .attempt(entryID: "x", generation: 1, at: t0, payload: .object([]), requestID: "r1"),
                    .progress(entryID: "x", bytesSent: 3), .requeue(entryID: "x"),
                ], now: t0)
            let before = try c.get("x")
            let results = try c.store.enqueue([try c.entry("x", "note", #"{"n": 1, "hv": "b"}"#, expiresAt: t0 + 90_000)], now: t0 + 5)
            #expect(results == [EnqueueResult(id: "x", decision: .resume)])
            let e = try c.get("x")
            #expect(e.seq == before.seq)
            #expect(e.state == .queued)
            #expect(e.generation == 1)
            #expect(e.vars == .object([("n", .number("1")), ("hv", .string("b"))]))
            #expect(HeaderRules.value(e.request.headers, "X-Version") == "b")
            #expect(e.expiresAt == t0 + 90_000)
            #expect(e.attempts == 1)
            #expect(e.bytesSent == 3)
            #expect(e.bodyHash == before.bodyHash)
            #expect(e.idempotencyKey == before.idempotencyKey)
            #expect(e.createdAt == t0)
        }

        // Same body on a running entry: the attempt in flight carries on; new headers apply from the next one.
        @Test(arguments: StoreUnderTest.all)
        func sameBodyResumesARunningEntryWithoutStoppingIt(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let running = try c.bring("x", "note", #"{"n": 1, "hv": "a"}"#, to: .running)
            #expect(try c.enqueue("x", "note", #"{"n": 1, "hv": "b"}"#, now: t0 + 5) == .resume)
            let e = try c.get("x")
            #expect(e.state == .running)
            #expect(HeaderRules.value(e.request.headers, "X-Version") == "b")
            #expect(try c.store.runningGenerations(seqs: [running.seq]) == [running.seq: 1])
            // The runner holding it reads the new vars for its outcome.
            #expect(try c.store.currentVars(seqs: [running.seq, 999_999]) == [running.seq: try JSON.parse(#"{"n": 1, "hv": "b"}"#)])
        }

        // Same body on an entry awaiting auth: it keeps waiting (only a headers update resumes it).
        @Test(arguments: StoreUnderTest.all)
        func sameBodyResumesAParkedEntryWhereItIs(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .awaitingAuth)
            #expect(try c.enqueue("x", now: t0 + 5) == .resume)
            #expect(try c.get("x").state == .awaitingAuth)
            #expect(try c.dueIDs(at: t0 + 10_000_000) == [])
        }

        // A different body on a queued entry replaces it: new body, progress reset, still generation 1.
        @Test(arguments: StoreUnderTest.all)
        func aDifferentBodyReplacesAQueuedEntry(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("x", "text", #"{"t": "old body"}"#)
            try c.claim("x")
            try c.store.apply(
                [
                    .attempt(entryID: "x", generation: 1, at: t0, payload: .object([]), requestID: "r1"),
                    .progress(entryID: "x", bytesSent: 4), .requeue(entryID: "x"),
                ], now: t0)
            #expect(try c.enqueue("x", "text", #"{"t": "the new body"}"#, now: t0 + 5) == .replace)
            let e = try c.get("x")
            #expect(e.state == .queued)
            #expect(e.generation == 1)
            #expect(Conformance.bytes(e.body) == Array("the new body".utf8))
            #expect(e.totalBytes == 12)
            #expect(e.attempts == 0)
            #expect(e.bytesSent == 0)
            #expect(try c.ids() == ["x"])
            #expect(try c.dueIDs(at: t0 + 5) == ["x"])
        }

        // A different body on an entry awaiting auth replaces it and queues it again.
        @Test(arguments: StoreUnderTest.all)
        func aDifferentBodyReplacesAParkedEntryAndQueuesIt(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .awaitingAuth)
            #expect(try c.enqueue("x", "note", #"{"n": 2}"#, now: t0 + 5) == .replace)
            let e = try c.get("x")
            #expect(e.state == .queued)
            #expect(e.request.url == "https://x.example/notes/2")
            #expect(try c.dueIDs(at: t0 + 5) == ["x"])
        }

        // Pause is a flag of the key, not of the entry: a replaced entry of a paused key stays held.
        @Test(arguments: StoreUnderTest.all)
        func aReplacedEntryOfAPausedKeyStaysHeld(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("x")
            try c.store.setPaused(keys: ["note"], paused: true)
            #expect(try c.enqueue("x", "note", #"{"n": 2}"#, now: t0 + 5) == .replace)
            #expect(try c.dueIDs(at: t0 + 5) == [])
            try c.store.setPaused(keys: ["note"], paused: false)
            #expect(try c.dueIDs(at: t0 + 5) == ["x"])
        }

        // A different body on a running entry is E_RUNNING, and the whole batch leaves the store as it was.
        @Test(arguments: StoreUnderTest.all)
        func aDifferentBodyOnARunningEntryIsRejected(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let before = try c.bring("x", "note", #"{"n": 1, "hv": "a"}"#, to: .running)
            let batch = [try c.entry("fresh"), try c.entry("x", "note", #"{"n": 2, "hv": "b"}"#)]
            let error = #expect(throws: OutboxError.self) { try c.store.enqueue(batch, now: t0 + 5) }
            #expect(error?.code == .running)
            #expect(error?.message.contains("x") == true)
            let e = try c.get("x")
            #expect(e.state == .running)
            #expect(e.generation == 1)
            #expect(e.vars == before.vars)
            #expect(e.bodyHash == before.bodyHash)
            #expect(e.request.text == before.request.text)
            #expect(e.updatedAt == before.updatedAt)
            #expect(try c.ids() == ["x"])
        }

        // Same body on an error entry reopens it: queued again, due now, attempts from zero, same generation.
        @Test(arguments: StoreUnderTest.all)
        func sameBodyReopensAnErrorEntry(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .error)
            #expect(try c.enqueue("x", now: t0 + 5) == .reopen)
            let e = try c.get("x")
            #expect(e.state == .queued)
            #expect(e.reason == nil)
            #expect(e.generation == 1)
            #expect(e.attempts == 0)
            #expect(try c.dueIDs(at: t0 + 5) == ["x"])
            // The error outcome is still delivered, on its own.
            #expect(try c.journal("x") == ["x g1 error pending"])
        }

        // A different body on an error entry replaces it as a new generation; the old outcome is still owed.
        @Test(arguments: StoreUnderTest.all)
        func aDifferentBodyReplacesAnErrorEntryAsANewGeneration(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .error)
            #expect(try c.enqueue("x", "note", #"{"n": 2}"#, now: t0 + 5) == .replace)
            let e = try c.get("x")
            #expect(e.state == .queued)
            #expect(e.generation == 2)
            #expect(e.request.url == "https://x.example/notes/2")
            #expect(try c.dueIDs(at: t0 + 5) == ["x"])
            #expect(try c.journal("x") == ["x g1 error pending"])
        }

        // Same body on a completed entry whose outcome is not delivered yet: no new attempt, the outcome is delivered.
        @Test(arguments: StoreUnderTest.all)
        func sameBodyOnACompletedEntryRedelivers(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let before = try c.bring("x", to: .completed)
            #expect(try c.enqueue("x", now: t0 + 5) == .redeliver)
            let e = try c.get("x")
            #expect(e.state == .completed)
            #expect(e.generation == 1)
            #expect(e.bodyHash == before.bodyHash)
            #expect(try c.dueIDs(at: t0 + 5) == [])
            #expect(try c.journal("x") == ["x g1 completed pending"])
            #expect(try c.store.deliverableOutcomes(now: t0 + 5, keys: ["note"], excludingIDs: [], limit: nil).map(\.entryID) == ["x"])
        }

        // A different body on such an entry is a new generation that waits until the old outcome is delivered.
        @Test(arguments: StoreUnderTest.all)
        func aDifferentBodyOnACompletedEntryWaitsForDelivery(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .completed)
            #expect(try c.enqueue("x", "note", #"{"n": 2}"#, now: t0 + 5) == .replaceAfterDelivery)
            let e = try c.get("x")
            #expect(e.state == .queued)
            #expect(e.generation == 2)
            #expect(e.waitsForDelivery)
            #expect(e.request.url == "https://x.example/notes/2")
            #expect(try c.dueIDs(at: t0 + 10_000_000) == [])
            #expect(try c.journal("x") == ["x g1 completed pending"])
        }

        // A cancelled entry not yet acknowledged starts a new generation with whatever body it is given.
        @Test(arguments: StoreUnderTest.all)
        func aCancelledUnacknowledgedEntryStartsANewGeneration(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("same", to: .cancelled)
            try c.bring("other", to: .cancelled)
            #expect(try c.enqueue("same", now: t0 + 5) == .newGeneration)
            #expect(try c.enqueue("other", "note", #"{"n": 2}"#, now: t0 + 5) == .newGeneration)
            let same = try c.get("same")
            let other = try c.get("other")
            #expect([same.state, other.state] == [.queued, .queued])
            #expect([same.generation, other.generation] == [2, 2])
            #expect(other.request.url == "https://x.example/notes/2")
            #expect(try c.dueIDs(at: t0 + 5) == ["same", "other"])
            // The cancelled generation's outcome is still owed to its hook.
            #expect(try c.pendingJournal() == ["same g1 error pending", "other g1 error pending"])
        }
    }
}
