import CSystem
import Glibc
import OutboxModel
import OutboxProcess

/// A runner records the process groups of the hooks it starts right after starting them; one
/// killed in that instant leaves hooks nobody recorded. Each hook carries its outcome's token
/// (`OUTBOX_HOOK_TOKEN`), by which the next runner finds and stops it before delivering again.
enum UnrecordedHooks {
    /// Kills the groups whose leader (still running) was started with `name` set to one of
    /// `values`. A process of another group carrying the variable (a background child of a hook
    /// that exited) is left alone, as a recorded group whose leader exited is. Returns the groups.
    static func stopLeaders(withVariable name: String, in values: Set<String>) -> [Int32] {
        guard !values.isEmpty, let names = Paths.list("/proc") else { return [] }
        let prefix = Array((name + "=").utf8)
        var stopped: [Int32] = []
        for entry in names {
            // Only a group leader can be a hook as started; its environment is the one exec gave it.
            guard let pid = Int32(entry), pid > 1, pid != getpid(), getpgid(pid) == pid,
                let environ = Paths.readBytes("/proc/\(entry)/environ")
            else { continue }
            let carries = environ.split(separator: 0).contains { variable in
                variable.starts(with: prefix) && values.contains(String(decoding: variable.dropFirst(prefix.count), as: UTF8.self))
            }
            var start: UInt64 = 0
            var group: Int32 = 0
            guard carries, csystem_proc_stat(pid, &start, &group) == 0,
                ProcessRunner.killStaleGroup(pgid: pid, startTime: start)
            else { continue }
            stopped.append(pid)
        }
        return stopped
    }
}
