import CSQLite
import Glibc
import OutboxModel

/// A value bound to or read from an SQL statement.
enum SQLValue: Sendable {
    case null
    case int(Int64)
    case text(String)
    case blob([UInt8])

    static func optional(_ v: Int64?) -> SQLValue { v.map { .int($0) } ?? .null }
    static func optional(_ v: String?) -> SQLValue { v.map { .text($0) } ?? .null }
    static func int(_ v: Int) -> SQLValue { .int(Int64(v)) }
    static func bool(_ v: Bool) -> SQLValue { .int(v ? 1 : 0) }
}

/// A row of a result, read by column index while the statement is positioned on it.
struct SQLRow: SQLRowReading {
    fileprivate let statement: OpaquePointer

    func isNull(_ i: Int32) -> Bool { sqlite3_column_type(statement, i) == SQLITE_NULL }
    func int(_ i: Int32) -> Int64 { sqlite3_column_int64(statement, i) }
    func text(_ i: Int32) -> String {
        guard let p = sqlite3_column_text(statement, i) else { return "" }
        let n = Int(sqlite3_column_bytes(statement, i))
        return String(decoding: UnsafeBufferPointer(start: p, count: n), as: UTF8.self)
    }
    /// The column's UTF-8 bytes, valid only inside `body` (no String is made).
    func withText<T>(_ i: Int32, _ body: (UnsafeBufferPointer<UInt8>) -> T) -> T {
        guard let p = sqlite3_column_text(statement, i) else { return body(UnsafeBufferPointer(start: nil, count: 0)) }
        return body(UnsafeBufferPointer(start: p, count: Int(sqlite3_column_bytes(statement, i))))
    }
    func blob(_ i: Int32) -> [UInt8]? {
        if isNull(i) { return nil }
        let n = Int(sqlite3_column_bytes(statement, i))
        guard n > 0, let p = sqlite3_column_blob(statement, i) else { return [] }
        return Array(UnsafeRawBufferPointer(start: p, count: n))
    }
}

/// One SQLite connection, confined to the thread that uses it; statements cached by SQL text.
///
/// Opened in WAL mode with `synchronous=FULL` (per connection: set on every open) and a busy timeout,
/// so several `enqueue` processes and one runner share a store safely.
final class SQLiteConnection: SQLDatabase, @unchecked Sendable {
    private let db: OpaquePointer
    private var statements: [String: OpaquePointer] = [:]
    /// The same statements by the address of their text's bytes, with the text: a literal's
    /// bytes stay at one address, so this finds it without hashing the whole text (which cost
    /// a runner's commit about 2,000 instructions a statement). The text is compared on a hit,
    /// and held here, so no other text can come to live at that address. A text built at run
    /// time has a new address each time: the table is emptied when it reaches
    /// `maxAddresses`, or a long run would hold every copy.
    private var statementsByAddress: [Int: (sql: String, statement: OpaquePointer)] = [:]
    static let maxAddresses = 256
    /// How many texts the address table holds now (for its test).
    var statementAddressCount: Int { statementsByAddress.count }
    private var transactionDepth = 0
    let path: String

    /// How a connection opens its database.
    enum Access {
        case readWrite
        /// Queries only; nothing is changed, not even the journal mode.
        case readOnly
        /// Queries only, on a file no process has open: SQLite then creates no -wal or -shm
        /// beside it, which could be another user's files (a root shell completing in a project).
        case readOnlyUnopened
    }

    /// How long this connection waits for another process's lock, and who hears of a long wait.
    let busyWait: SQLiteBusyWait

    static let maxPathBytes = 504

    /// Process-wide settings, made once before the first connection opens (SQLite takes them
    /// only before its first use; every use here starts with a connection).
    private static let processSettings: Void = { _ = csqlite_skip_memory_statistics() }()

    /// Opens the database at `path`, waiting at most `busyTimeoutMs` for a lock. Writers wait
    /// long by default: another process's large batch holds the lock while it inserts.
    init(path: String, access: Access = .readWrite, busyTimeoutMs: Int64 = 600_000) throws(OutboxError) {
        _ = Self.processSettings
        busyWait = SQLiteBusyWait(limitMs: busyTimeoutMs)
        self.path = path
        // SQLite's file names end within 512 bytes, "-journal" included; past that it says only "unable to open".
        if path.utf8.count > Self.maxPathBytes {
            throw .storage(
                "cannot open the store database \(path): its path is \(path.utf8.count) bytes, over the \(Self.maxPathBytes) SQLite can open; move the project, or give `store:` a shorter folder"
            )
        }
        var handle: OpaquePointer?
        let rc: Int32
        switch access {
        case .readWrite:
            rc = sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nil)
        case .readOnly:
            rc = sqlite3_open_v2(path, &handle, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nil)
        case .readOnlyUnopened:
            let uri = "file:" + Self.uriEncoded(path) + "?immutable=1"
            rc = sqlite3_open_v2(uri, &handle, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, nil)
        }
        guard rc == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            if let handle { sqlite3_close_v2(handle) }
            throw .storage("cannot open the store database \(path): \(message)")
        }
        db = handle
        sqlite3_extended_result_codes(db, 1)
        busyWait.install(on: handle)
        if access != .readWrite { return }
        // Until the database reads as one, closing must not fold the log into it: a damaged
        // outbox.db would take the log's pages and the log, holding the last commits, would go.
        _ = csqlite_no_checkpoint_on_close(db, 1)
        let mode = try scalarText("PRAGMA journal_mode=WAL")
        guard mode.lowercased() == "wal" else {
            throw .storage("the store database \(path) refused WAL mode (got \(mode))")
        }
        try execute("PRAGMA synchronous=FULL")
        try execute("PRAGMA foreign_keys=ON")
        // A forgotten entry's bytes (its headers may hold credentials) are zeroed in the file, not
        // left in free space: Debian builds SQLite this way, other builds may not.
        try execute("PRAGMA secure_delete=ON")
        _ = csqlite_no_checkpoint_on_close(db, 0)
    }

    /// A path as a `file:` URI's path: bytes other than unreserved ones and `/` percent-encoded.
    static func uriEncoded(_ path: String) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        var out: [UInt8] = []
        for byte in path.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"), UInt8(ascii: "/"):
                out.append(byte)
            default:
                out += [UInt8(ascii: "%"), hex[Int(byte >> 4)], hex[Int(byte & 0xF)]]
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    deinit {
        for statement in statements.values { sqlite3_finalize(statement) }
        if keepsLog, (FileInfo.stat(path + "-wal")?.size ?? 0) > Self.foldBackAboveBytes {
            // Without waiting: a process still reading keeps the log, and a later close folds it back.
            sqlite3_busy_timeout(db, 0)
            sqlite3_wal_checkpoint_v2(db, nil, SQLITE_CHECKPOINT_TRUNCATE, nil, nil)
        }
        sqlite3_close_v2(db)
    }

    private func failure(_ context: String) -> OutboxError {
        if sqlite3_errcode(db) == SQLITE_BUSY {
            return .storage(
                "\(context): another process held its lock for \(Units.formatDuration(ms: busyWait.limitMs)) (\(path))")
        }
        return .storage("\(context): \(String(cString: sqlite3_errmsg(db))) (\(path))")
    }

    func execute(_ sql: String) throws(OutboxError) {
        var error: UnsafeMutablePointer<CChar>?
        if sqlite3_exec(db, sql, nil, nil, &error) != SQLITE_OK {
            let message = error.map { String(cString: $0) } ?? "unknown error"
            sqlite3_free(error)
            throw .storage("\(message) (\(path))")
        }
    }

    private func statement(_ sql: String) throws(OutboxError) -> OpaquePointer {
        // Only a text with storage of its own has a lasting address (up to 15 bytes live inline).
        let address = sql.utf8.count > 15 ? sql.utf8.withContiguousStorageIfAvailable { Int(bitPattern: $0.baseAddress) } : nil
        if let address, let hit = statementsByAddress[address], hit.sql == sql { return hit.statement }
        if let cached = statements[sql] {
            if let address { remember(cached, sql, at: address) }
            return cached
        }
        var statement: OpaquePointer?
        guard sqlite3_prepare_v3(db, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil) == SQLITE_OK,
            let statement
        else {
            throw failure("cannot prepare a statement")
        }
        statements[sql] = statement
        if let address { remember(statement, sql, at: address) }
        return statement
    }

    private func remember(_ statement: OpaquePointer, _ sql: String, at address: Int) {
        if statementsByAddress.count >= Self.maxAddresses { statementsByAddress.removeAll(keepingCapacity: true) }
        statementsByAddress[address] = (sql, statement)
    }

    private func bind(_ statement: OpaquePointer, _ values: [SQLValue]) throws(OutboxError) {
        for (offset, value) in values.enumerated() {
            let i = Int32(offset + 1)
            let rc: Int32
            switch value {
            case .null: rc = sqlite3_bind_null(statement, i)
            case let .int(v): rc = sqlite3_bind_int64(statement, i, v)
            // withCString reads a native string in place; passing `v` itself would copy it.
            case let .text(v): rc = v.withCString { csqlite_bind_text(statement, i, $0, -1) }
            case let .blob(v): rc = v.withUnsafeBytes { csqlite_bind_blob(statement, i, $0.baseAddress, Int32($0.count)) }
            }
            guard rc == SQLITE_OK else { throw failure("cannot bind a value") }
        }
    }

    /// Runs a statement that returns no rows; returns the number of rows changed.
    @discardableResult
    func run(_ sql: String, _ values: [SQLValue] = []) throws(OutboxError) -> Int {
        let statement = try statement(sql)
        defer { sqlite3_reset(statement); sqlite3_clear_bindings(statement) }
        try bind(statement, values)
        let rc = sqlite3_step(statement)
        guard rc == SQLITE_DONE || rc == SQLITE_ROW else { throw failure("cannot write to the store") }
        return Int(sqlite3_changes(db))
    }

    /// Runs a query and maps every row; the statement is reset at once (an open read holds
    /// back WAL checkpoints).
    func query<T>(_ sql: String, _ values: [SQLValue] = [], _ map: (SQLRow) throws(OutboxError) -> T) throws(OutboxError) -> [T] {
        let statement = try statement(sql)
        defer { sqlite3_reset(statement); sqlite3_clear_bindings(statement) }
        try bind(statement, values)
        var rows: [T] = []
        while true {
            let rc = sqlite3_step(statement)
            if rc == SQLITE_DONE { break }
            // An INSERT ... RETURNING reads rows too: say which the failure was.
            guard rc == SQLITE_ROW else {
                throw failure(sqlite3_stmt_readonly(statement) != 0 ? "cannot read the store" : "cannot write to the store")
            }
            rows.append(try map(SQLRow(statement: statement)))
        }
        return rows
    }

    /// Runs a query and hands each row to `body` as it is read, holding none of them.
    func forEach(_ sql: String, _ values: [SQLValue] = [], _ body: (SQLRow) throws(OutboxError) -> Void) throws(OutboxError) {
        let statement = try statement(sql)
        defer { sqlite3_reset(statement); sqlite3_clear_bindings(statement) }
        try bind(statement, values)
        while true {
            let rc = sqlite3_step(statement)
            if rc == SQLITE_DONE { break }
            guard rc == SQLITE_ROW else { throw failure("cannot read the store") }
            try body(SQLRow(statement: statement))
        }
    }

    func queryOne<T>(_ sql: String, _ values: [SQLValue] = [], _ map: (SQLRow) throws(OutboxError) -> T) throws(OutboxError) -> T? {
        try query(sql, values, map).first
    }

    private func scalarText(_ sql: String) throws(OutboxError) -> String {
        try queryOne(sql) { $0.text(0) } ?? ""
    }

    var lastInsertRowID: Int64 { sqlite3_last_insert_rowid(db) }

    /// Runs `body` in one read transaction (a deferred `BEGIN`: no write lock), so that many
    /// reads share one snapshot instead of each taking and dropping its own.
    func read<T>(_ body: () throws(OutboxError) -> T) throws(OutboxError) -> T {
        if transactionDepth > 0 { return try body() }
        try execute("BEGIN")
        transactionDepth += 1
        defer {
            transactionDepth -= 1
            try? execute("COMMIT")
        }
        return try body()
    }

    /// Runs `body` in one `BEGIN IMMEDIATE` transaction; rolls back on a throw. (A deferred
    /// one that writes later gets SQLITE_BUSY_SNAPSHOT, with no busy wait.)
    @discardableResult
    func transaction<T>(_ body: () throws(OutboxError) -> T) throws(OutboxError) -> T {
        if transactionDepth > 0 { return try body() }
        // BEGIN and COMMIT run as cached statements: through sqlite3_exec each was parsed
        // and prepared again, a tenth of a runner's commit.
        try run("BEGIN IMMEDIATE")
        transactionDepth += 1
        do throws(OutboxError) {
            let result = try body()
            transactionDepth -= 1
            do throws(OutboxError) {
                try run("COMMIT")
            } catch {
                try? execute("ROLLBACK")
                throw error
            }
            return result
        } catch {
            transactionDepth -= 1
            try? execute("ROLLBACK")
            throw error
        }
    }

    /// A transaction whose commit is not fsynced (`synchronous=NORMAL` for it alone). In WAL
    /// mode it survives a crash of the process (the log is in the page cache) and becomes
    /// durable with the next synced commit; only a power loss before that can drop it. For
    /// records that matter only while the machine stays up; inside another transaction, the
    /// outer one's commit decides.
    @discardableResult
    func transactionWithoutSync<T>(_ body: () throws(OutboxError) -> T) throws(OutboxError) -> T {
        if transactionDepth > 0 { return try body() }
        try run("PRAGMA synchronous=NORMAL")
        let result: Result<T, OutboxError>
        do throws(OutboxError) { result = .success(try transaction(body)) } catch { result = .failure(error) }
        try run("PRAGMA synchronous=FULL")
        return try result.get()
    }

    /// Rows changed by this connection since it opened; no query, no lock.
    var totalChanges: Int64 { sqlite3_total_changes64(db) }

    /// Changes whenever another connection commits; cheap to poll.
    func dataVersion() throws(OutboxError) -> Int64 {
        try queryOne("PRAGMA data_version") { $0.int(0) } ?? 0
    }

    /// Leaves the write-ahead log as it is when the connection closes (while it is small). Folding it back then
    /// cost every short command 3 `fdatasync`s and the log's unlink and re-creation, more
    /// than the next process spends reading the log's frames back; SQLite still folds it
    /// back as it grows (`wal_autocheckpoint`), and the runner when it ends.
    func keepLogOnClose() {
        keepsLog = csqlite_no_checkpoint_on_close(db, 1) == SQLITE_OK
    }

    /// Set by `keepLogOnClose`.
    private var keepsLog = false
    /// A log larger than this is folded back at close: every process that opens the store
    /// after the last one closed reads the whole log back (about 0.45 ms per MiB here).
    static let foldBackAboveBytes: Int64 = 256 << 10

    func checkpoint() {
        _ = try? execute("PRAGMA wal_checkpoint(TRUNCATE)")
    }
}
