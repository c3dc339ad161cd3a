import Glibc
import Synchronization

/// Named points where a debug build kills itself with SIGKILL when `OUTBOX_FAULT=name[:n]`
/// names the point (at its n-th pass, default the first), so crash tests choose where a
/// process dies. Release builds compile the check away.
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
    #endif

    /// Reads `OUTBOX_FAULT` now, on the main thread before any other starts: a lazy global first
    /// touched by two threads at once is ordered by the runtime's once, which ThreadSanitizer
    /// cannot see.
    package static func arm() {
        #if DEBUG
        _ = target
        _ = passes.load(ordering: .relaxed)
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
