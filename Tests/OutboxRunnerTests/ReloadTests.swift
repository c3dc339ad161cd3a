import Foundation
import OutboxModel
import TestSupport
import Testing

/// SIGHUP makes a running `outbox run` read its config and definitions again; work in flight
/// carries on, and a reload with errors keeps what is in use.
struct ReloadTests {
    @Test func sighupReloadsDefinitionsAndKeepsThemWhenTheNewOnesAreBroken() async throws {
        let p = try Project(definitions: ["t": definition("t", hooks: false)])
        defer { p.server.release("a") }
        try await p.enqueue("t", path: "/hold/a", id: "a")
        let runner = try p.start(["run"])
        #expect(await p.server.waitForHeld("a"))

        // A definition with a hook now: the outcome of the request in flight goes to it.
        try p.define("t", definition("t"))
        runner.signal(SIGHUP)
        try await eventually("the reload logged") { runner.stderrSoFar.contains("outbox: reloaded") }

        // A broken definition: the errors are logged like `outbox check`, the old ones kept.
        _ = try p.write("definitions/broken.yaml", "key: broken\nrequest:\n  methd: PUT\n")
        runner.signal(SIGHUP)
        try await eventually("the refused reload logged") { runner.stderrSoFar.contains("the config and definitions in use are kept") }
        #expect(runner.stderrSoFar.contains("broken.yaml:3:3: error: unknown field \"methd\""), "\(runner.stderrSoFar)")

        p.server.release("a")
        try await eventually("the outcome delivered to the reloaded hook") { p.deliveries("a").count == 1 }
        runner.signal(SIGTERM)
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0, "SIGHUP no longer ends the runner: \(finished.description)")
    }
}
