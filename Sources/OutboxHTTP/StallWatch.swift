import OutboxModel

/// Decides when a transfer has stalled: it moved fewer than `belowBytesPerSecond` a second,
/// on average, over the last `forMs` (`timeouts.stall`, docs/config.md).
///
/// libcurl's own low-speed check averages the rate over its last 5 seconds, so a transfer
/// that stopped dead right after a burst was given up as much as 5 s after `for`. Here the
/// curl thread samples the bytes a transfer moved (sent plus received) as it runs; the
/// window starts at the newest sample at least `forMs` old, so a dead transfer is given up
/// between `forMs` and `forMs` + `stepMs` after its last byte, and never before `forMs`.
struct StallWatch {
    let belowBytesPerSecond: Int
    let forMs: Int64
    /// What must move within the window for the transfer to be alive.
    let minimumBytes: Int64
    /// Samples are at least this far apart: at most ~34 are kept, whatever `forMs`.
    let stepMs: Int64
    private var samples: [(ms: Int64, bytes: Int64)] = []

    /// nil when either limit is 0 (no stall check).
    init?(belowBytesPerSecond: Int, forMs: Int) {
        guard belowBytesPerSecond > 0, forMs > 0 else { return nil }
        self.belowBytesPerSecond = belowBytesPerSecond
        self.forMs = Int64(forMs)
        minimumBytes = (Int64(belowBytesPerSecond) * Int64(forMs) + 999) / 1000
        stepMs = max(100, Int64(forMs) / 32)
    }

    /// Records that the transfer has moved `bytes` in all by `nowMs` (a monotonic clock);
    /// true once it has stalled.
    mutating func observe(bytes: Int64, nowMs: Int64) -> Bool {
        // A sample at most every stepMs; the check below uses the bytes of now either way.
        if samples.last.map({ nowMs - $0.ms >= stepMs }) ?? true { samples.append((nowMs, bytes)) }
        let windowStart = nowMs - forMs
        var older = 0
        while older + 1 < samples.count && samples[older + 1].ms <= windowStart { older += 1 }
        if older > 0 { samples.removeFirst(older) }
        guard let start = samples.first, start.ms <= windowStart else { return false }
        return bytes - start.bytes < minimumBytes
    }

    /// The failure message of a stalled transfer.
    var message: String {
        "stalled: less than \(Units.formatBytes(Int64(belowBytesPerSecond)))/s over \(Units.formatDuration(ms: forMs))"
    }

    /// Forgets the samples: the transfer has not started moving bytes yet (still
    /// connecting), so no time counts against it.
    mutating func reset() {
        samples.removeAll(keepingCapacity: true)
    }
}
