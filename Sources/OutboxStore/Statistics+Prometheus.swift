import OutboxModel

/// The Prometheus text exposition format (version 0.0.4) of the statistics.
extension Statistics {
    package static let prometheusContentType = "text/plain; version=0.0.4; charset=utf-8"

    package var prometheus: String {
        var lines: [String] = []
        func family(_ name: String, _ type: String, _ help: String) {
            lines += ["# HELP \(name) \(help)", "# TYPE \(name) \(type)"]
        }
        family("outbox_entries", "gauge", "Entries in the store by state.")
        for state in EntryState.allCases {
            lines.append("outbox_entries\(Self.labels([("state", state.rawValue)])) \(states[state] ?? 0)")
        }
        family("outbox_key_entries", "gauge", "Entries in the store by key and state.")
        for key in byKey.keys.sorted() {
            for state in EntryState.allCases {
                lines.append("outbox_key_entries\(Self.labels([("key", key), ("state", state.rawValue)])) \(byKey[key]?[state] ?? 0)")
            }
        }
        family("outbox_outcomes_pending", "gauge", "Outcomes not yet acknowledged by a hook.")
        lines.append("outbox_outcomes_pending \(pendingOutcomes)")
        family("outbox_oldest_queued_age_seconds", "gauge", "How long the oldest queued entry has waited since it was enqueued.")
        lines.append("outbox_oldest_queued_age_seconds \(Self.seconds(ms: oldestQueuedAgeMs))")
        family("outbox_held_hosts", "gauge", "Hosts held after connection failures.")
        lines.append("outbox_held_hosts \(heldHosts.count)")

        let helps: [(Counter, String)] = [
            (.attempts, "Attempts since the store was created, by key and result (success, retry, auth, error, skipped, aborted)."),
            (.sentBytes, "Request body bytes sent since the store was created, retries included, by key."),
            (.acceptedBytes, "Request body bytes of accepted requests and parts since the store was created, by key."),
            (.hookDeliveries, "Outcomes acknowledged by a hook since the store was created, by key."),
            (.hookFailures, "Hook runs that failed since the store was created, by key."),
        ]
        for (counter, help) in helps {
            family(counter.rawValue, "counter", help)
            for sample in counters where sample.counter == counter {
                lines.append(
                    "\(counter.rawValue)\(Self.labels(sample.labels.sorted { $0.key < $1.key }.map { ($0.key, $0.value) })) \(sample.value)"
                )
            }
        }
        lines += durationLines()
        return lines.joined(separator: "\n") + "\n"
    }

    /// The request-duration histogram as the format wants it: each `le` counts every
    /// attempt at or below it (the store keeps a count per bucket).
    package var durationHistogram: (buckets: [(le: String, count: Int64)], microseconds: Int64, count: Int64) {
        var perBucket: [String: Int64] = [:]
        var microseconds: Int64 = 0
        for sample in counters {
            if sample.counter == .durationBucket, let le = sample.labels["le"] { perBucket[le, default: 0] += sample.value }
            if sample.counter == .durationMicroseconds { microseconds += sample.value }
        }
        var cumulative: Int64 = 0
        var buckets: [(le: String, count: Int64)] = []
        for bound in Counter.durationBuckets.map(Counter.formatBound) + ["+Inf"] {
            cumulative += perBucket[bound] ?? 0
            buckets.append((bound, cumulative))
        }
        return (buckets, microseconds, cumulative)
    }

    static func seconds(microseconds: Int64) -> String {
        let fraction = String(microseconds % 1_000_000)
        return "\(microseconds / 1_000_000).\(String(repeating: "0", count: 6 - fraction.count))\(fraction)"
    }

    private func durationLines() -> [String] {
        let name = "outbox_request_duration_seconds"
        let histogram = durationHistogram
        return [
            "# HELP \(name) How long attempts took, from the start of the request to the end of the response.",
            "# TYPE \(name) histogram",
        ] + histogram.buckets.map { "\(name)_bucket{le=\"\($0.le)\"} \($0.count)" } + [
            "\(name)_sum \(Self.seconds(microseconds: histogram.microseconds))", "\(name)_count \(histogram.count)",
        ]
    }

    /// `{name="value",...}`, values escaped (backslash, quote, newline); empty for no labels.
    static func labels(_ pairs: [(String, String)]) -> String {
        guard !pairs.isEmpty else { return "" }
        let body = pairs.map { name, value in
            let escaped = value.map { c in c == "\\" ? "\\\\" : c == "\"" ? "\\\"" : c == "\n" ? "\\n" : String(c) }.joined()
            return "\(name)=\"\(escaped)\""
        }
        return "{\(body.joined(separator: ","))}"
    }
}
