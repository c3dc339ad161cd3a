import Glibc
import OutboxModel
import OutboxStore

/// `outbox store copy --to URL|FOLDER`: the project's stopped store into an empty one.
enum StoreCopyCommand {
    static func run(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        guard let to = i.args.value("to"), !to.isEmpty else { throw .usage("store copy needs --to URL (postgres://...) or a store folder") }
        // `POSTGRES://...` or `mysql://...` would quietly become folders of that name.
        if let problem = Config.storeProblem(to) { throw .usage("store copy: --to: \(problem)") }
        // A URL that does not parse, or that libpq refuses, is this option's mistake, not the config's `store:`.
        func optionMistake(_ error: OutboxError) -> OutboxError {
            .usage("store copy: --to: \(error.message.hasPrefix("store: ") ? String(error.message.dropFirst(7)) : error.message)")
        }
        if Config.isServerStore(to) {
            do { _ = try PostgresURL(to) } catch { throw optionMistake(error) }
        }
        let project = try i.project()
        var targetConfig = project.config
        targetConfig.store = Config.storeLocation(to, root: project.config.root)
        if !Config.isServerStore(to), !Config.isServerStore(project.config.store) {
            // A copy into the store itself (or a folder in it) would fill the source with its own copy.
            let (target, own) = (Paths.resolved(targetConfig.store), Paths.resolved(project.config.store))
            guard target != own, !Paths.isInside(target, own), !Paths.isInside(own, target) else {
                throw .usage("store copy: --to \(to) is the project's own store, or a folder inside or around it")
            }
        }
        if Config.isServerStore(to), Config.isServerStore(project.config.store),
            try PostgresURL(to).place == (try PostgresURL(project.config.store).place)
        {
            throw .usage("store copy: --to \(try PostgresURL(to).redacted) is the project's own store")
        }
        // A folder target is SQLite's: it must not exist yet with a database of its own.
        let name = Config.isServerStore(to) ? try PostgresURL(to).redacted : targetConfig.store
        let source = try project.store()
        // A failed copy leaves a target folder as it found it (or not at all).
        let folder = Config.isServerStore(to) ? nil : TargetFolder(targetConfig.store)
        let summary: StoreCopy.Summary
        do {
            // A target folder that cannot be a store is refused before the source is locked.
            if let folder { try SQLiteStore.checkStoreFolder(folder.path, option: "--to") }
            summary = try StoreCopy.copy(
                from: source,
                to: { () throws(OutboxError) in
                    do throws(OutboxError) { return try Project.openStore(targetConfig) } catch  where error.code == .config {
                        throw optionMistake(error)
                    }
                }, targetName: name)
        } catch {
            folder?.restore()
            throw error
        }
        if i.json {
            i.console.out(
                JSON.object([
                    ("entries", .int64(Int64(summary.entries))), ("outcomes", .int64(Int64(summary.outcomes))),
                    ("files", .int64(Int64(summary.files))), ("to", .string(name)),
                ]).serialized())
        } else {
            func count(_ n: Int, _ one: String, _ many: String) -> String { "\(n) \(n == 1 ? one : many)" }
            i.console.err(
                "copied \(count(summary.entries, "entry", "entries")), \(count(summary.outcomes, "outcome", "outcomes")) and "
                    + "\(count(summary.files, "staged file", "staged files")) to \(name)")
        }
        return 0
    }
}

/// A copy's target folder as it was before the copy: what a failed copy puts back. A folder it
/// made goes, with the parents it made; one that was there loses what the copy added to it and
/// gets its mode back (opening a store there makes it 0700).
struct TargetFolder {
    let path: String
    /// The topmost folder on the way to `path` that did not exist.
    private var made: String?
    private var names: Set<String> = []
    private var mode: mode_t = 0

    init(_ path: String) {
        self.path = path
        var info = stat()
        if stat(path, &info) == 0 {
            names = Set(Paths.list(path) ?? [])
            mode = info.st_mode & 0o7777
            return
        }
        var missing = path
        while true {
            let parent = Paths.dirname(missing)
            if parent == missing || Paths.exists(parent) { break }
            missing = parent
        }
        made = missing
    }

    func restore() {
        if let made {
            Paths.removeTree(made)
            return
        }
        for name in Paths.list(path) ?? [] where !names.contains(name) { Paths.removeTree(Paths.join(path, name)) }
        chmod(path, mode)
    }
}
