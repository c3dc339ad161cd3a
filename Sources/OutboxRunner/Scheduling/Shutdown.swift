import OutboxModel

/// How a run stops: running → draining (attempts in flight may finish until a deadline;
/// nothing new starts) → aborting (what is still in flight is cut off). The first stop
/// request or `--max-time` starts the drain; a request after that one, or the deadline, aborts.
/// Graceful shutdown is not cancellation: a drain loses no work, an abort puts what it cut
/// off back in the queue.
///
/// A pure value driven by the loop each turn with the monotonic clock and the number of
/// stop requests so far (the CLI counts SIGINT and SIGTERM; the library installs no handler).
struct Shutdown: Equatable {
    enum Phase: Equatable {
        case running
        case draining(deadline: Int64)
        case aborting
    }

    enum Action: Equatable {
        case log(String)
        /// Withdraw standby transfers: what has not started stays in the queue.
        case abortStandby
        /// Cut off every transfer in flight.
        case abortInFlight
    }

    let startedAt: Int64
    let graceMs: Int64
    let maxTimeMs: Int64?
    private(set) var phase = Phase.running
    /// The stop requests the drain began with (a first one; none after `--max-time`): one more aborts.
    private var requestsAtDrain = 0

    init(startedAt: Int64, graceMs: Int64, maxTimeMs: Int64?) {
        self.startedAt = startedAt
        self.graceMs = graceMs
        self.maxTimeMs = maxTimeMs
    }

    var isStopping: Bool { phase != .running }

    /// Advances with the clock and the stop requests seen so far; returns what to do now.
    mutating func step(now: Int64, stopRequests: Int) -> [Action] {
        var actions: [Action] = []
        if phase == .running {
            if let maxTimeMs, now - startedAt >= maxTimeMs {
                phase = .draining(deadline: now + graceMs)
                requestsAtDrain = min(stopRequests, 1)
                actions.append(
                    .log(
                        "outbox: --max-time reached; attempts in flight may finish within \(Units.formatDuration(ms: graceMs)) (signal to stop now)"
                    ))
            } else if stopRequests >= 1 {
                phase = .draining(deadline: now + graceMs)
                requestsAtDrain = 1
                // SIGQUIT counts as two requests: it stops at once, below.
                actions.append(
                    .log(
                        stopRequests > 1
                            ? "outbox: stopping now; attempts in flight are stopped"
                            : "outbox: stopping; attempts in flight may finish within \(Units.formatDuration(ms: graceMs)) (signal again to stop now)"
                    ))
            }
        }
        guard isStopping else { return actions }
        // Every turn: a standby transfer the curl thread queued meanwhile is withdrawn too.
        actions.append(.abortStandby)
        if case let .draining(deadline) = phase, stopRequests > requestsAtDrain || now >= deadline {
            phase = .aborting
            actions.append(.abortInFlight)
        }
        return actions
    }

    /// Whether the loop may end: nothing in flight, and no hook running unless aborting
    /// (an aborted run leaves a running hook's outcome to be delivered again).
    func mayExit(transfersInFlight: Bool, hooksRunning: Bool) -> Bool {
        isStopping && !transfersInFlight && (!hooksRunning || phase == .aborting)
    }
}
