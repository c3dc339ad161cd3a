import OutboxModel

extension PostgresStore {
    /// The database time for a time of this host's clock.
    func databaseTime(_ now: Int64) -> Int64 { now + clockOffset }

    package func releaseHolds(now: Int64, reasons: [HoldReason]) throws(OutboxError) {
        let held = JSON.array(reasons.map { .string($0.rawValue) }).serialized()
        try db.quietTransaction { () throws(OutboxError) in
            let released = try db.run(
                """
                UPDATE entries SET next_attempt_at = ?, reason = NULL, updated_at = ?
                WHERE state = 'queued' AND reason IN (SELECT jsonb_array_elements_text(?::jsonb))
                """, [.int(now), .int(now), .text(held)])
            if released > 0 { try wakeRunners() }
        }
    }

    /// Outcomes another runner is delivering now (their delivery lease runs) are left alone.
    package func releaseDeliveryBackoffs(now: Int64) throws(OutboxError) {
        try db.quietTransaction { () throws(OutboxError) in
            let released = try db.run(
                """
                UPDATE outcomes SET next_delivery_at = ?
                WHERE acknowledged = 0 AND next_delivery_at > ? AND COALESCE(delivery_until, 0) < ?
                """, [.int(now), .int(now), .int(databaseTime(now))])
            if released > 0 { try wakeRunners() }
        }
    }

    /// Entries whose body is on this host's disk, or anywhere when the staging is shared.
    var onThisHost: String { "(body_host IS NULL OR body_host = ? OR ?::int = 1)" }
    var onThisHostValues: [SQLValue] { [.text(host), .bool(sharedStaging)] }

    /// Queued entries that may start now, in enqueue order, honouring pauses, holds, scopes
    /// and where file bodies are.
    package func dueEntries(
        now: Int64, limit: Int, excluding: Set<String>, horizon: Int64?, fromSeq: Int64
    ) throws(OutboxError) -> [Entry] {
        let excluded = JSON.array(excluding.map { .string($0) }).serialized()
        return try db.query(
            """
            SELECT \(Self.entryColumns) FROM entries e
            WHERE state = 'queued' AND paused = 0 AND seq >= ? AND waits_for_delivery = 0 AND NOT \(queuePaused)
              AND id NOT IN (SELECT jsonb_array_elements_text(?::jsonb))
              AND (next_attempt_at IS NULL OR next_attempt_at <= ?)
              AND (not_before IS NULL OR not_before <= ?)
              AND (attempts = 0 OR next_attempt_at IS NULL OR next_attempt_at <= ?)
              AND (not_before IS NULL OR not_before <= ? OR not_before <= created_at)
              AND \(onThisHost)
              AND (scope IS NULL OR NOT EXISTS (
                SELECT 1 FROM entries o WHERE o.scope = e.scope AND o.seq < e.seq
                  AND o.state IN ('queued', 'running', 'awaiting-auth')))
            ORDER BY seq LIMIT ?
            """,
            [.int(fromSeq), .text(excluded), .int(now), .int(now), .int(horizon ?? .max), .int(horizon ?? .max)] + onThisHostValues
                + [.int(limit)], entryFromRow)
    }

    package func runningGenerations(seqs: [Int64]) throws(OutboxError) -> [Int64: Int64] {
        guard !seqs.isEmpty else { return [:] }
        let list = JSON.array(seqs.map { .int64($0) }).serialized()
        let rows = try db.query(
            """
            SELECT seq, generation FROM entries
            WHERE seq IN (SELECT jsonb_array_elements_text(?::jsonb)::bigint) AND state = 'running'
            """, [.text(list)]
        ) { ($0.int(0), $0.int(1)) }
        return Dictionary(rows, uniquingKeysWith: { first, _ in first })
    }

    /// Whether the whole queue is paused, as a condition of the statement that reads it.
    private var queuePaused: String {
        "EXISTS (SELECT 1 FROM settings WHERE name = '\(SQLiteStore.queuePausedSetting)' AND value = '1')"
    }

    /// The earliest times, reduced by the server: a drain asks this whenever its runner is
    /// idle, and the queue may hold many thousands of entries.
    package func dueTimes(deliverableKeys: Set<String>) throws(OutboxError) -> DueTimes {
        let held = JSON.array(HoldReason.allCases.map { .string($0.rawValue) }).serialized()
        let keys = JSON.array(deliverableKeys.sorted().map { .string($0) }).serialized()
        let row = try db.queryOne(
            """
            WITH due AS (
                SELECT GREATEST(COALESCE(next_attempt_at, 0), COALESCE(not_before, 0)) AS at, attempts = 0 AS fresh FROM entries e
                WHERE state = 'queued' AND paused = 0 AND waits_for_delivery = 0 AND \(onThisHost) AND NOT \(queuePaused)
                  AND (reason IS NULL OR reason NOT IN (SELECT jsonb_array_elements_text(?::jsonb)))
                  AND (scope IS NULL OR NOT EXISTS (
                    SELECT 1 FROM entries o WHERE o.scope = e.scope AND o.seq < e.seq
                      AND o.state IN ('queued', 'running', 'awaiting-auth')))
                UNION ALL
                SELECT COALESCE(next_delivery_at, 0), deliveries = 0 FROM outcomes o
                WHERE acknowledged = 0 AND key IN (SELECT jsonb_array_elements_text(?::jsonb))
                  AND seq = (SELECT MIN(seq) FROM outcomes p WHERE p.entry_id = o.entry_id AND p.acknowledged = 0))
            SELECT MIN(at), MIN(at) FILTER (WHERE fresh) FROM due
            """, onThisHostValues + [.text(held), .text(keys)]
        ) { ($0.optionalInt(0), $0.optionalInt(1)) }
        return DueTimes(any: row?.0, fresh: row?.1)
    }

    /// The condition that makes a runner's change apply only while its claim holds: same
    /// owner and the token of this object's claim (nothing without a lease). An entry it
    /// never claimed (expired or its file gone while queued) changes only while unclaimed.
    func fence(_ id: String, _ lease: Lease?) -> (sql: String, values: [SQLValue]) {
        guard let lease else { return ("", []) }
        if let token = claimTokens[id] {
            return (" AND lease_owner = ? AND lease_token = ?", [.text(lease.owner), .text(token)])
        }
        return (" AND (lease_owner = ? OR (state = 'queued' AND lease_owner IS NULL))", [.text(lease.owner)])
    }

    /// Applies a runner's changes in one transaction; with a lease, each change to an entry
    /// applies only while this runner's claim on it holds (fencing).
    @discardableResult
    package func apply(_ changes: [RunnerChange], by lease: Lease?, now: Int64) throws(OutboxError) -> AppliedChanges {
        // The claims and settles of a transaction that does not commit did not happen.
        let tokensBefore = claimTokens
        var forgotten: Set<Int64>?
        do throws(OutboxError) {
            return try applyInFrame(
                changes, now: now,
                transaction: { enqueues, body throws(OutboxError) in
                    // Follow-ups are enqueued under the same-id rules (one writer at a time); the
                    // rest is fenced by generations and this runner's lease tokens.
                    func run() throws(OutboxError) {
                        claimTokens = tokensBefore
                        forgotten = nil
                        try body()
                    }
                    if enqueues { try db.transaction(lock: lockKey, run) } else { try db.quietTransaction(run) }
                },
                settle: { [self] s throws(OutboxError) in
                    guard Self.forgetsAtOnce(s) else { return try settle(s, lease: lease, now: now) }
                    // The turn's entries settled without a hook go in one statement, at the first of them.
                    if forgotten == nil { forgotten = try forgetSettled(changes, lease: lease) }
                    return settledForgotten(s, &forgotten)
                },
                // Entries behind a failed one in its scope are nobody's claim: not fenced.
                settleUnclaimed: { [self] s throws(OutboxError) in try settle(s, lease: nil, now: now).files },
                other: { [self] change throws(OutboxError) in try apply(change, lease: lease, now: now) })
        } catch {
            claimTokens = tokensBefore
            throw error
        }
    }

    /// Claims: rows another runner is claiming are skipped, not waited for; each claim
    /// writes a fresh token and the lease's end by the database clock.
    private func claim(_ seqs: [Int64], _ lease: Lease, now: Int64) throws(OutboxError) {
        let token = Identifiers.uuid()
        let list = JSON.array(seqs.map { .int64($0) }).serialized()
        let claimed = try db.query(
            """
            UPDATE entries SET state = 'running', lease_owner = ?, lease_token = ?, lease_until = ?, updated_at = ?
            WHERE seq IN (
              SELECT seq FROM entries WHERE seq IN (SELECT jsonb_array_elements_text(?::jsonb)::bigint)
                AND state = 'queued' AND \(onThisHost)
              FOR UPDATE SKIP LOCKED)
            RETURNING id
            """,
            [.text(lease.owner), .text(token), .int(databaseTime(now) + lease.durationMs), .int(now), .text(list)] + onThisHostValues
        ) { $0.text(0) }
        for id in claimed {
            claimTokens[id] = token
            lostClaims.remove(id)
        }
    }

    /// The id of an entry by seq, for changes that name an entry by seq.
    private func entryID(seq: Int64) throws(OutboxError) -> String? {
        try db.queryOne("SELECT id FROM entries WHERE seq = ?", [.int(seq)]) { $0.text(0) }
    }

    private func apply(_ change: RunnerChange, lease: Lease?, now: Int64) throws(OutboxError) -> [String] {
        switch change {
        case let .markRunning(seqs, claimLease):
            try claim(seqs, claimLease, now: now)
        case let .attempt(id, generation, at, payload, requestID):
            let f = fence(id, lease)
            // One round trip; the trim does not see the new row, so it keeps 19 older ones.
            try db.run(
                """
                WITH u AS (
                    UPDATE entries SET attempts = attempts + 1, last_request_id = ?, updated_at = ?
                    WHERE id = ? AND generation = ?\(f.sql) RETURNING id),
                  i AS (INSERT INTO attempts (entry_id, generation, at, payload) SELECT id, ?::bigint, ?::bigint, ?::text FROM u)
                DELETE FROM attempts WHERE entry_id IN (SELECT id FROM u) AND seq NOT IN (
                  SELECT seq FROM attempts WHERE entry_id = ? ORDER BY seq DESC LIMIT 19)
                """,
                [.text(requestID), .int(now), .text(id), .int(generation)] + f.values
                    + [.int(generation), .int(at), .text(payload.serialized()), .text(id)])
        case let .reschedule(id, next, reason):
            let f = fence(id, lease)
            try db.run(
                """
                UPDATE entries SET state = 'queued', next_attempt_at = ?, reason = ?, lease_owner = NULL, lease_token = NULL,
                  lease_until = NULL, updated_at = ?
                WHERE id = ? AND state = 'running'\(f.sql)
                """, [.int(next), .optional(reason), .int(now), .text(id)] + f.values)
            claimTokens[id] = nil
        case let .hold(id, until, reason):
            try db.run(
                "UPDATE entries SET next_attempt_at = ?, reason = ?, updated_at = ? WHERE id = ? AND state = 'queued'",
                [.int(until), .text(reason.rawValue), .int(now), .text(id)])
        case let .park(id):
            let f = fence(id, lease)
            try db.run(
                """
                UPDATE entries SET state = 'awaiting-auth', reason = 'auth', next_attempt_at = NULL, lease_owner = NULL, lease_token = NULL,
                  lease_until = NULL, updated_at = ?
                WHERE id = ? AND state = 'running'\(f.sql)
                """, [.int(now), .text(id)] + f.values)
            claimTokens[id] = nil
        case let .requeue(id):
            let f = fence(id, lease)
            try db.run(
                """
                UPDATE entries SET state = 'queued', lease_owner = NULL, lease_token = NULL, lease_until = NULL, updated_at = ?
                WHERE id = ? AND state = 'running'\(f.sql)
                """, [.int(now), .text(id)] + f.values)
            claimTokens[id] = nil
        case let .progress(id, sent):
            let f = fence(id, lease)
            try db.run("UPDATE entries SET bytes_sent = ? WHERE id = ?\(f.sql)", [.int(sent), .text(id)] + f.values)
        case let .partAccepted(seq, index, status, headers):
            guard let id = try entryID(seq: seq) else { return [] }
            let f = fence(id, lease)
            try db.run(
                """
                UPDATE parts SET accepted = 1, status = ?, response_headers = ?, attempts = attempts + 1
                WHERE entry_seq = ? AND idx = ? AND EXISTS (SELECT 1 FROM entries WHERE seq = ?\(f.sql))
                """, [.int(status), .text(headers.serialized()), .int(seq), .int(index), .int(seq)] + f.values)
        case let .partRetry(seq, index, next, status):
            guard let id = try entryID(seq: seq) else { return [] }
            let f = fence(id, lease)
            try db.run(
                """
                UPDATE parts SET attempts = attempts + 1, next_attempt_at = ?, status = ?
                WHERE entry_seq = ? AND idx = ? AND EXISTS (SELECT 1 FROM entries WHERE seq = ?\(f.sql))
                """, [.int(next), .optional(status.map(Int64.init)), .int(seq), .int(index), .int(seq)] + f.values)
        case let .partRefused(seq, index, status):
            guard let id = try entryID(seq: seq) else { return [] }
            let f = fence(id, lease)
            try db.run(
                """
                UPDATE parts SET attempts = attempts + 1, status = ?
                WHERE entry_seq = ? AND idx = ? AND accepted = 0 AND EXISTS (SELECT 1 FROM entries WHERE seq = ?\(f.sql))
                """, [.optional(status.map(Int64.init)), .int(seq), .int(index), .int(seq)] + f.values)
        case let .settle(s):
            return try settle(s, lease: lease, now: now).files
        case .cancelScope:
            return []  // applyInFrame settles those, to report the entries
        case let .drop(id, reason):
            guard let e = try entry(id: id) else { return [] }
            try db.run(
                """
                INSERT INTO outcomes (entry_id, key, generation, outcome, payload, acknowledged, reason, created_at)
                VALUES (?, ?, ?, 'error', '{}', 1, ?, ?)
                """,
                [.text(e.id), .text(e.key), .int(e.generation), .text(reason), .int(now)])
            claimTokens[id] = nil
            return try forget(e, returnMovedFile: true)
        case let .count(increments):
            try addCounters(increments)
        }
        return []
    }

    /// Settles an entry and journals its outcome (see the SQLite store: the same rules),
    /// applied only while the runner's claim holds.
    private func settle(_ s: Settlement, lease: Lease?, now: Int64) throws(OutboxError) -> (files: [String], applied: Bool) {
        guard let e = try settledEntry(s) else { return ([], false) }
        let f = fence(s.entryID, lease)
        defer { claimTokens[s.entryID] = nil }
        if s.forgetsEntry {
            // One round trip: the row, its attempts, outcomes and parts go in one statement.
            let deleted =
                try db.queryOne(
                    """
                    WITH d AS (DELETE FROM entries WHERE seq = ? AND generation = ?\(f.sql) RETURNING id, seq),
                      a AS (DELETE FROM attempts WHERE entry_id IN (SELECT id FROM d)),
                      o AS (DELETE FROM outcomes WHERE entry_id IN (SELECT id FROM d) AND generation <= ?),
                      p AS (DELETE FROM parts WHERE entry_seq IN (SELECT seq FROM d))
                    SELECT COUNT(*) FROM d
                    """, [.int(e.seq), .int(s.generation)] + f.values + [.int(s.generation)]
                ) { $0.int(0) } ?? 0
            guard deleted == 1 else { return ([], false) }
            var settled = e
            settled.state = s.state
            return (forgottenFiles(settled, returnMovedFile: s.state == .cancelled), true)
        }
        let changed = try db.run(
            """
            UPDATE entries SET state = ?, reason = ?, lease_owner = NULL, lease_token = NULL, lease_until = NULL,
              next_attempt_at = NULL, updated_at = ?
            WHERE seq = ? AND generation = ?\(f.sql)
            """, [.text(s.state.rawValue), .optional(s.reason), .int(now), .int(e.seq), .int(s.generation)] + f.values)
        guard changed == 1 else { return ([], false) }
        try journalOutcome(of: e, s, now: now)
        return ([], true)
    }

    package func markUnhandled(keys: Set<String>) throws(OutboxError) {
        try db.quietTransaction { () throws(OutboxError) in
            for o in try unacknowledgedOutcomes() where !keys.contains(o.key) && o.reason != "unhandled-key" {
                try db.run("UPDATE outcomes SET reason = 'unhandled-key' WHERE seq = ?", [.int(o.seq)])
            }
        }
    }

    /// Nothing to fold back: the server keeps its own log.
    package func checkpoint() {}

    package func freeBytes() -> Int64? { nil }
}
