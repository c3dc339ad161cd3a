import Foundation
import Glibc
import OutboxModel
import TestSupport
import Testing

/// The runner lock of an SQLite store is a file; something outside (a cleaner of old files
/// in /tmp, a hand) can remove it while a runner runs, and a second runner must still be
/// kept out.
@Suite struct RunnerLockTests {
    @Test func aRemovedLockFileIsTakenAgainAndKeepsASecondRunnerOut() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        let runner = try p.start(["run"])
        await eventually("the runner to hold the store") { p.read(".outbox/runner.lock")?.contains("pid \(runner.pid)") == true }
        try FileManager.default.removeItem(atPath: p.path(".outbox/runner.lock"))
        await eventually("the runner to lock the store again") {
            p.read(".outbox/runner.lock")?.contains("pid \(runner.pid)") == true
        }
        let second = try await p.outbox(["run", "--drain"])
        #expect(second.exitCode == 75, "\(second.description)")
        #expect(second.stderr.contains("another runner holds the store"))
        // The first runner still works.
        try await p.enqueue("t", path: "/status/200", id: "after")
        await eventually("the runner to send the entry") { p.deliveries("after").count == 1 }
        runner.signal(SIGTERM)
        let finished = await runner.wait()
        #expect(finished.exitCode == 0, "\(finished.description)")
        #expect(finished.stderr.contains("runner.lock was removed; this runner locked it again"))
    }

    /// The store folder moved away and an empty one put in its place (a restore, a swap):
    /// the runner stops, where it locked the new folder and went on with the old database, so
    /// entries enqueued into the new store were never sent and a second runner was kept out.
    @Test func aRunnerWhoseStoreFolderWasReplacedStops() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        let runner = try p.start(["run"])
        await eventually("the runner to hold the store") { p.read(".outbox/runner.lock")?.contains("pid \(runner.pid)") == true }
        #expect(rename(p.path(".outbox"), p.path(".outbox.old")) == 0)
        #expect(mkdir(p.path(".outbox"), 0o700) == 0)
        let finished = await runner.wait(timeout: 120)
        #expect(finished.exitCode == 74, "\(finished.description)")
        #expect(finished.stderr.contains("is no longer the database this runner opened (its store folder was moved or replaced)"))
        try await p.enqueue("t", path: "/status/200", id: "after")
        try await p.drain(failures: 0)
        #expect(p.deliveries("after").count == 1, "the store there now is run")
    }

    @Test func aRunnerWhoseLockFileAnotherTookStops() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        let runner = try p.start(["run"])
        await eventually("the runner to hold the store") { p.read(".outbox/runner.lock")?.contains("pid \(runner.pid)") == true }
        // What a second runner does once the file is gone: a new file, locked. Made aside and
        // renamed over the old one, so the runner never finds the path empty and locks it
        // again before this test can (a race a slow machine lost).
        let path = p.path(".outbox/runner.lock")
        let fd = open(path + ".new", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        #expect(fd >= 0)
        defer { close(fd) }
        #expect(flock(fd, LOCK_EX | LOCK_NB) == 0)
        _ = "pid 4242 since then\n".withCString { write(fd, $0, strlen($0)) }
        #expect(rename(path + ".new", path) == 0)
        let finished = await runner.wait(timeout: 120)
        #expect(finished.exitCode == 75, "\(finished.description)")
        #expect(finished.stderr.contains("E_RUNNING"))
        #expect(finished.stderr.contains("was removed and another runner took the store (pid 4242 since then)"))
    }
}
