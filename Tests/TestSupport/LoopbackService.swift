import Foundation
import Testing

/// A server of another project (a WebDAV server, an echo service) started on a free
/// loopback port as a child process of the test, and killed when it is done with.
package final class LoopbackService: @unchecked Sendable {
    package let name: String
    package private(set) var port = 0
    private var process: RunningProcess?
    /// The file the server's stdout and stderr go to.
    package let log: String

    package var url: String { "http://127.0.0.1:\(port)" }

    /// Starts `executable` with the arguments `arguments(port)` makes and waits until
    /// `readyPath` answers with any status. A port another process takes first makes it try
    /// another. `folder` holds the server's log; `environment` is all the child gets.
    package init(
        _ name: String, executable: String, folder: String, environment: [String: String], readyPath: String = "/",
        arguments: (Int) throws -> [String]
    ) async throws {
        self.name = name
        log = folder + "/\(name).log"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        for _ in 0..<5 {
            guard let port = freeLoopbackPort() else { break }
            self.port = port
            // Through the project's own spawn: every fd but 0-2 is closed in the child, so a
            // server that outlives its test keeps no other test's file or socket open.
            let process = try RunningProcess(
                executable: "/bin/sh", arguments: ["-c", #"l=$1; shift; exec "$@" > "$l" 2>&1"#, "sh", log, executable] + arguments(port),
                cwd: folder, environment: environment)
            self.process = process
            let url = url + readyPath
            let up = await eventually("\(name) to answer on port \(port)", timeout: 60) {
                guard process.isRunning else { return true }
                // curl waits on a thread of its own, not on one of the test pool's two.
                let answer = try? await offload { try TestHTTPCurl.statusCode(url) }
                return (answer?.code ?? 0) > 0
            }
            if up && process.isRunning { return }
            stop()
        }
        throw TestHTTPServerError(description: "\(name) did not start: \(logText.suffix(1500))")
    }

    deinit { stop() }

    /// What the server printed so far.
    package var logText: String { (try? String(contentsOfFile: log, encoding: .utf8)) ?? "" }

    /// Why `executable` cannot run here (naming the Debian package that has it), or nil.
    package static func missing(_ executable: String, package: String) -> String? {
        FileManager.default.isExecutableFile(atPath: executable)
            ? nil : "\(executable) is missing: install Debian's \(package) (.ci/setup does with OUTBOX_SETUP_TESTS=1)"
    }

    package func stop() {
        guard let process, process.isRunning else { return }
        let pid = process.pid
        // A server's workers (gunicorn's) would outlive it, holding its port: they go too,
        // after it, so that it cannot start new ones. SIGKILL: the child may have inherited a
        // mask that blocks SIGTERM, and nothing of it is kept.
        let workers =
            (try? String(contentsOfFile: "/proc/\(pid)/task/\(pid)/children", encoding: .utf8))?
            .split(separator: " ").compactMap { Int32($0) } ?? []
        kill(pid, SIGKILL)
        for worker in workers { kill(worker, SIGKILL) }
        _ = process.waitBlocking(timeout: 60)
    }
}
