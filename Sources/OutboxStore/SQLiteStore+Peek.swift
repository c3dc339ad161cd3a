import OutboxModel

extension SQLiteStore {
    /// The ids of the most recent entries, newest first, read without opening the store for
    /// writing: nothing is created, migrated or recovered, so a shell's completion can ask at
    /// every key press. Empty when there is no store yet.
    package static func recentIDs(folder: String, limit: Int) throws(OutboxError) -> [String] {
        let path = Paths.join(folder, "outbox.db")
        guard Paths.isRegularFile(path) else { return [] }
        // Without a log no process has the store open, and reading the file alone is exact.
        let access: SQLiteConnection.Access = Paths.exists(path + "-wal") ? .readOnly : .readOnlyUnopened
        // A completion must answer at once; a writer holding the lock longer is waited out elsewhere.
        let db = try SQLiteConnection(path: path, access: access, busyTimeoutMs: 200)
        return try db.query("SELECT id FROM entries ORDER BY seq DESC LIMIT ?", [.int(limit)]) { $0.text(0) }
    }
}
