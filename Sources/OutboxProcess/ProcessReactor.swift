import CSystem
import Glibc

/// Runs every child handed to it on one thread: one poll over all their pipes and pidfds,
/// plus a wake-up fd for children added meanwhile. A thread per child cost a thread start,
/// a 64 KiB buffer and a poll loop for each hook; here they share one of each.
package final class ProcessReactor: @unchecked Sendable {
    /// A child handed over, and who hears its result.
    private struct Handoff {
        let started: ProcessRunner.Started
        let done: @Sendable (ProcessResult) -> Void
    }

    private struct Shared {
        var incoming: [Handoff] = []
        var running = false
        var stopping = false
    }

    private var state = Shared()
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    /// An eventfd: written by `add`, read by the reactor thread, so a new child interrupts its poll.
    private let wakeFD: Int32

    /// Fails only when the process is out of fds.
    package init() throws(ProcessSpawnError) {
        let fd = csystem_proc_eventfd()
        guard fd >= 0 else {
            throw ProcessSpawnError(message: "cannot watch hook processes: \(ProcessRunner.errorText(-fd))", transient: true)
        }
        wakeFD = fd
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        csystem_proc_close(wakeFD)
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    private func withLock<T>(_ body: (inout Shared) -> T) -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return body(&state)
    }

    /// Starts the reactor thread, detached; false when no thread could be made.
    private func startThread() -> Bool {
        let context = Unmanaged.passRetained(self).toOpaque()
        var thread = pthread_t()
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        defer { pthread_attr_destroy(&attributes) }
        pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
        let rc = pthread_create(
            &thread, &attributes,
            { raw in
                Unmanaged<ProcessReactor>.fromOpaque(raw!).takeRetainedValue().loop()
                return nil
            }, context)
        if rc != 0 { Unmanaged<ProcessReactor>.fromOpaque(context).release() }
        return rc == 0
    }

    /// Feeds, watches and reaps `started` until it ends, then calls `done` with its result
    /// on the reactor thread. The thread starts with the first child, and ends once
    /// `stop` was called and no child is left.
    package func add(_ started: ProcessRunner.Started, done: @escaping @Sendable (ProcessResult) -> Void) {
        let needsThread = withLock { state -> Bool in
            state.incoming.append(Handoff(started: started, done: done))
            defer { state.running = true }
            return !state.running
        }
        if needsThread {
            if !startThread() {
                // No thread to be had: the children waiting are run to their end here instead.
                let waiting = withLock { state in
                    defer { state.incoming.removeAll() }
                    state.running = false
                    return state.incoming
                }
                for handoff in waiting { handoff.done(ProcessRunner.finish(handoff.started)) }
            }
        } else {
            csystem_proc_eventfd_signal(wakeFD)
        }
    }

    /// Lets the thread end once its children have; they are still run to their end.
    package func stop() {
        withLock { $0.stopping = true }
        csystem_proc_eventfd_signal(wakeFD)
    }

    private func loop() {
        // A hook that stops reading its stdin must not kill the runner; this thread never unblocks it.
        _ = csystem_proc_block_sigpipe()
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65536, alignment: 16)
        defer { buffer.deallocate() }
        var sessions: [(session: ChildSession, done: @Sendable (ProcessResult) -> Void)] = []
        var fds: [pollfd] = []
        var slots: [ChildSession.Slots] = []
        while true {
            let incoming = withLock { state in
                defer { state.incoming.removeAll() }
                return state.incoming
            }
            for handoff in incoming {
                let session = ChildSession(child: handoff.started.child, spec: handoff.started.spec, spawnedAt: handoff.started.spawnedAt)
                sessions.append((session, handoff.done))
            }
            let now = csystem_proc_now_ms()
            var timeout: Int32 = -1
            fds.removeAll(keepingCapacity: true)
            slots.removeAll(keepingCapacity: true)
            fds.append(pollfd(fd: wakeFD, events: Int16(POLLIN), revents: 0))
            var index = 0
            while index < sessions.count {
                sessions[index].session.advance(now: now, buffer: buffer)
                if sessions[index].session.finished {
                    let (session, done) = sessions.remove(at: index)
                    done(session.result)
                    continue
                }
                slots.append(sessions[index].session.appendPollFDs(to: &fds))
                let wait = sessions[index].session.pollTimeout(now: now)
                if wait >= 0 { timeout = timeout < 0 ? wait : min(timeout, wait) }
                index += 1
            }
            if sessions.isEmpty {
                // Ends only when no child can arrive unseen: the check and the flag change under one lock.
                let ended = withLock { state -> Bool in
                    guard state.incoming.isEmpty, state.stopping else { return false }
                    state.running = false
                    return true
                }
                if ended { return }
            }
            let ready = fds.withUnsafeMutableBufferPointer { csystem_proc_poll($0.baseAddress, UInt($0.count), timeout) }
            if ready < 0 { continue }  // EINTR: recompute timers
            if fds[0].revents != 0 { csystem_proc_eventfd_drain(wakeFD) }
            for position in sessions.indices {
                sessions[position].session.handle(fds, slots: slots[position], buffer: buffer)
            }
        }
    }
}
