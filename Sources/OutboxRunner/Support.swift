import Glibc
import OutboxModel
import Synchronization

/// A queue of events posted by the curl thread and hook threads, read by the control thread.
final class Mailbox<Event: Sendable>: @unchecked Sendable {
    private var items: [Event] = []
    private var mutex = pthread_mutex_t()
    private var condition = pthread_cond_t()

    init() {
        pthread_mutex_init(&mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        // Waits measure the monotonic clock, so a wall-clock jump cannot stall the runner.
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(&condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(&condition)
        pthread_mutex_destroy(&mutex)
    }

    func post(_ event: Event) {
        pthread_mutex_lock(&mutex)
        // The reader waits only for an empty queue: later posts need no signal.
        if items.isEmpty { pthread_cond_signal(&condition) }
        items.append(event)
        pthread_mutex_unlock(&mutex)
    }

    /// Everything posted so far, waiting up to `timeoutMs` for the first event.
    func take(timeoutMs: Int64) -> [Event] {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        if items.isEmpty && timeoutMs > 0 {
            var deadline = timespec()
            clock_gettime(CLOCK_MONOTONIC, &deadline)
            let nanos = Int64(deadline.tv_nsec) + (timeoutMs % 1000) * 1_000_000
            deadline.tv_sec += Int(timeoutMs / 1000) + Int(nanos / 1_000_000_000)
            deadline.tv_nsec = Int(nanos % 1_000_000_000)
            while items.isEmpty {
                if pthread_cond_timedwait(&condition, &mutex, &deadline) == ETIMEDOUT { break }
            }
        }
        let taken = items
        items.removeAll()
        return taken
    }
}

/// Starts a detached thread for blocking work (hooks, plugins), off the cooperative pool (T-swift4).
func startThread(_ body: @escaping @Sendable () -> Void) {
    final class Box { let body: @Sendable () -> Void; init(_ b: @escaping @Sendable () -> Void) { body = b } }
    let context = Unmanaged.passRetained(Box(body)).toOpaque()
    var thread = pthread_t()
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
    let rc = pthread_create(&thread, &attributes, { raw in
        let box = Unmanaged<AnyObject>.fromOpaque(raw!).takeRetainedValue() as! Box
        box.body()
        return nil
    }, context)
    pthread_attr_destroy(&attributes)
    if rc != 0 {
        // No thread: run inline rather than lose the work.
        Unmanaged<AnyObject>.fromOpaque(context).release()
        body()
    }
}

/// Counts SIGINT/SIGTERM; the runner's loop reads it (the first drains, the second stops).
let stopSignals = Atomic<Int>(0)

func installStopSignals() {
    let handler: @convention(c) (Int32) -> Void = { _ in stopSignals.add(1, ordering: .relaxed) }
    signal(SIGINT, handler)
    signal(SIGTERM, handler)
    // A parent may have started us with these blocked (e.g. spawned from a libdispatch
    // worker thread, which blocks signals); then SIGTERM would never reach the handler.
    var stops = sigset_t()
    sigemptyset(&stops)
    sigaddset(&stops, SIGINT)
    sigaddset(&stops, SIGTERM)
    pthread_sigmask(SIG_UNBLOCK, &stops, nil)
}

enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    static func encode(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i + 2 < bytes.count {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], alphabet[Int(n & 63)]]
            i += 3
        }
        let rest = bytes.count - i
        if rest == 1 {
            let n = UInt32(bytes[i]) << 16
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)], 61, 61]
        } else if rest == 2 {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], 61]
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// A response body for JSON: UTF-8 text, or base64 when it is not valid UTF-8.
func bodyJSON(_ bytes: [UInt8], into object: inout JSON, field: String = "body") {
    if let text = String(validating: bytes, as: UTF8.self) {
        object.set(field, .string(text))
    } else {
        object.set(field, .string(Base64.encode(bytes)))
        object.set("\(field)_encoding", .string("base64"))
    }
}
