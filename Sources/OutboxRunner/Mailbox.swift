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

/// Starts a detached thread for blocking work (hooks, plugins): blocking calls must not
/// run on Swift's cooperative pool, whose few threads the whole process shares.
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
