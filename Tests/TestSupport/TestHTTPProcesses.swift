import Foundation

/// What a finished `curl` (or other helper) process produced: the fixture's one result type.
package typealias TestHTTPProcessResult = CommandResult

extension CommandResult {
    /// Standard output as text (`stdout`).
    package var stdoutText: String { stdout }
}

/// Runs `/usr/bin/curl` against test servers (Linux URLSession is not trusted in tests).
package enum TestHTTPCurl {
    /// Runs curl with `arguments` (add `-s`, `-o`, `-w` as needed) and waits for it.
    package static func run(_ arguments: [String]) throws -> TestHTTPProcessResult {
        try runExecutable("/usr/bin/curl", arguments)
    }

    /// Runs curl with `-s -o /dev/null -w %{http_code}` and returns the code (0 when no response).
    package static func statusCode(_ url: String, _ extra: [String] = []) throws -> (code: Int, exitCode: Int32) {
        let result = try run(["-s", "-o", "/dev/null", "-w", "%{http_code}"] + extra + [url])
        return (Int(result.stdoutText) ?? -1, result.exitCode)
    }

    /// Runs an executable to completion with the scrubbed environment, or exactly `environment`.
    package static func runExecutable(
        _ path: String, _ arguments: [String], environment: [String: String]? = nil
    ) throws -> TestHTTPProcessResult {
        try runProcess(path, arguments, environment: environment)
    }
}

/// The `outbox-testserver` binary running as a child process, for tests that need the
/// server outside the test process. Terminated (SIGTERM) by `stop()` or on deinit.
package final class TestHTTPServerProcess: @unchecked Sendable {
    /// The bound port, read from the port file.
    package let port: Int
    /// `http://127.0.0.1:PORT`.
    package var baseURL: String { "http://127.0.0.1:\(port)" }
    private let process: RunningProcess
    private let folder: TemporaryFolder

    /// Starts the binary (default: next to the test bundle in the build folder) and waits
    /// until it has written its port file.
    package init(executable: String? = nil, timeoutSeconds: Double = 60) throws {
        let path = executable ?? Self.defaultExecutable()
        folder = TemporaryFolder(prefix: "testserver")
        let portFile = folder.path("port")
        // The project's own spawn: only fds 0-2 reach the child, so it keeps no other test's file open.
        process = try RunningProcess(
            executable: path, arguments: ["--port", "0", "--port-file", portFile], cwd: folder.path,
            environment: scrubbedEnvironment(home: folder.path, tmp: folder.path))
        let deadline = Date().addingTimeInterval(timeoutSeconds)
        var found: Int?
        while found == nil {
            if let text = try? String(contentsOfFile: portFile, encoding: .utf8),
                let value = Int(text.trimmingCharacters(in: .whitespacesAndNewlines))
            {
                found = value
            } else if !process.isRunning || Date() > deadline {
                process.signal(SIGKILL)
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
    package func stop() -> Int32 {
        process.signal(SIGTERM)
        // A child spawned from a thread that blocks SIGTERM inherits that mask: the wait
        // ends it with SIGKILL after a while, so a test can never hang here.
        return process.waitBlocking(timeout: 30).exitCode
    }

    /// Releases requests held at `name` through the control endpoint (see `TestHTTPServer.release`).
    @discardableResult
    package func release(_ name: String, count: Int? = nil) throws -> TestHTTPProcessResult {
        try TestHTTPCurl.run(["-s", "-X", "POST", baseURL + "/_control/release/\(name)" + (count.map { "?count=\($0)" } ?? "")])
    }

    /// How many requests wait at the hold `name`, through the control endpoint.
    package func heldCount(_ name: String) throws -> Int {
        let result = try TestHTTPCurl.run(["-s", baseURL + "/_control/held/\(name)"])
        return (result.jsonObject as? [String: Any])?["held"] as? Int ?? -1
    }

    /// The build products folder holding the test bundle, where SwiftPM also puts executables.
    package static func defaultExecutable() -> String {
        builtExecutable("outbox-testserver")
    }
}
