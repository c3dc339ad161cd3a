import OutboxModel

extension SQLiteStore {
    /// Counts and bytes of the entries not yet settled, and how much of them is accepted.
    package func pendingTotals() throws(OutboxError) -> PendingTotals {
        let live = "('queued', 'running', 'awaiting-auth')"
        let (count, bytes) =
            try db.queryOne(
                "SELECT COUNT(*), COALESCE(SUM(total_bytes), 0) FROM entries WHERE state IN \(live)"
            ) { ($0.int(0), $0.int(1)) } ?? (0, 0)
        let accepted =
            try db.queryOne(
                """
                SELECT COALESCE(SUM(p.end - p.start), 0) FROM parts p JOIN entries e ON e.seq = p.entry_seq
                WHERE p.accepted = 1 AND e.state IN \(live)
                """
            ) { $0.int(0) } ?? 0
        return PendingTotals(entries: Int(count), bytes: bytes, acceptedBytes: accepted)
    }
}
