import Glibc
import OutboxModel

package enum ProgressMode: String, Sendable { case auto, always, never }

/// How `outbox run` runs: the flags of the command.
package struct RunOptions: Sendable {
    package var drain = false
    package var horizonMs: Int64 = 10_000
    package var maxTimeMs: Int64?
    package var graceMs: Int64 = 30_000
    /// `--concurrency`, `--per-host`, `--part-concurrency`: above the config's, also after a reload.
    package var limits = LimitOverrides()
    package var progress: ProgressMode = .auto
    package var stderrIsTerminal = false
    /// `--events -` writes to a terminal: the events are the display.
    package var eventsToTerminal = false
    /// How many times a stop was requested so far (the CLI counts SIGINT and SIGTERM):
    /// the first drains, the second stops at once.
    package var stopRequests: @Sendable () -> Int = { 0 }
    /// How many times a reload of config and definitions was requested (SIGHUP).
    package var reloadRequests: @Sendable () -> Int = { 0 }
    /// The service manager to tell when the run is stopping and that it is alive (systemd).
    package var notifier: SystemdNotifier?
    /// Where the live display is drawn (stderr; the CLI passes its own, which a stalled terminal
    /// holds only until a stop, as it does the log).
    package var drawProgress: @Sendable (String) -> Void = { text in _ = text.withCString { write(2, $0, strlen($0)) } }
    package init() {}

    /// Whether the live progress line is drawn: on a terminal, unless the events go to it too
    /// (the line would run into them), or when asked for.
    package var showsProgress: Bool {
        progress == .always || (progress == .auto && stderrIsTerminal && !eventsToTerminal)
    }
}

/// Limits given as flags, which win over the config file and the environment.
package struct LimitOverrides: Sendable {
    package var concurrency: Int?
    package var perHost: Int?
    package var partConcurrency: Int?
    package init() {}

    package func apply(to config: inout Config) {
        if let concurrency { config.concurrency = concurrency }
        if let perHost { config.perHost = perHost }
        if let partConcurrency { config.partConcurrency = partConcurrency }
    }
}

/// What a run did, for the one-line summary and `--json`.
package struct RunSummary: Sendable {
    package var attempts = 0
    package var completed = 0
    package var errors = 0
    package var retried = 0
    /// Entries completed without an upload: their object was already there (`skip_existing`).
    package var skipped = 0
    package var parked = 0
    package var cancelled = 0
    package var delivered = 0
    package var deliveryFailures = 0
    package var bytesSent: Int64 = 0
    package var elapsedMs: Int64 = 0
    package var remaining = 0
    /// Entries that settled error in this run.
    package var erroredIDs: [String] = []
    /// Entries parked awaiting-auth during the run (sent again after an auth refresh or not),
    /// and those left so at its end.
    package var awaitingAuthIDs: [String] = []
    /// Entries whose hook delivery failed during the run, delivered later in it or not.
    package var undeliveredIDs: [String] = []
    /// Entries whose outcome's `then` follow-ups could not be built (a template error): none
    /// of them was enqueued.
    package var unbuiltFollowUpIDs: [String] = []

    /// Bits of the exit status of `run --drain`, so cron and systemd see what failed.
    package typealias Failure = DrainFailure

    /// 0 only when nothing failed in the run; otherwise the sum of the `Failure` bits.
    package var failureStatus: Int32 {
        (erroredIDs.isEmpty ? 0 : Failure.settledError.rawValue) | (awaitingAuthIDs.isEmpty ? 0 : Failure.awaitingAuth.rawValue)
            | (undeliveredIDs.isEmpty && unbuiltFollowUpIDs.isEmpty ? 0 : Failure.hookFailed.rawValue)
    }

    package var json: JSON {
        .object([
            ("attempts", .int(attempts)), ("completed", .int(completed)), ("errors", .int(errors)), ("retried", .int(retried)),
            ("skipped", .int(skipped)), ("awaiting_auth", .int(parked)), ("cancelled", .int(cancelled)), ("delivered", .int(delivered)),
            ("delivery_failures", .int(deliveryFailures)), ("bytes_sent", .int64(bytesSent)), ("elapsed_ms", .int64(elapsedMs)),
            ("remaining", .int(remaining)),
            (
                "failed",
                .object([
                    ("error", .array(erroredIDs.prefix(1000).map { .string($0) })),
                    ("awaiting_auth", .array(awaitingAuthIDs.prefix(1000).map { .string($0) })),
                    ("hook_failures", .array(undeliveredIDs.prefix(1000).map { .string($0) })),
                    ("follow_up_failures", .array(unbuiltFollowUpIDs.prefix(1000).map { .string($0) })),
                ])
            ),
            ("failure_status", .int(Int(failureStatus))),
        ])
    }

    package var line: String {
        "outbox: \(completed) completed\(skipped > 0 ? " (\(skipped) skipped)" : ""), \(errors) error, \(retried) retried, \(parked) awaiting-auth"
            + (cancelled > 0 ? ", \(cancelled) cancelled" : "") + ", \(delivered) delivered"
            + (deliveryFailures > 0 ? " (\(deliveryFailures) failed deliver\(deliveryFailures == 1 ? "y" : "ies"))" : "")
            + ", \(remaining) left, \(attempts) attempt\(attempts == 1 ? "" : "s") in \(Units.formatDuration(ms: elapsedMs))"
    }
}
