import CDigest
import Glibc

extension SHA256 {
    /// The raw 32-byte SHA-256 of each byte range `[start, end)` of the open file `fd`, hashed
    /// on up to one thread per CPU (in C, with the CPU's SHA instructions). Nil when the CPU
    /// has none (the caller hashes one range after another); an errno when a read failed.
    package static func digests(fd: Int32, ranges: [(start: Int64, end: Int64)]) -> Result<[[UInt8]], Errno>? {
        let starts = ranges.map(\.start), ends = ranges.map(\.end)
        var out = [UInt8](repeating: 0, count: 32 * ranges.count)
        let threads = Int32(min(max(sysconf(Int32(_SC_NPROCESSORS_ONLN)), 1), 8))
        let status = out.withUnsafeMutableBufferPointer { buffer in
            cdigest_sha256_file_ranges(fd, starts, ends, ranges.count, buffer.baseAddress, threads)
        }
        if status == -1 { return nil }
        if status != 0 { return .failure(Errno(code: status)) }
        return .success((0..<ranges.count).map { Array(out[(32 * $0)..<(32 * $0 + 32)]) })
    }

    /// An errno from a read of the file being hashed.
    package struct Errno: Error, Sendable {
        package let code: Int32
    }
}
