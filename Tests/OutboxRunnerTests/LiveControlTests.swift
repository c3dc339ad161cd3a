import Foundation
import Glibc
import OutboxModel
import TestSupport
import Testing

// Control commands typed in another process while `outbox run` runs: cancel and pause.
// "In flight" is always a fact here (a response the test server holds), never a sleep.

/// How a run reports what it did: state events (`--events -`) or the summary (`--json`),
/// which cannot be combined in one run.
enum RunReport: String, CaseIterable, CustomTestStringConvertible, Sendable {
    case events, summary
    var testDescription: String { rawValue }
    var arguments: [String] { self == .events ? ["--events", "-"] : ["--json"] }
}

extension CommandResult {
    /// The state events of one entry, in order.
    func states(of id: String) -> [JSON] {
        jsonLines.filter { $0.string("type") == "state" && $0.string("id") == id }
    }
}

/// Checks that a finished run reported `id` cancelled by the user exactly once and never
/// as settled otherwise: one state event, or the summary's count.
func expectReportedCancelled(
    _ run: CommandResult, _ id: String, as report: RunReport,
    sourceLocation: SourceLocation = #_sourceLocation
) {
    switch report {
    case .events:
        let states = run.states(of: id)
        let cancelled = states.filter { $0.string("state") == "cancelled" }
        #expect(cancelled.count == 1, "\(states)", sourceLocation: sourceLocation)
        #expect(cancelled.first?.string("reason") == "user", sourceLocation: sourceLocation)
        #expect(
            states.allSatisfy { ["running", "cancelled"].contains($0.string("state") ?? "") }, "\(states)",
            sourceLocation: sourceLocation)
    case .summary:
        let summary = run.json
        #expect(summary?.int("cancelled") == 1, "\(run.stdout)", sourceLocation: sourceLocation)
        #expect(summary?.int("completed") == 0, "\(run.stdout)", sourceLocation: sourceLocation)
        #expect(summary?.int("errors") == 0, "\(run.stdout)", sourceLocation: sourceLocation)
    }
}

extension Project {
    /// Whether each part of a chunked entry is accepted, in part order (`show --json`).
    func acceptedParts(_ id: String) async throws -> [Bool] {
        (try await show(id)?.at("parts")?.arrayValue ?? []).map { $0["accepted"]?.boolValue ?? false }
    }
}

@Suite struct LiveControlTests {
    // MARK: Cancel

    /// A cancel from another process aborts the request in flight: the server sees the
    /// client go away from a response it never released, and no hook runs.
    @Test(arguments: RunReport.allCases)
    func cancelAbortsARequestInFlight(_ report: RunReport) async throws {
        let p = try Project(definitions: ["t": definition("t")])
        defer { p.server.release("c") }
        try await p.enqueue("t", path: "/hold/c", id: "c")
        let runner = try p.start(["run", "--drain"] + report.arguments)
        #expect(await p.server.waitForHeld("c"))
        try await eventually("the claim to be committed") { try await p.states()["c"] == "running" }

        let cancel = try await p.outbox(["cancel", "c"])
        #expect(cancel.exitCode == 0, "\(cancel.description)")
        // Never released: only the runner's abort takes the request off the hold.
        await eventually("the runner to abort the request") { p.server.heldCount("c") == 0 }
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished.description)")
        expectReportedCancelled(finished, "c", as: report)
        if report == .events {
            // The request was sent: it is an attempt, one that outbox stopped.
            let attempts = finished.jsonLines.filter { $0.string("type") == "attempt" }
            #expect(attempts.map { $0.string("outcome") } == ["aborted"], "\(finished.stdout)")
        }
        #expect(p.server.requests(path: "/hold/c").count == 1)
        #expect(p.hookLog.isEmpty, "a cancelled entry runs no hook")
        #expect(try await p.list().isEmpty)
    }

    /// A request stopped while its connection is still being made (a TLS handshake nobody
    /// answers) never went out: no attempt is counted, logged or reported.
    @Test func aRequestStoppedWhileItConnectsIsNoAttempt() async throws {
        // A socket nobody reads: once accepted, the runner's ClientHello waits there forever.
        let (listener, port) = try #require(boundLoopbackSocket())
        defer { close(listener) }
        #expect(listen(listener, 4) == 0)

        // However late a busy machine lets the test stop it, the handshake is still going then.
        let config = fastConfig.replacingOccurrences(of: "timeouts: { stall:", with: "timeouts: { connect: 1h, stall:")
        let p = try Project(config: config, definitions: ["t": definition("t")])
        let vars = #"{"url": "https://127.0.0.1:\#(port)/x", "tag": "a"}"#
        #expect(try await p.outbox(["enqueue", "t", "--id", "t1", "--vars", vars]).exitCode == 0)
        let runner = try p.start(["run", "--drain", "--grace", "0s", "--events", "-"])
        // Accepted: the transfer is connecting now, and stays so.
        let connection = try await offload { accept(listener, nil, nil) }
        defer { close(connection) }
        #expect(connection >= 0)
        runner.signal(SIGTERM)
        let finished = await runner.wait(timeout: 60)
        #expect(!finished.timedOut, "\(finished.description)")
        #expect(!finished.jsonLines.contains { $0.string("type") == "attempt" }, "\(finished.stdout)")
        let show = try #require(try await p.show("t1"))
        #expect(show["attempts"] == .int(0), "\(show)")
        #expect(show["state"] == .string("queued"))
    }

    /// A cancel of a chunked upload aborts every part in flight, starts no other part, and
    /// the `cancel` command puts the moved file back at its source path.
    @Test(arguments: RunReport.allCases)
    func cancelAbortsEveryPartInFlightAndGivesTheMovedFileBack(_ report: RunReport) async throws {
        let p = try Project(config: fastConfig + "part_concurrency: 2\n", definitions: [:])
        defer { p.server.release("parts") }
        try p.define("up", partsDefinition(p.server, min: "64KiB", max: "64KiB", ownership: "move"))
        p.server.script("/put/", [TestResponse.status(201).held("parts")])
        let file = p.path("data/mv.bin")
        try PartFiles.make(file, size: 4 * 65_536, seed: 9)
        let original = try PartFiles.sha(file, 0, 4 * 65_536)
        let enqueue = try await p.outbox(["enqueue", "up", "--id", "mv", "--vars", #"{"path": "data/mv.bin"}"#])
        #expect(enqueue.exitCode == 0, "\(enqueue.description)")
        #expect(!FileManager.default.fileExists(atPath: file), "moved into the store")

        let runner = try p.start(["run", "--drain"] + report.arguments)
        #expect(await p.server.waitForHeld("parts", count: 2))
        try await eventually("the claim to be committed") { try await p.states()["mv"] == "running" }
        #expect(try await p.outbox(["cancel", "mv"]).exitCode == 0)
        await eventually("the runner to abort both parts") { p.server.heldCount("parts") == 0 }
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished.description)")
        expectReportedCancelled(finished, "mv", as: report)
        #expect(p.server.requests(path: "/put/mv/").count == 2, "no part starts after the cancel")
        #expect(try PartFiles.sha(file, 0, 4 * 65_536) == original, "the file is back where it was")
        #expect(try FileManager.default.contentsOfDirectory(atPath: p.path(".outbox/bodies")).isEmpty)
        #expect(!p.exists("outcome.json") && !p.exists("error.json"), "a cancelled entry runs no hook")
        #expect(try await p.list().isEmpty)
    }

    /// A cancel committed while the runner reads the response (its parser runs) wins: the
    /// store recorded it first, so the entry is reported cancelled, never completed, and
    /// nothing of the attempt outlives the cancel.
    @Test(arguments: RunReport.allCases)
    func aSettleTheCancelBeatIsReportedAsTheCancel(_ report: RunReport) async throws {
        // The parser tells the test it runs, then waits until the test lets it answer.
        let parser = "#!/bin/sh\ncat > /dev/null\ntouch parsing\nwhile [ ! -e parse-go ]; do sleep 0.01; done\necho '{}'\n"
        // The parser may wait as long as the test takes to cancel, however busy the machine.
        let p = try Project(
            config: fastConfig + "plugins: { timeout: 30m }\n",
            definitions: ["t": definition("t", top: "response: { command: hooks/parse.sh }")],
            hooks: ["parse.sh": parser])
        defer { p.touch("parse-go") }
        try await p.enqueue("t", path: "/status/200", id: "r")
        let runner = try p.start(["run", "--drain"] + report.arguments)
        await eventually("the response to be parsed") { p.exists("parsing") }
        #expect(try await p.outbox(["cancel", "r"]).exitCode == 0)
        p.touch("parse-go")

        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished.description)")
        expectReportedCancelled(finished, "r", as: report)
        #expect(p.server.requests(path: "/status/200").count == 1)
        #expect(p.hookLog.isEmpty, "the outcome the cancel beat is not delivered")
        #expect(try await p.list().isEmpty)
        // The cancel forgot the entry with its attempts: a new entry of that id starts clean.
        try await p.enqueue("t", path: "/status/200", id: "r")
        let again = try #require(try await p.show("r"))
        #expect(again.at("attempts_log") == .array([]), "\(again)")
        #expect(again.at("outcomes") == .array([]), "\(again)")
    }

    // MARK: Pause

    /// A pause stops a chunked upload between parts: the parts in flight finish and stay
    /// accepted, no other part starts, the entry waits paused, and after `resume` only the
    /// remaining parts are sent.
    @Test func pauseStopsAChunkedUploadBetweenParts() async throws {
        let p = try Project(config: fastConfig + "part_concurrency: 2\n", definitions: ["probe": definition("probe")])
        defer { p.server.release("parts") }
        try p.define("up", partsDefinition(p.server, min: "64KiB", max: "64KiB"))
        p.server.script("/put/", [TestResponse.status(201).held("parts")])
        try PartFiles.make(p.path("pz.bin"), size: 5 * 65_536)
        #expect(try await p.outbox(["enqueue", "up", "--id", "pz", "--vars", #"{"path": "pz.bin"}"#]).exitCode == 0)
        let runner = try p.start(["run", "--drain", "--events", "-"])
        #expect(await p.server.waitForHeld("parts", count: 2))
        try await eventually("the claim to be committed") { try await p.states()["pz"] == "running" }

        #expect(try await p.outbox(["pause", "--key", "up"]).exitCode == 0)
        // An entry enqueued after the pause reaching the server proves the runner read the
        // store since the pause: from its next turn on, it knows of the pause.
        try await p.enqueue("probe", path: "/status/200?probe", id: "probe")
        await eventually("the probe's request") { p.server.requests(path: "/status/200?probe").count == 1 }

        // One part returns while the other is still in flight: no part may take its place.
        #expect(p.server.release("parts", count: 1) == 1)
        try await eventually("the first part's acceptance") {
            try await p.acceptedParts("pz").filter { $0 }.count == 1
        }
        #expect(p.server.release("parts", count: 1) == 1)
        var state = ""
        try await eventually("the entry to go back to the queue, or another part to start") {
            state = try await p.states()["pz"] ?? ""
            return state == "paused" || p.server.requests(path: "/put/pz/").count > 2
        }
        #expect(state == "paused")
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished.description)")
        #expect(p.server.requests(path: "/put/pz/").map(\.path).sorted() == ["/put/pz/1", "/put/pz/2"])
        #expect(try await p.acceptedParts("pz") == [true, true, false, false, false])
        #expect(finished.states(of: "pz").map { $0.string("state") ?? "" } == ["running", "paused"])
        #expect(!p.exists("outcome.json"))

        #expect(try await p.outbox(["resume", "--key", "up"]).exitCode == 0)
        p.server.release("parts")
        try await p.drain()
        let counts = Dictionary(grouping: p.server.requests(path: "/put/pz/"), by: { PartFiles.partNumber($0.path) ?? 0 })
            .mapValues(\.count)
        #expect(counts == [1: 1, 2: 1, 3: 1, 4: 1, 5: 1], "only the remaining parts are sent after resume")
        let outcome = try #require(PartFiles.readJSON(p.path("outcome.json")))
        #expect((outcome["parts"] as? [[String: Any]])?.count == 5)
    }

    /// `pause --key` with an empty key or one with spaces is E_INVALID and changes nothing:
    /// the running upload goes on to the end.
    @Test func pauseWithAnEmptyOrSpacedKeyIsInvalidAndChangesNothing() async throws {
        let p = try Project(config: fastConfig + "part_concurrency: 1\n", definitions: [:])
        defer { p.server.release("parts") }
        try p.define("up", partsDefinition(p.server, min: "64KiB", max: "64KiB", ownership: "copy"))
        p.server.script("/put/", [TestResponse.status(201).held("parts")])
        try PartFiles.make(p.path("k.bin"), size: 3 * 65_536)
        #expect(try await p.outbox(["enqueue", "up", "--id", "k", "--vars", #"{"path": "k.bin"}"#]).exitCode == 0)
        let runner = try p.start(["run", "--drain"])
        #expect(await p.server.waitForHeld("parts"))
        let control = "SELECT * FROM settings; SELECT * FROM paused_keys;"
        let before = try p.sqlite(control)

        for key in ["", "up x", " up", "up\t"] {
            let pause = try await p.outbox(["pause", "--key", key])
            #expect(pause.exitCode == 65, "pause --key \(key.debugDescription): \(pause.description)")
            #expect(pause.stderr.hasPrefix("outbox: E_INVALID: "), "\(pause.stderr)")
        }
        #expect(try p.sqlite(control) == before)
        p.server.release("parts")
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished.description)")
        #expect(p.server.requests(path: "/put/k/").count == 3, "the upload went on")
        #expect(PartFiles.readJSON(p.path("outcome.json"))?["outcome"] as? String == "completed")
    }
}
