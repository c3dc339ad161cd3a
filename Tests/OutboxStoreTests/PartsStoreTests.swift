import Foundation
@testable import OutboxModel
@testable import OutboxStore
import Testing

// The store's side of chunked uploads: accepted parts are durable, survive a
// runner that died, and survive a same-id enqueue with the same body.

/// A temp folder with a store and a file to upload; removed on deinit.
final class PartsStoreFixture {
    let folder: String
    let file: String
    let size: Int64

    init(size: Int64 = 300) throws {
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("outbox-parts-store-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        file = folder + "/upload.bin"
        self.size = size
        try Data(repeating: 7, count: Int(size)).write(to: URL(fileURLWithPath: file))
    }

    deinit { try? FileManager.default.removeItem(atPath: folder) }

    func store() throws -> SQLiteStore { try SQLiteStore(folder: folder + "/.outbox") }

    /// A chunked entry of three parts; `host` changes its URLs (so its body).
    func entry(id: String, ownership: Ownership, host: String = "a.example", identity: FileIdentity? = nil) throws -> NewEntry {
        let fileID: FileIdentity
        if let identity {
            fileID = identity
        } else {
            let info = try #require(FileInfo.stat(file))
            fileID = FileIdentity(path: file, size: info.size, mtimeNs: info.mtimeNs, inode: info.inode)
        }
        let parts = [(0, 100), (100, 200), (200, 300)].enumerated().map { n, range in
            PreparedPart(range: ByteRange(start: Int64(range.0), end: Int64(range.1)), url: "https://\(host)/part/\(n + 1)", headers: [])
        }
        let prepared = PreparedRequest(
            method: "PUT", url: nil, headers: [("Content-Type", "application/octet-stream")],
            body: .parts(fileID, ownership, parts), accept: [], retry: RetryRules(), expiresInMs: 86_400_000,
            response: .raw, scope: nil, cancelScopeOnError: false, followRedirects: 0, wifiOnly: nil, idempotencyKey: "k-\(id)")
        return NewEntry(id: id, key: "up", vars: .object([]), prepared: prepared)
    }
}

@Suite struct PartsStoreTests {
    @Test func acceptedPartsSurviveARunnerThatDied() throws {
        let fixture = try PartsStoreFixture()
        let now: Int64 = 1_800_000_000_000
        do {
            let store = try fixture.store()
            _ = try store.enqueue([try fixture.entry(id: "up-1", ownership: .reference)], now: now)
            let seq = try #require(try store.entry(id: "up-1")).seq
            try store.apply([.markRunning(entrySeqs: [seq], lease: Lease(owner: "runner-that-died"))], now: now)
            try store.apply(
                [
                    .partAccepted(entrySeq: seq, index: 0, status: 200, headers: .object([("etag", .string("\"e0\""))])),
                    .partRetry(entrySeq: seq, index: 1, nextAttemptAt: now + 5000, status: nil),
                    .partAccepted(entrySeq: seq, index: 2, status: 201, headers: .object([("etag", .string("\"e2\""))])),
                ],
                now: now)
        }
        // A new process opens the store; the old runner's lease is stale.
        let store = try fixture.store()
        #expect(try store.entry(id: "up-1")?.state == .running)
        #expect(try store.requeueAbandoned(lease: Lease(owner: "next-runner"), now: now + 1000) == 1)
        let entry = try #require(try store.entry(id: "up-1"))
        #expect(entry.state == .queued)
        let parts = try store.parts(entrySeq: entry.seq)
        #expect(parts.map(\.accepted) == [true, false, true])
        #expect(parts.map(\.status) == [200, nil, 201])
        #expect(parts.map(\.attempts) == [1, 1, 1])
        #expect(parts[1].nextAttemptAt == now + 5000)
        #expect(parts[2].responseHeaders?["etag"]?.stringValue == "\"e2\"")
    }

    @Test func sameBodyAgainKeepsAcceptedPartsAndADifferentOneResetsThem() throws {
        let fixture = try PartsStoreFixture()
        let store = try fixture.store()
        let now: Int64 = 1_800_000_000_000
        _ = try store.enqueue([try fixture.entry(id: "up-2", ownership: .reference)], now: now)
        let seq = try #require(try store.entry(id: "up-2")).seq
        try store.apply([.partAccepted(entrySeq: seq, index: 1, status: 200, headers: .object([]))], now: now)

        let resumed = try store.enqueue([try fixture.entry(id: "up-2", ownership: .reference)], now: now + 1)
        #expect(resumed.map(\.decision) == [.resume])
        let kept = try #require(try store.entry(id: "up-2"))
        #expect(try store.parts(entrySeq: kept.seq).map(\.accepted) == [false, true, false])

        let replaced = try store.enqueue([try fixture.entry(id: "up-2", ownership: .reference, host: "b.example")], now: now + 2)
        #expect(replaced.map(\.decision) == [.replace])
        let fresh = try #require(try store.entry(id: "up-2"))
        let parts = try store.parts(entrySeq: fresh.seq)
        #expect(parts.map(\.accepted) == [false, false, false])
        #expect(parts.map(\.url) == ["https://b.example/part/1", "https://b.example/part/2", "https://b.example/part/3"])
        // The replaced entry's parts went with its row.
        #expect(try store.audit() == [])
    }

    /// A file moved into the store has left its folder: a replacing body that names the same
    /// source path reuses the staged bytes instead of failing with a missing file.
    @Test func replacingAMovedFileReusesTheStagedBytes() throws {
        let fixture = try PartsStoreFixture()
        let store = try fixture.store()
        let now: Int64 = 1_800_000_000_000
        let first = try fixture.entry(id: "up-3", ownership: .move)
        _ = try store.enqueue([first], now: now)
        #expect(!FileManager.default.fileExists(atPath: fixture.file))
        let staged = try #require(try store.entry(id: "up-3")?.bodyFile)
        guard case let .parts(identity, _, _) = first.prepared.body else { Issue.record("not a parts body"); return }

        let results = try store.enqueue(
            [try fixture.entry(id: "up-3", ownership: .move, host: "b.example", identity: identity)], now: now + 1)
        #expect(results.map(\.decision) == [.replace])
        let entry = try #require(try store.entry(id: "up-3"))
        #expect(entry.bodyFile == staged)
        #expect(FileManager.default.fileExists(atPath: staged))
        #expect(try store.audit() == [])
    }

    @Test func pendingTotalsCountLiveEntriesAndTheirAcceptedParts() throws {
        let fixture = try PartsStoreFixture()
        let store = try fixture.store()
        let now: Int64 = 1_800_000_000_000
        #expect(try store.pendingTotals() == PendingTotals(entries: 0, bytes: 0, acceptedBytes: 0))
        _ = try store.enqueue(
            [try fixture.entry(id: "a", ownership: .reference), try fixture.entry(id: "b", ownership: .reference)], now: now)
        let seq = try #require(try store.entry(id: "a")).seq
        try store.apply(
            [
                .partAccepted(entrySeq: seq, index: 0, status: 200, headers: .object([])),
                .partAccepted(entrySeq: seq, index: 2, status: 200, headers: .object([])),
            ], now: now)
        #expect(try store.pendingTotals() == PendingTotals(entries: 2, bytes: 600, acceptedBytes: 200))
        _ = try store.cancel(ids: ["a"], key: nil, now: now)
        #expect(try store.pendingTotals() == PendingTotals(entries: 1, bytes: 300, acceptedBytes: 0))
    }
}
