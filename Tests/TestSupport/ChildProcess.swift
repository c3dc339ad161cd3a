import Foundation

/// The environment every child of a test gets: nothing from the test process's own, so a
/// developer's or CI's variables (OUTBOX_CONFIG, proxies, locale) cannot change a result.
package func scrubbedEnvironment(home: String, tmp: String) -> [String: String] {
    ["PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TMPDIR": tmp]
}

/// A child process started by a test. Its stdout and stderr go to files, so no pipe can fill
/// up whatever it prints, and stdin comes from a file (or /dev/null). Killed with SIGKILL if
/// it still runs when the last reference goes away.
package final class RunningProcess: @unchecked Sendable {
    package let process: Process
    /// Holds the stdin, stdout and stderr files.
    private let files: TemporaryFolder

    /// Starts `executable ARGS` in `cwd` with exactly `environment`.
    package init(executable: String, arguments: [String], cwd: String, environment: [String: String], stdin: String? = nil) throws {
        files = TemporaryFolder(prefix: "io")
        process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.currentDirectoryURL = URL(fileURLWithPath: cwd)
        process.environment = environment
        let out = try files.write("stdout", Data()), err = try files.write("stderr", Data())
        process.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: out))
        process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: err))
        if let stdin {
            process.standardInput = try FileHandle(forReadingFrom: URL(fileURLWithPath: try files.write("stdin", stdin)))
        } else {
            process.standardInput = FileHandle.nullDevice
        }
        try process.run()
    }

    deinit {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    package var pid: Int32 { process.processIdentifier }
    package var isRunning: Bool { process.isRunning }

    /// What it printed to stdout so far.
    package var stdoutSoFar: String { (try? String(contentsOfFile: files.path("stdout"), encoding: .utf8)) ?? "" }
    /// What it printed to stderr so far.
    package var stderrSoFar: String { (try? String(contentsOfFile: files.path("stderr"), encoding: .utf8)) ?? "" }

    /// Sends a signal (SIGKILL for crash tests, SIGTERM to stop).
    package func signal(_ number: Int32) { kill(process.processIdentifier, number) }

    /// The peak resident memory so far in KiB (`VmHWM`), nil once the process is gone.
    package var peakMemoryKiB: Int? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("VmHWM:") {
            return Int(line.split(separator: " ", omittingEmptySubsequences: true)[1])
        }
        return nil
    }

    /// Waits for the exit on a thread of its own (never holding one of the cooperative pool's);
    /// SIGKILL after `timeout` seconds, so a hung child fails its test instead of hanging the run.
    package func wait(timeout: Double = 300) async -> CommandResult {
        await withCheckedContinuation { continuation in
            Thread { [self] in continuation.resume(returning: waitBlocking(timeout: timeout)) }.start()
        }
    }

    /// `wait` for callers on a thread of their own.
    package func waitBlocking(timeout: Double = 300) -> CommandResult {
        let deadline = Date().addingTimeInterval(timeout)
        var late = false
        while process.isRunning {
            if Date() > deadline {
                late = true
                kill(process.processIdentifier, SIGKILL)
                break
            }
            usleep(5000)
        }
        process.waitUntilExit()
        let status = process.terminationReason == .uncaughtSignal ? -process.terminationStatus : process.terminationStatus
        let stdout = FileManager.default.contents(atPath: files.path("stdout")) ?? Data()
        return CommandResult(exitCode: status, stdoutBytes: [UInt8](stdout), stderr: stderrSoFar, timedOut: late)
    }
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
