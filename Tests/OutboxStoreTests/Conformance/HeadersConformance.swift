import Foundation
import OutboxModel
import OutboxStore
import Testing

extension StoreConformance {
    /// `outbox headers update`: a patch over every entry's headers, ranking above all other sources.
    struct HeadersUpdate {
        // The patch is merged into every entry, whatever its state, and the header generation goes up.
        @Test(arguments: StoreUnderTest.all)
        func anUpdateMergesIntoEveryEntry(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let queued = try c.bring("q", "note", #"{"n": 1, "hv": "v1"}"#, to: .queued)
            let running = try c.bring("r", to: .running)
            let failed = try c.bring("e", to: .error)
            let patch = [("Authorization", "Bearer new"), ("x-version", "patched")]
            #expect(try c.store.updateHeaders(patch, now: t0 + 5) == 1)
            #expect(try c.store.control().headerGeneration == 1)
            for before in [queued, running, failed] {
                let e = try c.get(before.id)
                #expect(
                    Conformance.headerLines(e.request.headers) == Conformance.headerLines(HeaderRules.merge(before.request.headers, patch)))
                #expect(e.headerGeneration == 1)
                #expect(e.state == before.state)
                // A patch carries credentials: its names join the entry's secrets, never printed.
                #expect(e.request.secretHeaders.isSuperset(of: ["authorization", "x-version"]))
            }
            #expect(HeaderRules.value(try c.get("q").request.headers, "X-Version") == "patched")
        }

        // A second update bumps the generation again, and its patch ranks above the first.
        @Test(arguments: StoreUnderTest.all)
        func updatesStack(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("x")
            #expect(try c.store.updateHeaders([("Authorization", "Bearer one"), ("X-Tenant", "t")], now: t0 + 1) == 1)
            #expect(try c.store.updateHeaders([("authorization", "Bearer two")], now: t0 + 2) == 2)
            #expect(try c.instance.another().control().headerGeneration == 2)
            let e = try c.get("x")
            #expect(HeaderRules.value(e.request.headers, "Authorization") == "Bearer two")
            #expect(HeaderRules.value(e.request.headers, "X-Tenant") == "t")
            #expect(e.headerGeneration == 2)
        }

        // Every part of a chunked upload gets the patch too.
        @Test(arguments: StoreUnderTest.all)
        func anUpdateMergesIntoParts(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            _ = try c.store.enqueue([try c.chunked("up")], now: t0)
            let seq = try c.get("up").seq
            let before = try c.store.parts(entrySeq: seq)
            let patch = [("Authorization", "Bearer new")]
            _ = try c.store.updateHeaders(patch, now: t0 + 1)
            let after = try c.store.parts(entrySeq: seq)
            #expect(
                after.map { Conformance.headerLines($0.headers) }
                    == before.map { Conformance.headerLines(HeaderRules.merge($0.headers, patch)) })
            #expect(after.map(\.range) == before.map(\.range))
        }

        // Entries awaiting auth are queued again and due at the time of the update.
        @Test(arguments: StoreUnderTest.all)
        func anUpdateResumesEntriesAwaitingAuth(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("parked", to: .awaitingAuth)
            try c.enqueue("later", notBefore: t0 + 100_000)
            _ = try c.store.updateHeaders([("Authorization", "Bearer new")], now: t0 + 5_000)
            #expect(try c.get("parked").state == .queued)
            #expect(try c.dueIDs(at: t0 + 5_000) == ["parked"])
            #expect(try c.ids(ListFilter(state: "awaiting-auth")) == [])
        }

        // Entries enqueued after an update carry its patch, above their definition's headers.
        @Test(arguments: StoreUnderTest.all)
        func entriesEnqueuedAfterAnUpdateCarryThePatch(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("old", "note", #"{"n": 1, "hv": "a"}"#)
            _ = try c.store.updateHeaders([("X-Token", "t2"), ("X-Version", "patched")], now: t0 + 1)
            try c.enqueue("new", "note", #"{"n": 2, "hv": "b"}"#, now: t0 + 2)
            let new = try c.get("new")
            #expect(HeaderRules.value(new.request.headers, "X-Token") == "t2")
            #expect(HeaderRules.value(new.request.headers, "X-Version") == "patched")
            #expect(new.headerGeneration == 1)
            #expect(new.request.secretHeaders.isSuperset(of: ["x-token", "x-version"]))
            // A resume takes the definition's headers again, and the patch still ranks above them.
            #expect(try c.enqueue("old", "note", #"{"n": 1, "hv": "c"}"#, now: t0 + 3) == .resume)
            let old = try c.get("old")
            #expect(HeaderRules.value(old.request.headers, "X-Token") == "t2")
            #expect(HeaderRules.value(old.request.headers, "X-Version") == "patched")
            #expect(old.request.secretHeaders.isSuperset(of: ["x-token", "x-version"]))
            #expect(old.headerGeneration == 1)
        }
    }
}
