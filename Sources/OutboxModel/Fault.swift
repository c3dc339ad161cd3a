import Glibc
import Synchronization

/// Named points where a debug build kills itself with SIGKILL when `OUTBOX_FAULT=name[:n]`
/// names the point (at its n-th pass, default the first), so crash tests choose where a
/// process dies, and `OUTBOX_FAULT_HOLD=name:path` where one waits while a test acts
/// (`hold`). Release builds compile the checks away.
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
