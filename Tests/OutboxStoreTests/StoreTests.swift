import Foundation
import OutboxModel
import Testing
import TestSupport
@testable import OutboxStore

struct StoreOpeningTests {
    @Test func theDatabaseIsInWALModeWithFullSync() throws {
        let f = try StoreFixture()
        #expect(try f.sqlite("PRAGMA journal_mode;") == "wal")
        // synchronous and foreign_keys are per connection, not persisted: check the store's own.
        #expect(try f.store.db.query("PRAGMA synchronous") { $0.int(0) } == [2])
        #expect(try f.store.db.query("PRAGMA foreign_keys") { $0.int(0) } == [1])
        let second = try SQLiteStore(folder: f.storeFolder)
        #expect(try second.db.query("PRAGMA synchronous") { $0.int(0) } == [2])
        #expect(try second.db.query("PRAGMA journal_mode") { $0.text(0) } == ["wal"])
    }

    /// The one commit made without a sync leaves the connection syncing again, whether its
    /// body succeeds or throws.
    @Test func aTransactionWithoutSyncRestoresFullSync() throws {
        let f = try StoreFixture()
        var during: [Int64] = []
        try f.store.db.transactionWithoutSync { () throws(OutboxError) in
            during = try f.store.db.query("PRAGMA synchronous") { $0.int(0) }
        }
        #expect(during == [1])
        #expect(try f.store.db.query("PRAGMA synchronous") { $0.int(0) } == [2])
        #expect(throws: OutboxError.self) {
            try f.store.db.transactionWithoutSync { () throws(OutboxError) in throw .storage("boom") }
        }
        #expect(try f.store.db.query("PRAGMA synchronous") { $0.int(0) } == [2])
    }

    @Test func theFolderIs0700AndTheFiles0600() throws {
        let f = try StoreFixture()
        try f.enqueue("a", "text", #"{"t": "\#(String(repeating: "z", count: 70_000))"}"#)
        #expect(fileMode(f.storeFolder) == 0o700)
        #expect(fileMode(f.bodies) == 0o700)
        #expect(fileMode(f.database) == 0o600)
        #expect(fileMode(f.database + "-wal") == 0o600)
        #expect(fileMode(f.database + "-shm") == 0o600)
        let staged = try #require(try f.get("a").bodyFile)
        #expect(fileMode(staged) == 0o600)
    }

    @Test func nestedStoreFoldersAreCreated() throws {
        let f = try StoreFixture()
        let deep = f.root + "/var/lib/queue"
        let store = try SQLiteStore(folder: deep)
        #expect(store.folder == deep)
        #expect(fileMode(deep) == 0o700)
        #expect(exists(deep + "/outbox.db"))
    }

    @Test func aStorePathUnderARegularFileIsAStorageError() throws {
        let f = try StoreFixture()
        let file = try f.userFile("plain", "not a folder")
        do {
            _ = try SQLiteStore(folder: file + "/store")
            Issue.record("opened a store under a regular file")
        } catch {
            #expect(error.code == .storage)
            #expect(error.code.exitStatus == 74)
            #expect(error.message.contains(file))
        }
    }

    /// The indexes of `entries` once every migration has run.
    static let currentEntryIndexes = [
        "entries_delayed", "entries_held", "entries_key", "entries_queued", "entries_running", "entries_scope",
        "entries_stuck", "entries_waiting", "sqlite_autoindex_entries_1",
    ]

    static func entryIndexes(_ f: StoreFixture) throws -> [String] {
        try f.sqlite("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'entries' ORDER BY name;")
            .split(separator: "\n").map(String.init)
    }

    @Test func migrationsAreRecordedOnceAndReopeningIsIdempotent() throws {
        let f = try StoreFixture()
        let first = try f.sqlite("SELECT name || '|' || applied_at FROM migrations ORDER BY name;")
        let names = first.split(separator: "\n").map { String($0.split(separator: "|")[0]) }
        #expect(
            names == [
                "001-entries", "002-queue-order", "003-queued-partial-index", "004-parts-without-cascade", "005-counters", "006-s3-uploads",
                "007-s3-uploads-without-cascade", "008-runner-start-indexes", "009-queued-index-with-times",
                "010-paused-entries-apart",
            ])
        try f.enqueue("keep", "note", #"{"n": 1}"#)
        _ = try SQLiteStore(folder: f.storeFolder)
        _ = try SQLiteStore(folder: f.storeFolder)
        #expect(try f.sqlite("SELECT name || '|' || applied_at FROM migrations;") == first)
        #expect(try f.sqlite("SELECT id FROM entries;") == "keep")
    }

    /// A store made before migration 003 gets it when it is opened, keeping its entries,
    /// and claims read the new partial index.
    @Test func aStoreFromBeforeThePartialIndexIsUpgradedInPlace() throws {
        let f = try StoreFixture()
        try f.enqueue("old", "note", #"{"n": 1}"#)
        // Back to the schema of 002.
        _ = try f.sqlite(
            """
            DROP INDEX entries_queued;
            CREATE INDEX entries_due ON entries (state, next_attempt_at);
            CREATE INDEX entries_queue ON entries (state, seq);
            DELETE FROM migrations WHERE name = '003-queued-partial-index';
            """)
        let store = try SQLiteStore(folder: f.storeFolder)
        #expect(try Self.entryIndexes(f) == Self.currentEntryIndexes)
        #expect(try store.dueEntries(now: 4_000_000_000_000, limit: 10, excluding: []).map(\.id) == ["old"])
        let plan = try f.sqlite("EXPLAIN QUERY PLAN SELECT id FROM entries WHERE state = 'queued' ORDER BY seq LIMIT 1;")
        #expect(plan.contains("entries_queued"), "\(plan)")
    }

    /// What a runner reads as it starts and ends names the rows it wants through a partial
    /// index: none of it reads every entry, so a run's start and end cost the same at any
    /// queue length. Each statement still finds what it is for.
    @Test func aRunsStartAndEndReadIndexesNotEveryEntry() throws {
        let f = try StoreFixture()
        for id in ["q1", "q2", "run", "held", "auth", "err", "done"] { try f.enqueue(id, "note", #"{"n": 1}"#) }
        try f.setState("run", .running)
        try f.setState("auth", .awaitingAuth)
        try f.setState("err", .error)
        try f.setState("done", .completed)
        _ = try f.sqlite("UPDATE entries SET reason = 'wifi', next_attempt_at = 9000000000000 WHERE id = 'held';")
        let statements: [(String, [SQLValue])] = [
            (SQLiteStore.requeueAbandonedSQL, [.int(1), .text("pid-1")]),
            (SQLiteStore.releaseHoldsSQL, [.int(1), .int(1), .text(#"["wifi","account","host"]"#)]),
            (SQLiteStore.remainingSQL, []),
            (SQLiteStore.entriesQuery(ListFilter(state: "awaiting-auth")).0, [.text("awaiting-auth")]),
            (SQLiteStore.entriesQuery(ListFilter(state: "error")).0, [.text("error")]),
            (SQLiteStore.nextWaitEndSQL, [.int(2_000), .int(2_000)]),
        ]
        for (sql, values) in statements {
            let plan = try f.store.db.query("EXPLAIN QUERY PLAN " + sql, values) { $0.text(3) }
            #expect(!plan.contains { $0.hasPrefix("SCAN entries") && !$0.contains("INDEX") }, "\(sql)\n\(plan)")
            #expect(plan.contains { $0.contains("entries_") }, "\(sql)\n\(plan)")
        }
        // Queued 3 (q1, q2, held), running 1, awaiting-auth 1, error 1; completed is not remaining.
        #expect(try f.store.remainingCount() == 6)
        #expect(try f.store.remainingCount() == f.store.counts().remaining)
        #expect(try f.store.list(ListFilter(state: "awaiting-auth")).map(\.id) == ["auth"])
        #expect(try f.store.list(ListFilter(state: "error")).map(\.id) == ["err"])
        #expect(try f.store.requeueAbandoned(lease: Lease(owner: "pid-1", durationMs: 1_000), now: 2_000) == 1)
        #expect(try f.get("run").state == .queued)
        try f.store.releaseHolds(now: 3_000, reasons: HoldReason.allCases)
        #expect(try f.sqlite("SELECT quote(reason) || '|' || next_attempt_at FROM entries WHERE id = 'held';") == "NULL|3000")
        #expect(try f.store.remainingCount() == 6)
        // The first wait to end after a time: a retry's backoff or a delay, of queued entries only.
        _ = try f.sqlite(
            """
            UPDATE entries SET next_attempt_at = 5000 WHERE id = 'q1';
            UPDATE entries SET not_before = 4000 WHERE id = 'q2';
            UPDATE entries SET next_attempt_at = 3500 WHERE id = 'err';
            """)
        #expect(try f.store.nextWaitEnd(after: 3_000) == 4_000)
        #expect(try f.store.nextWaitEnd(after: 4_000) == 5_000)
        #expect(try f.store.nextWaitEnd(after: 5_000) == nil)
    }

    /// A store made before migration 008 gets its indexes when it is opened.
    @Test func aStoreFromBeforeTheRunnerStartIndexesIsUpgradedInPlace() throws {
        let f = try StoreFixture()
        try f.enqueue("old", "note", #"{"n": 1}"#)
        try f.setState("old", .running)
        _ = try f.sqlite(
            """
            DROP INDEX entries_running; DROP INDEX entries_held; DROP INDEX entries_stuck; DROP INDEX entries_waiting;
            DROP INDEX entries_delayed;
            DELETE FROM migrations WHERE name = '008-runner-start-indexes';
            """)
        let store = try SQLiteStore(folder: f.storeFolder)
        #expect(try Self.entryIndexes(f) == Self.currentEntryIndexes)
        #expect(try store.requeueAbandoned(lease: Lease(owner: "pid-2", durationMs: 1_000), now: 2_000) == 1)
        #expect(try store.audit() == [])
    }

    /// A store made before migration 009 gets the queued entries' index with their times,
    /// and claims still read it.
    @Test func aStoreFromBeforeTheTimesInTheQueuedIndexIsUpgradedInPlace() throws {
        let f = try StoreFixture()
        try f.enqueue("old", "note", #"{"n": 1}"#)
        _ = try f.sqlite(
            """
            DROP INDEX entries_queued;
            CREATE INDEX entries_queued ON entries (seq) WHERE state = 'queued';
            DELETE FROM migrations WHERE name = '009-queued-index-with-times';
            """)
        let store = try SQLiteStore(folder: f.storeFolder)
        #expect(try f.sqlite("SELECT sql FROM sqlite_master WHERE name = 'entries_queued';").contains("(seq, next_attempt_at, not_before)"))
        #expect(try Self.entryIndexes(f) == Self.currentEntryIndexes)
        #expect(try store.dueEntries(now: 4_000_000_000_000, limit: 10, excluding: []).map(\.id) == ["old"])
        #expect(try store.audit() == [])
    }

    /// The read of due entries seeks past a paused key's entries in `entries_queued` and
    /// walks the rest in seq order (the marks themselves: `aPausedKeysEntriesAreMarked`).
    @Test func theReadOfDueEntriesSeeksPastPausedOnes() throws {
        let f = try StoreFixture()
        try f.enqueue("held", "note", #"{"n": 1}"#)
        try f.enqueue("other", "text", #"{"t": "x"}"#)
        try f.store.setPaused(keys: ["note"], paused: true)
        let far: Int64 = 4_000_000_000_000
        #expect(try f.store.dueEntries(now: far, limit: 10, excluding: []).map(\.id) == ["other"])
        let plan = try f.store.db.query(
            "EXPLAIN QUERY PLAN " + SQLiteStore.dueEntriesSQL,
            [.int(0), .text("[]"), .int(far), .int(far), .int(far), .int(far), .int(10)]
        ) { $0.text(3) }
        #expect(plan.contains { $0.contains("USING INDEX entries_queued (paused=? AND seq>?)") }, "\(plan)")
        #expect(!plan.contains { $0.contains("TEMP B-TREE") }, "\(plan)")
    }

    /// A store made before migration 010 marks the entries of the keys paused in it when it is
    /// opened, and its read of due entries leaves them out as before.
    @Test func aStoreFromBeforeThePausedMarksIsUpgradedInPlace() throws {
        let f = try StoreFixture()
        try f.enqueue("held", "note", #"{"n": 1}"#)
        try f.enqueue("free", "text", #"{"t": "x"}"#)
        try f.store.setPaused(keys: ["note"], paused: true)
        // Back to the schema of 009: no mark, no triggers, the index without it.
        _ = try f.sqlite(
            """
            DROP TRIGGER paused_keys_added; DROP TRIGGER paused_keys_removed;
            DROP INDEX entries_queued;
            ALTER TABLE entries DROP COLUMN paused;
            CREATE INDEX entries_queued ON entries (seq, next_attempt_at, not_before) WHERE state = 'queued';
            DELETE FROM migrations WHERE name = '010-paused-entries-apart';
            """)
        let store = try SQLiteStore(folder: f.storeFolder)
        #expect(
            try f.sqlite("SELECT group_concat(id || '=' || paused, ' ') FROM (SELECT id, paused FROM entries ORDER BY seq);")
                == "held=1 free=0")
        #expect(
            try f.sqlite("SELECT sql FROM sqlite_master WHERE name = 'entries_queued';").contains(
                "(paused, seq, next_attempt_at, not_before)"))
        #expect(try Self.entryIndexes(f) == Self.currentEntryIndexes)
        #expect(try store.dueEntries(now: 4_000_000_000_000, limit: 10, excluding: []).map(\.id) == ["free"])
        try store.setPaused(keys: ["note"], paused: false)
        #expect(try store.dueEntries(now: 4_000_000_000_000, limit: 10, excluding: []).map(\.id) == ["held", "free"])
        #expect(try store.audit() == [])
    }

    /// A store made before migration 004 keeps its parts (and drops parts of no entry, which
    /// the cascade could not leave), loses the cascade, and finds outcomes by entry.
    @Test func aStoreFromBeforeThePartsRebuildIsUpgradedInPlace() throws {
        let f = try StoreFixture()
        try f.userFile("in/p.bin", String(repeating: "p", count: 45))
        try f.enqueue("parts", "parts", #"{"path": "in/p.bin"}"#)
        try f.addOutcome("parts", "completed", acknowledged: false)
        let before = try f.sqlite("SELECT * FROM parts ORDER BY entry_seq, idx;")
        #expect(!before.isEmpty)
        // Back to the schema of 003, with an orphaned part.
        _ = try f.sqlite(
            """
            PRAGMA foreign_keys=OFF;
            CREATE TABLE parts_old (
                entry_seq INTEGER NOT NULL REFERENCES entries (seq) ON DELETE CASCADE, idx INTEGER NOT NULL,
                start INTEGER NOT NULL, end INTEGER NOT NULL, url TEXT NOT NULL, headers TEXT NOT NULL,
                accepted INTEGER NOT NULL DEFAULT 0, status INTEGER, response_headers TEXT,
                attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at INTEGER, PRIMARY KEY (entry_seq, idx)) WITHOUT ROWID;
            INSERT INTO parts_old SELECT * FROM parts;
            INSERT INTO parts_old (entry_seq, idx, start, end, url, headers) VALUES (999, 0, 0, 1, 'https://x.example/', '[]');
            DROP TABLE parts;
            ALTER TABLE parts_old RENAME TO parts;
            DROP INDEX outcomes_entry;
            CREATE INDEX outcomes_pending ON outcomes (acknowledged, entry_id, seq);
            DELETE FROM migrations WHERE name = '004-parts-without-cascade';
            """)
        #expect(try f.sqlite("SELECT COUNT(*) FROM pragma_foreign_key_list('parts');") == "1")
        let store = try SQLiteStore(folder: f.storeFolder)
        #expect(try f.sqlite("SELECT COUNT(*) FROM pragma_foreign_key_list('parts');") == "0")
        #expect(try f.sqlite("SELECT * FROM parts ORDER BY entry_seq, idx;") == before)
        #expect(try store.audit() == [])
        let plan = try f.sqlite("EXPLAIN QUERY PLAN DELETE FROM outcomes WHERE entry_id = 'parts' AND generation <= 1;")
        #expect(plan.contains("outcomes_entry"), "\(plan)")
    }

    /// A store made before migration 007 keeps the multipart uploads of its entries (and drops
    /// those of no entry), loses the cascade that ran on every entry's DELETE, and still forgets
    /// an entry's upload with the entry.
    @Test func aStoreFromBeforeTheUploadsRebuildIsUpgradedInPlace() throws {
        let f = try StoreFixture()
        try f.userFile("in/p.bin", String(repeating: "p", count: 45))
        try f.userFile("in/q.bin", String(repeating: "q", count: 45))
        try f.enqueue("parts", "parts", #"{"path": "in/p.bin"}"#)
        try f.enqueue("other", "parts", #"{"path": "in/q.bin"}"#)
        let seq = try f.sqlite("SELECT seq FROM entries WHERE id = 'parts';")
        let other = try f.sqlite("SELECT seq FROM entries WHERE id = 'other';")
        // Back to the schema of 006, with an upload of each entry and one of no entry.
        _ = try f.sqlite(
            """
            PRAGMA foreign_keys=OFF;
            DROP TRIGGER s3_uploads_parts_deleted;
            DROP TABLE s3_uploads;
            CREATE TABLE s3_uploads (
                entry_seq INTEGER PRIMARY KEY REFERENCES entries (seq) ON DELETE CASCADE, upload_id TEXT NOT NULL);
            CREATE TRIGGER s3_uploads_parts_deleted AFTER DELETE ON parts WHEN old.idx = 0
            BEGIN DELETE FROM s3_uploads WHERE entry_seq = old.entry_seq; END;
            INSERT INTO s3_uploads VALUES (\(seq), 'upload-a'), (\(other), 'upload-b'), (999, 'orphan');
            DELETE FROM migrations WHERE name = '007-s3-uploads-without-cascade';
            """)
        #expect(try f.sqlite("SELECT COUNT(*) FROM pragma_foreign_key_list('s3_uploads');") == "1")
        // The store runs with foreign keys on; the cascade shows as a sub-program of the DELETE.
        let explainDelete = "PRAGMA foreign_keys=ON; EXPLAIN DELETE FROM entries WHERE seq = 1;"
        #expect(try f.sqlite(explainDelete).contains("Program"))
        let store = try SQLiteStore(folder: f.storeFolder)
        #expect(try f.sqlite("SELECT COUNT(*) FROM pragma_foreign_key_list('s3_uploads');") == "0")
        #expect(
            try f.sqlite("SELECT entry_seq || '|' || upload_id FROM s3_uploads ORDER BY entry_seq;") == "\(seq)|upload-a\n\(other)|upload-b"
        )
        #expect(try store.audit() == [])
        // Deleting an entry runs no cascade now: the store forgets the upload with the parts.
        let plan = try f.sqlite(explainDelete)
        #expect(!plan.contains("Program"), "\(plan)")
        _ = try store.cancel(ids: ["parts"], key: nil, now: 2_000)
        #expect(try f.sqlite("SELECT entry_seq || '|' || upload_id FROM s3_uploads;") == "\(other)|upload-b")
    }
}

/// Statements are found by where their text lives; a text built at run time lives somewhere
/// new each time, and a long run must not keep every copy.
/// Near the end of year 9999 (a clock outbox still takes), a lifetime that would end past it
/// ends with it: a later time could not be recorded, and the store would read as damaged.
struct LastYearTests {
    @Test func anExpiryPastTheLastRecordableTimeEndsThere() throws {
        let f = try StoreFixture()
        let last = Identifiers.recordableMs.upperBound
        let now = last - 3_600_000
        try f.enqueue("late", "note", #"{"n": 1}"#, now: now)
        #expect(try f.get("late").expiresAt == last)
        // Expired and retried: its lifetime again from now, which ends there too.
        let created = last - 20 * 86_400_000
        try f.enqueue([try f.entry("old", "note", #"{"n": 2}"#, expiresAt: created + 14 * 86_400_000)], now: created)
        _ = try f.store.retry(ids: ["old"], key: nil, errors: true, now: now)
        #expect(try f.get("old").expiresAt == last)
    }
}

struct StatementCacheTests {
    @Test func textsBuiltAtRunTimeAreNotAllKept() throws {
        let f = try StoreFixture()
        try f.enqueue("a", "note", #"{"n": 1}"#)
        let column = "id"
        for _ in 0..<(3 * SQLiteConnection.maxAddresses) {
            let sql = "SELECT \(column) FROM entries WHERE id = ? AND seq > 0"
            #expect(try f.store.db.queryOne(sql, [.text("a")], { $0.text(0) }) == "a")
        }
        #expect(f.store.db.statementAddressCount <= SQLiteConnection.maxAddresses)
        // A literal is found by its address, and still answers what its text asks.
        #expect(try f.store.db.queryOne("SELECT COUNT(*) FROM entries WHERE id = ?", [.text("a")], { $0.int(0) }) == 1)
        #expect(try f.store.db.queryOne("SELECT COUNT(*) FROM entries WHERE id = ?", [.text("b")], { $0.int(0) }) == 0)
    }
}

struct StoreStagingTests {
    @Test func bodiesUpTo64KiBLiveInTheRow() throws {
        let f = try StoreFixture()
        let exact = String(repeating: "a", count: 65_536)
        try f.enqueue("inline", "text", #"{"t": "\#(exact)"}"#)
        let e = try f.get("inline")
        #expect(e.body == .bytes(Array(exact.utf8)))
        #expect(e.bodyFile == nil)
        #expect(e.totalBytes == 65_536)
        #expect(f.stagedFiles().isEmpty)
    }

    @Test func largerBodiesAreStagedFiles() throws {
        let f = try StoreFixture()
        let big = String(repeating: "b", count: 65_537)
        try f.enqueue("big", "text", #"{"t": "\#(big)"}"#)
        let e = try f.get("big")
        #expect(e.body.file != nil)
        let file = try #require(e.bodyFile)
        #expect(file.hasPrefix(f.bodies + "/"))
        #expect(!file.contains("big"), "store files are named by internal ids")
        #expect(fileText(file) == big)
        #expect(fileMode(file) == 0o600)
        #expect(e.totalBytes == 65_537)
        #expect(f.stagedFiles().count == 1)
    }

    @Test func aCopiedFileIsStagedAndTheSourceKept() throws {
        let f = try StoreFixture()
        let source = try f.userFile("in/a.bin", "file-bytes", mode: 0o644)
        try f.enqueue("c", "file.copy", #"{"path": "in/a.bin"}"#)
        let e = try f.get("c")
        let staged = try #require(e.bodyFile)
        #expect(staged.hasPrefix(f.bodies + "/"))
        #expect(fileText(staged) == "file-bytes")
        #expect(fileMode(staged) == 0o600)
        #expect(fileText(source) == "file-bytes")
        #expect(e.request.ownership == .copy)
        #expect(e.request.file?.path == source)
        #expect(e.totalBytes == 10)
    }

    @Test func aMovedFileLeavesItsSourceAndBecomes0600() throws {
        let f = try StoreFixture()
        let source = try f.userFile("in/m.bin", "moved-bytes", mode: 0o644)
        try f.enqueue("m", "file.move", #"{"path": "in/m.bin"}"#)
        let e = try f.get("m")
        let staged = try #require(e.bodyFile)
        #expect(!exists(source))
        #expect(staged.hasPrefix(f.bodies + "/"))
        #expect(fileText(staged) == "moved-bytes")
        #expect(fileMode(staged) == 0o600)
        #expect(e.request.ownership == .move)
        #expect(e.request.file?.path == source)
    }

    // A file with another hard link is copied in and its name removed: the other name keeps
    // its mode, and what is written through it later is not what the entry sends.
    @Test func aMovedFileWithAnotherHardLinkIsCopiedIn() throws {
        let f = try StoreFixture()
        let source = try f.userFile("in/h.bin", "linked-bytes", mode: 0o644)
        let other = f.root + "/in/other.bin"
        try #require(link(source, other) == 0)
        try f.enqueue("h", "file.move", #"{"path": "in/h.bin"}"#)
        let staged = try #require(try f.get("h").bodyFile)
        #expect(!exists(source))
        #expect(fileMode(other) == 0o644)
        #expect(fileMode(staged) == 0o600)
        let handle = try #require(FileHandle(forWritingAtPath: other))
        handle.write(Data("CHANGED".utf8))
        try handle.close()
        #expect(fileText(other) == "CHANGEDbytes")
        #expect(fileText(staged) == "linked-bytes")
    }

    // A staging lock the store cannot open for writing (a read-only store) is still taken:
    // audit checks the staged files, and says no enqueue is staging when none is.
    @Test func auditTakesAStagingLockItCannotWrite() throws {
        let f = try StoreFixture()
        try f.enqueue("c", "file.copy", #"{"path": "\#(try f.userFile("in/c.bin", "copied"))"}"#)
        let orphan = f.bodies + "/orphan-body"
        try #require(FileManager.default.createFile(atPath: orphan, contents: Data("x".utf8)))
        // A folder cannot be opened for writing, as a file on a read-only mount cannot.
        try? FileManager.default.removeItem(atPath: f.storeFolder + "/staging.lock")
        try FileManager.default.createDirectory(atPath: f.storeFolder + "/staging.lock", withIntermediateDirectories: false)
        var notes: [String] = []
        let problems = try f.store.audit(note: { notes.append($0) })
        #expect(notes.isEmpty, "\(notes)")
        #expect(problems.contains { $0.contains("orphan-body") }, "\(problems)")
    }

    @Test func aReferencedFileIsNotCopied() throws {
        let f = try StoreFixture()
        let source = try f.userFile("in/r.bin", "referenced", mode: 0o644)
        try f.enqueue("r", "file.reference", #"{"path": "in/r.bin"}"#)
        let e = try f.get("r")
        #expect(e.bodyFile == source)
        #expect(f.stagedFiles().isEmpty)
        #expect(fileText(source) == "referenced")
        #expect(fileMode(source) == 0o644)
    }

    @Test func partsAreStoredWithTheirRangesURLsAndHeaders() throws {
        let f = try StoreFixture()
        try f.userFile("in/p.bin", String(repeating: "p", count: 45))
        try f.enqueue("p", "parts", #"{"path": "in/p.bin"}"#)
        let e = try f.get("p")
        let parts = try f.store.parts(entrySeq: e.seq)
        #expect(parts.map { [$0.range.start, $0.range.end] } == [[0, 20], [20, 45]])
        #expect(parts.map(\.url) == ["https://up.example/parts/1", "https://up.example/parts/2"])
        #expect(
            parts.map { $0.headers.map { "\($0.0): \($0.1)" } } == [["Content-Range: bytes 0-19/45"], ["Content-Range: bytes 20-44/45"]])
        #expect(parts.allSatisfy { !$0.accepted })
        #expect(e.request.ownership == .move)
        #expect(e.totalBytes == 45)
    }
}

struct StoreAtomicBatchTests {
    /// Nothing of a failed batch may remain: no row, no staged file, no temp file, and a
    /// moved file back at its source.
    private func expectNothingLeft(_ f: StoreFixture, rows: Int64 = 0, sources: [String: String]) throws {
        #expect(try f.rowCount() == rows)
        #expect(f.stagedFiles().isEmpty, "\(f.stagedFiles())")
        // The move journal's folder and the staging lock may stay: no journal of the batch is left.
        #expect(f.storeFiles().filter { $0 != "moves" && $0 != "staging.lock" } == ["bodies"], "\(f.storeFiles())")
        for (path, text) in sources { #expect(fileText(path) == text, "\(path)") }
    }

    @Test func aDuplicateIdInOneBatchEnqueuesNothing() throws {
        let f = try StoreFixture()
        let source = try f.userFile("in/a.bin", "A")
        let batch = [try f.entry("same", "file.move", #"{"path": "in/a.bin"}"#), try f.entry("same", "note", #"{"n": 1}"#)]
        #expect { try f.enqueue(batch) } throws: { ($0 as? OutboxError)?.code == .invalid }
        try expectNothingLeft(f, sources: [source: "A"])
    }

    @Test func aMintedIdSkipsTheSameIdRuleButNeverOverwrites() throws {
        let f = try StoreFixture()
        try f.enqueue("taken", "note", #"{"n": 1}"#)
        let before = try f.sqlite("SELECT * FROM entries;")
        let source = try f.userFile("in/a.bin", "A")
        // Only a freshly minted id is marked so; if one ever equalled a stored id, the id's
        // UNIQUE index refuses the insert and the whole batch rolls back.
        var minted = try f.entry("taken", "note", #"{"n": 1}"#)
        minted.idWasMinted = true
        let batch = [try f.entry("fresh", "file.move", #"{"path": "in/a.bin"}"#), minted]
        #expect { try f.enqueue(batch) } throws: { ($0 as? OutboxError)?.code == .storage }
        try expectNothingLeft(f, rows: 1, sources: [source: "A"])
        #expect(try f.sqlite("SELECT * FROM entries;") == before)
    }

    @Test func aMoveOfAMissingFileRollsBackTheWholeBatch() throws {
        let f = try StoreFixture()
        let source = try f.userFile("in/a.bin", "A")
        let batch = [
            try f.entry("one", "file.move", #"{"path": "in/a.bin"}"#),
            try f.entry("two", "text", #"{"t": "\#(String(repeating: "t", count: 70_000))"}"#),
            // Rendered while the file exists; the first entry moves it away before this one stages.
            try f.entry("three", "file.move", #"{"path": "in/a.bin"}"#),
        ]
        do {
            try f.enqueue(batch)
            Issue.record("the batch was enqueued")
        } catch let error as OutboxError {
            #expect(error.code == .fileMissing)
            #expect(error.message.contains(source))
        }
        try expectNothingLeft(f, sources: [source: "A"])
    }

    @Test func aFailureInsideTheTransactionRollsBackStagedAndMovedFiles() throws {
        let f = try StoreFixture()
        try f.enqueue("busy", "note", #"{"n": 1}"#)
        try f.setState("busy", .running)
        let before = try f.sqlite("SELECT * FROM entries;")
        let moved = try f.userFile("in/m.bin", "M")
        let copied = try f.userFile("in/c.bin", "C")
        let batch = [
            try f.entry("m", "file.move", #"{"path": "in/m.bin"}"#),
            try f.entry("c", "file.copy", #"{"path": "in/c.bin"}"#),
            try f.entry("big", "text", #"{"t": "\#(String(repeating: "t", count: 70_000))"}"#),
            try f.entry("busy", "note", #"{"n": 2}"#),
        ]
        do {
            try f.enqueue(batch)
            Issue.record("the batch was enqueued")
        } catch let error as OutboxError {
            #expect(error.code == .running)
            #expect(error.code.exitStatus == 75)
            #expect(error.message.contains("busy"))
        }
        try expectNothingLeft(f, rows: 1, sources: [moved: "M", copied: "C"])
        #expect(try f.sqlite("SELECT * FROM entries;") == before)
    }
}

struct StoreSameIdTests {
    @Test func sameBodyResumesWithNewHeadersVarsAndExpiry() throws {
        let f = try StoreFixture()
        _ = try f.store.enqueue([try f.entry("r", "note", #"{"n": 1, "hv": "a"}"#, expiresAt: 50_000)], now: 1_000)
        try f.setState("r", .queued, attempts: 2, bytesSent: 5)
        let before = try f.get("r")
        let result = try f.store.enqueue([try f.entry("r", "note", #"{"n": 1, "hv": "b"}"#, expiresAt: 90_000)], now: 2_000)
        #expect(result == [EnqueueResult(id: "r", decision: .resume)])
        let e = try f.get("r")
        #expect(e.vars == .object([("n", .number("1")), ("hv", .string("b"))]))
        #expect(HeaderRules.value(e.request.headers, "X-Version") == "b")
        #expect(e.expiresAt == 90_000)
        #expect(e.attempts == 2)
        #expect(e.bytesSent == 5)
        #expect(e.state == .queued)
        #expect(e.generation == 1)
        #expect(e.seq == before.seq)
        #expect(e.internalID == before.internalID)
        #expect(e.createdAt == 1_000)
        #expect(e.updatedAt == 2_000)
        // The Idempotency-Key is the entry's for its whole life.
        #expect(e.idempotencyKey == before.idempotencyKey)
        #expect(e.body == .bytes(Array(#"{"n":1}"#.utf8)))
    }

    @Test func sameStagedBodyResumesWithoutStagingAgain() throws {
        let f = try StoreFixture()
        let big = #"{"t": "\#(String(repeating: "s", count: 70_000))"}"#
        try f.enqueue("s", "text", big)
        let file = try #require(try f.get("s").bodyFile)
        #expect(try f.enqueue("s", "text", big).decision == .resume)
        #expect(try f.get("s").bodyFile == file)
        #expect(f.stagedFiles() == [(file as NSString).lastPathComponent])
    }

    @Test func aDifferentBodyReplacesAQueuedEntry() throws {
        let f = try StoreFixture()
        let big = #"{"t": "\#(String(repeating: "1", count: 70_000))"}"#
        try f.enqueue("q", "text", big)
        let old = try f.get("q")
        try f.setState("q", .queued, attempts: 3, bytesSent: 100)
        let result = try f.enqueue("q", "text", #"{"t": "small now"}"#, now: 5_000)
        #expect(result.decision == .replace)
        let e = try f.get("q")
        #expect(e.body == .bytes(Array("small now".utf8)))
        #expect(e.bodyFile == nil)
        #expect(e.state == .queued)
        #expect(e.generation == 1)
        #expect(e.attempts == 0)
        #expect(e.bytesSent == 0)
        #expect(e.totalBytes == 9)
        #expect(e.bodyHash != old.bodyHash)
        #expect(e.createdAt == old.createdAt)
        // The old staged body is not needed any more.
        #expect(f.stagedFiles().isEmpty)
    }

    @Test func replacingAMovedFileReturnsItToItsSource() throws {
        let f = try StoreFixture()
        let first = try f.userFile("in/a.bin", "only copy of a")
        try f.userFile("in/b.bin", "b")
        try f.enqueue("m", "file.move", #"{"path": "in/a.bin"}"#)
        #expect(!exists(first))
        #expect(try f.enqueue("m", "file.move", #"{"path": "in/b.bin"}"#).decision == .replace)
        #expect(fileText(first) == "only copy of a")
        let staged = try #require(try f.get("m").bodyFile)
        #expect(fileText(staged) == "b")
        #expect(f.stagedFiles() == [(staged as NSString).lastPathComponent])
    }

    @Test func replacingAFormDropsItsOldStagedFiles() throws {
        let f = try StoreFixture()
        let source = try f.userFile("in/f1.bin", "one")
        try f.userFile("in/f2.bin", "two")
        try f.enqueue("form", "form", #"{"note": "x", "path": "in/f1.bin"}"#)
        #expect(f.stagedFiles().count == 1)
        #expect(try f.enqueue("form", "form", #"{"note": "y", "path": "in/f2.bin"}"#).decision == .replace)
        let e = try f.get("form")
        let file = try #require(e.request.form.last?.stagedFile)
        #expect(fileText(file) == "two")
        #expect(e.request.form.map(\.filename) == [nil, "f2.bin"])
        #expect(f.stagedFiles() == [(file as NSString).lastPathComponent])
        #expect(fileText(source) == "one")
    }

    @Test func aDifferentBodyOnARunningEntryIsERunning() throws {
        let f = try StoreFixture()
        try f.enqueue("run", "note", #"{"n": 1}"#)
        try f.setState("run", .running, attempts: 1)
        let before = try f.sqlite("SELECT * FROM entries;")
        #expect { try f.enqueue("run", "note", #"{"n": 2}"#) } throws: { ($0 as? OutboxError)?.code == .running }
        #expect(try f.sqlite("SELECT * FROM entries;") == before)
        // The same body resumes a running entry without stopping it.
        #expect(try f.enqueue("run", "note", #"{"n": 1, "hv": "x"}"#).decision == .resume)
        #expect(try f.get("run").state == .running)
    }

    @Test func aCancelledUnacknowledgedEntryStartsANewGeneration() throws {
        let f = try StoreFixture()
        try f.enqueue("c", "note", #"{"n": 1}"#)
        try f.setState("c", .cancelled)
        try f.addOutcome("c", "error", acknowledged: false)
        let result = try f.enqueue("c", "note", #"{"n": 1}"#)
        #expect(result.decision == .newGeneration)
        let e = try f.get("c")
        #expect(e.generation == 2)
        #expect(e.state == .queued)
        // The cancelled generation's outcome is still delivered: acknowledgements are per generation.
        #expect(try f.sqlite("SELECT generation || ':' || acknowledged FROM outcomes WHERE entry_id = 'c';") == "1:0")
    }

    @Test func aCompletedUnacknowledgedEntryRedeliversAndDoesNotRunAgain() throws {
        let f = try StoreFixture()
        try f.enqueue("done", "note", #"{"n": 1}"#)
        try f.setState("done", .completed, attempts: 1)
        try f.addOutcome("done", "completed", acknowledged: false)
        #expect(try f.enqueue("done", "note", #"{"n": 1}"#).decision == .redeliver)
        let e = try f.get("done")
        #expect(e.state == .completed)
        #expect(e.generation == 1)
        #expect(e.attempts == 1)
        #expect(!e.waitsForDelivery)
    }

    @Test func aCompletedUnacknowledgedEntryWithANewBodyWaitsForDelivery() throws {
        let f = try StoreFixture()
        try f.enqueue("done", "note", #"{"n": 1}"#)
        try f.setState("done", .completed)
        try f.addOutcome("done", "completed", acknowledged: false)
        #expect(try f.enqueue("done", "note", #"{"n": 2}"#).decision == .replaceAfterDelivery)
        let e = try f.get("done")
        #expect(e.state == .queued)
        #expect(e.generation == 2)
        #expect(e.waitsForDelivery)
        #expect(try f.sqlite("SELECT acknowledged FROM outcomes WHERE entry_id = 'done';") == "0")
    }

    @Test func aCompletedAcknowledgedRowIsTreatedAsGone() throws {
        let f = try StoreFixture()
        let big = #"{"t": "\#(String(repeating: "g", count: 70_000))"}"#
        try f.enqueue("gone", "text", big)
        try f.setState("gone", .completed, attempts: 1, bytesSent: 70_000)
        try f.addOutcome("gone", "completed", acknowledged: true)
        #expect(try f.enqueue("gone", "text", big).decision == .create)
        let e = try f.get("gone")
        #expect(e.state == .queued)
        #expect(e.attempts == 0)
        #expect(e.bytesSent == 0)
        let file = try #require(e.bodyFile)
        #expect(fileText(file)?.utf8.count == 70_000)
        #expect(f.stagedFiles() == [(file as NSString).lastPathComponent])
    }

    @Test func anErrorEntryWithTheSameBodyReopens() throws {
        let f = try StoreFixture()
        try f.enqueue("e", "note", #"{"n": 1}"#)
        try f.store.db.run("UPDATE entries SET state = 'error', reason = 'http', attempts = 4, bytes_sent = 3 WHERE id = 'e'")
        try f.addOutcome("e", "error", acknowledged: true)
        #expect(try f.enqueue("e", "note", #"{"n": 1}"#, now: 7_000).decision == .reopen)
        let e = try f.get("e")
        #expect(e.state == .queued)
        #expect(e.reason == nil)
        #expect(e.attempts == 0)
        #expect(e.nextAttemptAt == 7_000)
        #expect(e.generation == 1)
    }

    @Test func anErrorEntryWithADifferentBodyIsReplaced() throws {
        let f = try StoreFixture()
        try f.enqueue("e", "note", #"{"n": 1}"#)
        try f.setState("e", .error)
        #expect(try f.enqueue("e", "note", #"{"n": 2}"#).decision == .replace)
        let e = try f.get("e")
        #expect(e.state == .queued)
        #expect(e.body == .bytes(Array(#"{"n":2}"#.utf8)))
    }
}

struct StoreCancelTests {
    @Test func cancelForgetsRowsAndStagedFiles() throws {
        let f = try StoreFixture()
        try f.enqueue("small", "note", #"{"n": 1}"#)
        try f.enqueue("big", "text", #"{"t": "\#(String(repeating: "b", count: 70_000))"}"#)
        try f.userFile("in/p.bin", String(repeating: "p", count: 45))
        try f.enqueue("parts", "parts", #"{"path": "in/p.bin"}"#)
        try f.setState("parts", .completed)
        try f.addOutcome("parts", "completed", acknowledged: false)
        try f.enqueue("keep", "note", #"{"n": 9}"#)
        #expect(f.stagedFiles().count == 2)
        let cancelled = try f.store.cancel(ids: ["small", "big", "parts", "unknown"], key: nil, now: 2_000)
        #expect(cancelled == ["small", "big", "parts"])
        #expect(try f.store.list(ListFilter()).map(\.id) == ["keep"])
        #expect(f.stagedFiles().isEmpty)
        #expect(try f.sqlite("SELECT COUNT(*) FROM parts;") == "0")
        #expect(try f.sqlite("SELECT COUNT(*) FROM outcomes;") == "0")
        #expect(try f.store.cancel(ids: ["unknown"], key: nil, now: 3_000) == [])
    }

    @Test func cancelByKeyLeavesOtherKeys() throws {
        let f = try StoreFixture()
        try f.enqueue("n1", "note", #"{"n": 1}"#)
        try f.enqueue("t1", "text", #"{"t": "x"}"#)
        try f.enqueue("n2", "note", #"{"n": 2}"#)
        #expect(try f.store.cancel(ids: nil, key: "note", now: 2_000) == ["n1", "n2"])
        #expect(try f.store.list(ListFilter()).map(\.id) == ["t1"])
    }

    @Test func cancelNeverDeletesAReferencedFile() throws {
        let f = try StoreFixture()
        let source = try f.userFile("in/r.bin", "mine")
        try f.enqueue("r", "file.reference", #"{"path": "in/r.bin"}"#)
        _ = try f.store.cancel(ids: ["r"], key: nil, now: 2_000)
        #expect(fileText(source) == "mine")
    }

    @Test func cancelMovesAMovedFileBackToItsSource() throws {
        let f = try StoreFixture()
        let source = try f.userFile("in/m.bin", "only copy", mode: 0o640)
        try f.enqueue("m", "file.move", #"{"path": "in/m.bin"}"#)
        #expect(!exists(source))
        _ = try f.store.cancel(ids: ["m"], key: nil, now: 2_000)
        #expect(fileText(source) == "only copy")
        #expect(fileMode(source) == 0o640, "the file gets its own mode back, not the store's 0600")
        #expect(f.stagedFiles().isEmpty)
        #expect(!exists(f.storeFolder + "/returned"))
    }

    @Test func cancelKeepsAMovedFileUnderReturnedWhenTheSourceIsTaken() throws {
        let f = try StoreFixture()
        let source = try f.userFile("in/m.bin", "only copy", mode: 0o664)
        try f.enqueue("m", "file.move", #"{"path": "in/m.bin"}"#)
        try f.userFile("in/m.bin", "a new file")
        _ = try f.store.cancel(ids: ["m"], key: nil, now: 2_000)
        #expect(fileText(source) == "a new file")
        #expect(fileText(f.storeFolder + "/returned/m.bin") == "only copy")
        #expect(fileMode(f.storeFolder + "/returned/m.bin") == 0o600, "kept in the store, it is a store file")
        #expect(f.stagedFiles().isEmpty)
    }

    @Test func cancelOfAMovedPartsUploadReturnsTheFile() throws {
        let f = try StoreFixture()
        let source = try f.userFile("in/p.bin", String(repeating: "p", count: 45))
        try f.enqueue("p", "parts", #"{"path": "in/p.bin"}"#)
        try f.setState("p", .running, bytesSent: 20)
        _ = try f.store.cancel(ids: ["p"], key: nil, now: 2_000)
        #expect(fileText(source)?.utf8.count == 45)
        #expect(f.stagedFiles().isEmpty)
    }
}

struct StoreHeadersUpdateTests {
    @Test func headersUpdateMergesIntoEntriesAndPartsAndRequeuesAwaitingAuth() throws {
        let f = try StoreFixture()
        try f.enqueue("n", "note", #"{"n": 1, "hv": "v1"}"#)
        try f.userFile("in/p.bin", String(repeating: "p", count: 45))
        try f.enqueue("p", "parts", #"{"path": "in/p.bin"}"#)
        try f.enqueue("auth", "note", #"{"n": 2}"#)
        try f.store.db.run("UPDATE entries SET state = 'awaiting-auth', next_attempt_at = NULL WHERE id = 'auth'")
        let generation = try f.store.updateHeaders([("Authorization", "Bearer new"), ("x-version", "patched")], now: 5_000)
        #expect(generation == 1)

        let n = try f.get("n")
        #expect(
            n.request.headers.map { "\($0.0): \($0.1)" } == [
                "x-version: patched", "Content-Type: application/json", "Authorization: Bearer new",
            ])
        #expect(n.headerGeneration == 1)
        #expect(n.state == .queued)
        let p = try f.get("p")
        let parts = try f.store.parts(entrySeq: p.seq)
        #expect(
            parts.map { $0.headers.map { "\($0.0): \($0.1)" } } == [
                ["Content-Range: bytes 0-19/45", "Authorization: Bearer new", "x-version: patched"],
                ["Content-Range: bytes 20-44/45", "Authorization: Bearer new", "x-version: patched"],
            ])
        let auth = try f.get("auth")
        #expect(auth.state == .queued)
        #expect(auth.nextAttemptAt == 5_000)
        #expect(auth.headerGeneration == 1)

        #expect(try f.store.updateHeaders([("Authorization", "Bearer newer")], now: 6_000) == 2)
        #expect(HeaderRules.value(try f.get("n").request.headers, "authorization") == "Bearer newer")
    }

    @Test func entriesEnqueuedOrResumedAfterAnUpdateCarryThePatch() throws {
        let f = try StoreFixture()
        try f.enqueue("old", "note", #"{"n": 1, "hv": "a"}"#)
        _ = try f.store.updateHeaders([("X-Token", "t2")], now: 5_000)
        try f.enqueue("new", "note", #"{"n": 2}"#)
        let new = try f.get("new")
        #expect(HeaderRules.value(new.request.headers, "X-Token") == "t2")
        #expect(new.headerGeneration == 1)
        // A resume takes the new headers of the definition, and the patch still ranks above them.
        #expect(try f.enqueue("old", "note", #"{"n": 1, "hv": "b"}"#).decision == .resume)
        let old = try f.get("old")
        #expect(HeaderRules.value(old.request.headers, "X-Token") == "t2")
        #expect(HeaderRules.value(old.request.headers, "X-Version") == "b")
        #expect(old.headerGeneration == 1)
    }
}

/// `store copy` while a command writes to the source: the copy notices and commits nothing.
struct StoreCopyWhileWrittenTests {
    @Test func aSourceChangedDuringTheCopyLeavesTheTargetEmpty() async throws {
        let f = try StoreFixture()
        _ = try f.enqueue("a", "note", #"{"n": 1}"#)
        let targetFolder = f.root + "/copied"
        let late = try f.entry("b", "note", #"{"n": 2}"#)
        let error = #expect(throws: OutboxError.self) {
            _ = try StoreCopy.copy(
                from: f.store,
                to: { () throws(OutboxError) -> any Store in
                    // Another process's enqueue, after the copy took the source.
                    _ = try SQLiteStore(folder: f.storeFolder).enqueue([late], now: 2_000)
                    return try SQLiteStore(folder: targetFolder)
                }, targetName: targetFolder)
        }
        #expect(error?.code == .running)
        #expect(error?.message.contains("the source changed while it was copied") == true)
        #expect(try SQLiteStore(folder: targetFolder).list(ListFilter()).isEmpty)
        #expect(try f.store.list(ListFilter()).map(\.id).sorted() == ["a", "b"])
        // Once nothing writes to it, the copy goes through. The first copy's lock is released,
        // but a child another test forks holds its file until that child's exec: until then
        // the lock is taken (E_RUNNING), which a loaded machine made last long enough to see.
        var summary: StoreCopy.Summary?
        try await eventually("the source's lock to be free") {
            do {
                summary = try StoreCopy.copy(
                    from: f.store, to: { () throws(OutboxError) -> any Store in try SQLiteStore(folder: targetFolder) },
                    targetName: targetFolder)
                return true
            } catch let error as OutboxError where error.code == .running {
                return false
            }
        }
        #expect(summary?.entries == 2)
    }
}

/// An entry's texts made ahead (`NewEntry.encode`, as `enqueue --from` does on its render
/// threads) are stored exactly as those made in the transaction, and a change after them wins.
struct EncodedEntryTests {
    func stored(_ f: StoreFixture, _ id: String) throws -> [String] {
        try f.store.db.query("SELECT vars, request, body_hash FROM entries WHERE id = ?", [.text(id)]) {
            [$0.text(0), $0.text(1), $0.text(2)]
        }.first ?? []
    }

    @Test(arguments: [
        ("note", #"{"n": 7, "hv": "x\"y"}"#), ("text", #"{"t": "é\u0000z"}"#), ("file.copy", ""),
        ("file.move", ""), ("file.reference", ""), ("form", ""), ("parts", ""),
    ])
    func anEncodedEntryIsStoredAsOneEncodedInTheTransaction(key: String, vars: String) throws {
        let f = try StoreFixture()
        // A moved file (parts move by default) is moved once: the second entry gets its own.
        let moves = key == "file.move" || key == "parts"
        var files: [String] = []
        for name in moves ? [key, key + ".2"] : [key] {
            let path = try f.userFile("in/\(name).bin", String(repeating: "b", count: 25))
            files.append(#"{"path": "\#(path)", "note": "n"}"#)
        }
        let plain = try f.entry("plain", key, vars.isEmpty ? files[0] : vars)
        var ahead = try f.entry("ahead", key, vars.isEmpty ? files[files.count - 1] : vars)
        ahead.encode()
        #expect(ahead.encoded != nil)
        _ = try f.enqueue([plain, ahead])
        let (a, b) = (try stored(f, "plain"), try stored(f, "ahead"))
        #expect(a.count == 3)
        if !moves && key != "form" {
            #expect(a == b)
            return
        }
        // What differs: the second file's name and identity (so its hash), a form's staged files.
        func comparable(_ text: String) throws -> String {
            var text = text.replacingOccurrences(of: ".2.bin", with: ".bin")
            for pattern in [#"/bodies/[0-9a-f-]+\.form"#, #""(mtime_ns|inode)":[0-9]+"#] {
                text = try NSRegularExpression(pattern: pattern).stringByReplacingMatches(
                    in: text, range: NSRange(text.startIndex..., in: text), withTemplate: "$1")
            }
            return text
        }
        #expect(try a.prefix(2).map(comparable) == b.prefix(2).map(comparable))
        #expect(try a[1].count > comparable(a[1]).count)
        if !moves { #expect(a[2] == b[2]) }
    }

    @Test func aChangeAfterTheEncodingIsWhatIsStored() throws {
        let f = try StoreFixture()
        var entry = try f.entry("e", "note", #"{"n": 1}"#)
        entry.encode()
        entry.vars = try JSON.parse(#"{"n": 2}"#)
        #expect(entry.encoded == nil)
        entry.encode()
        entry.prepared.url = "https://x.example/notes/3"
        #expect(entry.encoded == nil)
        entry.encode()
        entry.prepared.headers.append(("X-Late", "1"))
        #expect(entry.encoded == nil)
        _ = try f.enqueue([entry])
        let e = try f.get("e")
        #expect(e.vars == (try JSON.parse(#"{"n": 2}"#)))
        #expect(e.request.url == "https://x.example/notes/3")
        #expect(HeaderRules.value(e.request.headers, "X-Late") == "1")
        // The hash covers the changed URL: the same entry enqueued plainly hashes the same.
        let fresh = try StoreFixture()
        var plain = try fresh.entry("e", "note", #"{"n": 1}"#)
        plain.vars = try JSON.parse(#"{"n": 2}"#)
        plain.prepared.url = "https://x.example/notes/3"
        plain.prepared.headers.append(("X-Late", "1"))
        _ = try fresh.enqueue([plain])
        #expect(try fresh.get("e").bodyHash == e.bodyHash)
    }
}

/// An entry that takes over the body of the entry it replaces finds the bytes gone (a cancel
/// in between) and stages them inside the transaction: a rollback removes that file, a
/// commit keeps it.
struct TakeOverStagingTests {
    @Test(arguments: [false, true])
    func aBodyStagedInsideTheTransactionFollowsItsOutcome(commits: Bool) throws {
        let f = try StoreFixture()
        var gone = StagedBody()
        gone.file = f.bodies + "/removed-meanwhile.body"
        gone.keepsStored = true
        let body = PreparedBody.bytes([UInt8](repeating: 7, count: 70_000), kind: .data)
        let fresh = try f.store.takeOver(nil, gone, body: body, internalID: "fresh")
        let file = try #require(fresh.file)
        #expect(FileManager.default.fileExists(atPath: file))
        if commits { f.store.finishForget([]) } else { f.store.dropReturns() }
        #expect(FileManager.default.fileExists(atPath: file) == commits)
        #expect(f.store.stagedInTransaction.isEmpty)
    }

    /// A user's file moved in there is written in the move journal until the commit or the
    /// rollback, as a batch's moves are; a rollback puts it back at its path.
    @Test(arguments: [false, true])
    func aFileMovedInsideTheTransactionIsJournaled(commits: Bool) throws {
        let f = try StoreFixture()
        let source = f.root + "/upload.bin"
        try Data(repeating: 9, count: 1000).write(to: URL(fileURLWithPath: source))
        let info = try #require(FileInfo.stat(source))
        let identity = FileIdentity(path: source, size: info.size, mtimeNs: info.mtimeNs, inode: info.inode, mode: info.mode)
        var gone = StagedBody()
        gone.file = f.bodies + "/removed-meanwhile.body"
        gone.keepsStored = true
        let fresh = try f.store.takeOver(nil, gone, body: .file(identity, .move), internalID: "moved")
        let staged = try #require(fresh.file)
        let journals = { (try? FileManager.default.contentsOfDirectory(atPath: f.storeFolder + "/moves")) ?? [] }
        #expect(journals().count == 1)
        #expect(FileManager.default.fileExists(atPath: staged))
        #expect(!FileManager.default.fileExists(atPath: source))
        if commits { f.store.finishForget([]) } else { f.store.dropReturns() }
        #expect(journals().isEmpty)
        #expect(FileManager.default.fileExists(atPath: staged) == commits)
        #expect(FileManager.default.fileExists(atPath: source) == !commits)
    }
}
