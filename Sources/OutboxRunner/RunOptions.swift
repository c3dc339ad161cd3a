import OutboxModel

public enum ProgressMode: String, Sendable { case auto, always, never }

/// How `outbox run` runs: the flags of the command.
public struct RunOptions: Sendable {
    public var drain = false
    public var horizonMs: Int64 = 10_000
    public var maxTimeMs: Int64?
    public var graceMs: Int64 = 30_000
    public var progress: ProgressMode = .auto
    public var stderrIsTerminal = false
    /// How many times a stop was requested so far (the CLI counts SIGINT and SIGTERM):
    /// the first drains, the second stops at once.
    public var stopRequests: @Sendable () -> Int = { 0 }
    public init() {}
}

/// What a run did, for the one-line summary and `--json`.
public struct RunSummary: Sendable {
    public var attempts = 0
    public var completed = 0
    public var errors = 0
    public var retried = 0
    public var parked = 0
    public var cancelled = 0
    public var delivered = 0
    public var deliveryFailures = 0
    public var bytesSent: Int64 = 0
    public var elapsedMs: Int64 = 0
    public var remaining = 0

    public var json: JSON {
        .object([
            ("attempts", .int(attempts)), ("completed", .int(completed)), ("errors", .int(errors)), ("retried", .int(retried)),
            ("awaiting_auth", .int(parked)), ("cancelled", .int(cancelled)), ("delivered", .int(delivered)),
            ("delivery_failures", .int(deliveryFailures)), ("bytes_sent", .int64(bytesSent)), ("elapsed_ms", .int64(elapsedMs)),
            ("remaining", .int(remaining)),
        ])
    }

    public var line: String {
        "outbox: \(completed) completed, \(errors) error, \(retried) retried, \(parked) awaiting-auth, \(delivered) delivered"
            + (deliveryFailures > 0 ? " (\(deliveryFailures) hook failures)" : "")
            + ", \(remaining) left, \(attempts) attempts in \(Units.formatDuration(ms: elapsedMs))"
    }
}
