import OutboxModel

package enum ProgressMode: String, Sendable { case auto, always, never }

/// How `outbox run` runs: the flags of the command.
package struct RunOptions: Sendable {
    package var drain = false
    package var horizonMs: Int64 = 10_000
    package var maxTimeMs: Int64?
    package var graceMs: Int64 = 30_000
    package var progress: ProgressMode = .auto
    package var stderrIsTerminal = false
    /// How many times a stop was requested so far (the CLI counts SIGINT and SIGTERM):
    /// the first drains, the second stops at once.
    package var stopRequests: @Sendable () -> Int = { 0 }
    package init() {}
}

/// What a run did, for the one-line summary and `--json`.
package struct RunSummary: Sendable {
    package var attempts = 0
    package var completed = 0
    package var errors = 0
    package var retried = 0
    package var parked = 0
    package var cancelled = 0
    package var delivered = 0
    package var deliveryFailures = 0
    package var bytesSent: Int64 = 0
    package var elapsedMs: Int64 = 0
    package var remaining = 0

    package var json: JSON {
        .object([
            ("attempts", .int(attempts)), ("completed", .int(completed)), ("errors", .int(errors)), ("retried", .int(retried)),
            ("awaiting_auth", .int(parked)), ("cancelled", .int(cancelled)), ("delivered", .int(delivered)),
            ("delivery_failures", .int(deliveryFailures)), ("bytes_sent", .int64(bytesSent)), ("elapsed_ms", .int64(elapsedMs)),
            ("remaining", .int(remaining)),
        ])
    }

    package var line: String {
        "outbox: \(completed) completed, \(errors) error, \(retried) retried, \(parked) awaiting-auth, \(delivered) delivered"
            + (deliveryFailures > 0 ? " (\(deliveryFailures) hook failures)" : "")
            + ", \(remaining) left, \(attempts) attempts in \(Units.formatDuration(ms: elapsedMs))"
    }
}
