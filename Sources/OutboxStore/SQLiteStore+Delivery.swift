import OutboxModel

/// Hook delivery: which outcomes are due, counting deliveries, recording hook processes,
/// and acknowledging (with the hooks' enqueues) or postponing them.
extension SQLiteStore {
    /// Outcomes to deliver now: the oldest unacknowledged one of each id, due, for keys that
    /// have a definition.
    /// At most `limit` outcomes (all when nil). Due time and keys are filtered in SQL so that
    /// starting one hook parses a few payloads, not every pending one.
    package func deliverableOutcomes(
        now: Int64, keys: Set<String>, excludingIDs: Set<String>, limit: Int?, horizon: Int64?
    ) throws(OutboxError) -> [OutcomeRecord] {
        let keyList = JSON.array(keys.sorted().map { .string($0) }).serialized()
        let rows = try db.query(
            """
            SELECT \(Self.outcomeColumns) FROM outcomes o
            WHERE acknowledged = 0 AND COALESCE(next_delivery_at, 0) <= ? AND (deliveries = 0 OR COALESCE(next_delivery_at, 0) <= ?)
              AND key IN (SELECT value FROM json_each(?))
              AND seq = (SELECT MIN(seq) FROM outcomes p WHERE p.entry_id = o.entry_id AND p.acknowledged = 0)
            ORDER BY seq LIMIT ?
            """, [.int(now), .int(horizon ?? .max), .text(keyList), .int(limit.map { $0 + excludingIDs.count } ?? -1)], Self.outcome)
        let open = rows.filter { !excludingIDs.contains($0.entryID) }
        return limit.map { Array(open.prefix($0)) } ?? open
    }

    /// Counts a delivery before its hook starts (so a crash mid-hook is seen as a delivery), returning the new count;
    /// nil for an outcome no longer there (its entry was cancelled since it was read): no hook starts for it.
    package func beginDelivery(seq: Int64) throws(OutboxError) -> Int64? {
        try beginDeliveries(seqs: [seq])[seq]
    }

    /// Counts a delivery of each outcome in one transaction: the hooks a turn starts cost one commit.
    package func beginDeliveries(seqs: [Int64]) throws(OutboxError) -> [Int64: Int64] {
        guard !seqs.isEmpty else { return [:] }
        return try db.transaction { () throws(OutboxError) -> [Int64: Int64] in try countDeliveries(seqs) }
    }

    /// Inside the caller's transaction: one more delivery of each outcome still there, and the new counts.
    private func countDeliveries(_ seqs: [Int64]) throws(OutboxError) -> [Int64: Int64] {
        var counts: [Int64: Int64] = [:]
        for seq in seqs {
            counts[seq] = try db.queryOne(
                "UPDATE outcomes SET deliveries = deliveries + 1, reason = NULL WHERE seq = ? RETURNING deliveries", [.int(seq)]
            ) { $0.int(0) }
        }
        return counts
    }

    /// Records a hook's process group so a later runner can stop it before redelivering.
    /// Not fsynced: it is needed after a crash of the runner, when the machine (and the
    /// page cache holding the record) stayed up; after a power loss the hook is gone too.
    package func recordHookProcess(seq: Int64, pgid: Int32, startTime: UInt64) throws(OutboxError) {
        try db.transactionWithoutSync { () throws(OutboxError) in
            try db.run(
                "UPDATE outcomes SET hook_pgid = ?, hook_start = ? WHERE seq = ?", [.int(Int64(pgid)), .int(Int64(startTime)), .int(seq)])
        }
    }

    package func recordHookProcesses(_ processes: [HookProcess]) throws(OutboxError) {
        guard !processes.isEmpty else { return }
        try db.transactionWithoutSync { () throws(OutboxError) in
            for p in processes {
                try db.run(
                    "UPDATE outcomes SET hook_pgid = ?, hook_start = ? WHERE seq = ?",
                    [.int(Int64(p.pgid)), .int(Int64(p.startTime)), .int(p.seq)])
            }
        }
    }

    /// Hook processes recorded by earlier runners for outcomes still unacknowledged.
    package func recordedHookProcesses() throws(OutboxError) -> [(pgid: Int32, startTime: UInt64)] {
        try db.query("SELECT hook_pgid, hook_start FROM outcomes WHERE acknowledged = 0 AND hook_pgid IS NOT NULL") {
            Self.hookProcess($0.int(0), $0.int(1))
        }.compactMap { $0 }
    }

    /// Acknowledges outcomes (hook exit 0), applies their hooks' enqueues, and forgets each
    /// completed or cancelled entry of that generation, all in one transaction: hooks that
    /// ended together cost one commit. An older generation's acknowledgement never forgets a
    /// newer generation.
    @discardableResult
    package func acknowledge(_ batch: [Acknowledgement], now: Int64) throws(OutboxError) -> [Int64: String] {
        try acknowledge(batch, thenBegin: [], now: now).refused
    }

    package func acknowledge(
        _ batch: [Acknowledgement], thenBegin begin: [Int64], now: Int64
    ) throws(OutboxError) -> (counts: [Int64: Int64], refused: [Int64: String]) {
        if batch.isEmpty { return (try beginDeliveries(seqs: begin), [:]) }
        let followUps = batch.flatMap(\.followUps)
        // Held only while follow-ups stage bodies (audit leaves those files alone meanwhile).
        let lock = followUps.isEmpty ? nil : stagingLock(exclusive: false)
        defer { withExtendedLifetime(lock) {} }
        let staged = try stageBatch(followUps, repeatsAllowed: true)
        var remove: [String] = []
        var counts: [Int64: Int64] = [:]
        var refused: [Int64: String] = [:]
        var selection = FollowUpSelection(all: followUps, staged: staged)
        do throws(OutboxError) {
            try db.transaction { () throws(OutboxError) in
                (refused, selection) = ([:], FollowUpSelection(all: followUps, staged: staged))
                // Counted per key once for the batch, not one counter write per hook.
                var tally = CounterTally()
                remove = try acknowledgeEach(batch, selection: &selection, refused: &refused) { (a) throws(OutboxError) in
                    try acknowledgeOne(a, now: now, tally: &tally)
                }
                try addCounters(tally.take())
                try selection.apply { (kept, keptStaged) throws(OutboxError) in _ = try applyBatch(kept, staged: keptStaged, now: now) }
                try journalReturns()
                counts = try countDeliveries(begin)
            }
        } catch {
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
        return (counts, refused)
    }

    package func acknowledge(seq: Int64, followUps: [NewEntry], now: Int64) throws(OutboxError) {
        try acknowledge([Acknowledgement(seq: seq, followUps: followUps)], now: now)
    }

    /// One acknowledgement inside the caller's transaction; returns the files to remove, and
    /// whether the outcome was there to acknowledge.
    private func acknowledgeOne(
        _ a: Acknowledgement, now: Int64, tally: inout CounterTally
    ) throws(OutboxError) -> ([String], Bool) {
        let seq = a.seq
        // Only what the acknowledgement needs: the payload is not read (nor parsed).
        guard
            let o = try db.queryOne(
                "SELECT entry_id, key, generation, acknowledged FROM outcomes WHERE seq = ?", [.int(seq)],
                { (entryID: $0.text(0), key: $0.text(1), generation: $0.int(2), acknowledged: $0.int(3) != 0) })
        else {
            // Forgotten while its hook ran (a cancel): the hook still exited 0.
            if let key = a.key { tally.add(.hookDeliveries, [("key", key)], by: 1) }
            return ([], false)
        }
        guard !o.acknowledged else { return ([], false) }
        try db.run("UPDATE outcomes SET acknowledged = 1, hook_pgid = NULL, next_delivery_at = NULL WHERE seq = ?", [.int(seq)])
        tally.add(.hookDeliveries, [("key", o.key)], by: 1)
        return (try entryAcknowledged(id: o.entryID, generation: o.generation, now: now), true)
    }

    package func deliveryFailed(
        seq: Int64, nextDeliveryAt: Int64, reason: String, hookStarted: Bool, hookFailed: Bool
    ) throws(OutboxError) {
        try db.transaction { () throws(OutboxError) in
            try db.run(
                """
                UPDATE outcomes SET next_delivery_at = ?, reason = ?, hook_pgid = NULL,
                  deliveries = CASE WHEN ? = 1 THEN deliveries ELSE MAX(deliveries - 1, 0) END
                WHERE seq = ?
                """, [.int(nextDeliveryAt), .text(reason), .int(hookStarted ? 1 : 0), .int(seq)])
            if hookFailed { try countDelivery(outcomeSeq: seq, .hookFailures) }
        }
    }

    /// Marks outcomes whose key has no definition (shown as unhandled-key; never dropped).
    package func markUnhandled(keys: Set<String>) throws(OutboxError) {
        try db.transaction { () throws(OutboxError) in
            for o in try unacknowledgedOutcomes() where !keys.contains(o.key) && o.reason != "unhandled-key" {
                try db.run("UPDATE outcomes SET reason = 'unhandled-key' WHERE seq = ?", [.int(o.seq)])
            }
        }
    }

}
