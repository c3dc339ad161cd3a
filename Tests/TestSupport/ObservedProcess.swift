import Foundation

/// A process known by its pid and its start time. Once it is gone its pid may be given to
/// another process (a busy machine with many tests running goes through the pids in
/// seconds), which must not count as the first one still running.
package struct ObservedProcess: Sendable, Equatable {
    package let pid: Int32
    /// Field 22 of `/proc/PID/stat`: when it started, in clock ticks since boot.
    let startTime: String

    /// The process that has `pid` now; nil when none has.
    package init?(_ pid: Int32) {
        guard let stat = Self.stat(pid) else { return nil }
        self.pid = pid
        startTime = stat.startTime
    }

    /// Whether it has ended: gone, a zombie, or its pid another process's now.
    package var hasEnded: Bool {
        guard let now = Self.stat(pid), now.startTime == startTime else { return true }
        return now.state == "Z" || now.state == "X"
    }

    /// The state and start time of the process `pid` (the fields after the command name,
    /// which may itself hold spaces and parentheses).
    private static func stat(_ pid: Int32) -> (state: String, startTime: String)? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = text.lastIndex(of: ")")
        else { return nil }
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 19 else { return nil }
        return (String(fields[0]), String(fields[19]))
    }
}
