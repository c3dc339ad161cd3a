import Foundation
import Digest
import Glibc
import Testing
import TestSupport

/// The loopback test server itself: every scripted action and built-in path, driven by
/// curl subprocesses or raw sockets.
struct TestServerTests {
    // MARK: - Helpers

    private func tempFolder() throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("h-srv-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }

    /// sha256sum's answer, so the server's own SHA-256 is checked against an outside one.
    private func sha256sum(_ path: String) throws -> String {
        let result = try TestHTTPCurl.runExecutable("/usr/bin/sha256sum", [path])
        return String(result.stdoutText.prefix(64))
    }

    private func jsonObject(_ bytes: [UInt8]) throws -> [String: Any] {
        try #require(JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any])
    }

    private func elapsedMs(_ body: () throws -> Void) rethrows -> Int64 {
        let start = ContinuousClock.now
        try body()
        let duration = ContinuousClock.now - start
        return duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
    }

    // MARK: - SHA-256

    @Test(arguments: [
        ("empty", "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        ("abc", "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        (
            "two blocks", "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        ),
    ])
    func sha256KnownVectors(name: String, input: String, expected: String) {
        #expect(SHA256.hex(Array(input.utf8)) == expected, "\(name)")
    }

    @Test func sha256IsTheSameFedInOddPieces() {
        let data = (0..<10_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        var hasher = SHA256.Hasher()
        var offset = 0
        for size in [1, 63, 64, 65, 127, 1000, 3] where offset < data.count {
            let end = min(offset + size, data.count)
            hasher.update(Array(data[offset..<end]))
            offset = end
        }
        hasher.update(Array(data[offset...]))
        #expect(hasher.finalizeHex() == SHA256.hex(data))
        #expect(
            SHA256.hex(Array(repeating: UInt8(ascii: "a"), count: 1_000_000))
                == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }

    // MARK: - Scripted responses

    @Test func scriptedSequenceRepeatsTheLastStep() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/api", [.status(503), .status(503), .status(200, body: "ok")])
        var codes: [Int] = []
        for _ in 0..<4 { codes.append(try TestHTTPCurl.statusCode(server.url("/api/items")).code) }
        #expect(codes == [503, 503, 200, 200])
        #expect(server.requests(path: "/api").count == 4)
        #expect(server.requests(path: "/other").isEmpty)
    }

    @Test func longestPrefixWins() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/a", [.status(201)])
        server.script("/a/b", [.status(202)])
        #expect(try TestHTTPCurl.statusCode(server.url("/a/b/c")).code == 202)
        #expect(try TestHTTPCurl.statusCode(server.url("/a/x")).code == 201)
        #expect(try TestHTTPCurl.statusCode(server.url("/z")).code == 200)
    }

    @Test func scriptedHeadersAndJSONBody() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/j", [.json(429, #"{"slow":"down"}"#, headers: [("Retry-After", "3")])])
        let result = try TestHTTPCurl.run(["-s", "-i", server.url("/j")])
        let text = result.stdoutText
        #expect(text.hasPrefix("HTTP/1.1 429 Too Many Requests\r\n"))
        #expect(text.contains("Retry-After: 3\r\n"))
        #expect(text.contains("Content-Type: application/json\r\n"))
        #expect(text.contains("Content-Length: 15\r\n"))
        #expect(text.hasSuffix("\r\n\r\n{\"slow\":\"down\"}"))
    }

    @Test func resetBeforeResponseIsARecvFailure() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/r", [.reset])
        let result = try TestHTTPCurl.run(["-s", "-o", "/dev/null", server.url("/r")])
        #expect(result.exitCode == 56)  // CURLE_RECV_ERROR: connection reset
        #expect(server.requests.count == 1)
        #expect(server.requests.first?.completed == true)
    }

    @Test func closeWithoutResponseIsAnEmptyReply() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/c", [.closeWithoutResponse])
        let result = try TestHTTPCurl.run(["-s", "-o", "/dev/null", server.url("/c")])
        #expect(result.exitCode == 52)  // CURLE_GOT_NOTHING
    }

    @Test func resetMidBodyFailsTheClientAfterPartOfTheBody() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/m", [.resetMidBody(bodySize: 200_000)])
        let result = try TestHTTPCurl.run(["-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download}", server.url("/m")])
        // 56: reset seen while reading; 18: connection ended before Content-Length bytes.
        #expect(result.exitCode == 56 || result.exitCode == 18)
        let parts = result.stdoutText.split(separator: " ")
        #expect(parts.first == "200")
        let received = Int(parts.last ?? "") ?? -1
        #expect(received >= 0 && received <= 100_000)
    }

    @Test func slowBodyTakesAtLeastItsIntervals() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/slow", [.slowBody(bodySize: 4000, bytesPerChunk: 1000, intervalMs: 100)])
        let folder = try tempFolder()
        defer { try? FileManager.default.removeItem(at: folder) }
        let out = folder.appendingPathComponent("body").path
        var result: TestHTTPProcessResult?
        let ms = try elapsedMs { result = try TestHTTPCurl.run(["-s", "-o", out, server.url("/slow")]) }
        #expect(result?.exitCode == 0)
        #expect(ms >= 400)
        #expect(try sha256sum(out) == TestResponse.patternSHA256(count: 4000))
    }

    @Test func delayHoldsTheResponse() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/d", [.delay(300, 204)])
        var code = 0
        let ms = try elapsedMs { code = try TestHTTPCurl.statusCode(server.url("/d")).code }
        #expect(code == 204)
        #expect(ms >= 300)
    }

    @Test func resetWhileReadingRequestRecordsAnIncompleteBody() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/up", [.resetWhileReadingRequest(afterBytes: 1000)])
        let folder = try tempFolder()
        defer { try? FileManager.default.removeItem(at: folder) }
        let file = folder.appendingPathComponent("body")
        try Data(repeating: 0x41, count: 1 << 20).write(to: file)
        let result = try TestHTTPCurl.run(["-s", "-o", "/dev/null", "-H", "Expect:", "-T", file.path, server.url("/up")])
        #expect(result.exitCode != 0)
        #expect(server.waitForRequests(count: 1))
        let record = try #require(server.requests.first)
        #expect(record.completed == false)
        #expect(record.bodySize == 1000)
        #expect(record.bodySHA256 == SHA256.hex(Array(repeating: UInt8(0x41), count: 1000)))
        #expect(record.body == nil)
    }

    @Test func stallHoldsUntilTheClientGivesUpAndStopStillReturns() throws {
        let server = try TestHTTPServer()
        server.script("/s", [.stall])
        let result = try TestHTTPCurl.run(["-s", "-o", "/dev/null", "--max-time", "0.5", server.url("/s")])
        #expect(result.exitCode == 28)  // CURLE_OPERATION_TIMEDOUT
        // A second stalled connection is still open while stop() runs: stop must end it.
        let client = try RawClient(port: server.port)
        try client.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(server.waitForRequests(count: 2))
        let ms = elapsedMs { server.stop() }
        #expect(ms < 60_000, "stop() did not end a stalled connection")
        #expect(client.receiveAll().isEmpty)
    }

    // MARK: - Holds

    @Test func aHeldRequestIsRecordedAndAnsweredOnlyOnceReleased() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/h", [TestResponse.status(201, body: "late").held("h")])
        let client = try RawClient(port: server.port)
        try client.send("GET /h HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(server.waitForHeld("h"))
        #expect(server.heldCount("h") == 1)
        #expect(server.requests.map(\.path) == ["/h"], "recorded before it waits")
        // Nothing can arrive while it is held, however long the test looks.
        #expect(client.hasBytesWaiting() == false)
        #expect(server.release("h") == 1)
        #expect(client.receive(until: "late").hasPrefix("HTTP/1.1 201 "))
        #expect(server.heldCount("h") == 0)
        #expect(server.waitForHeld("h", timeoutMs: 0) == false)
    }

    @Test func releaseWithACountLetsThatManyGoOldestFirstThenLaterArrivals() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/q", [TestResponse.status(200, body: "done").held("q")])
        var clients: [RawClient] = []
        for n in 1...3 {
            let client = try RawClient(port: server.port)
            try client.send("GET /q?\(n) HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(server.waitForHeld("q", count: n))
            clients.append(client)
        }
        #expect(server.release("q", count: 1) == 1)
        #expect(clients[0].receive(until: "done").hasPrefix("HTTP/1.1 200 "))
        #expect(server.heldCount("q") == 2)
        #expect(clients[1].hasBytesWaiting() == false)
        #expect(clients[2].hasBytesWaiting() == false)
        // Two held go on; the third release passes the next arrival at once.
        #expect(server.release("q", count: 3) == 2)
        #expect(clients[1].receive(until: "done").hasPrefix("HTTP/1.1 200 "))
        #expect(clients[2].receive(until: "done").hasPrefix("HTTP/1.1 200 "))
        #expect(try TestHTTPCurl.statusCode(server.url("/q?4")).code == 200)
        #expect(server.heldCount("q") == 0)
        // Permits used up: the next one waits again.
        let fifth = try RawClient(port: server.port)
        try fifth.send("GET /q?5 HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(server.waitForHeld("q"))
        server.release("q")
        #expect(fifth.receive(until: "done").hasPrefix("HTTP/1.1 200 "))
    }

    @Test func releaseWithoutACountOpensTheHoldForLaterRequests() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/o", [TestResponse.hold("o")])
        #expect(server.release("o") == 0)
        #expect(try TestHTTPCurl.statusCode(server.url("/o")).code == 200)
        #expect(try TestHTTPCurl.statusCode(server.url("/o")).code == 200)
        #expect(server.heldCount("o") == 0)
    }

    @Test func aHeldRequestWhoseClientLeavesNoLongerCounts() async throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/gone", [TestResponse.hold("gone")])
        let client = try RawClient(port: server.port)
        try client.send("GET /gone HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(await server.waitForHeld("gone"))
        client.close()
        await eventually("the held request to notice its client left") { server.heldCount("gone") == 0 }
        // A reset keeps holds: a request held afterwards still waits for its release.
        server.reset()
        server.script("/gone", [TestResponse.hold("gone")])
        let again = try RawClient(port: server.port)
        try again.send("GET /gone HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(await server.waitForHeld("gone"))
        #expect(server.release("gone") == 1)
        #expect(again.receive(until: "{}").hasPrefix("HTTP/1.1 200 "))
    }

    @Test func stopEndsHeldRequests() throws {
        let server = try TestHTTPServer()
        server.script("/s", [TestResponse.hold("s")])
        let client = try RawClient(port: server.port)
        try client.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(server.waitForHeld("s"))
        server.stop()
        #expect(client.receiveAll().isEmpty)
        #expect(server.heldCount("s") == 0)
    }

    @Test func holdPathAndControlEndpointsSteerTheStandaloneServer() async throws {
        let process = try TestHTTPServerProcess()
        let client = try RawClient(port: process.port)
        try client.send("PUT /hold/p/status/202 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
        try await eventually("the PUT held at p") { try process.heldCount("p") == 1 }
        #expect(client.hasBytesWaiting() == false)
        let release = try process.release("p")
        #expect(release.jsonObject as? [String: Int] == ["released": 1, "held": 0])
        #expect(client.receive(until: "}").hasPrefix("HTTP/1.1 202 "))
        // Control paths are neither recorded nor scriptable: only the held PUT was.
        let stats = try jsonObject(try TestHTTPCurl.run(["-s", process.baseURL + "/_stats"]).stdoutBytes)
        #expect(stats["count"] as? Int == 1)
        #expect((stats["requests"] as? [[String: Any]])?.first?["path"] as? String == "/hold/p/status/202")
        #expect(process.stop() == 0)
    }

    @Test func releaseEndpointTakesACount() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let first = try RawClient(port: server.port)
        try first.send("GET /hold/c HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(server.waitForHeld("c"))
        let release = try TestHTTPCurl.run(["-s", "-X", "POST", server.url("/_control/release/c?count=2")])
        #expect(release.jsonObject as? [String: Int] == ["released": 1, "held": 0])
        #expect(first.receive(until: "}").hasPrefix("HTTP/1.1 200 "))
        // The rest of the count lets the next arrival through at once.
        #expect(try TestHTTPCurl.statusCode(server.url("/hold/c")).code == 200)
        #expect(try TestHTTPCurl.statusCode(server.url("/_control/release/c?count=x")).code == 400)
        #expect(server.requests.map(\.path) == ["/hold/c", "/hold/c"])
    }

    // MARK: - Connections and bodies

    @Test func keepAliveReusesOneConnection() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let result = try TestHTTPCurl.run(["-s", "-o", "/dev/null", "-o", "/dev/null", server.url("/one"), server.url("/two")])
        #expect(result.exitCode == 0)
        #expect(server.connectionsAccepted == 1)
        #expect(server.requests.map(\.path) == ["/one", "/two"])
        #expect(Set(server.requests.map(\.connectionID)).count == 1)
    }

    @Test func connectionCloseFromAScriptEndsReuse() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/one", [TestResponse(status: 200, closeConnection: true)])
        let result = try TestHTTPCurl.run(["-s", "-o", "/dev/null", "-o", "/dev/null", server.url("/one"), server.url("/two")])
        #expect(result.exitCode == 0)
        #expect(server.connectionsAccepted == 2)
    }

    @Test func chunkedUploadIsRecordedWithSizeAndHash() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let folder = try tempFolder()
        defer { try? FileManager.default.removeItem(at: folder) }
        let file = folder.appendingPathComponent("body")
        let bytes = (0..<300_001).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 5) }
        try Data(bytes).write(to: file)
        let result = try TestHTTPCurl.run([
            "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Transfer-Encoding: chunked", "-H", "Expect:",
            "-H", "Content-Type: application/octet-stream", "--data-binary", "@" + file.path, server.url("/chunked"),
        ])
        #expect(result.stdoutText == "200")
        let record = try #require(server.requests.first)
        #expect(record.method == "POST")
        #expect(record.header("transfer-encoding") == "chunked")
        #expect(record.header("CONTENT-TYPE") == "application/octet-stream")
        #expect(record.bodySize == 300_001)
        #expect(record.bodySHA256 == (try sha256sum(file.path)))
        #expect(record.body == bytes)
        #expect(record.completed)
    }

    @Test func expectContinueGetsA100BeforeTheBody() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        try client.send("PUT /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        let interim = client.receive(until: "\r\n\r\n")
        #expect(interim == "HTTP/1.1 100 Continue\r\n\r\n")
        try client.send("hello")
        let final = client.receive(until: "\"}")
        #expect(final.hasPrefix("HTTP/1.1 200 OK\r\n"))
        #expect(server.expectContinueCount == 1)
        let record = try #require(server.requests.first)
        #expect(record.expectedContinue)
        #expect(record.bodyText == "hello")
    }

    @Test func curlExpectContinueUploadSucceeds() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let folder = try tempFolder()
        defer { try? FileManager.default.removeItem(at: folder) }
        let file = folder.appendingPathComponent("body")
        try Data(repeating: 7, count: 2048).write(to: file)
        let result = try TestHTTPCurl.run(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-T", file.path, server.url("/put/e")])
        #expect(result.stdoutText == "201")
        #expect(server.expectContinueCount == 1)
        #expect(server.requests.first?.bodySize == 2048)
    }

    @Test func fiftyMiBUploadStreamsWithTheRightHash() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let folder = try tempFolder()
        defer { try? FileManager.default.removeItem(at: folder) }
        let file = folder.appendingPathComponent("big")
        let block = Data((0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 % 253) })
        #expect(FileManager.default.createFile(atPath: file.path, contents: nil))
        let handle = try FileHandle(forWritingTo: file)
        for _ in 0..<50 { handle.write(block) }
        try handle.close()
        let result = try TestHTTPCurl.run([
            "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Expect:", "-T", file.path, server.url("/put/big"),
        ])
        #expect(result.stdoutText == "201")
        let record = try #require(server.requests.first)
        #expect(record.bodySize == 50 << 20)
        #expect(record.bodySHA256 == (try sha256sum(file.path)))
        #expect(record.body == nil)  // over the 1 MiB capture limit
    }

    @Test(arguments: [
        ("at the limit", 100, 100, true),
        ("over the limit", 100, 101, false),
        ("empty body", 0, 0, true),
    ])
    func bodyCaptureLimit(name: String, limit: Int, size: Int, kept: Bool) throws {
        let server = try TestHTTPServer(bodyCaptureLimit: limit)
        defer { server.stop() }
        let body = String(repeating: "x", count: size)
        _ = try TestHTTPCurl.run(["-s", "-o", "/dev/null", "-X", "POST", "--data-binary", body, server.url("/cap")])
        let record = try #require(server.requests.first)
        #expect((record.body != nil) == kept, "\(name)")
        #expect(record.bodySize == Int64(size))
    }

    @Test func clientVanishingMidBodyDoesNotHurtTheServer() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        do {
            let client = try RawClient(port: server.port)
            try client.send("PUT /gone HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
            client.close()
        }
        #expect(server.waitForRequests(count: 1))
        let record = try #require(server.requests.first)
        #expect(record.completed == false)
        #expect(record.bodySize == 10)
        #expect(try TestHTTPCurl.statusCode(server.url("/after")).code == 200)
    }

    @Test func rawPathAndHeadersAreRecordedAsSent() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        try client.send("GET /a%2Fb/../c?x=1%20 HTTP/1.1\r\nHost: x\r\nX-Thing: one\r\nx-thing:  two \r\nConnection: close\r\n\r\n")
        let response = client.receiveAll()
        #expect(response.hasPrefix("HTTP/1.1 200 OK\r\n"))
        #expect(response.contains("Connection: close\r\n"))
        let record = try #require(server.requests.first)
        #expect(record.path == "/a%2Fb/../c?x=1%20")
        #expect(record.headers.map(\.0) == ["Host", "X-Thing", "x-thing", "Connection"])
        #expect(record.header("x-thing") == "one, two")
        #expect(record.header("missing") == nil)
    }

    @Test func headSplitAcrossWritesAndPipelinedRequests() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let client = try RawClient(port: server.port)
        for piece in ["GET /p1 HTTP/1.1\r", "\nHost: x\r\n", "\r", "\n"] {
            try client.send(piece)
            usleep(20_000)
        }
        #expect(client.receive(until: "\"}").hasPrefix("HTTP/1.1 200 OK\r\n"))
        try client.send("POST /p2 HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /p3 HTTP/1.1\r\nConnection: close\r\n\r\n")
        let rest = client.receiveAll()
        #expect(rest.components(separatedBy: "HTTP/1.1 200 OK\r\n").count == 3)
        #expect(server.requests.map(\.path) == ["/p1", "/p2", "/p3"])
        #expect(server.requests.map(\.bodySize) == [0, 3, 0])
        #expect(server.connectionsAccepted == 1)
    }

    @Test func headRequestGetsNoBody() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/h", [.bytes(5000)])
        let result = try TestHTTPCurl.run(["-s", "-I", server.url("/h")])
        #expect(result.exitCode == 0)
        #expect(result.stdoutText.contains("Content-Length: 5000\r\n"))
        #expect(result.stdoutText.hasSuffix("\r\n\r\n"))
    }

    @Test func resetClearsScriptsRecordsAndCounters() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        server.script("/x", [.status(500)])
        _ = try TestHTTPCurl.statusCode(server.url("/x"))
        server.reset()
        #expect(server.requests.isEmpty)
        #expect(server.connectionsAccepted == 0)
        #expect(try TestHTTPCurl.statusCode(server.url("/x")).code == 200)
    }

    // MARK: - Built-in paths

    @Test(arguments: [
        ("status", "/status/418", 418),
        ("status 204", "/status/204", 204),
        ("delay", "/delay/10", 200),
        ("bytes", "/bytes/10", 200),
        ("redirect without following", "/redirect/2", 302),
        ("redirect end", "/redirect/0", 200),
        ("put", "/put/a/b", 201),
        ("bad status", "/status/abc", 400),
        ("default", "/anything/else", 200),
    ])
    func builtinStatus(name: String, path: String, expected: Int) throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        #expect(try TestHTTPCurl.statusCode(server.url(path)).code == expected, "\(name)")
    }

    @Test func builtinRetryAfter() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let result = try TestHTTPCurl.run(["-s", "-i", server.url("/status/503?retry_after=7")])
        #expect(result.stdoutText.hasPrefix("HTTP/1.1 503 Service Unavailable\r\n"))
        #expect(result.stdoutText.contains("Retry-After: 7\r\n"))
    }

    @Test func builtinSequenceCountsPerName() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        var codes: [Int] = []
        for path in [
            "/seq/a/503,503,200", "/seq/b/500,201", "/seq/a/503,503,200", "/seq/a/503,503,200", "/seq/a/503,503,200", "/seq/b/500,201",
        ] {
            codes.append(try TestHTTPCurl.statusCode(server.url(path)).code)
        }
        #expect(codes == [503, 500, 503, 200, 200, 201])
    }

    @Test func builtinRedirectChainIsFollowed() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let result = try TestHTTPCurl.run(["-s", "-L", "-o", "/dev/null", "-w", "%{http_code} %{num_redirects}", server.url("/redirect/3")])
        #expect(result.stdoutText == "200 3")
        #expect(server.requests.map(\.path) == ["/redirect/3", "/redirect/2", "/redirect/1", "/redirect/0"])
    }

    @Test func builtinRedirectToDecodesTheURL() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let result = try TestHTTPCurl.run([
            "-s", "-o", "/dev/null", "-w", "%{http_code} %{redirect_url}",
            server.url("/redirect-to?url=http%3A%2F%2Fexample.com%2Fx%3Fa%3D1"),
        ])
        #expect(result.stdoutText == "302 http://example.com/x?a=1")
    }

    @Test func builtinResetAndBytes() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        #expect(try TestHTTPCurl.run(["-s", "-o", "/dev/null", server.url("/reset")]).exitCode == 56)
        let bytes = try TestHTTPCurl.run(["-s", server.url("/bytes/100000")])
        #expect(bytes.exitCode == 0)
        #expect(bytes.stdoutBytes.count == 100_000)
        #expect(SHA256.hex(bytes.stdoutBytes) == TestResponse.patternSHA256(count: 100_000))
        #expect(Array(bytes.stdoutBytes.prefix(300)) == TestResponse.patternBytes(count: 300))
    }

    @Test func builtinEcho() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let result = try TestHTTPCurl.run([
            "-s", "-H", "X-Request-Id: r1", "-H", "Content-Type: text/plain", "--data-binary", "hi \"there\"", server.url("/echo?q=1"),
        ])
        let json = try jsonObject(result.stdoutBytes)
        #expect(json["method"] as? String == "POST")
        #expect(json["path"] as? String == "/echo?q=1")
        #expect(json["body"] as? String == "hi \"there\"")
        #expect(json["body_size"] as? Int == 10)
        #expect(json["body_sha256"] as? String == SHA256.hex(Array("hi \"there\"".utf8)))
        let headers = try #require(json["headers"] as? [String: String])
        #expect(headers["x-request-id"] == "r1")
        #expect(headers["content-type"] == "text/plain")
    }

    @Test func defaultResponseDescribesTheRequest() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let result = try TestHTTPCurl.run(["-s", "-i", "-X", "PATCH", "--data-binary", "12345", server.url("/v1/things?id=9")])
        #expect(result.stdoutText.hasPrefix("HTTP/1.1 200 OK\r\n"))
        #expect(result.stdoutText.contains("Content-Type: application/json\r\n"))
        let body = try #require(result.stdoutText.components(separatedBy: "\r\n\r\n").last)
        let json = try jsonObject(Array(body.utf8))
        #expect(json["method"] as? String == "PATCH")
        #expect(json["path"] as? String == "/v1/things?id=9")
        #expect(json["body_size"] as? Int == 5)
    }

    @Test func builtinStatsAndReset() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        _ = try TestHTTPCurl.run([
            "-s", "-o", "/dev/null", "-H", "Idempotency-Key: k1", "-H", "X-Request-Id: r1", "-H", "Authorization: secret", "-X", "PUT",
            "--data-binary", "abc", server.url("/put/p1"),
        ])
        _ = try TestHTTPCurl.run(["-s", "-o", "/dev/null", server.url("/other")])
        let stats = try jsonObject(try TestHTTPCurl.run(["-s", server.url("/_stats")]).stdoutBytes)
        #expect(stats["connections_accepted"] as? Int == 3)
        #expect(stats["count"] as? Int == 2)
        let requests = try #require(stats["requests"] as? [[String: Any]])
        #expect(requests.count == 2)
        let first = try #require(requests.first)
        #expect(first["method"] as? String == "PUT")
        #expect(first["path"] as? String == "/put/p1")
        #expect(first["body_size"] as? Int == 3)
        #expect(first["body_sha256"] as? String == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(first["connection_id"] as? Int == 1)
        let headers = try #require(first["headers"] as? [String: String])
        #expect(headers["idempotency-key"] == "k1")
        #expect(headers["x-request-id"] == "r1")
        #expect(headers["content-length"] == "3")
        #expect(headers["authorization"] == nil)

        let filtered = try jsonObject(try TestHTTPCurl.run(["-s", server.url("/_stats?prefix=/other")]).stdoutBytes)
        #expect(filtered["count"] as? Int == 1)

        _ = try TestHTTPCurl.run(["-s", "-o", "/dev/null", server.url("/_reset")])
        let after = try jsonObject(try TestHTTPCurl.run(["-s", server.url("/_stats")]).stdoutBytes)
        #expect(after["count"] as? Int == 0)
        #expect(server.requests.isEmpty)
    }

    // MARK: - Standalone process

    @Test func standaloneBinaryServesAndStopsOnSIGTERM() throws {
        let process = try TestHTTPServerProcess()
        #expect(process.port > 0)
        #expect(try TestHTTPCurl.statusCode(process.baseURL + "/seq/x/503,200").code == 503)
        #expect(try TestHTTPCurl.statusCode(process.baseURL + "/seq/x/503,200").code == 200)
        let stats = try jsonObject(try TestHTTPCurl.run(["-s", process.baseURL + "/_stats"]).stdoutBytes)
        #expect(stats["count"] as? Int == 2)
        #expect(process.stop() == 0)
    }

    @Test func standaloneRejectsUnknownArguments() throws {
        let result = try TestHTTPCurl.runExecutable(TestHTTPServerProcess.defaultExecutable(), ["--nope"])
        #expect(result.exitCode == 64)
        #expect(result.stderr.contains("unknown argument: --nope"))
    }
}

/// A blocking TCP client for what curl cannot do: pausing mid-request, half requests.
private final class RawClient {
    private var fd: Int32

    init(port: Int) throws {
        // Close-on-exec: a child another test starts with Foundation's Process meanwhile (the
        // sqlite3 lock holder, the Python HTTPS server) would keep the socket open after
        // `close()`, and the server would not see this client leave until that child ends.
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard result == 0 else { throw TestHTTPServerError(description: "connect failed") }
        // Generous: a read that times out fails its test, and a loaded machine is slow.
        var timeout = timeval(tv_sec: 60, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { close() }

    func send(_ text: String) throws {
        let bytes = Array(text.utf8)
        let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        guard n == bytes.count else { throw TestHTTPServerError(description: "short send") }
    }

    /// Reads until `marker` appears (or EOF/timeout).
    func receive(until marker: String) -> String {
        var received: [UInt8] = []
        var byte: UInt8 = 0
        while !String(decoding: received, as: UTF8.self).hasSuffix(marker) {
            guard recv(fd, &byte, 1, 0) == 1 else { break }
            received.append(byte)
        }
        return String(decoding: received, as: UTF8.self)
    }

    /// Whether bytes (or EOF) wait to be read now, without waiting for any.
    func hasBytesWaiting() -> Bool {
        var byte: UInt8 = 0
        return recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT)) >= 0
    }

    /// Reads until EOF (or error/timeout).
    func receiveAll() -> String {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            received += buffer[0..<n]
        }
        return String(decoding: received, as: UTF8.self)
    }

    func close() {
        if fd >= 0 {
            Glibc.close(fd)
            fd = -1
        }
    }
}
