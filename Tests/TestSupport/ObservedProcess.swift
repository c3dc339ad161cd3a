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

    /// The process started as `pid` at `startTime` (clock ticks since boot, as the process
    /// runner reports it), whether or not it still runs.
    package init(pid: Int32, startTime: UInt64) {
        self.pid = pid
        self.startTime = String(startTime)
    }

    /// Shell text that writes the last background process's pid and start time to `file`,
    /// for `init(recorded:)`: a script's child is then known even after it ended.
    package static func recordLastBackground(to file: String) -> String {
        // No double quotes: the text goes inside YAML's double-quoted strings too.
        "echo $! $(cut -d' ' -f22 /proc/$!/stat) > \(file)"
    }

    /// The process whose pid and start time a script wrote (`recordLastBackground`).
    package init?(recorded text: String) {
        let fields = text.split(whereSeparator: \.isWhitespace)
        guard fields.count == 2, let pid = Int32(fields[0]), let start = UInt64(fields[1]) else { return nil }
        self.init(pid: pid, startTime: start)
    }

    /// Whether it has ended: gone, a zombie, or its pid another process's now.
    package var hasEnded: Bool {
        guard let now = Self.stat(pid), now.startTime == startTime else { return true }
        return now.state == "Z" || now.state == "X"
    }

    /// The state and start time of the process `pid`.
    private static func stat(_ pid: Int32) -> (state: String, startTime: String)? {
        guard let fields = procStatFields(pid), fields.count > 19 else { return nil }
        return (fields[0], fields[19])
    }
}

/// Fields of /proc/PID/stat after the command name (which may itself hold spaces and
/// parentheses): index 0 is field 3 (state), index 19 field 22 (start time).
package func procStatFields(_ pid: Int32) -> [String]? {
    guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/stat") else { return nil }
    let line = String(decoding: data, as: UTF8.self)
    guard let close = line.lastIndex(of: ")") else { return nil }
    return line[line.index(after: close)...].split(separator: " ").map(String.init)
}
