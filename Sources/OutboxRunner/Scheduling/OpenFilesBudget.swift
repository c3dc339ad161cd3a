/// What the open-files limit leaves a runner: each transfer in flight holds a socket and
/// often its body's file (a chunked entry has up to `part_concurrency` transfers), each hook
/// its pipes, and the connection cache a socket per connection. A limit too low for the
/// config lowers `concurrency` and `hooks.concurrency` (with a word in the log), rather than
/// let connects fail as if the server were down and hooks never start.
struct OpenFilesBudget: Equatable {
    /// The store, the lock, the log, libcurl's own and the metrics listener.
    static let reserved = 64
    /// A running hook's stdin, stdout and stderr pipes and its process handle.
    static let perHook = 4
    /// Below this limit a runner does not start: with one entry in flight it could not also
    /// run a hook, a plugin and the events command (measured: hooks fail to start below 18).
    static let floor = 32

    /// Entries in flight at once.
    let concurrency: Int
    /// Hooks running at once.
    let hookConcurrency: Int
    /// Idle connections kept for reuse (libcurl's cache).
    let connectionCache: Int

    /// `limit`: the soft open-files limit (after `csystem_raise_open_files`), <= 0 when unknown.
    init(limit: Int, concurrency wanted: Int, hookConcurrency hooksWanted: Int, partConcurrency: Int = 1) {
        let cacheWanted = max(wanted * 2, 16)
        let perEntry = 2 * max(1, partConcurrency)
        let entriesNeed = wanted * perEntry + cacheWanted
        let available = limit - Self.reserved
        if limit <= 0 || available >= entriesNeed + hooksWanted * Self.perHook {
            (concurrency, hookConcurrency, connectionCache) = (wanted, hooksWanted, cacheWanted)
        } else if available - entriesNeed >= Self.perHook {
            // The entries fit: the hooks get what is left.
            (concurrency, connectionCache) = (wanted, cacheWanted)
            hookConcurrency = min(hooksWanted, (available - entriesNeed) / Self.perHook)
        } else {
            // Neither fits: hooks take at most a quarter; each entry then gets its transfers'
            // sockets and files, and a cached connection.
            hookConcurrency = max(1, min(hooksWanted, available / (4 * Self.perHook)))
            let left = available - hookConcurrency * Self.perHook
            concurrency = max(1, min(wanted, left / (perEntry + 1)))
            connectionCache = max(4, min(cacheWanted, left - concurrency * perEntry))
        }
    }
}
