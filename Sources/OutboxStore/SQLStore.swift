import OutboxModel

/// A result row as both stores' shared SQL reads it (SQLite's statement or libpq's result).
protocol SQLRowReading {
    func isNull(_ i: Int32) -> Bool
    func int(_ i: Int32) -> Int64
    func text(_ i: Int32) -> String
    func withText<T>(_ i: Int32, _ body: (UnsafeBufferPointer<UInt8>) -> T) -> T
    func blob(_ i: Int32) -> [UInt8]?
}

extension SQLRowReading {
    func optionalInt(_ i: Int32) -> Int64? { isNull(i) ? nil : int(i) }
    func optionalText(_ i: Int32) -> String? { isNull(i) ? nil : text(i) }
}

/// A connection both stores' shared SQL runs on: `?` placeholders, one thread at a time.
protocol SQLDatabase: AnyObject {
    associatedtype Row: SQLRowReading
    /// Runs a statement that returns no rows; returns the number of rows changed.
    @discardableResult
    func run(_ sql: String, _ values: [SQLValue]) throws(OutboxError) -> Int
    func query<T>(_ sql: String, _ values: [SQLValue], _ map: (Row) throws(OutboxError) -> T) throws(OutboxError) -> [T]
    func forEach(_ sql: String, _ values: [SQLValue], _ body: (Row) throws(OutboxError) -> Void) throws(OutboxError)
    func queryOne<T>(_ sql: String, _ values: [SQLValue], _ map: (Row) throws(OutboxError) -> T) throws(OutboxError) -> T?
    /// Runs `body` in one read snapshot.
    func read<T>(_ body: () throws(OutboxError) -> T) throws(OutboxError) -> T
}

extension SQLDatabase {
    func query<T>(_ sql: String, _ map: (Row) throws(OutboxError) -> T) throws(OutboxError) -> [T] { try query(sql, [], map) }
    func queryOne<T>(_ sql: String, _ map: (Row) throws(OutboxError) -> T) throws(OutboxError) -> T? { try queryOne(sql, [], map) }
}

/// The store both backends are: the same tables, rules and files, written once here over
/// the SQL SQLite and PostgreSQL both speak. What differs is asked of the store: how a
/// write takes its turn, and what only one of them can check.
protocol SQLStore: AnyObject {
    associatedtype Database: SQLDatabase
    var db: Database { get }
    var folder: String { get }
    var staging: Staging { get }
    var moves: MoveJournal { get }
    /// Moved files to put back after the commit: staged path, source path, identity at enqueue.
    var returns: [(file: String, source: String, identity: FileIdentity?)] { get set }
    /// Staged files of replaced bodies, removed once the transaction commits.
    var obsoleteFiles: [String] { get set }
    /// Files of forgotten entries that an entry written in the same transaction took over.
    var takenOverFiles: Set<String> { get set }
    /// Bodies staged inside the transaction (a take-over whose bytes were gone), with the
    /// journal of the file each moved in: rolled back with it, finished with its commit.
    var stagedInTransaction: [(body: StagedBody, moves: MoveJournal.Ticket?)] { get set }
    /// The journal of `returns`, written before the commit that forgets their entries.
    var returnsTicket: MoveJournal.Ticket? { get set }
    /// Stored requests parsed already, by their text (entries of a definition share it).
    var requestCache: StoredRequestCache { get set }

    /// Runs `body` in a transaction as the store's one writer: the same-id rules read, then write.
    func writing<T>(_ body: () throws(OutboxError) -> T) throws(OutboxError) -> T
    /// Runs `body` in a transaction on rows this runner holds (an entry it claimed): no same-id
    /// rule reads the store, so it needs no turn as the store's one writer.
    func writingOwnRows<T>(_ body: () throws(OutboxError) -> T) throws(OutboxError) -> T
    /// What the database itself finds damaged, for `audit`.
    func databaseProblems() throws(OutboxError) -> [String]
    /// Entries whose staged files are on another host's disk (that host's audit checks them).
    func entriesStagedElsewhere() throws(OutboxError) -> Set<String>
    /// Columns of an entry's row only this store has, with their values for a new entry.
    func entryColumnsOfThisStore(_ staged: StagedBody) -> [(column: String, value: SQLValue)]
    /// Adds to the cumulative counters inside the caller's transaction (each store keeps its
    /// series its own way: one row per series, or shards that concurrent runners add to).
    func addCounters(_ increments: [CounterIncrement]) throws(OutboxError)
}
