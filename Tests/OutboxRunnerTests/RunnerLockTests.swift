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
