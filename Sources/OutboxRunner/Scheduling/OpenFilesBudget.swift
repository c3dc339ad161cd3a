/// What the open-files limit leaves a runner: each entry in flight holds a socket and often
/// its body's file, each hook its pipes, and the connection cache a socket per connection.
/// A limit too low for the config lowers `concurrency` and `hooks.concurrency` (with a word
/// in the log), rather than let connects fail as if the server were down and hooks never start.
struct OpenFilesBudget: Equatable {
    /// The store, the lock, the log, libcurl's own and the metrics listener.
    static let reserved = 64
    /// A running hook's stdin, stdout and stderr pipes and its process handle.
    static let perHook = 4

    /// Entries in flight at once.
    let concurrency: Int
    /// Hooks running at once.
    let hookConcurrency: Int
    /// Idle connections kept for reuse (libcurl's cache).
    let connectionCache: Int

    /// `limit`: the soft open-files limit (after `csystem_raise_open_files`), <= 0 when unknown.
    init(limit: Int, concurrency wanted: Int, hookConcurrency hooksWanted: Int) {
        let cacheWanted = max(wanted * 2, 16)
        let available = limit - Self.reserved
        guard limit > 0, available < hooksWanted * Self.perHook + wanted * 2 + cacheWanted else {
            concurrency = wanted
            hookConcurrency = hooksWanted
            connectionCache = cacheWanted
            return
        }
        // Hooks take at most a quarter; each entry then gets a socket, a file and a cached connection.
        hookConcurrency = max(1, min(hooksWanted, available / (4 * Self.perHook)))
        let left = available - hookConcurrency * Self.perHook
        concurrency = max(1, min(wanted, left / 3))
        connectionCache = max(4, min(cacheWanted, left - concurrency * 2))
    }
}
