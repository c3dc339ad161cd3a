import Foundation
import OutboxModel
@testable import OutboxStore
import Testing

/// `store copy` reads the source a chunk at a time: tables past the chunk's size (entries,
/// parts keyed by two columns, outcomes) arrive whole and in order, SQLite to PostgreSQL and back.
struct StoreCopyChunkTests {
    /// Every row of every copied table, as text, the source's staged-body folder named as the target's.
    static func rows(_ store: any Store, bodies: (from: String, to: String)? = nil) throws -> [String: [String]] {
        let copyable = try #require(store as? any CopyableStore)
        var tables: [String: [String]] = [:]
        for table in StoreTables.tables {
            var rows: [String] = []
            try copyable.forEachRowChunk(table) { (chunk) throws(OutboxError) in rows += chunk.map { "\($0)" } }
            if let bodies { rows = rows.map { $0.replacingOccurrences(of: bodies.from + "/", with: bodies.to + "/") } }
            tables[table.name] = rows
        }
        return tables
    }

    @Test(arguments: StoreUnderTest.all)
    func tablesPastTheChunkSizeArriveWhole(_ sut: StoreUnderTest) throws {
        let c = try Conformance(sut)
        let notes = try (1...1_100).map { n in try c.entry("n-\(n)", "note", #"{"n": \#(n)}"#) }
        let uploads = try (1...340).map { n in try c.chunked("u-\(n)") }
        _ = try c.store.enqueue(notes + uploads, now: StoreConformance.t0)
        // 1,050 outcomes owed to a hook.
        let settled = try notes.prefix(1_050).map { try c.get($0.id) }
        try c.store.apply([.markRunning(entrySeqs: settled.map(\.seq), lease: StoreConformance.runnerA)], now: StoreConformance.t0)
        let held = settled.map { e in
            var running = e
            running.state = .running
            return RunnerChange.settle(c.settlement(running, .completed, .completed))
        }
        try c.store.apply(held, by: nil, now: StoreConformance.t0 + 1)
        try c.store.setPaused(keys: ["note"], paused: true)

        let targetKind: StoreUnderTest = sut == .sqlite ? .postgres : .sqlite
        let target = try targetKind.make()
        let summary = try StoreCopy.copy(from: c.store, to: { () throws(OutboxError) -> any Store in target.store }, targetName: "target")
        #expect(summary.entries == 1_440)
        #expect(summary.outcomes == 1_050)

        let source = try #require(c.store as? any CopyableStore)
        let copied = try #require(target.store as? any CopyableStore)
        let before = try Self.rows(c.store, bodies: (source.bodiesFolder, copied.bodiesFolder))
        let after = try Self.rows(target.store)
        // Counted by other reads than the copy's.
        #expect(before["parts"]?.count == 1_020)
        #expect(try target.store.list(ListFilter()).count == 1_440)
        #expect(try target.store.unacknowledgedOutcomes().count == 1_050)
        #expect(try target.store.control().pausedKeys == ["note"])
        // The 50 queued notes stay held in the copy, whichever table it wrote first.
        let due = try target.store.dueEntries(now: 4_000_000_000_000, limit: 2_000, excluding: [])
        #expect(due.count == 340 && due.allSatisfy { $0.key != "note" })
        for table in StoreTables.tables {
            #expect(before[table.name] == after[table.name], "table \(table.name)")
        }
    }
}
