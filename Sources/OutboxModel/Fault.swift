import Glibc
import Synchronization

/// Named points where a debug build kills itself with SIGKILL when `OUTBOX_FAULT=name[:n]`
/// names the point (at its n-th pass, default the first), so crash tests choose where a
/// process dies, and `OUTBOX_FAULT_HOLD=name:path` where one waits while a test acts
/// (`hold`), and `OUTBOX_FAULT_FAIL=name:N` where code fails on purpose (`fails`). Release
/// builds compile the checks away.
package enum Fault {
    #if DEBUG
    private static let target: (name: String, at: Int)? = {
        guard let raw = getenv("OUTBOX_FAULT") else { return nil }
        let text = String(cString: raw)
        let parts = text.split(separator: ":", maxSplits: 1).map(String.init)
        guard let name = parts.first, !name.isEmpty else { return nil }
        return (name, parts.count > 1 ? max(1, Int(parts[1]) ?? 1) : 1)
    }()
    private static let passes = Atomic<Int>(0)
    /// `OUTBOX_FAULT_HOLD=NAME:PATH`: the point where `hold` waits, and the file it waits for.
    private static let holdTarget: (name: String, path: String)? = {
        guard let raw = getenv("OUTBOX_FAULT_HOLD") else { return nil }
        let parts = String(cString: raw).split(separator: ":", maxSplits: 1).map(String.init)
        guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty else { return nil }
        return (parts[0], parts[1])
    }()
    private static let held = Atomic<Bool>(false)
    /// `OUTBOX_FAULT_FAIL=NAME:N`: the point `fails` answers true at, for its first N passes.
    private static let failTarget: (name: String, count: Int)? = {
        guard let raw = getenv("OUTBOX_FAULT_FAIL") else { return nil }
        let parts = String(cString: raw).split(separator: ":", maxSplits: 1).map(String.init)
        guard let name = parts.first, !name.isEmpty else { return nil }
        return (name, parts.count > 1 ? max(1, Int(parts[1]) ?? 1) : 1)
    }()
    private static let failures = Atomic<Int>(0)
    #endif

    /// Reads `OUTBOX_FAULT` now, on the main thread before any other starts: a lazy global first
    /// touched by two threads at once is ordered by the runtime's once, which ThreadSanitizer
    /// cannot see.
    package static func arm() {
        #if DEBUG
        _ = target
        _ = passes.load(ordering: .relaxed)
        _ = holdTarget
        _ = held.load(ordering: .relaxed)
        _ = failTarget
        _ = failures.load(ordering: .relaxed)
        #endif
    }

    /// Whether the code at `name` fails on purpose now (debug builds), so tests reach what a
    /// failure only a system under pressure gives (no fds for a spawn) does.
    @inline(__always)
    package static func fails(_ name: String) -> Bool {
        #if DEBUG
        guard let failTarget, failTarget.name == name else { return false }
        return failures.add(1, ordering: .relaxed).newValue <= failTarget.count
        #else
        return false
        #endif
    }

    /// Holds the process the first time it passes `name` while a test acts between two of
    /// its steps (debug builds): writes PATH.reached, then waits until PATH exists.
    @inline(__always)
    package static func hold(_ name: String) {
        #if DEBUG
        guard let holdTarget, holdTarget.name == name, !held.exchange(true, ordering: .relaxed) else { return }
        close(open(holdTarget.path + ".reached", O_WRONLY | O_CREAT | O_CLOEXEC, 0o600))
        while access(holdTarget.path, F_OK) != 0 { usleep(5_000) }
        #endif
    }

    @inline(__always)
    package static func point(_ name: String) {
        #if DEBUG
        guard let target, target.name == name else { return }
        if passes.add(1, ordering: .relaxed).newValue == target.at { kill(getpid(), SIGKILL) }
        #endif
    }
}
