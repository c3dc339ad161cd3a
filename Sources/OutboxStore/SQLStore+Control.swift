import CSystem
import Glibc
import OutboxModel

/// Cancel, retry, headers, counts, audit and orphans: the same on both stores.
extension SQLStore {
    /// Forgets an entry: its row, parts, attempts, outcomes and staged bytes. A file moved
    /// into the store and never sent completely goes back to its source path: outbox never
    /// destroys the user's only copy.
    /// Must run inside a transaction; returns files to remove after the commit.
    func forget(_ e: Entry, returnMovedFile: Bool, rowDeleted: Bool = false) throws(OutboxError) -> [String] {
        if !rowDeleted { try db.run("DELETE FROM entries WHERE seq = ?", [.int(e.seq)]) }
        try deleteParts(of: e)
        try db.run("DELETE FROM attempts WHERE entry_id = ?", [.text(e.id)])
        try db.run("DELETE FROM outcomes WHERE entry_id = ? AND generation <= ?", [.text(e.id), .int(e.generation)])
        return forgottenFiles(e, returnMovedFile: returnMovedFile)
    }

    /// The entry a settle is about: the runner's snapshot, which spares re-reading (and
    /// re-parsing) the row it just sent, or else the stored row of the settle's generation.
    func settledEntry(_ s: Settlement) throws(OutboxError) -> Entry? {
        if let snapshot = s.snapshot { return snapshot }
        guard let stored = try entry(id: s.entryID), stored.generation == s.generation else { return nil }
        return stored
    }

    /// Journals the outcome of a settle that keeps its entry, inside the caller's transaction:
    /// acknowledged already when no hook will take it.
    func journalOutcome(of e: Entry, _ s: Settlement, now: Int64) throws(OutboxError) {
        try db.run(
            """
            INSERT INTO outcomes (entry_id, key, generation, outcome, payload, acknowledged, reason, created_at)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            """,
            [
                .text(e.id), .text(e.key), .int(e.generation), .text(s.outcome.rawValue), .text(s.payload.serialized()),
                .bool(!s.hookExists), .optional(s.reason), .int(now),
            ])
    }

    /// What an acknowledged outcome of an entry's generation lets go, inside the caller's
    /// transaction: a completed or cancelled entry that owes no other outcome is forgotten; any
    /// other stops waiting for its delivery. Returns the files to remove after the commit.
    func entryAcknowledged(id: String, generation: Int64, now: Int64) throws(OutboxError) -> [String] {
        // A later outcome of the same generation (an error entry reopened and then
        // completed) is still owed: forgetting now would drop it.
        let owed =
            try db.queryOne("SELECT COUNT(*) FROM outcomes WHERE entry_id = ? AND acknowledged = 0", [.text(id)]) { $0.int(0) } ?? 0
        guard let e = try entry(id: id) else { return [] }
        if e.generation == generation, e.state == .completed || e.state == .cancelled, owed == 0 {
            // A scope's cancel is a cancel: a moved file that was never sent goes back.
            return try forget(e, returnMovedFile: true)
        } else if e.waitsForDelivery {
            try db.run("UPDATE entries SET waits_for_delivery = 0, updated_at = ? WHERE seq = ?", [.int(now), .int(e.seq)])
        }
        return []
    }

    /// Removes an entry whose row cannot be read back (what it refers to is unknown), with its
    /// parts, attempts and outcomes. Its staged files are kept in `returned/`: one may be a moved
    /// file's only copy.
    func forgetDamaged(id: String) throws(OutboxError) {
        guard
            let (seq, internalID) = try db.queryOne(
                "SELECT seq, internal FROM entries WHERE id = ?", [.text(id)], { ($0.int(0), $0.text(1)) })
        else { return }
        // Once the row is gone the next runner would remove them as orphans.
        for name in Paths.list(staging.bodiesDir) ?? [] where Self.isStaged(name, forOneOf: [internalID]) {
            _ = MoveJournal.keepReturned(Paths.join(staging.bodiesDir, name), storeFolder: folder, source: name)
        }
        try db.run("DELETE FROM entries WHERE seq = ?", [.int(seq)])
        try db.run("DELETE FROM parts WHERE entry_seq = ?", [.int(seq)])
        try db.run("DELETE FROM s3_uploads WHERE entry_seq = ?", [.int(seq)])
        try db.run("DELETE FROM attempts WHERE entry_id = ?", [.text(id)])
        try db.run("DELETE FROM outcomes WHERE entry_id = ?", [.text(id)])
    }

    /// The staged files of a forgotten entry to remove after the commit; a moved file that
    /// was never sent is queued to go back instead.
    func forgottenFiles(_ e: Entry, returnMovedFile: Bool) -> [String] {
        var files = e.request.form.compactMap(\.stagedFile)
        if let file = e.bodyFile, file.hasPrefix(staging.bodiesDir + "/") {
            if returnMovedFile, e.request.ownership == .move, e.state != .completed, let source = e.request.file?.path {
                returns.append((file, source, e.request.file))
            } else {
                files.append(file)
            }
        }
        return files
    }

    /// Parts, and an s3 entry's multipart upload, live and die with their entry row (no
    /// cascade: see migrations 004 and 007). Only an entry sent in parts has either.
    func deleteParts(of e: Entry) throws(OutboxError) {
        guard e.isChunked else { return }
        try db.run("DELETE FROM parts WHERE entry_seq = ?", [.int(e.seq)])
        try db.run("DELETE FROM s3_uploads WHERE entry_seq = ?", [.int(e.seq)])
    }

    /// Removes staged files after a commit, and puts moved files back.
    func finishForget(_ files: [String]) {
        for file in files + obsoleteFiles where !takenOverFiles.contains(file) { staging.discard(file) }
        obsoleteFiles.removeAll()
        takenOverFiles.removeAll()
        staging.afterCommit(stagedInTransaction.map(\.body))
        for staged in stagedInTransaction { moves.end(staged.moves) }
        stagedInTransaction.removeAll()
        for (file, source, identity) in returns {
            // The store keeps its files 0600; the user's file gets its own mode back.
            if let mode = identity?.mode { chmod(file, mode_t(mode)) }
            let sourceTaken = Paths.exists(source)
            var putBackError = ""
            if !sourceTaken {
                if MoveJournal.putBack(file, at: source, mode: identity?.mode, mtimeNs: identity?.mtimeNs) {
                    Fault.point("forget.returned")
                    continue
                }
                putBackError = Paths.errnoMessage()
            }
            if let kept = MoveJournal.keepReturned(file, storeFolder: folder, source: source) {
                let why = sourceTaken ? "\(source) exists" : "it could not be put back at \(source) (\(putBackError))"
                FileIO.log("outbox: \(why), so the file moved into the store was kept as \(kept)")
            }
        }
        returns.removeAll()
        moves.end(returnsTicket)
        returnsTicket = nil
    }

    /// Writes down the moved files this transaction will put back after its commit, so that
    /// a crash between the commit and the renames back strands none of them. Called at the
    /// end of every transaction that may forget an entry holding a moved file.
    func journalReturns() throws(OutboxError) {
        guard !returns.isEmpty, returnsTicket == nil else { return }
        returnsTicket = try moves.begin(returns.map { MoveJournal.Move(staged: $0.file, source: $0.source, identity: $0.identity) })
    }

    /// Forgets the returns of a transaction that rolled back (the files stay where they are)
    /// and removes the bodies it staged.
    func dropReturns() {
        returns.removeAll()
        takenOverFiles.removeAll()
        for staged in stagedInTransaction {
            staging.rollback(staged.body)
            moves.end(staged.moves)
        }
        stagedInTransaction.removeAll()
        moves.end(returnsTicket)
        returnsTicket = nil
    }

    /// `outbox cancel`: live entries settle cancelled and are forgotten; settled ones are
    /// forgotten with their unacknowledged outcomes. Unknown ids are not errors.
    package func cancel(ids: [String]?, key: String?, now: Int64) throws(OutboxError) -> [String] {
        var toRemove: [String] = []
        let cancelled: [String]
        do throws(OutboxError) {
            // One writer at a time: an enqueue of the same id must not slip between the read and the delete.
            cancelled = try writing { () throws(OutboxError) -> [String] in
                // A transaction cut before its commit runs again whole.
                toRemove = []
                var cancelled: [String] = []
                func cancel(_ entries: [Entry]) throws(OutboxError) {
                    for e in entries {
                        toRemove += try forget(e, returnMovedFile: true)
                        cancelled.append(e.id)
                    }
                }
                // Named by its id, a row that cannot be read back can still go: the way out of it.
                func cancelDamaged(_ id: String) throws(OutboxError) {
                    try forgetDamaged(id: id)
                    cancelled.append(id)
                }
                if let ids {
                    for id in ids {
                        let e: Entry?
                        do throws(OutboxError) {
                            e = try entry(id: id)
                        } catch {
                            guard Self.isDamage(error) else { throw error }
                            try cancelDamaged(id)
                            continue
                        }
                        if let e { try cancel([e]) }
                    }
                } else {
                    // `--all` and `--key` leave nothing behind, rows that do not read back included.
                    try forEachChunk(ListFilter(key: key), damaged: cancelDamaged, cancel)
                }
                try journalReturns()
                Fault.point("cancel.journaled")
                return cancelled
            }
        } catch {
            dropReturns()
            throw error
        }
        Fault.point("cancel.committed")
        finishForget(toRemove)
        return cancelled
    }

    /// `outbox retry`: entries due now, backoff reset and a `--delay` hold lifted (see
    /// `Store.retry`). An expired entry
    /// gets its lifetime again from now, or it would expire again at once.
    package func retry(ids: [String]?, key: String?, errors: Bool, now: Int64) throws(OutboxError) -> [String] {
        // One writer at a time: the entries are read, then written by generation, as the same-id rules do.
        try writing { () throws(OutboxError) -> [String] in
            var retried: [String] = []
            func retry(_ entries: [Entry]) throws(OutboxError) { retried += try retryRows(entries, now: now) }
            if let ids {
                for id in ids { if let e = try entry(id: id) { try retry([e]) } }
            } else if let key {
                try forEachChunk(ListFilter(key: key), retry)
            } else if errors {
                try forEachChunk(ListFilter(state: EntryState.error.rawValue), retry)
            }
            return retried
        }
    }

    package func retry(asRead entries: [Entry], now: Int64) throws(OutboxError) -> [String] {
        try writing { () throws(OutboxError) -> [String] in try retryRows(entries, now: now) }
    }

    /// Puts back the entries as read, each only while it is still in that state: runners
    /// claim without the writers' lock (PostgreSQL), so one may have taken it since, and a
    /// running entry put back in the queue under its runner would be sent twice.
    private func retryRows(_ entries: [Entry], now: Int64) throws(OutboxError) -> [String] {
        var retried: [String] = []
        for e in entries where [.queued, .awaitingAuth, .error].contains(e.state) {
            var expiresAt = e.expiresAt
            if let expiry = e.expiresAt, expiry <= now {
                expiresAt = Identifiers.expiry(now: now, lifetimeMs: max(0, expiry - e.createdAt))
            }
            let changed = try db.run(
                """
                UPDATE entries SET state = 'queued', reason = NULL, attempts = 0, next_attempt_at = ?, not_before = NULL,
                  expires_at = ?, updated_at = ?
                WHERE seq = ? AND generation = ? AND state = ?
                """, [.int(now), .optional(expiresAt), .int(now), .int(e.seq), .int(e.generation), .text(e.state.rawValue)])
            guard changed > 0 else { continue }
            retried.append(e.id)
            // Its parts waiting for their own retries are due now too, their backoff reset.
            if e.isChunked {
                try db.run("UPDATE parts SET attempts = 0, next_attempt_at = NULL WHERE entry_seq = ? AND accepted = 0", [.int(e.seq)])
            }
        }
        return retried
    }

    package func headerPatch() throws(OutboxError) -> [(String, String)] {
        HeaderRules.from(json: try headerSettings().patch)
    }

    /// `outbox headers update`: merges a patch into every entry (and its parts), bumps the
    /// header generation and resumes awaiting-auth entries. Returns the new generation.
    package func updateHeaders(_ patch: [(String, String)], now: Int64) throws(OutboxError) -> Int64 {
        // One writer at a time: the header generation is read and bumped, and every entry rewritten.
        try writing { () throws(OutboxError) -> Int64 in
            let stored = try headerSettings()
            let generation = stored.generation + 1
            try setSetting(Self.headerGenerationSetting, String(generation))
            let merged = HeaderRules.merge(HeaderRules.from(json: stored.patch), patch)
            // The patch alone must fit in a request head: every later entry carries it.
            do throws(HeaderRules.HeadOverLimit) { try HeaderRules.checkHead(method: "", url: nil, headers: merged) } catch {
                switch error {
                case let .headers(n):
                    throw .invalid(
                        "headers update: the patch would hold \(n) headers, over the \(HeaderRules.maxHeaders) a request may carry")
                case let .bytes(n):
                    throw .invalid(
                        "headers update: the patch would hold \(n) bytes, over the \(HeaderRules.maxHeadBytes) of one request head")
                }
            }
            try setSetting("header_patch", HeaderRules.json(merged).serialized())
            func updateHeaders(of e: Entry) throws(OutboxError) {
                var request = e.request
                request.apply(headerPatch: patch)
                try Self.checkPatchedHead(method: request.method, url: request.url, headers: request.headers, id: e.id)
                try db.run(
                    """
                    UPDATE entries SET request = ?, header_generation = ?, updated_at = ?,
                      state = CASE WHEN state = 'awaiting-auth' THEN 'queued' ELSE state END,
                      reason = CASE WHEN state = 'awaiting-auth' THEN '\(headersUpdatedReason)' ELSE reason END,
                      next_attempt_at = CASE WHEN state = 'awaiting-auth' THEN ? ELSE next_attempt_at END
                    WHERE seq = ?
                    """, [.text(request.text), .int(generation), .int(now), .int(now), .int(e.seq)])
                for part in try parts(entrySeq: e.seq) {
                    let headers = HeaderRules.merge(part.headers, patch)
                    try Self.checkPatchedHead(method: request.method, url: part.url, headers: headers, id: e.id)
                    try db.run(
                        "UPDATE parts SET headers = ? WHERE entry_seq = ? AND idx = ?",
                        [.text(HeaderRules.json(headers).serialized()), .int(e.seq), .int(part.index)])
                }
                Fault.point("headers.mid-update")
            }
            try forEachChunk(ListFilter()) { entries throws(OutboxError) in for e in entries { try updateHeaders(of: e) } }
            return generation
        }
    }

    /// Counts of entries by state, and of outcomes not yet acknowledged.
    package func counts() throws(OutboxError) -> StoreCounts {
        var states: [EntryState: Int64] = [:]
        var byKey: [String: [EntryState: Int64]] = [:]
        let rows = try db.query("SELECT key, state, COUNT(*) FROM entries GROUP BY key, state", []) { ($0.text(0), $0.text(1), $0.int(2)) }
        for (key, name, n) in rows {
            guard let state = EntryState(rawValue: name) else {
                let id = try db.queryOne("SELECT id FROM entries WHERE state = ? LIMIT 1", [.text(name)]) { $0.text(0) } ?? "?"
                throw Self.damaged("the stored entry \(id) is damaged: unknown state \"\(name)\"", id: id)
            }
            states[state, default: 0] += n
            byKey[key, default: [:]][state] = n
        }
        let pending = try db.queryOne("SELECT COUNT(*) FROM outcomes WHERE acknowledged = 0") { $0.int(0) } ?? 0
        let oldest = try db.queryOne("SELECT MIN(created_at) FROM entries WHERE state = 'queued'") { $0.isNull(0) ? nil : $0.int(0) } ?? nil
        if let oldest, !Self.plausibleTime.contains(oldest) {
            throw .storage("the store is damaged: an entry was created at \(oldest), out of range (`outbox audit` names it)")
        }
        return StoreCounts(states: states, pendingOutcomes: pending, oldestQueuedAt: oldest, byKey: byKey)
    }

    package func remainingCount() throws(OutboxError) -> Int64 {
        // One count per partial index: queued, running, and the failed states together.
        try db.queryOne(Self.remainingSQL) { $0.int(0) } ?? 0
    }

    package func nextWaitEnd(after now: Int64) throws(OutboxError) -> Int64? {
        try db.queryOne(Self.nextWaitEndSQL, [.int(now), .int(now)]) { $0.isNull(0) ? nil : $0.int(0) } ?? nil
    }

    /// Through `entries_stuck` (the states spelt as the partial index has them): the queue's
    /// length does not count.
    package func parkedPastExpiry(now: Int64) throws(OutboxError) -> [Entry] {
        try db.query(
            "SELECT \(Self.entryColumns) FROM entries WHERE \(Self.stuckStates) AND state = 'awaiting-auth' AND expires_at <= ? ORDER BY seq",
            [.int(now)], entryFromRow)
    }

    /// Two index seeks on SQLite (`entries_waiting`, `entries_delayed`), whatever the queue's length.
    static var nextWaitEndSQL: String {
        """
        SELECT MIN(t) FROM (
          SELECT MIN(next_attempt_at) AS t FROM entries WHERE state = 'queued' AND next_attempt_at IS NOT NULL AND next_attempt_at > ?
          UNION ALL
          SELECT MIN(not_before) AS t FROM entries WHERE state = 'queued' AND not_before IS NOT NULL AND not_before > ?
        ) AS waits
        """
    }

    static var remainingSQL: String {
        """
        SELECT (SELECT COUNT(*) FROM entries WHERE state = 'queued') + (SELECT COUNT(*) FROM entries WHERE state = 'running')
          + (SELECT COUNT(*) FROM entries WHERE \(stuckStates))
        """
    }

    /// The failed states, as the partial index `entries_stuck` spells them: a query that
    /// names them so reads that index instead of every entry.
    static var stuckStates: String { "state IN ('awaiting-auth', 'error')" }

    /// Problems with the store's invariants (empty when all hold), for `outbox audit`.
    /// Where a staged file is: a store moved as a folder and opened read-only keeps its rows'
    /// old paths (only a writer rewrites them), so a file is found by its name in this store's folder.
    private func stagedHere(_ path: String) -> String { Staging.found(path, in: staging.bodiesDir) ?? path }

    /// The staged files of `e` (its body, its form's files) that are not in this store's
    /// folder, each as "staged body PATH". A referenced file is the user's, not the store's:
    /// its going away is an error of that entry (kind file), not of the store.
    private func stagedFilesMissing(_ e: Entry) -> [String] {
        var missing: [String] = []
        if let file = e.bodyFile.map(stagedHere), e.request.ownership != .reference, !Paths.exists(file) {
            missing.append("staged body \(file)")
        }
        for f in e.request.form.compactMap(\.stagedFile) where !Paths.exists(stagedHere(f)) { missing.append("staged form file \(f)") }
        return missing
    }

    package func missingStagedFiles(of e: Entry) throws(OutboxError) -> [String] {
        try entriesStagedElsewhere().contains(e.id) ? [] : stagedFilesMissing(e)
    }

    package func audit(note: (String) -> Void) throws(OutboxError) -> [String] {
        var problems = try databaseProblems()
        // A mark out of step with `paused_keys` sends a paused key's entry, or holds one for good.
        let paused = try pausedKeys()
        let astray = try db.query(
            """
            SELECT key, COUNT(*) FROM entries WHERE paused <> CASE WHEN key IN (SELECT key FROM paused_keys) THEN 1 ELSE 0 END
            GROUP BY key ORDER BY key
            """
        ) { ($0.text(0), $0.int(1)) }
        for (key, n) in astray {
            problems.append(
                "\(n) \(n == 1 ? "entry" : "entries") of key \(key) marked \(paused.contains(key) ? "unpaused" : "paused") against the key's pause (resume the key, and pause it again if it should stay paused)"
            )
        }
        let elsewhere = try entriesStagedElsewhere()
        func check(_ e: Entry) throws(OutboxError) {
            guard !elsewhere.contains(e.id) else { return }
            let missing = stagedFilesMissing(e)
            for file in missing { problems.append("\(e.id): \(file) is missing") }
            if missing.isEmpty, let file = e.bodyFile.map(stagedHere), e.request.ownership != .reference,
                let problem = Paths.stagedFileProblem(file, size: e.request.file?.size)
            {
                problems.append("\(e.id): staged body \(file) \(problem)")
            }
            if e.isChunked {
                let parts = try self.parts(entrySeq: e.seq)
                if let problem = ChunkPlan.tilingProblem(parts.map(\.range), size: e.totalBytes) {
                    problems.append("\(e.id): parts do not tile the file: \(problem)")
                }
            }
            if e.state == .completed || e.state == .cancelled {
                let pending =
                    try db.queryOne("SELECT COUNT(*) FROM outcomes WHERE entry_id = ? AND acknowledged = 0", [.text(e.id)]) { $0.int(0) }
                    ?? 0
                if pending == 0 { problems.append("\(e.id): \(e.state.rawValue) but has no outcome awaiting acknowledgement") }
            }
        }
        var sawDamage = false
        try db.read { () throws(OutboxError) in
            // A row that does not read back is a problem to list, like the others, not the end of the audit.
            let damaged = { (id: String) throws(OutboxError) in
                sawDamage = true
                do throws(OutboxError) { _ = try self.entry(id: id) } catch { problems.append(error.message) }
            }
            try forEachChunk(ListFilter(), damaged: damaged) { entries throws(OutboxError) in for e in entries { try check(e) } }
        }
        do { _ = try unacknowledgedOutcomes() } catch  where error.code == .storage { problems.append(error.message) }
        do { _ = try headerSettings() } catch  where error.code == .storage { problems.append(error.message) }
        let orphans = try db.queryOne("SELECT COUNT(*) FROM parts WHERE entry_seq NOT IN (SELECT seq FROM entries)") { $0.int(0) } ?? 0
        if orphans > 0 { problems.append(orphans == 1 ? "1 part belongs to no entry" : "\(orphans) parts belong to no entry") }
        // While an enqueue stages its bodies (it holds the lock shared) they are not in the
        // table yet: they are not orphans, and no file can be judged until it commits.
        guard let lock = stagingLock(exclusive: true) else {
            note(
                "an enqueue (or a runner's follow-up entries) is staging bodies now: staged files not checked for orphans (run audit again after it)"
            )
            return problems
        }
        defer { withExtendedLifetime(lock) {} }
        // A move journal left (none is being written while the lock is ours) could not be read.
        let journals = (Paths.list(moves.folder) ?? []).filter { $0.hasSuffix(".json") }.map { Paths.join(moves.folder, $0) }
        problems += journals.map { "move journal \($0) cannot be read: no staged file is removed while it is there" }
        // A damaged row or a lost journal may own staged files no one can name: none is called an orphan then.
        if sawDamage || !journals.isEmpty {
            let why = sawDamage ? "a row is damaged (cancel it" : "a move journal cannot be read (see above"
            note("staged files not checked for orphans while \(why), then run audit again)")
            return problems
        }
        // By name, as the runner judges orphans: rows may name this folder under another spelling.
        var knownNames = Set<String>()
        let owners = try stagingOwners()
        try forEachChunk(ListFilter()) { entries in knownNames.formUnion(entries.flatMap(\.body.files).map(Paths.basename)) }
        for name in Paths.list(staging.bodiesDir) ?? [] {
            let path = Paths.join(staging.bodiesDir, name)
            if let marker = name.firstRange(of: ".tmp-") {
                // Another process's copy in progress, unless that process is gone.
                let pid = Int32(name[marker.upperBound...].prefix { $0.isASCII && $0.isNumber }) ?? 0
                if pid > 0, kill(pid, 0) != 0, errno == ESRCH {
                    problems.append("temporary file \(path) left by process \(pid), which is gone (audit --fix removes it)")
                }
                continue
            }
            if !knownNames.contains(name), !Self.isStaged(name, forOneOf: owners) { problems.append("orphan staged file \(path)") }
        }
        return problems
    }
}

enum FileIO {
    static func log(_ line: String) {
        let text = line + "\n"
        _ = text.withCString { write(2, $0, strlen($0)) }
    }

    /// Reads `count` bytes into the start of `buffer` unless the file ends first; how many, or -1.
    static func readFully(_ fd: Int32, into buffer: inout [UInt8], count: Int) -> Int {
        var got = 0
        while got < count {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress! + got, count - got) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { return n < 0 ? -1 : got }
            got += n
        }
        return got
    }
}

/// Held shared by every process while it stages bodies and commits them; `cleanOrphans`
/// needs it alone, so it never takes the files of an enqueue in progress for orphans.
final class StagingLock {
    private var fd: Int32
    init(fd: Int32) { self.fd = fd }
    deinit { if fd >= 0 { close(fd) } }
}

extension SQLStore {
    func stagingLock(exclusive: Bool) -> StagingLock? {
        let path = Paths.join(folder, "staging.lock")
        var fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        // A read-only store: flock needs no write access, and without the file nothing can be
        // staging (no enqueue could have made it), so the lock is free.
        if fd < 0 { fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) }
        guard fd >= 0 else { return errno == ENOENT && exclusive ? StagingLock(fd: -1) : nil }
        // A hard link to another file is no lock of the store's: as if taken.
        var own = stat()
        guard fstat(fd, &own) == 0, (own.st_mode & S_IFMT) != S_IFREG || own.st_nlink == 1 else {
            close(fd)
            return nil
        }
        let operation = exclusive ? LOCK_EX | LOCK_NB : LOCK_SH
        while flock(fd, operation) != 0 {
            if errno == EINTR { continue }
            close(fd)
            return nil
        }
        return StagingLock(fd: fd)
    }

    /// The internal ids of the entries: a staged file is named `INTERNAL.body` (or `.formN`).
    func stagingOwners() throws(OutboxError) -> Set<String> {
        Set(try db.query("SELECT internal FROM entries") { $0.text(0) })
    }

    /// Whether `name` (in the bodies folder) was staged for one of `owners`; a copy in progress
    /// (`.tmp-PID`) is judged by its process instead.
    static func isStaged(_ name: String, forOneOf owners: Set<String>) -> Bool {
        !name.contains(".tmp-") && owners.contains(String(name.prefix { $0 != "." }))
    }

    package func cleanOrphans() throws(OutboxError) -> [String] {
        guard let lock = stagingLock(exclusive: true) else { return [] }
        defer { withExtendedLifetime(lock) {} }
        // A move journal still here (with the staging lock ours, no enqueue is running) is one
        // that could not be read: a staged file may be a moved file's only copy.
        if (Paths.list(moves.folder) ?? []).contains(where: { $0.hasSuffix(".json") }) { return [] }
        // Every run starts here: the staged files come first, and the rows are read only as far
        // as they can own one (parsing every entry made a run's start grow with the queue).
        // By name: a row that names a body under another spelling of this folder still owns it.
        var candidates = Set(Paths.list(staging.bodiesDir) ?? [])
        guard !candidates.isEmpty else { return [] }
        candidates.subtract(try db.query("SELECT body_file FROM entries WHERE body_file IS NOT NULL") { Paths.basename($0.text(0)) })
        // And by the entry it was staged for: a row whose body_file was damaged by hand must
        // not lose its body (perhaps a moved file's only copy) as an orphan.
        let owners = try stagingOwners()
        candidates = candidates.filter { !Self.isStaged($0, forOneOf: owners) }
        // Form fields' staged files live in the stored request.
        if !candidates.isEmpty {
            try forEachChunk(ListFilter()) { entries in candidates.subtract(entries.flatMap(\.body.files).map(Paths.basename)) }
        }
        var removed: [String] = []
        for path in candidates.sorted().map({ Paths.join(staging.bodiesDir, $0) }) where unlink(path) == 0 { removed.append(path) }
        if !removed.isEmpty { _ = csystem_fsync_dir(staging.bodiesDir) }
        return removed
    }
}
