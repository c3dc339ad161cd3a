import Glibc
import OutboxModel

/// Hook delivery, the counters and the runner lock of the PostgreSQL store.
extension PostgresStore {
    // MARK: Delivery

    /// Outcomes to deliver now: the oldest unacknowledged one of each id, due, for keys that
    /// have a definition.
    /// At most `limit` outcomes (all when nil). Due time and keys are filtered in SQL so that
    /// starting one hook parses a few payloads, not every pending one.
    package func deliverableOutcomes(
        now: Int64, keys: Set<String>, excludingIDs: Set<String>, limit: Int?, horizon: Int64?
    ) throws(OutboxError) -> [OutcomeRecord] {
        // No key has a hook: nothing to read (a runner asks at every turn).
        guard !keys.isEmpty else { return [] }
        let keyList = JSON.array(keys.sorted().map { .string($0) }).serialized()
        let rows = try db.query(
            """
            SELECT \(Self.outcomeColumns) FROM outcomes o
            WHERE acknowledged = 0 AND COALESCE(next_delivery_at, 0) <= ? AND COALESCE(delivery_until, 0) < ?
              AND (deliveries = 0 OR COALESCE(next_delivery_at, 0) <= ?)
              AND key IN (SELECT jsonb_array_elements_text(?::jsonb))
              AND seq = (SELECT MIN(seq) FROM outcomes p WHERE p.entry_id = o.entry_id AND p.acknowledged = 0)
            ORDER BY seq LIMIT ?
            """,
            [
                .int(now), .int(databaseTime(now)), .int(horizon ?? .max), .text(keyList),
                .optional(limit.map { Int64($0 + excludingIDs.count) }),
            ], Self.outcome
        )
        let open = rows.filter { !excludingIDs.contains($0.entryID) }
        return limit.map { Array(open.prefix($0)) } ?? open
    }

    /// Counts a delivery before its hook starts (so a crash mid-hook is seen as a delivery), returning the new count.
    package func beginDelivery(seq: Int64) throws(OutboxError) -> Int64? {
        try beginDeliveries(seqs: [seq])[seq]
    }

    /// Counts a delivery of each outcome in one transaction: the hooks a turn starts cost one commit.
    package func beginDeliveries(seqs: [Int64]) throws(OutboxError) -> [Int64: Int64] {
        guard !seqs.isEmpty else { return [:] }
        return try db.quietTransaction { () throws(OutboxError) -> [Int64: Int64] in
            var counts: [Int64: Int64] = [:]
            for seq in seqs {
                counts[seq] = try db.queryOne(
                    "UPDATE outcomes SET deliveries = deliveries + 1, reason = NULL WHERE seq = ? RETURNING deliveries", [.int(seq)]
                ) { $0.int(0) }
            }
            return counts
        }
    }

    /// Records a hook's process group, and the host it runs on, so a later runner on this
    /// host can stop it before redelivering.
    package func recordHookProcess(seq: Int64, pgid: Int32, startTime: UInt64) throws(OutboxError) {
        try db.quietTransaction { () throws(OutboxError) in
            try db.run(
                "UPDATE outcomes SET hook_pgid = ?, hook_start = ?, hook_host = ? WHERE seq = ?",
                [.int(Int64(pgid)), .int(Int64(startTime)), .text(host), .int(seq)])
        }
    }

    /// Hook processes recorded by earlier runners on this host for outcomes still
    /// unacknowledged, whose delivery lease ran out (a live runner's hooks are its own).
    package func recordedHookProcesses() throws(OutboxError) -> [(pgid: Int32, startTime: UInt64)] {
        try db.query(
            """
            SELECT hook_pgid, hook_start FROM outcomes
            WHERE acknowledged = 0 AND hook_pgid IS NOT NULL AND hook_host = ? AND COALESCE(delivery_until, 0) < ?
            """, [.text(host), .int(databaseTime(Identifiers.nowMs()))]
        ) {
            Self.hookProcess($0.int(0), $0.int(1))
        }.compactMap { $0 }
    }

    /// Acknowledges outcomes (hook exit 0), applies their hooks' enqueues, and forgets each
    /// completed or cancelled entry of that generation, all in one transaction: hooks that
    /// ended together cost one commit. An older generation's acknowledgement never forgets a
    /// newer generation.
    @discardableResult
    package func acknowledge(_ batch: [Acknowledgement], now: Int64) throws(OutboxError) -> [Int64: String] {
        guard !batch.isEmpty else { return [:] }
        let followUps = batch.flatMap(\.followUps)
        // Held only while follow-ups stage bodies (audit leaves those files alone meanwhile).
        let lock = followUps.isEmpty ? nil : stagingLock(exclusive: false)
        defer { withExtendedLifetime(lock) {} }
        let staged = try stageBatch(followUps, repeatsAllowed: true)
        var remove: [String] = []
        var refused: [Int64: String] = [:]
        var selection = FollowUpSelection(all: followUps, staged: staged)
        // A transaction cut before its commit runs again whole, from the claims held before it.
        let claimsBefore = deliveryClaims
        do throws(OutboxError) {
            // Follow-ups are enqueued under the same-id rules (one writer at a time); the rest
            // is fenced by the delivery lease and the outcome's row.
            func body() throws(OutboxError) {
                (refused, selection) = ([:], FollowUpSelection(all: followUps, staged: staged))
                deliveryClaims = claimsBefore
                remove = try acknowledgeEach(batch, selection: &selection, refused: &refused) { (a) throws(OutboxError) in
                    try acknowledgeOne(a, now: now)
                }
                try selection.apply { (kept, keptStaged) throws(OutboxError) in _ = try applyBatch(kept, staged: keptStaged, now: now) }
                try journalReturns()
            }
            if followUps.isEmpty { try db.quietTransaction(body) } else { try db.transaction(lock: lockKey, body) }
        } catch {
            deliveryClaims = claimsBefore
            for s in staged.bodies { staging.rollback(s) }
            moves.end(staged.ticket)
            dropReturns()
            throw error
        }
        Fault.point("ack.committed")
        staging.afterCommit(selection.keptStaged.bodies)
        for s in selection.dropped { staging.rollback(s) }
        moves.end(staged.ticket)
        finishForget(remove)
        return refused
    }

    package func acknowledge(seq: Int64, followUps: [NewEntry], now: Int64) throws(OutboxError) {
        try acknowledge([Acknowledgement(seq: seq, followUps: followUps)], now: now)
    }

    /// One acknowledgement inside the caller's transaction; returns the files to remove, and
    /// whether the outcome was this runner's to acknowledge.
    private func acknowledgeOne(_ a: Acknowledgement, now: Int64) throws(OutboxError) -> ([String], Bool) {
        let seq = a.seq
        guard let o = try db.queryOne("SELECT \(Self.outcomeColumns) FROM outcomes WHERE seq = ?", [.int(seq)], Self.outcome) else {
            // Forgotten while its hook ran (a cancel): the hook still exited 0.
            if let key = a.key { try addCounters([CounterIncrement(.hookDeliveries, [("key", key)], by: 1)]) }
            deliveryClaims.remove(seq)
            return ([], false)
        }
        guard !o.acknowledged else { return ([], false) }
        // A runner whose delivery lease another runner took over acknowledges nothing.
        let fence = deliveryFence(seq)
        deliveryClaims.remove(seq)
        guard
            try db.run(
                """
                UPDATE outcomes SET acknowledged = 1, hook_pgid = NULL, next_delivery_at = NULL, delivery_owner = NULL,
                  delivery_until = NULL
                WHERE seq = ? AND acknowledged = 0\(fence.sql)
                """, [.int(seq)] + fence.values) == 1
        else { return ([], false) }
        try addCounters([CounterIncrement(.hookDeliveries, [("key", o.key)], by: 1)])
        return (try entryAcknowledged(id: o.entryID, generation: o.generation, now: now), true)
    }

    package func deliveryFailed(
        seq: Int64, nextDeliveryAt: Int64, reason: String, hookStarted: Bool, hookFailed: Bool
    ) throws(OutboxError) {
        let fence = deliveryFence(seq)
        deliveryClaims.remove(seq)
        try db.quietTransaction { () throws(OutboxError) in
            let changed = try db.run(
                """
                UPDATE outcomes SET next_delivery_at = ?, reason = ?, hook_pgid = NULL, delivery_owner = NULL, delivery_until = NULL,
                  deliveries = CASE WHEN ? = 1 THEN deliveries ELSE GREATEST(deliveries - 1, 0) END
                WHERE seq = ?\(fence.sql)
                """, [.int(nextDeliveryAt), .text(reason), .int(hookStarted ? 1 : 0), .int(seq)] + fence.values)
            if changed == 1 && hookFailed { try countDelivery(outcomeSeq: seq, .hookFailures) }
        }
    }

    /// Adds to counter series inside the caller's transaction.
    /// One statement, into this connection's rows of each series (in a fixed order, so two
    /// writers that share a row never wait for each other in a cycle).
    func addCounters(_ increments: [CounterIncrement]) throws(OutboxError) {
        var sums: [String: [String: Int64]] = [:]
        for increment in increments where increment.by != 0 {
            sums[increment.counter.rawValue, default: [:]][increment.labelText, default: 0] += increment.by
        }
        guard !sums.isEmpty else { return }
        var rows: [JSON] = []
        for name in sums.keys.sorted() {
            for (labels, by) in sums[name, default: [:]].sorted(by: { $0.key < $1.key }) {
                rows.append(.array([.string(name), .string(labels), .int64(by)]))
            }
        }
        try db.run(
            """
            INSERT INTO counters (name, labels, shard, value)
            SELECT x->>0, x->>1, pg_backend_pid() % 64, (x->>2)::bigint FROM jsonb_array_elements(?::jsonb) x
            ON CONFLICT (name, labels, shard) DO UPDATE SET value = counters.value + excluded.value
            """, [.text(JSON.array(rows).serialized())])
    }
}
