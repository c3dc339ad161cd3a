import Foundation

/// A port no one listens on now: bound on loopback, read back, released (nil if that fails).
/// Another process may take it before the caller's server binds it, so callers try again.
package func freeLoopbackPort() -> Int? {
    guard let (fd, port) = boundLoopbackSocket() else { return nil }
    close(fd)
    return port
}

/// A TCP socket bound to a free loopback port, and the port (nil if that fails): the caller
/// listens on it or not, and closes it.
package func boundLoopbackSocket() -> (fd: Int32, port: Int)? {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { return nil }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    guard bound else {
        close(fd)
        return nil
    }
    return (fd, Int(UInt16(bigEndian: address.sin_port)))
}
