import Foundation
import OutboxModel
import OutboxStore
import Testing

extension StoreConformance {
    /// Chunked uploads: the parts of an entry and their acceptance are durable.
    struct Parts {
        // Parts are stored as planned, in order, none accepted yet.
        @Test(arguments: StoreUnderTest.all)
        func partsReadBackInOrder(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let new = try c.chunked("up")
            guard case let .parts(_, _, planned) = new.prepared.body else { throw ConformanceFailure("not a chunked body") }
            _ = try c.store.enqueue([new], now: t0)
            let e = try c.get("up")
            #expect(e.isChunked)
            #expect(e.totalBytes == 300)
            let parts = try c.store.parts(entrySeq: e.seq)
            #expect(parts.map(\.index) == [0, 1, 2])
            #expect(parts.map(\.range) == planned.map(\.range))
            #expect(
                parts.map(\.range) == [ByteRange(start: 0, end: 100), ByteRange(start: 100, end: 200), ByteRange(start: 200, end: 300)])
            #expect(parts.map(\.url) == ["https://a.example/parts/1", "https://a.example/parts/2", "https://a.example/parts/3"])
            #expect(parts.map { Conformance.headerLines($0.headers) } == planned.map { $0.headers.map { "\($0.name): \($0.value)" } })
            #expect(parts.map(\.accepted) == [false, false, false])
            #expect(parts.map(\.status) == [nil, nil, nil])
            #expect(parts.map(\.attempts) == [0, 0, 0])
            #expect(parts.map(\.nextAttemptAt) == [nil, nil, nil])
            #expect(try c.store.parts(entrySeq: 999_999).isEmpty)
        }

        // Acceptance and retries are committed: another process reads them back.
        @Test(arguments: StoreUnderTest.all)
        func partAcceptanceAndRetriesPersist(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            _ = try c.store.enqueue([try c.chunked("up")], now: t0)
            let seq = try c.claim("up")[0].seq
            try c.store.apply(
                [
                    .partAccepted(entrySeq: seq, index: 0, status: 200, headers: .object([("etag", .string("\"e0\""))])),
                    .partRetry(entrySeq: seq, index: 1, nextAttemptAt: t0 + 5_000, status: nil),
                ], now: t0 + 1)
            try c.store.apply(
                [
                    .partRetry(entrySeq: seq, index: 1, nextAttemptAt: t0 + 9_000, status: 503),
                    .partAccepted(entrySeq: seq, index: 2, status: 201, headers: .object([("etag", .string("\"e2\""))])),
                ], now: t0 + 2)
            let parts = try c.instance.another().parts(entrySeq: seq)
            #expect(parts.map(\.accepted) == [true, false, true])
            // A retried part keeps its last answer's status (null for no answer), for `show`.
            #expect(parts.map(\.status) == [200, 503, 201])
            #expect(parts.map(\.attempts) == [1, 2, 1])
            #expect(parts[1].nextAttemptAt == t0 + 9_000)
            #expect(parts[0].responseHeaders == .object([("etag", .string("\"e0\""))]))
            #expect(parts[2].responseHeaders == .object([("etag", .string("\"e2\""))]))
            #expect(parts[1].responseHeaders == nil)
            // Refused for good: the attempt and its status are kept; an accepted part is left as it is.
            try c.store.apply(
                [.partRefused(entrySeq: seq, index: 1, status: 422), .partRefused(entrySeq: seq, index: 0, status: 500)], now: t0 + 3)
            let refused = try c.instance.another().parts(entrySeq: seq)
            #expect(refused.map(\.status) == [200, 422, 201])
            #expect(refused.map(\.attempts) == [1, 3, 1])
            #expect(refused.map(\.accepted) == [true, false, true])
        }

        // An aborted upload is forgotten with the parts it accepted (a retry starts a new
        // one), unless the entry has started another upload since.
        @Test(arguments: StoreUnderTest.all)
        func anAbortedUploadIsForgottenWithItsParts(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            _ = try c.store.enqueue([try c.chunked("up")], now: t0)
            let seq = try c.claim("up")[0].seq
            try c.store.setS3UploadID(entrySeq: seq, "u-1")
            try c.store.apply(
                [.partAccepted(entrySeq: seq, index: 0, status: 200, headers: .object([("etag", .string("\"e0\""))]))], now: t0 + 1)
            // Another upload is the entry's now: forgetting the old one changes nothing.
            try c.store.setS3UploadID(entrySeq: seq, "u-2")
            try c.store.forgetS3Upload(entrySeq: seq, uploadID: "u-1")
            #expect(try c.instance.another().s3UploadID(entrySeq: seq) == "u-2")
            #expect(try c.store.parts(entrySeq: seq).map(\.accepted) == [true, false, false])

            try c.store.forgetS3Upload(entrySeq: seq, uploadID: "u-2")
            let other = try c.instance.another()
            #expect(try other.s3UploadID(entrySeq: seq) == nil)
            let parts = try other.parts(entrySeq: seq)
            #expect(parts.map(\.accepted) == [false, false, false])
            #expect(parts.map(\.status) == [nil, nil, nil])
            #expect(parts[0].responseHeaders == nil)
            #expect(parts.map(\.attempts) == [1, 0, 0], "attempts stay counted")
        }

        // A runner that is gone loses its claim, not the parts the server accepted.
        @Test(arguments: StoreUnderTest.all)
        func acceptedPartsSurviveRequeueAbandoned(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            _ = try c.store.enqueue([try c.chunked("up")], now: t0)
            let seq = try c.claim("up", lease: runnerA, now: t0)[0].seq
            try c.store.apply(
                [
                    .partAccepted(entrySeq: seq, index: 0, status: 200, headers: .object([])),
                    .partAccepted(entrySeq: seq, index: 2, status: 200, headers: .object([])),
                ], now: t0 + 1)
            let other = try c.instance.another()
            #expect(try other.requeueAbandoned(lease: runnerB, now: t0 + runnerA.durationMs + 1) == 1)
            let e = try c.get("up")
            #expect(e.state == .queued)
            #expect(try other.parts(entrySeq: e.seq).map(\.accepted) == [true, false, true])
        }

        // The same body again keeps accepted parts; a different body starts over.
        @Test(arguments: StoreUnderTest.all)
        func sameBodyKeepsAcceptedPartsAndADifferentOneResetsThem(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            _ = try c.store.enqueue([try c.chunked("up")], now: t0)
            let seq = try c.get("up").seq
            try c.store.apply([.partAccepted(entrySeq: seq, index: 1, status: 200, headers: .object([]))], now: t0)
            #expect(try c.store.enqueue([try c.chunked("up")], now: t0 + 1).map(\.decision) == [.resume])
            #expect(try c.store.parts(entrySeq: try c.get("up").seq).map(\.accepted) == [false, true, false])
            #expect(try c.store.enqueue([try c.chunked("up", host: "b.example")], now: t0 + 2).map(\.decision) == [.replace])
            let parts = try c.store.parts(entrySeq: try c.get("up").seq)
            #expect(parts.map(\.accepted) == [false, false, false])
            #expect(parts.map(\.url) == ["https://b.example/parts/1", "https://b.example/parts/2", "https://b.example/parts/3"])
        }

        // Pending totals count the accepted bytes of live entries only.
        @Test(arguments: StoreUnderTest.all)
        func pendingTotalsCountAcceptedPartBytes(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            _ = try c.store.enqueue([try c.chunked("a"), try c.chunked("b")], now: t0)
            let seq = try c.get("a").seq
            try c.store.apply(
                [
                    .partAccepted(entrySeq: seq, index: 0, status: 200, headers: .object([])),
                    .partAccepted(entrySeq: seq, index: 2, status: 200, headers: .object([])),
                ], now: t0)
            #expect(try c.store.pendingTotals(dueBy: nil) == PendingTotals(entries: 2, bytes: 600, acceptedBytes: 200))
            _ = try c.store.cancel(ids: ["a"], key: nil, now: t0 + 1)
            #expect(try c.store.pendingTotals(dueBy: nil) == PendingTotals(entries: 1, bytes: 300, acceptedBytes: 0))
        }
    }
}
