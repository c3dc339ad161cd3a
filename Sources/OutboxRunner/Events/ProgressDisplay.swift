import CSystem
import OutboxModel
import OutboxStore

/// The live display of `outbox run` on a terminal: entries done of total, bytes
/// accepted of total, rate and ETA, redrawn on one line at most four times a second.
///
/// It learns from the runner's own events (state and progress) and from the store's totals
/// of what is not settled yet, read at most once a second so a large queue costs nothing.
final class ProgressDisplay {
    /// What one line shows.
    struct Snapshot: Equatable {
        var doneEntries = 0
        var totalEntries = 0
        var acceptedBytes: Int64 = 0
        var totalBytes: Int64 = 0
        /// Bytes per second on the wire over the last seconds; nil until there is a measure.
        var rate: Int64?
        /// Bytes still to send (not accepted and not in flight).
        var remainingBytes: Int64 = 0
        var running = 0
        var retried = 0
        var errors = 0
    }

    private let write: (String) -> Void
    private let totals: () -> PendingTotals?
    private let clock: () -> Int64
    /// The terminal's width, read at each draw (a window may be resized); 0 when unknown.
    private let columns: () -> Int
    private var pending = PendingTotals(entries: 0, bytes: 0, acceptedBytes: 0)
    private var lastRefresh: Int64 = .min
    private var lastDraw: Int64 = .min
    private var doneEntries = 0
    private var completedBytes: Int64 = 0
    /// Entries sending now: bytes sent and accepted from their latest progress event.
    private var live: [String: (sent: Int64, accepted: Int64)] = [:]
    /// Every byte seen leaving, re-sends included: the rate is measured on it.
    private var wireBytes: Int64 = 0
    private var samples: [(at: Int64, bytes: Int64)] = []
    private var drewSomething = false

    static let redrawMs: Int64 = 250
    static let refreshMs: Int64 = 1000
    static let rateWindowMs: Int64 = 10_000

    init(
        write: @escaping (String) -> Void, totals: @escaping () -> PendingTotals?,
        clock: @escaping () -> Int64 = { Identifiers.monotonicMs() },
        columns: @escaping () -> Int = { Int(csystem_terminal_columns(2)) }
    ) {
        self.write = write
        self.totals = totals
        self.clock = clock
        self.columns = columns
    }

    /// Takes in one runner event (state or progress); other events are ignored.
    func observe(_ event: JSON) {
        guard let id = event["id"]?.stringValue else { return }
        switch event["type"]?.stringValue {
        case "progress":
            let sent = event["bytes_sent"]?.int64Value ?? 0
            let accepted = event["bytes_accepted"]?.int64Value ?? 0
            let previous = live[id]?.sent ?? 0
            if sent > previous { wireBytes += sent - previous }
            live[id] = (sent, accepted)
        case "state":
            guard let state = event["state"]?.stringValue.flatMap(EntryState.init(rawValue:)), state != .running else { return }
            let accepted = live.removeValue(forKey: id)?.accepted ?? 0
            guard state.isSettled else { return }
            let total = event["total_bytes"]?.int64Value ?? 0
            doneEntries += 1
            if state == .completed { completedBytes += total }
            // Until the next refresh, the store's totals still count this entry as pending.
            pending.entries = max(0, pending.entries - 1)
            pending.bytes = max(0, pending.bytes - total)
            pending.acceptedBytes = max(0, pending.acceptedBytes - accepted)
        default:
            return
        }
    }

    /// Redraws the line when it is due.
    func draw(summary: RunSummary, flights: Int, running: Int) {
        let now = clock()
        guard lastDraw == .min || now - lastDraw >= Self.redrawMs else { return }
        lastDraw = now
        if lastRefresh == .min || now - lastRefresh >= Self.refreshMs {
            lastRefresh = now
            if let fresh = totals() { pending = fresh }
        }
        samples.append((now, wireBytes))
        while let first = samples.first, now - first.at > Self.rateWindowMs { samples.removeFirst() }
        var rate: Int64?
        if let first = samples.first, now - first.at >= 1000 {
            rate = (wireBytes - first.bytes) * 1000 / (now - first.at)
        }
        let inFlight = live.values.reduce(Int64(0)) { $0 + max(0, $1.sent - $1.accepted) }
        let accepted = completedBytes + pending.acceptedBytes
        let total = completedBytes + pending.bytes
        let snapshot = Snapshot(
            doneEntries: doneEntries, totalEntries: doneEntries + pending.entries, acceptedBytes: accepted,
            totalBytes: total, rate: rate, remainingBytes: max(0, total - accepted - inFlight), running: running,
            retried: summary.retried, errors: summary.errors)
        write(LiveLine.clearing + Self.fitted(Self.line(snapshot), columns: columns()))
        drewSomething = true
    }

    /// Clears the line so the summary prints on a clean one.
    func finish() {
        if drewSomething { write(LiveLine.clearing) }
    }

    /// Clears the line before another line is written (a log line), and lets the next
    /// `draw` come at once, below it.
    func clear() {
        guard drewSomething else { return }
        write(LiveLine.clearing)
        drewSomething = false
        lastDraw = .min
    }

    /// The text of the line, e.g. `3/10 entries · 1.2 GiB of 4 GiB · 80 MiB/s · ETA 35s · 2 running`.
    /// Entries that carry no bytes (requests without bodies) show no bytes, rate or ETA.
    static func line(_ s: Snapshot) -> String {
        var pieces = ["\(s.doneEntries)/\(s.totalEntries) entries"]
        if s.totalBytes > 0 {
            pieces.append("\(Units.formatBytes(s.acceptedBytes)) of \(Units.formatBytes(s.totalBytes))")
            if let rate = s.rate { pieces.append("\(Units.formatBytes(rate))/s") }
            pieces.append("ETA \(eta(s))")
        }
        pieces.append("\(s.running) running")
        if s.retried > 0 { pieces.append("\(s.retried) retried") }
        if s.errors > 0 { pieces.append("\(s.errors) error\(s.errors == 1 ? "" : "s")") }
        return pieces.joined(separator: " · ")
    }

    /// The line cut to one column less than the terminal: a line that wraps leaves a copy of
    /// itself on the row above at each redraw, which clears only its own row.
    static func fitted(_ line: String, columns: Int) -> String {
        guard columns > 1, line.count >= columns else { return line }
        return String(line.prefix(columns - 2)) + "…"
    }

    private static func eta(_ s: Snapshot) -> String {
        guard let rate = s.rate else { return "--" }
        // Every byte sent and some not yet accepted: when the answers come is not the rate's to say.
        if s.remainingBytes == 0 { return s.acceptedBytes < s.totalBytes ? "--" : "0s" }
        return rate > 0 ? Units.formatDuration(ms: s.remainingBytes * 1000 / rate) : "--"
    }
}

/// The live line on stderr as the threads writing there share it: the runner draws it, and
/// a line logged from any thread (the events plugin's output is logged from the sink's)
/// clears what is drawn first, so it never runs on after the line's text.
package final class LiveLine: Sendable {
    static let clearing = "\r\u{1B}[2K"
    /// Whether the last thing written was a drawn line, not yet cleared.
    private let drawn = Locked(false)
    private let write: @Sendable (String) -> Void

    package init(write: @escaping @Sendable (String) -> Void) { self.write = write }

    /// What `ProgressDisplay` writes: a line to draw, or the clearing of the last one.
    package func draw(_ text: String) {
        drawn.withLock { drawn in
            write(text)
            drawn = !text.hasSuffix(Self.clearing)
        }
    }

    /// Runs `log` (which writes one whole line) on a row of its own.
    package func logging(_ log: () -> Void) {
        drawn.withLock { drawn in
            if drawn { write(Self.clearing) }
            drawn = false
            log()
        }
    }
}
