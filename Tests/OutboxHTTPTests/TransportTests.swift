import Foundation
import Glibc
import Testing
import CCurl
@testable import OutboxHTTP

// MARK: - A loopback server (Python's http.server) started per test on port 0

/// Python server used by these tests: echoes what it received as JSON, and has routes for
/// statuses, redirects, big bodies, Retry-After and a stalled body.
private let serverScript = #"""
import base64, email.utils, hashlib, json, os, sys, threading, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
from urllib.parse import urlsplit, parse_qs

class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    connections = 0
    lock = threading.Lock()

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        with self.server.lock:
            self.server.connections += 1
            self.conn = self.server.connections

    def read_body(self):
        digest = hashlib.sha256()
        kept = bytearray()
        total = 0
        def take(data):
            nonlocal total
            digest.update(data)
            total += len(data)
            if len(kept) < (1 << 20):
                kept.extend(data[: (1 << 20) - len(kept)])
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                take(self.rfile.read(size))
                self.rfile.readline()
        else:
            left = int(self.headers.get("Content-Length") or 0)
            while left > 0:
                data = self.rfile.read(min(left, 1 << 18))
                if not data:
                    break
                take(data)
                left -= len(data)
        return total, digest.hexdigest(), bytes(kept)

    def reply(self, status, body=b"", headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_any(self):
        length, sha, kept = self.read_body()
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        path = url.path
        if path.startswith("/status/"):
            extra = [tuple(h.split(":", 1)) for h in query.get("header", [])]
            code = int(path.split("/")[2])
            return self.reply(code, b"" if code in (204, 304) else ("status %d" % code).encode(), extra)
        if path.startswith("/redirect/"):
            n = int(path.split("/")[2])
            if n > 0:
                return self.reply(302, b"moved", [("Location", "/redirect/%d" % (n - 1))])
        if path == "/redirect-to":
            return self.reply(int(query.get("code", ["302"])[0]), b"moved", [("Location", query["url"][0])])
        if path == "/loop":
            return self.reply(302, b"again", [("Location", "/loop")])
        if path == "/big":
            n = int(query["n"][0])
            return self.reply(200, bytes(i % 251 for i in range(n)))
        if path == "/retry-after":
            return self.reply(503, b"busy", [("Retry-After", query["v"][0])])
        if path == "/retry-after-date":
            when = email.utils.formatdate(time.time() + int(query["in"][0]), usegmt=True)
            return self.reply(429, b"slow down", [("Retry-After", when)])
        if path == "/stall":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"x" * 10)
            self.wfile.flush()
            for _ in range(300):
                time.sleep(0.1)
            return
        info = {
            "method": self.command,
            "path": self.path,
            "headers": [[k, v] for k, v in self.headers.items()],
            "length": length,
            "sha256": sha,
            "body_b64": base64.b64encode(kept).decode(),
            "conn": self.conn,
            "connections": self.server.connections,
        }
        self.reply(200, json.dumps(info).encode(), [("Content-Type", "application/json")])

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = handle_any

def exit_with_parent():
    # The test process holds our stdin: EOF means it is gone, so never outlive it.
    sys.stdin.buffer.read()
    os._exit(0)

threading.Thread(target=exit_with_parent, daemon=True).start()
server = Server(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""#

/// One Python server process on a loopback port, stopped by `stop()`.
private final class LoopbackServer: @unchecked Sendable {
    let process = Process()
    /// Our end of the server's stdin: closing it (or dying) makes the server exit.
    let input = Pipe()
    let port: Int
    var baseURL: String { "http://127.0.0.1:\(port)" }

    init(scratch: TempFolder) throws {
        let script = scratch.path + "/server.py"
        try serverScript.write(toFile: script, atomically: true, encoding: .utf8)
        let python = FileManager.default.isExecutableFile(atPath: "/usr/bin/python3")
            ? "/usr/bin/python3" : "/root/.pyenv/shims/python3"
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = [script]
        let out = Pipe()
        process.standardOutput = out
        process.standardInput = input
        try process.run()
        var line = Data()
        while !line.contains(0x0A) {
            let chunk = out.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            line.append(chunk)
        }
        guard let text = String(data: line, encoding: .utf8),
              let port = Int(text.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            process.terminate()
            throw TestFailure("the test server did not print its port")
        }
        self.port = port
    }

    func stop() {
        // SIGKILL, not SIGTERM: children of dispatch threads inherit a mask that blocks it.
        kill(process.processIdentifier, SIGKILL)
        try? input.fileHandleForWriting.close()
        process.waitUntilExit()
    }
}

private struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A fresh temp folder per test, removed by `remove()`.
private struct TempFolder {
    let path: String
    init() throws {
        var template = Array((NSTemporaryDirectory() + "/outbox-http-XXXXXX").utf8CString)
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw TestFailure("mkdtemp failed")
        }
        path = String(cString: made)
    }
    func remove() { try? FileManager.default.removeItem(atPath: path) }
    func file(_ name: String, _ bytes: [UInt8]) throws -> String {
        let file = path + "/" + name
        try Data(bytes).write(to: URL(fileURLWithPath: file))
        return file
    }
}

/// Runs `body` with a temp folder, a server and a client, and tears all three down.
private func withFixture(_ body: (LoopbackServer, HTTPClient, TempFolder) async throws -> Void) async throws {
    let folder = try TempFolder()
    defer { folder.remove() }
    let server = try LoopbackServer(scratch: folder)
    defer { server.stop() }
    let client = try HTTPClient()
    defer { client.shutdown() }
    try await body(server, client, folder)
}

private func send(_ client: HTTPClient, _ request: HTTPRequest,
                  progress: (@Sendable (Int64, Int64) -> Void)? = nil) async -> HTTPResult {
    await withCheckedContinuation { continuation in
        client.start(request, progress: progress) { continuation.resume(returning: $0) }
    }
}

/// What the echo route saw.
private struct Echo {
    var method: String
    var path: String
    var headers: [(String, String)]
    var length: Int
    var sha256: String
    var body: [UInt8]
    var conn: Int
    var connections: Int

    init(_ result: HTTPResult) throws {
        guard result.status == 200,
              let object = try JSONSerialization.jsonObject(with: Data(result.body)) as? [String: Any] else {
            throw TestFailure("not an echo: status \(String(describing: result.status)) \(String(describing: result.failure))")
        }
        method = object["method"] as? String ?? ""
        path = object["path"] as? String ?? ""
        headers = (object["headers"] as? [[String]] ?? []).map { ($0[0], $0[1]) }
        length = object["length"] as? Int ?? -1
        sha256 = object["sha256"] as? String ?? ""
        body = Array(Data(base64Encoded: object["body_b64"] as? String ?? "") ?? Data())
        conn = object["conn"] as? Int ?? -1
        connections = object["connections"] as? Int ?? -1
    }

    /// All values of a header, by case-insensitive name.
    func header(_ name: String) -> [String] {
        headers.filter { $0.0.lowercased() == name.lowercased() }.map(\.1)
    }
}

private func pattern(_ count: Int, seed: Int = 7) -> [UInt8] {
    (0..<count).map { UInt8(truncatingIfNeeded: ($0 &* 31 &+ seed) ^ ($0 >> 8)) }
}

private func residentBytes() -> Int {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
    for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
        let kb = line.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
        return kb * 1024
    }
    return 0
}

/// A loopback port nobody listens on: bound, then closed.
private func unusedPort() -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
    }
    _ = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    return Int(UInt16(bigEndian: address.sin_port))
}

private final class Recorder: @unchecked Sendable {
    private let lock = NSLock()
    private var values: [(Int64, Int64)] = []
    private var peakRSS = 0
    func add(_ sent: Int64, _ total: Int64) {
        let rss = residentBytes()
        lock.lock()
        values.append((sent, total))
        peakRSS = max(peakRSS, rss)
        lock.unlock()
    }
    var all: [(Int64, Int64)] { lock.lock(); defer { lock.unlock() }; return values }
    var peak: Int { lock.lock(); defer { lock.unlock() }; return peakRSS }
}

// MARK: - Requests on the wire

@Suite struct TransportRequestTests {
    struct MethodCase: CustomTestStringConvertible, Sendable {
        var name: String
        var method: String
        var body: [UInt8]?
        var testDescription: String { name }
    }

    @Test(arguments: [
        MethodCase(name: "GET without body", method: "GET", body: nil),
        MethodCase(name: "POST with bytes", method: "POST", body: pattern(3000)),
        MethodCase(name: "POST empty", method: "POST", body: nil),
        MethodCase(name: "PUT with bytes", method: "PUT", body: pattern(70_000)),
        MethodCase(name: "PUT empty", method: "PUT", body: nil),
        MethodCase(name: "PATCH with bytes", method: "PATCH", body: pattern(512)),
        MethodCase(name: "DELETE without body", method: "DELETE", body: nil),
        MethodCase(name: "DELETE with bytes", method: "DELETE", body: pattern(100)),
        MethodCase(name: "lowercase put", method: "put", body: pattern(10)),
    ])
    func methodAndBodyArrive(_ c: MethodCase) async throws {
        try await withFixture { server, client, _ in
            let request = HTTPRequest(url: server.baseURL + "/echo", method: c.method,
                                      body: c.body.map { .bytes($0) } ?? .none)
            let result = await send(client, request)
            #expect(result.failure == nil)
            let echo = try Echo(result)
            #expect(echo.method == c.method.uppercased())
            #expect(echo.length == (c.body?.count ?? 0))
            #expect(echo.body == (c.body ?? []))
            #expect(result.bytesSent == Int64(c.body?.count ?? 0))
            // POST=1 must not invent a form content type; an empty PUT/POST says length 0.
            #expect(echo.header("content-type").isEmpty)
            if c.body != nil || ["POST", "PUT"].contains(c.method.uppercased()) {
                #expect(echo.header("content-length") == ["\(c.body?.count ?? 0)"])
            }
        }
    }

    @Test func jsonBodyWithContentType() async throws {
        try await withFixture { server, client, _ in
            let json = Array(#"{"comment":"héllo","n":1}"#.utf8)
            let request = HTTPRequest(url: server.baseURL + "/echo", method: "POST",
                                      headers: [(name: "Content-Type", value: "application/json")], body: .bytes(json))
            let echo = try Echo(await send(client, request))
            #expect(echo.body == json)
            #expect(echo.header("content-type") == ["application/json"])
        }
    }

    @Test func headersSentAsGivenWithoutExpectContinue() async throws {
        try await withFixture { server, client, _ in
            let request = HTTPRequest(
                url: server.baseURL + "/echo", method: "PUT",
                headers: [(name: "X-Custom", value: "a b, c"), (name: "Idempotency-Key", value: "k-1"),
                          (name: "X-Empty", value: ""), (name: "Content-Type", value: "text/plain")],
                body: .bytes(pattern(2048)), userAgent: "outbox-test/1")
            let echo = try Echo(await send(client, request))
            #expect(echo.header("x-custom") == ["a b, c"])
            #expect(echo.header("idempotency-key") == ["k-1"])
            #expect(echo.header("x-empty") == [""])
            #expect(echo.header("content-type") == ["text/plain"])
            #expect(echo.header("user-agent") == ["outbox-test/1"])
            #expect(echo.header("expect").isEmpty)
            #expect(echo.length == 2048)
        }
    }

    @Test(arguments: [("CR LF in value", "X-A", "1\r\nX-Injected: 2"), ("colon in name", "X:A", "1"), ("empty name", "", "1")])
    func invalidHeaderFailsBeforeSending(_ label: String, _ name: String, _ value: String) async throws {
        try await withFixture { server, client, _ in
            let result = await send(client, HTTPRequest(url: server.baseURL + "/echo", method: "GET",
                                                        headers: [(name: name, value: value)]))
            #expect(result.status == nil, "\(label)")
            #expect(result.failure?.kind == .network)
            #expect(result.failure?.message.hasPrefix("invalid header") == true)
        }
    }

    @Test func fileBodyRangeIsStreamedExactly() async throws {
        try await withFixture { server, client, folder in
            let content = pattern(400_000, seed: 3)
            let path = try folder.file("payload.bin", content)
            for method in ["POST", "PUT", "PATCH"] {
                let request = HTTPRequest(url: server.baseURL + "/echo", method: method,
                                          body: .file(path: path, offset: 12_345, length: 300_000))
                let result = await send(client, request)
                let echo = try Echo(result)
                #expect(echo.method == method)
                #expect(echo.length == 300_000)
                #expect(echo.body == Array(content[12_345..<312_345]))
                #expect(result.bytesSent == 300_000)
            }
        }
    }

    @Test func fileBodyIsResentAfter307() async throws {
        // A 307 makes curl rewind the body: that needs the seek callback (T-curl1).
        try await withFixture { server, client, folder in
            let content = pattern(100_000, seed: 5)
            let path = try folder.file("payload.bin", content)
            let request = HTTPRequest(url: server.baseURL + "/redirect-to?code=307&url=/echo", method: "POST",
                                      body: .file(path: path, offset: 0, length: 100_000), followRedirects: 2)
            let result = await send(client, request)
            #expect(result.failure == nil)
            let echo = try Echo(result)
            #expect(echo.method == "POST")
            #expect(echo.body == content)
        }
    }

    @Test func missingFileFailsWithFileMessage() async throws {
        try await withFixture { server, client, folder in
            let missing = folder.path + "/nope.bin"
            let result = await send(client, HTTPRequest(url: server.baseURL + "/echo", method: "PUT",
                                                        body: .file(path: missing, offset: 0, length: 10)))
            #expect(result.status == nil)
            #expect(result.failure?.kind == .network)
            #expect(result.failure?.message.hasPrefix("file: cannot open \(missing)") == true)

            let short = try folder.file("short.bin", pattern(5))
            let tooShort = await send(client, HTTPRequest(url: server.baseURL + "/echo", method: "PUT",
                                                          body: .file(path: short, offset: 2, length: 10)))
            #expect(tooShort.failure?.kind == .network)
            #expect(tooShort.failure?.message.hasPrefix("file:") == true)

            let form = await send(client, HTTPRequest(url: server.baseURL + "/echo", method: "POST",
                                                      body: .form([FormField(name: "f", filePath: missing)])))
            #expect(form.failure?.message == "file: cannot read form file \(missing)")
        }
    }

    @Test func largeFileUploadKeepsMemoryFlat() async throws {
        try await withFixture { server, client, folder in
            // Sparse: 200 MiB of zeros without using the disk.
            let size: Int64 = 200 << 20
            let path = folder.path + "/big.bin"
            let fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
            #expect(ftruncate(fd, off_t(size)) == 0)
            close(fd)
            let before = residentBytes()
            let recorder = Recorder()
            let result = await send(client, HTTPRequest(url: server.baseURL + "/echo", method: "PUT",
                                                        body: .file(path: path, offset: 0, length: size),
                                                        maxResponseBytes: 4 << 20),
                                    progress: { recorder.add($0, $1) })
            let after = residentBytes()
            #expect(result.failure == nil)
            let echo = try Echo(result)
            #expect(echo.length == Int(size))
            #expect(echo.sha256 == "72abf2ca8f36943ebe2e49ca3a51d409ca5f0bfcffab6c9d25643c17c32889da")
            #expect(result.bytesSent == size)
            // A whole-file load would add 200 MiB; streaming adds at most curl's buffers.
            #expect(max(after, recorder.peak) - before < 48 << 20)
            let reports = recorder.all
            #expect(!reports.isEmpty)
            #expect(reports.last.map { $0.0 == size && $0.1 == size } == true)
            #expect(reports.allSatisfy { $0.1 == size })
            #expect(zip(reports, reports.dropFirst()).allSatisfy { $0.0 < $1.0 })
        }
    }

    @Test func multipartFormArrives() async throws {
        try await withFixture { server, client, folder in
            let fileBytes = Array("JPEGDATA-0123456789".utf8)
            let path = try folder.file("stored-name.bin", fileBytes)
            let request = HTTPRequest(
                url: server.baseURL + "/echo", method: "POST",
                // A caller Content-Type is dropped: curl writes the boundary.
                headers: [(name: "Content-Type", value: "multipart/form-data")],
                body: .form([FormField(name: "title", value: "hello world"),
                             FormField(name: "photo", filePath: path, filename: "photo.jpg", contentType: "image/jpeg")]))
            let result = await send(client, request)
            let echo = try Echo(result)
            let contentType = echo.header("content-type")
            #expect(contentType.count == 1)
            #expect(contentType.first?.hasPrefix("multipart/form-data; boundary=") == true)
            let text = String(decoding: echo.body, as: UTF8.self)
            #expect(text.contains("Content-Disposition: form-data; name=\"title\"\r\n\r\nhello world\r\n"))
            #expect(text.contains("Content-Disposition: form-data; name=\"photo\"; filename=\"photo.jpg\"\r\nContent-Type: image/jpeg\r\n\r\nJPEGDATA-0123456789\r\n"))
            #expect(echo.length == echo.body.count)
            #expect(result.bytesSent == Int64(echo.length))
        }
    }

    @Test func formWithPutUsesPut() async throws {
        try await withFixture { server, client, _ in
            let result = await send(client, HTTPRequest(url: server.baseURL + "/echo", method: "PUT",
                                                        body: .form([FormField(name: "a", value: "1")])))
            let echo = try Echo(result)
            #expect(echo.method == "PUT")
            #expect(String(decoding: echo.body, as: UTF8.self).contains("name=\"a\"\r\n\r\n1\r\n"))
        }
    }
}

// MARK: - Responses

@Suite struct TransportResponseTests {
    @Test(arguments: [200, 201, 204, 404, 409, 500, 503])
    func statusAndHeadersReturned(_ status: Int) async throws {
        try await withFixture { server, client, _ in
            let url = server.baseURL + "/status/\(status)?header=X-Thing:One&header=X-Thing:Two&header=ETag:%22abc%22"
            let result = await send(client, HTTPRequest(url: url, method: "GET"))
            #expect(result.failure == nil)
            #expect(result.status == status)
            #expect(result.header("x-thing") == "One, Two")
            #expect(result.header("ETag") == "\"abc\"")
            #expect(result.headers.allSatisfy { $0.name == $0.name.lowercased() })
            #expect(result.headers.filter { $0.name == "x-thing" }.count == 1)
            #expect(result.body == (status == 204 ? [] : Array("status \(status)".utf8)))
            #expect(result.retryAfterSeconds == nil)
            #expect(result.effectiveURL == url)
        }
    }

    @Test(arguments: [(100_000, 1000, true), (1000, 1000, false), (999, 1000, false), (5, 0, true)])
    func bodyIsCappedWithoutFailing(_ size: Int, _ cap: Int, _ truncated: Bool) async throws {
        try await withFixture { server, client, _ in
            let result = await send(client, HTTPRequest(url: server.baseURL + "/big?n=\(size)", method: "GET",
                                                        maxResponseBytes: cap))
            #expect(result.failure == nil)
            #expect(result.status == 200)
            #expect(result.bodyTruncated == truncated)
            #expect(result.body == (0..<min(size, cap)).map { UInt8($0 % 251) })
        }
    }

    @Test func retryAfterSecondsAndDate() async throws {
        try await withFixture { server, client, _ in
            let seconds = await send(client, HTTPRequest(url: server.baseURL + "/retry-after?v=7", method: "GET"))
            #expect(seconds.status == 503)
            #expect(seconds.retryAfterSeconds == 7)
            let zero = await send(client, HTTPRequest(url: server.baseURL + "/retry-after?v=0", method: "GET"))
            #expect(zero.retryAfterSeconds == 0)
            let date = await send(client, HTTPRequest(url: server.baseURL + "/retry-after-date?in=120", method: "GET"))
            #expect(date.status == 429)
            // An HTTP date is relative to now: allow for clock rounding and a slow machine.
            #expect((90...121).contains(date.retryAfterSeconds ?? -1))
        }
    }

    @Test func headRequestHasNoBody() async throws {
        try await withFixture { server, client, _ in
            let result = await send(client, HTTPRequest(url: server.baseURL + "/status/200", method: "HEAD"))
            #expect(result.failure == nil)
            #expect(result.status == 200)
            #expect(result.body.isEmpty)
            #expect(result.header("content-length") == "10")
        }
    }
}

// MARK: - Redirects and failures

@Suite struct TransportRedirectAndFailureTests {
    @Test func redirectNotFollowedReturnsThe3xx() async throws {
        try await withFixture { server, client, _ in
            let result = await send(client, HTTPRequest(url: server.baseURL + "/redirect/1", method: "GET"))
            #expect(result.failure == nil)
            #expect(result.status == 302)
            #expect(result.header("location") == "/redirect/0")
            #expect(result.body == Array("moved".utf8))
        }
    }

    @Test func redirectsFollowedUpToTheLimit() async throws {
        try await withFixture { server, client, _ in
            let result = await send(client, HTTPRequest(url: server.baseURL + "/redirect/3", method: "GET",
                                                        followRedirects: 3))
            #expect(result.failure == nil)
            #expect(result.status == 200)
            #expect(result.effectiveURL == server.baseURL + "/redirect/0")
            // Only the final response's headers (T-curl9).
            #expect(result.header("location") == nil)
            #expect(result.header("content-type") == "application/json")
            let echo = try Echo(result)
            #expect(echo.path == "/redirect/0")
        }
    }

    @Test(arguments: [
        ("loop", "/loop", 3),
        ("one too many", "/redirect/4", 3),
        ("ftp scheme", "/redirect-to?url=ftp://127.0.0.1/x", 3),
        ("file scheme", "/redirect-to?url=file:///etc/passwd", 3),
    ])
    func badRedirectsFailAsRedirect(_ label: String, _ path: String, _ limit: Int) async throws {
        try await withFixture { server, client, _ in
            let result = await send(client, HTTPRequest(url: server.baseURL + path, method: "GET", followRedirects: limit))
            #expect(result.failure?.kind == .redirect, "\(label): \(String(describing: result.failure))")
            #expect(result.failure?.message.isEmpty == false)
            #expect(!String(decoding: result.body, as: UTF8.self).contains("root:"))
        }
    }

    @Test func connectionRefusedIsNetwork() async throws {
        let client = try HTTPClient()
        defer { client.shutdown() }
        let result = await send(client, HTTPRequest(url: "http://127.0.0.1:\(unusedPort())/x", method: "POST",
                                                    body: .bytes([1, 2, 3])))
        #expect(result.status == nil)
        #expect(result.failure?.kind == .network)
        #expect(result.failure?.message.isEmpty == false)
    }

    @Test func schemeOtherThanHTTPIsRefused() async throws {
        let client = try HTTPClient()
        defer { client.shutdown() }
        let result = await send(client, HTTPRequest(url: "file:///etc/passwd", method: "GET"))
        #expect(result.status == nil)
        #expect(result.failure?.kind == .network)
        #expect(result.body.isEmpty)
    }

    @Test func stalledTransferTimesOut() async throws {
        try await withFixture { server, client, _ in
            let result = await send(client, HTTPRequest(url: server.baseURL + "/stall", method: "GET",
                                                        stallBelowBytesPerSecond: 100, stallForSeconds: 1))
            #expect(result.failure?.kind == .timeout)
            #expect(result.status == 200)
        }
    }

    @Test func tlsFailureIsTLS() async throws {
        // The plain-HTTP server cannot complete a TLS handshake.
        try await withFixture { server, client, _ in
            let result = await send(client, HTTPRequest(url: "https://127.0.0.1:\(server.port)/echo", method: "GET",
                                                        connectTimeoutMs: 5000, stallForSeconds: 5))
            #expect(result.failure?.kind == .tls)
            #expect(result.status == nil)
        }
    }
}

// MARK: - The multi loop

@Suite struct TransportLoopTests {
    @Test func sequentialRequestsReuseOneConnection() async throws {
        try await withFixture { server, client, _ in
            var connections: Set<Int> = []
            var last: Echo?
            for i in 0..<20 {
                let echo = try Echo(await send(client, HTTPRequest(url: server.baseURL + "/echo?i=\(i)", method: "GET")))
                connections.insert(echo.conn)
                last = echo
            }
            #expect(connections == [1])
            #expect(last?.connections == 1)
        }
    }

    @Test func fiftyConcurrentTransfersComplete() async throws {
        try await withFixture { server, client, _ in
            let paths = try await withThrowingTaskGroup(of: String.self) { group in
                for i in 0..<50 {
                    group.addTask {
                        let result = await send(client, HTTPRequest(url: server.baseURL + "/echo?i=\(i)", method: "POST",
                                                                    body: .bytes(pattern(1000 + i))))
                        let echo = try Echo(result)
                        guard echo.length == 1000 + i, echo.body == pattern(1000 + i) else {
                            throw TestFailure("body of \(i) differs")
                        }
                        return echo.path
                    }
                }
                var all: [String] = []
                for try await path in group { all.append(path) }
                return all
            }
            #expect(Set(paths) == Set((0..<50).map { "/echo?i=\($0)" }))
        }
    }

    @Test func cancelCompletesWithAborted() async throws {
        try await withFixture { server, client, _ in
            let result: HTTPResult = await withCheckedContinuation { continuation in
                let id = client.start(HTTPRequest(url: server.baseURL + "/stall", method: "GET")) {
                    continuation.resume(returning: $0)
                }
                // Once immediately, once mid-transfer: the second must be a no-op.
                DispatchQueue.global().asyncAfter(deadline: .now() + 0.3) {
                    client.cancel(id)
                    client.cancel(id)
                }
            }
            #expect(result.failure?.kind == .network)
            #expect(result.failure?.message == "aborted")
            // The client still works afterwards.
            let after = await send(client, HTTPRequest(url: server.baseURL + "/status/200", method: "GET"))
            #expect(after.status == 200)
        }
    }

    @Test func shutdownAbortsInFlightAndLaterStarts() async throws {
        let folder = try TempFolder()
        defer { folder.remove() }
        let server = try LoopbackServer(scratch: folder)
        defer { server.stop() }
        let client = try HTTPClient()
        let started = Recorder()
        let inFlight: HTTPResult = await withCheckedContinuation { continuation in
            client.start(HTTPRequest(url: server.baseURL + "/stall", method: "GET"),
                         progress: { started.add($0, $1) }) { continuation.resume(returning: $0) }
            DispatchQueue.global().asyncAfter(deadline: .now() + 0.3) { client.shutdown() }
        }
        #expect(inFlight.failure?.kind == .network)
        #expect(inFlight.failure?.message.hasPrefix("aborted") == true)
        let late = await send(client, HTTPRequest(url: server.baseURL + "/status/200", method: "GET"))
        #expect(late.failure?.message.hasPrefix("aborted") == true)
        client.shutdown()
    }

    @Test func curlIsLoadedAtRunTimeNotLinked() throws {
        #expect(HTTPClient.curlVersion.hasPrefix("libcurl/7."))
        // The test binary is linked like `outbox`: libcurl must not be a NEEDED entry.
        let readelf = Process()
        readelf.executableURL = URL(fileURLWithPath: "/usr/bin/readelf")
        readelf.arguments = ["-d", "/proc/self/exe"]
        let out = Pipe()
        readelf.standardOutput = out
        try readelf.run()
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        readelf.waitUntilExit()
        #expect(text.contains("(NEEDED)"))
        #expect(!text.contains("libcurl"))
    }
}

// MARK: - Pure parts

@Suite struct TransportPureTests {
    @Test func headerParserKeepsFinalResponseOnly() {
        var headers = ResponseHeaders()
        for line in ["HTTP/1.1 100 Continue\r\n", "\r\n",
                     "HTTP/1.1 302 Found\r\n", "Location: /x\r\n", "\r\n",
                     "HTTP/1.1 200 OK\r\n", "Content-Type: text/plain\r\n", "Set-Cookie: a=1\r\n",
                     "X-Long: one\r\n", " two\r\n", "set-cookie: b=2\r\n", "X-Space:   padded \t\r\n",
                     "Empty:\r\n", "no colon here\r\n", "\r\n"] {
            headers.consume(line)
        }
        #expect(headers.fields.map(\.name) == ["content-type", "set-cookie", "x-long", "x-space", "empty"])
        #expect(headers.value("set-cookie") == "a=1, b=2")
        #expect(headers.value("x-long") == "one two")
        #expect(headers.value("x-space") == "padded")
        #expect(headers.value("empty") == "")
        #expect(headers.value("location") == nil)
    }

    @Test(arguments: [
        ("timeout", CURLE_OPERATION_TIMEDOUT, false, HTTPFailureKind.timeout),
        ("refused", CURLE_COULDNT_CONNECT, false, .network),
        ("resolve", CURLE_COULDNT_RESOLVE_HOST, false, .network),
        ("nothing", CURLE_GOT_NOTHING, false, .network),
        ("partial", CURLE_PARTIAL_FILE, false, .network),
        ("recv", CURLE_RECV_ERROR, false, .network),
        ("read error", CURLE_READ_ERROR, false, .network),
        ("verify", CURLE_PEER_FAILED_VERIFICATION, false, .tls),
        ("handshake", CURLE_SSL_CONNECT_ERROR, false, .tls),
        ("bad CA file", CURLE_SSL_CACERT_BADFILE, false, .tls),
        ("too many redirects", CURLE_TOO_MANY_REDIRECTS, true, .redirect),
        ("scheme after redirect", CURLE_UNSUPPORTED_PROTOCOL, true, .redirect),
        ("scheme at first", CURLE_UNSUPPORTED_PROTOCOL, false, .network),
    ])
    func curlCodesMapToKinds(_ label: String, _ code: CURLcode, _ afterRedirect: Bool, _ kind: HTTPFailureKind) {
        #expect(CurlFailure.kind(of: code, afterRedirect: afterRedirect) == kind, "\(label)")
    }
}
