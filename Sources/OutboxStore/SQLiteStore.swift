import CSystem
import Glibc
import OutboxModel

/// The embedded store: one SQLite database in WAL mode plus staged bodies, in a 0700 folder.
///
/// A connection is confined to the thread that uses it (the CLI's main thread, or the
/// runner's control thread); several processes share the database through SQLite's locks.
package final class SQLiteStore: Store, @unchecked Sendable {
    package let folder: String
    let db: SQLiteConnection
    let staging: Staging
    /// Moved files to put back after the current cancel commits: (store path, source path).
    /// Moved files to put back after the commit: staged path, source path, mode at enqueue.
    var returns: [(file: String, source: String, identity: FileIdentity?)] = []
    /// Staged files of replaced bodies, removed once the transaction commits.
    var obsoleteFiles: [String] = []
    var requestCache: [String: StoredRequest] = [:]
    let moves: MoveJournal
    /// The journal of `returns`, written before the commit that forgets their entries.
    var returnsTicket: MoveJournal.Ticket?
    /// Opened on a store that cannot be written: reads answer, writes fail with E_STORAGE.
    package private(set) var readOnly = false

    /// Opens (creating if needed) the store in `folder`. E_STORAGE when that is impossible.
    package init(folder: String) throws(OutboxError) {
        self.folder = folder
        umask(0o077)
        try Self.checkStoreFolder(folder)
        let bodies = Paths.join(folder, "bodies")
        staging = Staging(bodiesDir: bodies)
        moves = MoveJournal(folder: Paths.join(folder, "moves"))
        let path = Paths.join(folder, "outbox.db")
        if Self.isReadOnly(folder) && Paths.exists(path) {
            // Reading commands still answer; a write fails as SQLite refuses it (E_STORAGE).
            db = try SQLiteConnection(path: path, access: Paths.exists(path + "-wal") ? .readOnly : .readOnlyUnopened)
            readOnly = true
            let applied = Set(try db.query("SELECT name FROM migrations") { $0.text(0) })
            try Self.refuseNewer(applied, path: path)
            if let missing = Schema.migrations.first(where: { !applied.contains($0.name) }) {
                throw .storage(
                    "the store \(folder) is read-only and older than this outbox (it lacks \(missing.name)); open it once where it may be written"
                )
            }
            return
        }
        try Self.makeFolder(folder)
        try Self.makeFolder(bodies)
        // Made with the store, so an enqueue that moves a file and then fails leaves no new folder.
        try Self.makeFolder(moves.folder)
        if !Paths.exists(path) {
            // The database is made before any body is staged: bodies without it mean it was lost.
            if let staged = Paths.list(bodies), !staged.isEmpty {
                throw .storage(
                    "the store database \(path) is missing but \(bodies) holds \(staged.count) staged file\(staged.count == 1 ? "" : "s"): "
                        + "the store is damaged; put outbox.db back, or move the store folder away to start an empty one")
            }
            try Self.createDatabase(at: path)
        } else if FileInfo.stat(path)?.size == 0 {
            // A store is created whole (below), so an empty database is damage, not a new store,
            // even beside a log: the log the last command left holds only the pages it changed.
            throw .storage("the store database \(path) is empty: it is damaged, not new; move it away to start an empty store")
        }
        db = try SQLiteConnection(path: path)
        db.keepLogOnClose()
        try Self.migrate(db)
        // A command killed while moving a user's file leaves a journal: settle it now.
        for line in try moves.recover(owned: { staged throws(OutboxError) in
            try db.queryOne("SELECT 1 FROM entries WHERE body_file = ?", [.text(staged)]) { _ in true } ?? false
        }) {
            FileIO.log("outbox: \(line)")
        }
    }

    /// Whether the store folder cannot be written: a read-only file system, or a folder of
    /// someone else's the user may only read.
    static func isReadOnly(_ folder: String) -> Bool {
        var fs = statvfs()
        if statvfs(folder, &fs) == 0, fs.f_flag & UInt(ST_RDONLY) != 0 { return true }
        return Paths.isDirectory(folder) && access(folder, W_OK) != 0
    }

    /// Creates the database whole under a temporary name and links it into place, so a
    /// crash never leaves an empty or half-made `outbox.db`; when another process created
    /// it meanwhile, theirs is kept (a link never replaces a file).
    static func createDatabase(at path: String) throws(OutboxError) {
        let temp = "\(path).new-\(getpid())"
        for leftover in [temp, temp + "-wal", temp + "-shm"] { unlink(leftover) }
        // Pre-created 0600, so the database and its -wal/-shm never exist with a wider mode.
        let fd = open(temp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .storage("cannot create \(temp): \(Paths.errnoMessage())") }
        close(fd)
        do {
            let connection = try SQLiteConnection(path: temp)
            try migrate(connection)
            // The last connection to close folds the log back and removes it.
        }
        guard !Paths.exists(temp + "-wal") else {
            unlink(temp)
            throw .storage("cannot create \(path): its write-ahead log was not folded back")
        }
        let fileFD = open(temp, O_RDONLY | O_CLOEXEC)
        if fileFD >= 0 {
            fsync(fileFD)
            close(fileFD)
        }
        let linked = link(temp, path) == 0 || errno == EEXIST
        let linkError = errno
        unlink(temp)
        guard linked else { throw .storage("cannot create \(path): \(Paths.errnoMessage(linkError))") }
        _ = csystem_fsync_dir(Paths.dirname(path))
    }

    /// The store holds tokens and bodies: a link (it could point anywhere) is refused, and a
    /// folder others may read is tightened to 0700, with a word on stderr.
    static func checkStoreFolder(_ path: String) throws(OutboxError) {
        var st = stat()
        guard lstat(path, &st) == 0 else { return }
        if (st.st_mode & S_IFMT) == S_IFLNK {
            throw .storage("the store folder \(path) is a symbolic link; give the real folder as store: in the config")
        }
        if (st.st_mode & S_IFMT) == S_IFDIR, st.st_mode & 0o077 != 0, st.st_uid == getuid() {
            chmod(path, 0o700)
            FileIO.log("outbox: the store folder \(path) was open to others (mode \(String(st.st_mode & 0o777, radix: 8))); it is 0700 now")
        }
    }

    static func makeFolder(_ path: String) throws(OutboxError) {
        if Paths.isDirectory(path) { return }
        if Paths.exists(path) { throw .storage("the store path \(path) exists and is not a folder") }
        let parent = Paths.dirname(path)
        if !Paths.isDirectory(parent) { try makeFolder(parent) }
        guard mkdir(path, 0o700) == 0 || errno == EEXIST else {
            throw .storage("cannot create the store folder \(path): \(Paths.errnoMessage())")
        }
        // The new name is durable only once its parent folder is synced.
        _ = csystem_fsync_dir(parent)
    }

    /// A newer outbox's store may mean things this version would get wrong: never touch it.
    static func refuseNewer(_ applied: Set<String>, path: String) throws(OutboxError) {
        if let unknown = applied.subtracting(Schema.migrations.map(\.name)).sorted().first {
            throw .storage("the store database \(path) was changed by a newer outbox (migration \(unknown)); use that version")
        }
    }

    /// Applies the migrations not yet recorded, inside one write transaction (two enqueues
    /// may open a new store at once).
    static func migrate(_ db: SQLiteConnection) throws(OutboxError) {
        try db.transaction { () throws(OutboxError) in
            try db.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at INTEGER NOT NULL)")
            let applied = Set(try db.query("SELECT name FROM migrations") { $0.text(0) })
            try refuseNewer(applied, path: db.path)
            for migration in Schema.migrations where !applied.contains(migration.name) {
                try db.execute(migration.sql)
                try db.run("INSERT INTO migrations (name, applied_at) VALUES (?, ?)", [.text(migration.name), .int(Identifiers.nowMs())])
            }
        }
    }

    // MARK: Reading

    static let entryColumns = """
        seq, id, internal, key, vars, state, reason, generation, request, body, body_file, body_hash, total_bytes,
        bytes_sent, attempts, idempotency_key, account, scope, parent, header_generation, created_at, updated_at,
        expires_at, not_before, next_attempt_at, lease_owner, last_request_id, waits_for_delivery
        """

    /// Entries of one definition usually share their stored request text: parsed once.
    func storedRequest(_ text: String) throws(OutboxError) -> StoredRequest {
        if let cached = requestCache[text] { return cached }
        let request = try StoredRequest(json: try Self.storedJSON(text, what: "stored request"))
        if requestCache.count >= 256 { requestCache.removeAll(keepingCapacity: true) }
        requestCache[text] = request
        return request
    }

    /// Parses a JSON column; a column that does not parse is damage, reported with the row's table.
    static func storedJSON(_ text: String, what: String) throws(OutboxError) -> JSON {
        do { return try JSON.parse(text) } catch { throw .storage("the \(what) is damaged: \(error)") }
    }

    /// An entry from its row. A row that does not read back whole fails with E_STORAGE
    /// naming what is damaged: a default in its place could send another request.
    func entryFromRow(_ r: SQLRow) throws(OutboxError) -> Entry {
        let id = r.text(1)
        guard let state = EntryState(rawValue: r.text(5)) else {
            throw .storage("the stored entry \(id) is damaged: unknown state \"\(r.text(5))\"")
        }
        // The request and body name what is damaged; the entry's id says where.
        let request: StoredRequest
        let body: StoredBody
        do throws(OutboxError) {
            request = try storedRequest(r.text(8))
            body = try StoredBody(kind: request.bodyKind, inline: r.blob(9), file: r.optionalText(10), form: request.form)
        } catch {
            throw .storage("\(error.message) (entry \(id))")
        }
        return Entry(
            seq: r.int(0), id: id, internalID: r.text(2), key: r.text(3),
            vars: try Self.storedJSON(r.text(4), what: "vars of entry \(id)"),
            state: state, reason: r.optionalText(6), generation: r.int(7), request: request,
            body: body,
            bodyHash: r.text(11), totalBytes: r.int(12),
            bytesSent: r.int(13), attempts: r.int(14), idempotencyKey: r.optionalText(15), account: r.optionalText(16),
            scope: r.optionalText(17), parent: r.optionalText(18), headerGeneration: r.int(19), createdAt: r.int(20),
            updatedAt: r.int(21), expiresAt: r.optionalInt(22), notBefore: r.optionalInt(23), nextAttemptAt: r.optionalInt(24),
            leaseOwner: r.optionalText(25), lastRequestID: r.optionalText(26), waitsForDelivery: r.int(27) != 0)
    }

    package func entry(id: String) throws(OutboxError) -> Entry? {
        try db.queryOne("SELECT \(Self.entryColumns) FROM entries WHERE id = ?", [.text(id)], entryFromRow)
    }

    package func list(_ filter: ListFilter) throws(OutboxError) -> [Entry] {
        var sql = "SELECT \(Self.entryColumns) FROM entries WHERE 1=1"
        var values: [SQLValue] = []
        if let key = filter.key { sql += " AND key = ?"; values.append(.text(key)) }
        if let id = filter.id { sql += " AND id = ?"; values.append(.text(id)) }
        if let state = filter.state, state != "paused" { sql += " AND state = ?"; values.append(.text(state)) }
        if filter.state == "paused" { sql += " AND state = 'queued'" }
        sql += " ORDER BY seq"
        if let limit = filter.limit { sql += " LIMIT \(limit)" }
        return try db.query(sql, values, entryFromRow)
    }

    package func parts(entrySeq: Int64) throws(OutboxError) -> [StoredPart] {
        try db.query(
            """
            SELECT idx, start, end, url, headers, accepted, status, response_headers, attempts, next_attempt_at
            FROM parts WHERE entry_seq = ? ORDER BY idx
            """, [.int(entrySeq)]
        ) { r throws(OutboxError) in
            var responseHeaders: JSON?
            if let text = r.optionalText(7) { responseHeaders = try Self.storedJSON(text, what: "response headers of a part") }
            return StoredPart(
                index: Int(r.int(0)), range: ByteRange(start: r.int(1), end: r.int(2)), url: r.text(3),
                headers: HeaderRules.from(json: try Self.storedJSON(r.text(4), what: "headers of a part")), accepted: r.int(5) != 0,
                status: r.optionalInt(6).map(Int.init), responseHeaders: responseHeaders,
                attempts: Int(r.int(8)), nextAttemptAt: r.optionalInt(9))
        }
    }

    package func attempts(entryID: String) throws(OutboxError) -> [JSON] {
        try db.query("SELECT payload FROM attempts WHERE entry_id = ? ORDER BY seq DESC LIMIT 20", [.text(entryID)]) {
            (try? JSON.parse($0.text(0))) ?? .null
        }.reversed()
    }

    static let outcomeColumns = """
        seq, entry_id, key, generation, outcome, payload, deliveries, acknowledged, next_delivery_at, reason, hook_pgid,
        hook_start, created_at
        """

    static func outcome(_ r: SQLRow) throws(OutboxError) -> OutcomeRecord {
        guard let outcome = Outcome(rawValue: r.text(4)) else {
            throw .storage("the outcome of \(r.text(1)) is damaged: unknown outcome \"\(r.text(4))\"")
        }
        return OutcomeRecord(
            seq: r.int(0), entryID: r.text(1), key: r.text(2), generation: r.int(3), outcome: outcome,
            payload: try storedJSON(r.text(5), what: "outcome payload of \(r.text(1))"), deliveries: r.int(6), acknowledged: r.int(7) != 0,
            nextDeliveryAt: r.optionalInt(8), reason: r.optionalText(9), hookPgid: r.optionalInt(10).map { Int32($0) },
            hookStart: r.optionalInt(11).map { UInt64($0) }, createdAt: r.int(12))
    }

    package func outcomes(entryID: String) throws(OutboxError) -> [OutcomeRecord] {
        try db.query("SELECT \(Self.outcomeColumns) FROM outcomes WHERE entry_id = ? ORDER BY seq", [.text(entryID)], Self.outcome)
    }

    package func unacknowledgedOutcomes() throws(OutboxError) -> [OutcomeRecord] {
        try db.query("SELECT \(Self.outcomeColumns) FROM outcomes WHERE acknowledged = 0 ORDER BY seq", [], Self.outcome)
    }

    // MARK: Settings

    static let queuePausedSetting = "queue_paused"
    static let wifiOnlySetting = "wifi_only"
    static let headerGenerationSetting = "header_generation"

    package func control() throws(OutboxError) -> QueueControl {
        try db.read { () throws(OutboxError) -> QueueControl in
            QueueControl(
                queuePaused: try setting(Self.queuePausedSetting) == "1", pausedKeys: try pausedKeys(),
                wifiOnly: try setting(Self.wifiOnlySetting) == "1",
                headerGeneration: Int64(try setting(Self.headerGenerationSetting) ?? "0") ?? 0)
        }
    }

    static let heldHostsSetting = "held_hosts"

    package func heldHosts() throws(OutboxError) -> [String] {
        guard let text = try setting(Self.heldHostsSetting) else { return [] }
        return (try Self.storedJSON(text, what: "held hosts").arrayValue ?? []).compactMap(\.stringValue)
    }

    package func setHeldHosts(_ hosts: [String]) throws(OutboxError) {
        try setSetting(Self.heldHostsSetting, hosts.isEmpty ? nil : JSON.array(hosts.sorted().map { .string($0) }).serialized())
    }

    package func setQueuePaused(_ paused: Bool) throws(OutboxError) {
        try setSetting(Self.queuePausedSetting, paused ? "1" : nil)
    }

    package func setWifiOnly(_ on: Bool) throws(OutboxError) {
        try setSetting(Self.wifiOnlySetting, on ? "1" : nil)
    }

    func setting(_ name: String) throws(OutboxError) -> String? {
        try db.queryOne("SELECT value FROM settings WHERE name = ?", [.text(name)]) { $0.text(0) }
    }

    func setSetting(_ name: String, _ value: String?) throws(OutboxError) {
        try db.transaction { () throws(OutboxError) in
            if let value {
                try db.run(
                    "INSERT INTO settings (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    [.text(name), .text(value)])
            } else {
                try db.run("DELETE FROM settings WHERE name = ?", [.text(name)])
            }
        }
    }

    func pausedKeys() throws(OutboxError) -> Set<String> {
        Set(try db.query("SELECT key FROM paused_keys") { $0.text(0) })
    }

    package func setPaused(keys: [String], paused: Bool) throws(OutboxError) {
        try db.transaction { () throws(OutboxError) in
            for key in keys {
                if paused {
                    try db.run("INSERT OR IGNORE INTO paused_keys (key) VALUES (?)", [.text(key)])
                } else {
                    try db.run("DELETE FROM paused_keys WHERE key = ?", [.text(key)])
                }
            }
        }
    }

    package func dataVersion() throws(OutboxError) -> Int64 { try db.dataVersion() }
}
