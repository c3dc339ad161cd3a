import CSystem
import Glibc

/// The first `cap` bytes of one output stream; the rest is read and dropped, because closing
/// the pipe early would SIGPIPE the hook into a failure.
struct CappedOutput {
    var fd: Int32
    let cap: Int
    var bytes: [UInt8] = []
    var truncated = false

    init(fd: Int32, cap: Int) {
        self.fd = fd
        self.cap = max(0, cap)
    }

    var isOpen: Bool { fd >= 0 }

    mutating func close() {
        csystem_proc_close(fd)
        fd = -1
    }

    /// Reads what is available now; closes on EOF or error.
    mutating func readAvailable(into buffer: UnsafeMutableRawBufferPointer) {
        // Bounded, so a writer as fast as we read cannot starve the other fds and timers.
        for _ in 0..<8 where isOpen {
            let n = csystem_proc_read(fd, buffer.baseAddress, buffer.count)
            if n > 0 {
                let keep = min(n, cap - bytes.count)
                if keep > 0 {
                    bytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[0..<keep]))
                }
                if n > keep { truncated = true }
                if n < buffer.count { return }
            } else if n == 0 || n != -Int(EAGAIN) {
                close()
            } else {
                return
            }
        }
    }
}

/// One running child: feeds stdin, collects output, enforces warn/timeout, and decides
/// completion on the child's exit rather than on pipe EOF (a background grandchild may
/// keep the pipes open).
struct ChildSession {
    let pid: Int32
    var pidfd: Int32
    var stdinFD: Int32
    let input: [UInt8]
    var inputOffset = 0
    var stdout: CappedOutput
    var stderr: CappedOutput
    let spec: ProcessSpec

    var warnAt: Int64?
    var timeoutAt: Int64?
    var killAt: Int64?
    var timedOut = false
    /// Stopped because stdout passed its cap (`stopWhenStdoutOverflows`).
    var stoppedForOutput = false
    /// Killed because the waiting thread must stop at once (`Heartbeat.abandon`).
    var abandoned = false
    var exitStatus: Int32?
    var signal: Int32?
    var exited = false
    /// The leader exited after a stop began and is left unreaped until the grace ends: the
    /// zombie keeps the group id pinned while the rest of the group (a shell's child, often
    /// the real hook) gets the time SIGTERM promises to clean up.
    var leaderAwaitsGrace = false
    var drainUntil: Int64 = 0
    /// Reaped and every fd closed: `result` is final.
    var finished = false

    init(child: csystem_child, spec: ProcessSpec, spawnedAt start: Int64) {
        pid = child.pid
        pidfd = child.pidfd
        stdinFD = child.stdin_fd
        input = spec.stdin
        // The spawn wrote what the pipe held, and closed it when that was all (an empty input too).
        inputOffset = min(Int(child.stdin_written), input.count)
        stdout = CappedOutput(fd: child.stdout_fd, cap: spec.outputCap)
        stderr = CappedOutput(fd: child.stderr_fd, cap: spec.outputCap)
        self.spec = spec
        if let warn = spec.warnAfterMs, spec.onWarn != nil { warnAt = start + Int64(max(0, warn)) }
        if let timeout = spec.timeoutMs { timeoutAt = start + Int64(max(0, timeout)) }
    }

    /// Runs the child to its end on the calling thread, which blocks until then.
    mutating func runToCompletion() -> ProcessResult {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65536, alignment: 16)
        defer { buffer.deallocate() }
        var fds: [pollfd] = []
        let heartbeat = spec.heartbeat.flatMap { $0.isOnOwnerThread ? $0 : nil }
        var beatAt = csystem_proc_now_ms() + (heartbeat?.everyMs ?? 0)
        while true {
            var now = csystem_proc_now_ms()
            if let heartbeat, now >= beatAt {
                heartbeat.beat()
                now = csystem_proc_now_ms()
                beatAt = now + heartbeat.everyMs
            }
            // A signal that ends this process (recorded while a plugin runs), or the caller
            // stopping at once: no grace, and what it waited for is not used.
            if !abandoned, !exited, csystem_stop_pending() != 0 || heartbeat?.abandon?() == true {
                abandoned = true
                signalGroup(SIGKILL)
            }
            advance(now: now, buffer: buffer)
            if finished { break }
            fds.removeAll(keepingCapacity: true)
            let slots = appendPollFDs(to: &fds)
            var timeout = pollTimeout(now: now)
            // Looked at again at least this often: the stop checks above, and the heartbeat.
            let untilCheck = min(heartbeat == nil ? Int64.max : max(0, beatAt - now), Heartbeat.abandonCheckMs)
            timeout = timeout < 0 ? Int32(clamping: untilCheck) : min(timeout, Int32(clamping: untilCheck))
            let ready = fds.withUnsafeMutableBufferPointer {
                csystem_proc_poll($0.baseAddress, UInt($0.count), timeout)
            }
            if ready < 0 { continue }  // EINTR: recompute timers
            handle(fds, slots: slots, buffer: buffer)
        }
        return result
    }

    /// Where a session's fds sit in a poll array (-1: not polled).
    struct Slots {
        var stdin = -1
        var stdout = -1
        var stderr = -1
        var pid = -1
    }

    /// Before each poll: fires due timers, and ends the session once the child is reaped and
    /// its pipes are at EOF or their drain time is over.
    mutating func advance(now: Int64, buffer: UnsafeMutableRawBufferPointer) {
        guard !finished else { return }
        if exited {
            if !stdout.isOpen && !stderr.isOpen {
                finish()
            } else if now >= drainUntil {
                // One last non-blocking read of what is already buffered, then give up.
                stdout.readAvailable(into: buffer)
                stderr.readAvailable(into: buffer)
                finish()
            }
        } else {
            fireTimers(now: now)
        }
    }

    /// Adds the fds this session waits on to `fds`.
    func appendPollFDs(to fds: inout [pollfd]) -> Slots {
        var slots = Slots()
        if stdinFD >= 0 {
            slots.stdin = fds.count
            fds.append(pollfd(fd: stdinFD, events: Int16(POLLOUT), revents: 0))
        }
        if stdout.isOpen {
            slots.stdout = fds.count
            fds.append(pollfd(fd: stdout.fd, events: Int16(POLLIN), revents: 0))
        }
        if stderr.isOpen {
            slots.stderr = fds.count
            fds.append(pollfd(fd: stderr.fd, events: Int16(POLLIN), revents: 0))
        }
        if !exited && !leaderAwaitsGrace && pidfd >= 0 {
            slots.pid = fds.count
            fds.append(pollfd(fd: pidfd, events: Int16(POLLIN), revents: 0))
        }
        return slots
    }

    /// After a poll: writes stdin, reads output, and reaps the child when its pidfd says it exited.
    mutating func handle(_ fds: [pollfd], slots: Slots, buffer: UnsafeMutableRawBufferPointer) {
        if slots.stdin >= 0 && fds[slots.stdin].revents != 0 { writeStdin() }
        if slots.stdout >= 0 && fds[slots.stdout].revents != 0 {
            stdout.readAvailable(into: buffer)
            if spec.stopWhenStdoutOverflows, stdout.truncated, !stoppedForOutput, !exited {
                stoppedForOutput = true
                stopGroup(now: csystem_proc_now_ms())
            }
        }
        if slots.stderr >= 0 && fds[slots.stderr].revents != 0 { stderr.readAvailable(into: buffer) }
        let leaderExited: Bool
        if slots.pid >= 0 {
            leaderExited = fds[slots.pid].revents != 0
        } else {
            // No pidfd (old kernel): poll the child's state on each short tick.
            leaderExited = !exited
        }
        if leaderExited, timedOut || stoppedForOutput, killAt != nil {
            leaderAwaitsGrace = true
        } else if leaderExited && reap(blocking: slots.pid >= 0) {
            markExited()
        }
    }

    private mutating func markExited() {
        exited = true
        closeStdin()
        drainUntil = csystem_proc_now_ms() + ProcessRunner.drainMs
    }

    /// Closes every fd; the result is final.
    mutating func finish() {
        stdout.close()
        stderr.close()
        closeStdin()
        csystem_proc_close(pidfd)
        pidfd = -1
        finished = true
    }

    var result: ProcessResult {
        var result = ProcessResult(
            pid: pid, exitStatus: exitStatus, signal: signal, timedOut: timedOut,
            stdout: stdout.bytes, stdoutTruncated: stdout.truncated,
            stderr: stderr.bytes, stderrTruncated: stderr.truncated)
        result.abandoned = abandoned
        return result
    }

    mutating func fireTimers(now: Int64) {
        if let at = warnAt, now >= at {
            warnAt = nil
            spec.onWarn?(pid)
        }
        if let at = timeoutAt, now >= at {
            timeoutAt = nil
            timedOut = true
            stopGroup(now: now)
        }
        // Every member gone (the hook obeyed the SIGTERM): the grace is over at once.
        if let at = killAt, now >= at || (leaderAwaitsGrace && csystem_proc_group_has_others(pid) == 0) {
            killAt = nil
            signalGroup(SIGKILL)
            // The leader is a zombie already: reaped now, as no pidfd event will come for it.
            if leaderAwaitsGrace, reap(blocking: true) { markExited() }
        }
    }

    func pollTimeout(now: Int64) -> Int32 {
        var next: Int64? = nil
        if exited {
            next = drainUntil
        } else {
            for deadline in [warnAt, timeoutAt, killAt].compactMap({ $0 }) {
                next = min(next ?? deadline, deadline)
            }
        }
        var wait: Int64 = next.map { max(0, $0 - now) } ?? -1
        if !exited && pidfd < 0 { wait = wait < 0 ? 20 : min(wait, 20) }
        // The zombie leader says nothing of its group: the group is looked at every 50 ms.
        if leaderAwaitsGrace { wait = wait < 0 ? 50 : min(wait, 50) }
        return Int32(clamping: wait)
    }

    /// SIGTERM to the group now, SIGKILL after the grace period.
    mutating func stopGroup(now: Int64) {
        signalGroup(SIGTERM)
        killAt = now + spec.killGraceMs
    }

    /// The child is not reaped yet, so its pid (= pgid) cannot have been reused.
    func signalGroup(_ sig: Int32) {
        if csystem_proc_killpg(pid, sig) != 0 {
            // The leader left its group (setsid/setpgid): still stop the leader itself.
            _ = csystem_proc_kill(pid, sig)
        }
    }

    /// waitpid on this pid only (`waitpid(-1)` would steal other children). True once reaped.
    mutating func reap(blocking: Bool) -> Bool {
        if (timedOut || stoppedForOutput || abandoned) && blocking {
            // Finish off group members that ignored SIGTERM while the zombie leader still
            // pins the group id.
            _ = csystem_proc_killpg(pid, SIGKILL)
        }
        if spec.stopGroupWhenLeaderFails || spec.stopGroupWhenLeaderExits {
            var code: Int32 = 0
            var sig: Int32 = -1
            // Peeked before the reap: the zombie leader still pins the group id.
            if csystem_proc_peek_exit(pid, &code, &sig) == 1, spec.stopGroupWhenLeaderExits || code != 0 || sig >= 0 {
                _ = csystem_proc_killpg(pid, SIGKILL)
            }
        }
        var code: Int32 = -1
        var sig: Int32 = -1
        let rc = csystem_proc_wait(pid, blocking ? 0 : 1, &code, &sig)
        if rc == 0 { return false }
        if rc < 0 {
            // ECHILD: someone else reaped it (a waitpid(-1) elsewhere); report as a crash.
            exitStatus = nil
            signal = nil
            return true
        }
        exitStatus = code >= 0 ? code : nil
        signal = sig >= 0 ? sig : nil
        return true
    }

    /// Writes as much stdin as the pipe takes; EPIPE means the hook stopped reading, which
    /// is not a failure.
    mutating func writeStdin() {
        while stdinFD >= 0 && inputOffset < input.count {
            let n = input.withUnsafeBytes { raw in
                csystem_proc_write(stdinFD, raw.baseAddress! + inputOffset, min(raw.count - inputOffset, 65536))
            }
            if n > 0 {
                inputOffset += n
            } else if n == -Int(EAGAIN) {
                return
            } else {
                closeStdin()
                return
            }
        }
        if inputOffset >= input.count { closeStdin() }
    }

    mutating func closeStdin() {
        csystem_proc_close(stdinFD)
        stdinFD = -1
    }
}
