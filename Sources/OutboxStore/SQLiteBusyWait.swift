import CSQLite
import CSystem
import Glibc

/// How a connection waits for another process's write lock. A large batch (`enqueue --from`
/// of many lines) holds it for as long as its inserts take; a runner that gave up after a
/// few seconds would stop with its work in flight. So writers wait up to `limitMs`, and say
/// every `reportEveryMs` that they are waiting.
final class SQLiteBusyWait: @unchecked Sendable {
    static let reportEveryMs: Int64 = 10_000
    let limitMs: Int64
    /// Where a long wait is told; by default a line on stderr.
    var report: (String) -> Void = { FileIO.log($0) }
    private var startedAt: Int64 = 0
    private var reportedAt: Int64 = 0

    init(limitMs: Int64) { self.limitMs = limitMs }

    /// Installs the wait on `db`; the connection keeps this object alive as long as itself.
    func install(on db: OpaquePointer) {
        sqlite3_busy_handler(
            db,
            { context, count in
                guard let context else { return 0 }
                return Unmanaged<SQLiteBusyWait>.fromOpaque(context).takeUnretainedValue().keepWaiting(count) ? 1 : 0
            }, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Whether to try again, after a short sleep (SQLite counts the calls of one wait from 0).
    func keepWaiting(_ count: Int32) -> Bool {
        let now = csystem_proc_now_ms()
        if count == 0 { (startedAt, reportedAt) = (now, now) }
        let waited = now - startedAt
        // A stop noted while an enqueue's moved files wait to be put back: the wait ends now.
        if waited >= limitMs || csystem_stop_pending() != 0 { return false }
        if now - reportedAt >= Self.reportEveryMs {
            reportedAt = now
            report("outbox: waiting for the store: another process has held its lock for \(waited / 1000) s (a large batch enqueue?)")
        }
        // 1 ms at first (a commit of another process ends soon), then up to 20 ms.
        usleep(useconds_t(min(Int(count) + 1, 20) * 1000))
        return true
    }
}
