import CSystem
import Glibc
import OutboxModel

/// The embedded store: one SQLite database in WAL mode plus staged bodies, in a 0700 folder.
///
/// A connection is confined to the thread that uses it (the CLI's main thread, or the
/// runner's control thread); several processes share the database through SQLite's locks.
package final class SQLiteStore: Store, SQLStore, @unchecked Sendable {
    package let folder: String
    let db: SQLiteConnection
    let staging: Staging
    /// Moved files to put back after the current cancel commits: (store path, source path).
    /// Moved files to put back after the commit: staged path, source path, mode at enqueue.
    var returns: [(file: String, source: String, identity: FileIdentity?)] = []
    /// Staged files of replaced bodies, removed once the transaction commits.
    var obsoleteFiles: [String] = []
    var takenOverFiles: Set<String> = []
    var stagedInTransaction: [(body: StagedBody, moves: MoveJournal.Ticket?)] = []
    var requestCache = StoredRequestCache()
    let moves: MoveJournal
    /// The journal of `returns`, written before the commit that forgets their entries.
    var returnsTicket: MoveJournal.Ticket?
    /// Opened on a store that cannot be written: reads answer, writes fail with E_STORAGE.
    package private(set) var readOnly = false

    /// Opens (creating if needed) the store in `folder`. E_STORAGE when that is impossible.
    package init(folder given: String) throws(OutboxError) {
        csystem_restrict_umask()
        try Self.checkStoreFolder(given)
        // One spelling for the paths rows record, whichever way (a link to the project, a
        // `--config` path) the store was reached.
        let folder = Paths.resolved(given)
        self.folder = folder
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
        try Self.makeInnerFolder(bodies)
        // Made with the store, so an enqueue that moves a file and then fails leaves no new folder.
        try Self.makeInnerFolder(moves.folder)
        if !Paths.exists(path) {
            // The database is made before any body is staged: bodies without it mean it was lost.
            if let staged = Paths.list(bodies), !staged.isEmpty {
                throw .storage(
                    "the store database \(path) is missing but \(bodies) holds \(staged.count) staged file\(staged.count == 1 ? "" : "s"): "
                        + "the store is damaged; put outbox.db back, or move the store folder away to start an empty one")
            }
            try Self.createDatabase(at: path)
        } else if let info = FileInfo.stat(path), !info.isRegular {
            throw .storage("the store database \(path) is not a regular file; move it away to start an empty store")
        } else if FileInfo.stat(path)?.size == 0 {
            // A store is created whole (below), so an empty database is damage, not a new store,
            // even beside a log: the log the last command left holds only the pages it changed.
            throw .storage("the store database \(path) is empty: it is damaged, not new; move it away to start an empty store")
        } else if let size = FileInfo.stat(path)?.size, size < 512 {
            // Shorter than SQLite's smallest page: SQLite would take it for a new, empty database.
            throw .storage(
                "the store database \(path) is \(size) byte\(size == 1 ? "" : "s") long, shorter than any database: it is damaged, not new; move it away to start an empty store"
            )
        }
        db = try SQLiteConnection(path: path)
        db.keepLogOnClose()
        // Created whole with its tables, a store never has none: this file is another one, or
        // was emptied, and taking it for new would disown the staged bodies.
        if try db.queryOne("SELECT COUNT(*) FROM sqlite_master", { $0.int(0) }) == 0 {
            throw .storage(
                "the store database \(path) has no tables: it is not one outbox made, nor new; move it away to start an empty store")
        }
        try Self.migrate(db)
        try relocateStagedPaths()
        // A command killed while moving a user's file leaves a journal: settle it now.
        for line in try moves.recover(owned: { staged throws(OutboxError) in
            try db.queryOne("SELECT 1 FROM entries WHERE body_file = ?", [.text(staged)]) { _ in true } ?? false
        }) {
            FileIO.log("outbox: \(line)")
        }
    }

    /// Rows name staged files by their whole path. A store moved as a folder, or reached
    /// before under another spelling, finds its bodies under a new prefix: the rows follow
    /// before anything reads them (the runner would take the bodies for orphans and remove
    /// the only copy).
    func relocateStagedPaths() throws(OutboxError) {
        let here = staging.bodiesDir + "/"
        let recorded = try setting(Self.bodiesFolderSetting)
        guard recorded != here else { return }
        try writing { () throws(OutboxError) in
            // Only a bodies folder is a prefix to rewrite (a damaged setting, `''` or `/`, would
            // rewrite every row's path into nonsense).
            var prefixes = Set([recorded].compactMap { $0 }.filter { $0.hasPrefix("/") && $0.hasSuffix("/bodies/") })
            // Stores from before the setting, and rows written under another spelling.
            let elsewhere = try db.query(
                "SELECT DISTINCT body_file FROM entries WHERE body_file IS NOT NULL AND substr(body_file, 1, length(?1)) != ?1",
                [.text(here)]
            ) { $0.text(0) }
            for path in elsewhere {
                guard let slash = path.lastIndex(of: "/"), path[..<slash].hasSuffix("/bodies") else { continue }
                prefixes.insert(String(path[...slash]))
            }
            for old in prefixes where old != here {
                try db.run(
                    "UPDATE entries SET body_file = ?2 || substr(body_file, length(?1) + 1) WHERE substr(body_file, 1, length(?1)) = ?1",
                    [.text(old), .text(here)])
                // Form files' staged paths, as the stored request writes them (nothing else of it).
                try db.run(
                    "UPDATE entries SET request = replace(request, ?1, ?2) WHERE instr(request, ?1) > 0",
                    [.text(StoredRequest.stagedFileMember(old)), .text(StoredRequest.stagedFileMember(here))])
            }
            try setSetting(Self.bodiesFolderSetting, here)
        }
    }

    static let bodiesFolderSetting = "bodies_folder"

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
        removeAbandonedTemporaries(beside: path)
        func removeTemporary() { for file in [temp, temp + "-wal", temp + "-shm"] { unlink(file) } }
        removeTemporary()
        // Pre-created 0600, so the database and its -wal/-shm never exist with a wider mode.
        let fd = open(temp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .storage("cannot create \(temp): \(Paths.errnoMessage())") }
        close(fd)
        do throws(OutboxError) {
            let connection = try SQLiteConnection(path: temp)
            try migrate(connection)
            // The last connection to close folds the log back and removes it.
        } catch {
            removeTemporary()
            throw error
        }
        guard !Paths.exists(temp + "-wal") else {
            removeTemporary()
            // SQLite keeps the log when it cannot fold it back: most often a full disk.
            throw .storage("cannot create \(path): its write-ahead log was not folded back (is the disk full?)")
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

    /// `outbox.db.new-PID` files (and their -wal/-shm) of creating processes that are gone.
    static func removeAbandonedTemporaries(beside path: String) {
        let prefix = Paths.basename(path) + ".new-"
        for name in Paths.list(Paths.dirname(path)) ?? [] where name.hasPrefix(prefix) {
            let digits = name.dropFirst(prefix.count).prefix { $0.isASCII && $0.isNumber }
            guard let pid = Int32(digits), pid > 0, kill(pid, 0) != 0, errno == ESRCH else { continue }
            unlink(Paths.join(Paths.dirname(path), name))
        }
    }

    /// The store holds tokens and bodies: a link (it could point anywhere) is refused, and a
    /// folder others may read is tightened to 0700, with a word on stderr.
    /// `option` names where the folder was given (the config's `store:`, or `store copy --to`).
    package static func checkStoreFolder(_ path: String, option: String = "store: in the config") throws(OutboxError) {
        var st = stat()
        guard lstat(path, &st) == 0 else { return }
        if (st.st_mode & S_IFMT) == S_IFLNK {
            throw .storage("the store folder \(path) is a symbolic link; give the real folder as \(option)")
        }
        if geteuid() == 0, st.st_uid != 0 {
            // Root's files in it (a body, the log, a lock) would be 0600 and root's: its owner's
            // runner could not read them, and would retry or fail on them unseen.
            let owner = getpwuid(st.st_uid).map { String(cString: $0.pointee.pw_name) } ?? "uid \(st.st_uid)"
            throw .storage(
                "the store folder \(path) belongs to \(owner), and outbox runs as root: files it made there would be root's and unreadable to \(owner); run it as that user (sudo -u \(owner) outbox ...)"
            )
        }
        if (st.st_mode & S_IFMT) == S_IFDIR, let names = Paths.list(path), !names.contains("outbox.db"), !names.contains("bodies") {
            // A folder of someone else's files would be tightened to 0700 and filled with ours.
            let foreign = names.filter { !Self.storeNames.contains($0) && !$0.hasPrefix("outbox.db.new-") }.sorted()
            if !foreign.isEmpty {
                throw OutboxError(
                    .config,
                    "the store folder \(path) holds files outbox did not make (\(foreign.prefix(3).joined(separator: ", "))"
                        + "\(foreign.count > 3 ? ", ..." : "")); give \(option) a new or empty folder of its own")
            }
        }
        if (st.st_mode & S_IFMT) == S_IFDIR, st.st_mode & 0o077 != 0, st.st_uid == getuid() {
            // Only others' bits go: a folder the owner made read-only stays read-only.
            let ownerOnly = st.st_mode & 0o700
            let mode = String(st.st_mode & 0o777, radix: 8)
            if chmod(path, ownerOnly) == 0 {
                FileIO.log("outbox: the store folder \(path) was open to others (mode \(mode)); it is 0\(String(ownerOnly, radix: 8)) now")
            } else {
                // A read-only file system: said as it is, and the store's own checks decide.
                FileIO.log(
                    "outbox: the store folder \(path) is open to others (mode \(mode)) and cannot be changed: \(Paths.errnoMessage())")
            }
        }
    }

    /// Folders and files of the store that others may read or write (made by hand, copied in
    /// with `cp -r`, a umask that `chmod` later undid): the store keeps folders 0700 and
    /// files 0600. With `fix`, each one this user owns is tightened. Returns what it found.
    func looseModes(fix: Bool) -> [String] {
        var found: [String] = []
        var folders = [folder]
        while let current = folders.popLast() {
            for name in Paths.list(current) ?? [] {
                let path = Paths.join(current, name)
                var st = Glibc.stat()
                guard lstat(path, &st) == 0, st.st_uid == getuid() else { continue }
                let isFolder = (st.st_mode & S_IFMT) == S_IFDIR
                if isFolder { folders.append(path) }
                guard isFolder || (st.st_mode & S_IFMT) == S_IFREG, st.st_mode & 0o077 != 0 else { continue }
                let wanted: mode_t = isFolder ? 0o700 : 0o600
                let mode = String(st.st_mode & 0o777, radix: 8)
                // A file with another name (a hard link) may be a user's: said, never changed.
                if fix, isFolder || st.st_nlink == 1, chmod(path, wanted) == 0 {
                    found.append("\(path) was mode \(mode); it is \(String(wanted, radix: 8)) now")
                } else {
                    found.append("\(path) has mode \(mode): others may read it (audit --fix makes it \(String(wanted, radix: 8)))")
                }
            }
        }
        return found
    }

    /// What a store folder may hold before its database or bodies exist (a crash between
    /// the two, a file system's own folder).
    static let storeNames: Set<String> = [
        "outbox.db-wal", "outbox.db-shm", "moves", "returned", "runner.lock", "staging.lock", "lost+found",
    ]

    /// A folder inside the store (`bodies`, `moves`): made by outbox, so a link there (which
    /// would put bodies and tokens wherever it points, outside the store's 0700) is refused.
    static func makeInnerFolder(_ path: String) throws(OutboxError) {
        var st = stat()
        if lstat(path, &st) == 0, (st.st_mode & S_IFMT) == S_IFLNK {
            throw .storage("the store folder \(path) is a symbolic link; outbox makes it itself (remove the link)")
        }
        try makeFolder(path)
    }

    /// Makes a folder of the store (and its parents), 0700. Two commands may open a new store
    /// at once: a folder the other one made meanwhile is the folder wanted, and what is at the
    /// path is looked at after `mkdir` fails, not before it (where the other could make it).

    static func makeFolder(_ path: String) throws(OutboxError) {
        if Paths.isDirectory(path) { return }
        Fault.hold("store.make-folder")
        let parent = Paths.dirname(path)
        if !Paths.isDirectory(parent) { try makeFolder(parent) }
        if mkdir(path, 0o700) != 0 {
            let code = errno
            if Paths.isDirectory(path) { return }
            if code == EEXIST { throw .storage("the store path \(path) exists and is not a folder") }
            throw .storage("cannot create the store folder \(path): \(Paths.errnoMessage(code))")
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
        // Up to date (every open but the first after an upgrade): a read, so a reading command
        // never waits behind another process's write transaction.
        if try db.queryOne("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'migrations'", { _ in true }) == true {
            let applied = Set(try db.query("SELECT name FROM migrations") { $0.text(0) })
            try refuseNewer(applied, path: db.path)
            if Schema.migrations.allSatisfy({ applied.contains($0.name) }) { return }
        }
        try db.transaction { () throws(OutboxError) in
            try db.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at INTEGER NOT NULL)")
            let applied = Set(try db.query("SELECT name FROM migrations") { $0.text(0) })
            try refuseNewer(applied, path: db.path)
            // The tables without the record of what made them: applying the first migration
            // again would fail on them, and nothing says which of the later ones they have.
            if applied.isEmpty,
                try db.queryOne("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'entries'", { _ in true }) == true
            {
                throw .storage(
                    "the store database \(db.path) has its tables but no record of its migrations (the table migrations is empty): it is damaged"
                )
            }
            for migration in Schema.migrations where !applied.contains(migration.name) {
                try db.execute(migration.sql)
                try db.run("INSERT INTO migrations (name, applied_at) VALUES (?, ?)", [.text(migration.name), .int(Identifiers.nowMs())])
            }
        }
    }

    package func dataVersion() throws(OutboxError) -> Int64 { try db.dataVersion() }
    package var ownWrites: Int64 { db.totalChanges }

    /// SQLite's writers take turns on the database's write lock.
    func writing<T>(_ body: () throws(OutboxError) -> T) throws(OutboxError) -> T { try db.transaction(body) }

    /// One runner holds the store (its lock file): any transaction is its own.
    func writingOwnRows<T>(_ body: () throws(OutboxError) -> T) throws(OutboxError) -> T { try db.transaction(body) }

    /// Each batch is written as it comes: a transaction here never runs its body twice.
    package func enqueue(
        batches next: () throws(OutboxError) -> [NewEntry]?, now: Int64, committing: () -> Void
    ) throws(OutboxError) -> [EnqueueResult] {
        try enqueueStreaming(next, now: now, committing: committing)
    }

    func databaseProblems() throws(OutboxError) -> [String] {
        let check = try db.query("PRAGMA integrity_check") { $0.text(0) }
        return (check == ["ok"] ? [] : check.map { "sqlite: \($0)" }) + looseModes(fix: false)
    }

    /// `audit --fix`: the store's files and folders that others may read are tightened.
    package func tightenModes() -> [String] { looseModes(fix: true) }

    /// One host: every staged file is on this disk.
    func entriesStagedElsewhere() throws(OutboxError) -> Set<String> { [] }

    func entryColumnsOfThisStore(_ staged: StagedBody) -> [(column: String, value: SQLValue)] { [] }
}
