import CSystem
import Glibc

/// A long-lived child fed lines on stdin for as long as we run (the events plugin). Writing
/// never blocks: what the pipe does not take at once waits in a buffer of at most `bufferCap`
/// bytes, and a line that does not fit is dropped and counted, so a child that reads slowly,
/// or not at all, never stalls the caller. What it prints (stdout and stderr) is read, never
/// passed through: our stdout may be a JSON document, and its bytes may be anything.
package final class StreamingChild {
    package let pid: Int32
    private let pidfd: Int32
    private var stdinFD: Int32
    private var pending: [UInt8] = []
    private let bufferCap: Int
    /// Lines dropped because the buffer was full or the child had stopped reading.
    package private(set) var dropped = 0
    /// Set once a write found its stdin closed: it exited, or closed its input, early.
    package private(set) var stoppedReading = false
    /// How it ended when `close` reaped it by itself (before any kill): exit status or signal.
    package private(set) var ended: (status: Int32?, signal: Int32?)?
    /// Set when `close` killed it because it had not exited within the grace.
    package private(set) var killedAfterGrace = false
    private var closed = false
    private var output: [OutputLines]
    /// Lines read from its output and not yet taken.
    private var printed: [String] = []

    private init(child: csystem_child, bufferCap: Int, lineCap: Int) {
        pid = child.pid
        pidfd = child.pidfd
        stdinFD = child.stdin_fd
        self.bufferCap = bufferCap
        output = [OutputLines(fd: child.stdout_fd, lineCap: lineCap), OutputLines(fd: child.stderr_fd, lineCap: lineCap)]
    }

    /// Starts the command; `spec.stdin`, `outputCap` and the timeouts do not apply. Lines it
    /// prints longer than `lineCap` bytes are cut.
    package static func start(
        _ spec: ProcessSpec, bufferCap: Int = 1 << 20, lineCap: Int = 4096
    ) throws(ProcessSpawnError) -> StreamingChild {
        StreamingChild(child: try ProcessRunner.spawn(spec, feedsStdin: true), bufferCap: bufferCap, lineCap: lineCap)
    }

    /// The lines it printed since the last call, each stream's in order (of what one look finds,
    /// stdout's before stderr's); reading them keeps a chatty child from blocking on a full pipe.
    package func takeOutput() -> [String] {
        readOutput()
        defer { printed = [] }
        return printed
    }

    private func readOutput() {
        for i in output.indices { output[i].read(into: &printed) }
    }

    /// Queues one line (a newline is added) and writes what the pipe takes now.
    package func send(line: String) {
        guard stdinFD >= 0 else {
            dropped += 1
            return
        }
        var bytes = Array(line.utf8)
        bytes.append(0x0A)
        guard pending.count + bytes.count <= bufferCap else {
            dropped += 1
            return
        }
        pending += bytes
        flush()
    }

    /// Writes buffered bytes until the pipe is full; a child gone from its stdin ends feeding.
    private func flush() {
        while !pending.isEmpty && stdinFD >= 0 {
            let n = pending.withUnsafeBytes { csystem_proc_write(stdinFD, $0.baseAddress, $0.count) }
            if n > 0 {
                pending.removeFirst(n)
            } else if n == -Int(EAGAIN) || n == -Int(EWOULDBLOCK) {
                return
            } else {
                stoppedReading = true
                dropped += pending.split(separator: 0x0A).count
                pending.removeAll()
                csystem_proc_close(stdinFD)
                stdinFD = -1
            }
        }
    }

    /// Ends the child: writes what is buffered for up to `graceMs`, closes its stdin (its
    /// end-of-input), waits up to `graceMs` for it to exit, then kills its process group
    /// (whatever is left in it, also when the child exited).
    package func close(graceMs: Int64 = 2000) {
        guard !closed else { return }
        closed = true
        let deadline = csystem_proc_now_ms() + graceMs
        while !pending.isEmpty && stdinFD >= 0 {
            let left = deadline - csystem_proc_now_ms()
            guard left > 0 else { break }
            var fds = [pollfd(fd: stdinFD, events: Int16(POLLOUT), revents: 0)]
            _ = csystem_proc_poll(&fds, 1, Int32(min(left, 100)))
            flush()
        }
        // Lines it did not take within the grace never reach it.
        if !pending.isEmpty {
            dropped += pending.split(separator: 0x0A).count
            pending.removeAll()
        }
        if stdinFD >= 0 {
            csystem_proc_close(stdinFD)
            stdinFD = -1
        }
        var code: Int32 = -1
        var signal: Int32 = -1
        while csystem_proc_wait(pid, 1, &code, &signal) == 0 {
            let left = deadline - csystem_proc_now_ms()
            if left <= 0 {
                killedAfterGrace = true
                _ = csystem_proc_killpg(pid, SIGKILL)
                _ = csystem_proc_wait(pid, 0, &code, &signal)
                (code, signal) = (-1, -1)
                break
            }
            // Its output is read while it finishes, so a full pipe cannot hold it until the kill.
            readOutput()
            if pidfd >= 0 {
                _ = csystem_proc_poll_readable(pidfd, Int32(min(left, 100)))
            } else {
                usleep(10_000)
            }
        }
        if code >= 0 || signal >= 0 { ended = (code >= 0 ? code : nil, signal >= 0 ? signal : nil) }
        // What it started in its group (a background process) does not outlive it.
        _ = csystem_proc_killpg(pid, SIGKILL)
        if pidfd >= 0 { csystem_proc_close(pidfd) }
        // What it printed last; a process that left its group may hold the pipes, so no waiting for their end.
        readOutput()
        for i in output.indices { output[i].close(into: &printed) }
    }
}
