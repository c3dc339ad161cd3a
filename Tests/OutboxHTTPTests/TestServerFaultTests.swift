import Foundation
import Glibc
import Testing
import TestSupport

/// The fault routes of the test server, seen from curl or a raw socket.
struct TestServerFaultTests {
    /// Sends `request` on a new connection and reads until the server closes it or `limit`
    /// bytes arrived.
    private func exchange(_ server: TestHTTPServer, _ request: String, limit: Int = 4 << 20) throws -> [UInt8] {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        try #require(fd >= 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(server.port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        try #require(connected == 0)
        let bytes = Array(request.utf8)
        try #require(send(fd, bytes, bytes.count, Int32(MSG_NOSIGNAL)) == bytes.count)
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while received.count < limit {
            let n = recv(fd, &buffer, buffer.count, 0)
            if n <= 0 { break }
            received += buffer[0..<n]
        }
        return received
    }

    @Test(arguments: MalformedResponses.names)
    func aMalformedResponseIsSentByteForByteThenClosed(_ name: String) throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let answer = try exchange(server, "GET /malformed/\(name) HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(answer == MalformedResponses.bytes(name))
    }

    @Test func anUnknownMalformedNameIsABadRoute() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        #expect(try TestHTTPCurl.statusCode(server.url("/malformed/nope")).code == 400)
    }

    @Test func aStormAnswersItsCodeNTimesThen200() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let codes = try (0..<4).map { _ in try TestHTTPCurl.statusCode(server.url("/storm/a/2/503")).code }
        #expect(codes == [503, 503, 200, 200])
        #expect(try TestHTTPCurl.statusCode(server.url("/storm/b/1/429")).code == 429, "each name counts for itself")
        let headers = try TestHTTPCurl.run([
            "-s", "-D", "-", "-o", "/dev/null", server.url("/storm/c/1/429?retry_after=Sun%2C%2006%20Nov%201994%2008%3A49%3A37%20GMT"),
        ])
        #expect(headers.stdout.contains("Retry-After: Sun, 06 Nov 1994 08:49:37 GMT\r\n"))
    }

    @Test func firstAnswersAsTheRestOfThePathNTimesThen200() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let codes = try (0..<3).map { _ in try TestHTTPCurl.statusCode(server.url("/first/x/2/status/418")).code }
        #expect(codes == [418, 418, 200])
        #expect(try TestHTTPCurl.statusCode(server.url("/first/y/1/malformed/garbage")).exitCode != 0)
        #expect(try TestHTTPCurl.statusCode(server.url("/first/y/1/malformed/garbage")).code == 200)
    }

    @Test(arguments: ["", "-1", "abc", "99999999999999999999999", "a+b c"])
    func anyRetryAfterValuePassesThroughPercentEncoding(_ value: String) throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let encoded = value.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        let headers = try TestHTTPCurl.run(["-s", "-D", "-", "-o", "/dev/null", server.url("/status/429?retry_after=\(encoded)")])
        #expect(headers.stdout.contains("Retry-After: \(value)\r\n"), "\(headers.stdout)")
    }

    @Test func anEndlessBodyGoesOnUntilTheClientHangsUp() throws {
        let server = try TestHTTPServer()
        let answer = try exchange(server, "GET /endless?chunk=1000 HTTP/1.1\r\nHost: x\r\n\r\n", limit: 3 << 20)
        #expect(answer.count >= 3 << 20)
        let text = String(decoding: answer.prefix(300), as: UTF8.self)
        #expect(text.hasPrefix("HTTP/1.1 200 OK\r\n"))
        #expect(text.contains("Transfer-Encoding: chunked\r\n"))
        #expect(text.contains("\r\n\r\n3e8\r\n"))
        // The connection's thread ends once we hung up: stop() joins it.
        server.stop()
    }

    @Test func stallAfterHeadersSendsTheHeadersAndNoBody() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        // The headers must reach curl before it gives up: 3 s for a loaded machine to schedule
        // curl and the server's threads.
        let result = try TestHTTPCurl.run(["-s", "-D", "-", "-o", "/dev/null", "--max-time", "3", server.url("/stall-after-headers/500")])
        #expect(result.exitCode == 28, "curl gave up waiting for the body")
        #expect(result.stdout.hasPrefix("HTTP/1.1 200 OK\r\n"))
        #expect(result.stdout.contains("Content-Length: 500\r\n"))
    }

    @Test func resetMidRequestCutsTheBodyAtItsByteCount() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("fault-\(UUID().uuidString)")
        try Data(repeating: 1, count: 200_000).write(to: folder)
        defer { try? FileManager.default.removeItem(at: folder) }
        let result = try TestHTTPCurl.run([
            "-s", "-o", "/dev/null", "-H", "Expect:", "-T", folder.path, server.url("/reset-mid-request/1000"),
        ])
        #expect(result.exitCode != 0)
        let record = try #require(server.requests(path: "/reset-mid-request/").first)
        #expect(record.bodySize == 1000)
        #expect(!record.completed)
    }

    @Test(arguments: [300, 301, 302, 303, 304, 305, 307, 308, 399])
    func redirectToAnswersAnyRedirectCode(_ code: Int) throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let result = try TestHTTPCurl.run([
            "-s", "-D", "-", "-o", "/dev/null", server.url("/redirect-to?code=\(code)&url=gopher%3A%2F%2Fx%2F"),
        ])
        #expect(result.stdout.hasPrefix("HTTP/1.1 \(code) "))
        #expect(result.stdout.contains("Location: gopher://x/\r\n"))
        #expect(try TestHTTPCurl.statusCode(server.url("/redirect-to?code=200&url=%2Fx")).code == 400)
    }

    @Test func aTLSHandshakeOnThePlainPortIsReset() throws {
        let server = try TestHTTPServer()
        defer { server.stop() }
        let result = try TestHTTPCurl.statusCode("https://127.0.0.1:\(server.port)/x", ["-k"])
        #expect(result.exitCode == 35, "a TLS connect error")
        #expect(try TestHTTPCurl.statusCode(server.url("/status/204")).code == 204, "plain HTTP still works")
    }
}
