import CCurl
import Digest
import Foundation
import Glibc
import OutboxModel
import OutboxTestServer
import Testing
import TestSupport
@testable import OutboxHTTP

// Most tests run against the in-repo TestHTTPServer (in process, port 0), which records
// every request. It has no TLS, so the HTTPS tests use a small Python server instead.

// MARK: - Fixtures

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
    /// A sparse file of `size` zero bytes: large without using the disk.
    func sparseFile(_ name: String, size: Int64) -> String {
        let file = path + "/" + name
        let fd = open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
        _ = ftruncate(fd, off_t(size))
        close(fd)
        return file
    }
}

/// Runs `body` with a temp folder, a test server and a client, and tears all three down.
private func withFixture(_ body: (TestHTTPServer, HTTPClient, TempFolder) async throws -> Void) async throws {
    let folder = try TempFolder()
    defer { folder.remove() }
    let server = try TestHTTPServer(port: 0)
    defer { server.stop() }
    let client = try HTTPClient()
    defer { client.shutdown() }
    try await body(server, client, folder)
}

private func send(
    _ client: HTTPClient, _ request: HTTPRequest,
    progress: (@Sendable (Int64, Int64) -> Void)? = nil
) async -> HTTPResult {
    await withCheckedContinuation { continuation in
        client.start(request, progress: progress) { continuation.resume(returning: $0) }
    }
}

/// The one request the server recorded for `path` (exact path, query included).
private func recorded(_ server: TestHTTPServer, _ path: String) throws -> RecordedRequest {
    let matches = server.requests.filter { $0.path == path }
    guard matches.count == 1 else { throw TestFailure("\(matches.count) requests recorded for \(path)") }
    return matches[0]
}

/// All values of a header, in order, by case-insensitive name.
private func values(_ request: RecordedRequest, _ name: String) -> [String] {
    request.headers.filter { $0.0.lowercased() == name.lowercased() }.map(\.1)
}

private func pattern(_ count: Int, seed: Int = 7) -> [UInt8] {
    (0..<count).map { UInt8(truncatingIfNeeded: ($0 &* 31 &+ seed) ^ ($0 >> 8)) }
}

/// An HTTP date (RFC 9110 IMF-fixdate) `seconds` from now.
private func httpDate(secondsFromNow seconds: Int) -> String {
    var when = time(nil) + seconds
    var parts = tm()
    gmtime_r(&when, &parts)
    var buffer = [CChar](repeating: 0, count: 64)
    let count = strftime(&buffer, buffer.count, "%a, %d %b %Y %H:%M:%S GMT", &parts)
    return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// A loopback port nobody listens on: bound, then closed.
private func unusedPort() -> Int { freeLoopbackPort() ?? 9 }

/// Progress reports in the order they came (memory is measured on the runner process, whose
/// peak no other test shares: see FaultServerTests).
private final class Recorder: @unchecked Sendable {
    private let lock = NSLock()
    private var values: [(Int64, Int64)] = []
    func add(_ sent: Int64, _ total: Int64) {
        lock.lock()
        values.append((sent, total))
        lock.unlock()
    }
    var all: [(Int64, Int64)] { lock.lock(); defer { lock.unlock() }; return values }
}

// MARK: - HTTPS server (Python: the Swift test server has no TLS)

private let httpsScript = #"""
    import os, ssl, sys, threading
    from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *args):
            pass
        def handle_any(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            reply = ("%s %d" % (self.command, len(body))).encode() + body
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
        do_GET = do_POST = handle_any

    def exit_with_parent():
        # The test process holds our stdin: EOF means it is gone, so never outlive it.
        sys.stdin.buffer.read()
        os._exit(0)

    threading.Thread(target=exit_with_parent, daemon=True).start()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(sys.argv[1], sys.argv[2])
    if len(sys.argv) > 3:
        # Clients must show a certificate this file vouches for.
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(sys.argv[3])
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()
    """#

/// A Python HTTPS server with a fresh self-signed certificate for 127.0.0.1 only.
private final class HTTPSServer: @unchecked Sendable {
    let process = Process()
    /// Our end of the server's stdin: closing it (or dying) makes the server exit.
    let input = Pipe()
    let port: Int
    let certificate: String

    /// With `clientCA`, the server asks every client for a certificate signed by it.
    init(folder: TempFolder, clientCA: String? = nil) throws {
        certificate = folder.path + "/cert.pem"
        let key = folder.path + "/key.pem"
        try selfSignedCertificate(certificate, key: key, name: "outbox test", extra: ["-addext", "subjectAltName=IP:127.0.0.1"])

        let script = folder.path + "/https.py"
        try httpsScript.write(toFile: script, atomically: true, encoding: .utf8)
        let python =
            FileManager.default.isExecutableFile(atPath: "/usr/bin/python3")
            ? "/usr/bin/python3" : "/root/.pyenv/shims/python3"
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = [script, certificate, key] + (clientCA.map { [$0] } ?? [])
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
        guard let port = Int(String(decoding: line, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) else {
            kill(process.processIdentifier, SIGKILL)
            throw TestFailure("the HTTPS server did not print its port")
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

/// Writes a fresh self-signed EC certificate and its key (PEM) with openssl.
func selfSignedCertificate(_ certificate: String, key: String, name: String, extra: [String] = []) throws {
    let made = try runProcess(
        "/usr/bin/openssl",
        [
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", certificate, "-days", "2", "-subj", "/CN=\(name)",
        ] + extra)
    guard made.exitCode == 0 else { throw TestFailure("openssl req failed: \(made.stderr)") }
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
        MethodCase(name: "WebDAV MKCOL", method: "MKCOL", body: nil),
        MethodCase(name: "WebDAV COPY", method: "COPY", body: nil),
        MethodCase(name: "WebDAV MOVE", method: "MOVE", body: nil),
    ])
    func methodAndBodyArrive(_ c: MethodCase) async throws {
        try await withFixture { server, client, _ in
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/m"), method: c.method,
                    body: c.body.map { .bytes($0) } ?? .none))
            #expect(result.failure == nil)
            #expect(result.status == 200)
            let request = try recorded(server, "/m")
            #expect(request.method == c.method.uppercased())
            #expect(request.bodySize == Int64(c.body?.count ?? 0))
            #expect(request.body == (c.body ?? []))
            #expect(request.completed)
            #expect(result.bytesSent == Int64(c.body?.count ?? 0))
            // POST=1 must not invent a form content type; an empty PUT/POST says length 0.
            #expect(values(request, "content-type").isEmpty)
            if c.body != nil || ["POST", "PUT"].contains(c.method.uppercased()) {
                #expect(values(request, "content-length") == ["\(c.body?.count ?? 0)"])
            } else {
                #expect(values(request, "content-length").isEmpty)
            }
        }
    }

    @Test func jsonBodyWithContentType() async throws {
        try await withFixture { server, client, _ in
            let json = Array(#"{"comment":"héllo","n":1}"#.utf8)
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/notes"), method: "POST",
                    headers: [(name: "Content-Type", value: "application/json")],
                    body: .bytes(json)))
            #expect(result.status == 200)
            let request = try recorded(server, "/notes")
            #expect(request.body == json)
            #expect(values(request, "content-type") == ["application/json"])
        }
    }

    @Test func headersSentAsGivenWithoutExpectContinue() async throws {
        try await withFixture { server, client, _ in
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/h"), method: "PUT",
                    headers: [
                        (name: "X-Custom", value: "a b, c"), (name: "Idempotency-Key", value: "k-1"),
                        (name: "X-Empty", value: ""), (name: "Content-Type", value: "text/plain"),
                    ],
                    body: .bytes(pattern(2048)), userAgent: "outbox-test/1"))
            #expect(result.status == 200)
            let request = try recorded(server, "/h")
            #expect(values(request, "x-custom") == ["a b, c"])
            #expect(values(request, "idempotency-key") == ["k-1"])
            #expect(values(request, "x-empty") == [""])
            #expect(values(request, "content-type") == ["text/plain"])
            #expect(values(request, "user-agent") == ["outbox-test/1"])
            #expect(values(request, "expect").isEmpty)
            #expect(!request.expectedContinue)
            #expect(server.expectContinueCount == 0)
            #expect(request.bodySize == 2048)
        }
    }

    /// The client sends each request on a handle that an earlier one used (reset in between):
    /// nothing of the earlier request may reach the next, neither its method, body, headers,
    /// signature nor form, and a bare GET after each is sent bare.
    @Test func aHandleUsedAgainCarriesNothingOfTheRequestBefore() async throws {
        try await withFixture { server, client, folder in
            let path = try folder.file("first.bin", pattern(5000))
            var signed = HTTPRequest(
                url: server.url("/first-signed"), method: "PUT", headers: [(name: "X-First", value: "1")],
                body: .file(path: path, offset: 0, length: 5000), userAgent: "first/1")
            signed.awsSigV4 = AWSSigV4(provider: "aws:amz:us-east-1:s3", accessKeyID: "AKIDFIRST", secretAccessKey: "secret")
            let earlier: [(String, HTTPRequest)] = [
                ("signed PUT of a file", signed),
                (
                    "PUT of a small file, sent with the headers",
                    HTTPRequest(
                        url: server.url("/first-small"), method: "PUT", headers: [(name: "X-First", value: "0")],
                        body: .file(path: path, offset: 0, length: 5000), userAgent: "first/0")
                ),
                (
                    "form POST",
                    HTTPRequest(
                        url: server.url("/first-form"), method: "POST", headers: [(name: "X-First", value: "2")],
                        body: .form([FormField(name: "a", value: "1")]), userAgent: "first/2")
                ),
                (
                    "DELETE with a body",
                    HTTPRequest(
                        url: server.url("/first-delete"), method: "DELETE", headers: [(name: "Authorization", value: "Bearer t")],
                        body: .bytes(pattern(100)), userAgent: "first/3")
                ),
            ]
            for (i, (label, request)) in earlier.enumerated() {
                #expect(await send(client, request).status == 200, "\(label)")
                let bare = await send(client, HTTPRequest(url: server.url("/bare-\(i)"), method: "GET", userAgent: "bare/1"))
                #expect(bare.status == 200, "\(label)")
                let sent = try recorded(server, "/bare-\(i)")
                #expect(sent.method == "GET", "\(label)")
                #expect(sent.bodySize == 0 && values(sent, "content-length").isEmpty, "\(label)")
                #expect(values(sent, "user-agent") == ["bare/1"], "\(label)")
                for name in ["x-first", "authorization", "x-amz-date", "x-amz-content-sha256", "content-type", "expect"] {
                    #expect(values(sent, name).isEmpty, "\(label): \(name) was sent again")
                }
            }
        }
    }

    @Test(arguments: [("CR LF in value", "X-A", "1\r\nX-Injected: 2"), ("colon in name", "X:A", "1"), ("empty name", "", "1")])
    func invalidHeaderFailsBeforeSending(_ label: String, _ name: String, _ value: String) async throws {
        try await withFixture { server, client, _ in
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/x"), method: "GET",
                    headers: [(name: name, value: value)]))
            #expect(result.status == nil, "\(label)")
            #expect(result.failure?.kind == .network)
            #expect(result.failure?.message.hasPrefix("invalid header") == true)
            #expect(server.requests.isEmpty)
        }
    }

    @Test func fileBodyRangeIsStreamedExactly() async throws {
        try await withFixture { server, client, folder in
            let content = pattern(400_000, seed: 3)
            let path = try folder.file("payload.bin", content)
            for method in ["POST", "PUT", "PATCH"] {
                let result = await send(
                    client,
                    HTTPRequest(
                        url: server.url("/f/\(method)"), method: method,
                        body: .file(path: path, offset: 12_345, length: 300_000)))
                #expect(result.status == 200)
                let request = try recorded(server, "/f/\(method)")
                #expect(request.method == method)
                #expect(request.bodySize == 300_000)
                #expect(request.body == Array(content[12_345..<312_345]))
                #expect(result.bytesSent == 300_000)
            }
        }
    }

    @Test func fileBodyIsResentAfter307() async throws {
        // A 307 makes curl rewind the body: that needs the seek callback.
        try await withFixture { server, client, folder in
            server.script("/old", [TestResponse(status: 307, headers: [("Location", "/new")])])
            let content = pattern(100_000, seed: 5)
            let path = try folder.file("payload.bin", content)
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/old"), method: "POST",
                    body: .file(path: path, offset: 0, length: 100_000),
                    followRedirects: 2))
            #expect(result.failure == nil)
            #expect(result.status == 200)
            let request = try recorded(server, "/new")
            #expect(request.method == "POST")
            #expect(request.body == content)
        }
    }

    /// libcurl's byte counters start over with each request of a redirect; the stall check
    /// counts on from what the first request moved. Here the 307 trickles in at ~1.2 KB/s
    /// for 4 s, then the re-sent body waits 1.5 s for its answer: a check that compared
    /// the second request's counter with the first one's would call that a stall. The limit,
    /// 256 B/s over 4 s, leaves the trickle and the wait wide margins on a loaded machine.
    @Test func aRedirectDoesNotLookLikeAStall() async throws {
        try await withFixture { server, client, folder in
            server.script(
                "/old",
                [
                    TestResponse(
                        status: 307, headers: [("Location", "/new")],
                        action: .slowBody(bytesPerChunk: 300, intervalMs: 250), bodySize: 4800)
                ])
            server.script("/new", [.delay(1500, 200)])
            let path = try folder.file("payload.bin", pattern(1 << 20, seed: 9))
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/old"), method: "PUT",
                    body: .file(path: path, offset: 0, length: 1 << 20),
                    followRedirects: 1, stallBelowBytesPerSecond: 256,
                    stallForMs: 4000))
            #expect(result.failure == nil, "\(result.failure?.message ?? "")")
            #expect(result.status == 200)
            #expect(try recorded(server, "/new").bodySize == 1 << 20)
        }
    }

    /// A request that names the file it expects (a file referenced at enqueue) is checked
    /// as the file is opened: a different size, mtime or inode, or no file, fails with
    /// `.file` and sends nothing; the same file is sent.
    @Test func anExpectedFileIsCheckedWhenTheTransferStarts() async throws {
        try await withFixture { server, client, folder in
            let path = try folder.file("ref.bin", pattern(1000))
            var info = stat()
            #expect(stat(path, &info) == 0)
            let identity = FileIdentity(
                path: path, size: Int64(info.st_size),
                mtimeNs: Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec),
                inode: UInt64(info.st_ino))
            func put(_ expected: FileIdentity, path: String) async -> HTTPResult {
                var request = HTTPRequest(url: server.url("/x"), method: "PUT", body: .file(path: path, offset: 0, length: 1000))
                request.expectedFile = expected
                return await send(client, request)
            }
            var bigger = identity
            bigger.size += 1
            let changed = await put(bigger, path: path)
            #expect(changed.failure?.kind == .file)
            #expect(changed.failure?.message == "the referenced file \(path) changed since enqueue (size, mtime or inode differ)")
            var otherInode = identity
            otherInode.inode &+= 1
            #expect(await put(otherInode, path: path).failure?.kind == .file)
            let missing = await put(identity, path: folder.path + "/gone.bin")
            #expect(missing.failure?.kind == .file)
            #expect(missing.failure?.message == "the referenced file \(folder.path)/gone.bin is missing")
            #expect(server.requests.isEmpty)
            let same = await put(identity, path: path)
            #expect(same.failure == nil)
            #expect(same.status == 200)
            #expect(server.requests.count == 1)
        }
    }

    @Test func missingFileFailsWithFileMessage() async throws {
        try await withFixture { server, client, folder in
            let missing = folder.path + "/nope.bin"
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/x"), method: "PUT",
                    body: .file(path: missing, offset: 0, length: 10)))
            #expect(result.status == nil)
            #expect(result.failure?.kind == .network)
            #expect(result.failure?.message.hasPrefix("file: cannot open \(missing)") == true)

            let short = try folder.file("short.bin", pattern(5))
            let tooShort = await send(
                client,
                HTTPRequest(
                    url: server.url("/x"), method: "PUT",
                    body: .file(path: short, offset: 2, length: 10)))
            // The bytes enqueued are gone: an error of the entry (kind file), not a network retry.
            #expect(tooShort.failure?.kind == .file)
            #expect(tooShort.failure?.message == "file: \(short) has 5 bytes, needs 12")

            // A staged body is never read through a link put in its place.
            let elsewhere = try folder.file("elsewhere.bin", pattern(12))
            let link = folder.path + "/link.bin"
            #expect(symlink(elsewhere, link) == 0)
            let linked = await send(
                client, HTTPRequest(url: server.url("/x"), method: "PUT", body: .file(path: link, offset: 0, length: 12)))
            #expect(linked.failure?.kind == .file)
            #expect(linked.failure?.message == "file: the staged body \(link) was replaced by a symbolic link")

            let form = await send(
                client,
                HTTPRequest(
                    url: server.url("/x"), method: "POST",
                    body: .form([FormField(name: "f", filePath: missing)])))
            #expect(form.failure?.message == "file: cannot read form file \(missing)")
            #expect(server.requests.isEmpty)
        }
    }

    // A named pipe where the body file was (swapped in after the runner's own check) must
    // not block the transfer thread in open(2), waiting for a writer that never comes.
    @Test func aFIFOInPlaceOfTheBodyFileFailsWithoutBlocking() async throws {
        try await withFixture { server, client, folder in
            let fifo = folder.path + "/swapped.bin"
            #expect(mkfifo(fifo, 0o600) == 0)
            let result = await send(
                client, HTTPRequest(url: server.url("/x"), method: "PUT", body: .file(path: fifo, offset: 0, length: 10)))
            #expect(result.status == nil)
            #expect(result.failure?.kind == .file)
            #expect(result.failure?.message == "file: \(fifo) is not a regular file")
            #expect(server.requests.isEmpty)
        }
    }

    @Test func fileThatShrinksDuringUploadFailsAsFile() async throws {
        try await withFixture { server, client, folder in
            let path = folder.sparseFile("shrinks.bin", size: 64 << 20)
            let fd = open(path, O_WRONLY | O_CLOEXEC)
            defer { close(fd) }
            // The first progress report comes before the first read: cut the file there.
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/x"), method: "PUT",
                    body: .file(path: path, offset: 0, length: 64 << 20)),
                progress: { _, _ in _ = ftruncate(fd, 1000) })
            #expect(result.failure?.kind == .file)
            #expect(result.failure?.message == "file: \(path) shrank while it was being sent")
        }
    }

    /// A file body up to 64 KiB is read whole at setup and handed to libcurl with the headers
    /// (one write, not a write for the headers and another from the read callback); a larger
    /// one, a signed one and a GET's are read as they are sent. Either way the server gets the
    /// bytes of the range, any method keeps its verb, and the bytes sent and the last progress
    /// report count the body.
    @Test(arguments: [
        ("PUT", Int64(1), false), ("PUT", 4096, false), ("POST", 65_536, false), ("PATCH", 65_537, false),
        ("PUT", 4096, true), ("GET", 4096, false),
    ])
    func aSmallFileGoesWithTheHeaders(_ method: String, _ length: Int64, _ signs: Bool) async throws {
        try await withFixture { server, client, folder in
            let bytes = pattern(Int(length) + 100)
            let path = try folder.file("f.bin", bytes)
            var request = HTTPRequest(url: server.url("/f"), method: method, body: .file(path: path, offset: 100, length: length))
            if signs {
                request.awsSigV4 = AWSSigV4(provider: "aws:amz:us-east-1:s3", accessKeyID: "AKID", secretAccessKey: "secret")
            }
            let transfer = try Transfer(id: 1, request: request, progress: nil, completion: { _ in })
            #expect((transfer.fileBytes != nil) == (length <= 65_536 && !signs && method != "GET"))
            #expect(transfer.fileBytes.map { Array($0) } == (transfer.fileBytes == nil ? nil : Array(bytes[100...])))
            transfer.close()

            let recorder = Recorder()
            let result = await send(client, request, progress: { recorder.add($0, $1) })
            #expect(result.failure == nil)
            #expect(result.status == 200)
            let sent = try recorded(server, "/f")
            #expect(sent.method == method)
            #expect(sent.bodySize == length)
            #expect(sent.bodySHA256 == SHA256.hex(Array(bytes[100...])))
            #expect(values(sent, "content-length") == ["\(length)"])
            #expect(values(sent, "content-type").isEmpty)
            #expect(result.bytesSent == length)
            #expect(recorder.all.last.map { $0.0 == length && $0.1 == length } == true)
        }
    }

    /// A small file read whole at setup is still the file checked after the transfer: a file
    /// rewritten meanwhile shows in `bodyFileAtEnd`, which the runner compares with the
    /// identity taken at enqueue. (Started and waited for without the task pool, which the
    /// suite's blocking tests can keep busy on a loaded machine.)
    @Test func aSmallFileReadAtSetupIsCheckedAgainAtTheEnd() throws {
        let folder = try TempFolder()
        defer { folder.remove() }
        try withStandbyFixture { server, client, results in
            let path = try folder.file("f.bin", pattern(4096))
            let before = try #require(FileInfo.stat(path))
            let request = HTTPRequest(
                url: server.url("/hold/f/status/200"), method: "PUT", body: .file(path: path, offset: 0, length: 4096))
            client.start(request, host: "h", slot: true) { results.record("put", $0) }
            #expect(server.waitForHeld("f"))
            try Data(pattern(4097, seed: 9)).write(to: URL(fileURLWithPath: path))
            server.release("f")
            #expect(results.wait(for: ["put"]))
            let end = try #require(results["put"]?.bodyFileAtEnd)
            #expect(end.size == 4097)
            #expect(end.inode == before.inode)
        }
    }

    @Test func largeFileUploadArrivesWholeWithRisingProgress() async throws {
        try await withFixture { server, client, folder in
            let size: Int64 = 200 << 20
            let path = folder.sparseFile("big.bin", size: size)
            let recorder = Recorder()
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/big"), method: "PUT",
                    body: .file(path: path, offset: 0, length: size)),
                progress: { recorder.add($0, $1) })
            #expect(result.failure == nil)
            #expect(result.status == 200)
            let request = try recorded(server, "/big")
            #expect(request.bodySize == size)
            // SHA-256 of 200 MiB of zeros.
            #expect(request.bodySHA256 == "72abf2ca8f36943ebe2e49ca3a51d409ca5f0bfcffab6c9d25643c17c32889da")
            #expect(result.bytesSent == size)
            let reports = recorder.all
            #expect(!reports.isEmpty)
            #expect(reports.last.map { $0.0 == size && $0.1 == size } == true)
            #expect(reports.allSatisfy { $0.1 == size })
            #expect(zip(reports, reports.dropFirst()).allSatisfy { $0.0 < $1.0 })
        }
    }

    @Test func multipartFormArrives() async throws {
        try await withFixture { server, client, folder in
            let path = try folder.file("stored-name.bin", Array("JPEGDATA-0123456789".utf8))
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/form"), method: "POST",
                    // A caller Content-Type is dropped: curl writes the boundary.
                    headers: [(name: "Content-Type", value: "multipart/form-data")],
                    body: .form([
                        FormField(name: "title", value: "hello world"),
                        FormField(name: "photo", filePath: path, filename: "photo.jpg", contentType: "image/jpeg"),
                        FormField(name: "raw", filePath: path),
                    ])))
            #expect(result.status == 200)
            let request = try recorded(server, "/form")
            let contentType = values(request, "content-type")
            #expect(contentType.count == 1)
            #expect(contentType.first?.hasPrefix("multipart/form-data; boundary=") == true)
            let text = request.bodyText ?? ""
            #expect(text.contains("Content-Disposition: form-data; name=\"title\"\r\n\r\nhello world\r\n"))
            #expect(
                text.contains(
                    "Content-Disposition: form-data; name=\"photo\"; filename=\"photo.jpg\"\r\nContent-Type: image/jpeg\r\n\r\nJPEGDATA-0123456789\r\n"
                ))
            // Without a filename, the file's own name is sent.
            #expect(text.contains("name=\"raw\"; filename=\"stored-name.bin\""))
            #expect(request.bodySize == Int64(request.body?.count ?? -1))
            #expect(result.bytesSent == request.bodySize)
        }
    }

    @Test func formWithPutUsesPut() async throws {
        try await withFixture { server, client, _ in
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/form"), method: "PUT",
                    body: .form([FormField(name: "a", value: "1")])))
            #expect(result.status == 200)
            let request = try recorded(server, "/form")
            #expect(request.method == "PUT")
            #expect(request.bodyText?.contains("name=\"a\"\r\n\r\n1\r\n") == true)
        }
    }

    @Test func dotSegmentsAreSentAsIs() async throws {
        try await withFixture { server, client, _ in
            let result = await send(client, HTTPRequest(url: server.url("/a/../b/./c"), method: "GET"))
            #expect(result.status == 200)
            #expect(server.requests.map(\.path) == ["/a/../b/./c"])
        }
    }
}

// MARK: - Responses

@Suite struct TransportResponseTests {
    @Test(arguments: [200, 201, 204, 404, 409, 500, 503])
    func statusAndHeadersReturned(_ status: Int) async throws {
        try await withFixture { server, client, _ in
            let body = status == 204 ? "" : "status \(status)"
            server.script(
                "/s",
                [
                    .status(
                        status, body: body,
                        headers: [("X-Thing", "One"), ("X-Thing", "Two"), ("ETag", "\"abc\"")])
                ])
            let result = await send(client, HTTPRequest(url: server.url("/s"), method: "GET"))
            #expect(result.failure == nil)
            #expect(result.status == status)
            #expect(result.header("x-thing") == "One, Two")
            #expect(result.header("ETag") == "\"abc\"")
            #expect(result.headers.allSatisfy { $0.name == $0.name.lowercased() })
            #expect(result.headers.filter { $0.name == "x-thing" }.count == 1)
            #expect(result.body == Array(body.utf8))
            #expect(!result.bodyTruncated)
            #expect(result.retryAfterSeconds == nil)
            #expect(result.effectiveURL == server.url("/s"))
        }
    }

    @Test(arguments: [(100_000, 1000, true), (1000, 1000, false), (999, 1000, false), (5, 0, true)])
    func bodyIsCappedWithoutFailing(_ size: Int, _ cap: Int, _ truncated: Bool) async throws {
        try await withFixture { server, client, _ in
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/bytes/\(size)"), method: "GET",
                    maxResponseBytes: cap))
            #expect(result.failure == nil)
            #expect(result.status == 200)
            #expect(result.bodyTruncated == truncated)
            #expect(result.body == TestResponse.patternBytes(count: min(size, cap)))
        }
    }

    @Test func retryAfterSecondsAndDate() async throws {
        try await withFixture { server, client, _ in
            let seconds = await send(client, HTTPRequest(url: server.url("/status/503?retry_after=7"), method: "GET"))
            #expect(seconds.status == 503)
            #expect(seconds.retryAfterSeconds == 7)
            let zero = await send(client, HTTPRequest(url: server.url("/status/429?retry_after=0"), method: "GET"))
            #expect(zero.retryAfterSeconds == 0)
            let scripted = time(nil)
            server.script("/date", [.status(429, headers: [("Retry-After", httpDate(secondsFromNow: 120))])])
            let date = await send(client, HTTPRequest(url: server.url("/date"), method: "GET"))
            let answered = time(nil)
            #expect(date.status == 429)
            // An HTTP date is relative to now: 120 s less the time the exchange took, give or
            // take a second of rounding.
            let earliest = Int64(120 - (answered - scripted) - 1)
            #expect((earliest...121).contains(date.retryAfterSeconds ?? -1))
            // And the date itself, for the runner to count from when it settles.
            #expect((Int64(scripted + 120) * 1000...Int64(answered + 120) * 1000).contains(date.retryAfterDate ?? -1))
            #expect(seconds.retryAfterDate == nil)
        }
    }

    /// An invalid Retry-After is ignored (nil: the entry's backoff applies), never read as 0.
    @Test(arguments: ["abc", "-1", "1.5", "", "Sun, 99 Foo 1994 08:49:37 GMT"])
    func anInvalidRetryAfterIsIgnored(_ value: String) async throws {
        try await withFixture { server, client, _ in
            server.script("/bad", [.status(503, headers: [("Retry-After", value)])])
            let result = await send(client, HTTPRequest(url: server.url("/bad"), method: "GET"))
            #expect(result.status == 503)
            #expect(result.retryAfterSeconds == nil)
        }
    }

    @Test func aRetryAfterBeyond64BitsIsAVeryLongWait() async throws {
        try await withFixture { server, client, _ in
            server.script("/huge", [.status(503, headers: [("Retry-After", "99999999999999999999999")])])
            let result = await send(client, HTTPRequest(url: server.url("/huge"), method: "GET"))
            #expect(result.retryAfterSeconds == Int64.max)
        }
    }

    @Test func headRequestHasNoBody() async throws {
        try await withFixture { server, client, _ in
            server.script("/head", [.status(200, body: "0123456789")])
            let result = await send(client, HTTPRequest(url: server.url("/head"), method: "HEAD"))
            #expect(result.failure == nil)
            #expect(result.status == 200)
            #expect(result.body.isEmpty)
            #expect(result.header("content-length") == "10")
            let request = try recorded(server, "/head")
            #expect(request.method == "HEAD")
        }
    }
}

// MARK: - Redirects and failures

@Suite struct TransportRedirectAndFailureTests {
    @Test func redirectNotFollowedReturnsThe3xx() async throws {
        try await withFixture { server, client, _ in
            let result = await send(client, HTTPRequest(url: server.url("/redirect/1"), method: "GET"))
            #expect(result.failure == nil)
            #expect(result.status == 302)
            #expect(result.header("location") == "/redirect/0")
            #expect(server.requests.map(\.path) == ["/redirect/1"])
        }
    }

    /// `http_code` is the final status: neither an interim 100 nor the 3xx of a redirect
    /// followed to a request that failed.
    @Test func noFinalResponseIsNoStatus() async throws {
        try await withFixture { server, client, _ in
            server.script("/interim", [.raw("HTTP/1.1 100 Continue\r\n\r\n")])
            let interim = await send(client, HTTPRequest(url: server.url("/interim"), method: "GET"))
            #expect(interim.failure != nil)
            #expect(interim.status == nil, "\(interim.status.map(String.init) ?? "nil")")
            // https to this plain-HTTP server: the followed request gets no response.
            let tls = server.url("/status/200").replacingOccurrences(of: "http://", with: "https://")
            let target = tls.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
            let redirected = await send(
                client, HTTPRequest(url: server.url("/redirect-to?code=307&url=\(target)"), method: "GET", followRedirects: 3))
            #expect(redirected.failure != nil)
            #expect(redirected.failure?.kind != .redirect, "\(redirected.failure.map { "\($0)" } ?? "")")
            #expect(redirected.status == nil, "\(redirected.status.map(String.init) ?? "nil")")
            #expect(server.requests.map(\.path).contains { $0.hasPrefix("/redirect-to") })
        }
    }

    @Test func redirectsFollowedUpToTheLimit() async throws {
        try await withFixture { server, client, _ in
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/redirect/3"), method: "GET",
                    followRedirects: 3))
            #expect(result.failure == nil)
            #expect(result.status == 200)
            #expect(result.effectiveURL == server.url("/redirect/0"))
            // Only the final response's headers, not the redirect's.
            #expect(result.header("location") == nil)
            #expect(result.header("content-type") == "application/json")
            #expect(server.requests.map(\.path) == ["/redirect/3", "/redirect/2", "/redirect/1", "/redirect/0"])
        }
    }

    @Test(arguments: [
        ("loop", "/loop"),
        ("one too many", "/redirect/4"),
        ("ftp scheme", "/redirect-to?url=ftp%3A%2F%2F127.0.0.1%2Fx"),
        ("file scheme", "/redirect-to?url=file%3A%2F%2F%2Fetc%2Fpasswd"),
    ])
    func badRedirectsFailAsRedirect(_ label: String, _ path: String) async throws {
        try await withFixture { server, client, _ in
            server.script("/loop", [TestResponse(status: 302, headers: [("Location", "/loop")])])
            let result = await send(client, HTTPRequest(url: server.url(path), method: "GET", followRedirects: 3))
            #expect(result.failure?.kind == .redirect, "\(label): \(String(describing: result.failure))")
            #expect(result.failure?.message.isEmpty == false)
            #expect(!String(decoding: result.body, as: UTF8.self).contains("root:"))
        }
    }

    /// A 301/302/303 would make libcurl re-send a PUT or a POST as a GET without its body:
    /// not followed unless the request allows the method change; 307/308 keep method and body.
    @Test(
        arguments: [
            (301, "PUT", false, false), (302, "POST", false, false), (303, "PATCH", false, false), (303, "DELETE", false, false),
            (303, "POST", true, true), (301, "POST", true, true), (302, "GET", false, true), (307, "PUT", false, true),
            (308, "POST", false, true),
            // libcurl would re-send these verbs as themselves without the body: never followed.
            (303, "PUT", true, false), (302, "PATCH", true, false), (301, "DELETE", true, false),
            // Not redirects with one target: never followed, whatever the method.
            (300, "GET", false, false), (304, "GET", false, false), (305, "POST", true, false), (399, "GET", false, false),
        ] as [(Int, String, Bool, Bool)])
    func aRedirectThatWouldDropTheBodyIsNotFollowed(status: Int, method: String, allowed: Bool, follows: Bool) async throws {
        try await withFixture { server, client, _ in
            server.script("/moved", [TestResponse(status: status, headers: [("Location", "/new")])])
            server.script("/new", [.status(201)])
            var request = HTTPRequest(
                url: server.url("/moved"), method: method, body: method == "GET" ? .none : .bytes(Array("body".utf8)), followRedirects: 3)
            request.redirectMethodChange = allowed
            let result = await send(client, request)
            if follows {
                #expect(result.failure == nil, "\(String(describing: result.failure))")
                #expect(result.status == 201)
                #expect(server.requests.map(\.path) == ["/moved", "/new"])
                if status >= 307 { #expect(server.requests.last?.method == method && server.requests.last?.bodyText == "body") }
                if status < 307 && method != "GET" { #expect(server.requests.last?.method == "GET" && server.requests.last?.bodySize == 0) }
            } else {
                #expect(result.failure?.kind == .redirect, "\(String(describing: result.failure))")
                #expect(result.failure?.message.contains("not followed") == true)
                #expect(result.status == status)
                #expect(server.requests.map(\.path) == ["/moved"], "the body was never re-sent as a GET")
                // The way out it names is one that exists: only a POST may change its method.
                let advice = result.failure?.message.contains("redirect_method_change: true allows it") == true
                #expect(advice == (status <= 303 && status != 300 && method == "POST" && !allowed), "\(result.failure?.message ?? "")")
            }
        }
    }

    /// Credential headers never follow a redirect to another origin (scheme, host or port),
    /// as curl does not send them there either: the redirect is not followed at all. Without
    /// them, or to the same origin, it is.
    @Test(arguments: [
        ("Authorization", "host", false), ("Cookie", "host", false), ("X-Api-Key", "host", false), ("X-Plain", "host", true),
        ("Authorization", "scheme", false), ("Authorization", "port", false), ("Authorization", "same", true),
    ])
    func credentialsNeverFollowARedirectToAnotherOrigin(header: String, change: String, follows: Bool) async throws {
        try await withFixture { server, client, _ in
            let url = server.url("/new")
            let target =
                switch change {
                // "localhost" is this machine too, but another host as far as the request goes.
                case "host": url.replacingOccurrences(of: "127.0.0.1", with: "localhost")
                // The same host and port over TLS: an upgrade, but not where the header was written for.
                case "scheme": url.replacingOccurrences(of: "http://", with: "https://")
                case "port": url.replacingOccurrences(of: ":\(server.port)/", with: ":\(server.port == 65535 ? 1 : server.port + 1)/")
                default: "/new"
                }
            #expect(target != url || change == "same")
            server.script("/moved", [TestResponse(status: 307, headers: [("Location", target)])])
            server.script("/new", [.status(201)])
            var request = HTTPRequest(
                url: server.url("/moved"), method: "GET", headers: [(name: header, value: "secret")], followRedirects: 3)
            request.credentialHeaders.insert("x-api-key")
            let result = await send(client, request)
            if follows {
                #expect(result.status == 201, "\(String(describing: result.failure))")
            } else {
                #expect(result.failure?.kind == .redirect)
                #expect(result.failure?.message.contains("to another origin") == true, "\(String(describing: result.failure))")
                #expect(server.requests.map(\.path) == ["/moved"])
            }
        }
    }

    @Test func connectionRefusedIsNetwork() async throws {
        let client = try HTTPClient()
        defer { client.shutdown() }
        let result = await send(
            client,
            HTTPRequest(
                url: "http://127.0.0.1:\(unusedPort())/x", method: "POST",
                body: .bytes([1, 2, 3])))
        #expect(result.status == nil)
        #expect(result.failure?.kind == .network)
        #expect(result.failure?.message.isEmpty == false)
    }

    @Test func resetBeforeResponseIsNetwork() async throws {
        try await withFixture { server, client, _ in
            let result = await send(client, HTTPRequest(url: server.url("/reset"), method: "GET"))
            #expect(result.status == nil)
            #expect(result.failure?.kind == .network)
        }
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
            // 10 bytes every 5 s is far below 100 B/s. The stall is counted from the request,
            // so the answer's head must come before it is declared (status 200): 3 s, not 1 s,
            // for the server's threads to be scheduled on a loaded machine.
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/slow/100000?chunk=10&interval_ms=5000"),
                    method: "GET", stallBelowBytesPerSecond: 100, stallForMs: 3000))
            #expect(result.failure?.kind == .timeout)
            #expect(result.status == 200)
        }
    }

    @Test func silentServerTimesOut() async throws {
        try await withFixture { server, client, _ in
            let result = await send(
                client,
                HTTPRequest(
                    url: server.url("/stall"), method: "GET",
                    stallBelowBytesPerSecond: 100, stallForMs: 1000))
            #expect(result.failure?.kind == .timeout)
            #expect(result.status == nil)
        }
    }

    @Test func httpsWithTrustedCAFileSucceeds() async throws {
        let folder = try TempFolder()
        defer { folder.remove() }
        let server = try HTTPSServer(folder: folder)
        defer { server.stop() }
        let client = try HTTPClient()
        defer { client.shutdown() }
        let url = "https://127.0.0.1:\(server.port)/x"

        let trusted = await send(
            client,
            HTTPRequest(
                url: url, method: "POST", body: .bytes(Array("abc".utf8)),
                caFile: server.certificate))
        #expect(trusted.failure == nil)
        #expect(trusted.status == 200)
        #expect(trusted.body == Array("POST 3abc".utf8))

        // Verification is always on: the system store does not know this certificate...
        let untrusted = await send(client, HTTPRequest(url: url, method: "GET"))
        #expect(untrusted.failure?.kind == .tls)
        #expect(untrusted.status == nil)
        // ...and the host name must match the certificate (VERIFYHOST=2).
        let wrongName = await send(
            client,
            HTTPRequest(
                url: "https://localhost:\(server.port)/x", method: "GET",
                caFile: server.certificate))
        #expect(wrongName.failure?.kind == .tls)
    }

    @Test func aServerThatAsksForAClientCertificateGetsTheConfiguredOne() async throws {
        let folder = try TempFolder()
        defer { folder.remove() }
        let clientCert = folder.path + "/client.pem"
        let clientKey = folder.path + "/client-key.pem"
        try selfSignedCertificate(clientCert, key: clientKey, name: "outbox client")
        let server = try HTTPSServer(folder: folder, clientCA: clientCert)
        defer { server.stop() }
        let client = try HTTPClient()
        defer { client.shutdown() }
        var request = HTTPRequest(
            url: "https://127.0.0.1:\(server.port)/x", method: "POST", body: .bytes(Array("abc".utf8)), caFile: server.certificate)

        // Without a certificate the server ends the handshake: no HTTP answer.
        let refused = await send(client, request)
        #expect(refused.status == nil)
        #expect(refused.failure != nil)

        (request.clientCert, request.clientKey) = (clientCert, clientKey)
        let accepted = await send(client, request)
        #expect(accepted.failure == nil)
        #expect(accepted.status == 200)
        #expect(accepted.body == Array("POST 3abc".utf8))

        // A key file that is not there fails the attempt, nothing is sent (a new client: the
        // connection made above would be reused as it is).
        request.clientKey = folder.path + "/missing.pem"
        let fresh = try HTTPClient()
        defer { fresh.shutdown() }
        let missing = await send(fresh, request)
        #expect(missing.status == nil)
        #expect(missing.failure?.kind == .tls)

        // A key encrypted with a passphrase fails the attempt too: no passphrase is asked for
        // (OpenSSL would read it from the terminal or stdin, holding the curl thread).
        let encrypted = folder.path + "/encrypted-key.pem"
        let made = try runProcess(
            "/usr/bin/openssl", ["pkey", "-in", clientKey, "-out", encrypted, "-aes256", "-passout", "pass:secret"])
        #expect(made.exitCode == 0, "\(made.stderr)")
        request.clientKey = encrypted
        let another = try HTTPClient()
        defer { another.shutdown() }
        let refusedKey = await send(another, request)
        #expect(refusedKey.status == nil)
        #expect(refusedKey.failure?.kind == .tls, "\(String(describing: refusedKey.failure))")
    }
}

// MARK: - The multi loop

@Suite struct TransportLoopTests {
    @Test func sequentialRequestsReuseOneConnection() async throws {
        try await withFixture { server, client, _ in
            var spans: [(start: ContinuousClock.Instant, end: ContinuousClock.Instant)] = []
            for i in 0..<20 {
                let start = ContinuousClock.now
                let result = await send(
                    client,
                    HTTPRequest(
                        url: server.url("/seq?i=\(i)"), method: i % 2 == 0 ? "GET" : "POST",
                        body: i % 2 == 0 ? .none : .bytes(pattern(100))))
                spans.append((start, .now))
                #expect(result.status == 200)
            }
            // libcurl closes a connection idle for 118 s: only where a run starved of CPU may
            // have left it that long between two requests may a new one open.
            let mayHaveAged = (1..<spans.count).filter { spans[$0].end - spans[$0 - 1].start > .seconds(110) }.count
            #expect(server.requests.count == 20)
            #expect((1...(1 + mayHaveAged)).contains(server.connectionsAccepted))
            #expect(Set(server.requests.map(\.connectionID)).count == server.connectionsAccepted)
        }
    }

    @Test func fiftyConcurrentTransfersComplete() async throws {
        try await withFixture { server, client, _ in
            let statuses = await withTaskGroup(of: Int?.self) { group in
                for i in 0..<50 {
                    group.addTask {
                        await send(
                            client,
                            HTTPRequest(
                                url: server.url("/c/\(i)"), method: "POST",
                                body: .bytes(pattern(1000 + i)))
                        ).status
                    }
                }
                var all: [Int?] = []
                for await status in group { all.append(status) }
                return all
            }
            #expect(statuses.count == 50)
            #expect(statuses.allSatisfy { $0 == 200 })
            let requests = server.requests
            #expect(Set(requests.map(\.path)) == Set((0..<50).map { "/c/\($0)" }))
            for request in requests {
                let i = Int(request.path.dropFirst(3))!
                #expect(request.body == pattern(1000 + i))
            }
        }
    }

    @Test func cancelCompletesWithAborted() async throws {
        try await withFixture { server, client, _ in
            let result: HTTPResult = await withCheckedContinuation { continuation in
                let id = client.start(HTTPRequest(url: server.url("/stall"), method: "GET")) {
                    continuation.resume(returning: $0)
                }
                DispatchQueue.global().async {
                    // Once the server has the request, cancel twice: the second is a no-op.
                    server.waitForRequests(count: 1)
                    client.cancel(id)
                    client.cancel(id)
                }
            }
            #expect(result.failure?.kind == .aborted)
            #expect(result.status == nil)
            // The client still works afterwards.
            let after = await send(client, HTTPRequest(url: server.url("/status/200"), method: "GET"))
            #expect(after.status == 200)
        }
    }

    @Test func cancelBeforeItStarts() async throws {
        try await withFixture { server, client, _ in
            let result: HTTPResult = await withCheckedContinuation { continuation in
                let id = client.start(HTTPRequest(url: server.url("/stall"), method: "GET")) {
                    continuation.resume(returning: $0)
                }
                client.cancel(id)
            }
            #expect(result.failure?.kind == .aborted)
            #expect(result.status == nil)
        }
    }

    @Test func shutdownAbortsInFlightAndLaterStarts() async throws {
        let server = try TestHTTPServer(port: 0)
        defer { server.stop() }
        let client = try HTTPClient()
        let inFlight: HTTPResult = await withCheckedContinuation { continuation in
            client.start(HTTPRequest(url: server.url("/stall"), method: "GET")) { continuation.resume(returning: $0) }
            DispatchQueue.global().async {
                server.waitForRequests(count: 1)
                client.shutdown()
            }
        }
        #expect(inFlight.failure == TransportFailure(.aborted, "the HTTP client was shut down"))
        let late = await send(client, HTTPRequest(url: server.url("/status/200"), method: "GET"))
        #expect(late.failure == TransportFailure(.aborted, "the HTTP client was shut down"))
        client.shutdown()
        #expect(server.requests.count == 1)
    }

    @Test func curlIsLoadedAtRunTimeNotLinked() throws {
        #expect(HTTPClient.curlVersion.hasPrefix("libcurl/7."))
        // The test binary links OutboxHTTP like `outbox` does: libcurl must not be NEEDED.
        let text = try runProcess("/usr/bin/readelf", ["-d", "/proc/self/exe"]).stdout
        #expect(text.contains("(NEEDED)"))
        #expect(!text.contains("libcurl"))
    }
}

// MARK: - Pure parts

@Suite struct TransportPureTests {
    @Test func headerParserKeepsFinalResponseOnly() {
        var headers = ResponseHeaders()
        for line in [
            "HTTP/1.1 100 Continue\r\n", "\r\n",
            "HTTP/1.1 302 Found\r\n", "Location: /x\r\n", "\r\n",
            "HTTP/1.1 200 OK\r\n", "Content-Type: text/plain\r\n", "Set-Cookie: a=1\r\n",
            "X-Long: one\r\n", " two\r\n", "set-cookie: b=2\r\n", "X-Space:   padded \t\r\n",
            "Empty:\r\n", "no colon here\r\n", "\r\n",
        ] {
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
        ("timeout", CURLE_OPERATION_TIMEDOUT, false, TransportFailure.Kind.timeout),
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
        ("bad Location", CURLE_URL_MALFORMAT, true, .redirect),
        ("bad URL at first", CURLE_URL_MALFORMAT, false, .network),
    ])
    func curlCodesMapToKinds(_ label: String, _ code: CURLcode, _ afterRedirect: Bool, _ kind: TransportFailure.Kind) {
        #expect(CurlFailure.kind(of: code, afterRedirect: afterRedirect) == kind, "\(label)")
    }
}

// MARK: - Standby transfers

/// Collects results by transfer id, for tests that start several transfers at once.
private final class Results: @unchecked Sendable {
    private let lock = NSLock()
    private var byID: [String: HTTPResult] = [:]
    func record(_ name: String, _ result: HTTPResult) { lock.lock(); byID[name] = result; lock.unlock() }
    subscript(_ name: String) -> HTTPResult? { lock.lock(); defer { lock.unlock() }; return byID[name] }
    func wait(for names: [String], timeoutMs: Int = 60_000) -> Bool {
        for _ in 0..<(timeoutMs / 10) {
            if names.allSatisfy({ self[$0] != nil }) { return true }
            usleep(10_000)
        }
        return false
    }
}

/// Runs `body` with a test server, a client with `perHost`, and a result collector.
private func withStandbyFixture(perHost: Int = .max, _ body: (TestHTTPServer, HTTPClient, Results) throws -> Void) throws {
    let server = try TestHTTPServer(port: 0)
    defer { server.stop() }
    let client = try HTTPClient(perHost: perHost)
    defer { client.shutdown() }
    try body(server, client, Results())
}

@Suite struct StandbyTransferTests {
    @Test func standbyStartsInTheSlotOfTheTransferThatEnds() throws {
        try withStandbyFixture { server, client, results in
            server.script("/slow", [.hold("slow")])
            client.start(HTTPRequest(url: server.url("/slow"), method: "GET"), host: "h", slot: true) { results.record("a", $0) }
            let b = client.start(HTTPRequest(url: server.url("/next"), method: "GET"), host: "h", slot: true, standby: true) {
                results.record("b", $0)
            }
            #expect(server.waitForHeld("slow"))
            // While the slot is held, the standby transfer is not sent. (The pause only gives a
            // wrong start time to show; a slow machine can make this miss one, never fail.)
            usleep(100_000)
            #expect(server.requests(path: "/next").isEmpty)
            server.release("slow")
            #expect(results.wait(for: ["a", "b"]))
            #expect(results["a"]?.startedInPlace == b)
            #expect(results["b"]?.status == 200)
            #expect(server.requests.map(\.path) == ["/slow", "/next"])
        }
    }

    @Test func promoteStartsAStandbyTransferAtOnce() throws {
        try withStandbyFixture { server, client, results in
            let id = client.start(HTTPRequest(url: server.url("/p"), method: "GET"), host: "h", slot: true, standby: true) {
                results.record("p", $0)
            }
            // Not sent before the promotion. (The pause only gives a wrong start time to
            // show; a slow machine can make this miss one, never fail.)
            usleep(100_000)
            #expect(server.requests.isEmpty)
            client.promote(id)
            client.promote(id)  // a second promotion is ignored
            #expect(results.wait(for: ["p"]))
            #expect(results["p"]?.status == 200)
            #expect(server.requests.count == 1)
        }
    }

    @Test func cancelledStandbyIsNeverSent() throws {
        try withStandbyFixture { server, client, results in
            let id = client.start(
                HTTPRequest(url: server.url("/never"), method: "POST", body: .bytes(pattern(10))), host: "h",
                slot: true, standby: true
            ) { results.record("n", $0) }
            client.cancel(id)
            #expect(results.wait(for: ["n"]))
            #expect(results["n"]?.failure?.kind == .aborted)
            #expect(results["n"]?.startedInPlace == nil)
            // A slot transfer ending later starts nothing in its place.
            client.start(HTTPRequest(url: server.url("/after"), method: "GET"), host: "h", slot: true) { results.record("after", $0) }
            #expect(results.wait(for: ["after"]))
            #expect(results["after"]?.startedInPlace == nil)
            #expect(server.requests.map(\.path) == ["/after"])
        }
    }

    @Test func withdrawnStandbyThatHasNotStartedIsNeverSent() throws {
        try withStandbyFixture { server, client, results in
            let id = client.start(HTTPRequest(url: server.url("/never"), method: "GET"), host: "h", slot: true, standby: true) {
                results.record("n", $0)
            }
            client.withdraw(id)
            #expect(results.wait(for: ["n"]))
            #expect(results["n"]?.failure?.kind == .aborted)
            client.start(HTTPRequest(url: server.url("/after"), method: "GET"), host: "h", slot: true) { results.record("after", $0) }
            #expect(results.wait(for: ["after"]))
            #expect(server.requests.map(\.path) == ["/after"])
        }
    }

    // The curl thread starts a standby transfer in a freed slot while the runner decides to
    // withdraw it (a pause): that transfer may be on the wire, so it is left to finish and
    // report. Aborting it sent the request and then queued its entry again: sent twice.
    @Test func withdrawalOfAStandbyThatStartedLeavesItToFinish() throws {
        try withStandbyFixture { server, client, results in
            server.script("/slow", [.hold("slow")])
            server.script("/next", [.hold("next")])
            client.start(HTTPRequest(url: server.url("/slow"), method: "GET"), host: "h", slot: true) { results.record("a", $0) }
            let b = client.start(HTTPRequest(url: server.url("/next"), method: "GET"), host: "h", slot: true, standby: true) {
                results.record("b", $0)
            }
            #expect(server.waitForHeld("slow"))
            server.release("slow")
            // b starts in a's slot; the server holds it, so it is on the wire when withdrawn.
            #expect(server.waitForHeld("next"))
            #expect(results.wait(for: ["a"]))
            #expect(results["a"]?.startedInPlace == b)
            client.withdraw(b)
            // The curl thread reads requests in order: once this one is done, it has seen the withdrawal.
            client.start(HTTPRequest(url: server.url("/marker"), method: "GET")) { results.record("marker", $0) }
            #expect(results.wait(for: ["marker"]))
            #expect(results["b"] == nil, "b was ended by its withdrawal: \(String(describing: results["b"]))")
            server.release("next")
            #expect(results.wait(for: ["b"]))
            #expect(results["b"]?.status == 200)
            #expect(server.requests(path: "/next").count == 1)
        }
    }

    @Test func standbyWaitsWhileItsHostIsAtPerHost() throws {
        try withStandbyFixture(perHost: 1) { server, client, results in
            // /long holds host h until /short has ended, however long that takes.
            server.script("/long", [.hold("long")])
            // A part-like transfer (no slot) holds host h; a slot transfer to host g ends first.
            client.start(HTTPRequest(url: server.url("/long"), method: "GET"), host: "h") { results.record("long", $0) }
            client.start(HTTPRequest(url: server.url("/short"), method: "GET"), host: "g", slot: true) { results.record("short", $0) }
            let waiting = client.start(HTTPRequest(url: server.url("/h2"), method: "GET"), host: "h", slot: true, standby: true) {
                results.record("h2", $0)
            }
            #expect(results.wait(for: ["short"]))
            // Host h is full, so the freed slot is not used for it.
            #expect(results["short"]?.startedInPlace == nil)
            #expect(server.requests(path: "/h2").isEmpty)
            server.release("long")
            #expect(results.wait(for: ["long"]))
            #expect(results["long"]?.startedInPlace == nil)  // not a slot transfer
            client.promote(waiting)
            #expect(results.wait(for: ["h2"]))
            #expect(results["h2"]?.status == 200)
        }
    }
}
