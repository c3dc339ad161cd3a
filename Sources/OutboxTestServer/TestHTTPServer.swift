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

    /// Connections still open: a client killed mid-request is recorded only once its
    /// connection has ended, so crash tests wait for zero before reading `requests`.
    /// Connections being served, and those still waiting in the listen queue.
    package var openConnections: Int { core.pendingAccepts + core.state.withLock { $0.connections.values.filter { !$0.done }.count } }

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

    /// Waits until at least `count` requests wait at the hold `name`; false on timeout (long:
    /// it returns as soon as they do, and a loaded machine can take a while to send them).
    @discardableResult
    package func waitForHeld(_ name: String, count: Int = 1, timeoutMs: Int = 120_000) -> Bool {
        waitBlocking(timeoutMs: timeoutMs) { ($0.holds[name]?.waiting.count ?? 0) >= count }
    }

    /// `waitForHeld` for async callers: polls without holding a thread of the pool.
    @discardableResult
    package func waitForHeld(_ name: String, count: Int = 1, timeoutMs: Int = 120_000) async -> Bool {
        await waitAsync(timeoutMs: timeoutMs) { ($0.holds[name]?.waiting.count ?? 0) >= count }
    }

    /// Deadlines stretch by `OUTBOX_TEST_TIME_SCALE` (sanitizer runs are many times slower).
    static let timeScale: Int = max(1, Int(getenv("OUTBOX_TEST_TIME_SCALE").map { String(cString: $0) } ?? "") ?? 1)

    private func waitBlocking(timeoutMs: Int, _ done: (ServerState) -> Bool) -> Bool {
        let deadline = monotonicMs() + Int64(timeoutMs * Self.timeScale)
        while true {
            if core.state.withLock({ done($0) }) { return true }
            if monotonicMs() >= deadline { return false }
            usleep(2000)
        }
    }

    private func waitAsync(timeoutMs: Int, _ done: (ServerState) -> Bool) async -> Bool {
        let deadline = monotonicMs() + Int64(timeoutMs * Self.timeScale)
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
