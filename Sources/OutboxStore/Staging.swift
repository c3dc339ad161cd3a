import CSystem
import Glibc
import OutboxModel

/// Bodies staged on disk for one entry, and how to undo that if the commit fails.
struct StagedBody {
    var inline: [UInt8]?
    var file: String?
    var form: [StoredFormField] = []
    var totalBytes: Int64 = 0
    /// Files this staging created inside the store (removed on rollback).
    var created: [String] = []
    /// (store path, user's source path, its mode) of files moved in (moved back on rollback).
    var movedIn: [(String, String, mode_t)] = []
    /// Sources copied across filesystems for a `move`: removed only after the commit.
    var removeAfterCommit: [String] = []
    /// Nothing was staged: the entry of this id already held the same body when the batch was
    /// staged. The body the entry holds when the batch is written is the one to keep.
    var keepsStored = false
    /// The file is one the replaced entry staged (`reusableMovedBody`): kept from removal when
    /// that entry is forgotten in the same commit (by its settle, or by this replace).
    var reusesStored = false

    /// The body an entry holds, passed on to the entry that replaces it with the same bytes.
    init(takenOver e: Entry) {
        switch e.body {
        case let .bytes(bytes): inline = bytes
        case let .form(fields): form = fields
        case .none, .file, .parts: break
        }
        file = e.body.file
        totalBytes = e.totalBytes
    }

    init() {}
}

/// Writes bodies into `.outbox/bodies` durably: temp file + fsync + rename + fsync of the
/// folder, so a committed entry never points at a half-written body.
struct Staging {
    static let inlineLimit = 64 * 1024
    let bodiesDir: String

    func path(_ internalID: String, _ suffix: String) -> String {
        Paths.join(bodiesDir, "\(internalID).\(suffix)")
    }

    /// A staged path as it is found now: where it was recorded, or else the file of the same
    /// name in `bodiesDir` (a store moved as a folder keeps names, not paths); nil when neither is.
    static func found(_ path: String, in bodiesDir: String) -> String? {
        if Paths.exists(path) { return path }
        let local = Paths.join(bodiesDir, Paths.basename(path))
        return Paths.exists(local) ? local : nil
    }

    private func tempPath(for final: String) -> String {
        "\(final).tmp-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
    }

    func writeBytes(_ bytes: [UInt8], to final: String) throws(OutboxError) {
        let temp = tempPath(for: final)
        let rc = bytes.withUnsafeBytes { csystem_write_file(temp, $0.baseAddress, $0.count) }
        guard rc == 0 else { throw .storage("cannot write \(temp): \(Paths.errnoMessage(-rc))") }
        guard rename(temp, final) == 0 else {
            let e = errno
            unlink(temp)
            throw .storage("cannot rename \(temp): \(Paths.errnoMessage(e))")
        }
    }

    /// Why this user may not remove the file at `path` (whose owner is `owner`) from its
    /// folder, or nil: the folder is not writable and searchable for it, or it is sticky
    /// (`/tmp`) and neither the folder nor the file is the user's.
    static func removalProblem(_ path: String, owner: uid_t) -> String? {
        let folder = Paths.dirname(path)
        guard faccessat(AT_FDCWD, folder, W_OK | X_OK, AT_EACCESS) == 0 else {
            return "its folder \(folder) does not let this user remove it (\(Paths.errnoMessage()))"
        }
        var info = stat()
        let me = geteuid()
        if stat(folder, &info) == 0, info.st_mode & S_ISVTX != 0, me != 0, me != info.st_uid, me != owner {
            return "its folder \(folder) is sticky and neither it nor the file is this user's"
        }
        return nil
    }

    /// Copies `file` in; the copy must be the file as the entry recorded it (a file still
    /// being written would give bytes that match neither its recorded size nor its hash).
    func copyFile(_ file: FileIdentity, to final: String) throws(OutboxError) {
        let source = file.path
        let temp = tempPath(for: final)
        // One byte past the recorded size is enough to see a file that grew.
        var sourceFailed: Int32 = 0
        let rc = csystem_copy_file(source, temp, file.size + 1, &sourceFailed)
        guard rc == 0 else {
            if -rc == EINTR { try Self.checkStop() }
            if -rc == ENOENT { throw .fileMissing("no such file \(source)") }
            if -rc == EINVAL { throw .invalid("\(source) is not a regular file (any more)") }
            if sourceFailed != 0 { throw .unreadable("cannot read \(source): \(Paths.errnoMessage(-rc))", errno: -rc) }
            throw .storage("cannot write into the store folder \(Paths.dirname(final)): \(Paths.errnoMessage(-rc))")
        }
        let copied = FileInfo.stat(temp)?.size ?? -1
        guard copied == file.size, let now = FileInfo.stat(source), file.matches(size: now.size, mtimeNs: now.mtimeNs, inode: now.inode)
        else {
            unlink(temp)
            throw .invalid(
                "\(source) changed while it was copied into the store (it had \(file.size) bytes when enqueue read it); enqueue it once it is complete"
            )
        }
        guard rename(temp, final) == 0 else {
            let e = errno
            unlink(temp)
            throw .storage("cannot rename \(temp): \(Paths.errnoMessage(e))")
        }
    }

    /// Stages the body of a prepared request under `internalID`.
    func stage(_ body: PreparedBody, internalID: String) throws(OutboxError) -> StagedBody {
        var staged = StagedBody()
        do throws(OutboxError) {
            switch body {
            case .none:
                break
            case let .bytes(bytes, _):
                staged.totalBytes = Int64(bytes.count)
                if bytes.count <= Self.inlineLimit {
                    staged.inline = bytes
                } else {
                    let final = path(internalID, "body")
                    try writeBytes(bytes, to: final)
                    staged.created.append(final)
                    staged.file = final
                }
            case let .form(fields):
                for (i, field) in fields.enumerated() {
                    var stored = StoredFormField(
                        name: field.name, value: field.value, stagedFile: nil,
                        filename: field.filename, contentType: field.contentType)
                    if let file = field.file {
                        let final = path(internalID, "form\(i)")
                        csystem_stop_defer()  // as for a copied body, below
                        try copyFile(file, to: final)
                        staged.created.append(final)
                        stored.stagedFile = final
                        if stored.filename == nil { stored.filename = Paths.basename(file.path) }
                        staged.totalBytes += file.size
                    } else {
                        staged.totalBytes += Int64(field.value?.utf8.count ?? 0)
                    }
                    staged.form.append(stored)
                }
            case let .file(identity, ownership), let .parts(identity, ownership, _):
                staged.totalBytes = identity.size
                switch ownership {
                case .reference:
                    staged.file = identity.path
                case .copy:
                    let final = path(internalID, "body")
                    // A stop signal during a copy (a large file takes seconds) ends it and the
                    // enqueue's cleanup runs, instead of ending the process with half a copy inside.
                    csystem_stop_defer()
                    try copyFile(identity, to: final)
                    staged.created.append(final)
                    Fault.point("enqueue.copied")
                    Fault.hold("enqueue.copied")
                    staged.file = final
                case .move:
                    let final = path(internalID, "body")
                    // From the first file moved in, a stop signal waits for the code that puts
                    // them back (`checkStop`) instead of ending the process with them inside.
                    csystem_stop_defer()
                    // A link would move the link and leave the file it names outside the store.
                    var st = stat()
                    if lstat(identity.path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFLNK {
                        throw OutboxError.invalid(
                            "request.file: \(identity.path) is a symbolic link; ownership: move takes a regular file (use copy or reference)"
                        )
                    }
                    // Moved, the file leaves its folder: one this user may not change would keep it
                    // (across filesystems, a copy would go in and the name stay, unseen).
                    if let problem = Self.removalProblem(identity.path, owner: st.st_uid) {
                        throw OutboxError.unreadable(
                            "request.file: cannot move \(identity.path) into the store: \(problem) (ownership: move takes the file away from there; copy leaves it)",
                            errno: EACCES)
                    }
                    if st.st_nlink > 1 || st.st_uid != geteuid() {
                        // Renamed in, a file with other hard links would still be theirs too: the
                        // store's mode would be theirs, their later writes sent; one another user
                        // owns would keep that owner and mode (0644 for all to read, or 000). It is
                        // copied in, and its name removed after the commit, as across filesystems.
                        try copyFile(identity, to: final)
                        staged.created.append(final)
                        staged.removeAfterCommit.append(identity.path)
                    } else if rename(identity.path, final) == 0 {
                        Fault.point("enqueue.moved")
                        staged.movedIn.append((final, identity.path, st.st_mode & 0o7777))
                        // A moved file keeps the user's mode; the store's files are 0600 (they hold tokens).
                        chmod(final, 0o600)
                    } else if errno == EXDEV {
                        try copyFile(identity, to: final)
                        staged.created.append(final)
                        staged.removeAfterCommit.append(identity.path)
                    } else if errno == ENOENT {
                        throw OutboxError.fileMissing("request.file: no such file \(identity.path)")
                    } else {
                        throw OutboxError.storage("cannot move \(identity.path) into the store: \(Paths.errnoMessage())")
                    }
                    staged.file = final
                }
            }
        } catch {
            rollback(staged)
            throw error
        }
        return staged
    }

    /// Makes the renames durable: one fsync of the bodies folder (and of each source folder).
    func syncFolders(_ staged: [StagedBody]) throws(OutboxError) {
        guard staged.contains(where: { !$0.created.isEmpty || !$0.movedIn.isEmpty }) else { return }
        let rc = csystem_fsync_dir(bodiesDir)
        guard rc == 0 else { throw .storage("cannot fsync \(bodiesDir): \(Paths.errnoMessage(-rc))") }
        var sources = Set<String>()
        for s in staged { for (_, source, _) in s.movedIn { sources.insert(Paths.dirname(source)) } }
        for dir in sources { _ = csystem_fsync_dir(dir) }
    }

    /// Throws once a stop signal came while files moved in wait to be put back: the callers'
    /// cleanup puts them back, and the process then ends with the signal.
    static func checkStop() throws(OutboxError) {
        guard csystem_stop_pending() != 0 else { return }
        throw .storage("stopped by a signal before the commit; the files moved or copied into the store were put back or removed")
    }

    /// Undoes a staging: created files removed, moved files put back where they were.
    func rollback(_ staged: StagedBody) {
        for file in staged.created { unlink(file) }
        // Back with the mode it had: the store made it 0600 when it moved in.
        for (final, source, mode) in staged.movedIn where rename(final, source) == 0 { chmod(source, mode) }
    }

    func afterCommit(_ staged: [StagedBody]) {
        var dirs = Set<String>()
        for s in staged {
            for source in s.removeAfterCommit {
                unlink(source)
                dirs.insert(Paths.dirname(source))
            }
        }
        for dir in dirs { _ = csystem_fsync_dir(dir) }
    }

    /// Removes a staged file when its entry is forgotten; never the user's referenced file.
    func discard(_ path: String?) {
        guard let path, path.hasPrefix(bodiesDir + "/") else { return }
        // A body left behind is not lost data, but audit would call it an orphan: say why.
        if unlink(path) != 0, errno != ENOENT {
            FileIO.log("outbox: cannot remove \(path): \(Paths.errnoMessage()); `outbox audit --fix` removes it later")
        }
    }
}
