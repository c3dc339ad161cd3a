import CSystem
import Glibc
import OutboxModel
import OutboxStore

/// A loaded project: config, definitions, and (opened on demand) the store.
final class Project {
    let config: Config
    let environment: [String: String]
    private var loadedDefinitions: DefinitionSet?
    private var openedStore: (any Store)?

    init(config: Config, environment: [String: String]) {
        self.config = config
        self.environment = environment
    }

    static func load(explicitConfig: String?, cwd: String, environment: [String: String]) throws(OutboxError) -> Project {
        guard let file = Config.locate(explicit: explicitConfig, cwd: cwd) else {
            throw OutboxError(.config, "no config/outbox.yaml in \(cwd) or any folder above it (run `outbox init`, or pass --config FILE)")
        }
        if !Paths.isRegularFile(file) {
            guard explicitConfig == nil else {
                if Paths.exists(file) { throw .fileMissing("the config file \(file) is not a regular file") }
                if Paths.entryExists(file) { throw .fileMissing("the config file \(file) is a link to nothing (or a loop of links)") }
                throw .fileMissing("no config file at \(file)")
            }
            let what = Paths.exists(file) ? "is not a regular file" : "is a link to nothing (or a loop of links)"
            throw OutboxError(.config, "\(file) \(what): a project's config/outbox.yaml must be a regular file")
        }
        return Project(config: try Config.load(file: file, environment: environment), environment: environment)
    }

    var definitions: DefinitionSet {
        if let loadedDefinitions { return loadedDefinitions }
        let set = DefinitionSet.load(folder: config.definitions)
        loadedDefinitions = set
        return set
    }

    /// The project's store: the embedded SQLite store in the folder `config.store`, or a
    /// PostgreSQL schema when it is a `postgres://` URL.
    func store() throws(OutboxError) -> any Store {
        if let openedStore { return openedStore }
        let store = try Self.openStore(config)
        openedStore = store
        return store
    }

    /// Enqueues into the project's store.
    func enqueue(_ entries: [NewEntry], now: Int64) throws(OutboxError) -> [EnqueueResult] {
        let store = try store()
        return try Self.stoppedOnlyBeforeTheCommit { () throws(OutboxError) in
            try Self.sayingWhyRunning(store) { () throws(OutboxError) in
                try store.enqueue(entries, now: now, committing: { csystem_stop_hold() })
            }
        }
    }

    /// Enqueues the batches `next` gives, in one transaction (see `Store.enqueue(batches:now:)`).
    func enqueue(batches next: () throws(OutboxError) -> [NewEntry]?, now: Int64) throws(OutboxError) -> [EnqueueResult] {
        let store = try store()
        return try Self.stoppedOnlyBeforeTheCommit { () throws(OutboxError) in
            try Self.sayingWhyRunning(store) { () throws(OutboxError) in
                try store.enqueue(batches: next, now: now, committing: { csystem_stop_hold() })
            }
        }
    }

    /// A stop signal (TERM, INT, HUP, QUIT) ends an enqueue at once, storing nothing, until its
    /// transaction commits; from the commit on it is only recorded, and the enqueue finishes
    /// (exit 0 says the entries are stored, whenever the signal came). A commit that fails
    /// releases it: the process then ends with that signal, its staged files cleaned up.
    private static func stoppedOnlyBeforeTheCommit<T>(_ body: () throws(OutboxError) -> T) throws(OutboxError) -> T {
        do {
            return try body()
        } catch {
            csystem_stop_release()
            throw error
        }
    }

    /// A same-id enqueue refused because the entry is running says so truly when no runner
    /// runs: the entry's runner was killed.
    private static func sayingWhyRunning<T>(_ store: any Store, _ body: () throws(OutboxError) -> T) throws(OutboxError) -> T {
        do {
            return try body()
        } catch {
            guard error.code == .running, let id = error.runningEntryID else { throw error }
            let why: String
            if let sqlite = store as? SQLiteStore, sqlite.runnerHolderPID() == nil {
                why = " was being sent when its runner stopped (killed or crashed)"
            } else if let shared = store as? PostgresStore, try shared.leaseEnded(entryID: id, now: Identifiers.nowMs()) == true {
                why = " was being sent by a runner that let its lease run out (stopped, killed or cut off from the database)"
            } else {
                throw error
            }
            let next = store is SQLiteStore ? "the next `outbox run`" : "a live runner"
            throw .running(
                error.message.replacing(" is being sent now", with: why)
                    .replacing("try again when it settles", with: "\(next) puts it back in the queue: enqueue it again then"))
        }
    }

    /// Why the definitions folder cannot hold definitions (missing, or not a folder); nil when it can.
    var definitionsFolderProblem: String? {
        let folder = config.definitions
        if Paths.isDirectory(folder) { return nil }
        return "the definitions folder \(folder) \(Paths.exists(folder) ? "is not a folder" : "does not exist")"
    }

    static func openStore(_ config: Config) throws(OutboxError) -> any Store {
        try Identifiers.checkClock()
        if Config.isServerStore(config.store) {
            return try PostgresStore(url: try PostgresURL(config.store), folder: config.stagingFolder, sharedStaging: config.stagingShared)
        }
        return try SQLiteStore(folder: config.store)
    }

    /// Whether the store exists already (a bad input must not create one); a server's
    /// schema is made by its first open, so it counts as there.
    var storeExists: Bool {
        Config.isServerStore(config.store) || Paths.exists(Paths.join(config.store, "outbox.db"))
    }

    /// Whether no store was made at the store's path yet (nothing at all there, or an empty
    /// folder): a reading command answers as for an empty store and makes none. Anything
    /// else, even broken, is opened, and says what is wrong with it.
    var storeNotMadeYet: Bool {
        guard !Config.isServerStore(config.store) else { return false }
        // Only "no such file": a path under a regular file, or one this user may not look
        // into, can never be a store, and opening it says why.
        var info = stat()
        if lstat(config.store, &info) != 0 { return errno == ENOENT }
        return (info.st_mode & S_IFMT) == S_IFDIR && Paths.list(config.store)?.isEmpty == true
    }

    /// The error of an id no entry has; in a project with no store yet, it says so.
    func noEntry(_ id: String) -> OutboxError {
        .invalid("no entry has id \(Units.quoted(id, limit: 128))\(storeNotMadeYet ? " (\(noStoreYet))" : "")")
    }

    /// Says that the store does not exist yet, naming its folder.
    var noStoreYet: String { "no store at \(config.store) yet" }

    /// The entry with this id, or nil, without making a store where there is none (a reading
    /// command that fails leaves the project as it was).
    func existingEntry(id: String) throws(OutboxError) -> Entry? {
        guard !storeNotMadeYet else { return nil }
        return try store().entry(id: id)
    }

    /// The definition of a key: E_CONFIG when its file has errors, E_INVALID when unknown.
    func definition(_ key: String) throws(OutboxError) -> Definition {
        let set = definitions
        if let d = set.definitions[key] { return d }
        if let problems = set.brokenKeys[key] {
            throw OutboxError(.config, "the definition of \(key) has errors", diagnostics: problems)
        }
        if let problem = definitionsFolderProblem {
            throw OutboxError(.config, "no definition has key \(Units.quoted(key, limit: 200)): \(problem)")
        }
        let unreadable = set.diagnostics.filter { d in !set.brokenKeys.values.contains { $0.contains(d) } }
        if !unreadable.isEmpty {
            throw OutboxError(.config, "no definition has key \(key), and some files cannot be read", diagnostics: unreadable)
        }
        let known = set.definitions.keys.sorted().prefix(10).joined(separator: ", ")
        throw .invalid(
            "no definition has key \(Units.quoted(key, limit: 200)) in \(config.definitions)\(known.isEmpty ? "" : " (known: \(known))")")
    }
}
