import CSystem
import Glibc
import OutboxModel

/// The queue in a PostgreSQL schema, shared by the hosts that name it. Data, text and form
/// values live in the database; file bodies are staged in a local folder and stay on the
/// host that enqueued them (`body_host`), unless the staging folder is shared by every host.
///
/// A connection is confined to the thread that uses it. Every write transaction takes the
/// schema's advisory lock, so writers queue as SQLite's do and the same-id rules see one
/// order; claims take rows with `FOR UPDATE SKIP LOCKED` and write a lease token and end.
package final class PostgresStore: Store, @unchecked Sendable {
    package let url: PostgresURL
    /// The local folder of staged bodies, move journals and the staging lock.
    package let folder: String
    /// This host's name, recorded with the file bodies it stages and the hooks it starts.
    package let host: String
    /// Whether every host sees `folder` at the same path (file bodies may be sent from any).
    package let sharedStaging: Bool
    let db: PGConnection
    let staging: Staging
    let moves: MoveJournal
    var returns: [(file: String, source: String, identity: FileIdentity?)] = []
    var obsoleteFiles: [String] = []
    var requestCache: [String: StoredRequest] = [:]
    var returnsTicket: MoveJournal.Ticket?
    /// The database clock minus this host's, in ms: lease ends are database times.
    let clockOffset: Int64
    /// The token of each claim this store object made, by entry id: later changes match it.
    var claimTokens: [String: String] = [:]
    /// Entries whose claim a renewal found gone: changes to them stay fenced out.
    var lostClaims: Set<String> = []
    /// The runner whose hook deliveries this object claimed, and the outcomes it holds.
    var deliveryOwner: String?
    var deliveryClaims: Set<Int64> = []
    /// Set while a runner listens for the schema's wake-ups on this connection.
    var listening = false
    /// The data version last read, and when (monotonic ms).
    var knownVersion: (version: Int64, readAt: Int64)?

    var lockKey: Int32 { url.lockKey }

    /// Connects, creates the schema and applies its migrations, and opens the local
    /// staging folder. E_STORAGE with the server's message when any of that fails.
    package init(url: PostgresURL, folder: String, host: String? = nil, sharedStaging: Bool = false) throws(OutboxError) {
        self.url = url
        self.folder = folder
        self.host = host ?? Self.hostName()
        self.sharedStaging = sharedStaging
        umask(0o077)
        try SQLiteStore.checkStoreFolder(folder)
        let bodies = Paths.join(folder, "bodies")
        staging = Staging(bodiesDir: bodies)
        moves = MoveJournal(folder: Paths.join(folder, "moves"))
        db = try PGConnection(uri: url.connectionURI, name: url.redacted)
        try db.setSession("schema", "SET search_path TO \"\(url.schema)\"")
        try Self.migrate(db, url: url)
        clockOffset = try Self.measureClockOffset(db)
        try SQLiteStore.makeFolder(folder)
        try SQLiteStore.makeFolder(bodies)
        let host = self.host
        for line in try moves.recover(owned: { [db] staged throws(OutboxError) in
            try db.queryOne("SELECT 1 FROM entries WHERE body_file = ? AND body_host = ?", [.text(staged), .text(host)]) { _ in true }
                ?? false
        }) {
            FileIO.log("outbox: \(line)")
        }
    }

    static func hostName() -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return "localhost" }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Creates the schema and applies the migrations it lacks under the schema's lock (two
    /// processes may open a new schema at once). A schema made by a newer outbox is refused.
    static func migrate(_ db: PGConnection, url: PostgresURL) throws(OutboxError) {
        try db.transaction(lock: url.lockKey) { () throws(OutboxError) in
            try db.execute("CREATE SCHEMA IF NOT EXISTS \"\(url.schema)\"")
            try db.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at BIGINT NOT NULL)")
            let applied = Set(try db.query("SELECT name FROM migrations") { $0.text(0) })
            let known = Set(PostgresSchema.migrations.map(\.name))
            if let newer = applied.subtracting(known).sorted().last {
                throw .storage(
                    "the schema \(url.schema) of \(url.redacted) was made by a newer outbox (it has migration \(newer)); use that version")
            }
            for migration in PostgresSchema.migrations where !applied.contains(migration.name) {
                try db.execute(migration.sql)
                try db.run("INSERT INTO migrations (name, applied_at) VALUES (?, ?)", [.text(migration.name), .int(Identifiers.nowMs())])
            }
        }
    }

    /// The database clock minus ours, measured over one round trip. Under a second it is
    /// taken as none: the measurement's own jitter would move lease ends either way.
    static func measureClockOffset(_ db: PGConnection) throws(OutboxError) -> Int64 {
        let before = Identifiers.nowMs()
        let server = try db.queryOne("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint") { $0.int(0) } ?? before
        let after = Identifiers.nowMs()
        let offset = server - (before + after) / 2
        return abs(offset) < 1_000 ? 0 : offset
    }

    // MARK: Reading

    static let entryColumns = SQLiteStore.entryColumns

    func storedRequest(_ text: String) throws(OutboxError) -> StoredRequest {
        if let cached = requestCache[text] { return cached }
        let request = try StoredRequest(json: try SQLiteStore.storedJSON(text, what: "stored request"))
        if requestCache.count >= 256 { requestCache.removeAll(keepingCapacity: true) }
        requestCache[text] = request
        return request
    }

    /// An entry from its row; a row that does not read back whole is E_STORAGE naming it.
    func entryFromRow(_ r: PGRow) throws(OutboxError) -> Entry {
        let id = r.text(1)
        guard let state = EntryState(rawValue: r.text(5)) else {
            throw .storage("the stored entry \(id) is damaged: unknown state \"\(r.text(5))\"")
        }
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
            vars: try SQLiteStore.storedJSON(r.text(4), what: "vars of entry \(id)"),
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
            SELECT idx, start, "end", url, headers, accepted, status, response_headers, attempts, next_attempt_at
            FROM parts WHERE entry_seq = ? ORDER BY idx
            """, [.int(entrySeq)]
        ) { r throws(OutboxError) in
            var responseHeaders: JSON?
            if let text = r.optionalText(7) { responseHeaders = try SQLiteStore.storedJSON(text, what: "response headers of a part") }
            return StoredPart(
                index: Int(r.int(0)), range: ByteRange(start: r.int(1), end: r.int(2)), url: r.text(3),
                headers: HeaderRules.from(json: try SQLiteStore.storedJSON(r.text(4), what: "headers of a part")),
                accepted: r.int(5) != 0, status: r.optionalInt(6).map(Int.init), responseHeaders: responseHeaders,
                attempts: Int(r.int(8)), nextAttemptAt: r.optionalInt(9))
        }
    }

    package func attempts(entryID: String) throws(OutboxError) -> [JSON] {
        try db.query("SELECT payload FROM attempts WHERE entry_id = ? ORDER BY seq DESC LIMIT 20", [.text(entryID)]) {
            (try? JSON.parse($0.text(0))) ?? .null
        }.reversed()
    }

    static let outcomeColumns = SQLiteStore.outcomeColumns

    static func outcome(_ r: PGRow) throws(OutboxError) -> OutcomeRecord {
        guard let outcome = Outcome(rawValue: r.text(4)) else {
            throw .storage("the outcome of \(r.text(1)) is damaged: unknown outcome \"\(r.text(4))\"")
        }
        return OutcomeRecord(
            seq: r.int(0), entryID: r.text(1), key: r.text(2), generation: r.int(3), outcome: outcome,
            payload: try SQLiteStore.storedJSON(r.text(5), what: "outcome payload of \(r.text(1))"), deliveries: r.int(6),
            acknowledged: r.int(7) != 0, nextDeliveryAt: r.optionalInt(8), reason: r.optionalText(9),
            hookPgid: r.optionalInt(10).map { Int32($0) }, hookStart: r.optionalInt(11).map { UInt64($0) }, createdAt: r.int(12))
    }

    package func outcomes(entryID: String) throws(OutboxError) -> [OutcomeRecord] {
        try db.query("SELECT \(Self.outcomeColumns) FROM outcomes WHERE entry_id = ? ORDER BY seq", [.text(entryID)], Self.outcome)
    }

    package func unacknowledgedOutcomes() throws(OutboxError) -> [OutcomeRecord] {
        try db.query("SELECT \(Self.outcomeColumns) FROM outcomes WHERE acknowledged = 0 ORDER BY seq", [], Self.outcome)
    }

    // MARK: Settings

    package func control() throws(OutboxError) -> QueueControl {
        try db.read { () throws(OutboxError) -> QueueControl in
            QueueControl(
                queuePaused: try setting(SQLiteStore.queuePausedSetting) == "1", pausedKeys: try pausedKeys(),
                wifiOnly: try setting(SQLiteStore.wifiOnlySetting) == "1",
                headerGeneration: Int64(try setting(SQLiteStore.headerGenerationSetting) ?? "0") ?? 0)
        }
    }

    package func heldHosts() throws(OutboxError) -> [String] {
        guard let text = try setting(SQLiteStore.heldHostsSetting) else { return [] }
        return (try SQLiteStore.storedJSON(text, what: "held hosts").arrayValue ?? []).compactMap(\.stringValue)
    }

    package func setHeldHosts(_ hosts: [String]) throws(OutboxError) {
        try setSetting(SQLiteStore.heldHostsSetting, hosts.isEmpty ? nil : JSON.array(hosts.sorted().map { .string($0) }).serialized())
    }

    package func setQueuePaused(_ paused: Bool) throws(OutboxError) {
        try setSetting(SQLiteStore.queuePausedSetting, paused ? "1" : nil)
    }

    package func setWifiOnly(_ on: Bool) throws(OutboxError) {
        try setSetting(SQLiteStore.wifiOnlySetting, on ? "1" : nil)
    }

    func setting(_ name: String) throws(OutboxError) -> String? {
        try db.queryOne("SELECT value FROM settings WHERE name = ?", [.text(name)]) { $0.text(0) }
    }

    func setSetting(_ name: String, _ value: String?) throws(OutboxError) {
        // Read, then written: one writer at a time, and the commit wakes the runners.
        try db.transaction(lock: lockKey) { () throws(OutboxError) in
            // Unchanged: no write, so runners polling the data version are not woken for nothing.
            guard try setting(name) != value else { return }
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
        // A pause is the runners' business: the locked commit wakes them.
        try db.transaction(lock: lockKey) { () throws(OutboxError) in
            for key in keys {
                if paused {
                    try db.run("INSERT INTO paused_keys (key) VALUES (?) ON CONFLICT DO NOTHING", [.text(key)])
                } else {
                    try db.run("DELETE FROM paused_keys WHERE key = ?", [.text(key)])
                }
            }
        }
    }

    /// While a runner listens, the version is read again only after a wake-up, or once a
    /// second in case one was missed; otherwise at every call.
    package func dataVersion() throws(OutboxError) -> Int64 {
        let mono = Identifiers.monotonicMs()
        if listening, try db.takeNotifications() == 0, let known = knownVersion, mono - known.readAt < 1_000 {
            return known.version
        }
        let version = try db.queryOne("SELECT version FROM data_version WHERE one = 1") { $0.int(0) } ?? 0
        knownVersion = (version, mono)
        return version
    }
}
