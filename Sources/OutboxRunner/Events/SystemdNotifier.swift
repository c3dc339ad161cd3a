import Glibc

/// The service manager's notify protocol: `READY=1` once the runner holds the store,
/// `STOPPING=1` when it stops, `WATCHDOG=1` at half the watchdog interval. Each message is
/// one datagram to `$NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace); without
/// that variable nothing is sent.
package final class SystemdNotifier: @unchecked Sendable {
    private let fd: Int32
    private var address = sockaddr_un()
    private let addressLength: socklen_t
    /// Half of `WATCHDOG_USEC`, when the service manager asks for pings.
    package let watchdogEveryMs: Int64?
    private var lastPing: Int64?

    package init?(environment: [String: String]) {
        guard let socketPath = environment["NOTIFY_SOCKET"], !socketPath.isEmpty,
            socketPath.hasPrefix("/") || socketPath.hasPrefix("@")
        else { return nil }
        var bytes = Array(socketPath.utf8)
        if bytes[0] == UInt8(ascii: "@") { bytes[0] = 0 }
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard bytes.count < capacity else { return nil }
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, b) in bytes.enumerated() { raw[i] = b }
        }
        addressLength = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + (bytes[0] == 0 ? 0 : 1))
        // As sd_watchdog_enabled(): a WATCHDOG_PID naming another process means the pings are not ours to send.
        let forUs = environment["WATCHDOG_PID"].map { Int32($0) == getpid() } ?? true
        if forUs, let usec = environment["WATCHDOG_USEC"].flatMap(Int64.init), usec > 0 {
            watchdogEveryMs = max(1, usec / 2000)
        } else {
            watchdogEveryMs = nil
        }
    }

    deinit { close(fd) }

    /// Never blocks: a message the manager's queue has no room for is dropped.
    package func send(_ message: String) {
        var bytes = Array(message.utf8)
        _ = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socketAddress in
                sendto(fd, &bytes, bytes.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT), socketAddress, addressLength)
            }
        }
    }

    /// Sends `WATCHDOG=1` when half the interval has passed since the last one.
    package func pingIfDue(monotonicMs now: Int64) {
        guard let every = watchdogEveryMs else { return }
        if let lastPing, now - lastPing < every { return }
        lastPing = now
        send("WATCHDOG=1")
    }
}
