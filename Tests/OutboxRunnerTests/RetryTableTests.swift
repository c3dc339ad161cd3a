import Foundation
import Glibc
import OutboxModel
@testable import OutboxRunner
import TestSupport
import Testing

/// One row of the attempt table (docs/states-and-exit-codes.md) that settles in a single attempt.
struct SettleCase: Sendable, CustomTestStringConvertible {
    var name: String
    var path: String
    /// Scripted answers for `path` (nil: the server's built-in route answers).
    var steps: [TestResponse]? = nil
    var request = ""
    var top = ""
    var config = fastConfig
    /// The hook's `outcome` field (and OUTBOX_OUTCOME).
    var outcome: String
    /// `error.kind`, for error outcomes.
    var kind: String? = nil
    /// `response.status` (completed) or `error.status` (http errors).
    var status: Int?
    /// `error.body` of an http error.
    var errorBody: String? = nil
    /// The entry's state once its outcome is acknowledged: completed entries are forgotten (nil).
    var stateAfter: String?
    var testDescription: String { name }
}

@Suite struct RetryTableTests {
    static let settleCases: [SettleCase] = [
        SettleCase(name: "2xx completes", path: "/status/201", outcome: "completed", status: 201, stateAfter: nil),
        SettleCase(
            name: "409 with the accept text completes", path: "/conflict",
            steps: [.json(409, #"{"error":"already exists"}"#)],
            top: "accept:\n  - status: 409\n    body_includes: already exists",
            outcome: "completed", status: 409, stateAfter: nil),
        SettleCase(
            name: "409 without the accept text is an http error", path: "/conflict",
            steps: [.json(409, #"{"error":"conflict"}"#)],
            top: "accept:\n  - status: 409\n    body_includes: already exists",
            outcome: "error", kind: "http", status: 409, errorBody: #"{"error":"conflict"}"#, stateAfter: "error"),
        SettleCase(
            name: "422 is an http error with status and body", path: "/status/422",
            outcome: "error", kind: "http", status: 422, errorBody: #"{"status":422}"#, stateAfter: "error"),
        SettleCase(
            name: "3xx not followed is an http error", path: "/redirect/1",
            outcome: "error", kind: "http", status: 302, stateAfter: "error"),
        SettleCase(
            name: "follow_redirects 2 reaches the 200 when the method may change", path: "/redirect/1",
            request: "follow_redirects: 2\nredirect_method_change: true", outcome: "completed", status: 200, stateAfter: nil),
        SettleCase(
            name: "a 302 that would turn the POST into a GET is not followed", path: "/redirect/1", request: "follow_redirects: 2",
            outcome: "error", kind: "http", status: 302, stateAfter: "error"),
        SettleCase(
            name: "too many redirects is an http error", path: "/redirect/3", request: "follow_redirects: 2",
            outcome: "error", kind: "http", stateAfter: "error"),
        SettleCase(
            name: "a redirect to ftp is an http error", path: "/redirect-to?url=ftp%3A%2F%2F127.0.0.1%2Fx",
            request: "follow_redirects: 2", outcome: "error", kind: "http", stateAfter: "error"),
        SettleCase(
            name: "invalid JSON with response json: unknown, entry completed", path: "/notjson",
            steps: [.status(200, body: "this is not json")], top: "response: json",
            outcome: "error", kind: "unknown", errorBody: "this is not json", stateAfter: nil),
        SettleCase(
            name: "JSON whose string is not UTF-8 with response json: unknown, not repaired", path: "/notutf8",
            steps: [
                TestResponse(
                    status: 200, headers: [("Content-Type", "application/json")],
                    body: Array(#"{"s": ""#.utf8) + [0xFF, 0xFE] + Array(#""}"#.utf8))
            ],
            top: "response: json", outcome: "error", kind: "unknown", stateAfter: nil),
        SettleCase(
            name: "a parser plugin that exits non-zero: unknown, entry completed", path: "/status/200",
            top: "response:\n  command: \"cat > /dev/null; exit 3\"",
            outcome: "error", kind: "unknown", stateAfter: nil),
        SettleCase(
            name: "a parser plugin's output is the data", path: "/status/200",
            top: "response:\n  command: \"cat > /dev/null; echo '{\\\"parsed\\\": true}'\"",
            outcome: "completed", status: 200, stateAfter: nil),
        SettleCase(
            name: "a response over max_response_bytes with a parser: truncated", path: "/bytes/5000",
            top: "response: json", config: fastConfig + "max_response_bytes: 1KiB\n",
            outcome: "error", kind: "truncated", stateAfter: nil),
        SettleCase(
            name: "an empty body with response json gives data null", path: "/empty",
            steps: [TestResponse(status: 200)], top: "response: json",
            outcome: "completed", status: 200, stateAfter: nil),
        SettleCase(
            name: "a body of only blanks with response json gives data null too", path: "/blank",
            steps: [TestResponse(status: 200, body: Array(" \t\r\n ".utf8))], top: "response: json",
            outcome: "completed", status: 200, stateAfter: nil),
    ]

    @Test(arguments: settleCases)
    func settles(_ c: SettleCase) async throws {
        let p = try Project(config: c.config, definitions: ["t": definition("t", request: c.request, top: c.top)])
        if let steps = c.steps { p.server.script(c.path, steps) }
        try await p.enqueue("t", path: c.path, id: "e1")
        try await p.drain()

        let log = p.deliveries("e1")
        #expect(log.count == 1, "\(p.hookLog)")
        let hook = try #require(log.first)
        #expect(hook.string("env.outcome") == c.outcome)
        #expect(hook.string("stdin.outcome") == c.outcome)
        #expect(hook.int("env.deliveries") == 1)
        #expect(hook.int("stdin.meta.deliveries") == 1)
        #expect(hook.int("stdin.meta.attempts") == 1)
        if let kind = c.kind {
            #expect(hook.string("stdin.error.kind") == kind, "\(hook.serialized())")
            #expect(hook.at("stdin.data") == .null)
            if kind == "http", let status = c.status {
                #expect(hook.int("stdin.error.status") == Int64(status))
            }
            if let body = c.errorBody { #expect(hook.string("stdin.error.body") == body) }
        } else {
            #expect(hook.at("stdin.error") == nil)
            #expect(hook.int("stdin.response.status") == c.status.map(Int64.init))
            #expect(hook.at("stdin.parts") == .null, "a request without parts: \(hook.serialized())")
        }
        if c.name.contains("plugin's output") {
            #expect(hook.at("stdin.data") == .object([("parsed", .bool(true))]))
        }
        if c.name.contains("data null") {
            #expect(hook.at("stdin.data") == .null)
            #expect(hook.at("stdin.data") != nil)
            #expect(hook.string("stdin.response.body") == (c.path == "/blank" ? " \t\r\n " : ""))
        }

        let rows = try await p.list()
        if let state = c.stateAfter {
            #expect(rows.count == 1)
            #expect(rows.first?.string("state") == state)
        } else {
            #expect(rows.isEmpty, "a completed entry is forgotten once acknowledged: \(rows)")
        }
        // Settled means never sent again, also by a later run.
        let sent = p.server.requests.count
        try await p.drain()
        #expect(p.server.requests.count == sent)
        #expect(p.deliveries("e1").count == 1)
    }

    @Test func responseOverMaxBytesStillReportsTheStatusAndTruncation() async throws {
        let p = try Project(
            config: fastConfig + "max_response_bytes: 1KiB\n",
            definitions: ["t": definition("t", top: "response: json")])
        try await p.enqueue("t", path: "/bytes/5000", id: "big")
        try await p.drain()
        let hook = try #require(p.deliveries("big").first)
        #expect(hook.int("stdin.response.status") == 200)
        #expect(hook.at("stdin.response.body_truncated") == .bool(true))
        #expect(hook.string("stdin.error.kind") == "truncated")
        // The error carries what came of the body, as for any other error with a response.
        let body = try #require(hook.string("stdin.response.body"))
        #expect(!body.isEmpty && hook.string("stdin.error.body") == body, "\(hook.serialized())")
    }

    struct RetryCase: Sendable, CustomTestStringConvertible {
        var name: String
        var steps: [TestResponse]
        var testDescription: String { name }
    }

    static let retryCases: [RetryCase] = [
        RetryCase(name: "connection reset", steps: [.reset, .reset, .json(200, "{}")]),
        RetryCase(name: "closed without a response", steps: [.closeWithoutResponse, .json(200, "{}")]),
        RetryCase(name: "5xx", steps: [.status(500), .status(503), .json(200, "{}")]),
        RetryCase(name: "408", steps: [.status(408), .json(200, "{}")]),
        RetryCase(name: "429 without Retry-After", steps: [.status(429), .status(429), .json(200, "{}")]),
        RetryCase(name: "404 in exempt", steps: [.status(404), .json(200, "{}")]),
    ]

    @Test(arguments: retryCases)
    func retriesUntilSuccess(_ c: RetryCase) async throws {
        let p = try Project(definitions: ["t": definition("t")])
        p.server.script("/flaky", c.steps)
        try await p.enqueue("t", path: "/flaky", id: "r1")
        let run = try await p.drain(["--events", "-"])

        let hook = try #require(p.deliveries("r1").first)
        #expect(hook.string("stdin.outcome") == "completed")
        #expect(hook.int("stdin.meta.attempts") == Int64(c.steps.count))
        #expect(hook.int("stdin.response.status") == 200)
        #expect(p.server.waitForRequests(count: c.steps.count))
        #expect(p.server.requests(path: "/flaky").count == c.steps.count)
        let attempts = run.jsonLines.filter { $0.string("type") == "attempt" }
        #expect(attempts.map { $0.string("outcome") ?? "" } == Array(repeating: "retry", count: c.steps.count - 1) + ["success"])
        #expect(attempts.map { $0.int("attempt") ?? 0 } == (1...Int64(c.steps.count)).map { $0 })
        #expect(try await p.list().isEmpty)
    }

    @Test func connectionRefusedIsRetriedUntilTheServerComesUp() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        let (blocker, port) = try refusingPort()
        let vars = JSON.object([("url", .string("http://127.0.0.1:\(port)/up")), ("tag", .string("a"))]).serialized()
        #expect(try await p.outbox(["enqueue", "t", "--vars", vars, "--id", "refused"]).exitCode == 0)

        let first = try await p.runUntil(["--events", "-"]) { runner in
            runner.stdoutSoFar.components(separatedBy: #""type":"attempt""#).count > 2
        }
        let attempts = first.jsonLines.filter { $0.string("type") == "attempt" }
        #expect(attempts.count >= 2, "retried within the run: \(first.stdout)")
        #expect(
            attempts.allSatisfy { $0.string("outcome") == "retry" && $0.string("error_kind") == "network" && $0.at("http_code") == .null })
        let row = try #require(try await p.list().first)
        #expect(row.string("state") == "queued")
        #expect(p.hookLog.isEmpty)

        let server = try TestHTTPServer(port: port)
        close(blocker)
        defer { server.stop() }
        try await p.drain()
        #expect(server.requests(path: "/up").count == 1)
        let hook = try #require(p.deliveries("refused").first)
        #expect(hook.string("stdin.outcome") == "completed")
        #expect(hook.int("stdin.meta.attempts") == Int64(attempts.count) + 1)
    }

    @Test func retryAfterIsHonoured() async throws {
        // Retry-After is capped at the backoff max: give a max above the hour asked for.
        let p = try Project(definitions: ["t": definition("t", top: "retry:\n  backoff: { base: 50ms, max: 2h, jitter: 0 }")])
        p.server.script("/busy", [.json(429, "{}", headers: [("Retry-After", "3600")]), .json(200, "{}")])
        try await p.enqueue("t", path: "/busy", id: "ra")
        let before = nowMs()
        // The next attempt is an hour away, beyond the horizon: drain returns after one attempt.
        try await p.drain(["--horizon", "2s"])
        let after = nowMs()
        #expect(p.server.requests(path: "/busy").count == 1)
        let row = try #require(try await p.list().first)
        #expect(row.string("state") == "queued")
        #expect(row.int("attempts") == 1)
        let next = try #require(row.int("next_attempt_at"))
        #expect((before + 3_600_000...after + 3_600_000).contains(next), "next_attempt_at \(next) is not the 429's time + 3600 s")
        #expect(p.hookLog.isEmpty)
    }

    /// A parked entry has no next attempt: it waits for `headers update`, also when it is
    /// parked a second time after one.
    @Test func aParkedEntryShowsNoNextAttempt() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        p.server.script("/auth2", [.status(403), .status(403)])
        try await p.enqueue("t", path: "/auth2", id: "a2")
        try await p.drain(failures: 2)
        #expect(try await p.outbox(["headers", "update", "Authorization: Bearer y"]).exitCode == 0)
        try await p.drain(failures: 2)
        let row = try #require(try await p.list().first)
        #expect(p.server.requests(path: "/auth2").count == 2)
        #expect(row.string("state") == "awaiting-auth")
        #expect(row["next_attempt_at"] == .null)
    }

    @Test(arguments: [401, 403])
    func authFailureParksUntilHeadersUpdate(_ status: Int) async throws {
        let p = try Project(definitions: ["t": definition("t")])
        p.server.script("/auth", [.status(status), .json(200, "{}")])
        try await p.enqueue("t", path: "/auth", id: "au")
        try await p.drain()
        let parked = try #require(try await p.list().first)
        #expect(parked.string("state") == "awaiting-auth")
        #expect(p.hookLog.isEmpty)
        #expect(p.server.requests(path: "/auth").count == 1)
        // Parked entries are not due: another drain sends nothing.
        try await p.drain()
        #expect(p.server.requests(path: "/auth").count == 1)

        let update = try await p.outbox(["headers", "update", "Authorization: Bearer x"])
        #expect(update.exitCode == 0, "\(update.description)")
        try await p.drain()
        let requests = p.server.requests(path: "/auth")
        #expect(requests.count == 2)
        #expect(requests.last?.header("Authorization") == "Bearer x")
        #expect(requests.first?.header("Authorization") == nil)
        let hook = try #require(p.deliveries("au").first)
        #expect(hook.string("stdin.outcome") == "completed")
        #expect(hook.int("stdin.meta.attempts") == 2)
        #expect(try await p.list().isEmpty)
    }

    @Test func authFailureOfAnOlderHeaderGenerationIsSentAgainAtOnce() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        // The 401 is held until `headers update` ran: it answers headers that are already replaced.
        p.server.script("/stale", [TestResponse.status(401).held("401"), .json(200, "{}")])
        try await p.enqueue("t", path: "/stale", id: "st")
        // A horizon no busy machine reaches: the send again is due at once, but only a drain
        // whose horizon has not passed makes it.
        let runner = try p.start(["run", "--drain", "--horizon", "10m", "--events", "-"])
        #expect(await p.server.waitForHeld("401"))
        #expect(try await p.outbox(["headers", "update", "Authorization: Bearer new"]).exitCode == 0)
        p.server.release("401")
        let run = await runner.wait()
        #expect(run.exitCode == 0, "\(run.description)")
        #expect(!run.jsonLines.contains { $0.string("state") == "awaiting-auth" }, "never parked")
        let attempts = run.jsonLines.filter { $0.string("type") == "attempt" }
        #expect(attempts.map { $0.string("outcome") } == ["retry", "success"], "the 401 is reported as what it led to")
        let requests = p.server.requests(path: "/stale")
        #expect(requests.count == 2)
        #expect(requests.last?.header("Authorization") == "Bearer new")
        #expect(p.deliveries("st").first?.string("stdin.outcome") == "completed")
    }

    @Test func missingStagedPayloadSettlesErrorFile() async throws {
        let p = try Project(definitions: ["up": fileDefinition("up")])
        let source = p.base + "/payload.bin"
        // Over 64 KiB, so the body is staged as a file and not kept in the row.
        try Data(repeating: 7, count: 100_000).write(to: URL(fileURLWithPath: source))
        let vars = JSON.object([("url", .string(p.url("/put/x"))), ("path", .string(source))]).serialized()
        #expect(try await p.outbox(["enqueue", "up", "--vars", vars, "--id", "f1"]).exitCode == 0)
        let bodies = p.root + "/.outbox/bodies"
        let staged = try FileManager.default.contentsOfDirectory(atPath: bodies)
        #expect(staged.count == 1)
        for name in staged { try FileManager.default.removeItem(atPath: bodies + "/" + name) }

        try await p.drain()
        #expect(p.server.requests.isEmpty)
        let hook = try #require(p.deliveries("f1").first)
        #expect(hook.string("stdin.outcome") == "error")
        #expect(hook.string("stdin.error.kind") == "file")
        let row = try #require(try await p.list().first)
        #expect(row.string("state") == "error")
        #expect(row.string("reason") == "file")
    }

    /// A referenced file is checked as its request opens it: removed, or rewritten, after
    /// enqueue, it settles error kind `file`; nothing reaches the server and no attempt counts.
    @Test func referencedFileGoneOrChangedSettlesErrorFileWithNoAttempt() async throws {
        let p = try Project(definitions: ["up": fileDefinition("up", ownership: "reference")])
        let good = p.base + "/good.bin"
        let gone = p.base + "/gone.bin"
        let changed = p.base + "/changed.bin"
        for path in [good, gone, changed] { try Data(repeating: 7, count: 4096).write(to: URL(fileURLWithPath: path)) }
        for (id, path) in [("good", good), ("gone", gone), ("changed", changed)] {
            let vars = JSON.object([("url", .string(p.url("/put/\(id)"))), ("path", .string(path))]).serialized()
            #expect(try await p.outbox(["enqueue", "up", "--vars", vars, "--id", id]).exitCode == 0)
        }
        try FileManager.default.removeItem(atPath: gone)
        try Data(repeating: 8, count: 5000).write(to: URL(fileURLWithPath: changed))

        let run = try await p.outbox(["run", "--drain", "--json"])
        #expect(run.exitCode != 0, "two entries settled error")
        #expect(p.server.requests.map(\.path) == ["/put/good"])
        #expect(run.json?.int("attempts") == 1, "\(run.stdout)")
        for (id, message) in [("gone", "missing"), ("changed", "changed")] {
            let hook = try #require(p.deliveries(id).first)
            #expect(hook.string("stdin.outcome") == "error")
            #expect(hook.string("stdin.error.kind") == "file")
            #expect(hook.string("stdin.error.message")?.contains(message) == true, "\(hook)")
            #expect(hook.int("stdin.meta.attempts") == 0)
        }
        let rows = try await p.list()
        #expect(Set(rows.map { $0.string("id") ?? "" }) == ["gone", "changed"])
        #expect(rows.allSatisfy { $0.string("state") == "error" && $0.string("reason") == "file" && $0.int("attempts") == 0 })
    }

    @Test func pastExpiresAtSettlesErrorExpired() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        // Enqueued with a time to be sent in (one already past is refused), which then passed.
        try await p.enqueue("t", path: "/status/200", id: "old")
        _ = try p.sqlite("UPDATE entries SET expires_at = \(nowMs() - 1000) WHERE id = 'old'")
        try await p.drain()
        #expect(p.server.requests.isEmpty)
        let hook = try #require(p.deliveries("old").first)
        #expect(hook.string("stdin.outcome") == "error")
        #expect(hook.string("stdin.error.kind") == "expired")
        #expect(hook.string("stdin.error.message") == "the entry expired before it could be sent")
        // Every field of the contract's payload is there, null where it does not apply.
        for field in ["stdin.response", "stdin.parts", "stdin.data", "stdin.error.status", "stdin.error.body"] {
            #expect(hook.at(field) == .null, "\(field): \(hook.serialized())")
        }
        let row = try #require(try await p.list().first)
        #expect(row.string("state") == "error")
        #expect(row.string("reason") == "expired")
    }

    /// An entry that was sent and kept failing until it expired says so, and why the last
    /// attempt failed (the entry's reason); one never sent says that.
    @Test(arguments: [
        (Int64(0), nil as String?, "the entry expired before it could be sent"),
        (1, "HTTP 503", "the entry expired after 1 attempt without success; the last: HTTP 503"),
        (
            7, "timeout: stalled: less than 1 KiB/s over 1m",
            "the entry expired after 7 attempts without success; the last: timeout: stalled: less than 1 KiB/s over 1m"
        ),
        (2, nil, "the entry expired after 2 attempts without success"),
        (
            1, "headers updated",
            "the entry expired after 1 attempt without success; the last: refused for its credentials (401/403), then the headers were updated"
        ),
    ])
    func expiredMessageSaysHowTheAttemptsWent(_ attempts: Int64, _ reason: String?, _ message: String) {
        #expect(OutcomePayloads.expiredMessage(attempts: attempts, lastReason: reason) == message)
    }

    @Test func expiresInElapsedSettlesErrorExpired() async throws {
        // The shortest lifetime an enqueue takes: one second to be sent in.
        let p = try Project(definitions: ["t": definition("t", top: "expires_in: 1s")])
        try await p.enqueue("t", path: "/status/200", id: "short")
        // The run starts once the clock has passed the stored expiry, however long that took.
        let expiresAt = try #require(try await p.show("short")?.int("expires_at"))
        await eventually("the clock to pass the entry's expiry") { nowMs() > expiresAt }
        try await p.drain()
        #expect(p.server.requests.isEmpty)
        let hook = try #require(p.deliveries("short").first)
        #expect(hook.string("stdin.error.kind") == "expired")
    }

    /// A stored X-Request-Id or Idempotency-Key (a store written before they were refused as
    /// given headers) is not sent beside outbox's own: a server reading the first value would
    /// have seen the same request id on every attempt, and another key than the entry's.
    @Test func storedHeadersOfOutboxsOwnNamesAreNotSentTwice() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        p.server.script("/own", [.status(503), .json(200, "{}")])
        try await p.enqueue("t", path: "/own", id: "own")
        _ = try p.sqlite(
            """
            UPDATE entries SET request = json_set(request, '$.headers',
              json_array(json_array('x-request-id', 'stale'), json_array('IDEMPOTENCY-KEY', 'other'))) WHERE id = 'own'
            """)
        try await p.drain()
        let requests = p.server.requests(path: "/own")
        #expect(requests.count == 2)
        let requestIDs = requests.compactMap { $0.header("X-Request-Id") }
        #expect(Set(requestIDs).count == 2 && !requestIDs.contains { $0.contains(",") || $0 == "stale" }, "\(requestIDs)")
        let keys = requests.compactMap { $0.header("Idempotency-Key") }
        let hook = try #require(p.deliveries("own").first)
        #expect(keys.count == 2 && keys.allSatisfy { $0 == hook.string("stdin.meta.idempotency_key") }, "\(keys)")
    }

    @Test func requestIdsDifferPerAttemptAndTheIdempotencyKeyStays() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        p.server.script("/ids", [.status(503), .status(503), .json(200, "{}")])
        try await p.enqueue("t", path: "/ids", id: "ids")
        try await p.drain()
        let requests = p.server.requests(path: "/ids")
        #expect(requests.count == 3)
        let requestIDs = requests.compactMap { $0.header("X-Request-Id") }
        #expect(requestIDs.count == 3)
        #expect(Set(requestIDs).count == 3, "a fresh X-Request-Id per attempt: \(requestIDs)")
        let keys = requests.compactMap { $0.header("Idempotency-Key") }
        #expect(keys.count == 3)
        #expect(Set(keys).count == 1, "one Idempotency-Key for every attempt: \(keys)")
        #expect(requests.allSatisfy { $0.header("User-Agent")?.hasPrefix("outbox/") == true })
        let hook = try #require(p.deliveries("ids").first)
        #expect(hook.string("stdin.meta.idempotency_key") == keys.first)
        #expect(hook.string("stdin.meta.request_id") == requestIDs.last)
    }
}
