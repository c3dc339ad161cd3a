import Foundation

/// What a finished `curl` (or other helper) process produced.
public struct TestHTTPProcessResult: Sendable {
    /// The exit status (curl: 0 success, 22 HTTP error with `-f`, 52 empty reply, 56 recv failure).
    public var exitCode: Int32
    /// Standard output bytes.
    public var stdout: [UInt8]
    /// Standard error, as text.
    public var stderr: String
    /// Standard output as UTF-8 text (lossy).
    public var stdoutText: String { String(decoding: stdout, as: UTF8.self) }
}

/// Runs `/usr/bin/curl` against test servers (Linux URLSession is not trusted in tests).
public enum TestHTTPCurl {
    /// Runs curl with `arguments` (add `-s`, `-o`, `-w` as needed) and waits for it.
    public static func run(_ arguments: [String]) throws -> TestHTTPProcessResult {
        try runExecutable("/usr/bin/curl", arguments)
    }

    /// Runs curl with `-s -o /dev/null -w %{http_code}` and returns the code (0 when no response).
    public static func statusCode(_ url: String, _ extra: [String] = []) throws -> (code: Int, exitCode: Int32) {
        let result = try run(["-s", "-o", "/dev/null", "-w", "%{http_code}"] + extra + [url])
        return (Int(result.stdoutText) ?? -1, result.exitCode)
    }

    /// Runs an executable to completion, draining stdout and stderr together so neither
    /// pipe can fill up and block the child.
    public static func runExecutable(_ path: String, _ arguments: [String]) throws -> TestHTTPProcessResult {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let errBox = DataBox()
        let group = DispatchGroup()
        group.enter()
        DispatchQueue.global().async {
            errBox.set(err.fileHandleForReading.readDataToEndOfFile())
            group.leave()
        }
        let stdout = out.fileHandleForReading.readDataToEndOfFile()
        group.wait()
        process.waitUntilExit()
        return TestHTTPProcessResult(
            exitCode: process.terminationStatus,
            stdout: [UInt8](stdout),
            stderr: String(decoding: errBox.get(), as: UTF8.self)
        )
    }
}

private final class DataBox: @unchecked Sendable {
    private let lock = NSLock()
    private var data = Data()
    func set(_ value: Data) { lock.withLock { data = value } }
    func get() -> Data { lock.withLock { data } }
}

/// The `outbox-testserver` binary running as a child process, for tests that need the
/// server outside the test process. Terminated (SIGTERM) by `stop()` or on deinit.
public final class TestHTTPServerProcess: @unchecked Sendable {
    /// The bound port, read from the port file.
    public let port: Int
    /// `http://127.0.0.1:PORT`.
    public var baseURL: String { "http://127.0.0.1:\(port)" }
    private let process: Process
    private let folder: URL

    /// Starts the binary (default: next to the test bundle in the build folder) and waits
    /// until it has written its port file.
    public init(executable: String? = nil, timeoutSeconds: Double = 10) throws {
        let path = executable ?? Self.defaultExecutable()
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("outbox-testserver-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        let portFile = folder.appendingPathComponent("port").path
        process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = ["--port", "0", "--port-file", portFile]
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        let deadline = Date().addingTimeInterval(timeoutSeconds)
        var found: Int?
        while found == nil {
            if let text = try? String(contentsOfFile: portFile, encoding: .utf8),
               let value = Int(text.trimmingCharacters(in: .whitespacesAndNewlines)) {
                found = value
            } else if !process.isRunning || Date() > deadline {
                process.terminate()
                throw TestHTTPServerError(description: "outbox-testserver did not start (\(path))")
            } else {
                usleep(5000)
            }
        }
        port = found!
    }

    deinit { stop() }

    /// Sends SIGTERM and waits; returns the exit status (0 for a clean stop).
    @discardableResult
    public func stop() -> Int32 {
        if process.isRunning { process.terminate() }
        // A child spawned from a thread that blocks SIGTERM inherits that mask: give it a
        // few seconds, then SIGKILL, so a test can never hang here.
        let deadline = Date().addingTimeInterval(5)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        try? FileManager.default.removeItem(at: folder)
        return process.terminationStatus
    }

    /// The build products folder holding the test bundle, where SwiftPM also puts executables.
    public static func defaultExecutable() -> String {
        builtExecutable("outbox-testserver")
    }
}
