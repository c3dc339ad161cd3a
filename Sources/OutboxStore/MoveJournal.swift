import CSystem
import Glibc
import OutboxModel

/// Moves of the user's files into the store (`ownership: move`) and back out (cancel,
/// replace), written down durably before they happen. A crash between a rename and the
/// commit that records it, or between a commit and the rename back, would otherwise leave
/// the user's only copy inside `.outbox/` with no entry owning it.
///
/// One journal file per batch in `.outbox/moves/`, locked (flock) by the process that
/// wrote it for as long as the batch runs; the lock goes with that process. Any later
/// command recovers the journals whose lock is free: a staged file that no entry owns goes
/// back to its source path (or, when that path is taken, is removed if it is a copy).
struct MoveJournal {
    struct Move: Equatable {
        var staged: String
        var source: String
        /// The mode and modification time the file had at its source, given back with it.
        var mode: UInt32?
        var mtimeNs: Int64?
        /// With the modification time, how the source file itself is known again.
        var size: Int64?
        var inode: UInt64?

        init(staged: String, source: String, identity: FileIdentity?) {
            self.staged = staged
            self.source = source
            mode = identity?.mode
            mtimeNs = identity?.mtimeNs
            size = identity?.size
            inode = identity?.inode
        }

        /// Whether the file at `source` is still the one this move took (same inode, size and
        /// modification time): after a copy across filesystems, the original left behind.
        var sourceIsTheOriginal: Bool {
            guard let size, let inode, let mtimeNs, let info = FileInfo.stat(source), info.isRegular else { return false }
            return info.size == size && info.mtimeNs == mtimeNs && info.inode == inode
        }
    }

    /// A journal being written by this process: removed by `end` once its moves are settled.
    final class Ticket {
        let path: String
        fileprivate var fd: Int32

        fileprivate init(path: String, fd: Int32) {
            self.path = path
            self.fd = fd
        }

        deinit { if fd >= 0 { close(fd) } }
    }

    let folder: String
    /// The name a journal has until it is written whole.
    static let writingSuffix = ".writing"

    /// Writes the moves down (synced, the folder too) and keeps the journal locked.
    func begin(_ moves: [Move]) throws(OutboxError) -> Ticket? {
        guard !moves.isEmpty else { return nil }
        try SQLiteStore.makeInnerFolder(folder)
        let path = Paths.join(folder, "\(getpid())-\(Identifiers.uuid().prefix(8)).json")
        // Written under another name and renamed once synced: a kill while it is written leaves
        // no journal cut short (which would keep every staged file), only a file `recover`
        // removes, of a batch that had moved nothing yet. Locked from the start, and the lock
        // goes with the file through the rename: a recovery elsewhere never takes it for a dead batch.
        let writing = path + Self.writingSuffix
        let fd = csystem_lock_file(writing)
        guard fd >= 0 else { throw .storage("cannot create the move journal \(path): \(Paths.errnoMessage(-fd))") }
        Fault.point("move.journal-opened")
        let text = JSON.array(
            moves.map { move in
                var item = JSON.object([("staged", .string(move.staged)), ("source", .string(move.source))])
                if let mode = move.mode { item.set("mode", .int64(Int64(mode))) }
                if let mtime = move.mtimeNs { item.set("mtime_ns", .int64(mtime)) }
                if let size = move.size { item.set("size", .int64(size)) }
                if let inode = move.inode { item.set("inode", .int64(Int64(bitPattern: inode))) }
                return item
            }
        ).serialized()
        var bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeMutableBytes { write(fd, $0.baseAddress! + offset, $0.count - offset) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            offset += n
        }
        guard offset == bytes.count, fsync(fd) == 0, rename(writing, path) == 0, csystem_fsync_dir(folder) == 0 else {
            let code = errno
            close(fd)
            unlink(writing)
            unlink(path)
            throw .storage("cannot write the move journal \(path): \(Paths.errnoMessage(code))")
        }
        return Ticket(path: path, fd: fd)
    }

    /// The moves are settled (committed and done, or undone): the journal goes.
    func end(_ ticket: Ticket?) {
        guard let ticket else { return }
        unlink(ticket.path)
        close(ticket.fd)
        ticket.fd = -1
    }

    /// Settles the journals of processes that are gone. `owned` says whether an entry
    /// records a staged file. Returns what was done, for the log.
    func recover(owned: (String) throws(OutboxError) -> Bool) throws(OutboxError) -> [String] {
        guard let names = Paths.list(folder), !names.isEmpty else { return [] }
        // The store may have moved since (a journal names its old folder): files are looked for here.
        let bodies = Paths.join(Paths.dirname(folder), "bodies")
        var done: [String] = []
        // A journal its writer did not finish: no move of its batch had begun. Locked: still being written.
        for name in names where name.hasSuffix(".json" + Self.writingSuffix) {
            let path = Paths.join(folder, name)
            let fd = csystem_lock_file(path)
            guard fd >= 0 else { continue }
            unlink(path)
            close(fd)
        }
        for name in names where name.hasSuffix(".json") {
            let path = Paths.join(folder, name)
            // Locked: the batch is still running in another process; leave it alone.
            let fd = csystem_lock_file(path)
            guard fd >= 0 else { continue }
            defer { close(fd) }
            let items = Paths.readText(path).flatMap { try? JSON.parse($0) }?.arrayValue
            let moves = (items ?? []).compactMap { item -> Move? in
                guard let staged = item["staged"]?.stringValue, let source = item["source"]?.stringValue else { return nil }
                var move = Move(staged: staged, source: source, identity: nil)
                move.mode = item["mode"]?.int64Value.map { UInt32(truncatingIfNeeded: $0) }
                move.mtimeNs = item["mtime_ns"]?.int64Value
                move.size = item["size"]?.int64Value
                move.inode = item["inode"]?.int64Value.map { UInt64(bitPattern: $0) }
                return move
            }
            // One that cannot be read whole (cut short, edited) is kept, and with it every staged
            // file (`cleanOrphans` leaves them while a journal is here): one may be a moved
            // file's only copy, and which one is no longer known.
            guard let items, items.count == moves.count else {
                done.append(
                    "kept the move journal \(path): it cannot be read, so no staged file is removed while it is there "
                        + "(take what is yours out of \(bodies), then delete it)")
                continue
            }
            // A copy back across filesystems that was cut short is never the user's file.
            Self.removeDeadReturnCopies(of: moves.map(\.source))
            for var move in moves {
                guard let staged = Staging.found(move.staged, in: bodies) else { continue }
                // Only a regular file of the store's bodies folder is acted on: a journal edited by
                // hand could name any file to remove or move.
                var info = stat()
                guard Paths.dirname(staged) == bodies, lstat(staged, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
                    done.append("left \(staged) alone: the move journal \(path) names it, but it is no file of the store")
                    continue
                }
                move.staged = staged
                if try owned(move.staged) {
                    // Committed across filesystems, but stopped before it removed the source:
                    // the move is finished now, or the file would be sent again by a rerun.
                    if move.sourceIsTheOriginal, unlink(move.source) == 0 {
                        _ = csystem_fsync_dir(Paths.dirname(move.source))
                        done.append("removed \(move.source), moved into the store by a process stopped before it removed it")
                    }
                    continue
                }
                if !Paths.exists(move.source) {
                    if Self.putBack(move.staged, at: move.source, mode: move.mode, mtimeNs: move.mtimeNs) {
                        done.append("put \(move.source) back (a process moving it was stopped before it finished)")
                    } else {
                        // Its folder went away (moved with the project, say): the only copy stays, kept.
                        let why = Paths.errnoMessage()
                        if let kept = Self.keepReturned(move.staged, storeFolder: Paths.dirname(folder), source: move.source) {
                            done.append("kept \(kept): \(move.source) could not be put back (\(why)); a process moving it was stopped")
                        }
                    }
                } else if move.sourceIsTheOriginal {
                    // The source is there as it was: the staged file is a copy never recorded.
                    unlink(move.staged)
                    done.append("removed \(move.staged), an unrecorded copy of \(move.source)")
                } else if Self.sameFile(move.staged, move.source, mtimeNs: move.mtimeNs) {
                    // Put back across filesystems (a copy, given the file's time) by a process
                    // stopped before it removed the store's copy: the staged file is that copy.
                    unlink(move.staged)
                    done.append("removed \(move.staged): \(move.source) was put back from it by a process stopped before it removed it")
                } else if let kept = Self.keepReturned(move.staged, storeFolder: Paths.dirname(folder), source: move.source) {
                    // Another file took the source path since: the staged one may be the only copy.
                    done.append("kept \(kept): \(move.source) is another file now; a process moving it was stopped")
                }
            }
            unlink(path)
        }
        _ = csystem_fsync_dir(folder)
        return done
    }

    /// Whether `source` holds the bytes of `staged` and the time the journal recorded: a copy
    /// put back, not another file that took the path since.
    static func sameFile(_ staged: String, _ source: String, mtimeNs: Int64?) -> Bool {
        guard let a = FileInfo.stat(staged), let b = FileInfo.stat(source), a.isRegular, b.isRegular, a.size == b.size,
            let mtimeNs, b.mtimeNs == mtimeNs
        else { return false }
        let fa = open(staged, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        let fb = open(source, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        defer {
            if fa >= 0 { close(fa) }
            if fb >= 0 { close(fb) }
        }
        guard fa >= 0, fb >= 0 else { return false }
        var x = [UInt8](repeating: 0, count: 1 << 16)
        var y = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = read(fa, &x, x.count)
            guard n >= 0, n == FileIO.readFully(fb, into: &y, count: n) else { return false }
            if n == 0 { return true }
            guard memcmp(x, y, n) == 0 else { return false }
        }
    }

    /// Keeps a moved file that cannot go back to its source in the store's `returned/` folder,
    /// which outbox never empties; returns where, or nil when even that failed.
    static func keepReturned(_ file: String, storeFolder: String, source: String) -> String? {
        let returned = Paths.join(storeFolder, "returned")
        try? SQLiteStore.makeFolder(returned)
        let target = Paths.join(returned, Paths.basename(source))
        let finalTarget = Paths.exists(target) ? "\(target).\(Identifiers.uuid().prefix(8))" : target
        // Kept inside the store, it stays a store file: owner only, whatever its source's mode.
        chmod(file, 0o600)
        guard rename(file, finalTarget) == 0 else { return nil }
        _ = csystem_fsync_dir(returned)
        return finalTarget
    }

    /// Moves a staged file back to its source path with the mode and modification time it
    /// had there: a rename, or across filesystems a copy (given them, synced, then renamed
    /// into place, so a kill never leaves it there without them) before the store's copy goes.
    static func putBack(_ file: String, at source: String, mode: UInt32?, mtimeNs: Int64?) -> Bool {
        if rename(file, source) == 0 {
            restore(source, mode: mode, mtimeNs: mtimeNs)
            _ = csystem_fsync_dir(Paths.dirname(source))
            return true
        }
        guard errno == EXDEV else { return false }
        let temp = "\(source)\(returnCopySuffix)\(getpid())"
        guard csystem_copy_file(file, temp, -1, nil) == 0 else { return false }
        restore(temp, mode: mode, mtimeNs: mtimeNs)
        guard csystem_fsync_path(temp) == 0, rename(temp, source) == 0 else {
            unlink(temp)
            return false
        }
        _ = csystem_fsync_dir(Paths.dirname(source))
        Fault.point("return.copied")
        unlink(file)
        return true
    }

    static let returnCopySuffix = ".outbox-return-"

    /// Removes the partial copies back to these source paths made by processes that are
    /// gone (each folder listed once).
    static func removeDeadReturnCopies(of sources: [String]) {
        let wanted = Set(sources)
        for folder in Set(sources.map(Paths.dirname)) {
            for name in Paths.list(folder) ?? [] {
                guard let cut = name.ranges(of: returnCopySuffix).last,
                    wanted.contains(Paths.join(folder, String(name[..<cut.lowerBound]))),
                    let pid = Int32(name[cut.upperBound...]), pid > 0, kill(pid, 0) != 0, errno == ESRCH
                else { continue }
                unlink(Paths.join(folder, name))
            }
        }
    }

    /// Gives a file put back at its source path the mode and modification time it had there.
    static func restore(_ path: String, mode: UInt32?, mtimeNs: Int64?) {
        if let mode { chmod(path, mode_t(mode)) }
        guard let mtimeNs else { return }
        let time = timespec(tv_sec: Int(mtimeNs / 1_000_000_000), tv_nsec: Int(mtimeNs % 1_000_000_000))
        var times = [time, time]
        _ = utimensat(AT_FDCWD, path, &times, 0)
    }
}
