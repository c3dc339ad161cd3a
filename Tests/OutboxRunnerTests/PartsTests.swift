import Digest
import Foundation
import Testing
import OutboxModel
@testable import OutboxRunner
import OutboxStore
import TestSupport

// Chunked uploads end to end: the real `outbox` binary against a loopback test server
// (parts, states, progress events). Each test has its own project folder and its own
// server on port 0.

/// Files and hashes for part tests.
enum PartFiles {
    /// Writes `size` deterministic pseudo-random bytes (xorshift), different for each seed,
    /// 1 MiB at a time so that the test process's memory stays flat (other suites measure it).
    static func make(_ path: String, size: Int, seed: UInt64 = 1) throws {
        var state = seed &* 0x9E37_79B9_7F4A_7C15 | 1
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        guard FileManager.default.createFile(atPath: path, contents: nil) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path])
        }
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        defer { try? handle.close() }
        var chunk = [UInt64](repeating: 0, count: (1 << 20) / 8)
        var left = size
        while left > 0 {
            for i in chunk.indices {
                state ^= state << 13
                state ^= state >> 7
                state ^= state << 17
                chunk[i] = state
            }
            let n = min(left, 1 << 20)
            chunk.withUnsafeBytes { handle.write(Data($0.prefix(n))) }
            left -= n
        }
    }

    /// SHA-256 (hex) of bytes [start, end) of a file, read in 4 MiB pieces.
    static func sha(_ path: String, _ start: Int64, _ end: Int64) throws -> String {
        let handle = try FileHandle(forReadingFrom: URL(fileURLWithPath: path))
        defer { try? handle.close() }
        try handle.seek(toOffset: UInt64(start))
        var hasher = SHA256.Hasher()
        var left = end - start
        while left > 0 {
            let chunk = try handle.read(upToCount: Int(min(left, 4 << 20))) ?? Data()
            if chunk.isEmpty { break }
            chunk.withUnsafeBytes { hasher.update($0) }
            left -= Int64(chunk.count)
        }
        return hasher.finalizeHex()
    }

    /// The ETag the test server gives a body: its SHA-256's first 32 hex digits, quoted.
    static func etag(_ sha: String) -> String { "\"" + sha.prefix(32) + "\"" }

    static func readJSON(_ path: String) -> [String: Any]? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        return try? JSONSerialization.jsonObject(with: data) as? [String: Any]
    }

    /// The parts of `outbox show ID --json`: (index, start, end, accepted).
    static func storedParts(_ sandbox: OutboxSandbox, _ id: String) async throws -> [(index: Int, start: Int64, end: Int64, accepted: Bool)]
    {
        let parts = (try await sandbox.show(id)?["parts"] as? [[String: Any]]) ?? []
        return parts.map { p in
            (
                (p["index"] as? Int) ?? -1, Int64((p["start"] as? Int) ?? -1), Int64((p["end"] as? Int) ?? -1),
                (p["accepted"] as? Bool) ?? false
            )
        }
    }

    /// Part number (1-based) from a recorded path `/put/ID/N`.
    static func partNumber(_ path: String) -> Int? { path.split(separator: "/").last.flatMap { Int($0) } }
}

/// A definition of a chunked PUT to `/put/{{ entry.id }}/{{ part.number }}` on `server`.
func partsDefinition(
    _ server: TestHTTPServer, key: String = "up", min: String, max: String, extra: String = "",
    ownership: String? = nil
) -> String {
    """
    key: \(key)
    request:
      method: PUT
      file: "{{ vars.path }}"
    \(ownership.map { "  ownership: \($0)\n" } ?? "")  parts:
        plan: { min: \(min), max: \(max) }
        url: "\(server.baseURL)/put/{{ entry.id }}/{{ part.number }}"
        headers:
          Content-Range: "bytes {{ part.start }}-{{ part.last }}/{{ file.size }}"
    retry:
      backoff: { base: 50ms, max: 200ms, jitter: 0 }
    on_success: "cat > outcome.json"
    on_error: "cat > error.json"
    \(extra)
    """
}

@Suite(.serialized) struct PartsTests {
    /// A test server answering as `script` says, and a sandbox with `config` whose `up`
    /// definition sends f.bin (`parts` parts of 256 KiB, copied in) to it, enqueued as `id`.
    static func enqueueParts(
        id: String, parts: Int, config: String, script: [(String, TestResponse)]
    ) async throws -> (TestHTTPServer, OutboxSandbox) {
        let server = try TestHTTPServer()
        for (path, response) in script { server.script(path, [response]) }
        let sandbox = try OutboxSandbox(config: config)
        try sandbox.define("up", partsDefinition(server, min: "256KiB", max: "256KiB", ownership: "copy"))
        try PartFiles.make(sandbox.path("f.bin"), size: parts * 262_144)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", id, "--vars", #"{"path": "f.bin"}"#]).status == 0)
        return (server, sandbox)
    }

    /// A `headers update` while a chunked upload runs reaches its later parts (they went with
    /// the headers the upload started with until one was retried).
    @Test func aHeadersUpdateReachesTheLaterPartsOfARunningUpload() async throws {
        let server = try TestHTTPServer()
        server.script("/put/hu/1", [.hold("p1")])
        // No stall limit: the held part stays one request until it is released, however slow the machine.
        let sandbox = try OutboxSandbox(config: "part_concurrency: 1\nheaders: { X-Tok: old }\ntimeouts: { stall: { for: 1h } }\n")
        try sandbox.define("up", partsDefinition(server, min: "256KiB", max: "256KiB", ownership: "copy"))
        try PartFiles.make(sandbox.path("f.bin"), size: 3 * 262_144)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "hu", "--vars", #"{"path": "f.bin"}"#]).status == 0)
        let run = try sandbox.start(["run", "--drain", "-v"])
        #expect(await server.waitForHeld("p1"))
        #expect(try await sandbox.outbox(["headers", "update", "X-Tok: new"]).status == 0)
        await eventually("the runner took the update") { run.stderrSoFar.contains("hu: its next parts carry the updated headers") }
        server.release("p1")
        let finished = await run.wait()
        #expect(finished.exitCode == 0, "\(finished)")
        // The answered request of each part (one cut short on a busy machine is retried).
        let sent = (1...3).map { server.requests(path: "/put/hu/\($0)").first(where: \.completed)?.header("x-tok") }
        let all = server.requests(path: "/put/hu/").map { "\($0.path) \($0.header("x-tok") ?? "-") \($0.completed)" }
        #expect(sent == ["old", "new", "new"], "\(sent); every request: \(all); the run said: \(finished.stderr)")
    }

    @Test func chunkedUploadSendsEachPartOnceAndListsEveryETag() async throws {
        let server = try TestHTTPServer()
        let sandbox = try OutboxSandbox(config: "part_concurrency: 3\n")
        try sandbox.define("up", partsDefinition(server, min: "1MiB", max: "4MiB"))
        let file = sandbox.path("data/capture.bin")
        let size = 10 * 1_048_576 + 123
        try PartFiles.make(file, size: size, seed: 7)
        let ranges: [(Int64, Int64)] = [(0, 4_194_304), (4_194_304, 8_388_608), (8_388_608, Int64(size))]
        let hashes = try ranges.map { try PartFiles.sha(file, $0.0, $0.1) }

        let enqueue = try await sandbox.outbox(["enqueue", "up", "--id", "cap-1", "--vars", #"{"path": "data/capture.bin"}"#])
        #expect(enqueue.status == 0)
        #expect(enqueue.stdout == "cap-1\n")
        // Parts default to ownership move: the file now lives in the store.
        #expect(!FileManager.default.fileExists(atPath: file))

        let run = try await sandbox.outbox(["run", "--drain", "--events", "-"])
        #expect(run.status == 0, "\(run.stderr)")
        let received = server.requests(path: "/put/cap-1/")
        #expect(received.count == 3)
        for record in received {
            let number = try #require(PartFiles.partNumber(record.path))
            #expect(record.completed)
            #expect(record.method == "PUT")
            #expect(record.bodySHA256 == hashes[number - 1])
            #expect(record.header("Content-Range") == "bytes \(ranges[number - 1].0)-\(ranges[number - 1].1 - 1)/\(size)")
            #expect(record.header("Expect") == nil)
        }
        let outcome = try #require(PartFiles.readJSON(sandbox.path("outcome.json")))
        #expect(outcome["outcome"] as? String == "completed")
        // One Idempotency-Key names one payload: each part's is the entry's with its number.
        let key = try #require((outcome["meta"] as? [String: Any])?["idempotency_key"] as? String)
        for record in received {
            #expect(record.header("Idempotency-Key") == "\(key)-part-\(PartFiles.partNumber(record.path) ?? 0)")
        }
        let parts = try #require(outcome["parts"] as? [[String: Any]])
        #expect(parts.map { $0["index"] as? Int } == [0, 1, 2])
        #expect(parts.map { $0["status"] as? Int } == [201, 201, 201])
        #expect(parts.map { ($0["headers"] as? [String: String])?["etag"] } == hashes.map(PartFiles.etag))
        // Completed and acknowledged: forgotten with its bytes.
        #expect(try await sandbox.list().isEmpty)
        #expect(try FileManager.default.contentsOfDirectory(atPath: sandbox.path(".outbox/bodies")).isEmpty)

        // Progress events carry bytes sent and bytes accepted; the last one is complete.
        let progress = run.lines.compactMap { line -> [String: Any]? in
            guard let event = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                event["type"] as? String == "progress"
            else { return nil }
            return event
        }
        let last = try #require(progress.last)
        #expect(last["bytes_sent"] as? Int == size)
        #expect(last["bytes_accepted"] as? Int == size)
        #expect(last["total_bytes"] as? Int == size)
        let accepted = progress.compactMap { $0["bytes_accepted"] as? Int }
        #expect(accepted == accepted.sorted())
        // Accepted bytes are always a sum of whole parts, in whatever order they finished.
        let sizes = ranges.map { Int($0.1 - $0.0) }
        var sums: Set<Int> = [0]
        for partSize in sizes { sums.formUnion(sums.map { $0 + partSize }) }
        #expect(Set(accepted).isSubset(of: sums))
    }

    struct Limits: CustomTestStringConvertible, Sendable {
        var partConcurrency: Int
        var perHost: Int
        var connections: Int
        var testDescription: String { "part_concurrency \(partConcurrency), per_host \(perHost)" }
    }

    @Test(arguments: [
        Limits(partConcurrency: 2, perHost: 4, connections: 2),
        Limits(partConcurrency: 3, perHost: 1, connections: 1),
        Limits(partConcurrency: 1, perHost: 4, connections: 1),
    ])
    func partsInFlightStayWithinPartConcurrencyAndPerHost(_ limits: Limits) async throws {
        // Every part is held until the test lets it go, so the parts in flight at once are
        // counted, not guessed from timing.
        let (server, sandbox) = try await Self.enqueueParts(
            id: "lim", parts: 6, config: "part_concurrency: \(limits.partConcurrency)\nper_host: \(limits.perHost)\n",
            script: [("/put/", TestResponse.status(201).held("parts"))])
        let runner = try sandbox.start(["run", "--drain"])
        // One part at a time goes on; each time, as many parts as the limits allow are held.
        let limit = min(limits.partConcurrency, limits.perHost)
        var released = 0
        while released < 6 {
            let inFlight = min(limit, 6 - released)
            guard await server.waitForHeld("parts", count: inFlight) else {
                Issue.record("\(inFlight) parts were never in flight at once (\(released) released)")
                break
            }
            #expect(server.requests(path: "/put/lim/").count == released + inFlight, "more parts in flight than the limits allow")
            released += server.release("parts", count: 1)
        }
        server.release("parts")
        let run = await runner.wait()
        #expect(run.status == 0, "\(run.stderr)")
        let received = server.requests(path: "/put/lim/")
        #expect(received.count == 6)
        // curl reuses an idle connection before opening one, so the connections the server
        // saw are the parts that were in flight at once.
        #expect(Set(received.map(\.connectionID)).count == limits.connections)
        #expect(FileManager.default.fileExists(atPath: sandbox.path("outcome.json")))
    }

    @Test func transientPartFailureRetriesOnlyThatPart() async throws {
        let server = try TestHTTPServer()
        server.script("/put/tr/2", [.status(503), .status(500), .json(201, "{}", headers: [("ETag", "\"second\"")])])
        let sandbox = try OutboxSandbox()
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "64KiB"))
        try PartFiles.make(sandbox.path("f.bin"), size: 3 * 65_536)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "tr", "--vars", #"{"path": "f.bin"}"#]).status == 0)
        let run = try await sandbox.outbox(["run", "--drain", "--events", "-"])
        #expect(run.status == 0, "\(run.stderr)")
        let counts = Dictionary(grouping: server.requests(path: "/put/tr/"), by: { PartFiles.partNumber($0.path) ?? 0 }).mapValues(\.count)
        #expect(counts == [1: 1, 2: 3, 3: 1])
        let outcome = try #require(PartFiles.readJSON(sandbox.path("outcome.json")))
        let parts = try #require(outcome["parts"] as? [[String: Any]])
        #expect((parts[1]["headers"] as? [String: String])?["etag"] == "\"second\"")
        let partAttempts = run.lines.filter { $0.contains(#""type":"attempt""#) && $0.contains(#""part_index":1"#) }
        #expect(partAttempts.count == 3)
        #expect(partAttempts.filter { $0.contains(#""outcome":"retry""#) }.count == 2)
    }

    /// `outbox retry` of a chunked entry whose part waits an hour for its own retry: the part
    /// is due now too, so the next run sends it (it was held back to the part's old time).
    @Test func retryMakesAWaitingPartDueNow() async throws {
        let server = try TestHTTPServer()
        server.script("/put/rt/2", [.status(503), .json(201, "{}")])
        let sandbox = try OutboxSandbox()
        let slow = partsDefinition(server, min: "64KiB", max: "64KiB").replacingOccurrences(
            of: "backoff: { base: 50ms, max: 200ms, jitter: 0 }", with: "backoff: { base: 1h, max: 2h, jitter: 0 }")
        try sandbox.define("up", slow)
        try PartFiles.make(sandbox.path("f.bin"), size: 3 * 65_536)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "rt", "--vars", #"{"path": "f.bin"}"#]).status == 0)
        #expect(try await sandbox.outbox(["run", "--drain"]).status == 0)
        #expect(server.requests(path: "/put/rt/2").count == 1, "part 2 waits an hour")
        #expect(try await sandbox.outbox(["retry", "rt"]).status == 0)
        let run = try await sandbox.outbox(["run", "--drain"])
        #expect(run.status == 0, "\(run.stderr)")
        #expect(server.requests(path: "/put/rt/2").count == 2, "sent again at once")
        #expect(try await sandbox.list().isEmpty, "completed")
    }

    /// Network faults inside parts retry only those parts: a connection reset while the
    /// server reads a part's body, and a server that takes a whole part and never answers
    /// (the stall timeout ends the wait). Every part is accepted once, from its own bytes.
    @Test func resetAndStalledPartsRetryOnlyThoseParts() async throws {
        let server = try TestHTTPServer()
        server.script("/put/nf/2", [.resetWhileReadingRequest(afterBytes: 100_000), .status(201, headers: [("ETag", "\"two\"")])])
        server.script("/put/nf/3", [.stall, .status(201, headers: [("ETag", "\"three\"")])])
        // A stall window long enough that no healthy part on a loaded machine looks stalled.
        let sandbox = try OutboxSandbox(config: "part_concurrency: 2\ntimeouts: { stall: { below: 1KiB, for: 5s } }\n")
        try sandbox.define("up", partsDefinition(server, min: "256KiB", max: "256KiB"))
        let file = sandbox.path("f.bin")
        let partSize = 262_144
        try PartFiles.make(file, size: 4 * partSize, seed: 3)
        let hashes = try (0..<4).map { try PartFiles.sha(file, Int64($0 * partSize), Int64(($0 + 1) * partSize)) }
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "nf", "--vars", #"{"path": "f.bin"}"#]).status == 0)

        // Part 3's retry comes due 5 s (the stall window) after it started, past the default
        // 10 s horizon once reaching it took 5 s: a horizon no busy machine reaches.
        let run = try await sandbox.outbox(["run", "--drain", "--horizon", "10m", "--events", "-"])
        #expect(run.status == 0, "\(run.stderr)")
        let received = server.requests(path: "/put/nf/")
        let byPart = Dictionary(grouping: received, by: { PartFiles.partNumber($0.path) ?? 0 })
        #expect(byPart.mapValues(\.count) == [1: 1, 2: 2, 3: 2, 4: 1])
        // The reset cut part 2's first body short; every body that arrived whole is its
        // part's bytes, the stalled part's first one included.
        #expect(byPart[2]?.first?.completed == false)
        #expect(byPart[3]?.first?.completed == true)
        for record in received where record.completed {
            #expect(record.bodySHA256 == hashes[(PartFiles.partNumber(record.path) ?? 1) - 1])
        }
        let outcome = try #require(PartFiles.readJSON(sandbox.path("outcome.json")))
        let parts = try #require(outcome["parts"] as? [[String: Any]])
        #expect(parts.map { $0["status"] as? Int } == [201, 201, 201, 201])
        #expect(
            parts.map { ($0["headers"] as? [String: String])?["etag"] }
                == [PartFiles.etag(hashes[0]), "\"two\"", "\"three\"", PartFiles.etag(hashes[3])])
        let retried = run.lines.filter { $0.contains(#""type":"attempt""#) && $0.contains(#""outcome":"retry""#) }
        // Only those two parts are retried. The reset part is retried by outbox (kind network),
        // on a reused connection too (libcurl's own re-send is refused): one retry event.
        #expect(retried.allSatisfy { $0.contains(#""part_index":1"#) || $0.contains(#""part_index":2"#) }, "\(retried)")
        #expect(retried.filter { $0.contains(#""part_index":1"#) }.allSatisfy { $0.contains(#""error_kind":"network""#) })
        #expect(retried.filter { $0.contains(#""part_index":1"#) }.count == 1, "\(retried)")
        #expect(retried.contains { $0.contains(#""part_index":2"#) && $0.contains(#""error_kind":"timeout""#) })
    }

    /// A server that fails every part: the parts in flight fail and wait for their retries
    /// holding their slots, so the same part_concurrency parts are tried again and again,
    /// and the other parts are not each tried once in a burst.
    @Test func failingPartsKeepTheirSlotsWhileTheyWait() async throws {
        let server = try TestHTTPServer()
        server.script("/put/down/", [.status(503)])
        let sandbox = try OutboxSandbox(config: "part_concurrency: 3\n")
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "64KiB"))
        try PartFiles.make(sandbox.path("f.bin"), size: 10 * 65_536)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "down", "--vars", #"{"path": "f.bin"}"#]).status == 0)

        // Stopped once a part was tried again, however long that took.
        try await sandbox.runUntil(until: "a part tried again") { _ in server.requests(path: "/put/down/").count > 3 }
        let received = server.requests(path: "/put/down/")
        #expect(Set(received.compactMap { PartFiles.partNumber($0.path) }) == [1, 2, 3])
        #expect(received.count > 3, "no part was retried (\(received.count) requests)")
        let show = try #require(try await sandbox.show("down"))
        #expect(show["state"] as? String == "queued")
        #expect(try await PartFiles.storedParts(sandbox, "down").allSatisfy { !$0.accepted })
    }

    @Test func terminalPartFailureSettlesErrorNamingThePart() async throws {
        let server = try TestHTTPServer()
        server.script("/put/te/3", [.status(422, body: "part rejected")])
        let sandbox = try OutboxSandbox(config: "part_concurrency: 1\n")
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "64KiB"))
        try PartFiles.make(sandbox.path("f.bin"), size: 4 * 65_536)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "te", "--vars", #"{"path": "f.bin"}"#]).status == 0)
        let run = try await sandbox.outbox(["run", "--drain"])
        #expect(run.status == 1, "the entry settled error: \(run.stderr)")
        let error = try #require(PartFiles.readJSON(sandbox.path("error.json")))
        let detail = try #require(error["error"] as? [String: Any])
        #expect(detail["kind"] as? String == "http")
        #expect(detail["status"] as? Int == 422)
        #expect(detail["part_index"] as? Int == 2)
        #expect(detail["body"] as? String == "part rejected")
        #expect((detail["message"] as? String)?.hasPrefix("part 3 of 4 (index 2, bytes 131072-196607)") == true)
        // An error entry stays (until cancel or a same-id enqueue); part 4 was never sent.
        let row = try #require(try await sandbox.list().first)
        #expect(row["state"] as? String == "error")
        #expect(row["reason"] as? String == "http")
        #expect(server.requests(path: "/put/te/4").isEmpty)
        // `show` gives the refused part its attempt and status (they read null and 0).
        let parts = try #require(try await sandbox.show("te")?["parts"] as? [[String: Any]])
        #expect(parts.map { $0["status"] as? Int } == [201, 201, 422, nil], "\(parts)")
        #expect(parts.map { $0["attempts"] as? Int } == [1, 1, 1, 0], "\(parts)")
    }

    /// The store's copy of a file sent in parts must have the size enqueued: parts read
    /// ranges, and a longer file put in its place (a hand or a tool editing the store) would
    /// send its first bytes as if they were the file's.
    @Test func aStagedFileOfAnotherSizeSendsNoPart() async throws {
        let (server, sandbox) = try await Self.enqueueParts(id: "sz", parts: 2, config: "", script: [])
        let staged = try #require(try FileManager.default.contentsOfDirectory(atPath: sandbox.path(".outbox/bodies")).first)
        try PartFiles.make(sandbox.path(".outbox/bodies/" + staged), size: 3 * 262_144, seed: 9)
        let run = try await sandbox.outbox(["run", "--drain"])
        #expect(run.status == 1, "the entry settled error: \(run.stderr)")
        let detail = try #require(PartFiles.readJSON(sandbox.path("error.json"))?["error"] as? [String: Any])
        #expect(detail["kind"] as? String == "file")
        #expect((detail["message"] as? String)?.contains("has 786432 bytes, not the 524288 enqueued") == true, "\(detail)")
        #expect(server.requests(path: "/put/sz/").isEmpty)
    }

    /// Part rows damaged by hand stop the run with E_STORAGE naming the damage, before any
    /// part is sent: a start below 0 (the runner stopped on a trap there), a row lost (the
    /// rest would complete the entry with bytes missing), a URL of another scheme (it was
    /// retried without end, its host held).
    @Test(arguments: [
        (
            "UPDATE parts SET start = -9223372036854775808 WHERE idx = 0",
            "E_STORAGE: a part of an entry is damaged: the part at index 0 covers -9223372036854775808..<262144"
        ),
        ("DELETE FROM parts WHERE idx = 1", "E_STORAGE: the stored entry dp is damaged: its parts are not numbered 0 to 1"),
        (
            "UPDATE parts SET url = 'file:///etc/passwd' WHERE idx = 0",
            "E_STORAGE: a part of an entry is damaged: the URL of the part at index 0"
        ),
    ])
    func aDamagedPartRowStopsTheRunWithAStorageError(_ damage: String, _ message: String) async throws {
        let (server, sandbox) = try await Self.enqueueParts(id: "dp", parts: 3, config: "", script: [])
        _ = try sandbox.sqlite(damage)
        let run = try await sandbox.outbox(["run", "--drain"])
        #expect(run.status == 74, "\(run.stderr)")
        #expect(run.stderr.contains(message), "\(run.stderr)")
        #expect(server.requests(path: "/put/dp/").isEmpty)
    }

    /// A part stopped because another was refused counts as an attempt: the hook, `show`
    /// and the attempt events agree on how many requests were sent.
    @Test func aPartStoppedByARefusalCountsAsAnAttempt() async throws {
        let server = try TestHTTPServer()
        server.script("/put/ab/1", [TestResponse.status(200).held("p1")])
        server.script("/put/ab/2", [TestResponse.status(422, body: "no").held("p2")])
        let sandbox = try OutboxSandbox(config: "part_concurrency: 2\n")
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "64KiB"))
        try PartFiles.make(sandbox.path("f.bin"), size: 3 * 65_536)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "ab", "--vars", #"{"path": "f.bin"}"#]).status == 0)
        let runner = try sandbox.start(["run", "--drain", "--events", "-"])
        await eventually("both parts are on the server") { server.heldCount("p1") == 1 && server.heldCount("p2") == 1 }
        _ = server.release("p2")
        let run = await runner.wait()
        _ = server.release("p1")
        #expect(run.exitCode == 1, "\(run.stderr)")
        let attempts = run.stdout.split(separator: "\n").compactMap { try? JSON.parse(String($0)) }.filter {
            $0["type"] == .string("attempt")
        }
        #expect(attempts.map { $0["part_index"]?.int64Value ?? -1 }.sorted() == [0, 1])
        #expect(attempts.first { $0["part_index"] == .int(0) }?["outcome"] == .string("aborted"))
        #expect(attempts.first { $0["part_index"] == .int(1) }?["outcome"] == .string("error"))
        let error = try #require(PartFiles.readJSON(sandbox.path("error.json")))
        #expect((error["meta"] as? [String: Any])?["attempts"] as? Int == 2)
        #expect(try await sandbox.show("ab")?["attempts"] as? Int == 2)
        #expect(server.requests(path: "/put/ab/3").isEmpty)
    }

    @Test func unauthorizedPartParksTheEntryUntilHeadersUpdate() async throws {
        let server = try TestHTTPServer()
        server.script("/put/au/2", [.status(401), .json(201, "{}", headers: [("ETag", "\"after-auth\"")])])
        let sandbox = try OutboxSandbox(config: "part_concurrency: 1\n")
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "64KiB"))
        try PartFiles.make(sandbox.path("f.bin"), size: 3 * 65_536)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "au", "--vars", #"{"path": "f.bin"}"#]).status == 0)
        #expect(try await sandbox.outbox(["run", "--drain"]).status == 2, "the entry is left awaiting-auth")
        let parked = try #require(try await sandbox.list().first)
        #expect(parked["state"] as? String == "awaiting-auth")
        #expect(try await PartFiles.storedParts(sandbox, "au").map(\.accepted) == [true, false, false])

        #expect(try await sandbox.outbox(["headers", "update", "Authorization: Bearer fresh"]).status == 0)
        let run = try await sandbox.outbox(["run", "--drain"])
        #expect(run.status == 0, "\(run.stderr)")
        let counts = Dictionary(grouping: server.requests(path: "/put/au/"), by: { PartFiles.partNumber($0.path) ?? 0 }).mapValues(\.count)
        #expect(counts == [1: 1, 2: 2, 3: 1])
        #expect(server.requests(path: "/put/au/2").last?.header("Authorization") == "Bearer fresh")
        let outcome = try #require(PartFiles.readJSON(sandbox.path("outcome.json")))
        #expect(outcome["outcome"] as? String == "completed")
    }

    /// A stop with no grace aborts a part in flight; a same-id enqueue with the same parts
    /// resumes the entry (the moved file still counts as the same file); the next run sends
    /// only the part that was never accepted.
    @Test func stopAndSameIdResumeNeverResendAcceptedParts() async throws {
        let server = try TestHTTPServer()
        server.script("/put/rs/4", [TestResponse.status(201).held("four"), .json(201, "{}", headers: [("ETag", "\"four\"")])])
        // No stall limit: the held part is never given up (and accepted when sent again) while
        // the test waits for the others, however slow the machine.
        let sandbox = try OutboxSandbox(config: "part_concurrency: 2\n" + heldRequestConfig)
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "64KiB"))
        try PartFiles.make(sandbox.path("f.bin"), size: 5 * 65_536)
        let vars = #"{"path": "f.bin"}"#
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "rs", "--vars", vars]).status == 0)
        // Stopped while part 4 is held and every other part was accepted.
        let first = try sandbox.start(["run", "--grace", "0s"])
        #expect(await server.waitForHeld("four"))
        try await eventually("parts 1, 2, 3 and 5 accepted") {
            try await PartFiles.storedParts(sandbox, "rs").map(\.accepted) == [true, true, true, false, true]
        }
        first.signal(SIGTERM)
        let stopped = await first.wait()
        #expect(stopped.status == 0, "\(stopped.stderr)")
        #expect(try await PartFiles.storedParts(sandbox, "rs").map(\.accepted) == [true, true, true, false, true])
        #expect(try await sandbox.list().first?["state"] as? String == "queued")

        let again = try await sandbox.outbox(["enqueue", "up", "--id", "rs", "--vars", vars])
        #expect(again.status == 0, "\(again.stderr)")
        #expect(try await PartFiles.storedParts(sandbox, "rs").map(\.accepted) == [true, true, true, false, true])
        let second = try await sandbox.outbox(["run", "--drain"])
        #expect(second.status == 0, "\(second.stderr)")
        let counts = Dictionary(grouping: server.requests(path: "/put/rs/"), by: { PartFiles.partNumber($0.path) ?? 0 }).mapValues(\.count)
        #expect(counts == [1: 1, 2: 1, 3: 1, 4: 2, 5: 1])
        let outcome = try #require(PartFiles.readJSON(sandbox.path("outcome.json")))
        #expect(((outcome["parts"] as? [[String: Any]])?[3]["headers"] as? [String: String])?["etag"] == "\"four\"")
    }

    /// The part plan at its limit: a 5 TiB file (sparse, by reference, so nothing is copied) gets
    /// exactly the parts `chunk-plan 5TiB --json` prints.
    @Test func fiveTiBFileGetsThePlanOfChunkPlan() async throws {
        let server = try TestHTTPServer()
        let sandbox = try OutboxSandbox()
        try sandbox.define(
            "up",
            partsDefinition(server, min: "8MiB", max: "20MiB", ownership: "reference")
                .replacingOccurrences(of: "plan: { min: 8MiB, max: 20MiB }", with: "plan: { min: 8MiB, max: 20MiB, max_parts: 10000 }"))
        let plan = try await sandbox.outbox(["chunk-plan", "5TiB", "--json"])
        #expect(plan.status == 0)
        let ranges = try #require(plan.jsonObject as? [[String: Int]])
        #expect(ranges.count == 9987)
        #expect(ranges.first == ["start": 0, "end": 550_502_400])
        #expect(ranges.last?["end"] == 5 << 40)

        let file = sandbox.path("huge.img")
        #expect(FileManager.default.createFile(atPath: file, contents: nil))
        guard truncate(file, off_t(5) << 40) == 0 else {
            print("PartsTests: this filesystem cannot hold a sparse 5 TiB file (errno \(errno)); the enqueue half is skipped")
            return
        }
        let enqueue = try await sandbox.outbox(["enqueue", "up", "--id", "huge", "--vars", #"{"path": "huge.img"}"#])
        #expect(enqueue.status == 0, "\(enqueue.stderr)")
        let stored = try await PartFiles.storedParts(sandbox, "huge")
        #expect(stored.count == ranges.count)
        #expect(stored.map { [Int($0.start), Int($0.end)] } == ranges.map { [$0["start"]!, $0["end"]!] })
        // Reference: the store holds no copy, and the user's file is where it was.
        #expect(try FileManager.default.contentsOfDirectory(atPath: sandbox.path(".outbox/bodies")).isEmpty)
        #expect(FileManager.default.fileExists(atPath: file))
        #expect(try await sandbox.outbox(["cancel", "huge"]).status == 0)
        #expect(FileManager.default.fileExists(atPath: file))
    }

    /// A chunked entry cancelled by another process while a part is in flight: the runner's
    /// state event counts the bytes of the parts already accepted.
    @Test func aCancelMidUploadReportsTheBytesAccepted() async throws {
        let (server, sandbox) = try await Self.enqueueParts(
            id: "can", parts: 3, config: "part_concurrency: 1\n", script: [("/put/can/2", TestResponse.status(201).held("p2"))])
        let runner = try sandbox.start(["run", "--drain", "--events", "-"])
        #expect(await server.waitForHeld("p2"))
        #expect(try await sandbox.outbox(["cancel", "can"]).status == 0)
        server.release("p2")
        let run = await runner.wait()
        #expect(run.status == 0, "\(run.stderr)")
        let events = run.stdout.split(separator: "\n").compactMap { try? JSON.parse(String($0)) }
        let cancelled = try #require(
            events.first { $0["type"] == .string("state") && $0["state"] == .string("cancelled") }, "\(run.stdout)")
        #expect(cancelled["bytes_sent"] == .int64(262_144), "\(cancelled.serialized())")
        #expect(cancelled["attempts"] == .int64(2), "\(cancelled.serialized())")
    }

    /// A part's own secret headers are masked in what a server echoes of them.
    @Test func aPartsSecretHeaderIsMaskedInItsAttemptEvent() async throws {
        let server = try TestHTTPServer()
        server.script("/put/sec/", [TestResponse.status(201, body: "got Authorization: Bearer part-secret-77")])
        let sandbox = try OutboxSandbox(config: "part_concurrency: 1\n")
        let definition = partsDefinition(server, min: "256KiB", max: "256KiB", ownership: "copy")
            .replacingOccurrences(of: "      Content-Range:", with: "      Authorization: \"Bearer part-secret-77\"\n      Content-Range:")
        #expect(definition.contains("part-secret-77"))
        try sandbox.define("up", definition)
        try PartFiles.make(sandbox.path("f.bin"), size: 2 * 262_144)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "sec", "--vars", #"{"path": "f.bin"}"#]).status == 0)
        let run = try await sandbox.outbox(["run", "--drain", "--events", "-"])
        #expect(run.status == 0, "\(run.stderr)")
        let attempts = run.stdout.split(separator: "\n").filter { $0.contains(#""type":"attempt""#) }
        #expect(attempts.count == 2, "\(run.stdout)")
        #expect(attempts.allSatisfy { $0.contains("[redacted]") && !$0.contains("part-secret-77") }, "\(attempts)")
    }

    @Test func requestCommandDescribesThePartsAtEnqueue() async throws {
        let server = try TestHTTPServer()
        let sandbox = try OutboxSandbox()
        try sandbox.write(
            "plugins/describe.py",
            """
            import json, os, sys
            request = json.load(sys.stdin)
            with open("plugin-input.json", "w") as f:
                json.dump(request, f)
            path = request["vars"]["path"]
            size = os.path.getsize(path)
            half = size // 2
            base = "\(server.baseURL)/put/" + request["entry"]["id"]
            print(json.dumps({
                "method": "PUT",
                "file": path,
                "ownership": "copy",
                "headers": {"X-Plugin": "yes"},
                "parts": [
                    {"url": base + "/1?sig=a%2Fb", "range": {"start": 0, "end": half}},
                    {"url": base + "/2?sig=c%2Fd", "range": {"start": half, "end": size}, "headers": {"X-Part": "last"}},
                ],
                "expires_in": "2h",
            }))
            """)
        try sandbox.define(
            "cmd",
            """
            key: cmd
            request_command: [python3, plugins/describe.py]
            on_success: "cat > outcome.json"
            """)
        try PartFiles.make(sandbox.path("f.bin"), size: 100_001)
        let before = Int64(Date().timeIntervalSince1970 * 1000)
        let enqueue = try await sandbox.outbox(["enqueue", "cmd", "--id", "rc", "--vars", #"{"path": "f.bin"}"#])
        let after = Int64(Date().timeIntervalSince1970 * 1000)
        #expect(enqueue.status == 0, "\(enqueue.stderr)")
        let input = try #require(PartFiles.readJSON(sandbox.path("plugin-input.json")))
        #expect(input["vars"] as? [String: String] == ["path": "f.bin"])
        #expect(input["entry"] as? [String: String] == ["id": "rc"])
        let shown = try #require(try await sandbox.show("rc"))
        let expiresAt = try #require(shown["expires_at"] as? Int)
        #expect(
            (before + 7_200_000...after + 7_200_000).contains(Int64(expiresAt)), "expires_at \(expiresAt) is not the enqueue's time + 2h")
        // The plugin asked for a copy: the source stays.
        #expect(FileManager.default.fileExists(atPath: sandbox.path("f.bin")))

        #expect(try await sandbox.outbox(["run", "--drain"]).status == 0)
        let received = server.requests(path: "/put/rc/").sorted { $0.path < $1.path }
        #expect(received.map(\.path) == ["/put/rc/1?sig=a%2Fb", "/put/rc/2?sig=c%2Fd"])
        #expect(received.map { $0.header("X-Plugin") } == ["yes", "yes"])
        #expect(received.map { $0.header("X-Part") } == [nil, "last"])
        #expect(received[0].bodySHA256 == (try PartFiles.sha(sandbox.path("f.bin"), 0, 50_000)))
        #expect(received[1].bodySHA256 == (try PartFiles.sha(sandbox.path("f.bin"), 50_000, 100_001)))
        #expect(PartFiles.readJSON(sandbox.path("outcome.json"))?["outcome"] as? String == "completed")
    }

    @Test func failingRequestCommandStoresNothing() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.write("plugins/fail.sh", "echo 'no upload slot today' >&2\nexit 3\n", mode: 0o755)
        try sandbox.define(
            "cmd",
            """
            key: cmd
            request_command: plugins/fail.sh
            """)
        let enqueue = try await sandbox.outbox(["enqueue", "cmd", "--vars", "{}"])
        #expect(enqueue.status == 65)
        #expect(enqueue.stderr.contains("request_command exited 3: no upload slot today"))
        #expect(try await sandbox.list().isEmpty)
    }

    @Test func progressDisplayDrawsOnRequestAndStaysOffWithNever() async throws {
        let server = try TestHTTPServer()
        server.script("/put/", [TestResponse.delay(300, 201)])
        let sandbox = try OutboxSandbox()
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "64KiB"))
        try PartFiles.make(sandbox.path("a.bin"), size: 4 * 65_536)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "pd", "--vars", #"{"path": "a.bin"}"#]).status == 0)
        let shown = try await sandbox.outbox(["run", "--drain", "--progress", "always"])
        #expect(shown.status == 0)
        #expect(shown.stderr.contains("\u{1B}[2K"))
        #expect(shown.stderr.contains("0/1 entries · 0 B of 256 KiB"))
        #expect(shown.stderr.contains("1 running"))

        try PartFiles.make(sandbox.path("b.bin"), size: 4 * 65_536)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "pd2", "--vars", #"{"path": "b.bin"}"#]).status == 0)
        let hidden = try await sandbox.outbox(["run", "--drain", "--progress", "never"])
        #expect(hidden.status == 0)
        #expect(!hidden.stderr.contains("\u{1B}"))
        #expect(!hidden.stderr.contains("entries"))
    }

    /// The events plugin's output is logged from the sink, beside the runner that draws the
    /// live line: each such line is on a row of its own, the drawn line cleared first (it ran on
    /// after the drawn line's text).
    @Test func aPluginLineLoggedBesideTheLiveLineClearsItFirst() async throws {
        let server = try TestHTTPServer()
        server.script("/put/", [TestResponse.delay(300, 201)])
        let sandbox = try OutboxSandbox(config: "events: { command: hooks/events.sh }\n")
        _ = try sandbox.write("hooks/events.sh", "#!/bin/sh\nwhile IFS= read -r line; do echo seen one; done\n", mode: 0o755)
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "64KiB"))
        try PartFiles.make(sandbox.path("a.bin"), size: 4 * 65_536)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "pl", "--vars", #"{"path": "a.bin"}"#]).status == 0)
        let run = try await sandbox.outbox(["run", "--drain", "--progress", "always"])
        #expect(run.status == 0, "\(run.stderr)")
        let rows = run.stderr.split(separator: "\n").filter { $0.contains("events.command: seen one") }
        #expect(!rows.isEmpty, "\(run.stderr)")
        for row in rows {
            // What a terminal shows of the row: the text after its last clearing.
            let shown = row.components(separatedBy: LiveLine.clearing).last ?? ""
            #expect(!shown.contains("entries"), "a drawn line runs into the log line: \(row.debugDescription)")
        }
    }

    @Test func aLineLoggedFromAnotherThreadClearsTheDrawnLine() {
        let written = Locked<[String]>([])
        let live = LiveLine(write: { text in written.withLock { $0.append(text) } })
        live.logging { written.withLock { $0.append("first\n") } }
        live.draw(LiveLine.clearing + "1/2 entries")
        live.logging { written.withLock { $0.append("second\n") } }
        live.logging { written.withLock { $0.append("third\n") } }
        live.draw(LiveLine.clearing + "2/2 entries")
        live.draw(LiveLine.clearing)
        live.logging { written.withLock { $0.append("fourth\n") } }
        #expect(
            written.withLock { $0 } == [
                "first\n", LiveLine.clearing + "1/2 entries", LiveLine.clearing, "second\n", "third\n",
                LiveLine.clearing + "2/2 entries", LiveLine.clearing, "fourth\n",
            ])
    }

    struct LineCase: CustomTestStringConvertible, Sendable {
        var name: String
        var snapshot: ProgressDisplay.Snapshot
        var line: String
        var testDescription: String { name }
    }

    @Test(arguments: [
        LineCase(
            name: "no rate yet",
            snapshot: .init(
                doneEntries: 0, totalEntries: 3, acceptedBytes: 0, totalBytes: 3 << 30, rate: nil,
                remainingBytes: 3 << 30, running: 2),
            line: "0/3 entries · 0 B of 3 GiB · ETA -- · 2 running"),
        LineCase(
            name: "mid-way with retries and errors",
            snapshot: .init(
                doneEntries: 5, totalEntries: 12, acceptedBytes: 1 << 30, totalBytes: 4 << 30, rate: 100 << 20,
                remainingBytes: 3 << 30, running: 3, retried: 2, errors: 1),
            line: "5/12 entries · 1 GiB of 4 GiB · 100 MiB/s · ETA 30.7s · 3 running · 2 retried · 1 error"),
        LineCase(
            name: "stalled",
            snapshot: .init(
                doneEntries: 1, totalEntries: 2, acceptedBytes: 10, totalBytes: 20, rate: 0,
                remainingBytes: 10, running: 1),
            line: "1/2 entries · 10 B of 20 B · 0 B/s · ETA -- · 1 running"),
        LineCase(
            name: "every byte sent, answers awaited",
            snapshot: .init(
                doneEntries: 1, totalEntries: 2, acceptedBytes: 10, totalBytes: 20, rate: 5,
                remainingBytes: 0, running: 1),
            line: "1/2 entries · 10 B of 20 B · 5 B/s · ETA -- · 1 running"),
        LineCase(
            name: "done",
            snapshot: .init(
                doneEntries: 2, totalEntries: 2, acceptedBytes: 20, totalBytes: 20, rate: 5,
                remainingBytes: 0, running: 0),
            line: "2/2 entries · 20 B of 20 B · 5 B/s · ETA 0s · 0 running"),
        LineCase(
            name: "requests without bodies",
            snapshot: .init(
                doneEntries: 1, totalEntries: 3, acceptedBytes: 0, totalBytes: 0, rate: 0,
                remainingBytes: 0, running: 2, retried: 1),
            line: "1/3 entries · 2 running · 1 retried"),
    ])
    func progressLine(_ c: LineCase) {
        #expect(ProgressDisplay.line(c.snapshot) == c.line)
    }

    /// A line as wide as the terminal would wrap, and each redraw (which clears its own row)
    /// would leave a copy above: it is cut to one column less, with an ellipsis.
    @Test func progressLineFitsTheTerminal() {
        var written: [String] = []
        var width = 24
        let display = ProgressDisplay(
            write: { written.append($0) }, totals: { PendingTotals(entries: 10, bytes: 1 << 30, acceptedBytes: 0) },
            clock: { 0 }, columns: { width })
        display.draw(summary: RunSummary(), flights: 1, running: 3)
        #expect(written.last == "\r\u{1B}[2K0/10 entries · 0 B of …")
        #expect(written.last.map { $0.count - 5 } == 23)
        #expect(ProgressDisplay.fitted("3/10 entries", columns: 13) == "3/10 entries", "fits with a column to spare")
        #expect(ProgressDisplay.fitted("3/10 entries", columns: 12) == "3/10 entri…")
        #expect(ProgressDisplay.fitted("3/10 entries", columns: 0) == "3/10 entries", "no terminal width: as is")
        width = 200
        display.clear()
        display.draw(summary: RunSummary(), flights: 1, running: 3)
        #expect(written.last?.hasSuffix("· 3 running") == true, "\(written)")
    }

    @Test func progressDisplayCountsAcceptedBytesFromEvents() {
        var written: [String] = []
        var now: Int64 = 0
        var stored = PendingTotals(entries: 2, bytes: 300, acceptedBytes: 0)
        let display = ProgressDisplay(write: { written.append($0) }, totals: { stored }, clock: { now }, columns: { 0 })
        display.observe(
            .object([
                ("type", .string("progress")), ("id", .string("a")), ("bytes_sent", .int(150)),
                ("bytes_accepted", .int(100)), ("total_bytes", .int(200)),
            ]))
        display.draw(summary: RunSummary(), flights: 1, running: 1)
        #expect(written.last == "\r\u{1B}[2K0/2 entries · 0 B of 300 B · ETA -- · 1 running")

        // "a" completes; before the store's totals are read again the display adjusts them itself.
        now = 500
        display.observe(
            .object([
                ("type", .string("progress")), ("id", .string("a")), ("bytes_sent", .int(200)),
                ("bytes_accepted", .int(200)), ("total_bytes", .int(200)),
            ]))
        display.observe(
            .object([
                ("type", .string("state")), ("id", .string("a")), ("state", .string("completed")),
                ("total_bytes", .int(200)),
            ]))
        display.draw(summary: RunSummary(), flights: 0, running: 1)
        #expect(written.last == "\r\u{1B}[2K1/2 entries · 200 B of 300 B · ETA -- · 1 running")

        now = 600
        display.draw(summary: RunSummary(), flights: 0, running: 1)
        #expect(written.count == 2, "redrawn at most every 250 ms")

        stored = PendingTotals(entries: 1, bytes: 100, acceptedBytes: 40)
        now = 2000
        display.draw(summary: RunSummary(), flights: 0, running: 1)
        // 50 bytes left the wire in 2 s; 60 of the last 100 are still to send.
        #expect(written.last == "\r\u{1B}[2K1/2 entries · 240 B of 300 B · 25 B/s · ETA 2.4s · 1 running")
        // A log line clears the display's line first; the next draw comes at once, below it.
        display.clear()
        #expect(written.last == "\r\u{1B}[2K")
        now = 2010
        display.draw(summary: RunSummary(), flights: 0, running: 1)
        #expect(written.last == "\r\u{1B}[2K1/2 entries · 240 B of 300 B · 24 B/s · ETA 2.5s · 1 running")
        display.clear()
        display.clear()
        #expect(
            Array(written.suffix(2)) == ["\r\u{1B}[2K1/2 entries · 240 B of 300 B · 24 B/s · ETA 2.5s · 1 running", "\r\u{1B}[2K"],
            "a second clear writes nothing")
        now = 2100
        display.draw(summary: RunSummary(), flights: 0, running: 1)
        display.finish()
        #expect(written.last == "\r\u{1B}[2K")
    }
}

/// Accepted parts and delivery under a crash: SIGKILL the runner in the middle of a 1 GiB chunked upload,
/// run again, and check what the server received.
@Suite struct PartsCrashTests {
    static let partSize: Int64 = 16 << 20
    static let size: Int64 = 1 << 30

    /// A sparse 1 GiB file with each MiB stamped with its offset, so that every part's bytes
    /// differ (a misplaced range would show) while the file costs almost no disk.
    static func makeStampedFile(_ path: String) throws {
        #expect(FileManager.default.createFile(atPath: path, contents: nil))
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        defer { try? handle.close() }
        try handle.truncate(atOffset: UInt64(size))
        for block in stride(from: Int64(0), to: size, by: 1 << 20) {
            try handle.seek(toOffset: UInt64(block + 4096))
            handle.write(Data("block at \(block) of \(size)".utf8))
        }
    }

    @Test func sigkillMidUploadThenRunAgainSendsNoAcceptedPartTwice() async throws {
        let server = try TestHTTPServer()
        // Part 40 is held: whenever the kill comes, however slow the test, the upload is not over.
        server.script("/put/big/40", [.hold("part40")])
        // No stall limit: the held part stays one request until the kill, however slow the machine.
        let sandbox = try OutboxSandbox(config: "part_concurrency: 3\ntimeouts: { stall: { for: 1h } }\n")
        try sandbox.define("up", partsDefinition(server, min: "8MiB", max: "16MiB"))
        let file = sandbox.path("big.bin")
        try Self.makeStampedFile(file)
        let count = Int(Self.size / Self.partSize)
        let expected = try await offload {
            try (0..<count).map { i in try PartFiles.sha(file, Int64(i) * Self.partSize, Int64(i + 1) * Self.partSize) }
        }
        #expect(Set(expected).count == count)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "big", "--vars", #"{"path": "big.bin"}"#]).status == 0)

        let first = try sandbox.start(["run", "--events", "-"])
        try await eventually("the first runner to get 12 parts accepted", timeout: 120) {
            try await PartFiles.storedParts(sandbox, "big").filter(\.accepted).count >= 12
        }
        let firstPeak = first.peakMemoryKiB ?? 0
        first.signal(SIGKILL)
        _ = await first.wait()
        #expect(first.killedBySignal == true)

        let before = try await PartFiles.storedParts(sandbox, "big")
        #expect(before.count == count)
        let acceptedBefore = Set(before.filter(\.accepted).map(\.index))
        #expect(acceptedBefore.count >= 12)
        #expect(acceptedBefore.count < count)
        #expect(!acceptedBefore.contains(39), "the held part was accepted")
        #expect(try await sandbox.list().first?["state"] as? String == "running")

        // The second runner gets part 40 answered like the others (with its ETag).
        server.script("/put/big/40", [])
        let clock = Date()
        let second = try sandbox.start(["run", "--drain", "--events", "-"])
        var secondPeak = 0
        while second.isRunning {
            secondPeak = max(secondPeak, second.peakMemoryKiB ?? 0)
            try await Task.sleep(nanoseconds: 50_000_000)
        }
        let result = await second.wait()
        let elapsed = Date().timeIntervalSince(clock)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stderr.contains("put 1 entry left running by an earlier runner back in the queue"))

        // Every part's bytes arrived whole at least once, and the outcome has every ETag.
        let records = server.requests(path: "/put/big/")
        let byPart = Dictionary(grouping: records, by: { (PartFiles.partNumber($0.path) ?? 0) - 1 })
        for i in 0..<count {
            let complete = (byPart[i] ?? []).filter { $0.completed && $0.bodySize == Self.partSize }
            #expect(complete.contains { $0.bodySHA256 == expected[i] }, "part \(i) never arrived whole")
            #expect(complete.allSatisfy { $0.bodySHA256 == expected[i] }, "part \(i) arrived with wrong bytes")
        }
        // A part accepted before the kill was never sent again; at most part_concurrency
        // parts (those in flight at the kill) were sent twice.
        for i in acceptedBefore {
            #expect(byPart[i]?.count == 1, "accepted part \(i) was sent \(byPart[i]?.count ?? 0) times")
        }
        let resent = byPart.filter { $0.value.count > 1 }
        #expect(resent.count <= 3, "parts sent more than once: \(resent.keys.sorted())")
        #expect(resent.values.allSatisfy { $0.count == 2 })
        let outcome = try #require(PartFiles.readJSON(sandbox.path("outcome.json")))
        let parts = try #require(outcome["parts"] as? [[String: Any]])
        #expect(parts.map { ($0["headers"] as? [String: String])?["etag"] } == expected.map(PartFiles.etag))

        print(
            "PartsCrashTests: \(acceptedBefore.count) parts accepted before the kill, \(resent.count) sent twice; "
                + "peak memory \(firstPeak) KiB then \(secondPeak) KiB; second run \(String(format: "%.1f", elapsed)) s")
        // Memory stays flat whatever the file size: the parts stream from disk.
        #expect(firstPeak > 0 && firstPeak < 96 * 1024, "first runner peaked at \(firstPeak) KiB")
        #expect(secondPeak > 0 && secondPeak < 96 * 1024, "second runner peaked at \(secondPeak) KiB")

        // Progress: at most about four events a second for the entry, bytes accepted rising to the total.
        let progress = result.lines.filter { $0.contains(#""type":"progress""#) }
        #expect(Double(progress.count) <= 4 * elapsed + 4, "\(progress.count) progress events in \(elapsed) s")
        #expect(progress.last?.contains(#""bytes_accepted":\#(Self.size)"#) == true)
    }
}

/// Who owns a file body (`ownership`): move, copy, reference, and what cancel gives back.
@Suite(.serialized) struct OwnershipTests {
    enum Change: String, CaseIterable, CustomTestStringConvertible, Sendable {
        case appended, touched, replaced, deleted
        var testDescription: String { rawValue }

        func apply(_ path: String) throws {
            switch self {
            case .appended:
                let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
                try handle.seekToEnd()
                handle.write(Data("x".utf8))
                try handle.close()
            case .touched:
                var times = [timespec(tv_sec: 1_000_000_000, tv_nsec: 5), timespec(tv_sec: 1_000_000_000, tv_nsec: 5)]
                #expect(utimensat(AT_FDCWD, path, &times, 0) == 0)
            case .replaced:
                // Same size and bytes, but a new inode.
                let data = try Data(contentsOf: URL(fileURLWithPath: path))
                try FileManager.default.removeItem(atPath: path)
                try data.write(to: URL(fileURLWithPath: path))
            case .deleted:
                try FileManager.default.removeItem(atPath: path)
            }
        }
    }

    @Test(arguments: Change.allCases)
    func referencedFileChangedBeforeTheAttemptSettlesErrorKindFile(_ change: Change) async throws {
        let server = try TestHTTPServer()
        let sandbox = try OutboxSandbox()
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "64KiB", ownership: "reference"))
        let file = sandbox.path("ref.bin")
        try PartFiles.make(file, size: 2 * 65_536)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "ref", "--vars", #"{"path": "ref.bin"}"#]).status == 0)
        try change.apply(file)
        // Exit 1: the entry settled error in the run.
        #expect(try await sandbox.outbox(["run", "--drain"]).status == 1)
        let error = try #require(PartFiles.readJSON(sandbox.path("error.json")))
        #expect((error["error"] as? [String: Any])?["kind"] as? String == "file")
        #expect(server.requests(path: "/put/").isEmpty)
        #expect(try await sandbox.list().first?["reason"] as? String == "file")
    }

    @Test func referencedFileChangedBetweenPartsStopsBeforeTheNextPart() async throws {
        let server = try TestHTTPServer()
        server.script("/put/mid/1", [TestResponse.status(201).held("first")])
        let sandbox = try OutboxSandbox(config: "part_concurrency: 1\n")
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "64KiB", ownership: "reference"))
        let file = sandbox.path("ref.bin")
        try PartFiles.make(file, size: 3 * 65_536)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "mid", "--vars", #"{"path": "ref.bin"}"#]).status == 0)
        let runner = try sandbox.start(["run", "--drain"])
        // The file changes while part 1 is in flight: it is held until then.
        #expect(await server.waitForHeld("first"))
        try Change.appended.apply(file)
        server.release("first")
        #expect(await runner.wait().status == 1, "the entry settled error")
        #expect(server.requests(path: "/put/mid/").map(\.path) == ["/put/mid/1"])
        let error = try #require(PartFiles.readJSON(sandbox.path("error.json")))
        #expect((error["error"] as? [String: Any])?["kind"] as? String == "file")
    }

    @Test func referencedFileIsSentFromWhereItIs() async throws {
        let server = try TestHTTPServer()
        let sandbox = try OutboxSandbox()
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "64KiB", ownership: "reference"))
        let file = sandbox.path("ref.bin")
        try PartFiles.make(file, size: 150_000, seed: 3)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "r", "--vars", #"{"path": "ref.bin"}"#]).status == 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: sandbox.path(".outbox/bodies")).isEmpty)
        #expect(try await sandbox.outbox(["run", "--drain"]).status == 0)
        let received = server.requests(path: "/put/r/").sorted { $0.path < $1.path }
        #expect(try received.map(\.bodySHA256) == [PartFiles.sha(file, 0, 65_536), PartFiles.sha(file, 65_536, 150_000)])
        #expect(FileManager.default.fileExists(atPath: file))
    }

    @Test func copySendsTheBytesAsTheyWereAtEnqueue() async throws {
        let server = try TestHTTPServer()
        let sandbox = try OutboxSandbox()
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "1MiB", ownership: "copy"))
        let file = sandbox.path("c.bin")
        try PartFiles.make(file, size: 100_000, seed: 4)
        let original = try PartFiles.sha(file, 0, 100_000)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "c", "--vars", #"{"path": "c.bin"}"#]).status == 0)
        try PartFiles.make(file, size: 100_000, seed: 5)
        #expect(try await sandbox.outbox(["run", "--drain"]).status == 0)
        #expect(server.requests(path: "/put/c/").map(\.bodySHA256) == [original])
        #expect(try PartFiles.sha(file, 0, 100_000) != original)
    }

    /// A second filesystem for cross-device moves: /dev/shm when it is one.
    static func otherFilesystemFolder(than path: String) -> String? {
        var a = stat(), b = stat()
        guard stat(path, &a) == 0, stat("/dev/shm", &b) == 0, a.st_dev != b.st_dev else { return nil }
        let folder = "/dev/shm/outbox-test-\(UUID().uuidString.prefix(8))"
        return (try? FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)) != nil ? folder : nil
    }

    /// A move across filesystems copies, then removes the source after the commit. Killed in
    /// between, the next command finishes the move, so a rerun of the migration finds
    /// nothing to send.
    @Test(arguments: [false, true])
    func moveAcrossFilesystemsCopiesThenRemovesTheSource(killedAfterItsCommit: Bool) async throws {
        let server = try TestHTTPServer()
        let sandbox = try OutboxSandbox()
        guard let folder = Self.otherFilesystemFolder(than: sandbox.root) else {
            Issue.record("no second filesystem at /dev/shm: the cross-device move cannot be tested here")
            return
        }
        defer { try? FileManager.default.removeItem(atPath: folder) }
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "1MiB"))
        let file = folder + "/m.bin"
        try PartFiles.make(file, size: 90_000, seed: 6)
        let original = try PartFiles.sha(file, 0, 90_000)
        let enqueue = ["enqueue", "up", "--id", "m", "--vars", "{\"path\": \"\(file)\"}"]
        if killedAfterItsCommit {
            let killed = try await sandbox.outbox(enqueue, environment: ["OUTBOX_FAULT": "enqueue.committed"])
            #expect(killed.exitCode == -SIGKILL, "\(killed)")
            #expect(FileManager.default.fileExists(atPath: file), "killed before it removed the source")
            let list = try await sandbox.outbox(["list"])
            #expect(list.exitCode == 0, "\(list)")
            #expect(list.stderr.contains("removed \(file), moved into the store by a process stopped before it removed it"), "\(list)")
        } else {
            #expect(try await sandbox.outbox(enqueue).status == 0)
        }
        #expect(!FileManager.default.fileExists(atPath: file))
        let staged = try FileManager.default.contentsOfDirectory(atPath: sandbox.path(".outbox/bodies"))
        #expect(staged.count == 1)
        #expect(try PartFiles.sha(sandbox.path(".outbox/bodies/\(staged[0])"), 0, 90_000) == original)
        #expect(try await sandbox.outbox(["run", "--drain"]).status == 0)
        #expect(server.requests(path: "/put/m/").map(\.bodySHA256) == [original])
    }

    enum CancelCase: String, CaseIterable, CustomTestStringConvertible, Sendable {
        case beforeAnySend, afterSomePartsAccepted, acrossFilesystems, sourcePathTaken
        var testDescription: String { rawValue }
    }

    @Test(arguments: CancelCase.allCases)
    func cancelNeverDestroysTheOnlyCopyOfAMovedFile(_ c: CancelCase) async throws {
        let server = try TestHTTPServer()
        server.script("/put/mv/3", [TestResponse.status(201).held("third")])
        // No stall limit: the held part stays one request while the test waits, however slow the machine.
        let sandbox = try OutboxSandbox(config: "part_concurrency: 1\n" + heldRequestConfig)
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "64KiB"))
        var folder = sandbox.path("data")
        if c == .acrossFilesystems {
            guard let other = Self.otherFilesystemFolder(than: sandbox.root) else {
                Issue.record("no second filesystem at /dev/shm: the cross-device return cannot be tested here")
                return
            }
            folder = other
        }
        defer { if c == .acrossFilesystems { try? FileManager.default.removeItem(atPath: folder) } }
        let file = folder + "/mv.bin"
        try PartFiles.make(file, size: 4 * 65_536, seed: 8)
        let original = try PartFiles.sha(file, 0, 4 * 65_536)
        // The file comes back as it was: its own mode and modification time, not the store's.
        let mtime = Date(timeIntervalSince1970: 1_600_000_000.25)
        try FileManager.default.setAttributes([.posixPermissions: 0o640, .modificationDate: mtime], ofItemAtPath: file)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "mv", "--vars", "{\"path\": \"\(file)\"}"]).status == 0)
        #expect(!FileManager.default.fileExists(atPath: file))
        if c == .afterSomePartsAccepted {
            // Stopped while part 3 is held, parts 1 and 2 accepted.
            let runner = try sandbox.start(["run", "--grace", "0s"])
            #expect(await server.waitForHeld("third"))
            try await eventually("parts 1 and 2 accepted") {
                try await PartFiles.storedParts(sandbox, "mv").map(\.accepted) == [true, true, false, false]
            }
            runner.signal(SIGTERM)
            #expect(await runner.wait().status == 0)
            #expect(try await PartFiles.storedParts(sandbox, "mv").map(\.accepted) == [true, true, false, false])
        }
        if c == .sourcePathTaken {
            try "someone else's file".write(toFile: file, atomically: true, encoding: .utf8)
        }
        let cancel = try await sandbox.outbox(["cancel", "mv"])
        #expect(cancel.status == 0)
        #expect(try await sandbox.list().isEmpty)
        if c == .sourcePathTaken {
            #expect(try String(contentsOfFile: file, encoding: .utf8) == "someone else's file")
            let kept = sandbox.path(".outbox/returned/mv.bin")
            #expect(try PartFiles.sha(kept, 0, 4 * 65_536) == original)
            #expect(cancel.stderr.contains(kept))
        } else {
            #expect(try PartFiles.sha(file, 0, 4 * 65_536) == original)
            let attributes = try FileManager.default.attributesOfItem(atPath: file)
            #expect(attributes[.posixPermissions] as? Int == 0o640)
            #expect(abs(((attributes[.modificationDate] as? Date) ?? .distantPast).timeIntervalSince(mtime)) < 0.001)
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: sandbox.path(".outbox/bodies")).isEmpty)
    }

    @Test func cancelOfACopiedEntryLeavesTheSourceAlone() async throws {
        let server = try TestHTTPServer()
        let sandbox = try OutboxSandbox()
        try sandbox.define("up", partsDefinition(server, min: "64KiB", max: "1MiB", ownership: "copy"))
        let file = sandbox.path("c.bin")
        try PartFiles.make(file, size: 70_000)
        let original = try PartFiles.sha(file, 0, 70_000)
        #expect(try await sandbox.outbox(["enqueue", "up", "--id", "c", "--vars", #"{"path": "c.bin"}"#]).status == 0)
        #expect(try await sandbox.outbox(["cancel", "c"]).status == 0)
        #expect(try PartFiles.sha(file, 0, 70_000) == original)
        #expect(try FileManager.default.contentsOfDirectory(atPath: sandbox.path(".outbox/bodies")).isEmpty)
        #expect(!FileManager.default.fileExists(atPath: sandbox.path(".outbox/returned")))
    }
}
