import Foundation

/// What one run of the `outbox` binary produced.
public struct OutboxRun: Sendable {
    public var status: Int32
    public var stdout: String
    public var stderr: String

    public init(status: Int32, stdout: String, stderr: String) {
        self.status = status
        self.stdout = stdout
        self.stderr = stderr
    }

    /// Non-empty stdout lines.
    public var lines: [String] { stdout.split(separator: "\n").map(String.init) }

    /// Stdout parsed as one JSON document (nil when it is not JSON).
    public var json: Any? { try? JSONSerialization.jsonObject(with: Data(stdout.utf8), options: [.fragmentsAllowed]) }
}

/// A throwaway outbox project in its own temp folder, driven through the real `outbox`
/// binary as a subprocess (the runner needs its own process for crash tests).
public final class OutboxSandbox: @unchecked Sendable {
    /// The project root (holds config/, definitions/, .outbox/).
    public let root: String
    /// The `outbox` executable under test.
    public let executable: String

    /// Creates `config/outbox.yaml` (with `config` as its text) and `definitions/`.
    public init(config: String = "", function: String = #function) throws {
        let name = function.filter { $0.isLetter || $0.isNumber }.prefix(40)
        root = FileManager.default.temporaryDirectory.appendingPathComponent("outbox-\(name)-\(UUID().uuidString.prefix(8))").path
        executable = OutboxSandbox.binary("outbox")
        try FileManager.default.createDirectory(atPath: root + "/config", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: root + "/definitions", withIntermediateDirectories: true)
        try write("config/outbox.yaml", config)
    }

    deinit { try? FileManager.default.removeItem(atPath: root) }

    /// An executable built next to the test bundle (`outbox`, `outbox-testserver`).
    public static func binary(_ name: String) -> String {
        builtExecutable(name)
    }

    /// `root` + "/" + `relative`.
    public func path(_ relative: String) -> String { root + "/" + relative }

    /// Writes a text file under the root, creating folders.
    public func write(_ relative: String, _ text: String, mode: Int? = nil) throws {
        let full = path(relative)
        try FileManager.default.createDirectory(atPath: (full as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        try text.write(toFile: full, atomically: true, encoding: .utf8)
        if let mode { chmod(full, mode_t(mode)) }
    }

    /// Writes `definitions/NAME.yaml`.
    public func define(_ name: String, _ yaml: String) throws {
        try write("definitions/\(name).yaml", yaml)
    }

    /// Runs `outbox ARGS` in the root and waits for it (without holding a cooperative thread).
    @discardableResult
    public func outbox(_ arguments: [String], stdin: String? = nil, environment: [String: String] = [:]) async throws -> OutboxRun {
        let process = try start(arguments, environment: environment, stdinText: stdin)
        return await process.wait()
    }

    /// Starts `outbox ARGS` in the root without waiting (for runners that tests stop or kill).
    public func start(_ arguments: [String], environment: [String: String] = [:], stdinText: String? = nil) throws -> OutboxProcess {
        try OutboxProcess(executable: executable, arguments: arguments, cwd: root, environment: environment, stdinText: stdinText)
    }

    /// `outbox show ID --json` as a dictionary.
    public func show(_ id: String) async throws -> [String: Any]? {
        try await outbox(["show", id, "--json"]).json as? [String: Any]
    }

    /// `outbox list --json` rows.
    public func list() async throws -> [[String: Any]] {
        (try await outbox(["list", "--json"]).json as? [[String: Any]]) ?? []
    }
}

/// A running `outbox` process; its stdout and stderr are collected into temp files so that
/// no pipe can fill up, whatever it prints.
public final class OutboxProcess: @unchecked Sendable {
    public let process: Process
    private let outPath: String
    private let errPath: String

    init(executable: String, arguments: [String], cwd: String, environment: [String: String], stdinText: String?) throws {
        process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.currentDirectoryURL = URL(fileURLWithPath: cwd)
        var env = ProcessInfo.processInfo.environment
        env["OUTBOX_CONFIG"] = nil
        for (k, v) in environment { env[k] = v }
        process.environment = env
        let tag = UUID().uuidString.prefix(8)
        outPath = FileManager.default.temporaryDirectory.appendingPathComponent("outbox-out-\(tag)").path
        errPath = FileManager.default.temporaryDirectory.appendingPathComponent("outbox-err-\(tag)").path
        _ = FileManager.default.createFile(atPath: outPath, contents: nil)
        _ = FileManager.default.createFile(atPath: errPath, contents: nil)
        process.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: outPath))
        process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: errPath))
        if let stdinText {
            let pipe = Pipe()
            process.standardInput = pipe
            try process.run()
            pipe.fileHandleForWriting.write(Data(stdinText.utf8))
            try pipe.fileHandleForWriting.close()
        } else {
            process.standardInput = FileHandle.nullDevice
            try process.run()
        }
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL); process.waitUntilExit() }
        unlink(outPath)
        unlink(errPath)
    }

    public var pid: Int32 { process.processIdentifier }

    /// What it printed to stdout so far.
    public var stdoutSoFar: String { (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? "" }
    /// What it printed to stderr so far.
    public var stderrSoFar: String { (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? "" }

    /// Sends a signal (SIGKILL for crash tests, SIGTERM to stop).
    public func signal(_ number: Int32) { kill(process.processIdentifier, number) }

    /// The peak resident memory so far in KiB (`VmHWM`), nil once the process is gone.
    public var peakMemoryKiB: Int? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("VmHWM:") {
            return Int(line.split(separator: " ", omittingEmptySubsequences: true)[1])
        }
        return nil
    }

    /// Waits for the exit (bounded: a hung runner fails the test instead of hanging CI).
    /// Polls with `Task.sleep`, so waiting never holds one of the cooperative pool's threads.
    public func wait(timeoutSeconds: Double = 300) async -> OutboxRun {
        let deadline = Date().addingTimeInterval(timeoutSeconds)
        while process.isRunning && Date() < deadline { try? await Task.sleep(nanoseconds: 10_000_000) }
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
        }
        process.waitUntilExit()
        return OutboxRun(status: process.terminationStatus, stdout: stdoutSoFar, stderr: stderrSoFar)
    }
}

/// Polls `condition` every 20 ms until it holds or `seconds` pass; returns whether it held.
@discardableResult
public func waitUntil(seconds: Double, _ condition: () throws -> Bool) async rethrows -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try condition() { return true }
        try? await Task.sleep(nanoseconds: 20_000_000)
    }
    return try condition()
}

/// Runs blocking or CPU-heavy work (hashing a GiB, waiting on a child) on a thread of its own.
///
/// Swift Testing runs tests on the cooperative pool, which has 2 threads on a 2-core machine
/// (one per core): a test that blocks one starves every other test of the run.
public func offload<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let thread = Thread { continuation.resume(with: Result { try work() }) }
        thread.stackSize = 8 << 20
        thread.start()
    }
}
