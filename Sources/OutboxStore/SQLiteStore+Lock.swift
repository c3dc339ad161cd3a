import CSystem
import Glibc
import OutboxModel

/// The lock file that makes one process the runner of an SQLite store. The kernel drops
/// it when the process dies, so a SIGKILLed runner never leaves the store locked.
final class SQLiteRunnerLock: RunnerLock {
    private let path: String
    private var fd: Int32
    /// The database this runner has open, by path and by (device, inode).
    private let database: (path: String, device: UInt64, inode: UInt64)?

    init(path: String, fd: Int32, database: String) {
        self.path = path
        self.fd = fd
        self.database = FileInfo.stat(database).map { (database, $0.device, $0.inode) }
    }

    /// A lock file someone removed (a cleaner of old files in /tmp, a hand) keeps no second
    /// runner out: the lock is taken again on the file the path names now, or, when a runner
    /// started meanwhile holds that one, this runner must stop.
    func keep() throws(OutboxError) -> Bool {
        guard fd >= 0, csystem_lock_is_named(fd, path) == 0 else { return false }
        // The folder moved away and another put in its place: a lock there would keep every
        // runner out of a store this one does not read. It stops instead.
        if let database, FileInfo.stat(database.path).map({ ($0.device, $0.inode) != (database.device, database.inode) }) ?? true {
            throw .storage(
                "\(database.path) is no longer the database this runner opened (its store folder was moved or replaced); this runner stops: start it again to run the store there now"
            )
        }
        let taken = csystem_lock_file(path)
        if taken == -EWOULDBLOCK || taken == -EAGAIN {
            let holder = Paths.readText(path)?.trimmingSpaces ?? ""
            let who = holder.isEmpty ? "" : " (\(holder))"
            throw .running("\(path) was removed and another runner took the store\(who); this runner stops")
        }
        guard taken >= 0 else { throw .storage("cannot lock \(path) again after it was removed: \(Paths.errnoMessage(-taken))") }
        close(fd)
        fd = taken
        SQLiteRunnerLock.writeHolder(fd)
        return true
    }

    func release() {
        guard fd >= 0 else { return }
        close(fd)
        fd = -1
    }

    deinit { release() }

    /// Who holds the lock, for the message of a runner that finds it taken.
    static func writeHolder(_ fd: Int32, copying: Bool = false) {
        ftruncate(fd, 0)
        let text = "pid \(getpid())\(copying ? " copying the store" : "") since \(Units.rfc3339(ms: Identifiers.nowMs()))\n"
        _ = text.withCString { pwrite(fd, $0, strlen($0), 0) }
    }
}

extension SQLiteStore {
    /// A runner's long waits for another process's write (a large batch enqueue) go to its log.
    package func reportLockWaits(_ log: @escaping (String) -> Void) { db.busyWait.report = log }

    /// Takes the store's runner lock: E_RUNNING (exit 75) naming the holder when another
    /// runner has it.
    package func lockForRunner() throws(OutboxError) -> RunnerLock { try takeRunnerLock(copying: false) }

    /// The runner lock already admits one holder.
    package func lockExclusively() throws(OutboxError) -> RunnerLock { try takeRunnerLock(copying: true) }

    /// The runner lock, taken by a runner or by `store copy` (which says so to whoever finds it taken).
    func takeRunnerLock(copying: Bool) throws(OutboxError) -> RunnerLock {
        let path = Paths.join(folder, "runner.lock")
        let fd = csystem_lock_file(path)
        if fd == -EWOULDBLOCK || fd == -EAGAIN {
            let holder = Paths.readText(path)?.trimmingSpaces ?? ""
            if holder.contains(" copying the store ") {
                throw .running("a store copy holds the store \(folder) (\(holder)); run again once it has finished")
            }
            throw .running("another runner holds the store \(folder)\(holder.isEmpty ? "" : " (\(holder))")")
        }
        if fd == -ELOOP { throw .storage("cannot lock \(path): it is a symbolic link (remove it; outbox makes the file)") }
        if fd == -EMLINK { throw .storage("cannot lock \(path): it has another name (a hard link; remove it, outbox makes the file)") }
        guard fd >= 0 else { throw .storage("cannot lock \(path): \(Paths.errnoMessage(-fd))") }
        SQLiteRunnerLock.writeHolder(fd, copying: copying)
        return SQLiteRunnerLock(path: path, fd: fd, database: Paths.join(folder, "outbox.db"))
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
