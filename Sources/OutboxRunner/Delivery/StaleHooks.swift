import CSystem
import Glibc
import OutboxModel
import OutboxProcess

/// Hooks left running by a runner that died. Each hook carries its outcome's token
/// (`OUTBOX_HOOK_TOKEN`): a recorded group is stopped only if its leader carries this store's
/// token, and a runner killed between starting a hook and recording its group leaves a hook
/// that is found by the token alone.
enum StaleHooks {
    /// Kills the groups whose leader (still running) was started with `name` set to one of
    /// `values`. A process of another group carrying the variable (a background child of a hook
    /// that exited, never recorded) is left alone. Returns the groups.
    static func stopLeaders(withVariable name: String, in values: Set<String>) -> [Int32] {
        guard !values.isEmpty, let names = Paths.list("/proc") else { return [] }
        var stopped: [Int32] = []
        for entry in names {
            // Only a group leader can be a hook as started; its environment is the one exec gave it.
            guard let pid = Int32(entry), pid > 1, pid != getpid(), getpgid(pid) == pid,
                let value = value(of: name, in: pid), values.contains(value)
            else { continue }
            var start: UInt64 = 0
            var group: Int32 = 0
            guard csystem_proc_stat(pid, &start, &group) == 0, ProcessRunner.killStaleGroup(pgid: pid, startTime: start) else {
                continue
            }
            stopped.append(pid)
        }
        return stopped
    }

    /// Kills what a recorded hook left running in its group after it exited (a background
    /// child): the members started with this store's token, no earlier than the leader. A pid
    /// is not reused while a group of that number has members, so these descend from the
    /// recorded hook; a leader's pid that another process holds now means the group is gone.
    /// Returns how many processes it stopped.
    static func stopRemains(ofGroup pgid: Int32, leaderStart: UInt64, store: String) -> Int {
        guard pgid > 1, pgid != getpgrp(), pgid != getpid() else { return 0 }
        var start: UInt64 = 0
        var group: Int32 = 0
        if csystem_proc_stat(pgid, &start, &group) == 0, start != leaderStart { return 0 }
        let prefix = HookEnvironment.tokenPrefix(store: store)
        var stopped = 0
        // Again while one is found: a member may have forked while the last pass ran.
        for _ in 0..<3 {
            var found = 0
            for entry in Paths.list("/proc") ?? [] {
                guard let pid = Int32(entry), pid > 1, pid != getpid(),
                    csystem_proc_stat(pid, &start, &group) == 0, group == pgid, start >= leaderStart,
                    value(of: HookEnvironment.tokenName, in: pid)?.hasPrefix(prefix) == true
                else { continue }
                if kill(pid: pid, startTime: start, group: pgid) { found += 1 }
            }
            stopped += found
            if found == 0 { break }
        }
        return stopped
    }

    /// Kills what plugins of this store left running when their outbox process was killed
    /// (the plugin's first process died with it, what that one started did not): processes
    /// that carry the plugin's `OUTBOX_PLUGIN_OWNER`, whose outbox process is gone, and that
    /// are still in a plugin's process group whose leader is gone, in the outbox process's
    /// session. One that left (a new group or session: a daemon) is left alone, as is an outbox
    /// process that inherited the variable. Returns the pids of those outbox processes.
    static func stopOrphanedPlugins(store: String) -> Set<Int32> {
        let prefix = HookEnvironment.tokenPrefix(store: store)
        let ownProgram = Paths.readLink("/proc/self/exe")
        var owners: Set<Int32> = []
        var start: UInt64 = 0
        var group: Int32 = 0
        for entry in Paths.list("/proc") ?? [] {
            guard let pid = Int32(entry), pid > 1, pid != getpid(),
                let value = value(of: HookEnvironment.pluginOwnerName, in: pid), value.hasPrefix(prefix)
            else { continue }
            let owner = value.dropFirst(prefix.count).split(separator: ":")
            guard owner.count == 3, let ownerPID = Int32(owner[0]), let ownerStart = UInt64(owner[1]), let ownerSession = Int32(owner[2])
            else { continue }
            // Its outbox process still runs (a live enqueue, another runner of a shared store).
            if csystem_proc_stat(ownerPID, &start, &group) == 0, start == ownerStart { continue }
            // Still in a plugin's group (whose leader, the plugin, is gone) in the owner's session.
            let pgid = getpgid(pid)
            guard pgid > 1, pgid != pid, getsid(pid) == ownerSession, !isAlive(pgid) else { continue }
            if let ownProgram, Paths.readLink("/proc/\(pid)/exe") == ownProgram { continue }
            guard csystem_proc_stat(pid, &start, &group) == 0, kill(pid: pid, startTime: start) else { continue }
            owners.insert(ownerPID)
        }
        return owners
    }

    /// Whether `pid` runs: there, and not a zombie (killed with its outbox process, a plugin
    /// may wait a moment for its reaper).
    private static func isAlive(_ pid: Int32) -> Bool {
        guard let stat = Paths.readBytes("/proc/\(pid)/stat"), let close = stat.lastIndex(of: UInt8(ascii: ")")),
            close + 2 < stat.count
        else { return false }
        return ![UInt8(ascii: "Z"), UInt8(ascii: "X")].contains(stat[close + 2])
    }

    /// SIGKILLs `pid` if it is still the process that started at `startTime`, and waits briefly
    /// for its end. The pidfd pins the pid: the process checked is the one signalled.
    private static func kill(pid: Int32, startTime: UInt64, group wanted: Int32? = nil) -> Bool {
        let pidfd = csystem_proc_pidfd_open(pid)
        guard pidfd >= 0 else { return false }
        defer { csystem_proc_close(pidfd) }
        var start: UInt64 = 0
        var group: Int32 = 0
        guard csystem_proc_stat(pid, &start, &group) == 0, start == startTime, wanted == nil || group == wanted else { return false }
        _ = csystem_proc_pidfd_signal(pidfd, SIGKILL)
        _ = csystem_proc_poll_readable(pidfd, 2000)
        return true
    }

    /// Whether a recorded group's leader is a hook of this store: a copy of the store folder
    /// (a backup restored beside the original) records the same groups, which are the
    /// original runner's to stop.
    static func isHook(_ pgid: Int32, ofStore store: String) -> Bool {
        value(of: HookEnvironment.tokenName, in: pgid)?.hasPrefix(HookEnvironment.tokenPrefix(store: store)) == true
    }

    /// The value a process was started with for `name`; nil when it has none or cannot be read.
    static func value(of name: String, in pid: Int32) -> String? {
        guard let environ = Paths.readBytes("/proc/\(pid)/environ") else { return nil }
        let prefix = Array((name + "=").utf8)
        guard let variable = environ.split(separator: 0).first(where: { $0.starts(with: prefix) }) else { return nil }
        return String(decoding: variable.dropFirst(prefix.count), as: UTF8.self)
    }
}
