import Glibc

/// What to run: a `/bin/sh -c` string, or a program with its arguments (no shell involved).
package enum ProcessCommand: Sendable, Equatable {
    /// Run with `/bin/sh -c`; a missing program shows up as exit status 127 from the shell.
    case shell(String)
    /// Run directly; the first element is found through `PATH` of the child's environment
    /// unless it contains a `/`. A missing program throws `ProcessSpawnError`.
    case argv([String])
}

/// Everything needed to run one hook or plugin process to completion.
package struct ProcessSpec: Sendable {
    /// The command line.
    package var command: ProcessCommand
    /// Bytes written to the child's stdin; then stdin is closed.
    package var stdin: [UInt8]
    /// The complete environment of the child (nothing is inherited implicitly).
    package var environment: ProcessEnvironment
    /// The child's working directory.
    package var workingDirectory: String
    /// Bytes kept per output stream; the rest is read and discarded, and flagged truncated.
    package var outputCap: Int
    /// Stops the process group (as at its timeout) once stdout passes `outputCap`: for a
    /// plugin, whose answer is then unusable, rather than wait for it to end or time out.
    package var stopWhenStdoutOverflows = false
    /// Stops what is left of the process group when the leader fails (non-zero exit or a
    /// signal): for a hook, whose outcome is delivered again and must not overlap it.
    package var stopGroupWhenLeaderFails = false
    /// Stops what is left of the process group whenever the leader ends: for a plugin, whose
    /// answer is complete then (a background child it left would outlive the run).
    package var stopGroupWhenLeaderExits = false
    /// After this long the whole process group gets SIGTERM, then SIGKILL `killGraceMs` later
    /// (at once when nothing of the group is left by then).
    package var timeoutMs: Int?
    /// The grace between the timeout's SIGTERM and SIGKILL.
    package var killGraceMs: Int64 = ProcessRunner.killGraceMs
    /// After this long `onWarn` is called once; the process keeps running.
    package var warnAfterMs: Int?
    /// Called once (with the pid) when the process outlives `warnAfterMs`.
    package var onWarn: (@Sendable (Int32) -> Void)?
    /// Called right after the spawn with the pid (= process-group id) and its start time,
    /// so the caller can record them durably before waiting.
    package var onStart: (@Sendable (_ pid: Int32, _ startTime: UInt64) -> Void)?
    /// Called while a blocking run waits for the process, on the thread that made it.
    package var heartbeat: Heartbeat?

    /// Creates a spec; callbacks are set afterwards.
    package init(
        command: ProcessCommand, stdin: [UInt8] = [], environment: [String: String],
        workingDirectory: String, outputCap: Int = 65536, timeoutMs: Int? = nil,
        warnAfterMs: Int? = nil
    ) {
        self.init(
            command: command, stdin: stdin, environment: ProcessEnvironment(environment), workingDirectory: workingDirectory,
            outputCap: outputCap, timeoutMs: timeoutMs, warnAfterMs: warnAfterMs)
    }

    /// Creates a spec whose environment shares an already encoded base.
    package init(
        command: ProcessCommand, stdin: [UInt8] = [], environment: ProcessEnvironment,
        workingDirectory: String, outputCap: Int = 65536, timeoutMs: Int? = nil,
        warnAfterMs: Int? = nil
    ) {
        self.command = command
        self.stdin = stdin
        self.environment = environment
        self.workingDirectory = workingDirectory
        self.outputCap = outputCap
        self.timeoutMs = timeoutMs
        self.warnAfterMs = warnAfterMs
        self.onWarn = nil
        self.onStart = nil
        self.heartbeat = nil
    }
}

/// Work a thread keeps doing while it waits for a process it runs (the runner renews its
/// leases while a plugin runs, and stops the plugin when it is told to stop at once). It
/// beats only on the thread that made it: a spec passed to another thread waits without it.
package struct Heartbeat: @unchecked Sendable {
    let everyMs: Int64
    let beat: () -> Void
    /// Asked at least every `abandonCheckMs`: true kills the process's group and ends the
    /// wait (its result says `abandoned`).
    let abandon: (() -> Bool)?
    private let owner = pthread_self()

    /// How often `abandon` (and a signal recorded while a plugin runs) is looked at while a
    /// process runs to completion.
    static let abandonCheckMs: Int64 = 100

    package init(everyMs: Int64, abandon: (() -> Bool)? = nil, beat: @escaping () -> Void) {
        self.everyMs = max(1, everyMs)
        self.beat = beat
        self.abandon = abandon
    }

    var isOnOwnerThread: Bool { pthread_equal(owner, pthread_self()) != 0 }
}

/// How a process ended and what it printed.
package struct ProcessResult: Sendable {
    /// The child's pid (also its process-group id).
    package var pid: Int32
    /// The exit status; nil when killed by a signal.
    package var exitStatus: Int32?
    /// The signal that killed it, if any.
    package var signal: Int32?
    /// True when `timeoutMs` expired and the group was killed.
    package var timedOut: Bool
    /// The first `outputCap` bytes of stdout.
    package var stdout: [UInt8]
    /// True when stdout had more than `outputCap` bytes.
    package var stdoutTruncated: Bool
    /// The first `outputCap` bytes of stderr.
    package var stderr: [UInt8]
    /// True when stderr had more than `outputCap` bytes.
    package var stderrTruncated: Bool

    /// True when the waiting thread gave up on it (`Heartbeat.abandon`) and killed its group.
    package var abandoned = false

    /// True when the process exited with status 0.
    package var succeeded: Bool { exitStatus == 0 }

    /// Creates a result (also useful for fakes in tests of callers).
    package init(
        pid: Int32, exitStatus: Int32?, signal: Int32?, timedOut: Bool,
        stdout: [UInt8], stdoutTruncated: Bool, stderr: [UInt8], stderrTruncated: Bool
    ) {
        self.pid = pid
        self.exitStatus = exitStatus
        self.signal = signal
        self.timedOut = timedOut
        self.stdout = stdout
        self.stdoutTruncated = stdoutTruncated
        self.stderr = stderr
        self.stderrTruncated = stderrTruncated
    }
}

/// The process could not be started (program not found, bad working directory, ...).
package struct ProcessSpawnError: Error, Sendable, CustomStringConvertible {
    /// What failed, naming the program or folder.
    package var message: String
    /// The system lacked fds, memory or processes for it: the program itself may be fine.
    package var transient: Bool

    /// Creates an error with a message.
    package init(message: String, transient: Bool = false) {
        self.message = message
        self.transient = transient
    }

    /// The message, for logs.
    package var description: String { message }
}
