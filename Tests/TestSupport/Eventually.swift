import Foundation
import Testing

/// How much longer than usual every test deadline is: `OUTBOX_TEST_TIME_SCALE` (1 when
/// unset), set by the sanitizer runs of `.ci/extended`, where everything runs many times slower.
package let testTimeScale: Double = {
    let value = Double(ProcessInfo.processInfo.environment["OUTBOX_TEST_TIME_SCALE"] ?? "") ?? 1
    return max(1, value)
}()

/// Polls `condition` until it holds, 10 ms apart at first and up to 100 ms apart later (a
/// condition that runs a command would otherwise load a busy machine further); after
/// `timeout` seconds records an issue naming `what` and returns false. Waiting is never an
/// assertion on speed: the deadline is generous, and the condition is checked once more
/// after it (a starved caller still sees the truth).
@discardableResult
package func eventually(
    _ what: @autoclosure () -> String = "the condition", timeout: Double = 120,
    sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: () async throws -> Bool
) async rethrows -> Bool {
    let timeout = timeout * testTimeScale
    let deadline = Date().addingTimeInterval(timeout)
    var pause: UInt64 = 10_000_000
    while Date() < deadline {
        if try await condition() { return true }
        try? await Task.sleep(nanoseconds: pause)
        pause = min(pause * 2, 100_000_000)
    }
    if try await condition() { return true }
    Issue.record("timed out after \(Int(timeout)) s waiting for \(what())", sourceLocation: sourceLocation)
    return false
}

/// `eventually` for synchronous tests: runs `attempt` again, 10 ms apart, until `done` holds
/// of its result or `timeout` seconds pass, and returns the last result (the test asserts on
/// it). For a state another process holds for a moment, such as a lock a freshly forked
/// child still has until it closes its descriptors.
package func retried<T>(timeout: Double = 120, _ attempt: () throws -> T, until done: (T) -> Bool) rethrows -> T {
    let deadline = Date().addingTimeInterval(timeout * testTimeScale)
    var result = try attempt()
    while !done(result) && Date() < deadline {
        usleep(10_000)
        result = try attempt()
    }
    return result
}

/// Runs blocking or CPU-heavy work (hashing a GiB, waiting on a child) on a thread of its own.
///
/// Swift Testing runs tests on the cooperative pool, which has 2 threads on a 2-core machine:
/// a test that blocks one starves every other test of the run.
package func offload<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let thread = Thread { continuation.resume(with: Result { try work() }) }
        thread.stackSize = 8 << 20
        thread.start()
    }
}

/// Config for a test that holds a request on the server while it looks at something slow:
/// neither the stall limit nor the lease gives the request up first, however busy the machine.
package let heldRequestConfig = "lease: 1h\ntimeouts:\n  stall:\n    for: 1h\n"
