@testable import OutboxRunner
import Testing

/// How a run stops, step by step: the first request drains, the deadline or a second
/// request aborts, `--max-time` drains like a first request (the next request aborts).
struct ShutdownTests {
    struct Step: Sendable {
        let at: Int64
        let requests: Int
        let actions: [Shutdown.Action]
        let phase: Shutdown.Phase
    }

    struct Case: Sendable, CustomTestStringConvertible {
        let name: String
        var maxTimeMs: Int64?
        let steps: [Step]
        var testDescription: String { name }
    }

    static let stopping = "outbox: stopping; attempts in flight may finish within 30s (signal again to stop now)"
    /// Two requests at once (SIGQUIT, or two signals in one turn): no grace is offered.
    static let stoppingNow = "outbox: stopping now; attempts in flight are stopped"
    static let maxTime = "outbox: --max-time reached; attempts in flight may finish within 30s (signal to stop now)"

    static let cases: [Case] = [
        Case(
            name: "no request: it runs",
            steps: [
                Step(at: 0, requests: 0, actions: [], phase: .running),
                Step(at: 999_999, requests: 0, actions: [], phase: .running),
            ]),
        Case(
            name: "one request drains until the grace deadline, then aborts",
            steps: [
                Step(at: 10, requests: 1, actions: [.log(stopping), .abortStandby], phase: .draining(deadline: 30_010)),
                Step(at: 20, requests: 1, actions: [.abortStandby], phase: .draining(deadline: 30_010)),
                Step(at: 30_010, requests: 1, actions: [.abortStandby, .abortInFlight], phase: .aborting),
                Step(at: 30_020, requests: 1, actions: [.abortStandby], phase: .aborting),
            ]),
        Case(
            name: "a second request aborts at once",
            steps: [
                Step(at: 10, requests: 1, actions: [.log(stopping), .abortStandby], phase: .draining(deadline: 30_010)),
                Step(at: 11, requests: 2, actions: [.abortStandby, .abortInFlight], phase: .aborting),
            ]),
        Case(
            name: "two requests seen in one turn drain and abort in that turn",
            steps: [
                Step(at: 5, requests: 2, actions: [.log(stoppingNow), .abortStandby, .abortInFlight], phase: .aborting)
            ]),
        Case(
            name: "--max-time drains like a first request: the next one aborts", maxTimeMs: 1000,
            steps: [
                Step(at: 999, requests: 0, actions: [], phase: .running),
                Step(at: 1000, requests: 0, actions: [.log(maxTime), .abortStandby], phase: .draining(deadline: 31_000)),
                Step(at: 1001, requests: 0, actions: [.abortStandby], phase: .draining(deadline: 31_000)),
                Step(at: 1002, requests: 1, actions: [.abortStandby, .abortInFlight], phase: .aborting),
            ]),
        Case(
            name: "--max-time after a request: the drain it began goes on", maxTimeMs: 1000,
            steps: [
                Step(at: 500, requests: 1, actions: [.log(stopping), .abortStandby], phase: .draining(deadline: 30_500)),
                Step(at: 1000, requests: 1, actions: [.abortStandby], phase: .draining(deadline: 30_500)),
                Step(at: 1001, requests: 2, actions: [.abortStandby, .abortInFlight], phase: .aborting),
            ]),
        Case(
            name: "--max-time with a request in the same turn: one more aborts", maxTimeMs: 1000,
            steps: [
                Step(at: 1000, requests: 1, actions: [.log(maxTime), .abortStandby], phase: .draining(deadline: 31_000)),
                Step(at: 1001, requests: 1, actions: [.abortStandby], phase: .draining(deadline: 31_000)),
                Step(at: 1002, requests: 2, actions: [.abortStandby, .abortInFlight], phase: .aborting),
            ]),
    ]

    @Test(arguments: cases)
    func steps(_ c: Case) {
        var shutdown = Shutdown(startedAt: 0, graceMs: 30_000, maxTimeMs: c.maxTimeMs)
        for step in c.steps {
            #expect(shutdown.step(now: step.at, stopRequests: step.requests) == step.actions, "at \(step.at)")
            #expect(shutdown.phase == step.phase, "at \(step.at)")
        }
    }

    @Test(
        arguments: [
            (Shutdown.Phase.running, false, false, false),
            (.draining(deadline: 1), true, false, false),
            (.draining(deadline: 1), false, true, false),
            (.draining(deadline: 1), false, false, true),
            (.aborting, true, false, false),
            (.aborting, false, true, true),
        ] as [(Shutdown.Phase, Bool, Bool, Bool)])
    func theLoopEndsWhenNothingIsInFlight(phase: Shutdown.Phase, transfers: Bool, hooks: Bool, exits: Bool) {
        var shutdown = Shutdown(startedAt: 0, graceMs: 1, maxTimeMs: nil)
        switch phase {
        case .running: break
        case .draining: _ = shutdown.step(now: 0, stopRequests: 1)
        case .aborting: _ = shutdown.step(now: 0, stopRequests: 2)
        }
        // A hook still running keeps a drain going; an abort leaves it to be delivered again.
        #expect(shutdown.mayExit(transfersInFlight: transfers, hooksRunning: hooks) == exits)
    }
}
