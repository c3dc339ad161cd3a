import Digest
import Glibc

/// SHA-256 checksums of an s3 request's bytes, computed once at enqueue and sent as
/// `x-amz-checksum-sha256`, which S3 checks against what it receives.
package enum S3Checksum {
    package static let header = "x-amz-checksum-sha256"
    package static let algorithmHeader = "x-amz-sdk-checksum-algorithm"

    /// Base64 of the SHA-256 of bytes `range` of the file, read from disk 1 MiB at a time.
    package static func sha256Base64(path: String, range: ByteRange) throws(OutboxError) -> String {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)  // a FIFO put in its place must not hang the enqueue
        guard fd >= 0 else { throw .unreadable("request.file: cannot read \(path) to checksum it: \(Paths.errnoMessage())", errno: errno) }
        defer { close(fd) }
        var hasher = SHA256.Hasher()
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var offset = range.start
        while offset < range.end {
            let want = Int(min(Int64(buffer.count), range.end - offset))
            let got = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, want, off_t(offset)) }
            if got < 0 && errno == EINTR { continue }
            guard got > 0 else { throw .invalid("request.file: \(path) ended or failed at byte \(offset) while it was checksummed") }
            buffer.withUnsafeBytes { hasher.update(UnsafeRawBufferPointer(rebasing: $0[..<got])) }
            offset += Int64(got)
        }
        return base64(bytes(hex: hasher.finalizeHex()))
    }

    /// Base64 SHA-256 of each part `ranges` of the file: on all CPUs at once where the CPU has
    /// SHA instructions (a 1 GiB object's parts are hashed before its entry is committed).
    package static func sha256Base64(path: String, ranges: [ByteRange]) throws(OutboxError) -> [String] {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)  // a FIFO put in its place must not hang the enqueue
        guard fd >= 0 else { throw .unreadable("request.file: cannot read \(path) to checksum it: \(Paths.errnoMessage())", errno: errno) }
        defer { close(fd) }
        switch SHA256.digests(fd: fd, ranges: ranges.map { ($0.start, $0.end) }) {
        case .success(let digests): return digests.map(base64)
        case .failure(let failure):
            let reason = failure.code == EIO ? "it ended early or could not be read" : String(cString: strerror(failure.code))
            throw .invalid("request.file: \(path) could not be checksummed: \(reason)")
        case nil:
            var sums: [String] = []
            for range in ranges { sums.append(try sha256Base64(path: path, range: range)) }
            return sums
        }
    }

    /// S3's checksum of a multipart object: the SHA-256 of the parts' digests, `-` the part count.
    package static func composite(_ partSums: [String]) -> String? {
        var digests: [UInt8] = []
        for sum in partSums {
            guard let bytes = decodeBase64(sum) else { return nil }
            digests += bytes
        }
        return base64(bytes(hex: SHA256.hex(digests))) + "-\(partSums.count)"
    }

    static func bytes(hex: String) -> [UInt8] {
        var out: [UInt8] = []
        var high: UInt8?
        for c in hex.utf8 {
            let v = c <= 0x39 ? c - 0x30 : c - 0x61 + 10
            if let h = high {
                out.append(h << 4 | v)
                high = nil
            } else {
                high = v
            }
        }
        return out
    }

    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    package static func base64(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        var i = 0
        while i < bytes.count {
            let n = min(3, bytes.count - i)
            let b0 = bytes[i]
            let b1 = n > 1 ? bytes[i + 1] : 0
            let b2 = n > 2 ? bytes[i + 2] : 0
            out.append(alphabet[Int(b0 >> 2)])
            out.append(alphabet[Int((b0 & 0x03) << 4 | b1 >> 4)])
            out.append(n > 1 ? alphabet[Int((b1 & 0x0F) << 2 | b2 >> 6)] : UInt8(ascii: "="))
            out.append(n > 2 ? alphabet[Int(b2 & 0x3F)] : UInt8(ascii: "="))
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func decodeBase64(_ text: String) -> [UInt8]? {
        var values: [UInt8] = []
        for c in text.utf8 where c != UInt8(ascii: "=") {
            guard let v = alphabet.firstIndex(of: c) else { return nil }
            values.append(UInt8(v))
        }
        var out: [UInt8] = []
        var i = 0
        while i + 1 < values.count {
            out.append(values[i] << 2 | values[i + 1] >> 4)
            if i + 2 < values.count { out.append((values[i + 1] & 0x0F) << 4 | values[i + 2] >> 2) }
            if i + 3 < values.count { out.append((values[i + 2] & 0x03) << 6 | values[i + 3]) }
            i += 4
        }
        return out
    }
}
