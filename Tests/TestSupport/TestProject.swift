import Foundation
import OutboxModel
import Synchronization
import Testing

/// One test's outbox project: a temp folder removed at the end, writers for its config,
/// definitions and hooks, a scrubbed environment, the in-repo HTTP test server, and a driver
/// for the built `outbox` binary.
///
/// The layout: `base` is the test's own folder (HOME and TMPDIR of every child point into
/// it); the project is `base/project` (`root`, the children's working directory). The
/// in-process driver (`CLI.run`) is an extension in the CLI tests: this target serves every
/// test target, down to the HTTP and process layers, so it does not depend on the CLI
/// module and everything under it.
open class TestProject: @unchecked Sendable {
    /// The test's temp folder: holds the project, HOME and TMPDIR.
    package let base: String
    /// The project root (config/, definitions/, hooks/, .outbox/).
    package let root: String
    /// What this test adds to the scrubbed environment of everything it runs.
    package var environment: [String: String] = [:]
    /// The `outbox` executable the process driver runs.
    package var executable = builtExecutable("outbox")

    private let folder: TemporaryFolder
    private let lazyServer = Locked<TestHTTPServer?>(nil)

    /// Creates the project: `config/outbox.yaml` with `config` (none when nil) and
    /// `definitions/KEY.yaml` for each of `definitions`. `name` (the calling test, by default)
    /// names the folder. Public, not package: a subclass in another module of an open class
    /// whose initializer it cannot see gets a synthesized one that calls itself (a warning).
    public init(config: String? = "", definitions: [String: String] = [:], name: String = #function) throws {
        folder = TemporaryFolder(prefix: name)
        base = folder.path
        root = base + "/project"
        for sub in ["project", "home", "tmp"] {
            try FileManager.default.createDirectory(atPath: base + "/" + sub, withIntermediateDirectories: true)
        }
        if let config { try writeConfig(config) }
        try FileManager.default.createDirectory(atPath: root + "/definitions", withIntermediateDirectories: true)
        for (key, yaml) in definitions { try define(key, yaml) }
    }

    deinit {
        lazyServer.withLock { $0?.stop() }
    }

    // MARK: Files

    /// `root` + "/" + `relative`.
    package func path(_ relative: String) -> String { root + "/" + relative }

    /// Writes a text file under the root (creating folders), optionally with a mode; returns its path.
    @discardableResult
    package func write(_ relative: String, _ text: String, mode: Int? = nil) throws -> String {
        try folder.write("project/" + relative, text, mode: mode)
    }

    /// Writes `config/outbox.yaml`.
    package func writeConfig(_ yaml: String) throws { try write("config/outbox.yaml", yaml) }

    /// Writes `definitions/KEY.yaml`.
    package func define(_ key: String, _ yaml: String) throws { try write("definitions/\(key).yaml", yaml) }

    /// Writes an executable `hooks/NAME`.
    package func writeHook(_ name: String, _ script: String) throws { try write("hooks/" + name, script, mode: 0o755) }

    /// A file's text under the root; nil when it cannot be read.
    package func read(_ relative: String) -> String? { try? String(contentsOfFile: path(relative), encoding: .utf8) }

    package func exists(_ relative: String) -> Bool { FileManager.default.fileExists(atPath: path(relative)) }

    package func touch(_ relative: String) { _ = FileManager.default.createFile(atPath: path(relative), contents: Data()) }

    package func remove(_ relative: String) { try? FileManager.default.removeItem(atPath: path(relative)) }

    /// The store folder and whether it exists.
    package var storeFolder: String { root + "/.outbox" }
    package var storeExists: Bool { FileManager.default.fileExists(atPath: storeFolder) }

    /// The sqlite3 tool's answer on the store's database, as an outside process sees it.
    package func sqlite(_ sql: String) throws -> String {
        let result = try runProcess("/usr/bin/sqlite3", [storeFolder + "/outbox.db", sql], environment: processEnvironment())
        guard result.exitCode == 0 else { throw FixtureError("sqlite3 failed: \(result)") }
        return result.stdout
    }

    // MARK: Environment and server

    /// The environment of a child: the scrubbed one, HOME and TMPDIR in this test's folder,
    /// plus `environment`, plus `extra`.
    package func processEnvironment(_ extra: [String: String] = [:]) -> [String: String] {
        scrubbedEnvironment(home: base + "/home", tmp: base + "/tmp").merging(environment) { $1 }.merging(extra) { $1 }
    }

    /// The test's own loopback HTTP server (port 0), started on first use, stopped at the end.
    package var server: TestHTTPServer {
        do { return try startServer() } catch { fatalError("the test server did not start: \(error)") }
    }

    /// Starts `server` now (a no-op once it runs), so a project can fail its init instead.
    @discardableResult
    package func startServer() throws -> TestHTTPServer {
        try lazyServer.withLock { server in
            if let server { return server }
            let started = try TestHTTPServer(port: 0)
            server = started
            return started
        }
    }

    /// A URL on `server`.
    package func url(_ path: String) -> String { server.url(path) }

    // MARK: The `outbox` binary

    /// Starts `outbox ARGS` in the root (or `cwd`) without waiting: for runners a test stops or kills.
    package func start(
        _ arguments: [String], stdin: String? = nil, environment extra: [String: String] = [:],
        cwd: String? = nil
    ) throws -> RunningProcess {
        try RunningProcess(
            executable: executable, arguments: arguments, cwd: cwd ?? root,
            environment: processEnvironment(extra), stdin: stdin)
    }

    /// Runs `outbox ARGS` to completion (killed after `timeout` seconds, which only a hung process reaches).
    @discardableResult
    package func outbox(
        _ arguments: [String], stdin: String? = nil, environment extra: [String: String] = [:],
        cwd: String? = nil, timeout: Double = 300
    ) async throws -> CommandResult {
        try await start(arguments, stdin: stdin, environment: extra, cwd: cwd).wait(timeout: timeout)
    }

    /// Runs `outbox run ARGS` until `condition` holds (or two minutes pass), then stops it with
    /// SIGTERM and expects a clean exit: for runs that never drain, without betting on timing.
    @discardableResult
    package func runUntil(
        _ extra: [String] = [], until what: @autoclosure () -> String = "the condition",
        sourceLocation: SourceLocation = #_sourceLocation,
        _ condition: (RunningProcess) async throws -> Bool
    ) async throws -> CommandResult {
        let runner = try start(["run"] + extra)
        if try await !eventually(what(), sourceLocation: sourceLocation, { try await condition(runner) }) {
            // What the runner said while it did not get there.
            Issue.record("the runner's log so far:\n\(runner.stderrSoFar)", sourceLocation: sourceLocation)
        }
        runner.signal(SIGTERM)
        let result = await runner.wait()
        #expect(result.exitCode == 0 && !result.timedOut, "run: \(result)", sourceLocation: sourceLocation)
        return result
    }
}
