import CSystem
import Glibc
import OutboxModel

/// The lock file that makes one process the runner of an SQLite store. The kernel drops
/// it when the process dies, so a SIGKILLed runner never leaves the store locked.
final class SQLiteRunnerLock: RunnerLock {
    private var fd: Int32

    init(fd: Int32) { self.fd = fd }

    func release() {
        guard fd >= 0 else { return }
        close(fd)
        fd = -1
    }

    deinit { release() }
}

extension SQLiteStore {
    /// Takes the store's runner lock: E_RUNNING (exit 75) naming the holder when another
    /// runner has it.
    package func lockForRunner() throws(OutboxError) -> RunnerLock {
        let path = Paths.join(folder, "runner.lock")
        let fd = csystem_lock_file(path)
        if fd == -EWOULDBLOCK || fd == -EAGAIN {
            let holder = Paths.readText(path)?.trimmingSpaces ?? ""
            throw .running("another runner holds the store \(folder)\(holder.isEmpty ? "" : " (\(holder))")")
        }
        guard fd >= 0 else { throw .storage("cannot lock \(path): \(Paths.errnoMessage(-fd))") }
        ftruncate(fd, 0)
        let text = "pid \(getpid()) since \(Identifiers.nowMs())\n"
        _ = text.withCString { pwrite(fd, $0, strlen($0), 0) }
        return SQLiteRunnerLock(fd: fd)
    }
}
