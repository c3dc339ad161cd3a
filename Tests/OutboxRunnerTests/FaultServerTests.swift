import Digest
import Foundation
import Glibc
import OutboxModel
import TestSupport
import Testing

/// For the faults where the server falls silent: a transfer that moves no byte for 2 s is
/// stalled, short enough for a quick test.
let stallConfig = fastConfigWith(stallFor: "2s", below: "1")
/// For every other fault: the server answers (or closes) at once, and no stall limit that a
/// loaded machine could outlast races it (a 2 s one once classed a TLS failure a timeout).
let faultConfig = fastConfigWith(stallFor: "10m", below: "1")

/// One fault that the runner must retry: the first request meets it, the second gets a 200.
struct RetriedFault: Sendable, CustomTestStringConvertible {
    var name: String
    /// The first answer (the second is a 200).
    var fault: TestResponse
    /// The first attempt's `error_kind` (nil: an HTTP status decided).
    var kind: String?
    /// The first attempt's `http_code`, when the fault gives one.
    var status: Int? = nil
    /// Words the first attempt's `error_message` holds.
    var message: String? = nil
    var testDescription: String { name }
}

/// One fault the runner must take as an answer in one attempt.
struct AnsweredFault: Sendable, CustomTestStringConvertible {
    var name: String
    var path: String
    var steps: [TestResponse]? = nil
    var request = ""
    var top = ""
    var config = faultConfig
    var outcome: String
    var kind: String? = nil
    var status: Int?
    /// The `run --drain` exit status: 0, or 1 when the entry settled `error`.
    var exit: Int32
    /// Checks on the hook's stdin, by dotted path.
    var expect: [String: JSON] = [:]
    var testDescription: String { name }
}

@Suite struct FaultServerTests {
    static func malformed(_ name: String) -> TestResponse { .raw(MalformedResponses.bytes(name)!) }

    /// A 200 whose body is these gzip bytes (base64), sent with `Content-Encoding: gzip`.
    static func gzipped(_ base64: String) -> TestResponse {
        TestResponse(
            status: 200, headers: [("Content-Type", "application/json"), ("Content-Encoding", "gzip")],
            body: Array(Data(base64Encoded: base64)!))
    }

    /// 256 KiB of zeros, gzipped (Python's `gzip.compress(bytes(262144), mtime=0)`).
    static let gzippedZeros =
        "H4sIAAAAAAACA+3BMQEAAADCoPVP7W0HoAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA3gAi6g7iAAAEAA=="

    // The request offers the encodings it can decode.
    @Test func aRequestOffersCompressedAnswers() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/204", id: "a1")
        try await p.drain()
        let offered = try #require(p.server.requests(path: "/status/204").first?.header("accept-encoding"))
        #expect(offered.contains("gzip"), "\(offered)")
    }

    /// A reused connection that closes before answering: libcurl would send the request again
    /// on a new connection by itself, a request no attempt shows. Refused, the retry is the
    /// runner's, an attempt of its own: every request the server saw is one attempt event.
    @Test func aRequestReSentAfterAReusedConnectionClosedIsAnAttemptOfItsOwn() async throws {
        let p = try Project(config: faultConfig + "concurrency: 1\nper_host: 1\n", definitions: ["t": definition("t")])
        p.server.script("/second", [.reset, .status(200)])
        try await p.enqueue("t", path: "/first", id: "a")
        try await p.enqueue("t", path: "/second", id: "b")
        let run = try await p.drain(["--events", "-", "--horizon", "1h"], failures: 0)
        let attempts = run.jsonLines.filter { $0.string("type") == "attempt" && $0.string("id") == "b" }
        #expect(attempts.map { $0.string("outcome") ?? "" } == ["retry", "success"], "\(run.stdout)")
        #expect(attempts.first?.string("error_kind") == "network", "\(run.stdout)")
        #expect(p.server.requests(path: "/second").count == 2)
        #expect(p.server.requests(path: "/first").first?.connectionID == p.server.requests(path: "/second").first?.connectionID, "reused")
    }

    static let retriedFaults: [RetriedFault] = [
        RetriedFault(name: "reset while the request body is read", fault: .resetWhileReadingRequest(afterBytes: 4), kind: "network"),
        RetriedFault(name: "reset mid-response", fault: .resetMidBody(bodySize: 1 << 16), kind: "network", status: 200),
        RetriedFault(name: "closed without a response", fault: .closeWithoutResponse, kind: "network"),
        RetriedFault(name: "stall before any byte", fault: .stall, kind: "timeout"),
        RetriedFault(name: "stall after the headers", fault: .stallAfterHeaders(), kind: "timeout", status: 200),
        RetriedFault(name: "status line with a word for the code", fault: malformed("status-not-a-number"), kind: "network"),
        RetriedFault(name: "status line with a four-digit code", fault: malformed("status-four-digits"), kind: "network"),
        RetriedFault(name: "status line with a code below 100", fault: malformed("status-below-100"), kind: "network"),
        RetriedFault(name: "garbage bytes", fault: malformed("garbage"), kind: "network"),
        RetriedFault(name: "HTTP/9.9", fault: malformed("version-9.9"), kind: "network"),
        RetriedFault(name: "a status line only, no CRLF", fault: malformed("status-line-only"), kind: "network"),
        RetriedFault(name: "the close inside the headers", fault: .raw("HTTP/1.1 201 Created\r\nContent-Type: app"), kind: "network"),
        RetriedFault(name: "a status line and the close", fault: .raw("HTTP/1.1 201 Created\r\n"), kind: "network"),
        RetriedFault(name: "a header line without a colon", fault: malformed("header-no-colon"), kind: "network", status: 200),
        RetriedFault(
            name: "a header line of 1 MiB", fault: malformed("header-1mib"), kind: "network", status: 200,
            message: "a response header line is over libcurl's 100 KiB limit"),
        RetriedFault(name: "a NUL byte in a header", fault: malformed("header-nul"), kind: "network", status: 200),
        RetriedFault(name: "Content-Length longer than the body", fault: malformed("length-longer"), kind: "network", status: 200),
        RetriedFault(
            name: "two different Content-Length headers", fault: malformed("length-two"), kind: "network", status: 200,
            message: "malformed response: two different Content-Length values (2, 3)"),
        RetriedFault(
            name: "a Content-Length libcurl would read as 1", fault: .raw("HTTP/1.1 200 OK\r\nContent-Length: 1e5\r\n\r\nok"),
            kind: "network", status: 200, message: #"malformed response: Content-Length "1e5" is not a number of bytes"#),
        RetriedFault(
            name: "a Content-Length in hexadecimal", fault: .raw("HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\nok"),
            kind: "network", status: 200, message: #"Content-Length "0x10" is not a number of bytes"#),
        RetriedFault(
            name: "a Content-Length past 2^63",
            fault: .raw("HTTP/1.1 200 OK\r\nContent-Length: 9223372036854775808\r\n\r\nok"), kind: "network", status: 200,
            message: #"Content-Length "9223372036854775808" is not a number of bytes"#),
        RetriedFault(name: "a negative Content-Length", fault: malformed("length-negative"), kind: "network", status: 200),
        RetriedFault(
            name: "a 1xx and then the close: no final response", fault: .raw("HTTP/1.1 199 Odd\r\nContent-Length: 0\r\n\r\n"),
            kind: "network"),
        RetriedFault(name: "503", fault: .status(503), kind: nil, status: 503),
        RetriedFault(
            name: "429 with an invalid Retry-After", fault: .status(429, headers: [("Retry-After", "abc")]), kind: nil, status: 429),
    ]

    @Test(arguments: retriedFaults)
    func aFaultIsRetriedAndTheNextAnswerCompletes(_ c: RetriedFault) async throws {
        let p = try Project(config: c.kind == "timeout" ? stallConfig : faultConfig, definitions: ["t": definition("t")])
        p.server.script("/f", [c.fault, .json(200, #"{"ok":true}"#)])
        try await p.enqueue("t", path: "/f", id: "e1")
        // The retry is due 50 ms after the fault (2 s and more for a stall), which a busy
        // machine may reach past the default 10 s horizon: this run must make it.
        let run = try await p.drain(["--events", "-", "--horizon", "1h"], failures: 0)

        let attempts = run.jsonLines.filter { $0.string("type") == "attempt" }
        #expect(attempts.map { $0.string("outcome") ?? "" } == ["retry", "success"], "\(run.stdout)")
        let first = try #require(attempts.first)
        #expect(first.string("error_kind") == c.kind, "\(first.serialized())")
        if let status = c.status { #expect(first.int("http_code") == Int64(status), "\(first.serialized())") }
        if c.kind != nil && c.status == nil { #expect(first.at("http_code") == .null, "\(first.serialized())") }
        if let message = c.message { #expect(first.string("error_message")?.contains(message) == true, "\(first.serialized())") }
        #expect(p.server.requests(path: "/f").count == 2)
        let hook = try #require(p.deliveries("e1").first)
        #expect(hook.string("stdin.outcome") == "completed")
        #expect(hook.int("stdin.meta.attempts") == 2)
        #expect(hook.int("stdin.response.status") == 200)
        #expect(try await p.list().isEmpty)
    }

    /// A response that keeps trickling (never a stall) is given up at `timeouts.attempt`.
    @Test func anAttemptLongerThanItsLimitIsGivenUpAndRetried() async throws {
        let config = """
            retry:
              backoff: { base: 50ms, max: 200ms, jitter: 0 }
            timeouts: { attempt: 1s, stall: { below: 1, for: 10m } }

            """
        let p = try Project(config: config, definitions: ["t": definition("t")])
        // 10 KB/s of a 1 GiB body: it would take a day, and stays far above the stall limit.
        p.server.script("/trickle", [.slowBody(bodySize: 1 << 30, bytesPerChunk: 100, intervalMs: 10), .json(200, #"{"ok":true}"#)])
        try await p.enqueue("t", path: "/trickle", id: "slow")
        let run = try await p.drain(["--events", "-", "--horizon", "1h"], failures: 0)
        let attempts = run.jsonLines.filter { $0.string("type") == "attempt" }
        // The limit holds for every attempt: a busy machine may take 1 s over the short answer
        // too, which is then given up and retried like the trickle. The last one completes.
        #expect(attempts.count >= 2 && attempts.last?.string("outcome") == "success", "\(run.stdout)")
        for attempt in attempts.dropLast() {
            #expect(attempt.string("outcome") == "retry", "\(run.stdout)")
            #expect(attempt.string("error_kind") == "timeout", "\(attempt.serialized())")
            #expect(attempt.string("error_message")?.contains("timed out") == true, "\(attempt.serialized())")
        }
        // An attempt given up before its request was read is not recorded (or not yet).
        #expect((2...max(2, attempts.count)).contains(p.server.requests(path: "/trickle").count))
        #expect(p.deliveries("slow").first?.string("stdin.outcome") == "completed")
    }

    @Test func aStormOf503IsRetriedUntilItPasses() async throws {
        let p = try Project(config: faultConfig, definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/storm/s/4/503", id: "st")
        // Four retries must all come in this run, however slowly the machine gets to them.
        let run = try await p.drain(["--events", "-", "--horizon", "1h"], failures: 0)
        let attempts = run.jsonLines.filter { $0.string("type") == "attempt" }
        #expect(attempts.map { $0.int("http_code") ?? 0 } == [503, 503, 503, 503, 200])
        #expect(p.server.requests(path: "/storm/s/").count == 5)
        #expect(p.deliveries("st").first?.int("stdin.meta.attempts") == 5)
    }

    @Test func aFileBodyCutOffMidRequestIsSentWholeTheNextTime() async throws {
        let p = try Project(config: faultConfig, definitions: ["up": fileDefinition("up")])
        let source = p.base + "/payload.bin"
        let bytes = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        try Data(bytes).write(to: URL(fileURLWithPath: source))
        p.server.script("/put/cut", [.resetWhileReadingRequest(afterBytes: 64 * 1024), .json(201, "{}")])
        let vars = JSON.object([("url", .string(p.url("/put/cut"))), ("path", .string(source))]).serialized()
        #expect(try await p.outbox(["enqueue", "up", "--vars", vars, "--id", "cut"]).exitCode == 0)
        try await p.drain(["--horizon", "1h"], failures: 0)
        let requests = p.server.requests(path: "/put/cut")
        #expect(requests.count == 2)
        #expect(requests.first?.completed == false)
        #expect((requests.first?.bodySize ?? 0) < Int64(bytes.count))
        #expect(requests.last?.completed == true)
        #expect(requests.last?.bodySHA256 == SHA256.hex(bytes))
        #expect(p.deliveries("cut").first?.string("stdin.outcome") == "completed")
    }

    // MARK: - Faults that are an answer

    static let answeredFaults: [AnsweredFault] = [
        AnsweredFault(
            name: "obs-fold continuation lines are joined", path: "/malformed/obs-fold", outcome: "completed", status: 200, exit: 0,
            expect: ["stdin.response.headers.x-folded": .string("first second"), "stdin.response.body": .string("ok")]),
        AnsweredFault(
            name: "10,000 headers are all kept", path: "/malformed/headers-10000", outcome: "completed", status: 200, exit: 0,
            expect: ["stdin.response.headers.x-header-0": .string("0"), "stdin.response.headers.x-header-9999": .string("9999")]),
        AnsweredFault(
            name: "a Content-Length shorter than the body frames the body", path: "/malformed/length-shorter",
            outcome: "completed", status: 200, exit: 0, expect: ["stdin.response.body": .string("ok")]),
        AnsweredFault(
            name: "a status above 599 is an http error", path: "/status/799", outcome: "error", kind: "http", status: 799, exit: 1),
        AnsweredFault(
            // libcurl reads what follows a 101 to a request that asked for no upgrade as its body.
            name: "a 101 to a request that asked for no upgrade is an http error", path: "/switch",
            steps: [
                .raw(
                    Array("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".utf8) + [0x81, 0x05]
                        + Array("hello".utf8))
            ],
            outcome: "error", kind: "http", status: 101, exit: 1),
        AnsweredFault(
            name: "one Content-Length value repeated in a list frames the body", path: "/cl-list",
            steps: [.raw("HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok")], outcome: "completed", status: 200, exit: 0,
            expect: ["stdin.response.body": .string("ok")]),
        AnsweredFault(
            // 65,536 bytes end inside the 21,846th euro sign: the cut character is left out.
            name: "UTF-8 text cut at max_response_bytes stays text", path: "/euros",
            steps: [.status(200, body: String(repeating: "€", count: 30_000))],
            config: faultConfig + "max_response_bytes: 64KiB\n", outcome: "completed", status: 200, exit: 0,
            expect: [
                "stdin.response.body": .string(String(repeating: "€", count: 21_845)), "stdin.response.body_truncated": .bool(true),
            ]),
        AnsweredFault(
            // The error's copy of the body is cut the same way: text, not base64 of the bytes.
            name: "UTF-8 text of a refusal cut at max_response_bytes stays text in the error", path: "/euros-422",
            steps: [.status(422, body: String(repeating: "€", count: 30_000))],
            config: faultConfig + "max_response_bytes: 64KiB\n", outcome: "error", kind: "http", status: 422, exit: 1,
            expect: ["stdin.error.body": .string(String(repeating: "€", count: 21_845))]),
        AnsweredFault(
            name: "UTF-8 text over max_response_bytes with a parser stays text in the error", path: "/euros-json",
            steps: [.status(200, body: String(repeating: "€", count: 30_000))], top: "response: json",
            config: faultConfig + "max_response_bytes: 64KiB\n", outcome: "error", kind: "truncated", status: nil, exit: 0,
            expect: ["stdin.error.body": .string(String(repeating: "€", count: 21_845))]),
        AnsweredFault(
            name: "an endless body over max_response_bytes with a parser: truncated", path: "/endless", top: "response: json",
            config: faultConfig + "max_response_bytes: 64KiB\n", outcome: "error", kind: "truncated", status: nil, exit: 0,
            expect: ["stdin.response.status": .int(200), "stdin.response.body_truncated": .bool(true)]),
        AnsweredFault(
            name: "an endless raw body is kept up to max_response_bytes", path: "/endless",
            config: faultConfig + "max_response_bytes: 64KiB\n", outcome: "completed", status: 200, exit: 0,
            expect: ["stdin.response.body_truncated": .bool(true)]),
        AnsweredFault(
            name: "a 10 MiB body with a parser: truncated", path: "/bytes/10485760", top: "response: json",
            config: faultConfig + "max_response_bytes: 64KiB\n", outcome: "error", kind: "truncated", status: nil, exit: 0,
            expect: ["stdin.response.status": .int(200), "stdin.response.body_truncated": .bool(true)]),
        AnsweredFault(
            name: "a gzip-encoded JSON body is decoded and parsed", path: "/gzip",
            steps: [gzipped(#"H4sIAAAAAAACA6tWylOyUqoyVKoFAFH6qmoKAAAA"#)], top: "response: json",
            outcome: "completed", status: 200, exit: 0,
            expect: ["stdin.data.n": .string("z1"), "stdin.response.body": .string(#"{"n":"z1"}"#)]),
        AnsweredFault(
            // 289 bytes that decode to 256 KiB of zeros: the cap counts what they decode to.
            name: "a compressed body that decodes past max_response_bytes: truncated", path: "/gzip-zeros",
            steps: [gzipped(gzippedZeros)], top: "response: json",
            config: faultConfig + "max_response_bytes: 64KiB\n", outcome: "error", kind: "truncated", status: nil, exit: 0,
            expect: ["stdin.response.status": .int(200), "stdin.response.body_truncated": .bool(true)]),
        AnsweredFault(
            name: "a 10 MiB raw body is kept up to max_response_bytes", path: "/bytes/10485760",
            config: faultConfig + "max_response_bytes: 64KiB\n", outcome: "completed", status: 200, exit: 0,
            expect: ["stdin.response.body_truncated": .bool(true)]),
    ]

    @Test(arguments: answeredFaults)
    func aFaultThatIsAnAnswerSettlesInOneAttempt(_ c: AnsweredFault) async throws {
        let p = try Project(config: c.config, definitions: ["t": definition("t", request: c.request, top: c.top)])
        if let steps = c.steps { p.server.script(c.path, steps) }
        try await p.enqueue("t", path: c.path, id: "a1")
        let run = try await p.drain(failures: c.exit)
        try await expectSettled(p, "a1", c)
        // A response that could not be read is said in the log too: with no hook, nothing else would.
        let unread = c.kind == "truncated" || c.kind == "unknown"
        #expect(run.stderr.contains("a1 was answered and is completed, but its response was not read") == unread, "\(run.stderr)")
    }

    func expectSettled(_ p: Project, _ id: String, _ c: AnsweredFault, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let log = p.deliveries(id)
        #expect(log.count == 1, sourceLocation: sourceLocation)
        let hook = try #require(log.first, sourceLocation: sourceLocation)
        #expect(hook.string("stdin.outcome") == c.outcome, "\(hook.serialized().prefix(2000))", sourceLocation: sourceLocation)
        #expect(hook.int("stdin.meta.attempts") == 1, sourceLocation: sourceLocation)
        #expect(hook.string("stdin.error.kind") == c.kind, "\(hook.serialized().prefix(2000))", sourceLocation: sourceLocation)
        if let status = c.status {
            let path = c.kind == "http" ? "stdin.error.status" : "stdin.response.status"
            #expect(hook.int(path) == Int64(status), "\(hook.serialized().prefix(2000))", sourceLocation: sourceLocation)
        }
        for (path, value) in c.expect {
            #expect(hook.at(path) == value, "\(path) in \(hook.serialized().prefix(2000))", sourceLocation: sourceLocation)
        }
        let rows = try await p.list()
        if c.outcome == "completed" || c.kind == "truncated" || c.kind == "unknown" {
            #expect(rows.isEmpty, "\(rows)", sourceLocation: sourceLocation)
        } else {
            #expect(rows.map { $0.string("state") } == ["error"], "\(rows)", sourceLocation: sourceLocation)
        }
    }

    @Test func anEndlessBodyKeepsTheRunnersMemoryFlat() async throws {
        let p = try Project(config: faultConfig + "max_response_bytes: 64KiB\n", definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/endless?chunk=65536", id: "big")
        var peakKiB = 0
        try await p.runUntil {
            runner in
            guard !p.deliveries("big").isEmpty else { return false }
            peakKiB = runner.peakMemoryKiB ?? 0
            return true
        }
        // Far more than the runner needs (a few MiB over its idle size), far less than
        // what reading on would have kept.
        #expect(peakKiB > 0 && peakKiB < 200 * 1024, "VmHWM \(peakKiB) KiB")
        #expect(p.deliveries("big").first?.at("stdin.response.body_truncated") == .bool(true))
    }

    /// A file body is streamed from disk: the runner's peak memory (its own `VmHWM`, so no other
    /// test's allocations count) stays far below the file's size.
    @Test func aLargeFileBodyKeepsTheRunnersMemoryFlat() async throws {
        let size: Int64 = 512 << 20
        let p = try Project(definitions: ["f": fileDefinition("f", ownership: "reference")])
        let file = p.path("big.bin")
        #expect(FileManager.default.createFile(atPath: file, contents: nil))
        #expect(truncate(file, off_t(size)) == 0)
        let vars = JSON.object([("url", .string(p.url("/big"))), ("path", .string(file))]).serialized()
        #expect(try await p.outbox(["enqueue", "f", "--id", "big", "--vars", vars]).exitCode == 0)
        let runner = try p.start(["run"])
        // 512 MiB through curl and the test server's SHA-256 can take minutes with both cores
        // busy: the wait is for the hook, not a bet on the machine's speed (runUntil gives 30 s).
        await eventually("the upload's hook", timeout: 600) { !p.deliveries("big").isEmpty }
        let peakKiB = runner.peakMemoryKiB ?? 0
        runner.signal(SIGTERM)
        let run = await runner.wait()
        #expect(run.exitCode == 0 && !run.timedOut, "run: \(run)")
        #expect(p.deliveries("big").first?.string("stdin.outcome") == "completed")
        let recorded = try #require(p.server.requests(path: "/big").last)
        #expect(recorded.bodySize == size)
        #expect(recorded.bodySHA256 == (try PartFiles.sha(file, 0, size)))
        // Loading the file would put the peak above 512 MiB; streaming keeps it near idle.
        #expect(peakKiB > 0 && peakKiB < 128 * 1024, "VmHWM \(peakKiB) KiB")
    }

    // MARK: - Retry-After

    /// Backoff 100 ms doubling, no jitter: the time between an attempt and the next is exact.
    static let retryAfterConfig = """
        retry:
          backoff: { base: 100ms, max: 2h, jitter: 0 }

        """

    @Test(arguments: [("delta-seconds", "3600")])
    func aValidRetryAfterSchedulesTheNextAttemptThen(_ name: String, _ value: String) async throws {
        let p = try Project(config: Self.retryAfterConfig, definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/429?retry_after=\(value)", id: "ra")
        let run = try await p.drain(["--events", "-", "--horizon", "1s"], failures: 0)
        let (at, next) = try lastAttemptAndNext(run, "ra")
        #expect(next - at == 3_600_000)
        #expect(p.server.requests(path: "/status/429").count == 1)
        let row = try #require(try await p.list().first)
        #expect(row.string("state") == "queued")
        #expect(row.int("next_attempt_at") == next)
    }

    @Test func anHTTPDateRetryAfterSchedulesTheNextAttemptAtThatDate() async throws {
        let p = try Project(config: Self.retryAfterConfig, definitions: ["t": definition("t")])
        let date = Int64(time(nil)) + 3600
        var tm = tm()
        var seconds = time_t(date)
        gmtime_r(&seconds, &tm)
        var buffer = [CChar](repeating: 0, count: 64)
        strftime(&buffer, buffer.count, "%a, %d %b %Y %H:%M:%S GMT", &tm)
        let value =
            String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self).addingPercentEncoding(
                withAllowedCharacters: .alphanumerics) ?? ""
        try await p.enqueue("t", path: "/status/429?retry_after=\(value)", id: "rd")
        let run = try await p.drain(["--events", "-", "--horizon", "1s"], failures: 0)
        let (_, next) = try lastAttemptAndNext(run, "rd")
        // The date's second, rounded up to a whole second from the attempt.
        #expect((date * 1000..<date * 1000 + 1000).contains(next), "next \(next), date \(date)")
        #expect(p.server.requests(path: "/status/429").count == 1)
    }

    @Test func aRetryAfterBeyond64BitsWaitsTheBackoffMax() async throws {
        let p = try Project(config: Self.retryAfterConfig, definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/429?retry_after=99999999999999999999999", id: "rh")
        let run = try await p.drain(["--events", "-", "--horizon", "1s"], failures: 0)
        let (at, next) = try lastAttemptAndNext(run, "rh")
        #expect(next - at == 7_200_000)
    }

    /// An invalid value falls back to the backoff: the second failure waits 200 ms, where a
    /// value read as 0 would wait the 100 ms floor.
    @Test(arguments: ["abc", "-1", "", "1.5", "%20", "Sun, 06 Nov 1994 08:49:37 XYZ"])
    func anInvalidRetryAfterFallsBackToTheBackoff(_ value: String) async throws {
        let p = try Project(config: Self.retryAfterConfig, definitions: ["t": definition("t")])
        let encoded = value == "%20" ? value : value.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        try await p.enqueue("t", path: "/storm/x/2/429?retry_after=\(encoded)", id: "ri")
        let run = try await p.drain(["--events", "-", "--horizon", "1h"], failures: 0)
        let attempts = run.jsonLines.filter { $0.string("type") == "attempt" }
        let states = run.jsonLines.filter {
            $0.string("type") == "state" && $0.string("state") == "queued" && $0.at("next_attempt_at") != nil
        }
        #expect(attempts.map { $0.int("http_code") ?? 0 } == [429, 429, 200])
        let waits = zip(attempts, states).map { ($1.int("next_attempt_at") ?? 0) - ($0.int("at") ?? 0) }
        #expect(waits == [100, 200], "\(run.stdout)")
        let recorded = p.server.requests(path: "/storm/x/").first?.path ?? ""
        #expect(recorded.contains("retry_after="))
    }

    func lastAttemptAndNext(_ run: Finished, _ id: String) throws -> (Int64, Int64) {
        let attempt = try #require(run.jsonLines.last { $0.string("type") == "attempt" && $0.string("id") == id })
        let state = try #require(
            run.jsonLines.last { $0.string("type") == "state" && $0.string("id") == id && $0.string("state") == "queued" })
        return (try #require(attempt.int("at")), try #require(state.int("next_attempt_at")))
    }
}
