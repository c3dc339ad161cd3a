import CLibPQ
import Glibc
import OutboxModel

/// A row of a PostgreSQL result, read by column index; results come in text format.
struct PGRow: SQLRowReading {
    fileprivate let pq: LibPQ
    fileprivate let result: OpaquePointer
    fileprivate let row: Int32

    func isNull(_ i: Int32) -> Bool { pq.getisnull(result, row, i) != 0 }
    func int(_ i: Int32) -> Int64 {
        guard let p = pq.getvalue(result, row, i) else { return 0 }
        return strtoll(p, nil, 10)
    }
    func text(_ i: Int32) -> String {
        guard let p = pq.getvalue(result, row, i) else { return "" }
        return String(cString: p)
    }
    /// The column's UTF-8 bytes, valid only inside `body` (no String is made).
    func withText<T>(_ i: Int32, _ body: (UnsafeBufferPointer<UInt8>) -> T) -> T {
        guard let p = pq.getvalue(result, row, i) else { return body(UnsafeBufferPointer(start: nil, count: 0)) }
        return p.withMemoryRebound(to: UInt8.self, capacity: Int(pq.getlength(result, row, i))) {
            body(UnsafeBufferPointer(start: $0, count: Int(pq.getlength(result, row, i))))
        }
    }
    /// A bytea column: text results spell it `\x` and two hex digits a byte.
    func blob(_ i: Int32) -> [UInt8]? {
        if isNull(i) { return nil }
        return withText(i) { text -> [UInt8] in
            guard text.count >= 2, text[0] == UInt8(ascii: "\\"), text[1] == UInt8(ascii: "x") else { return Array(text) }
            var out: [UInt8] = []
            out.reserveCapacity((text.count - 2) / 2)
            var i = 2
            while i + 1 < text.count {
                out.append(Self.hex(text[i]) << 4 | Self.hex(text[i + 1]))
                i += 2
            }
            return out
        }
    }

    private static func hex(_ c: UInt8) -> UInt8 {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
        default: return 0
        }
    }
}

/// One libpq connection, confined to the thread that uses it; statements prepared once per
/// SQL text. SQL is written with `?` placeholders, numbered for PostgreSQL here.
final class PGConnection: SQLDatabase, @unchecked Sendable {
    let pq: LibPQ
    let conn: OpaquePointer
    var statements: [String: String] = [:]
    var transactionDepth = 0
    /// The SQLSTATE of the last statement the server refused (`40P01`: a deadlock).
    var lastSQLState: String?
    /// Set when a transaction whose COMMIT lost its answer turned out rolled back.
    var rerunRolledBack = false
    /// Whether the open transaction holds the schema's lock (and so wakes runners).
    private var locked = false
    /// The server as messages name it: the URL without its password.
    let name: String
    /// What a dropped connection does: nil fails the statement (commands); a runner's
    /// reconnects and runs the statement or transaction again from its start.
    var reconnect: ReconnectPolicy?
    /// Clears what a transaction's body built besides its SQL, before it runs again.
    var beforeRetry: (() -> Void)?
    /// Session settings (search path, LISTEN) and session locks, set again after a reconnect.
    var session: [(name: String, sql: String)] = []
    var sessionLocks: [(key: Int32, shared: Bool)] = []

    /// Connects with a libpq connection URI; E_STORAGE with the server's message when that
    /// fails (the password never appears in it).
    init(uri: String, name: String, scrub: (String) -> String = { $0 }) throws(OutboxError) {
        self.name = name
        let pq = try LibPQ.get()
        self.pq = pq
        guard let c = pq.connectdb(uri) else { throw .storage("cannot connect to the PostgreSQL store \(name): out of memory") }
        guard pq.status(c) == CONNECTION_OK else {
            let message = scrub(Self.trimmed(pq.errorMessage(c)))
            pq.finish(c)
            // libpq refusing the URL's own options (a misspelt parameter, a value of the wrong
            // kind) is a mistake in the config, which no retry mends.
            let detail = message.firstRange(of: " failed: ").map { String(message[$0.upperBound...]) } ?? message
            if detail.hasPrefix("invalid ") {
                throw OutboxError(.config, "store: the PostgreSQL URL \(name) is refused: \(detail)")
            }
            throw .storage("cannot connect to the PostgreSQL store \(name): \(message)")
        }
        conn = c
        // A connection the server ends says so in the error outbox reports when it reconnects.
        _ = pq.setNoticeProcessor(c, { _, _ in }, nil)
        // The server's notices ("schema already exists, skipping") are not the user's business.
        try setSession("notices", "SET client_min_messages TO warning")
    }

    deinit { pq.finish(conn) }

    private static func trimmed(_ p: UnsafePointer<CChar>?) -> String {
        guard let p else { return "unknown error" }
        var text = String(cString: p)
        while let last = text.last, last.isWhitespace { text.removeLast() }
        // libpq prefixes several lines; one line reads better after "outbox: E_STORAGE:".
        return text.split(separator: "\n").map { String($0).trimmingSpaces }.joined(separator: "; ")
    }

    private func failure(_ result: OpaquePointer?, _ context: String) -> OutboxError {
        // PG_DIAG_SQLSTATE is 'C'.
        lastSQLState = result.flatMap { pq.resultErrorField($0, Int32(UInt8(ascii: "C"))) }.map { String(cString: $0) }
        let message = result.flatMap { pq.resultErrorMessage($0) }.map { Self.trimmed($0) } ?? Self.trimmed(pq.errorMessage(conn))
        let text = message.isEmpty ? Self.trimmed(pq.errorMessage(conn)) : message
        return .storage("\(context): \(text) (\(name))")
    }

    /// Runs SQL without parameters (several statements allowed): migrations, BEGIN, LISTEN.
    func execute(_ sql: String) throws(OutboxError) {
        if transactionDepth > 0 { return try executeOnce(sql) }
        try retrying { () throws(OutboxError) in try executeOnce(sql) }
    }

    /// Runs `sql` now and again on every new connection of this session (nil forgets `name`).
    func setSession(_ name: String, _ sql: String?) throws(OutboxError) {
        session.removeAll { $0.name == name }
        guard let sql else { return }
        try execute(sql)
        session.append((name, sql))
    }

    func executeOnce(_ sql: String) throws(OutboxError) {
        let result = pq.exec(conn, sql)
        defer { pq.clear(result) }
        let status = result.map { pq.resultStatus($0) } ?? PGRES_FATAL_ERROR
        guard status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK || status == PGRES_EMPTY_QUERY else {
            throw failure(result, "the store refused a statement")
        }
    }

    /// `?` placeholders become `$1`, `$2`, ...; quoted text is left alone.
    static func numbered(_ sql: String) -> String {
        var out = ""
        var n = 0
        var quote: Character?
        for c in sql {
            if let q = quote {
                if c == q { quote = nil }
                out.append(c)
            } else if c == "'" || c == "\"" {
                quote = c
                out.append(c)
            } else if c == "?" {
                n += 1
                out += "$\(n)"
            } else {
                out.append(c)
            }
        }
        return out
    }

    private func prepared(_ sql: String, count: Int) throws(OutboxError) -> String {
        if let name = statements[sql] { return name }
        let name = "s\(statements.count)"
        let result = pq.prepare(conn, name, Self.numbered(sql), 0, nil)
        defer { pq.clear(result) }
        guard let result, pq.resultStatus(result) == PGRES_COMMAND_OK else { throw failure(result, "cannot prepare a statement") }
        statements[sql] = name
        return name
    }

    /// Executes a prepared statement; the caller clears the result.
    private func exec(_ sql: String, _ values: [SQLValue]) throws(OutboxError) -> OpaquePointer {
        if transactionDepth > 0 { return try execOnce(sql, values) }
        return try retrying { () throws(OutboxError) in try execOnce(sql, values) }
    }

    func execOnce(_ sql: String, _ values: [SQLValue]) throws(OutboxError) -> OpaquePointer {
        let statement = try prepared(sql, count: values.count)
        // Text parameters, except bodies, sent as binary bytes (no escaping).
        var buffers: [[CChar]?] = []
        var lengths: [Int32] = []
        var formats: [Int32] = []
        for value in values {
            switch value {
            case .null:
                buffers.append(nil); lengths.append(0); formats.append(0)
            case let .int(v):
                buffers.append(Array(String(v).utf8CString)); lengths.append(0); formats.append(0)
            case let .text(v):
                buffers.append(Array(v.utf8CString)); lengths.append(0); formats.append(0)
            case let .blob(v):
                buffers.append(v.map { CChar(bitPattern: $0) }); lengths.append(Int32(v.count)); formats.append(1)
            }
        }
        let result = withPointers(buffers) { pointers in
            pq.execPrepared(conn, statement, Int32(values.count), pointers, lengths, formats, 0)
        }
        let status = result.map { pq.resultStatus($0) } ?? PGRES_FATAL_ERROR
        guard let result, status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK else {
            let error = failure(result, "the store refused a statement")
            pq.clear(result)
            throw error
        }
        return result
    }

    private func withPointers<T>(_ buffers: [[CChar]?], _ body: ([UnsafePointer<CChar>?]) -> T) -> T {
        var pointers: [UnsafePointer<CChar>?] = []
        var owned: [UnsafeMutablePointer<CChar>] = []
        for buffer in buffers {
            guard let buffer else { pointers.append(nil); continue }
            let p = UnsafeMutablePointer<CChar>.allocate(capacity: max(1, buffer.count))
            p.initialize(from: buffer, count: buffer.count)
            owned.append(p)
            pointers.append(UnsafePointer(p))
        }
        defer { for p in owned { p.deallocate() } }
        return body(pointers)
    }

    /// Runs a statement that returns no rows; returns the number of rows changed.
    @discardableResult
    func run(_ sql: String, _ values: [SQLValue] = []) throws(OutboxError) -> Int {
        let result = try exec(sql, values)
        defer { pq.clear(result) }
        return pq.cmdTuples(result).flatMap { Int(String(cString: $0)) } ?? 0
    }

    func query<T>(_ sql: String, _ values: [SQLValue] = [], _ map: (PGRow) throws(OutboxError) -> T) throws(OutboxError) -> [T] {
        let result = try exec(sql, values)
        defer { pq.clear(result) }
        var rows: [T] = []
        let n = pq.ntuples(result)
        rows.reserveCapacity(Int(n))
        for i in 0..<n { rows.append(try map(PGRow(pq: pq, result: result, row: i))) }
        return rows
    }

    func forEach(_ sql: String, _ values: [SQLValue] = [], _ body: (PGRow) throws(OutboxError) -> Void) throws(OutboxError) {
        _ = try query(sql, values, body)
    }

    func queryOne<T>(_ sql: String, _ values: [SQLValue] = [], _ map: (PGRow) throws(OutboxError) -> T) throws(OutboxError) -> T? {
        try query(sql, values, map).first
    }

    /// Runs `body` in one read-only snapshot, so that many reads agree with each other.
    func read<T>(_ body: () throws(OutboxError) -> T) throws(OutboxError) -> T {
        if transactionDepth > 0 { return try body() }
        return try retrying { () throws(OutboxError) -> T in
            try executeOnce("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            transactionDepth += 1
            defer {
                transactionDepth -= 1
                try? executeOnce("COMMIT")
            }
            return try body()
        }
    }

    /// Runs `body` in one transaction that first takes `lock` (an advisory lock held to
    /// the commit), for changes that need one writer at a time; its commit wakes the
    /// schema's runners. Rolls back on a throw and keeps the first error.
    @discardableResult
    func transaction<T>(lock: Int32, _ body: () throws(OutboxError) -> T) throws(OutboxError) -> T {
        // One round trip: the lock is taken by the statement that opens the transaction.
        let take = "SELECT pg_advisory_xact_lock(7361200, \(lock))"
        // Inside a quiet transaction: the lock is taken now and the commit wakes runners.
        if transactionDepth > 0, !locked {
            try execute("\(take); SET LOCAL outbox.quiet = 'off'")
            locked = true
        }
        return try transaction(opening: "BEGIN; \(take)", locked: true, body)
    }

    /// Runs `body` in one transaction without the schema's lock, for a runner's own work that
    /// row locks, generations and lease tokens keep safe; its commit wakes no runner (the
    /// triggers skip the data version and notification), so runners do not serialize on them.
    @discardableResult
    func quietTransaction<T>(_ body: () throws(OutboxError) -> T) throws(OutboxError) -> T {
        try transaction(opening: "BEGIN; SET LOCAL outbox.quiet = 'on'", locked: false, body)
    }

    private func transaction<T>(opening: String, locked: Bool, _ body: () throws(OutboxError) -> T) throws(OutboxError) -> T {
        if transactionDepth > 0 { return try body() }
        return try retrying { () throws(OutboxError) -> T in try transactionOnce(opening: opening, locked: locked, body) }
    }

    private func transactionOnce<T>(opening: String, locked: Bool, _ body: () throws(OutboxError) -> T) throws(OutboxError) -> T {
        do throws(OutboxError) {
            try executeOnce(opening)
        } catch {
            try? executeOnce("ROLLBACK")
            throw error
        }
        self.locked = locked
        transactionDepth += 1
        do throws(OutboxError) {
            let result = try body()
            // Asked before the COMMIT: if its answer is lost, the server can say what became of it.
            let xid = reconnect == nil ? nil : try queryOne("SELECT txid_current()") { $0.int(0) }
            transactionDepth -= 1
            do throws(OutboxError) {
                try executeOnce("COMMIT")
            } catch {
                // The COMMIT left and no answer came back: it may have happened or not.
                if pq.status(conn) != CONNECTION_OK {
                    guard let xid, let committed = try resolveCommit(xid, after: error) else { throw commitUnknown(error) }
                    if committed { return result }
                    // Surely rolled back: `retrying` runs it again on the new connection.
                    rerunRolledBack = true
                    throw error
                }
                try? executeOnce("ROLLBACK")
                throw error
            }
            return result
        } catch {
            if transactionDepth > 0 { transactionDepth -= 1 }
            try? executeOnce("ROLLBACK")
            throw error
        }
    }

    /// Reads what the server sent meanwhile and counts the notifications among it (those of
    /// `LISTEN`); a broken connection is E_STORAGE.
    func takeNotifications() throws(OutboxError) -> Int {
        guard pq.consumeInput(conn) == 1 else {
            let error = OutboxError.storage("lost the connection to the PostgreSQL store: \(Self.trimmed(pq.errorMessage(conn))) (\(name))")
            guard transactionDepth == 0, let policy = reconnect else { throw error }
            try connectAgain(after: error, policy)
            return 1  // what changed meanwhile is unknown: read it all again
        }
        var count = 0
        while let notification = pq.notifies(conn) {
            count += 1
            pq.freemem(UnsafeMutableRawPointer(notification))
        }
        return count
    }

    /// Whether the session advisory lock `(class, key)` could be taken now; it is held
    /// until `unlock` or the end of the connection (a killed process drops it).
    func tryLock(key: Int32, shared: Bool = false) throws(OutboxError) -> Bool {
        let function = shared ? "pg_try_advisory_lock_shared" : "pg_try_advisory_lock"
        let taken = try queryOne("SELECT \(function)(7361201, ?::int)", [.int(Int64(key))]) { $0.text(0) == "t" } ?? false
        if taken { sessionLocks.append((key, shared)) }
        return taken
    }

    func unlock(key: Int32, shared: Bool = false) {
        if let i = sessionLocks.firstIndex(where: { $0.key == key && $0.shared == shared }) { sessionLocks.remove(at: i) }
        let function = shared ? "pg_advisory_unlock_shared" : "pg_advisory_unlock"
        _ = try? run("SELECT \(function)(7361201, ?::int)", [.int(Int64(key))])
    }
}
