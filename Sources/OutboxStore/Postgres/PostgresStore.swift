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
package final class PostgresStore: Store, SQLStore, @unchecked Sendable {
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
    var takenOverFiles: Set<String> = []
    var stagedInTransaction: [(body: StagedBody, moves: MoveJournal.Ticket?)] = []
    var requestCache = StoredRequestCache()
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
        csystem_restrict_umask()
        try SQLiteStore.checkStoreFolder(folder)
        let bodies = Paths.join(folder, "bodies")
        staging = Staging(bodiesDir: bodies)
        moves = MoveJournal(folder: Paths.join(folder, "moves"))
        db = try PGConnection(uri: url.connectionURI, name: url.redacted, scrub: url.scrub)
        try db.setSession("schema", "SET search_path TO \"\(url.schema)\"")
        try Self.migrate(db, url: url)
        clockOffset = try Self.measureClockOffset(db)
        try SQLiteStore.makeFolder(folder)
        try SQLiteStore.makeInnerFolder(bodies)
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
        let known = Set(PostgresSchema.migrations.map(\.name))
        // Up to date, as nearly always: no lock is taken, so a command (a runner that then
        // finds a store copy at work, and exits 75) is not kept waiting behind a long one.
        if let applied = try? db.query("SELECT name FROM migrations", { $0.text(0) }), Set(applied) == known { return }
        try db.transaction(lock: url.lockKey) { () throws(OutboxError) in
            try db.execute("CREATE SCHEMA IF NOT EXISTS \"\(url.schema)\"")
            try db.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at BIGINT NOT NULL)")
            let applied = Set(try db.query("SELECT name FROM migrations") { $0.text(0) })
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

    /// Writers that read before they write take the schema's lock, and their commit wakes runners.
    func writing<T>(_ body: () throws(OutboxError) -> T) throws(OutboxError) -> T { try db.transaction(lock: lockKey, body) }

    /// The claimed row, not the schema, is the unit of change: no advisory lock.
    func writingOwnRows<T>(_ body: () throws(OutboxError) -> T) throws(OutboxError) -> T { try db.quietTransaction(body) }

    /// The server keeps its own pages whole.
    func databaseProblems() throws(OutboxError) -> [String] { [] }

    func entriesStagedElsewhere() throws(OutboxError) -> Set<String> {
        guard !sharedStaging else { return [] }
        return Set(try db.query("SELECT id FROM entries WHERE body_host <> ?", [.text(host)]) { $0.text(0) })
    }

    /// A body on this host's disk (a staged or referenced file, form files) is claimed here only.
    func entryColumnsOfThisStore(_ staged: StagedBody) -> [(column: String, value: SQLValue)] {
        let onThisHost = staged.file != nil || staged.form.contains(where: { $0.stagedFile != nil })
        return [("body_host", .optional(onThisHost ? host : nil))]
    }

    /// Every write statement bumps `data_version`, this runner's own too.
    package var ownWrites: Int64 { 0 }

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
