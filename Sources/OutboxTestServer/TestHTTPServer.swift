import Glibc
import Digest
import Synchronization

/// An error starting the test server (socket, bind or listen failed).
package struct TestHTTPServerError: Error, CustomStringConvertible, Sendable {
    /// What failed, with errno text.
    package let description: String

    /// Creates an error with its text (test helpers reuse the type).
    package init(description: String) { self.description = description }
}

/// A scriptable HTTP/1.1 server on loopback for integration tests, the CLI tests and the demo.
///
/// One thread per connection with blocking sockets; keep-alive, Content-Length and chunked
/// request bodies, `Expect: 100-continue`. Bodies are streamed and hashed, never held
/// beyond `bodyCaptureLimit`, so multi-GB uploads keep memory flat. Stopped on `stop()`
/// or when the last reference goes away.
package final class TestHTTPServer: Sendable {
    private let core: ServerCore
    /// The bound TCP port.
    package let port: Int
    /// The address the server listens on.
    package let host: String

    /// Binds and starts listening; `port` 0 picks a free port (read it from `port`).
    ///
    /// `hashBodies: false` leaves `bodySHA256` empty, for benchmarks where hashing
    /// (about 120 MB/s) would be the bottleneck; `logRequests` prints a line per request.
    package init(
        host: String = "127.0.0.1", port: Int = 0, bodyCaptureLimit: Int = 1 << 20,
        hashBodies: Bool = true, logRequests: Bool = false
    ) throws {
        let core = try ServerCore(
            host: host, port: port, bodyCaptureLimit: bodyCaptureLimit, hashBodies: hashBodies, logRequests: logRequests
        )
        self.core = core
        self.port = core.port
        self.host = host
        core.start()
    }

    deinit { core.stop() }

    /// `http://HOST:PORT`, without a trailing slash.
    package var baseURL: String { "http://\(host):\(port)" }

    /// `baseURL` + `path` (which should start with "/").
    package func url(_ path: String) -> String { baseURL + path }

    /// Closes the listener and every connection, and joins all server threads.
    package func stop() { core.stop() }

    /// Scripts responses for requests whose raw path starts with `pathPrefix` (longest
    /// prefix wins); each request consumes the next step and the last step repeats forever.
    /// Scripts take precedence over the built-in paths; replacing a script restarts it,
    /// and empty `steps` remove it.
    package func script(_ pathPrefix: String, _ steps: [TestResponse]) {
        core.state.withLock { state in
            if steps.isEmpty {
                state.scripts[pathPrefix] = nil
            } else {
                state.scripts[pathPrefix] = Script(steps: steps)
            }
        }
    }

    /// Every recorded request, in the order they were read (control paths `/_stats` and
    /// `/_reset` are not recorded).
    package var requests: [RecordedRequest] { core.state.withLock { $0.records } }

    /// Recorded requests whose raw path starts with `prefix`.
    package func requests(path prefix: String) -> [RecordedRequest] {
        core.state.withLock { $0.records.filter { $0.path.hasPrefix(prefix) } }
    }

    /// Connections accepted since start or the last `reset()` (reuse shows as a small count).
    package var connectionsAccepted: Int { core.state.withLock { $0.connectionsAccepted } }

    /// Requests that carried `Expect: 100-continue` since start or the last `reset()`.
    package var expectContinueCount: Int { core.state.withLock { $0.expectContinueCount } }

    /// Largest body kept in `RecordedRequest.body` (larger bodies are only sized and hashed).
    package var bodyCaptureLimit: Int {
        get { core.state.withLock { $0.bodyCaptureLimit } }
        set { core.state.withLock { $0.bodyCaptureLimit = newValue } }
    }

    /// Clears scripts, records, `/seq` counters and the counters; holds stay as they are.
    package func reset() {
        core.state.withLock { $0.clear() }
    }

    /// Waits until at least `count` requests are recorded; false on timeout. A client error
    /// (reset, disconnect) can reach the client before the server records the request.
    @discardableResult
    package func waitForRequests(count: Int, timeoutMs: Int = 30_000) -> Bool {
        waitBlocking(timeoutMs: timeoutMs) { $0.records.count >= count }
    }

    /// `waitForRequests` for async callers: polls without holding a thread of the pool.
    @discardableResult
    package func waitForRequests(count: Int, timeoutMs: Int = 30_000) async -> Bool {
        await waitAsync(timeoutMs: timeoutMs) { $0.records.count >= count }
    }

    // MARK: - Holds

    /// Lets requests waiting at the hold `name` (`TestResponse.hold`, `/hold/NAME/...`) go on,
    /// oldest first: `count` of them, or with nil every one held now and every later one
    /// (the hold stays open). A count larger than those held lets that many later arrivals
    /// through at once. Returns how many held requests it let go.
    @discardableResult
    package func release(_ name: String, count: Int? = nil) -> Int {
        core.state.withLock { $0.release(name, count: count) }
    }

    /// How many requests wait at the hold `name` now (a released one no longer counts, nor
    /// one whose client went away).
    package func heldCount(_ name: String) -> Int {
        core.state.withLock { $0.holds[name]?.waiting.count ?? 0 }
    }

    /// Waits until at least `count` requests wait at the hold `name`; false on timeout.
    @discardableResult
    package func waitForHeld(_ name: String, count: Int = 1, timeoutMs: Int = 30_000) -> Bool {
        waitBlocking(timeoutMs: timeoutMs) { ($0.holds[name]?.waiting.count ?? 0) >= count }
    }

    /// `waitForHeld` for async callers: polls without holding a thread of the pool.
    @discardableResult
    package func waitForHeld(_ name: String, count: Int = 1, timeoutMs: Int = 30_000) async -> Bool {
        await waitAsync(timeoutMs: timeoutMs) { ($0.holds[name]?.waiting.count ?? 0) >= count }
    }

    private func waitBlocking(timeoutMs: Int, _ done: (ServerState) -> Bool) -> Bool {
        let deadline = monotonicMs() + Int64(timeoutMs)
        while true {
            if core.state.withLock({ done($0) }) { return true }
            if monotonicMs() >= deadline { return false }
            usleep(2000)
        }
    }

    private func waitAsync(timeoutMs: Int, _ done: (ServerState) -> Bool) async -> Bool {
        let deadline = monotonicMs() + Int64(timeoutMs)
        while true {
            if core.state.withLock({ done($0) }) { return true }
            // Checked once more after the deadline: a starved caller still sees the truth.
            if monotonicMs() >= deadline { return core.state.withLock { done($0) } }
            try? await Task.sleep(nanoseconds: 5_000_000)
        }
    }
}

/// One named hold: requests wait there until the test releases them.
struct Hold {
    /// Released for good: every request passes at once.
    var open = false
    /// Later arrivals that pass at once (a release counted more than were held).
    var permits = 0
    /// Tickets of the requests waiting, oldest first.
    var waiting: [Int] = []
    /// Tickets released whose connection has not picked that up yet.
    var released: Set<Int> = []
}

/// One scripted path prefix: its steps and how many requests consumed them.
struct Script {
    var steps: [TestResponse]
    var used = 0

    /// The response for the next request; the last step repeats.
    mutating func next() -> TestResponse {
        defer { used += 1 }
        return steps[min(used, steps.count - 1)]
    }
}

/// A live connection, as tracked for `stop()`: its fd until the thread closes it.
struct ConnectionEntry {
    var fd: Int32
    var thread: pthread_t?
    var done = false
}

/// Everything shared between the package API and the server threads.
struct ServerState {
    var scripts: [String: Script] = [:]
    var records: [RecordedRequest] = []
    var sequences: [String: Int] = [:]
    var connectionsAccepted = 0
    var expectContinueCount = 0
    var nextConnectionID = 0
    var bodyCaptureLimit: Int
    var stopping = false
    var connections: [Int: ConnectionEntry] = [:]
    var acceptThread: pthread_t?
    /// Left alone by `clear()`: a request held there must still be releasable.
    var holds: [String: Hold] = [:]
    var nextTicket = 0

    mutating func clear() {
        scripts = [:]
        records = []
        sequences = [:]
        connectionsAccepted = 0
        expectContinueCount = 0
    }

    /// A request reaches the hold `name`: nil when it may go on at once, else its ticket.
    mutating func arrive(at name: String) -> Int? {
        var hold = holds[name, default: Hold()]
        defer { holds[name] = hold }
        if hold.open { return nil }
        if hold.permits > 0 {
            hold.permits -= 1
            return nil
        }
        nextTicket += 1
        hold.waiting.append(nextTicket)
        return nextTicket
    }

    /// Whether the ticket was released (and forgets it if so).
    mutating func takeRelease(_ ticket: Int, at name: String) -> Bool {
        holds[name]?.released.remove(ticket) != nil
    }

    /// A held request gives up (server stopping, client gone).
    mutating func leave(_ ticket: Int, at name: String) {
        holds[name]?.waiting.removeAll { $0 == ticket }
        holds[name]?.released.remove(ticket)
    }

    mutating func release(_ name: String, count: Int?) -> Int {
        var hold = holds[name, default: Hold()]
        let n = min(max(0, count ?? hold.waiting.count), hold.waiting.count)
        hold.released.formUnion(hold.waiting.prefix(n))
        hold.waiting.removeFirst(n)
        if let count {
            hold.permits += max(0, count - n)
        } else {
            hold.open = true
        }
        holds[name] = hold
        return n
    }

    /// The next scripted response for `path`, by longest matching prefix.
    mutating func scriptedResponse(for path: String) -> TestResponse? {
        var best: String?
        for prefix in scripts.keys where path.hasPrefix(prefix) {
            if best == nil || prefix.utf8.count > best!.utf8.count { best = prefix }
        }
        guard let best else { return nil }
        return scripts[best]!.next()
    }
}

/// Owns the listener and the threads; kept apart from `TestHTTPServer` so that threads
/// never retain the package object and its `deinit` can stop everything.
final class ServerCore: Sendable {
    let state: Mutex<ServerState>
    let port: Int
    let logRequests: Bool
    let hashBodies: Bool
    private let listenFD: Int32
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
        self.state = Mutex(ServerState(bodyCaptureLimit: bodyCaptureLimit))
    }

    func start() {
        let thread = spawnThread { [self] in acceptLoop() }
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
            if let thread = spawnThread({ [self] in serveConnection(fd: fd, id: id) }) {
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

private final class ThreadBody {
    let run: @Sendable () -> Void
    init(_ run: @escaping @Sendable () -> Void) { self.run = run }
}

/// Starts a joinable thread (no Foundation `Thread` here; blocking I/O must stay off the
/// cooperative pool).
func spawnThread(_ body: @escaping @Sendable () -> Void) -> pthread_t? {
    let context = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
    var thread = pthread_t()
    let result = pthread_create(
        &thread, nil,
        { raw in
            let body = Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue()
            body.run()
            return nil
        }, context)
    guard result == 0 else {
        Unmanaged<ThreadBody>.fromOpaque(context).release()
        return nil
    }
    return thread
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
