import Glibc

/// The one way outbox starts a thread. Blocking work (the curl loop, hooks, plugins) runs
/// on threads of its own: blocking calls must not occupy Swift's cooperative pool, whose
/// few threads the whole process shares.
package enum Threads {
    /// Runs `body` on a new thread: detached (it frees itself), or joinable (the caller
    /// joins the returned thread). Fails with the errno when no thread could be made; then
    /// `body` does not run.
    package static func start(detached: Bool, _ body: @escaping @Sendable () -> Void) -> Result<pthread_t, Errno> {
        final class Box {
            let body: @Sendable () -> Void
            init(_ body: @escaping @Sendable () -> Void) { self.body = body }
        }
        let context = Unmanaged.passRetained(Box(body)).toOpaque()
        var thread = pthread_t()
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        defer { pthread_attr_destroy(&attributes) }
        if detached { pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED)) }
        let rc = pthread_create(
            &thread, &attributes,
            { raw in
                let box = Unmanaged<Box>.fromOpaque(raw!).takeRetainedValue()
                box.body()
                return nil
            }, context)
        guard rc == 0 else {
            Unmanaged<Box>.fromOpaque(context).release()
            return .failure(Errno(code: rc))
        }
        return .success(thread)
    }

    /// A detached thread for blocking work; without a thread the work runs inline rather than being lost.
    package static func detach(_ body: @escaping @Sendable () -> Void) {
        if case .failure = start(detached: true, body) { body() }
    }
}

/// An errno value as an error.
package struct Errno: Error, Sendable, Equatable, CustomStringConvertible {
    package var code: Int32
    package init(code: Int32) { self.code = code }
    package var description: String { strerror(code).map { String(cString: $0) } ?? "error \(code)" }
}

/// A value behind a pthread mutex, for state several threads share. Synchronization's
/// `Mutex` would do as well, but ThreadSanitizer cannot see its lock on Linux (it reports
/// races between accesses the lock orders), while it understands pthread mutexes.
package final class Locked<Value: ~Copyable>: @unchecked Sendable {
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private var value: Value

    package init(_ value: consuming Value) {
        self.value = value
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    package func withLock<T: ~Copyable, E: Error>(_ body: (inout Value) throws(E) -> T) throws(E) -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
