import CCurl
import Glibc
import Synchronization

/// Sends HTTP requests on libcurl's multi interface, from one dedicated thread.
///
/// Transfers share the multi handle's connection cache, so requests to one host reuse
/// a connection. There is no per-host limit here: that is the scheduler's job (T-curl7).
/// A transport-level re-send on a dead reused connection repeats the request as is,
/// X-Request-Id included (T-curl1).
public final class HTTPClient: Sendable {
    private let engine: CurlEngine

    /// Loads libcurl, creates the multi handle and starts the thread that owns it.
    public init(maxTotalConnections: Int = 64) throws {
        engine = try CurlEngine(maxConnections: max(1, maxTotalConnections))
    }

    deinit {
        engine.shutdown()
    }

    /// Queues a transfer and returns its id at once.
    ///
    /// `progress` gets (bytes sent, bytes to send) on the curl thread, about 4 times a
    /// second at most; `completion` runs exactly once on the curl thread and must not
    /// block. After `shutdown`, `completion` runs at once on the caller's thread.
    @discardableResult
    public func start(_ request: HTTPRequest, progress: (@Sendable (Int64, Int64) -> Void)? = nil,
                      completion: @escaping @Sendable (HTTPResult) -> Void) -> UInt64 {
        engine.submit(request, progress: progress, completion: completion)
    }

    /// Aborts a transfer; its completion gets a `.network` failure "aborted". Unknown or
    /// finished ids are ignored.
    public func cancel(_ id: UInt64) {
        engine.cancel(id)
    }

    /// Aborts what is in flight, stops the thread and waits for it.
    public func shutdown() {
        engine.shutdown()
    }

    /// Loads libcurl and runs curl_global_init now; `run` can call this before it starts
    /// other threads (T-curl12). `init` does it too. Throws if libcurl cannot be loaded.
    public static func loadLibrary() throws {
        try CurlLibrary.ensureLoaded()
    }

    /// The loaded libcurl, e.g. "libcurl/7.88.1".
    public static var curlVersion: String {
        CurlLibrary.version
    }
}

/// The multi handle and the thread that owns it; other threads only touch `shared`.
final class CurlEngine: @unchecked Sendable {
    struct Job: Sendable {
        var id: UInt64
        var request: HTTPRequest
        var progress: (@Sendable (Int64, Int64) -> Void)?
        var completion: @Sendable (HTTPResult) -> Void
    }

    private struct Shared {
        var pending: [Job] = []
        var cancels: [UInt64] = []
        var nextID: UInt64 = 0
        var stopping = false
        /// The multi handle is gone: no more wakeups.
        var closed = false
        var joinClaimed = false
    }

    private let shared = Mutex(Shared())
    /// CURLM*; used by other threads only for curl_multi_wakeup, under `shared`'s lock.
    private let multi: UnsafeMutableRawPointer
    private var thread = pthread_t()
    // Loop thread only:
    private var active: [UInt64: Transfer] = [:]
    private var byHandle: [UnsafeMutableRawPointer: Transfer] = [:]

    init(maxConnections: Int) throws {
        // The main program does this too; a write to a closed socket must not kill us.
        signal(SIGPIPE, SIG_IGN)
        try CurlLibrary.ensureLoaded()
        guard let multi = ccurl_multi_init() else { throw HTTPClientError("curl_multi_init failed") }
        self.multi = multi
        // Size of the connection cache kept for reuse (not a limit that queues transfers).
        _ = ccurl_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, maxConnections)
        let context = Unmanaged.passRetained(self).toOpaque()
        let rc = pthread_create(&thread, nil, { context in
            let engine = Unmanaged<CurlEngine>.fromOpaque(context!).takeRetainedValue()
            engine.runLoop()
            return nil
        }, context)
        if rc != 0 {
            Unmanaged<CurlEngine>.fromOpaque(context).release()
            shared.withLock { $0.stopping = true; $0.closed = true; $0.joinClaimed = true }
            _ = ccurl_multi_cleanup(multi)
            throw HTTPClientError("cannot start the curl thread: \(String(cString: strerror(rc)))")
        }
    }

    func submit(_ request: HTTPRequest, progress: (@Sendable (Int64, Int64) -> Void)?,
                completion: @escaping @Sendable (HTTPResult) -> Void) -> UInt64 {
        let multi = self.multi
        let (id, accepted) = shared.withLock { state -> (UInt64, Bool) in
            state.nextID += 1
            let id = state.nextID
            guard !state.stopping else { return (id, false) }
            state.pending.append(Job(id: id, request: request, progress: progress, completion: completion))
            _ = ccurl_multi_wakeup(multi)
            return (id, true)
        }
        if !accepted {
            completion(HTTPResult(failure: (.network, "aborted: the HTTP client was shut down"), effectiveURL: request.url))
        }
        return id
    }

    func cancel(_ id: UInt64) {
        let multi = self.multi
        shared.withLock { state in
            guard !state.stopping else { return }
            state.cancels.append(id)
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
            let (jobs, cancels, stopping) = shared.withLock { state in
                defer {
                    state.pending.removeAll()
                    state.cancels.removeAll()
                }
                return (state.pending, state.cancels, state.stopping)
            }
            if stopping {
                for job in jobs {
                    job.completion(HTTPResult(failure: (.network, "aborted: the HTTP client was shut down"),
                                              effectiveURL: job.request.url))
                }
                for id in active.keys.sorted() { abort(id, message: "aborted: the HTTP client was shut down") }
                break
            }
            for job in jobs { begin(job) }
            for id in cancels { abort(id, message: "aborted") }
            _ = ccurl_multi_perform(multi, &running)
            collectFinished()
            // Returns early on socket activity, curl's own timers, or a wakeup.
            if ccurl_multi_poll(multi, 1000, nil) != CURLM_OK {
                usleep(10_000)  // never spin if polling itself fails
            }
        }
        let multi = self.multi
        shared.withLock { state in
            state.closed = true
            _ = ccurl_multi_cleanup(multi)
        }
    }

    private func begin(_ job: Job) {
        let transfer: Transfer
        do {
            transfer = try Transfer(id: job.id, request: job.request, progress: job.progress, completion: job.completion)
        } catch {
            job.completion(HTTPResult(failure: (error.kind, error.message), effectiveURL: job.request.url))
            return
        }
        guard let easy = transfer.easy else { return }
        let rc = ccurl_multi_add_handle(multi, easy)
        guard rc == CURLM_OK else {
            transfer.close()
            let message = String(cString: ccurl_multi_strerror(rc))
            job.completion(HTTPResult(failure: (.network, "curl_multi_add_handle: \(message)"), effectiveURL: job.request.url))
            return
        }
        active[job.id] = transfer
        byHandle[easy] = transfer
    }

    private func collectFinished() {
        var easy: UnsafeMutableRawPointer?
        var code = CURLE_OK
        while ccurl_multi_next_done(multi, &easy, &code) != 0 {
            guard let easy, let transfer = byHandle[easy] else { continue }
            finish(transfer, code: code, abortMessage: "")
        }
    }

    private func abort(_ id: UInt64, message: String) {
        guard let transfer = active[id] else { return }
        finish(transfer, code: nil, abortMessage: message)
    }

    /// Removes the handle from the multi, then frees it, then reports (T-curl11).
    private func finish(_ transfer: Transfer, code: CURLcode?, abortMessage: String) {
        guard let easy = transfer.easy else { return }
        _ = ccurl_multi_remove_handle(multi, easy)
        let result = transfer.result(code: code, abortMessage: abortMessage)
        active[transfer.id] = nil
        byHandle[easy] = nil
        transfer.close()
        transfer.completion(result)
    }
}
