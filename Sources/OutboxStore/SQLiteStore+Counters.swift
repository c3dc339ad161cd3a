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

    /// Counts one hook run of an outcome by its key: acknowledged or failed.
    func countDelivery(outcomeSeq seq: Int64, _ counter: Counter) throws(OutboxError) {
        guard let key = try db.queryOne("SELECT key FROM outcomes WHERE seq = ?", [.int(seq)], { $0.text(0) }) else { return }
        try addCounters([CounterIncrement(counter, [("key", key)], by: 1)])
    }

    package func counters() throws(OutboxError) -> [CounterSample] {
        try db.query("SELECT name, labels, value FROM counters ORDER BY name, labels") { row throws(OutboxError) -> CounterSample? in
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
}
