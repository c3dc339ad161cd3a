import OutboxModel

/// What `outbox stats` and the runner's metrics endpoint report: the store's gauges (entries
/// by state and key, pending outcomes, the oldest queued entry, held hosts) and its
/// cumulative counters, read at one moment.
package struct Statistics: Sendable {
    /// Entries by shown state: queued entries held by a pause count as paused, as in `list`.
    package var states: [EntryState: Int64]
    package var byKey: [String: [EntryState: Int64]]
    package var pendingOutcomes: Int64
    package var heldHosts: [String]
    /// How long the oldest queued entry has waited since it was enqueued; 0 when none waits.
    package var oldestQueuedAgeMs: Int64
    package var counters: [CounterSample]

    /// The figures of a store that holds nothing (or does not exist yet).
    package static let empty = Statistics(
        states: [:], byKey: [:], pendingOutcomes: 0, heldHosts: [], oldestQueuedAgeMs: 0, counters: [])

    package static func read(from store: any Store, now: Int64) throws(OutboxError) -> Statistics {
        let counts = try store.counts()
        let control = try store.control()
        var byKey = counts.byKey
        for (key, keyStates) in byKey where control.isPaused(key: key) {
            byKey[key]?[.paused] = keyStates[.queued] ?? 0
            byKey[key]?[.queued] = nil
        }
        var states: [EntryState: Int64] = [:]
        for keyStates in byKey.values { states.merge(keyStates, uniquingKeysWith: +) }
        return Statistics(
            states: states, byKey: byKey, pendingOutcomes: counts.pendingOutcomes, heldHosts: try store.heldHosts(),
            oldestQueuedAgeMs: counts.oldestQueuedAt.map { max(0, now - $0) } ?? 0, counters: try store.counters())
    }

    /// Seconds with three decimals.
    static func seconds(ms: Int64) -> String {
        let millis = String(ms % 1000)
        return "\(ms / 1000).\(String(repeating: "0", count: 3 - millis.count))\(millis)"
    }

    package var json: JSON {
        .object([
            ("entries", .object(EntryState.allCases.map { ($0.rawValue, .int64(states[$0] ?? 0)) })),
            (
                "keys",
                .object(
                    byKey.keys.sorted().map { key in
                        (key, .object(EntryState.allCases.map { ($0.rawValue, .int64(byKey[key]?[$0] ?? 0)) }))
                    })
            ),
            ("outcomes_pending", .int64(pendingOutcomes)),
            ("held_hosts", .array(heldHosts.map { .string($0) })),
            ("oldest_queued_age_seconds", .number(Self.seconds(ms: oldestQueuedAgeMs))),
            (
                "counters",
                .array(
                    counters.filter { $0.counter != .durationBucket && $0.counter != .durationMicroseconds }.map { sample in
                        .object([
                            ("name", .string(sample.counter.rawValue)),
                            ("labels", .object(sample.labels.sorted { $0.key < $1.key }.map { ($0.key, .string($0.value)) })),
                            ("value", .int64(sample.value)),
                        ])
                    })
            ),
            (
                "request_duration_seconds",
                .object([
                    ("buckets", .array(durationHistogram.buckets.map { .object([("le", .string($0.le)), ("count", .int64($0.count))]) })),
                    ("sum", .number(Self.seconds(microseconds: durationHistogram.microseconds))),
                    ("count", .int64(durationHistogram.count)),
                ])
            ),
        ])
    }
}
