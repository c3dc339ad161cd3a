import Foundation
import OutboxModel
import OutboxStore
import Testing

extension StoreConformance {
    /// Enqueue and the reads: entries come back whole, in order, filtered; counts and totals.
    struct EnqueueAndRead {
        // A stored entry is what was enqueued: nothing lost or defaulted on the way.
        @Test(arguments: StoreUnderTest.all)
        func anEntryComesBackWhole(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let new = try c.entry("a-1", "note", #"{"n": 7, "hv": "v2"}"#, notBefore: t0 + 500, parent: "p-0")
            #expect(try c.store.enqueue([new], now: t0) == [EnqueueResult(id: "a-1", decision: .create)])
            let e = try c.get("a-1")
            #expect(e.id == "a-1")
            #expect(e.key == "note")
            #expect(e.vars == .object([("n", .number("7")), ("hv", .string("v2"))]))
            #expect(e.state == .queued)
            #expect(e.reason == nil)
            #expect(e.generation == 1)
            #expect(e.request.bodyKind == .data)
            #expect(Conformance.bytes(e.body) == Array(#"{"n":7}"#.utf8))
            #expect(e.totalBytes == 7)
            #expect(e.bytesSent == 0)
            #expect(e.attempts == 0)
            #expect(e.request.method == "POST")
            #expect(e.request.url == "https://x.example/notes/7")
            #expect(HeaderRules.value(e.request.headers, "X-Version") == "v2")
            #expect(e.request.text == StoredRequest(prepared: new.prepared, form: []).text)
            #expect(e.bodyHash == new.prepared.bodyHash)
            #expect(e.idempotencyKey == new.prepared.idempotencyKey)
            #expect(e.parent == "p-0")
            #expect(e.scope == nil)
            #expect(e.notBefore == t0 + 500)
            #expect(e.expiresAt == t0 + new.prepared.expiresInMs)
            #expect(e.createdAt == t0)
            #expect(e.updatedAt == t0)
            #expect(e.headerGeneration == 0)
            #expect(!e.waitsForDelivery)
        }

        // An explicit expiry and a scope are kept as given.
        @Test(arguments: StoreUnderTest.all)
        func anExplicitExpiryAndAScopeAreKept(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            _ = try c.store.enqueue([try c.entry("s-1", "scoped", #"{"n": 1, "s": "album-9"}"#, expiresAt: t0 + 42)], now: t0)
            let e = try c.get("s-1")
            #expect(e.expiresAt == t0 + 42)
            #expect(e.scope == "album-9")
            // A scope that renders empty is none: such entries do not wait for each other.
            _ = try c.store.enqueue([try c.entry("s-2", "scoped", #"{"n": 2, "s": ""}"#)], now: t0)
            #expect(try c.get("s-2").scope == nil)
        }

        // A body too large for a row reads back byte for byte, wherever the store keeps it.
        @Test(arguments: StoreUnderTest.all)
        func aLargeTextBodyReadsBackWhole(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let text = String(repeating: "0123456789", count: 20_000)
            try c.enqueue("big", "text", #"{"t": "\#(text)"}"#)
            let e = try c.get("big")
            #expect(e.request.bodyKind == .text)
            #expect(Conformance.bytes(e.body) == Array(text.utf8))
            #expect(e.totalBytes == 200_000)
        }

        // A copied file is the store's own copy: the bytes at enqueue, whatever the user does next.
        @Test(arguments: StoreUnderTest.all)
        func aCopiedFileBodyKeepsTheBytesOfEnqueue(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let source = try c.userFile("photo.bin", "original bytes")
            try c.enqueue("f", "copy", #"{"path": "photo.bin"}"#)
            try "changed later".write(toFile: source, atomically: false, encoding: .utf8)
            let e = try c.get("f")
            #expect(e.request.bodyKind == .file)
            #expect(e.request.ownership == .copy)
            #expect(e.request.file?.path == source)
            #expect(e.request.method == "PUT")
            #expect(Conformance.bytes(e.body) == Array("original bytes".utf8))
            #expect(e.totalBytes == 14)
        }

        // The queue order is the enqueue order, across batches and within one, not id order.
        @Test(arguments: StoreUnderTest.all)
        func listIsInEnqueueOrder(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("c", now: t0)
            try c.enqueue("a", now: t0 + 1)
            _ = try c.store.enqueue([try c.entry("e"), try c.entry("b"), try c.entry("d")], now: t0 + 2)
            #expect(try c.ids() == ["c", "a", "e", "b", "d"])
            #expect(try c.store.list(ListFilter()).map(\.seq) == (try c.store.list(ListFilter()).map(\.seq).sorted()))
        }

        // Each filter field narrows the list; the limit takes the first in queue order.
        @Test(arguments: StoreUnderTest.all)
        func listFiltersByKeyIdStateAndLimit(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("n1")
            try c.enqueue("t1", "text", #"{"t": "x"}"#)
            try c.enqueue("n2")
            try c.enqueue("n3")
            try c.claim("n2")
            #expect(try c.ids(ListFilter(key: "note")) == ["n1", "n2", "n3"])
            #expect(try c.ids(ListFilter(key: "text")) == ["t1"])
            #expect(try c.ids(ListFilter(id: "n3")) == ["n3"])
            #expect(try c.ids(ListFilter(id: "missing")) == [])
            #expect(try c.ids(ListFilter(state: "running")) == ["n2"])
            #expect(try c.ids(ListFilter(state: "queued")) == ["n1", "t1", "n3"])
            #expect(try c.ids(ListFilter(limit: 2)) == ["n1", "t1"])
            #expect(try c.ids(ListFilter(key: "note", state: "queued", limit: 1)) == ["n1"])
        }

        // A var that went into a secret header is redacted in `list --json` rows, as in the
        // entry's own list row, before and after other entries; the other vars stay readable.
        @Test(arguments: StoreUnderTest.all)
        func listRowsRedactVarsThatFedASecretHeader(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("n1")
            try c.enqueue("b1", "bearer", #"{"token": "tok-5521af", "who": "me"}"#)
            try c.enqueue("n2")
            var text = ""
            try c.store.writeListRows(ListFilter(), displayState: { state, _ in state }) { text += $0 }
            #expect(!text.contains("tok-5521af"), "\(text)")
            let rows = try #require(try JSON.parse(text).arrayValue)
            #expect(rows.map { $0["id"]?.stringValue } == ["n1", "b1", "n2"])
            #expect(rows[1]["vars"] == .object([("token", .string("[redacted]")), ("who", .string("me"))]))
            #expect(rows[1] == (try c.get("b1")).listJSON(displayState: "queued"))
            #expect(rows[0]["vars"] == .object([("n", .int(1))]))
        }

        // Rows of any length come out whole: a vars text larger than the writer's first buffer,
        // strings that need escapes (vars and a reason), and enough rows to be handed over in several pieces.
        @Test(arguments: StoreUnderTest.all)
        func listRowsOfAnyLengthAreWholeJSON(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let long = String(repeating: "a\"b\\c\u{1}d\u{202E}e", count: 30_000)
            try c.enqueue("big", "note", JSON.object([("n", .int(1)), ("long", .string(long))]).serialized())
            let ids = (0..<1_500).map { "n\($0)" }
            for id in ids { try c.enqueue(id, "note", #"{"quote": "\"", "n": -12}"#) }
            try c.claim("n7")
            let reason = "said \"no\"\n\u{202E}\\"
            try c.store.apply(
                [.reschedule(entryID: "n7", nextAttemptAt: StoreConformance.t0 + 5_000, reason: reason)], now: StoreConformance.t0)
            var text = ""
            var pieces = 0
            try c.store.writeListRows(ListFilter(), displayState: { state, _ in state }) {
                text += $0
                pieces += 1
            }
            #expect(pieces > 2)
            let rows = try #require(try JSON.parse(text).arrayValue)
            #expect(rows.map { $0["id"]?.stringValue } == ["big"] + ids)
            #expect(rows[0]["vars"]?["long"]?.stringValue == long)
            #expect(rows[0] == (try c.get("big")).listJSON(displayState: "queued"))
            #expect(rows[1_500] == (try c.get("n1499")).listJSON(displayState: "queued"))
            #expect(rows[8]["reason"]?.stringValue == reason)
            #expect(rows[8] == (try c.get("n7")).listJSON(displayState: "queued"))
        }

        // `list --json` rows are the entries' list rows, with the state as displayed, filtered like `list`.
        @Test(arguments: StoreUnderTest.all)
        func listRowsAreTheEntriesAsDisplayed(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("n1", "note", #"{"n": 1, "hv": "\"quoted\""}"#)
            try c.enqueue("t1", "text", #"{"t": "x"}"#)
            try c.enqueue("n2")
            try c.claim("n2")
            // Text entries show as paused, as for a paused key.
            let display: (String, String) -> String = { state, key in key == "text" && state == "queued" ? "paused" : state }
            func rows(_ filter: ListFilter) throws -> JSON {
                var text = ""
                try c.store.writeListRows(filter, displayState: display) { text += $0 }
                return try JSON.parse(text)
            }
            func expected(_ ids: [String]) throws -> JSON {
                .array(
                    try ids.map { id in
                        let e = try c.get(id)
                        return e.listJSON(displayState: display(e.state.rawValue, e.key))
                    })
            }
            #expect(try rows(ListFilter()) == (try expected(["n1", "t1", "n2"])))
            #expect(try rows(ListFilter(key: "note")) == (try expected(["n1", "n2"])))
            #expect(try rows(ListFilter(id: "t1")) == (try expected(["t1"])))
            #expect(try rows(ListFilter(state: "paused")) == (try expected(["t1"])))
            #expect(try rows(ListFilter(state: "queued")) == (try expected(["n1"])))
            #expect(try rows(ListFilter(state: "running")) == (try expected(["n2"])))
            #expect(try rows(ListFilter(limit: 2)) == (try expected(["n1", "t1"])))
        }

        // Counts are by stored state, with the outcomes still owed to a hook.
        @Test(arguments: StoreUnderTest.all)
        func countsAreByStateWithPendingOutcomes(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            #expect(try c.store.counts().states.filter { $0.value != 0 } == [:])
            #expect(try c.store.counts().pendingOutcomes == 0)
            try c.bring("q", to: .queued)
            try c.bring("r", to: .running)
            try c.bring("p", to: .awaitingAuth)
            try c.bring("e", to: .error)
            try c.bring("d", to: .completed)
            // An error settled with no hook keeps its row; its outcome is owed to no one.
            try c.settle(try c.claim(try c.bring("e2", to: .queued).id)[0], .error, .error, hook: false)
            let counts = try c.store.counts()
            #expect(counts.states.filter { $0.value != 0 } == [.queued: 1, .running: 1, .awaitingAuth: 1, .error: 2, .completed: 1])
            #expect(counts.pendingOutcomes == 2)
            #expect(counts.remaining == 5)
        }

        // The live display's totals: entries not settled, their bytes, and accepted part bytes.
        @Test(arguments: StoreUnderTest.all)
        func pendingTotalsCountEntriesNotSettled(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            #expect(try c.store.pendingTotals(dueBy: nil) == PendingTotals(entries: 0, bytes: 0, acceptedBytes: 0))
            try c.bring("q", "text", #"{"t": "0123456789"}"#, to: .queued)
            try c.bring("r", "text", #"{"t": "01234567890123456789"}"#, to: .running)
            try c.bring("p", "text", #"{"t": "012345678901234567890123456789"}"#, to: .awaitingAuth)
            try c.bring("e", "text", #"{"t": "0123456789012345678901234567890123456789"}"#, to: .error)
            try c.bring("d", "text", #"{"t": "01234567890123456789012345678901234567890123456789"}"#, to: .completed)
            #expect(try c.store.pendingTotals(dueBy: nil) == PendingTotals(entries: 3, bytes: 60, acceptedBytes: 0))
            // A drain's totals: what it sends by its horizon, not parked, delayed or paused entries.
            #expect(try c.store.pendingTotals(dueBy: t0) == PendingTotals(entries: 2, bytes: 30, acceptedBytes: 0))
            try c.enqueue("later", "text", #"{"t": "0123"}"#, notBefore: t0 + 60_000)
            #expect(try c.store.pendingTotals(dueBy: t0 + 59_999) == PendingTotals(entries: 2, bytes: 30, acceptedBytes: 0))
            #expect(try c.store.pendingTotals(dueBy: t0 + 60_000) == PendingTotals(entries: 3, bytes: 34, acceptedBytes: 0))
            try c.store.setPaused(keys: ["text"], paused: true)
            #expect(try c.store.pendingTotals(dueBy: t0 + 60_000) == PendingTotals(entries: 1, bytes: 20, acceptedBytes: 0))
            try c.store.setPaused(keys: ["text"], paused: false)
            try c.store.setQueuePaused(true)
            #expect(try c.store.pendingTotals(dueBy: t0 + 60_000) == PendingTotals(entries: 1, bytes: 20, acceptedBytes: 0))
            #expect(try c.store.pendingTotals(dueBy: nil) == PendingTotals(entries: 4, bytes: 64, acceptedBytes: 0))
        }
    }
}
