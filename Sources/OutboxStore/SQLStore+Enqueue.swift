import CSystem
import Glibc
import OutboxModel

/// Enqueue on both stores: bodies staged outside the write lock, then the same-id rules and
/// inserts in one transaction.
extension SQLStore {
    /// Enqueues a batch in one transaction, applying the same-id rules to each entry.
    /// Bodies are staged before the transaction; on any failure every staged file is removed
    /// (or moved back) and nothing is committed.
    package func enqueue(_ batch: [NewEntry], now: Int64, committing: () -> Void) throws(OutboxError) -> [EnqueueResult] {
        // Shared with other enqueues; keeps orphan cleaning away from files not yet committed.
        let lock = stagingLock(exclusive: false)
        defer { withExtendedLifetime(lock) {} }
        let staged = try stageBatch(batch)
        Fault.point("enqueue.staged")
        return try write(batch, staged: staged, then: { nil }, now: now, committing: committing)
    }

    /// Enqueues the batches `next` gives (nil after the last) in one transaction, each written
    /// as it comes while the caller prepares the next one: the first is staged before the
    /// transaction, the later ones inside it (which holds the write lock while `next` runs).
    func enqueueStreaming(
        _ next: () throws(OutboxError) -> [NewEntry]?, now: Int64, committing: () -> Void
    ) throws(OutboxError) -> [EnqueueResult] {
        let lock = stagingLock(exclusive: false)
        defer { withExtendedLifetime(lock) {} }
        guard let first = try next() else { return [] }
        let staged = try stageBatch(first)
        Fault.point("enqueue.staged")
        return try write(first, staged: staged, then: next, now: now, committing: committing)
    }

    /// Writes `first` (staged already) and every batch `then` gives, in one transaction; on
    /// any failure every staged file is removed (or moved back) and nothing is committed.
    private func write(
        _ first: [NewEntry], staged firstStaged: StagedBatch, then next: () throws(OutboxError) -> [NewEntry]?, now: Int64,
        committing: () -> Void
    ) throws(OutboxError) -> [EnqueueResult] {
        var staged = [firstStaged]
        let results: [EnqueueResult]
        do throws(OutboxError) {
            // One writer at a time: the same-id rules read the live entry of an id, then replace it.
            results = try writing { () throws(OutboxError) -> [EnqueueResult] in
                // A body run again (after a reconnect) starts over from the first batch.
                staged = [firstStaged]
                var results: [EnqueueResult] = []
                var batch = first
                while true {
                    results += try applyBatch(batch, staged: staged[staged.count - 1], now: now)
                    staged[staged.count - 1] = staged[staged.count - 1].toFinish
                    Fault.point("enqueue.batch-written")
                    Fault.hold("enqueue.batch-written")
                    try Staging.checkStop()
                    guard let more = try next() else { break }
                    staged.append(try stageBatch(more))
                    batch = more
                }
                try journalReturns()
                try Staging.checkStop()
                committing()
                Fault.hold("enqueue.committing")
                return results
            }
        } catch {
            for batch in staged {
                for s in batch.bodies { staging.rollback(s) }
                moves.end(batch.ticket)
            }
            obsoleteFiles.removeAll()
            dropReturns()
            throw error
        }
        Fault.point("enqueue.committed")
        for batch in staged {
            staging.afterCommit(batch.bodies)
            moves.end(batch.ticket)
        }
        // Replaced bodies go; a replaced moved file goes back to its source path.
        finishForget([])
        return results
    }

    /// Stages every body of a batch outside the write lock (copies can be long). An entry
    /// whose id already holds the same body stages nothing: its bytes are kept.
    /// `repeatsAllowed`: an id may come again (follow-ups, of which the caller keeps the last).
    func stageBatch(_ batch: [NewEntry], repeatsAllowed: Bool = false) throws(OutboxError) -> StagedBatch {
        // By index throughout: an entry taken out of the array is a copy, a retain of each of its strings.
        var ids = Set<String>()
        for i in batch.indices where !repeatsAllowed && !ids.insert(batch[i].id).inserted {
            throw .invalid("the id \"\(batch[i].id)\" appears twice in one batch")
        }
        // One read transaction for every lookup (not one per entry), ended before any file
        // is copied so that a long copy does not hold the WAL back.
        // By position, only the ids stored already: an `Entry?` per line was 1.5 KB each.
        let stored = try db.read { () throws(OutboxError) -> [Int: Entry] in
            var stored: [Int: Entry] = [:]
            for position in batch.indices where !batch[position].idWasMinted {
                if let existing = try self.entry(id: batch[position].id) { stored[position] = existing }
            }
            return stored
        }
        var staged = StagedBatch()
        staged.internals = batch.map { _ in Identifiers.uuid() }
        // The files this batch will move in, written down before the first rename.
        staged.ticket = try moves.begin(
            batch.indices.compactMap { move(staging: batch[$0].prepared.body, internalID: staged.internals[$0]) })
        do throws(OutboxError) {
            for position in batch.indices {
                let existing = stored[position]
                // Only these decisions keep the stored body; every other one needs the new bytes.
                if let existing,
                    [.resume, .redeliver, .reopen].contains(try decide(existing, for: batch[position], batch[position].bodyHash))
                {
                    var kept = StagedBody(takenOver: existing)
                    kept.keepsStored = true
                    staged.bodies.append(kept)
                    continue
                }
                // A replace naming the same source path reuses the bytes already moved in.
                if let existing, let reused = Self.reusableMovedBody(existing, for: batch[position].prepared.body) {
                    staged.bodies.append(reused)
                    continue
                }
                try Staging.checkStop()
                staged.bodies.append(try staging.stage(batch[position].prepared.body, internalID: staged.internals[position]))
            }
            try staging.syncFolders(staged.bodies)
        } catch {
            for s in staged.bodies { staging.rollback(s) }
            moves.end(staged.ticket)
            throw error
        }
        return staged
    }

    /// The bytes an entry already moved or copied into the store, when a replacing body names
    /// the same source path and that path is gone: the store holds the only copy, so it is reused.
    static func reusableMovedBody(_ existing: Entry, for body: PreparedBody) -> StagedBody? {
        let identity: FileIdentity
        switch body {
        case let .file(file, .move), let .parts(file, .move, _), let .file(file, .copy), let .parts(file, .copy, _): identity = file
        default: return nil
        }
        guard existing.request.ownership != .reference, existing.request.file?.path == identity.path,
            let staged = existing.bodyFile, Paths.exists(staged), !Paths.exists(identity.path)
        else { return nil }
        var reused = StagedBody()
        reused.file = staged
        reused.totalBytes = identity.size
        reused.reusesStored = true
        return reused
    }

    /// Writes a staged batch; must run inside a transaction.
    func applyBatch(_ batch: [NewEntry], staged: StagedBatch, now: Int64) throws(OutboxError) -> [EnqueueResult] {
        var results: [EnqueueResult] = []
        let headers = try headerSettings()
        // Read once: nothing else writes them while the batch holds the write lock.
        let pausedKeys = try pausedKeys()
        if batch.contains(where: { !$0.prepared.secretVars.isEmpty }), try setting(Self.secretVarsSetting) == nil {
            try setSetting(Self.secretVarsSetting, "1")
        }
        for i in batch.indices {
            let (result, dropped) = try apply(
                batch[i], staged: staged.bodies[i], internalID: staged.internals[i], headers: headers,
                paused: pausedKeys.contains(batch[i].key), now: now)
            results.append(result)
            obsoleteFiles += dropped.compactMap { $0 }
        }
        return results
    }

    func hasPendingOutcome(_ id: String, generation: Int64) throws(OutboxError) -> Bool {
        try db.queryOne(
            "SELECT 1 FROM outcomes WHERE entry_id = ? AND generation = ? AND acknowledged = 0",
            [.text(id), .int(generation)]
        ) { _ in true } ?? false
    }

    func decide(_ e: Entry, _ newBodyHash: String) throws(OutboxError) -> SameIdDecision {
        SameIdRule.decide(
            existing: ExistingEntry(
                state: e.state, bodyHash: e.bodyHash,
                outcomeAcknowledged: !(try hasPendingOutcome(e.id, generation: e.generation))),
            newBodyHash: newBodyHash)
    }

    /// The decision for `new` itself: a `then` follow-up naming its own entry ("poll again")
    /// asks for a new send of the same bytes, not for the outcome it answers, whose delivery
    /// is still to come; so the new entry waits for that delivery, as a changed body would.
    func decide(_ e: Entry, for new: NewEntry, _ newBodyHash: String) throws(OutboxError) -> SameIdDecision {
        let decision = try decide(e, newBodyHash)
        return decision == .redeliver && new.resendsBeforeDelivery ? .replaceAfterDelivery : decision
    }

    /// Headers as stored: the `headers update` patch so far applies to entries enqueued after it.
    func patch(_ stored: inout StoredRequest, _ settings: HeaderSettings, id: String) throws(OutboxError) {
        guard let json = settings.patch else { return }
        stored.apply(headerPatch: HeaderRules.from(json: json))
        try Self.checkPatchedHead(method: stored.method, url: stored.url, headers: stored.headers, id: id)
    }

    /// A request that a `headers update` patch makes too large to send is refused when the
    /// patch meets it (enqueue or update), not failed at every attempt until it expires.
    static func checkPatchedHead(method: String, url: String?, headers: [(String, String)], id: String) throws(OutboxError) {
        do { try HeaderRules.checkHead(method: method, url: url, headers: headers) } catch {
            throw .invalid("entry \(id): with the headers update patch, \(error.field): \(error.message)")
        }
    }

    /// The move of a user's file into the store that staging `body` makes, if any.
    func move(staging body: PreparedBody, internalID: String) -> MoveJournal.Move? {
        switch body {
        case let .file(identity, .move), let .parts(identity, .move, _):
            return MoveJournal.Move(staged: staging.path(internalID, "body"), source: identity.path, identity: identity)
        default:
            return nil
        }
    }

    /// The body of a new entry that found its id holding the same bytes when the batch was
    /// staged (so nothing was staged), and found it forgotten when written: a hook or
    /// follow-up enqueueing its own id as its outcome is acknowledged. The bytes pass to the
    /// new entry (kept from removal); gone meanwhile (a cancel in between), they are staged now.
    func takeOver(_ existing: Entry?, _ staged: StagedBody, body: PreparedBody, internalID: String) throws(OutboxError) -> StagedBody {
        let held = existing.map { StagedBody(takenOver: $0) } ?? staged
        let files = [held.file].compactMap { $0 } + held.form.compactMap(\.stagedFile)
        guard files.allSatisfy(Paths.exists) else {
            // Written down before the rename, as a batch's moves are: a crash before the
            // commit puts the user's file back.
            let ticket = try moves.begin([move(staging: body, internalID: internalID)].compactMap { $0 })
            do throws(OutboxError) {
                let fresh = try staging.stage(body, internalID: internalID)
                stagedInTransaction.append((fresh, ticket))
                return fresh
            } catch {
                moves.end(ticket)
                throw error
            }
        }
        takenOverFiles.formUnion(files)
        return held
    }

    /// One entry's same-id decision and write; returns staged files made obsolete.
    func apply(
        _ new: NewEntry, staged: StagedBody, internalID: String, headers: HeaderSettings, paused: Bool,
        now: Int64
    ) throws(OutboxError) -> (EnqueueResult, [String?]) {
        let existing = new.idWasMinted ? nil : try entry(id: new.id)
        // Hashed once: the canonical form of a body is not cheap to build.
        let bodyHash = new.bodyHash
        let decision = try existing.map { e throws(OutboxError) in try decide(e, for: new, bodyHash) } ?? .create
        let p = new.prepared
        let expiresAt = new.expiresAt ?? Identifiers.expiry(now: now, lifetimeMs: p.expiresInMs)
        var staged = staged
        if decision == .create, staged.keepsStored { staged = try takeOver(existing, staged, body: p.body, internalID: internalID) }
        if staged.reusesStored, let file = staged.file { takenOverFiles.insert(file) }
        let request = StoredRequest(prepared: p, form: staged.form).text
        let varsText = new.varsText
        switch decision {
        case .rejectRunning:
            var error = OutboxError.running("entry \(new.id) is being sent now and the new body differs; try again when it settles")
            error.runningEntryID = new.id
            throw error
        case .create:
            // A settled row whose outcome was acknowledged counts as forgotten: drop it first.
            let old = try existing.map { e throws(OutboxError) in try forget(e, returnMovedFile: false) } ?? []
            try insert(
                new, vars: varsText, bodyHash: bodyHash, staged: staged, internalID: internalID, request: request,
                headers: headers, paused: paused, expiresAt: expiresAt, generation: 1, now: now)
            return (EnqueueResult(id: new.id, decision: decision), old)
        case .resume, .redeliver, .reopen:
            guard let e = existing else { return (EnqueueResult(id: new.id, decision: decision), []) }
            // Same body: new headers, vars and expiry; bytes and accepted parts are kept.
            var stored = e.request
            stored.headers = p.headers
            stored.secretHeaders = p.secretHeaders
            stored.secretVars = p.secretVars
            try patch(&stored, headers, id: new.id)
            let newState = decision == .reopen ? "queued" : e.state.rawValue
            // The entry keeps its Idempotency-Key for life (retries and replays share it) unless
            // a header gives one explicitly.
            let explicitKey = p.idempotencyKeyIsExplicit ? p.idempotencyKey : nil
            let headerGeneration = headers.generation
            // A new hold shows as the next attempt, as on a fresh entry (the later of the two).
            var next = e.nextAttemptAt
            if decision == .reopen {
                next = new.notBefore ?? now
            } else if let notBefore = new.notBefore, e.state == .queued {
                next = max(e.nextAttemptAt ?? 0, notBefore)
            }
            // The hold an earlier enqueue gave stays: a new expiry before its end would let the
            // entry expire unsent, as a hold past the expiry of a new entry would.
            if decision != .reopen, e.state == .queued, let hold = new.notBefore ?? e.notBefore,
                expiresAt - hold < NewEntry.shortestWindowMs
            {
                throw .invalid(
                    "entry \(new.id) is held until \(Units.rfc3339(ms: hold)) and would expire (\(Units.rfc3339(ms: expiresAt))) before it may be sent or within a second of it: give a later expiry (--expires-at, expires_in)"
                )
            }
            try db.run(
                """
                UPDATE entries SET vars = ?, request = ?, expires_at = ?, idempotency_key = COALESCE(?, idempotency_key, ?),
                  header_generation = ?,
                  state = ?, reason = CASE WHEN CAST(? AS TEXT) = 'queued' AND state != 'queued' THEN NULL ELSE reason END,
                  attempts = CASE WHEN CAST(? AS INTEGER) = 1 THEN 0 ELSE attempts END,
                  next_attempt_at = ?,
                  not_before = COALESCE(?, not_before), updated_at = ?
                WHERE id = ?
                """,
                [
                    .text(varsText), .text(stored.text), .int(expiresAt), .optional(explicitKey),
                    .optional(p.idempotencyKey), .int(headerGeneration), .text(newState), .text(newState),
                    .bool(decision == .reopen), .optional(next), .optional(new.notBefore), .int(now), .text(new.id),
                ])
            return (EnqueueResult(id: new.id, decision: decision), [])
        case .replace, .newGeneration, .replaceAfterDelivery:
            guard let e = existing else { return (EnqueueResult(id: new.id, decision: decision), []) }
            let generation = decision == .replace && !e.state.isSettled ? e.generation : e.generation + 1
            // A cancelled generation's outcome is still delivered (its hook may clean up):
            // outcomes are acknowledged per generation, never by a later enqueue.
            try db.run("DELETE FROM entries WHERE seq = ?", [.int(e.seq)])
            try deleteParts(of: e)
            try insert(
                new, vars: varsText, bodyHash: bodyHash, staged: staged, internalID: internalID, request: request,
                headers: headers, paused: paused, expiresAt: expiresAt, generation: generation, now: now,
                // A replace of an entry that still waits for its old outcome's delivery waits too.
                waits: decision == .replaceAfterDelivery || e.waitsForDelivery, createdAt: e.createdAt)
            // Form files are staged per entry and never reused, so the old ones always go.
            var old: [String?] = e.request.form.map(\.stagedFile)
            if let file = e.bodyFile, file != staged.file {
                if e.request.ownership == .move, e.state != .completed, let source = e.request.file?.path,
                    file.hasPrefix(staging.bodiesDir + "/")
                {
                    // Like a cancel, a replace never destroys the user's only copy.
                    returns.append((file, source, e.request.file))
                } else {
                    old.append(file)
                }
            }
            return (EnqueueResult(id: new.id, decision: decision), old)
        }
    }

    /// Writes a new entry's row; `paused` (its key is paused now) is the row's mark, which
    /// reads of due entries seek past in `entries_queued`.
    func insert(
        _ new: NewEntry, vars: String, bodyHash: String, staged: StagedBody, internalID: String, request: String,
        headers: HeaderSettings, paused: Bool, expiresAt: Int64, generation: Int64, now: Int64, waits: Bool = false,
        createdAt: Int64? = nil
    ) throws(OutboxError) {
        let p = new.prepared
        let headerGeneration = headers.generation
        // `headers update` patches rank above every other header source, also for entries enqueued after it.
        var request = request
        if headers.patch != nil {
            var stored = try StoredRequest(json: try Self.storedJSON(request, what: "stored request"))
            try patch(&stored, headers, id: new.id)
            request = stored.text
        }
        let extra = entryColumnsOfThisStore(staged)
        let sql = EntryInsert.sql(extraColumns: extra.map(\.column))
        let values: [SQLValue] =
            [
                .text(new.id), .text(internalID), .text(new.key), .text(vars), .int(generation), .text(request),
                staged.inline.map { .blob($0) } ?? .null, .optional(staged.file), .text(bodyHash), .int(staged.totalBytes),
                .optional(p.idempotencyKey), .optional(new.account), .optional(p.scope), .optional(new.parent),
                .int(headerGeneration), .int(createdAt ?? now), .int(now), .int(expiresAt), .optional(new.notBefore),
                .optional(new.notBefore), .bool(waits), .bool(paused),
            ] + extra.map(\.value)
        guard case let .parts(_, _, parts) = p.body else {
            // No RETURNING unless the parts need the seq: SQLite gathers returned rows in a temporary table.
            try db.run(sql, values)
            return
        }
        let seq = try db.queryOne(sql + " RETURNING seq", values) { $0.int(0) } ?? 0
        for (i, part) in parts.enumerated() {
            try db.run(
                "INSERT INTO parts (entry_seq, idx, start, \"end\", url, headers) VALUES (?, ?, ?, ?, ?, ?)",
                [
                    .int(seq), .int(i), .int(part.range.start), .int(part.range.end), .text(part.url),
                    .text(HeaderRules.json(part.headers.map { ($0.name, $0.value) }).serialized()),
                ])
        }
    }
}

/// The bodies of an enqueue batch, staged before its transaction.
struct StagedBatch {
    var bodies: [StagedBody] = []
    var internals: [String] = []
    /// The journal of the files this batch moves in, until its commit or rollback.
    var ticket: MoveJournal.Ticket?

    /// What a written batch still needs at its commit or rollback: the bodies that created,
    /// moved in or will remove a file (a batch of inline or referenced bodies keeps none, so
    /// the memory of a long `--from` file does not grow with its lines' bodies).
    var toFinish: StagedBatch {
        var kept = StagedBatch(ticket: ticket)
        kept.bodies = bodies.filter { !$0.created.isEmpty || !$0.movedIn.isEmpty || !$0.removeAfterCommit.isEmpty }
        return kept
    }
}

/// The `headers update` state every new row records: read once per batch, as nothing
/// else writes it while the batch holds the write lock.
struct HeaderSettings {
    var generation: Int64
    var patch: JSON?
}

/// The INSERT of a new entry row, made once for each set of columns a store adds: a text
/// made at each insert would be found in the statement cache only by hashing all of it.
enum EntryInsert {
    private static let plain = text([])
    private static let withBodyHost = text(["body_host"])

    static func sql(extraColumns: [String]) -> String {
        switch extraColumns {
        case []: plain
        case ["body_host"]: withBodyHost
        default: text(extraColumns)
        }
    }

    private static func text(_ extra: [String]) -> String {
        """
        INSERT INTO entries (id, internal, key, vars, state, generation, request, body, body_file, body_hash, total_bytes,
          idempotency_key, account, scope, parent, header_generation, created_at, updated_at, expires_at, not_before,
          next_attempt_at, waits_for_delivery, paused\(extra.map { ", " + $0 }.joined()))
        VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?\(String(repeating: ", ?", count: extra.count)))
        """
    }
}
