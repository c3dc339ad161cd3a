import OutboxModel

/// The cumulative counters a store keeps from its creation, so that a one-shot `stats`
/// reports them as a long-lived runner would: attempts, bytes, hook deliveries, and the
/// request-duration histogram. Every value is a whole number; a runner adds to them in the
/// same transaction as the changes they count.
package enum Counter: String, Sendable, CaseIterable {
    /// Attempts by key and result (success, retry, auth, error, aborted, skipped).
    case attempts = "outbox_attempts_total"
    /// Request body bytes sent, retries and re-sent parts included, by key.
    case sentBytes = "outbox_sent_bytes_total"
    /// Request body bytes of accepted requests and parts, by key.
    case acceptedBytes = "outbox_accepted_bytes_total"
    /// Outcomes acknowledged by a hook (exit 0), by key.
    case hookDeliveries = "outbox_hook_deliveries_total"
    /// Hook runs that failed (non-zero exit, signal, timeout), by key.
    case hookFailures = "outbox_hook_failures_total"
    /// Attempts whose duration falls in one histogram bucket (`le`), not cumulated.
    case durationBucket = "outbox_request_duration_bucket"
    /// The sum of attempt durations, in microseconds.
    case durationMicroseconds = "outbox_request_duration_microseconds"

    /// Upper bounds of the request-duration histogram, in seconds (+Inf is implied).
    package static let durationBuckets: [Double] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300]

    /// The `le` label of the bucket a duration falls in.
    package static func bucketLabel(seconds: Double) -> String {
        bucketLabels[durationBuckets.firstIndex(where: { seconds <= $0 }) ?? durationBuckets.count]
    }

    /// The `le` label of every bucket, +Inf last; made once, as a runner labels every attempt.
    package static let bucketLabels: [String] = durationBuckets.map(formatBound) + ["+Inf"]

    package static func formatBound(_ bound: Double) -> String {
        bound == bound.rounded() ? String(Int64(bound)) : String(bound)
    }
}

/// One counter series and how much to add to it.
package struct CounterIncrement: Sendable, Equatable, Hashable {
    package let counter: Counter
    /// Label names and values, sorted by name.
    package let labels: [Label]
    /// The labels as stored: a JSON object with sorted names, one text per series. Made once:
    /// it is the series' identity when a tally sums and sorts, and the stored key.
    package let labelText: String
    package var by: Int64

    package struct Label: Sendable, Equatable, Hashable {
        package var name: String
        package var value: String
        package init(_ name: String, _ value: String) {
            self.name = name
            self.value = value
        }
    }

    package init(_ counter: Counter, _ labels: [(String, String)], by: Int64) {
        self.counter = counter
        self.labels = labels.map { Label($0.0, $0.1) }.sorted { $0.name < $1.name }
        self.labelText = JSON.object(self.labels.map { ($0.name, .string($0.value)) }).serialized()
        self.by = by
    }
}

/// A counter series with its total since the store was created.
package struct CounterSample: Sendable, Equatable {
    package var counter: Counter
    package var labels: [String: String]
    package var value: Int64

    package init(counter: Counter, labels: [String: String], value: Int64) {
        self.counter = counter
        self.labels = labels
        self.value = value
    }
}

/// Increments summed by series, so a batch writes each series once.
package struct CounterTally: Sendable {
    /// By counter name and label text; the first increment of a series is kept, summed into.
    private var totals: [SeriesKey: CounterIncrement] = [:]

    private struct SeriesKey: Hashable {
        var counter: Counter
        var labelText: String
    }

    /// Attempts summed by key until `take`: an attempt costs one lookup by its key here
    /// instead of five label sorts and hashes (about 16,000 instructions per small request).
    private var attemptsByKey: [String: AttemptSums] = [:]
    /// Attempts per duration bucket (the last one is +Inf), and their summed microseconds.
    private var bucketCounts: [Int64] = []
    private var durationSum: Int64 = 0

    private struct AttemptSums {
        var results: [(result: String, count: Int64)] = []
        var sent: Int64 = 0
        var accepted: Int64 = 0
    }

    package init() {}

    package var isEmpty: Bool { totals.isEmpty && attemptsByKey.isEmpty && bucketCounts.isEmpty }

    /// One attempt of an entry of `key`: its result (success, retry, auth, error), the body
    /// bytes it sent, whether they were accepted, and its duration; the same series as
    /// `add` and `observeDuration` would write.
    package mutating func addAttempt(key: String, result: String, sentBytes: Int64, accepted: Bool, durationMicroseconds: Int64) {
        var sums = attemptsByKey.removeValue(forKey: key) ?? AttemptSums()
        if let i = sums.results.firstIndex(where: { $0.result == result }) {
            sums.results[i].count += 1
        } else {
            sums.results.append((result, 1))
        }
        sums.sent += sentBytes
        if accepted { sums.accepted += sentBytes }
        attemptsByKey[key] = sums
        let us = max(0, durationMicroseconds)
        if bucketCounts.isEmpty { bucketCounts = Array(repeating: 0, count: Counter.durationBuckets.count + 1) }
        let seconds = Double(us) / 1_000_000
        bucketCounts[Counter.durationBuckets.firstIndex(where: { seconds <= $0 }) ?? Counter.durationBuckets.count] += 1
        durationSum += us
    }

    package mutating func add(_ counter: Counter, _ labels: [(String, String)], by: Int64) {
        guard by != 0 else { return }
        var increment = CounterIncrement(counter, labels, by: by)
        let key = SeriesKey(counter: counter, labelText: increment.labelText)
        if let sum = totals[key] { increment.by += sum.by }
        totals[key] = increment
    }

    /// One attempt's duration in the histogram.
    package mutating func observeDuration(microseconds: Int64) {
        let us = max(0, microseconds)
        add(.durationBucket, [("le", Counter.bucketLabel(seconds: Double(us) / 1_000_000))], by: 1)
        add(.durationMicroseconds, [], by: us)
    }

    /// The summed increments, emptying the tally.
    package mutating func take() -> [CounterIncrement] {
        for (key, sums) in attemptsByKey {
            for (result, count) in sums.results { add(.attempts, [("key", key), ("result", result)], by: count) }
            add(.sentBytes, [("key", key)], by: sums.sent)
            add(.acceptedBytes, [("key", key)], by: sums.accepted)
        }
        for (i, count) in bucketCounts.enumerated() where count > 0 {
            add(.durationBucket, [("le", Counter.bucketLabels[i])], by: count)
        }
        if !bucketCounts.isEmpty { add(.durationMicroseconds, [], by: durationSum) }
        attemptsByKey.removeAll()
        bucketCounts.removeAll()
        durationSum = 0
        defer { totals.removeAll() }
        // In one order every time, so two tallies of the same increments compare equal.
        return totals.values.sorted { ($0.counter.rawValue, $0.labelText) < ($1.counter.rawValue, $1.labelText) }
    }
}
