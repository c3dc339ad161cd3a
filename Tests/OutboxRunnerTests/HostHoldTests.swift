import Glibc
import OutboxModel
import TestSupport
import Testing

/// A host that does not answer is held: one probe at a time, the other entries for it wait
/// without spending attempts, and entries for other hosts go on.
struct HostHoldTests {
    @Test func aDownHostIsHeldWhileOtherHostsGoOn() async throws {
        // Probes an hour apart: what is asserted while the host is held cannot change under the
        // test (30 s could pass on a busy machine before the last look, and d2 be the probe).
        // One failure holds the host: d1 fails, and d2 and d3, waiting as standby requests,
        // go back to the queue: neither is tried while the host is held.
        let config = fastConfig + "concurrency: 1\nhosts: { hold_after: 1 }\n"
        let p = try Project(
            config: config,
            definitions: ["t": definition("t", top: "retry:\n  backoff: { base: 1h, max: 2h, jitter: 0 }"), "ok": definition("ok")])
        let (blocker, port) = try refusingPort()
        let host = "127.0.0.1:\(port)"
        for id in ["d1", "d2", "d3"] {
            let vars = JSON.object([("url", .string("http://\(host)/up")), ("tag", .string(id))]).serialized()
            #expect(try await p.outbox(["enqueue", "t", "--vars", vars, "--id", id]).exitCode == 0)
        }
        try await p.enqueue("ok", path: "/other", id: "other")

        let runner = try p.start(["run"])
        try await eventually("the host is held and the other host's entry delivered") {
            let stats = try await p.outbox(["stats", "--json"]).json
            let held = stats?["held_hosts"]?.arrayValue?.compactMap(\.stringValue) ?? []
            guard held == [host], p.deliveries("other").count == 1 else { return false }
            return try await p.list().contains { $0.string("id") == "d3" && $0.string("reason") == "waiting for its host to answer" }
        }
        // Held: the entry behind the failures was never tried, and `explain` says why.
        #expect(try await p.show("d2")?.int("attempts") == 0)
        #expect(try await p.show("d3")?.int("attempts") == 0)
        let explain = try await p.outbox(["explain", "d3"])
        #expect(explain.stdout.contains("its host \(host) is held after connection failures"), "\(explain.stdout)")
        runner.signal(SIGTERM)
        let run = await runner.wait()
        #expect(run.exitCode == 0 && !run.timedOut, "run: \(run)")
        #expect(run.stderr.contains("holding \(host) after 1 connection failure:"), "\(run.stderr)")
        #expect(p.server.requests(path: "/other").count == 1)
        // The runner's holds end with it: a later runner judges the host afresh.
        #expect(try await p.outbox(["stats", "--json"]).json?["held_hosts"]?.arrayValue == [])
        let rows = try await p.list()
        #expect(rows.filter { $0.string("id")!.hasPrefix("d") }.allSatisfy { $0.string("state") == "queued" })
        #expect(!rows.contains { $0.string("reason") == "waiting for its host to answer" })

        // The host comes up: sent now, each entry once.
        let server = try TestHTTPServer(port: port)
        close(blocker)
        defer { server.stop() }
        #expect(try await p.outbox(["retry", "--key", "t"]).exitCode == 0)
        try await p.drain()
        #expect(server.requests(path: "/up").count == 3)
        for id in ["d1", "d2", "d3"] { #expect(p.deliveries(id).first?.string("stdin.outcome") == "completed") }
        #expect(p.deliveries("d3").first?.int("stdin.meta.attempts") == 1)
    }

    /// A connection to a host that got no answer, below `hold_after`: the curl thread starts
    /// none of that host's standby requests on its own until the runner says it does not hold
    /// the host; then they go in the next freed slot, not after every other host's backlog.
    @Test func aHostNotHeldAfterAFailureKeepsItsPlaceInTheStandbyOrder() async throws {
        let config = fastConfig + "concurrency: 1\nhosts: { hold_after: 5 }\n"
        // a1 is not tried again while the test runs (it looks for its one attempt, then for the
        // slot a1 would compete for).
        let p = try Project(
            config: config, definitions: ["t": definition("t", top: "retry:\n  backoff: { base: 1h, max: 2h, jitter: 0 }")])
        let other = try TestHTTPServer(port: 0)
        defer { other.stop() }
        // a1 is reset without an answer; a2 waits behind it as a standby request, with b1 and b2
        // of the other host (held there until the test releases them), b3 and b4 queued. a1 is
        // held until all three are standby requests: a slow machine may claim them late.
        p.server.script("/reset-held/a1", [TestResponse.reset.held("a1")])
        var entries = [("a1", p.url("/reset-held/a1")), ("a2", p.url("/hold/a2"))]
        entries += (1...4).map { ("b\($0)", other.url("/hold/b?\($0)")) }
        for (id, url) in entries {
            let vars = JSON.object([("url", .string(url)), ("tag", .string(id))]).serialized()
            #expect(try await p.outbox(["enqueue", "t", "--vars", vars, "--id", id]).exitCode == 0)
        }
        let runner = try p.start(["run"])
        defer {
            p.server.release("a1")
            other.release("b")
            p.server.release("a2")
        }
        #expect(await p.server.waitForHeld("a1"))
        // Standby requests show as running (claimed by the runner, on the curl thread).
        try await eventually("a2, b1 and b2 standby") {
            let running = try await p.list().filter { $0.string("state") == "running" }.compactMap { $0.string("id") }
            return Set(running).isSuperset(of: ["a1", "a2", "b1", "b2"])
        }
        p.server.release("a1")
        // b1 took a1's slot (a2's host had just failed to answer), and the runner has settled
        // a1's attempt: it has told the curl thread that a2's host is not held.
        #expect(await other.waitForHeld("b"))
        try await eventually("a1's failed attempt recorded") { try await p.show("a1")?.int("attempts") == 1 }
        #expect(p.server.requests(path: "/hold/a2").isEmpty)
        // The slot b1 frees goes to a2, the oldest standby request, not to b2 (a2 then holds it).
        other.release("b", count: 1)
        #expect(await p.server.waitForHeld("a2"))
        #expect(other.requests(path: "/hold/b").count == 1, "b2 started before a2")
        p.server.release("a2")
        other.release("b")
        await eventually("a2 and b2 to b4 delivered") { ["a2", "b2", "b3", "b4"].allSatisfy { p.deliveries($0).count == 1 } }
        runner.signal(SIGTERM)
        let run = await runner.wait()
        #expect(run.exitCode == 0 && !run.timedOut, "run: \(run)")
    }

    @Test func theFirstAnswerReleasesEveryEntryOfAHeldHost() async throws {
        let config = fastConfig + "concurrency: 2\nhosts: { hold_after: 1 }\n"
        let p = try Project(config: config, definitions: ["t": definition("t")])
        let (blocker, port) = try refusingPort()
        let host = "127.0.0.1:\(port)"
        let ids = (1...6).map { "e\($0)" }
        for id in ids {
            let vars = JSON.object([("url", .string("http://\(host)/up")), ("tag", .string(id))]).serialized()
            #expect(try await p.outbox(["enqueue", "t", "--vars", vars, "--id", id]).exitCode == 0)
        }
        let runner = try p.start(["run"])
        try await eventually("the host is held") {
            try await p.outbox(["stats", "--json"]).json?["held_hosts"]?.arrayValue == [.string(host)]
        }
        // The host comes up while the same runner holds it: a probe gets an answer and
        // every entry goes, without waiting for a later run.
        let server = try TestHTTPServer(port: port)
        defer { server.stop() }
        close(blocker)
        await eventually("every entry delivered") { ids.allSatisfy { p.deliveries($0).count == 1 } }
        runner.signal(SIGTERM)
        let run = await runner.wait()
        #expect(run.exitCode == 0 && !run.timedOut, "run: \(run)")
        #expect(run.stderr.contains("\(host) answers again"), "\(run.stderr)")
        #expect(server.requests(path: "/up").count == ids.count)
        for id in ids { #expect(p.deliveries(id).first?.string("stdin.outcome") == "completed") }
        #expect(try await p.outbox(["stats", "--json"]).json?["held_hosts"]?.arrayValue == [])
    }
}
