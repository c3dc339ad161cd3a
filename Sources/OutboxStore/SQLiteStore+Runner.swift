import Glibc
import OutboxModel

extension SQLiteStore {
    /// Puts entries left `running` by a runner that is gone back in the queue, keeping
    /// accepted parts. The SQLite store has one runner at a time (the lock file), so every
    /// running entry is stale when a runner starts (it writes no lease; stores from before
    /// may hold one); the PostgreSQL store compares lease ends instead.
    package func requeueAbandoned(lease: Lease, now: Int64) throws(OutboxError) -> Int {
        try db.transaction { () throws(OutboxError) -> Int in
            try db.run(Self.requeueAbandonedSQL, [.int(now), .text(lease.owner)])
        }
    }

    /// Reads `entries_running`: a run's start costs the same at 100 or 500,000 queued entries.
    static let requeueAbandonedSQL = """
        UPDATE entries SET state = 'queued', lease_owner = NULL, lease_until = NULL, updated_at = ?
        WHERE state = 'running' AND (lease_owner IS NULL OR lease_owner != ?)
        """

    /// Entries held for `reasons` are due now (see `Store.releaseHolds`).
    package func releaseHolds(now: Int64, reasons: [HoldReason]) throws(OutboxError) {
        let held = JSON.array(reasons.map { .string($0.rawValue) }).serialized()
        try db.run(Self.releaseHoldsSQL, [.int(now), .int(now), .text(held)])
    }

    /// Reads `entries_held`, which has only the queued entries with a reason.
    static let releaseHoldsSQL = """
        UPDATE entries SET next_attempt_at = ?, reason = NULL, updated_at = ?
        WHERE state = 'queued' AND reason IN (SELECT value FROM json_each(?))
        """

    package func releaseDeliveryBackoffs(now: Int64) throws(OutboxError) {
        try db.run("UPDATE outcomes SET next_delivery_at = ? WHERE acknowledged = 0 AND next_delivery_at > ?", [.int(now), .int(now)])
    }

    /// Queued entries that may start now, in enqueue order, honouring pauses, holds and scopes.
    package func dueEntries(
        now: Int64, limit: Int, excluding: Set<String>, horizon: Int64?, fromSeq: Int64
    ) throws(OutboxError) -> [Entry] {
        if try setting(Self.queuePausedSetting) == "1" { return [] }
        // Paused keys and `excluding` (entries the runner holds, or whose changes are not
        // committed yet) are filtered here, so the LIMIT reads no more rows than it returns:
        // every row read is a JSON parse, and the runner claims after each completion. A
        // paused key's entries are not walked at all: `paused = 0` seeks past them in
        // `entries_queued`, whose order is seq within it.
        let excluded = JSON.array(excluding.map { .string($0) }).serialized()
        return try db.query(
            Self.dueEntriesSQL,
            [.int(fromSeq), .text(excluded), .int(now), .int(now), .int(horizon ?? .max), .int(horizon ?? .max), .int(limit)],
            entryFromRow)
    }

    /// Made once: a text made per call would be a new string each time the runner reads ahead.
    static let dueEntriesSQL = """
        SELECT \(entryColumns) FROM entries e
        WHERE state = 'queued' AND paused = 0 AND seq >= ? AND waits_for_delivery = 0
          AND id NOT IN (SELECT value FROM json_each(?))
          AND (next_attempt_at IS NULL OR next_attempt_at <= ?)
          AND (not_before IS NULL OR not_before <= ?)
          AND (attempts = 0 OR next_attempt_at IS NULL OR next_attempt_at <= ?)
          AND (not_before IS NULL OR not_before <= ? OR not_before <= created_at)
          AND (scope IS NULL OR NOT EXISTS (
            SELECT 1 FROM entries o WHERE o.scope = e.scope AND o.seq < e.seq
              AND o.state IN ('queued', 'running', 'awaiting-auth')))
        ORDER BY seq LIMIT ?
        """

    /// The generation of each of these entries that is still `running` (absent: cancelled,
    /// replaced or settled by someone else).
    package func runningGenerations(seqs: [Int64]) throws(OutboxError) -> [Int64: Int64] {
        guard !seqs.isEmpty else { return [:] }
        let list = JSON.array(seqs.map { .int64($0) }).serialized()
        let rows = try db.query(
            """
            SELECT seq, generation FROM entries WHERE seq IN (SELECT value FROM json_each(?)) AND state = 'running'
            """, [.text(list)]
        ) { ($0.int(0), $0.int(1)) }
        return Dictionary(rows, uniquingKeysWith: { first, _ in first })
    }

    /// When something becomes due (see `Store.dueTimes`).
    package func dueTimes(deliverableKeys: Set<String>) throws(OutboxError) -> DueTimes {
        var any: [Int64] = []
        var fresh: [Int64] = []
        if try setting(Self.queuePausedSetting) != "1" {
            let held = JSON.array(HoldReason.allCases.map { .string($0.rawValue) }).serialized()
            // An entry behind an unsettled one of its scope is not due: what is due is the one
            // ahead. The earliest times are taken here, not by holding a row for each entry.
            let row = try db.queryOne(
                """
                SELECT MIN(due), MIN(CASE WHEN attempts = 0 THEN due END) FROM (
                  SELECT MAX(COALESCE(next_attempt_at, 0), COALESCE(not_before, 0)) AS due, attempts FROM entries e
                  WHERE state = 'queued' AND paused = 0 AND waits_for_delivery = 0
                    AND (reason IS NULL OR reason NOT IN (SELECT value FROM json_each(?)))
                    AND (scope IS NULL OR NOT EXISTS (
                      SELECT 1 FROM entries o WHERE o.scope = e.scope AND o.seq < e.seq
                        AND o.state IN ('queued', 'running', 'awaiting-auth'))))
                """, [.text(held)]
            ) { ($0.isNull(0) ? nil : $0.int(0), $0.isNull(1) ? nil : $0.int(1)) }
            if let first = row?.0 { any.append(first) }
            if let first = row?.1 { fresh.append(first) }
        }
        // Outcomes of one id go in order: only the oldest unacknowledged one of each can be due.
        let outcomes = try db.query(
            """
            SELECT key, COALESCE(next_delivery_at, 0), deliveries FROM outcomes o WHERE acknowledged = 0
              AND seq = (SELECT MIN(seq) FROM outcomes p WHERE p.entry_id = o.entry_id AND p.acknowledged = 0)
            """
        ) {
            ($0.text(0), $0.int(1), $0.int(2))
        }
        for (key, due, deliveries) in outcomes where deliverableKeys.contains(key) {
            any.append(due)
            if deliveries == 0 { fresh.append(due) }
        }
        return DueTimes(any: any.min(), fresh: fresh.min())
    }

    /// Applies runner changes in one transaction. Follow-ups are staged first; files of
    /// forgotten entries are removed after the commit.
    /// The lease is not compared: one runner holds an SQLite store at a time (the lock file),
    /// and each change is fenced by the entry's state and generation instead.
    @discardableResult
    package func apply(_ batch: [RunnerChange], by lease: Lease?, now: Int64) throws(OutboxError) -> AppliedChanges {
        // No other runner can take an entry from under a settle here: a settle that forgets its
        // entry is fenced out only by a cancel or a same-id replace, and then the attempt of
        // the request it sent belongs to no row either, so it needs no record.
        let changes = batch.sparingForgottenAttempts()
        return try applyInFrame(
            changes, now: now,
            transaction: { _, body throws(OutboxError) in try db.transaction(body) },
            settle: { [self] s throws(OutboxError) in try settle(s, now: now) },
            settleUnclaimed: { [self] s throws(OutboxError) in try settle(s, now: now).files },
            other: { [self] change throws(OutboxError) in try apply(change, now: now) })
    }

    private func apply(_ change: RunnerChange, now: Int64) throws(OutboxError) -> [String] {
        switch change {
        case let .markRunning(seqs, _):
            // No lease is written: the runner lock makes this runner the only one, and a row
            // that keeps its size is rewritten in place, where one that grows (a lease owner
            // and time) makes SQLite rebalance its full page with the next ones.
            for seq in seqs {
                try db.run(
                    "UPDATE entries SET state = 'running', updated_at = ? WHERE seq = ? AND state = 'queued'", [.int(now), .int(seq)])
            }
        case let .attempt(id, generation, at, payload, requestID):
            // Fenced like the row's update below: an attempt whose entry another process
            // cancelled meanwhile must not outlive it (a new entry of that id would show it).
            try db.run(
                """
                INSERT INTO attempts (entry_id, generation, at, payload)
                SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM entries WHERE id = ? AND generation = ?)
                """, [.text(id), .int(generation), .int(at), .text(payload.serialized()), .text(id), .int(generation)])
            try db.run(
                """
                DELETE FROM attempts WHERE entry_id = ? AND seq NOT IN (
                  SELECT seq FROM attempts WHERE entry_id = ? ORDER BY seq DESC LIMIT 20)
                """, [.text(id), .text(id)])
            try db.run(
                "UPDATE entries SET attempts = attempts + 1, last_request_id = ?, updated_at = ? WHERE id = ? AND generation = ?",
                [.text(requestID), .int(now), .text(id), .int(generation)])
        case let .reschedule(id, next, reason):
            try db.run(
                """
                UPDATE entries SET state = 'queued', next_attempt_at = ?, reason = ?, lease_owner = NULL, updated_at = ?
                WHERE id = ? AND state = 'running'
                """, [.int(next), .optional(reason), .int(now), .text(id)])
        case let .hold(id, until, reason):
            try db.run(
                "UPDATE entries SET next_attempt_at = ?, reason = ?, updated_at = ? WHERE id = ? AND state = 'queued'",
                [.int(until), .text(reason.rawValue), .int(now), .text(id)])
        case let .park(id):
            try db.run(
                "UPDATE entries SET state = 'awaiting-auth', reason = 'auth', next_attempt_at = NULL, lease_owner = NULL, updated_at = ? WHERE id = ? AND state = 'running'",
                [.int(now), .text(id)])
        case let .requeue(id):
            try db.run(
                "UPDATE entries SET state = 'queued', lease_owner = NULL, updated_at = ? WHERE id = ? AND state = 'running'",
                [.int(now), .text(id)])
        case let .progress(id, sent):
            try db.run("UPDATE entries SET bytes_sent = ? WHERE id = ?", [.int(sent), .text(id)])
        case let .partAccepted(seq, index, status, headers):
            try db.run(
                "UPDATE parts SET accepted = 1, status = ?, response_headers = ?, attempts = attempts + 1 WHERE entry_seq = ? AND idx = ?",
                [.int(status), .text(headers.serialized()), .int(seq), .int(index)])
        case let .partRetry(seq, index, next, status):
            try db.run(
                "UPDATE parts SET attempts = attempts + 1, next_attempt_at = ?, status = ? WHERE entry_seq = ? AND idx = ?",
                [.int(next), .optional(status.map(Int64.init)), .int(seq), .int(index)])
        case let .partRefused(seq, index, status):
            try db.run(
                "UPDATE parts SET attempts = attempts + 1, status = ? WHERE entry_seq = ? AND idx = ? AND accepted = 0",
                [.optional(status.map(Int64.init)), .int(seq), .int(index)])
        case let .settle(s):
            return try settle(s, now: now).files
        case .cancelScope:
            return []  // applyInFrame settles those, to report the entries
        case let .drop(id, reason):
            guard let e = try entry(id: id) else { return [] }
            try db.run(
                "INSERT INTO outcomes (entry_id, key, generation, outcome, payload, acknowledged, reason, created_at) VALUES (?, ?, ?, 'error', '{}', 1, ?, ?)",
                [.text(e.id), .text(e.key), .int(e.generation), .text(reason), .int(now)])
            return try forget(e, returnMovedFile: true)
        case let .count(increments):
            try addCounters(increments)
        }
        return []
    }

    /// Settles an entry and journals its outcome. With no hook to run, the outcome is
    /// acknowledged now and a completed or cancelled entry is forgotten at once.
    /// Returns the files to remove after the commit, and whether the settle applied.
    private func settle(_ s: Settlement, now: Int64) throws(OutboxError) -> (files: [String], applied: Bool) {
        // The statements below match seq and generation, so a row replaced or removed since
        // the snapshot (same-id enqueue, cancel) is left alone.
        guard let e = try settledEntry(s) else { return ([], false) }
        if s.forgetsEntry {
            // Nothing will read the outcome: the entry is forgotten at once, and an outcome
            // acknowledged as it settles would be deleted as it is written, so none is.
            guard try db.run("DELETE FROM entries WHERE seq = ? AND generation = ?", [.int(e.seq), .int(s.generation)]) == 1 else {
                return ([], false)
            }
            var settled = e
            settled.state = s.state
            return (try forget(settled, returnMovedFile: s.state == .cancelled, rowDeleted: true), true)
        }
        let changed = try db.run(
            """
            UPDATE entries SET state = ?, reason = ?, lease_owner = NULL, next_attempt_at = NULL, updated_at = ?
            WHERE seq = ? AND generation = ?
            """, [.text(s.state.rawValue), .optional(s.reason), .int(now), .int(e.seq), .int(s.generation)])
        guard changed == 1 else { return ([], false) }
        try journalOutcome(of: e, s, now: now)
        return ([], true)
    }

    package func checkpoint() { db.checkpoint() }

    package func freeBytes() -> Int64? {
        #if DEBUG
        // Tests give a full disk without mounting one.
        if let text = getenv("OUTBOX_TEST_FREE_BYTES"), let given = Int64(String(cString: text)) { return given }
        #endif
        var fs = statvfs()
        guard statvfs(folder, &fs) == 0 else { return nil }
        // Blocks kept for root are root's to write.
        return Int64(geteuid() == 0 ? fs.f_bfree : fs.f_bavail) * Int64(fs.f_frsize)
    }
}
