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
