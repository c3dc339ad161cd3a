import CCurl
import OutboxModel
import Glibc
import Synchronization

/// Sends HTTP requests on libcurl's multi interface, from one dedicated thread.
///
/// Transfers share the multi handle's connection cache, so requests to one host reuse
/// a connection. There is no per-host limit here: that is the scheduler's job (a transfer
/// libcurl holds back for a host limit would look running while its timeouts run).
/// A transport-level re-send on a dead reused connection repeats the request as is,
/// X-Request-Id included (libcurl does it by itself; the Idempotency-Key makes it safe).
///
/// Standby transfers let the scheduler hand over the next request before a slot is free:
/// a standby transfer waits here, outside libcurl (where it would look started), and
/// starts on the curl thread the moment a slot-holding transfer ends, without a round
/// trip through the scheduler.
package final class HTTPClient: Sendable {
    private let engine: CurlEngine

    /// Loads libcurl, creates the multi handle and starts the thread that owns it. A standby
    /// transfer is started only while fewer than `perHost` transfers to its host are active.
    package init(maxTotalConnections: Int = 64, perHost: Int = .max) throws {
        engine = try CurlEngine(maxConnections: max(1, maxTotalConnections), perHost: max(1, perHost))
    }

    deinit {
        engine.shutdown()
    }

    /// Queues a transfer and returns its id at once.
    ///
    /// `host` is the scheduler's host key. A `slot` transfer holds a scheduling slot: when it
    /// ends, the oldest standby transfer whose host has room starts in its place, and the
    /// result names it (`HTTPResult.startedInPlace`). A `standby` transfer (always a slot
    /// transfer) waits for that, or for `promote`.
    ///
    /// `keepsSlot`: a slot transfer whose slot stays taken when it ends (its entry waits for a
    /// plugin then): no standby transfer starts in its place; the scheduler promotes one
    /// (`promote`) once the slot is free.
    ///
    /// `progress` gets (bytes sent, bytes to send) on the curl thread, about 4 times a
    /// second at most; `completion` runs exactly once on the curl thread and must not
    /// block. After `shutdown`, `completion` runs at once on the caller's thread.
    @discardableResult
    package func start(
        _ request: HTTPRequest, host: String = "", slot: Bool = false, standby: Bool = false, keepsSlot: Bool = false,
        progress: (@Sendable (Int64, Int64) -> Void)? = nil,
        completion: @escaping @Sendable (HTTPResult) -> Void
    ) -> UInt64 {
        engine.submit(
            request, host: host, mode: standby ? .standby : slot ? .slot : .plain, keepsSlot: keepsSlot, progress: progress,
            completion: completion)
    }

    /// Starts a standby transfer now (the scheduler has a free slot). Ids that already
    /// started, finished or are unknown are ignored.
    package func promote(_ id: UInt64) {
        engine.promote(id)
    }

    /// Aborts a transfer, standby or active; its completion gets an `.aborted` failure.
    /// Unknown or finished ids are ignored.
    package func cancel(_ id: UInt64) {
        engine.cancel(id)
    }

    /// Takes back a standby transfer that has not started; its completion gets an `.aborted`
    /// failure. One that started meanwhile is left to finish: it may have been sent already.
    package func withdraw(_ id: UInt64) {
        engine.withdraw(id)
    }

    /// The runner does not hold `host` after a connection to it got no answer: its standby
    /// transfers may start in freed slots again (see `CurlEngine.unansweredHosts`).
    package func trust(host: String) {
        engine.trust(host: host)
    }

    /// Aborts what is in flight, stops the thread and waits for it.
    package func shutdown() {
        engine.shutdown()
    }

    /// Loads libcurl and runs curl_global_init now; `run` can call this before it starts
    /// other threads (curl_global_init is not thread-safe). `init` does it too. Throws if
    /// libcurl cannot be loaded.
    package static func loadLibrary() throws {
        try CurlLibrary.ensureLoaded()
    }

    /// The loaded libcurl, e.g. "libcurl/7.88.1".
    package static var curlVersion: String {
        CurlLibrary.version
    }
}

/// The multi handle and the thread that owns it; other threads only touch `shared`.
final class CurlEngine: @unchecked Sendable {
    enum Mode: Sendable { case plain, slot, standby }

    /// A class: the standby queue is taken from its front, and a request held inline made
    /// each start move every waiting one (about 5,000 instructions a request at 48 waiting).
    final class Job: Sendable {
        let id: UInt64
        let request: HTTPRequest
        let host: String
        let mode: Mode
        /// Hands its slot to no standby job when it ends (`HTTPClient.start`).
        let keepsSlot: Bool
        let progress: (@Sendable (Int64, Int64) -> Void)?
        let completion: @Sendable (HTTPResult) -> Void

        init(
            id: UInt64, request: HTTPRequest, host: String, mode: Mode, keepsSlot: Bool = false,
            progress: (@Sendable (Int64, Int64) -> Void)?, completion: @escaping @Sendable (HTTPResult) -> Void
        ) {
            self.id = id
            self.request = request
            self.host = host
            self.mode = mode
            self.keepsSlot = keepsSlot
            self.progress = progress
            self.completion = completion
        }
    }

    private struct Shared {
        var pending: [Job] = []
        var promotions: [UInt64] = []
        var cancels: [UInt64] = []
        var withdrawals: [UInt64] = []
        var trusted: [String] = []
        var nextID: UInt64 = 0
        var stopping = false
        /// The multi handle is gone: no more wakeups.
        var closed = false
        var joinClaimed = false
    }

    private let shared = Locked(Shared())
    /// CURLM*; used by other threads only for curl_multi_wakeup, under `shared`'s lock.
    private let multi: UnsafeMutableRawPointer
    private var thread = pthread_t()
    // Loop thread only:
    private var active: [UInt64: (transfer: Transfer, job: Job)] = [:]
    private var byHandle: [UnsafeMutableRawPointer: Transfer] = [:]
    /// Easy handles of ended transfers, reset, for the next ones (at most `maxSpareHandles`).
    private var spareHandles: [UnsafeMutableRawPointer] = []
    private let maxSpareHandles: Int
    /// Standby jobs, oldest first; never added to the multi handle until they start.
    private var standby: [Job] = []
    private var activePerHost: [String: Int] = [:]
    /// Hosts whose last transfer got no HTTP answer: their standby jobs wait for the runner,
    /// which trusts the host again (it is not held) or withdraws them (it is held, and one
    /// request at a time probes it). An answer from the host, a promotion or trust clears it.
    private var unansweredHosts: Set<String> = []
    private let perHost: Int
    /// A transfer was added since the last perform.
    private var added = false
    /// When the transfers were last checked for stalls (monotonic ms).
    private var stallCheckMs: Int64 = 0

    init(maxConnections: Int, perHost: Int) throws {
        self.perHost = perHost
        self.maxSpareHandles = min(maxConnections, 64)
        // The main program does this too; a write to a closed socket must not kill us.
        signal(SIGPIPE, SIG_IGN)
        try CurlLibrary.ensureLoaded()
        guard let multi = ccurl_multi_init() else { throw HTTPClientError("curl_multi_init failed") }
        self.multi = multi
        // Size of the connection cache kept for reuse (not a limit that queues transfers).
        _ = ccurl_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, maxConnections)
        switch Threads.start(detached: false, { [self] in runLoop() }) {
        case let .success(thread):
            self.thread = thread
        case let .failure(error):
            shared.withLock {
                $0.stopping = true; $0.closed = true; $0.joinClaimed = true
            }
            _ = ccurl_multi_cleanup(multi)
            throw HTTPClientError("cannot start the curl thread: \(error)")
        }
    }

    func submit(
        _ request: HTTPRequest, host: String, mode: Mode, keepsSlot: Bool = false, progress: (@Sendable (Int64, Int64) -> Void)?,
        completion: @escaping @Sendable (HTTPResult) -> Void
    ) -> UInt64 {
        let multi = self.multi
        let (id, accepted) = shared.withLock { state -> (UInt64, Bool) in
            state.nextID += 1
            let id = state.nextID
            guard !state.stopping else { return (id, false) }
            // One wakeup per batch: the curl thread takes every pending job when it wakes.
            if state.pending.isEmpty { _ = ccurl_multi_wakeup(multi) }
            state.pending.append(
                Job(id: id, request: request, host: host, mode: mode, keepsSlot: keepsSlot, progress: progress, completion: completion))
            return (id, true)
        }
        if !accepted {
            completion(HTTPResult(failure: TransportFailure(.aborted, "the HTTP client was shut down"), effectiveURL: request.url))
        }
        return id
    }

    func promote(_ id: UInt64) { request(id, into: \.promotions) }

    func cancel(_ id: UInt64) { request(id, into: \.cancels) }

    func withdraw(_ id: UInt64) { request(id, into: \.withdrawals) }

    func trust(host: String) { request(host, into: \.trusted) }

    /// Queues a request about a transfer or host for the curl thread and wakes it.
    private func request<Value>(_ value: Value, into list: WritableKeyPath<Shared, [Value]>) {
        let multi = self.multi
        shared.withLock { state in
            guard !state.stopping else { return }
            state[keyPath: list].append(value)
            _ = ccurl_multi_wakeup(multi)
        }
    }

    func shutdown() {
        let multi = self.multi
        let mustJoin = shared.withLock { state -> Bool in
            if !state.stopping {
                state.stopping = true
                if !state.closed { _ = ccurl_multi_wakeup(multi) }
            }
            if state.joinClaimed { return false }
            state.joinClaimed = true
            return true
        }
        guard mustJoin else { return }
        if pthread_equal(pthread_self(), thread) != 0 {
            // Called from a completion: the loop ends after it returns; nobody joins.
            pthread_detach(thread)
        } else {
            pthread_join(thread, nil)
        }
    }

    // MARK: - The curl thread

    private func runLoop() {
        var running: Int32 = 0
        while true {
            let (jobs, promotions, cancels, withdrawals, trusted, stopping) = shared.withLock { state in
                defer {
                    state.pending.removeAll()
                    state.promotions.removeAll()
                    state.cancels.removeAll()
                    state.withdrawals.removeAll()
                    state.trusted.removeAll()
                }
                return (state.pending, state.promotions, state.cancels, state.withdrawals, state.trusted, state.stopping)
            }
            if stopping {
                for job in jobs + standby {
                    job.completion(
                        HTTPResult(
                            failure: TransportFailure(.aborted, "the HTTP client was shut down"),
                            effectiveURL: job.request.url))
                }
                standby.removeAll()
                for id in active.keys.sorted() { abort(id, message: "the HTTP client was shut down") }
                break
            }
            for job in jobs {
                if job.mode == .standby { standby.append(job) } else { begin(job) }
            }
            unansweredHosts.subtract(trusted)
            for id in promotions {
                guard let index = standby.firstIndex(where: { $0.id == id }) else { continue }
                let job = standby.remove(at: index)
                unansweredHosts.remove(job.host)
                begin(job)
            }
            for id in cancels { abort(id, message: "cancelled by the runner") }
            for id in withdrawals where standby.contains(where: { $0.id == id }) { abort(id, message: "withdrawn before it started") }
            added = false
            _ = ccurl_multi_perform(multi, &running)
            collectFinished()
            abortStalled()
            // A standby transfer that just started is driven at once, not after a poll.
            if added { continue }
            // Returns early on socket activity, curl's own timers, or a wakeup; with
            // transfers in flight, soon enough for the stall check to keep its step.
            if ccurl_multi_poll(multi, active.isEmpty ? 1000 : 100, nil) != CURLM_OK {
                usleep(10_000)  // never spin if polling itself fails
            }
        }
        for easy in spareHandles { ccurl_easy_cleanup(easy) }
        spareHandles.removeAll()
        let multi = self.multi
        shared.withLock { state in
            state.closed = true
            _ = ccurl_multi_cleanup(multi)
        }
    }

    private func begin(_ job: Job) {
        let transfer: Transfer
        do {
            transfer = try Transfer(
                id: job.id, request: job.request, spare: spareHandles.popLast(), progress: job.progress,
                completion: job.completion)
        } catch {
            // Refused as it was set up: nothing of it went out.
            var result = HTTPResult(failure: TransportFailure(error.kind, error.message), effectiveURL: job.request.url)
            result.requestWentOut = false
            job.completion(result)
            return
        }
        guard let easy = transfer.easy else { return }
        let rc = ccurl_multi_add_handle(multi, easy)
        guard rc == CURLM_OK else {
            transfer.close()
            let message = String(cString: ccurl_multi_strerror(rc))
            job.completion(
                HTTPResult(failure: TransportFailure(.network, "curl_multi_add_handle: \(message)"), effectiveURL: job.request.url))
            return
        }
        active[job.id] = (transfer, job)
        byHandle[easy] = transfer
        activePerHost[job.host, default: 0] += 1
        added = true
    }

    /// Starts the oldest standby job whose host has room and answered last, in place of a
    /// slot transfer that ended; returns its id.
    private func startStandby() -> UInt64? {
        let index = standby.firstIndex {
            (unansweredHosts.isEmpty || !unansweredHosts.contains($0.host)) && activePerHost[$0.host, default: 0] < perHost
        }
        guard let index else { return nil }
        let job = standby.remove(at: index)
        begin(job)
        return job.id
    }

    private func collectFinished() {
        var easy: UnsafeMutableRawPointer?
        var code = CURLE_OK
        while ccurl_multi_next_done(multi, &easy, &code) != 0 {
            guard let easy, let transfer = byHandle[easy] else { continue }
            finish(transfer, code: code, abortMessage: "")
        }
    }

    /// Ends the transfers that stalled (`StallWatch`), at most every 50 ms.
    private func abortStalled() {
        guard !active.isEmpty else { return }
        let now = Int64(monotonicNanoseconds() / 1_000_000)
        guard now - stallCheckMs >= 50 else { return }
        stallCheckMs = now
        var stalled: [(Transfer, String)] = []
        for (transfer, _) in active.values {
            if let message = transfer.stallMessage(nowMs: now) { stalled.append((transfer, message)) }
        }
        for (transfer, message) in stalled { finish(transfer, code: nil, abortMessage: message, abortKind: .timeout) }
    }

    private func abort(_ id: UInt64, message: String) {
        if let index = standby.firstIndex(where: { $0.id == id }) {
            let job = standby.remove(at: index)
            job.completion(HTTPResult(failure: TransportFailure(.aborted, message), effectiveURL: job.request.url))
            return
        }
        guard let transfer = active[id]?.transfer else { return }
        finish(transfer, code: nil, abortMessage: message)
    }

    /// Removes the handle from the multi, then frees it (never while the multi holds it),
    /// then reports. A slot transfer hands its slot to a standby job before it reports.
    private func finish(
        _ transfer: Transfer, code: CURLcode?, abortMessage: String,
        abortKind: TransportFailure.Kind = .aborted
    ) {
        guard let easy = transfer.easy, let job = active[transfer.id]?.job else { return }
        _ = ccurl_multi_remove_handle(multi, easy)
        var result = transfer.result(code: code, abortMessage: abortMessage, abortKind: abortKind)
        active[transfer.id] = nil
        byHandle[easy] = nil
        activePerHost[job.host, default: 1] -= 1
        if let easy = transfer.close(keepingHandle: spareHandles.count < maxSpareHandles) { spareHandles.append(easy) }
        if result.connectionFailed {
            unansweredHosts.insert(job.host)
        } else if result.status != nil, !unansweredHosts.isEmpty {
            unansweredHosts.remove(job.host)
        }
        if job.mode != .plain && !job.keepsSlot { result.startedInPlace = startStandby() }
        transfer.completion(result)
    }
}
