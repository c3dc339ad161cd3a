import Foundation
import OutboxModel

/// What one finished command produced: the `outbox` binary, an in-process `CLI.run`, curl.
package struct CommandResult: Sendable, CustomStringConvertible {
    /// The exit status; minus the signal number when a signal killed the process.
    package var exitCode: Int32
    /// Standard output as bytes (curl downloads are binary).
    package var stdoutBytes: [UInt8]
    /// Standard output as UTF-8 text (lossy).
    package var stdout: String
    /// Standard error as UTF-8 text (lossy).
    package var stderr: String
    /// The process was killed because it outlived its wait.
    package var timedOut: Bool

    package init(exitCode: Int32, stdout: String, stderr: String, timedOut: Bool = false) {
        self.init(exitCode: exitCode, stdoutBytes: Array(stdout.utf8), stderr: stderr, timedOut: timedOut)
    }

    package init(exitCode: Int32, stdoutBytes: [UInt8], stderr: String, timedOut: Bool = false) {
        self.exitCode = exitCode
        self.stdoutBytes = stdoutBytes
        self.stdout = String(decoding: stdoutBytes, as: UTF8.self)
        self.stderr = stderr
        self.timedOut = timedOut
    }

    /// Non-empty stdout lines.
    package var lines: [String] { stdout.split(separator: "\n").map(String.init) }

    /// Stdout as one JSON document; nil when it is not one.
    package var json: JSON? { try? JSON.parse(stdout) }

    /// Stdout lines that are JSON documents (`run --events -`), blank lines skipped.
    package var jsonLines: [JSON] { stdout.split(separator: "\n").compactMap { try? JSON.parse(String($0)) } }

    /// Stdout parsed by Foundation, for `as? [String: Any]` style checks.
    package var jsonObject: Any? { try? JSONSerialization.jsonObject(with: Data(stdoutBytes), options: [.fragmentsAllowed]) }

    /// Stdout as one JSON document, or the parse error (with this result in its message).
    package func requireJSON() throws -> JSON {
        do { return try JSON.parse(stdout) } catch { throw FixtureError("stdout is not one JSON document: \(error)\n\(description)") }
    }

    package var description: String {
        "exit \(exitCode)\(timedOut ? " (timed out)" : "")\nstdout: \(stdout)\nstderr: \(stderr)"
    }
}

/// A fixture that could not do its part (a file it could not write, a process that did not start).
package struct FixtureError: Error, CustomStringConvertible {
    package var description: String
    package init(_ description: String) { self.description = description }
}
