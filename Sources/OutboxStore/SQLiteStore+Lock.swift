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
        let text = "pid \(getpid()) since \(Units.rfc3339(ms: Identifiers.nowMs()))\n"
        _ = text.withCString { pwrite(fd, $0, strlen($0), 0) }
        return SQLiteRunnerLock(fd: fd)
    }

    /// The process holding the runner lock, read from the kernel's lock table without taking
    /// the lock (a runner starting meanwhile must not find it taken); nil when none holds it.
    package func runnerHolderPID() -> Int32? {
        var st = stat()
        guard stat(Paths.join(folder, "runner.lock"), &st) == 0, let table = Paths.readText("/proc/locks") else { return nil }
        // "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234567 0 EOF": the pid, then major:minor:inode.
        let dev = UInt64(st.st_dev)
        let (major, minor) = (((dev >> 8) & 0xfff) | ((dev >> 32) & ~0xfff), (dev & 0xff) | ((dev >> 12) & ~0xff))
        func hex(_ n: UInt64) -> String { (n < 16 ? "0" : "") + String(n, radix: 16) }
        let device = "\(hex(major)):\(hex(minor)):\(st.st_ino)"
        for line in table.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count >= 6, fields[1] == "FLOCK", fields[5] == device else { continue }
            return Int32(fields[4])
        }
        return nil
    }
}
