import CSystem
import Glibc

/// Reads lines from a byte source with a cap on each line, so memory stays flat however
/// long the input is (`enqueue --from /dev/zero` fails on its first line, it does not
/// exhaust memory).
package struct LineReader {
    package enum Failure: Error, Equatable {
        /// Line `line` is longer than the cap (it was not read to its end).
        case tooLong(line: Int)
        /// The source could not be read (errno).
        case readFailed(Int32)
        /// The file ended before the size it had when it was opened (it was cut while read).
        case shrank(from: Int64, to: Int64)
    }

    /// Up to `n` bytes; empty at the end; nil (errno set) when the read failed.
    private let read: (Int) -> [UInt8]?
    private let maxLineBytes: Int
    private var buffer: [UInt8] = []
    private var start = 0
    private var atEnd = false
    /// The bytes the source must hold (a file's size when opened), and those read so far.
    private var expected: Int64?
    private var got: Int64 = 0
    /// The number of the line `next()` returned last (1-based; empty lines count).
    package private(set) var lineNumber = 0

    package init(maxLineBytes: Int, read: @escaping (Int) -> [UInt8]?) {
        self.maxLineBytes = maxLineBytes
        self.read = read
    }

    /// Reads a file descriptor, no more than `limit` bytes in all (a file that grows while
    /// it is read ends where it ended when it was opened).
    /// Given a limit, the file must hold that much: one cut shorter while read is refused.
    package init(fd: Int32, maxLineBytes: Int, limit: Int64 = .max) {
        var left = limit
        self.init(maxLineBytes: maxLineBytes) { n in
            guard left > 0 else { return [] }
            let chunk = Self.readChunk(fd: fd, Int(min(Int64(n), left)))
            left -= Int64(chunk?.count ?? 0)
            return chunk
        }
        expected = limit == .max ? nil : limit
    }

    /// Up to `n` bytes of `fd` (EINTR retried); empty at the end; nil on an error (errno set).
    package static func readChunk(fd: Int32, _ n: Int) -> [UInt8]? {
        var chunk = [UInt8](repeating: 0, count: max(1, n))
        while true {
            let got = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            // A stop noted while a command undoes its work (not retried: no more input is waited for).
            if got < 0 && errno == EINTR && csystem_stop_pending() == 0 { continue }
            guard got >= 0 else { return nil }
            chunk.removeLast(chunk.count - got)
            return chunk
        }
    }

    /// The next line without its newline, or nil at the end.
    package mutating func next() throws(Failure) -> [UInt8]? {
        var searched = start
        while true {
            if let newline = buffer[searched...].firstIndex(of: 0x0A) {
                if newline - start > maxLineBytes { throw .tooLong(line: lineNumber + 1) }
                let line = Array(buffer[start..<newline])
                start = newline + 1
                lineNumber += 1
                return line
            }
            if buffer.count - start > maxLineBytes { throw .tooLong(line: lineNumber + 1) }
            if atEnd {
                guard start < buffer.count else { return nil }
                if buffer.count - start > maxLineBytes { throw .tooLong(line: lineNumber + 1) }
                let line = Array(buffer[start...])
                start = buffer.count
                lineNumber += 1
                return line
            }
            if start > 0 {
                buffer.removeFirst(start)
                start = 0
            }
            searched = buffer.count
            guard let chunk = read(65_536) else { throw .readFailed(errno) }
            got += Int64(chunk.count)
            if chunk.isEmpty, let expected, got < expected { throw .shrank(from: expected, to: got) }
            if chunk.isEmpty { atEnd = true } else { buffer += chunk }
        }
    }
}
