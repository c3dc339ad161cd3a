import CSystem
import Foundation

/// A throwaway PostgreSQL 15 cluster for the tests: made by `initdb` in a temp folder,
/// started by `pg_ctl` on a free loopback port, once per test process, and stopped when
/// the process exits. As root (CI) it runs as the `postgres` user, which owns the folder.
/// Each test takes a schema of its own (`url(schema:)`), so tests never see each other's rows.
package final class PostgresCluster: Sendable {
    package static let binaries = "/usr/lib/postgresql/15/bin"
    package static let user = "outbox"
    /// The cluster asks for a password over TCP, so a wrong one can be tested.
    package static let password = "outbox-test-password"

    package let folder: String
    package let port: Int
    private let data: String
    private let asRoot: Bool

    /// The cluster of this test process, started at first use; a failure to start is
    /// reported by every test that needs it (never skipped).
    package static func shared() throws -> PostgresCluster {
        switch started {
        case let .success(cluster): return cluster
        case let .failure(error): throw error
        }
    }

    private static let started: Result<PostgresCluster, any Error> = Result { try PostgresCluster() }

    /// A cluster of the caller's own, for a test that stops and starts its server.
    package static func makePrivate() throws -> PostgresCluster { try PostgresCluster() }

    /// Stops the server (`-m fast`: it ends every session, as a restart by an operator does).
    package func stop() throws {
        try Self.run(Self.binaries + "/pg_ctl", ["-D", data, "-m", "fast", "-w", "stop"], asRoot: asRoot)
    }

    /// Starts the stopped server again on its port.
    package func start() throws {
        try Self.run(
            Self.binaries + "/pg_ctl",
            ["-D", data, "-l", folder + "/server.log", "-w", "-t", "60", "start", "-o", Self.options(port, folder)], asRoot: asRoot)
    }

    private static func options(_ port: Int, _ base: String) -> String {
        "-p \(port) -k \(base) -c listen_addresses=127.0.0.1 -c max_connections=400 -c fsync=off"
    }

    /// A URL for a schema of its own (created by the store on first open).
    package func url(schema: String, password: String = PostgresCluster.password) -> String {
        "postgres://\(Self.user):\(password)@127.0.0.1:\(port)/postgres?schema=\(schema)"
    }

    /// A new schema name, unique in this test process.
    package static func uniqueSchema(_ prefix: String) -> String {
        "\(prefix)_\(UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased().prefix(16))"
    }

    private init() throws {
        let initdb = Self.binaries + "/initdb"
        guard FileManager.default.isExecutableFile(atPath: initdb) else {
            throw ClusterFailure("no \(initdb): install Debian's postgresql-15 (.ci/setup installs it with OUTBOX_SETUP_TESTS=1)")
        }
        let base = URL(fileURLWithPath: "/tmp").appendingPathComponent("outbox-pg-\(getpid())-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
        folder = base
        let data = base + "/data"
        self.data = data
        let passwordFile = base + "/pwfile"
        try Self.password.write(toFile: passwordFile, atomically: false, encoding: .utf8)
        // The server refuses to run as root: the folder goes to the postgres user.
        let asRoot = getuid() == 0
        self.asRoot = asRoot
        if asRoot { try Self.run("/bin/chown", ["-R", "postgres:postgres", base], asRoot: false) }
        try Self.run(
            initdb,
            [
                "-D", data, "-U", Self.user, "--pwfile", passwordFile, "--auth-local=trust", "--auth-host=scram-sha-256",
                "--no-sync", "-E", "UTF8", "--locale=C.UTF-8",
            ], asRoot: asRoot)
        var lastError: (any Error)?
        for _ in 0..<5 {
            guard let port = freeLoopbackPort() else { throw ClusterFailure("no free loopback port: errno \(errno)") }
            do {
                try Self.run(
                    Self.binaries + "/pg_ctl",
                    [
                        "-D", data, "-l", base + "/server.log", "-w", "-t", "60", "start", "-o", Self.options(port, base),
                    ], asRoot: asRoot)
                self.port = port
                Self.stopAtExit(data: data, base: base, asRoot: asRoot)
                return
            } catch {
                // Another process may have taken the port between our probe and the server's bind.
                lastError = error
            }
        }
        let log = (try? String(contentsOfFile: base + "/server.log", encoding: .utf8)) ?? ""
        throw ClusterFailure("PostgreSQL did not start: \(lastError.map { "\($0)" } ?? "") \(log.suffix(800))")
    }

    /// Runs a PostgreSQL program (as the postgres user when we are root); throws with its
    /// output. Spawned with only fds 0-2 inherited (the server outlives this call and must
    /// not hold other tests' sockets open), and waited for on the calling thread: Foundation's
    /// Process waits through the cooperative pool, which the tests waiting for this cluster occupy.
    private static func run(_ program: String, _ arguments: [String], asRoot: Bool) throws {
        let command = asRoot ? ["/usr/sbin/runuser", "-u", "postgres", "--", program] + arguments : [program] + arguments
        let output = "/tmp/outbox-pg-out-\(getpid())-\(UUID().uuidString.prefix(8))"
        defer { unlink(output) }
        // The shell sends the program's output to a file, then becomes the program.
        let argv = ["/bin/sh", "-c", "exec \"$0\" \"$@\" > \(output) 2>&1 < /dev/null"] + command
        let environment = ["PATH=/usr/bin:/bin", "LANG=C.UTF-8", "LC_ALL=C.UTF-8"]
        let cArgs: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
        let cEnv: [UnsafeMutablePointer<CChar>?] = environment.map { strdup($0) } + [nil]
        defer { for p in cArgs + cEnv { free(p) } }
        var child = csystem_child()
        let rc = csystem_spawn("/bin/sh", cArgs, cEnv, nil, &child)
        guard rc == 0 else { throw ClusterFailure("cannot start \(command[0]): errno \(-rc)") }
        // The shell's own pipes are replaced by the file before the program starts.
        for fd in [child.stdin_fd, child.stdout_fd, child.stderr_fd] where fd >= 0 { close(fd) }
        if child.pidfd >= 0 { close(child.pidfd) }
        var code: Int32 = -1
        var signal: Int32 = -1
        _ = csystem_proc_wait(child.pid, 0, &code, &signal)
        guard code == 0 else {
            let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
            throw ClusterFailure(
                "\(program) \(arguments.joined(separator: " ")) failed (exit \(code), signal \(signal)): \(text.suffix(800))")
        }
    }

    private static let exitState = ExitState()

    private final class ExitState: @unchecked Sendable {
        let lock = NSLock()
        var clusters: [(data: String, base: String, asRoot: Bool)] = []
    }

    /// Stops the servers and removes their folders when the test process exits.
    private static func stopAtExit(data: String, base: String, asRoot: Bool) {
        exitState.lock.lock()
        defer { exitState.lock.unlock() }
        if exitState.clusters.isEmpty {
            atexit {
                for (data, base, asRoot) in PostgresCluster.exitState.clusters {
                    try? PostgresCluster.run(
                        PostgresCluster.binaries + "/pg_ctl", ["-D", data, "-m", "immediate", "-w", "stop"], asRoot: asRoot)
                    try? FileManager.default.removeItem(atPath: base)
                }
            }
        }
        exitState.clusters.append((data, base, asRoot))
    }
}

package struct ClusterFailure: Error, CustomStringConvertible {
    package var description: String
    init(_ d: String) { description = d }
}
