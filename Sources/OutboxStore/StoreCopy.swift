import CSystem
import Glibc
import OutboxModel

/// The tables a store keeps, row by row, in the same columns in SQLite and PostgreSQL:
/// what `outbox store copy` moves from one to the other.
enum StoreTables {
    enum Kind { case int, text, blob }

    static let tables: [(name: String, columns: [(String, Kind)])] = [
        (
            "entries",
            [
                ("seq", .int), ("id", .text), ("internal", .text), ("key", .text), ("vars", .text), ("state", .text),
                ("reason", .text), ("generation", .int), ("request", .text), ("body", .blob), ("body_file", .text),
                ("body_hash", .text), ("total_bytes", .int), ("bytes_sent", .int), ("attempts", .int), ("idempotency_key", .text),
                ("account", .text), ("scope", .text), ("parent", .text), ("header_generation", .int), ("created_at", .int),
                ("updated_at", .int), ("expires_at", .int), ("not_before", .int), ("next_attempt_at", .int), ("lease_owner", .text),
                ("lease_until", .int), ("last_request_id", .text), ("waits_for_delivery", .int),
            ]
        ),
        (
            "parts",
            [
                ("entry_seq", .int), ("idx", .int), ("start", .int), ("\"end\"", .int), ("url", .text), ("headers", .text),
                ("accepted", .int), ("status", .int), ("response_headers", .text), ("attempts", .int), ("next_attempt_at", .int),
            ]
        ),
        (
            "outcomes",
            [
                ("seq", .int), ("entry_id", .text), ("key", .text), ("generation", .int), ("outcome", .text), ("payload", .text),
                ("deliveries", .int), ("acknowledged", .int), ("next_delivery_at", .int), ("reason", .text), ("hook_pgid", .int),
                ("hook_start", .int), ("created_at", .int),
            ]
        ),
        ("attempts", [("seq", .int), ("entry_id", .text), ("generation", .int), ("at", .int), ("payload", .text)]),
        ("settings", [("name", .text), ("value", .text)]),
        ("paused_keys", [("key", .text)]),
        ("counters", [("name", .text), ("labels", .text), ("value", .int)]),
    ]

    static func value(_ kind: Kind, isNull: Bool, int: () -> Int64, text: () -> String, blob: () -> [UInt8]?) -> SQLValue {
        if isNull { return .null }
        switch kind {
        case .int: return .int(int())
        case .text: return .text(text())
        case .blob: return blob().map { .blob($0) } ?? .null
        }
    }

    static func insertSQL(_ table: String, _ columns: [(String, Kind)]) -> String {
        "INSERT INTO \(table) (\(columns.map(\.0).joined(separator: ", "))) VALUES (\(columns.map { _ in "?" }.joined(separator: ", ")))"
    }

    static func selectSQL(_ table: String, _ columns: [(String, Kind)]) -> String {
        // A PostgreSQL series may be kept in several rows (one per writer): a copy takes their sum.
        if table == "counters" { return "SELECT name, labels, SUM(value) FROM counters GROUP BY name, labels" }
        return "SELECT \(columns.map(\.0).joined(separator: ", ")) FROM \(table)"
    }
}

/// A store whose tables can be read and written whole (both implementations).
protocol CopyableStore: Store {
    /// Where this store stages file bodies.
    var bodiesFolder: String { get }
    func exportRows(_ table: String, _ columns: [(String, StoreTables.Kind)]) throws(OutboxError) -> [[SQLValue]]
    /// Writes every table in one transaction (the store was empty); `beforeCommit` may still
    /// refuse it.
    func importTables(
        _ tables: [(name: String, columns: [(String, StoreTables.Kind)], rows: [[SQLValue]])],
        beforeCommit: () throws(OutboxError) -> Void
    ) throws(OutboxError)
}

/// `outbox store copy`: a stopped store into an empty one, SQLite and PostgreSQL either way.
package enum StoreCopy {
    /// What a copy moved.
    package struct Summary: Sendable, Equatable {
        package var entries: Int
        package var outcomes: Int
        package var files: Int
    }

    /// Copies every entry, part, outcome, attempt, setting, paused key and counter of
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
            try to.exportRows("outcomes", [("seq", .int)]).isEmpty
        else {
            throw .invalid("store copy: \(targetName) is not empty (\(existing) entries); copy into an empty store")
        }
        // A store used before keeps settings, counters or attempts with no entry left: not empty either.
        for (name, columns) in StoreTables.tables where try !to.exportRows(name, columns).isEmpty {
            throw .invalid("store copy: \(targetName) is not empty (it holds \(name) of its own: it was used); copy into an empty store")
        }
        var tables: [(name: String, columns: [(String, StoreTables.Kind)], rows: [[SQLValue]])] = []
        for (name, columns) in StoreTables.tables {
            tables.append((name, columns, try from.exportRows(name, columns)))
        }
        // Staged files move to the target's folder; paths in rows follow them.
        let oldPrefix = from.bodiesFolder + "/"
        let newPrefix = to.bodiesFolder + "/"
        var copied: [String] = []
        if oldPrefix != newPrefix {
            try SQLiteStore.makeFolder(to.bodiesFolder)
            for name in Paths.list(from.bodiesFolder) ?? [] where !name.contains(".tmp-") {
                // Through a temporary name: a file a killed copy left under this name (the target
                // holds no entry, so none owns it) is replaced, never appended to or refused.
                let temp = newPrefix + name + ".tmp-\(getpid())-copy"
                unlink(temp)
                var rc = csystem_copy_file(oldPrefix + name, temp)
                if rc == 0, rename(temp, newPrefix + name) != 0 { rc = -errno }
                guard rc == 0 else {
                    unlink(temp)
                    for file in copied { unlink(file) }
                    throw .storage("store copy: cannot copy \(oldPrefix + name) into \(to.bodiesFolder): \(Paths.errnoMessage(-rc))")
                }
                copied.append(newPrefix + name)
            }
            _ = csystem_fsync_dir(to.bodiesFolder)
            // Entries are the first table: their request (form files) and body_file name staged paths.
            let columns = tables[0].columns.map(\.0)
            if let request = columns.firstIndex(of: "request"), let file = columns.firstIndex(of: "body_file") {
                for r in tables[0].rows.indices {
                    if case let .text(text) = tables[0].rows[r][request] {
                        tables[0].rows[r][request] = .text(text.replacingPrefixPaths(oldPrefix, newPrefix))
                    }
                    if case let .text(path) = tables[0].rows[r][file], path.hasPrefix(oldPrefix) {
                        tables[0].rows[r][file] = .text(newPrefix + path.dropFirst(oldPrefix.count))
                    }
                }
            }
        }
        do throws(OutboxError) {
            try to.importTables(tables) { () throws(OutboxError) in
                guard try source.dataVersion() == sourceVersion else {
                    throw .running(
                        "store copy: the source changed while it was copied (a command wrote to it); nothing was copied: copy again once nothing writes to it"
                    )
                }
            }
        } catch {
            for file in copied { unlink(file) }
            throw error
        }
        return Summary(entries: tables[0].rows.count, outcomes: tables[2].rows.count, files: copied.count)
    }
}

extension String {
    /// Replaces every occurrence of `old` with `new` (staged paths inside a stored request).
    fileprivate func replacingPrefixPaths(_ old: String, _ new: String) -> String {
        guard !old.isEmpty else { return self }
        var out = ""
        var rest = Substring(self)
        while let i = rest.firstRange(of: old) {
            out += rest[..<i.lowerBound]
            out += new
            rest = rest[i.upperBound...]
        }
        return out + rest
    }
}

extension SQLiteStore: CopyableStore {
    var bodiesFolder: String { staging.bodiesDir }

    func exportRows(_ table: String, _ columns: [(String, StoreTables.Kind)]) throws(OutboxError) -> [[SQLValue]] {
        try db.query(StoreTables.selectSQL(table, columns)) { r in
            columns.enumerated().map { i, column in
                let c = Int32(i)
                return StoreTables.value(column.1, isNull: r.isNull(c), int: { r.int(c) }, text: { r.text(c) }, blob: { r.blob(c) })
            }
        }
    }

    func importTables(
        _ tables: [(name: String, columns: [(String, StoreTables.Kind)], rows: [[SQLValue]])],
        beforeCommit: () throws(OutboxError) -> Void
    ) throws(OutboxError) {
        try db.transaction { () throws(OutboxError) in
            for table in tables {
                let sql = StoreTables.insertSQL(table.name, table.columns)
                for row in table.rows { try db.run(sql, row) }
            }
            try beforeCommit()
        }
    }
}

extension PostgresStore: CopyableStore {
    var bodiesFolder: String { staging.bodiesDir }

    func exportRows(_ table: String, _ columns: [(String, StoreTables.Kind)]) throws(OutboxError) -> [[SQLValue]] {
        try db.query(StoreTables.selectSQL(table, columns)) { r in
            columns.enumerated().map { i, column in
                let c = Int32(i)
                return StoreTables.value(column.1, isNull: r.isNull(c), int: { r.int(c) }, text: { r.text(c) }, blob: { r.blob(c) })
            }
        }
    }

    /// Rows keep their numbers; the identity sequences then continue after them, and
    /// entries whose body is on this host's disk record it.
    func importTables(
        _ tables: [(name: String, columns: [(String, StoreTables.Kind)], rows: [[SQLValue]])],
        beforeCommit: () throws(OutboxError) -> Void
    ) throws(OutboxError) {
        // One writer at a time: the rows keep their numbers, as if enqueued in one go.
        try db.transaction(lock: lockKey) { () throws(OutboxError) in
            for table in tables {
                let sql = StoreTables.insertSQL(table.name, table.columns)
                for row in table.rows { try db.run(sql, row) }
            }
            for table in ["entries", "outcomes", "attempts"] {
                try db.execute(
                    "SELECT setval(pg_get_serial_sequence('\(table)', 'seq'), COALESCE((SELECT MAX(seq) FROM \(table)), 0) + 1, false)")
            }
            for e in try list(ListFilter()) where !e.body.files.isEmpty {
                try db.run("UPDATE entries SET body_host = ? WHERE seq = ?", [.text(host), .int(e.seq)])
            }
            try beforeCommit()
        }
    }
}
