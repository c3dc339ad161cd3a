import CSystem
import Glibc

/// A child's output read a line at a time without blocking: complete lines are handed out as
/// they arrive, a line longer than `lineCap` bytes is cut there (its rest dropped), and the
/// last unterminated line is handed out when the stream ends.
struct OutputLines {
    private var fd: Int32
    private let lineCap: Int
    private var partial: [UInt8] = []
    /// Inside a line already cut at `lineCap`: bytes are dropped up to its newline.
    private var cutting = false

    init(fd: Int32, lineCap: Int) {
        self.fd = fd
        self.lineCap = lineCap
    }

    /// Reads what the pipe holds now (at most 64 KiB a call, so a child that writes without
    /// pause cannot hold the caller) and appends the complete lines to `lines`; closes at the end.
    mutating func read(into lines: inout [String]) {
        guard fd >= 0 else { return }
        var buffer = [UInt8](repeating: 0, count: 16_384)
        for _ in 0..<4 {
            let n = buffer.withUnsafeMutableBytes { csystem_proc_read(fd, $0.baseAddress, $0.count) }
            if n > 0 {
                take(buffer[0..<n], into: &lines)
                if n < buffer.count { return }
            } else if n == -Int(EAGAIN) {
                return
            } else {
                // The end (or an error, which ends it too).
                close(into: &lines)
                return
            }
        }
    }

    /// Closes the stream without reading more (a grandchild may hold its other end forever);
    /// the last line counts without its newline.
    mutating func close(into lines: inout [String]) {
        guard fd >= 0 else { return }
        csystem_proc_close(fd)
        fd = -1
        if !partial.isEmpty { lines.append(String(decoding: partial, as: UTF8.self)) }
        partial = []
    }

    private mutating func take(_ bytes: ArraySlice<UInt8>, into lines: inout [String]) {
        var rest = bytes
        while !rest.isEmpty {
            let newline = rest.firstIndex(of: 0x0A)
            let piece = rest[rest.startIndex..<(newline ?? rest.endIndex)]
            if !cutting {
                let room = lineCap - partial.count
                partial += piece.prefix(room)
                if piece.count > room {
                    // Over the cap: what fits is the line; the rest of it up to its newline is dropped.
                    lines.append(String(decoding: partial, as: UTF8.self) + " [...]")
                    partial = []
                    cutting = newline == nil
                } else if newline != nil {
                    lines.append(String(decoding: partial, as: UTF8.self))
                    partial = []
                }
            } else if newline != nil {
                cutting = false
            }
            guard let newline else { break }
            rest = rest[(newline + 1)...]
        }
    }
}
