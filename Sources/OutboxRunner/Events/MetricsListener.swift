import Glibc
import OutboxModel

/// `run --metrics-listen`: answers `GET /metrics` on one address, on a thread of its own,
/// with what `render` returns at each request. It never touches the runner's state: `render`
/// reads the store through its own connection. Connections are served side by side (poll),
/// each given 5 s to send its request and 5 s to take the answer, and when `maxConnections`
/// are open the oldest one still sending its request makes room: a slow client cannot
/// keep a scrape out.
package final class MetricsListener: @unchecked Sendable {
    /// Where to listen: an IP address (never a name to resolve) and a port.
    package struct Address: Sendable, Equatable {
        package var host: String
        package var port: Int

        /// `PORT`, `:PORT`, `HOST:PORT` or `[V6]:PORT`. No host means 127.0.0.1. The host is
        /// `localhost` or an IP address; one that means every interface (0.0.0.0, ::) is
        /// refused: metrics leave the machine only through an address named on purpose.
        package static func parse(_ text: String) throws(OutboxError) -> Address {
            let shown = Units.quoted(text, limit: 60)
            var host = "127.0.0.1"
            var portText = text
            if text.hasPrefix("[") {
                guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else {
                    throw .usage("--metrics-listen: \(shown) is not [ADDRESS]:PORT")
                }
                host = String(text[text.index(after: text.startIndex)..<close])
                portText = String(text[text.index(close, offsetBy: 2)...])
            } else if let colon = text.lastIndex(of: ":") {
                if colon != text.startIndex { host = String(text[..<colon]) }
                portText = String(text[text.index(after: colon)...])
            }
            guard let port = Units.wholeNumber(portText, in: 0...65535) else {
                throw .usage("--metrics-listen: the port in \(shown) is not a number from 0 (any free port) to 65535")
            }
            if host == "localhost" { host = "127.0.0.1" }
            guard let family = Self.family(of: host) else {
                throw .usage("--metrics-listen: \(shown) does not name an IP address (a host name is not looked up; use 127.0.0.1 or ::1)")
            }
            let unspecified = family == AF_INET ? host == "0.0.0.0" : Self.isUnspecifiedV6(host)
            if unspecified {
                throw .usage(
                    "--metrics-listen: \(shown) listens on every interface; name the one address to listen on (metrics stay on loopback unless you do)"
                )
            }
            return Address(host: host, port: port)
        }

        static func family(of host: String) -> Int32? {
            var v4 = in_addr()
            if inet_pton(AF_INET, host, &v4) == 1 { return AF_INET }
            var v6 = in6_addr()
            if inet_pton(AF_INET6, host, &v6) == 1 { return AF_INET6 }
            return nil
        }

        static func isUnspecifiedV6(_ host: String) -> Bool {
            var v6 = in6_addr()
            guard inet_pton(AF_INET6, host, &v6) == 1 else { return false }
            return withUnsafeBytes(of: &v6) { $0.allSatisfy { $0 == 0 } }
        }
    }

    private let fd: Int32
    /// Where it listens, with the port the system chose for port 0.
    package let url: String
    private let render: @Sendable () -> (status: Int, body: String)
    private var thread: pthread_t?

    /// Binds and listens now (so a port in use is an error before the runner starts), and
    /// answers on a thread. E_RUNNING names an address another process holds.
    package init(address: Address, contentType: String, render: @escaping @Sendable () -> (status: Int, body: String)) throws(OutboxError) {
        self.render = render
        let family = Address.family(of: address.host) ?? AF_INET
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .storage("--metrics-listen: cannot open a socket: \(Paths.errnoMessage())") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let bound: Int32
        if family == AF_INET {
            var a = sockaddr_in()
            a.sin_family = sa_family_t(AF_INET)
            a.sin_port = in_port_t(UInt16(address.port).bigEndian)
            inet_pton(AF_INET, address.host, &a.sin_addr)
            bound = withUnsafePointer(to: &a) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
        } else {
            var a = sockaddr_in6()
            a.sin6_family = sa_family_t(AF_INET6)
            a.sin6_port = in_port_t(UInt16(address.port).bigEndian)
            inet_pton(AF_INET6, address.host, &a.sin6_addr)
            bound = withUnsafePointer(to: &a) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size)) }
            }
        }
        let where_ = address.host.contains(":") ? "[\(address.host)]:\(address.port)" : "\(address.host):\(address.port)"
        guard bound == 0, listen(fd, 64) == 0 else {
            let code = errno
            close(fd)
            if code == EADDRINUSE { throw .running("--metrics-listen: \(where_) is in use by another process") }
            throw .storage("--metrics-listen: cannot listen on \(where_): \(Paths.errnoMessage(code))")
        }
        // Polled: an accept after a client gave up must not block the thread.
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        self.fd = fd
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let port = withUnsafeMutablePointer(to: &storage) { pointer -> Int in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = getsockname(fd, $0, &length) }
            return pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { Int(UInt16(bigEndian: $0.pointee.sin_port)) }
        }
        url = "http://\(address.host.contains(":") ? "[\(address.host)]" : address.host):\(port)/metrics"
        let started = Threads.start(detached: false) { [self] in self.serve(contentType: contentType) }
        switch started {
        case let .success(t): thread = t
        case let .failure(e):
            close(fd)
            throw .storage("--metrics-listen: cannot start its thread: \(e)")
        }
    }

    /// Stops answering and waits for the thread to end.
    package func stop() {
        shutdown(fd, Int32(SHUT_RDWR))
        if let thread { pthread_join(thread, nil) }
        thread = nil
        close(fd)
    }

    package static let maxConnections = 32
    private static let phaseMs: Int64 = 5_000

    private struct Connection {
        var fd: Int32
        var deadline: Int64
        var head: [UInt8] = []
        /// The answer, once the request head is read; `sent` bytes of it are out.
        var answer: [UInt8]?
        var sent = 0
    }

    private func serve(contentType: String) {
        var connections: [Connection] = []
        defer { for c in connections { close(c.fd) } }
        var buffer = [UInt8](repeating: 0, count: 2048)
        while true {
            let now = Identifiers.monotonicMs()
            connections.removeAll { c in
                guard c.deadline <= now else { return false }
                close(c.fd)
                return true
            }
            var polled = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0)]
            for c in connections { polled.append(pollfd(fd: c.fd, events: Int16(c.answer == nil ? POLLIN : POLLOUT), revents: 0)) }
            let wait = connections.map(\.deadline).min().map { Int32(clamping: max(0, $0 - now)) } ?? -1
            let ready = poll(&polled, nfds_t(polled.count), wait)
            if ready < 0 {
                if errno == EINTR { continue }
                return
            }
            // Served first: an accepted connection is appended after the polled ones.
            var closed = Set<Int32>()
            for (i, p) in polled.enumerated().dropFirst() where p.revents != 0 {
                let index = i - 1
                if !step(&connections[index], revents: p.revents, buffer: &buffer, contentType: contentType) {
                    close(connections[index].fd)
                    closed.insert(connections[index].fd)
                }
            }
            connections.removeAll { closed.contains($0.fd) }
            if polled[0].revents & Int16(POLLIN) != 0 {
                let client = accept(fd, nil, nil)
                if client >= 0 {
                    _ = fcntl(client, F_SETFD, FD_CLOEXEC)
                    _ = fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK)
                }
                if client < 0 {
                    if errno == EINTR || errno == ECONNABORTED || errno == EAGAIN || errno == EMFILE || errno == ENFILE { continue }
                    return  // shut down by stop()
                }
                if connections.count >= Self.maxConnections {
                    let reading = connections.indices.filter { connections[$0].answer == nil }
                    let oldest = reading.min { connections[$0].deadline < connections[$1].deadline } ?? 0
                    close(connections[oldest].fd)
                    connections.remove(at: oldest)
                }
                connections.append(Connection(fd: client, deadline: Identifiers.monotonicMs() + Self.phaseMs))
            } else if polled[0].revents != 0 {
                return  // the listening socket was shut down by stop()
            }
        }
    }

    /// Reads what the client sent, or sends what is left of the answer; false once done with it.
    private func step(_ c: inout Connection, revents: Int16, buffer: inout [UInt8], contentType: String) -> Bool {
        if c.answer == nil {
            let n = buffer.withUnsafeMutableBytes { recv(c.fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && (errno == EAGAIN || errno == EINTR) { return true }
            guard n > 0 else { return false }
            c.head += buffer[0..<n]
            let complete =
                c.head.count >= 4 && c.head.indices.dropFirst(3).contains { c.head[$0 - 3...$0].elementsEqual([13, 10, 13, 10]) }
            guard complete || c.head.count >= 8192 else { return true }
            c.answer = answer(to: c.head, contentType: contentType)
            c.deadline = Identifiers.monotonicMs() + Self.phaseMs
        }
        guard let bytes = c.answer else { return true }
        let n = bytes.withUnsafeBytes { send(c.fd, $0.baseAddress! + c.sent, $0.count - c.sent, Int32(MSG_NOSIGNAL)) }
        if n < 0 && (errno == EAGAIN || errno == EINTR) { return true }
        guard n > 0 else { return false }
        c.sent += n
        return c.sent < bytes.count
    }

    /// The whole answer to one request head (8 KiB at most).
    private func answer(to head: [UInt8], contentType: String) -> [UInt8] {
        let line = String(decoding: head.prefix { $0 != 13 && $0 != 10 }, as: UTF8.self).split(separator: " ")
        let method = line.first.map(String.init) ?? ""
        let path = line.count > 1 ? String(line[1].split(separator: "?", maxSplits: 1).first ?? "") : ""
        let response: (status: Int, type: String, body: String)
        if method != "GET" && method != "HEAD" {
            response = (405, "text/plain; charset=utf-8", "only GET\n")
        } else if path == "/metrics" {
            let rendered = render()
            response = (rendered.status, rendered.status == 200 ? contentType : "text/plain; charset=utf-8", rendered.body)
        } else {
            response = (404, "text/plain; charset=utf-8", "outbox serves its metrics at /metrics\n")
        }
        let reason = [200: "OK", 404: "Not Found", 405: "Method Not Allowed"][response.status] ?? "Internal Server Error"
        let body = Array(response.body.utf8)
        var bytes = Array(
            "HTTP/1.1 \(response.status) \(reason)\r\nContent-Type: \(response.type)\r\nContent-Length: \(body.count)\r\nConnection: close\r\n\r\n"
                .utf8)
        if method != "HEAD" { bytes += body }
        return bytes
    }
}
