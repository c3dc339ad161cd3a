import OutboxModel

/// The cumulative counters and the pending totals, read the same way from both stores.
extension SQLStore {
    /// Counts one hook run of an outcome by its key: acknowledged or failed.
    func countDelivery(outcomeSeq seq: Int64, _ counter: Counter) throws(OutboxError) {
        guard let key = try db.queryOne("SELECT key FROM outcomes WHERE seq = ?", [.int(seq)], { $0.text(0) }) else { return }
        try addCounters([CounterIncrement(counter, [("key", key)], by: 1)])
    }

    package func counters() throws(OutboxError) -> [CounterSample] {
        // A series may be kept in several rows (PostgreSQL's shards): they add up.
        try db.query("SELECT name, labels, SUM(value) FROM counters GROUP BY name, labels ORDER BY name, labels") {
            row throws(OutboxError) -> CounterSample? in
            // A series this version does not know (written by a newer one) is left out.
            guard let counter = Counter(rawValue: row.text(0)) else { return nil }
            var labels: [String: String] = [:]
            let text = row.text(1)
            guard let object = (try? JSON.parse(text))?.objectValue else {
                throw .storage("the counter \(counter.rawValue) has labels that are not a JSON object: \(text.prefix(80))")
            }
            for (name, value) in object { labels[name] = value.stringValue ?? "" }
            return CounterSample(counter: counter, labels: labels, value: row.int(2))
        }.compactMap { $0 }
    }

    /// Counts and bytes of the entries not yet settled, and how much of them is accepted.
    /// With `dueBy` (a drain's horizon), only what that run will send: entries running, and
    /// queued ones not paused (nor the queue) whose delay and retry time fall within it.
    package func pendingTotals(dueBy: Int64? = nil) throws(OutboxError) -> PendingTotals {
        var live = "e.state IN ('queued', 'running', 'awaiting-auth')"
        var bindings: [SQLValue] = []
        if dueBy != nil, try setting(Self.queuePausedSetting) == "1" {
            live = "e.state = 'running'"
        } else if let dueBy {
            live = """
                (e.state = 'running' OR (e.state = 'queued' AND e.paused = 0
                  AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= ?) AND (e.not_before IS NULL OR e.not_before <= ?)))
                """
            bindings = [.int(dueBy), .int(dueBy)]
        }
        let (count, bytes) =
            try db.queryOne(
                "SELECT COUNT(*), COALESCE(SUM(e.total_bytes), 0) FROM entries e WHERE \(live)", bindings
            ) { ($0.int(0), $0.int(1)) } ?? (0, 0)
        let accepted =
            try db.queryOne(
                """
                SELECT COALESCE(SUM(p."end" - p.start), 0) FROM parts p JOIN entries e ON e.seq = p.entry_seq
                WHERE p.accepted = 1 AND \(live)
                """, bindings
            ) { $0.int(0) } ?? 0
        return PendingTotals(entries: Int(count), bytes: bytes, acceptedBytes: accepted)
    }
}
