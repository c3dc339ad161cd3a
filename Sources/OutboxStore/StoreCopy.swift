import CSystem
import Glibc
import OutboxModel

/// The tables a store keeps, row by row, in the same columns in SQLite and PostgreSQL:
/// what `outbox store copy` moves from one to the other.
enum StoreTables {
    enum Kind { case int, text, blob }

    /// A table, its columns and the columns that order it (a copy reads it in that order, a
    /// chunk at a time).
    struct Table {
        let name: String
        let columns: [(String, Kind)]
        let key: [String]
        let insertSQL: String

        init(_ name: String, _ columns: [(String, Kind)], key: [String]) {
            self.name = name
            self.columns = columns
            self.key = key
            let names = columns.map(\.0)
            insertSQL = "INSERT INTO \(name) (\(names.joined(separator: ", "))) VALUES (\(names.map { _ in "?" }.joined(separator: ", ")))"
        }

        /// The rows after the key values `after` (all from the first when nil), at most `limit`.
        /// A PostgreSQL counter may be kept in several rows (one per writer): a copy takes their sum.
        func chunkSQL(after: Bool, limit: Int) -> String {
            let order = key.joined(separator: ", ")
            var conditions = after ? ["(\(order)) > (\(key.map { _ in "?" }.joined(separator: ", ")))"] : []
            // Where a store's own bodies are is its own, not the store's content: not copied,
            // and a store that holds only it was never used.
            if name == "settings" { conditions.append("name != '\(SQLiteStore.bodiesFolderSetting)'") }
            let condition = conditions.isEmpty ? "" : " WHERE " + conditions.joined(separator: " AND ")
            if name == "counters" {
                return "SELECT name, labels, SUM(value) FROM counters\(condition) GROUP BY name, labels ORDER BY \(order) LIMIT \(limit)"
            }
            return "SELECT \(columns.map(\.0).joined(separator: ", ")) FROM \(name)\(condition) ORDER BY \(order) LIMIT \(limit)"
        }

        /// The key values of a row this table's chunk query returned.
        func keyValues(_ row: [SQLValue]) -> [SQLValue] {
            key.map { k in row[columns.firstIndex { $0.0 == k }!] }
        }
    }

    static let entries = Table(
        "entries",
        [
            ("seq", .int), ("id", .text), ("internal", .text), ("key", .text), ("vars", .text), ("state", .text),
            ("reason", .text), ("generation", .int), ("request", .text), ("body", .blob), ("body_file", .text),
            ("body_hash", .text), ("total_bytes", .int), ("bytes_sent", .int), ("attempts", .int), ("idempotency_key", .text),
            ("account", .text), ("scope", .text), ("parent", .text), ("header_generation", .int), ("created_at", .int),
            ("updated_at", .int), ("expires_at", .int), ("not_before", .int), ("next_attempt_at", .int), ("lease_owner", .text),
            ("lease_until", .int), ("last_request_id", .text), ("waits_for_delivery", .int),
        ], key: ["seq"])
    static let outcomes = Table(
        "outcomes",
        [
            ("seq", .int), ("entry_id", .text), ("key", .text), ("generation", .int), ("outcome", .text), ("payload", .text),
            ("deliveries", .int), ("acknowledged", .int), ("next_delivery_at", .int), ("reason", .text), ("hook_pgid", .int),
            ("hook_start", .int), ("created_at", .int),
        ], key: ["seq"])

    static let tables: [Table] = [
        entries,
        Table(
            "parts",
            [
                ("entry_seq", .int), ("idx", .int), ("start", .int), ("\"end\"", .int), ("url", .text), ("headers", .text),
                ("accepted", .int), ("status", .int), ("response_headers", .text), ("attempts", .int), ("next_attempt_at", .int),
            ], key: ["entry_seq", "idx"]),
        // An s3 upload part way goes with the parts S3 accepted: the copy completes that upload.
        Table("s3_uploads", [("entry_seq", .int), ("upload_id", .text)], key: ["entry_seq"]),
        outcomes,
        Table("attempts", [("seq", .int), ("entry_id", .text), ("generation", .int), ("at", .int), ("payload", .text)], key: ["seq"]),
        Table("settings", [("name", .text), ("value", .text)], key: ["name"]),
        Table("paused_keys", [("key", .text)], key: ["key"]),
        Table("counters", [("name", .text), ("labels", .text), ("value", .int)], key: ["name", "labels"]),
    ]

    static func value(_ kind: Kind, isNull: Bool, int: () -> Int64, text: () -> String, blob: () -> [UInt8]?) -> SQLValue {
        if isNull { return .null }
        switch kind {
        case .int: return .int(int())
        case .text: return .text(text())
        case .blob: return blob().map { .blob($0) } ?? .null
        }
    }
}

/// A store whose tables can be read a chunk at a time and written in one transaction (both
/// implementations).
protocol CopyableStore: Store {
    /// Where this store stages file bodies.
    var bodiesFolder: String { get }
    /// At most `limit` rows of `table` in its key's order, those after the key values `after`.
    func exportRows(_ table: StoreTables.Table, after: [SQLValue]?, limit: Int) throws(OutboxError) -> [[SQLValue]]
    /// Writes, in one transaction, every row `produce` passes to its `insert` (the store was
    /// empty); `beforeCommit` may still refuse it. `produce` runs again whole if the
    /// transaction is retried.
    func importRows(
        _ produce: (_ insert: (StoreTables.Table, [SQLValue]) throws(OutboxError) -> Void) throws(OutboxError) -> Void,
        beforeCommit: () throws(OutboxError) -> Void
    ) throws(OutboxError)
}

extension CopyableStore {
    /// Every row of `table`, 1,000 at a time: a copy holds one chunk, not the store.
    func forEachRowChunk(_ table: StoreTables.Table, _ body: ([[SQLValue]]) throws(OutboxError) -> Void) throws(OutboxError) {
        var after: [SQLValue]?
        while true {
            let rows = try exportRows(table, after: after, limit: 1_000)
            guard let last = rows.last else { return }
            after = table.keyValues(last)
            try body(rows)
        }
    }
}

/// `outbox store copy`: a stopped store into an empty one, SQLite and PostgreSQL either way.
package enum StoreCopy {
    /// What a copy moved.
    package struct Summary: Sendable, Equatable {
        package var entries: Int
        package var outcomes: Int
        package var files: Int
    }

    /// Copies every entry, part, s3 upload, outcome, attempt, setting, paused key and counter of
    /// `source` into `target`, which must hold no entry and no outcome. Both are held alone
    /// (`lockExclusively`), so no runner runs on either meanwhile. Staged files go into the target's
    /// staging folder when it is another one.
    /// The target is opened (and so created) only once the source is held: a copy refused
    /// because a runner holds the source leaves nothing behind.
    package static func copy(
        from source: any Store, to openTarget: () throws(OutboxError) -> any Store, targetName: String
    ) throws(OutboxError) -> Summary {
        let sourceLock = try source.lockExclusively()
        defer { sourceLock.release() }
        // Commands that write are not held off by the lock: a change to the source while it is
        // copied must not be left out of the copy unseen.
        let sourceVersion = try source.dataVersion()
        let target = try openTarget()
        guard let from = source as? any CopyableStore, let to = target as? any CopyableStore else {
            throw .invalid("store copy: this store cannot be copied")
        }
        let targetLock = try target.lockExclusively()
        defer { targetLock.release() }
        let counts = try target.counts()
        let existing = counts.states.values.reduce(0, +)
        guard existing == 0, counts.pendingOutcomes == 0, try target.unacknowledgedOutcomes().isEmpty,
            try to.exportRows(StoreTables.outcomes, after: nil, limit: 1).isEmpty
        else {
            throw .invalid(
                "store copy: \(targetName) is not empty (\(existing) entr\(existing == 1 ? "y" : "ies")); copy into an empty store")
        }
        // A store used before keeps settings, counters or attempts with no entry left: not empty either.
        for table in StoreTables.tables where try !to.exportRows(table, after: nil, limit: 1).isEmpty {
            throw .invalid(
                "store copy: \(targetName) is not empty (it holds \(table.name) of its own: it was used); copy into an empty store")
        }
        // Staged files go to the target's folder, from wherever the rows name them (a store
        // copied before may still name the folder of the store it came from); paths follow.
        let newPrefix = to.bodiesFolder + "/"
        let columns = StoreTables.entries.columns.map(\.0)
        let requestColumn = columns.firstIndex(of: "request")!
        let fileColumn = columns.firstIndex(of: "body_file")!
        var copiedTo: [String: String] = [:]
        var targets = Set<String>()
        var copied: [String] { Array(copiedTo.values) }
        func copyIn(_ path: String) throws(OutboxError) -> String {
            if path.hasPrefix(newPrefix) { return path }
            if let done = copiedTo[path] { return done }
            // Gone already: the entry fails as it would have (kind file), the row keeps its path.
            var info = stat()
            guard lstat(path, &info) == 0 else { return path }
            // Never a file outside the store, nor what is no file: the store is damaged there.
            guard info.st_mode & S_IFMT == S_IFREG else {
                let what = info.st_mode & S_IFMT == S_IFLNK ? "a symbolic link" : "not a regular file"
                throw .storage("store copy: the staged body \(path) is \(what), not the file the store staged (see outbox audit)")
            }
            try SQLiteStore.makeFolder(to.bodiesFolder)
            var target = newPrefix + Paths.basename(path)
            if targets.contains(target) { target += "-" + Identifiers.uuid().prefix(8) }
            // Through a temporary name: a file a killed copy left under this name (the target
            // holds no entry, so none owns it) is replaced, never appended to or refused.
            let temp = target + ".tmp-\(getpid())-copy"
            unlink(temp)
            var rc = csystem_copy_file(path, temp, -1, nil)
            if rc == 0, rename(temp, target) != 0 { rc = -errno }
            guard rc == 0 else {
                unlink(temp)
                throw .storage("store copy: cannot copy \(path) into \(to.bodiesFolder): \(Paths.errnoMessage(-rc))")
            }
            copiedTo[path] = target
            targets.insert(target)
            return target
        }
        func moved(_ row: [SQLValue]) throws(OutboxError) -> [SQLValue] {
            guard case let .text(text) = row[requestColumn], let json = try? JSON.parse(text), let request = try? StoredRequest(json: json)
            else { return row }
            var row = row
            // A referenced file is the user's, sent from where it is: never copied.
            if case let .text(path) = row[fileColumn], request.ownership != .reference { row[fileColumn] = .text(try copyIn(path)) }
            var rewritten = text
            for staged in request.form.compactMap(\.stagedFile) {
                let new = try copyIn(staged)
                if new != staged {
                    // The whole value, closing quote included: no other path that starts alike.
                    rewritten = rewritten.replacing(
                        StoredRequest.stagedFileMember(staged) + "\"", with: StoredRequest.stagedFileMember(new) + "\"")
                }
            }
            row[requestColumn] = .text(rewritten)
            return row
        }
        var summary = Summary(entries: 0, outcomes: 0, files: 0)
        do throws(OutboxError) {
            try to.importRows(
                { (insert) throws(OutboxError) in
                    (summary.entries, summary.outcomes) = (0, 0)
                    for table in StoreTables.tables {
                        try from.forEachRowChunk(table) { (rows) throws(OutboxError) in
                            for row in rows { try insert(table, table.name == "entries" ? try moved(row) : row) }
                            if table.name == "entries" { summary.entries += rows.count }
                            if table.name == "outcomes" { summary.outcomes += rows.count }
                        }
                    }
                },
                beforeCommit: { () throws(OutboxError) in
                    // Tests write to the source here: the copy must see it and commit nothing.
                    Fault.hold("copy.before-commit")
                    // The rows name the copies: they are durable before the rows are.
                    if !copiedTo.isEmpty { _ = csystem_fsync_dir(to.bodiesFolder) }
                    guard try source.dataVersion() == sourceVersion else {
                        throw .running(
                            "store copy: the source changed while it was copied (a command wrote to it); nothing was copied: copy again once nothing writes to it"
                        )
                    }
                })
        } catch {
            for file in copied { unlink(file) }
            throw error
        }
        summary.files = copiedTo.count
        return summary
    }
}

/// Both stores read their rows for a copy alike; each writes them its own way.
extension SQLStore {
    var bodiesFolder: String { staging.bodiesDir }

    func exportRows(_ table: StoreTables.Table, after: [SQLValue]?, limit: Int) throws(OutboxError) -> [[SQLValue]] {
        try db.query(table.chunkSQL(after: after != nil, limit: limit), after ?? []) { r in
            table.columns.enumerated().map { i, column in
                let c = Int32(i)
                return StoreTables.value(column.1, isNull: r.isNull(c), int: { r.int(c) }, text: { r.text(c) }, blob: { r.blob(c) })
            }
        }
    }
}

extension SQLiteStore: CopyableStore {
    func importRows(
        _ produce: (_ insert: (StoreTables.Table, [SQLValue]) throws(OutboxError) -> Void) throws(OutboxError) -> Void,
        beforeCommit: () throws(OutboxError) -> Void
    ) throws(OutboxError) {
        try db.transaction { () throws(OutboxError) in
            try produce { (table, row) throws(OutboxError) in _ = try db.run(table.insertSQL, row) }
            try beforeCommit()
        }
    }
}

extension PostgresStore: CopyableStore {
    /// Rows keep their numbers; the identity sequences then continue after them, and
    /// entries whose body is on this host's disk record it.
    func importRows(
        _ produce: (_ insert: (StoreTables.Table, [SQLValue]) throws(OutboxError) -> Void) throws(OutboxError) -> Void,
        beforeCommit: () throws(OutboxError) -> Void
    ) throws(OutboxError) {
        // One writer at a time: the rows keep their numbers, as if enqueued in one go.
        try db.transaction(lock: lockKey) { () throws(OutboxError) in
            try produce { (table, row) throws(OutboxError) in _ = try db.run(table.insertSQL, row) }
            for table in ["entries", "outcomes", "attempts"] {
                try db.execute(
                    "SELECT setval(pg_get_serial_sequence('\(table)', 'seq'), COALESCE((SELECT MAX(seq) FROM \(table)), 0) + 1, false)")
            }
            try forEachChunk(ListFilter()) { (chunk) throws(OutboxError) in
                for e in chunk where !e.body.files.isEmpty {
                    try db.run("UPDATE entries SET body_host = ? WHERE seq = ?", [.text(host), .int(e.seq)])
                }
            }
            try beforeCommit()
        }
    }
}
