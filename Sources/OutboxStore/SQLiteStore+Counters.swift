import OutboxModel

/// The cumulative counters, one row per series in `counters`.
extension SQLiteStore {
    /// Adds to counter series inside the caller's transaction.
    func addCounters(_ increments: [CounterIncrement]) throws(OutboxError) {
        for increment in increments where increment.by != 0 {
            try db.run(
                """
                INSERT INTO counters (name, labels, value) VALUES (?, ?, ?)
                ON CONFLICT (name, labels) DO UPDATE SET value = value + excluded.value
                """, [.text(increment.counter.rawValue), .text(increment.labelText), .int(increment.by)])
        }
    }
}
