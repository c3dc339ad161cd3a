import CSystem
import Foundation
import OutboxModel

/// The environment every child of a test gets: nothing from the test process's own, so a
/// developer's or CI's variables (OUTBOX_CONFIG, proxies, locale) cannot change a result.
package func scrubbedEnvironment(home: String, tmp: String) -> [String: String] {
    ["PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TMPDIR": tmp]
}

/// A child process started by a test. Its stdout and stderr go to files, so no pipe can fill
/// up whatever it prints, and stdin comes from a file (or /dev/null). Killed with SIGKILL if
/// it still runs when the last reference goes away.
///
/// Started with the project's own spawn (only fds 0-2 inherited, a process group of its own),
/// not Foundation's `Process`: its `run` reads past a buffer while it scans /proc/self/fd and
/// crashed the test process with SIGSEGV when many fds were open (a busy run of the suite).
package final class RunningProcess: @unchecked Sendable {
    package let pid: Int32
    /// Holds the stdin, stdout and stderr files.
    private let files: TemporaryFolder
    /// The exit, once reaped: the code, or minus the signal that ended it.
    private let exit = Locked<Int32?>(nil)

    /// Starts `executable ARGS` in `cwd` with exactly `environment`; stdin is the text `stdin`,
    /// or the file (or folder) at `stdinPath`, or else /dev/null.
    package init(
        executable: String, arguments: [String], cwd: String, environment: [String: String], stdin: String? = nil,
        stdinPath: String? = nil
    ) throws {
        let files = TemporaryFolder(prefix: "io")
        self.files = files
        let input = try stdinPath ?? stdin.map { try files.write("stdin", $0) } ?? "/dev/null"
        let out = try files.write("stdout", Data()), err = try files.write("stderr", Data())
        // The shell points 0-2 at the files, then becomes the program (same pid); the paths
        // are its arguments, so the program's environment is exactly `environment`.
        let script = #"i=$1 o=$2 e=$3; shift 3; exec "$@" < "$i" > "$o" 2> "$e""#
        let argv = ["/bin/sh", "-c", script, "sh", input, out, err, executable] + arguments
        let cArgs: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
        let cEnv: [UnsafeMutablePointer<CChar>?] = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { for p in cArgs + cEnv { free(p) } }
        var child = csystem_child()
        let rc = csystem_spawn("/bin/sh", cArgs, cEnv, cwd, &child)
        guard rc == 0 else { throw SpawnFailure(description: "cannot start \(executable): errno \(-rc)") }
        // The shell's own pipes are replaced by the files before the program starts.
        for fd in [child.stdin_fd, child.stdout_fd, child.stderr_fd] where fd >= 0 { close(fd) }
        if child.pidfd >= 0 { close(child.pidfd) }
        pid = child.pid
    }

    deinit {
        if isRunning {
            kill(pid, SIGKILL)
            reap(blocking: true)
        }
    }

    /// Reaps the child if it ended (or waits for it); true once it is reaped.
    @discardableResult
    private func reap(blocking: Bool) -> Bool {
        exit.withLock { status in
            if status != nil { return true }
            var code: Int32 = -1
            var signal: Int32 = -1
            guard csystem_proc_wait(pid, blocking ? 0 : 1, &code, &signal) == 1 else { return false }
            status = signal > 0 ? -signal : code
            return true
        }
    }

    package var isRunning: Bool { !reap(blocking: false) }

    /// Whether a signal ended it (nil while it runs).
    package var killedBySignal: Bool? { reap(blocking: false) ? (exit.withLock { $0 } ?? 0) < 0 : nil }

    /// What it printed to stdout so far.
    package var stdoutSoFar: String { (try? String(contentsOfFile: files.path("stdout"), encoding: .utf8)) ?? "" }
    /// What it printed to stderr so far.
    package var stderrSoFar: String { (try? String(contentsOfFile: files.path("stderr"), encoding: .utf8)) ?? "" }

    /// Sends a signal (SIGKILL for crash tests, SIGTERM to stop).
    package func signal(_ number: Int32) { if isRunning { kill(pid, number) } }

    /// Whether `signal` still waits to be handed to the process (`/proc`'s pending masks): once
    /// false after `signal(_:)`, its handler has run (or the signal ended it).
    package func hasPending(_ signal: Int32) -> Bool {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let bit = UInt64(1) << UInt64(signal - 1)
        return status.split(separator: "\n").contains { line in
            guard line.hasPrefix("SigPnd:") || line.hasPrefix("ShdPnd:") else { return false }
            return (UInt64(line.split(separator: "\t").last ?? "", radix: 16) ?? 0) & bit != 0
        }
    }

    /// The peak resident memory so far in KiB (`VmHWM`), nil once the process is gone.
    package var peakMemoryKiB: Int? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("VmHWM:") {
            return Int(line.split(separator: " ", omittingEmptySubsequences: true)[1])
        }
        return nil
    }

    /// Waits for the exit on a thread of its own (never holding one of the cooperative pool's);
    /// SIGKILL after `timeout` seconds (stretched by `OUTBOX_TEST_TIME_SCALE`), so a hung child
    /// fails its test instead of hanging the run.
    package func wait(timeout: Double = 300) async -> CommandResult {
        await withCheckedContinuation { continuation in
            Thread { [self] in continuation.resume(returning: waitBlocking(timeout: timeout)) }.start()
        }
    }

    /// `wait` for callers on a thread of their own.
    package func waitBlocking(timeout: Double = 300) -> CommandResult {
        let deadline = Date().addingTimeInterval(timeout * testTimeScale)
        var late = false
        while isRunning {
            if Date() > deadline {
                late = true
                kill(pid, SIGKILL)
                break
            }
            usleep(5000)
        }
        reap(blocking: true)
        let status = exit.withLock { $0 } ?? -1
        let stdout = FileManager.default.contents(atPath: files.path("stdout")) ?? Data()
        return CommandResult(exitCode: status, stdoutBytes: [UInt8](stdout), stderr: stderrSoFar, timedOut: late)
    }
}

/// A child that could not be started.
package struct SpawnFailure: Error, CustomStringConvertible {
    package var description: String
}

/// Runs `executable ARGS` to completion on the calling thread (for synchronous tests and
/// `offload`), with exactly `environment` (default: the scrubbed one, HOME in a temp folder).
package func runProcess(
    _ executable: String, _ arguments: [String], cwd: String? = nil,
    environment: [String: String]? = nil, stdin: String? = nil, timeout: Double = 300
) throws -> CommandResult {
    let scratch = TemporaryFolder(prefix: "run")
    let child = try RunningProcess(
        executable: executable, arguments: arguments, cwd: cwd ?? scratch.path,
        environment: environment ?? scrubbedEnvironment(home: scratch.path, tmp: scratch.path),
        stdin: stdin)
    return child.waitBlocking(timeout: timeout)
}

extension RunningProcess {
    /// The URL a runner started with `--metrics-listen` logged ("metrics at URL"), once it has.
    package var loggedMetricsURL: String? {
        stderrSoFar.split(separator: "\n").compactMap { line in line.range(of: "metrics at ").map { String(line[$0.upperBound...]) } }.first
    }
}
