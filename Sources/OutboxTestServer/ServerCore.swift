import Glibc
import OutboxModel
import Digest
import Synchronization

/// Owns the listener and the threads; kept apart from `TestHTTPServer` so that threads
/// never retain the package object and its `deinit` can stop everything.
final class ServerCore: Sendable {
    let state: Locked<ServerState>
    let port: Int
    let logRequests: Bool
    let hashBodies: Bool
    private let listenFD: Int32

    /// Connections the kernel has accepted that the server has not taken yet (TCP_INFO's
    /// unacked count is a listening socket's accept queue), so a test can wait until every
    /// connection a dead client opened has been read.
    var pendingAccepts: Int {
        var info = tcp_info()
        var length = socklen_t(MemoryLayout<tcp_info>.size)
        guard getsockopt(listenFD, Int32(IPPROTO_TCP), TCP_INFO, &info, &length) == 0 else { return 0 }
        return Int(info.tcpi_unacked)
    }
    /// Written once by `stop()` and never drained: every wait polls it to end early.
    let wakeRead: Int32
    private let wakeWrite: Int32

    init(host: String, port: Int, bodyCaptureLimit: Int, hashBodies: Bool, logRequests: Bool) throws {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(truncatingIfNeeded: port).bigEndian)
        guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else {
            throw TestHTTPServerError(description: "not an IPv4 address: \(host)")
        }
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { throw TestHTTPServerError(description: "socket: \(errnoText())") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(fd, 128) == 0 else {
            let text = errnoText()
            close(fd)
            throw TestHTTPServerError(description: "bind/listen \(host):\(port): \(text)")
        }
        var actual = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        var pipeFDs: [Int32] = [-1, -1]
        guard gnuPipe2(&pipeFDs, O_CLOEXEC) == 0 else {
            close(fd)
            throw TestHTTPServerError(description: "pipe2: \(errnoText())")
        }
        self.listenFD = fd
        self.port = Int(UInt16(bigEndian: actual.sin_port))
        self.wakeRead = pipeFDs[0]
        self.wakeWrite = pipeFDs[1]
        self.logRequests = logRequests
        self.hashBodies = hashBodies
        self.state = Locked(ServerState(bodyCaptureLimit: bodyCaptureLimit))
    }

    func start() {
        let thread = try? Threads.start(detached: false) { [self] in acceptLoop() }.get()
        state.withLock { $0.acceptThread = thread }
    }

    func stop() {
        let (first, acceptThread) = state.withLock { state -> (Bool, pthread_t?) in
            if state.stopping { return (false, nil) }
            state.stopping = true
            defer { state.acceptThread = nil }
            return (true, state.acceptThread)
        }
        guard first else { return }
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
        if let acceptThread { pthread_join(acceptThread, nil) }
        close(listenFD)
        // No new connections now; wake every blocked recv/send and wait for the threads.
        let threads = state.withLock { state -> [pthread_t] in
            for entry in state.connections.values where entry.fd >= 0 {
                shutdown(entry.fd, Int32(SHUT_RDWR))
            }
            defer { state.connections = [:] }
            return state.connections.values.compactMap(\.thread)
        }
        for thread in threads { pthread_join(thread, nil) }
        close(wakeRead)
        close(wakeWrite)
    }

    /// Waits `ms` milliseconds; true when the server is stopping instead.
    func sleepOrStop(ms: Int) -> Bool {
        guard ms > 0 else { return false }
        let deadline = monotonicMs() + Int64(ms)
        while true {
            let left = deadline - monotonicMs()
            if left <= 0 { return false }
            var wake = pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0)
            let n = poll(&wake, 1, Int32(min(left, Int64(Int32.max))))
            if n > 0 { return true }
        }
    }

    private func acceptLoop() {
        while true {
            var fds = [
                pollfd(fd: listenFD, events: Int16(POLLIN), revents: 0),
                pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0),
            ]
            let ready = poll(&fds, 2, -1)
            if ready < 0 && errno == EINTR { continue }
            if fds[1].revents != 0 || ready < 0 { return }
            // CLOEXEC at accept: a child spawned meanwhile by another test must not inherit
            // the socket, or our close/RST would not reach the client.
            let fd = gnuAccept4(listenFD, nil, nil, Int32(SOCK_CLOEXEC.rawValue))
            if fd < 0 {
                let code = errno
                if code == EMFILE || code == ENFILE || code == ENOBUFS || code == ENOMEM { usleep(10_000) }
                continue  // EAGAIN (client gone before accept), ECONNABORTED, EINTR, ...
            }
            var one: Int32 = 1
            // Small responses on keep-alive connections would otherwise wait for delayed ACKs.
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            let id = state.withLock { state -> Int? in
                if state.stopping { return nil }
                state.connectionsAccepted += 1
                state.nextConnectionID += 1
                state.connections[state.nextConnectionID] = ConnectionEntry(fd: fd)
                return state.nextConnectionID
            }
            guard let id else {
                close(fd)
                return
            }
            reapFinishedThreads()
            if let thread = try? Threads.start(detached: false, { [self] in serveConnection(fd: fd, id: id) }).get() {
                state.withLock { $0.connections[id]?.thread = thread }
            } else {
                state.withLock { _ = $0.connections.removeValue(forKey: id) }
                close(fd)
            }
        }
    }

    /// Joins threads of closed connections, so a long test does not pile up zombies.
    private func reapFinishedThreads() {
        let finished = state.withLock { state -> [pthread_t] in
            var threads: [pthread_t] = []
            for (id, entry) in state.connections where entry.done {
                if let thread = entry.thread {
                    threads.append(thread)
                    state.connections[id] = nil
                }
            }
            return threads
        }
        for thread in finished { pthread_join(thread, nil) }
    }

    private func serveConnection(fd: Int32, id: Int) {
        let connection = TestHTTPConnection(fd: fd, id: id, core: self)
        let ending = connection.run()
        // Unregister before closing, so stop() never shuts down a reused fd number.
        state.withLock { state in
            state.connections[id]?.fd = -1
            state.connections[id]?.done = true
        }
        if ending == .reset { setLingerZero(fd) }
        close(fd)
    }

    func log(_ line: String) {
        guard logRequests else { return }
        writeStderr(line + "\n")
    }
}

/// With linger 0, close() sends RST instead of FIN: the client sees "connection reset".
func setLingerZero(_ fd: Int32) {
    var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
}

/// `accept4` and `pipe2` are GNU extensions the Glibc module does not import; looked up once.
nonisolated(unsafe) private let gnuAccept4 = unsafeBitCast(
    dlsym(nil, "accept4")!,
    to: (@convention(c) (Int32, UnsafeMutablePointer<sockaddr>?, UnsafeMutablePointer<socklen_t>?, Int32) -> Int32).self
)
nonisolated(unsafe) private let gnuPipe2 = unsafeBitCast(
    dlsym(nil, "pipe2")!,
    to: (@convention(c) (UnsafeMutablePointer<Int32>?, Int32) -> Int32).self
)

func monotonicMs() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
}

func errnoText() -> String {
    String(cString: strerror(errno))
}

func writeStderr(_ text: String) {
    var bytes = Array(text.utf8)
    var offset = 0
    while offset < bytes.count {
        let n = bytes.withUnsafeMutableBytes { write(2, $0.baseAddress! + offset, $0.count - offset) }
        if n <= 0 { return }
        offset += n
    }
}
