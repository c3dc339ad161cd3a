import Foundation
import OutboxModel
import Testing
import TestSupport

/// Another process may hold the store's write lock for long: a batch enqueue of many lines
/// holds it while it inserts. A runner that must commit meanwhile waits, says so in its
/// log, and goes on once the lock is free, instead of stopping with its work in flight.
struct StoreLockWaitTests {
    @Test func aRunnerWaitsOutAnotherProcesssLongWrite() async throws {
        // The store-copy tests' project: `note` posts to the test server's /notes/N.
        let p = try StoreCopyTests.project(config: heldRequestConfig)
        try await p.outbox(["enqueue", "note", "--vars", #"{"n": 1}"#, "--id", "one"])
        p.server.script("/notes/1", [.hold("held")])
        let runner = try p.start(["run"])
        #expect(await p.server.waitForHeld("held"))

        // The sqlite3 shell takes the write lock and keeps it until told to commit.
        guard let shell = try Self.holdWriteLock(p) else { return }

        // The answer comes back; the runner's settle needs the lock, past the old 10 s limit.
        _ = p.server.release("held")
        await eventually("the runner says it waits for the lock", timeout: 300) {
            runner.stderrSoFar.contains("waiting for the store: another process has held its lock for")
        }
        #expect(runner.isRunning, "\(runner.stderrSoFar)")
        try shell.end("COMMIT;")

        try await eventually("the entry settles once the lock is free") {
            try await p.outbox(["list", "--json"]).stdout == "[]\n"
        }
        runner.signal(SIGTERM)
        let result = await runner.wait()
        #expect(result.exitCode == 0, "\(result)")
        #expect(p.server.requests(path: "/notes/1").count == 1)
    }

    /// Reading commands read: they answer while another process holds the write lock
    /// (opening the store does not take it once its schema is current).
    @Test func readingCommandsAnswerWhileAnotherProcessWrites() async throws {
        let p = try StoreCopyTests.project()
        let enqueued = try await p.outbox(["enqueue", "note", "--vars", #"{"n": 1}"#, "--id", "one"])
        try #require(enqueued.exitCode == 0, "\(enqueued)")
        guard let shell = try Self.holdWriteLock(p) else { return }

        // Each would wait for the lock as long as the shell holds it (until the end of this test).
        for command in [["stats"], ["stats", "--json"], ["list"], ["list", "--json"], ["show", "one"], ["explain", "one"], ["audit"]] {
            let result = try await p.outbox(command, timeout: 60)
            #expect(result.exitCode == 0, "\(command): \(result)")
            #expect(!result.stderr.contains("waiting for the store"), "\(command): \(result.stderr)")
        }
        try shell.end("ROLLBACK;")
    }

    /// A sqlite3 shell holding the store's write lock (`BEGIN IMMEDIATE`) until `end`; nil
    /// (with an issue recorded) when sqlite3 is missing.
    static func holdWriteLock(_ p: TestProject) throws -> LockHolder? {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/sqlite3") else {
            Issue.record("sqlite3 is missing: install the sqlite3 package")
            return nil
        }
        let holder = LockHolder()
        holder.shell.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
        holder.shell.arguments = [p.path(".outbox/outbox.db")]
        holder.shell.standardInput = holder.input
        holder.shell.standardOutput = holder.output
        try holder.shell.run()
        // The throwing write: a shell gone early must fail this test, not crash the whole run.
        try holder.input.fileHandleForWriting.write(contentsOf: Data(".timeout 600000\nBEGIN IMMEDIATE;\nSELECT 'locked';\n".utf8))
        #expect(String(decoding: holder.output.fileHandleForReading.availableData, as: UTF8.self).contains("locked"))
        return holder
    }

    final class LockHolder {
        let shell = Process()
        let input = Pipe()
        let output = Pipe()

        /// Ends the transaction with `statement` and the shell with it.
        func end(_ statement: String) throws {
            try input.fileHandleForWriting.write(contentsOf: Data("\(statement)\n.quit\n".utf8))
            try input.fileHandleForWriting.close()
            shell.waitUntilExit()
        }
    }
}
