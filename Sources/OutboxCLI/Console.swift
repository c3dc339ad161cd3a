import Glibc
import OutboxModel
import OutboxRunner

/// Where a call's output goes; tests pass buffers, `main` passes the process's streams.
package final class Console: @unchecked Sendable {
    private let writeOut: (String) -> Void
    private let writeErr: (String) -> Void
    package let stdoutIsTerminal: Bool
    package let stderrIsTerminal: Bool
    /// Up to n bytes of stdin; empty at its end; nil when it cannot be read.
    private let readIn: (Int) -> [UInt8]?
    /// Why output written to stdout was lost (a full disk, a closed descriptor), or nil.
    private let lostOutput: () -> String?
    /// Given a check, a write to a stdout or stderr nobody reads stops waiting once the check holds.
    private let stallBreaker: ((@escaping () -> Bool) -> Void)?

    package init(
        out: @escaping (String) -> Void, err: @escaping (String) -> Void, stdinChunks: @escaping (Int) -> [UInt8]?,
        stdoutIsTerminal: Bool = false, stderrIsTerminal: Bool = false, lostOutput: @escaping () -> String? = { nil },
        stallBreaker: ((@escaping () -> Bool) -> Void)? = nil
    ) {
        self.stallBreaker = stallBreaker
        writeOut = out
        writeErr = err
        readIn = stdinChunks
        self.lostOutput = lostOutput
        self.stdoutIsTerminal = stdoutIsTerminal
        self.stderrIsTerminal = stderrIsTerminal
    }

    /// A console whose stdin is one buffer (tests).
    package convenience init(
        out: @escaping (String) -> Void, err: @escaping (String) -> Void, stdin: @escaping () -> [UInt8],
        stdoutIsTerminal: Bool = false, stderrIsTerminal: Bool = false
    ) {
        final class Cursor: @unchecked Sendable { var bytes: [UInt8]?; var offset = 0 }
        let cursor = Cursor()
        self.init(
            out: out, err: err,
            stdinChunks: { n in
                if cursor.bytes == nil { cursor.bytes = stdin() }
                let bytes = cursor.bytes ?? []
                let end = min(bytes.count, cursor.offset + n)
                defer { cursor.offset = end }
                return Array(bytes[cursor.offset..<end])
            }, stdoutIsTerminal: stdoutIsTerminal, stderrIsTerminal: stderrIsTerminal)
    }

    /// The process's own stdin, stdout and stderr; `stdinClosed`: the process started with
    /// no stdin (its number now holds /dev/null), and reading it fails as EBADF.
    package static func standard(stdinClosed: Bool = false) -> Console {
        // A reader that stopped early (`| head`) is not a failure; anything else losing output is.
        let failure = Locked<String?>(nil)
        let stall = OutputStall()
        return Console(
            out: { text in
                // A stalled reader holds a write no longer than the command goes on; then the rest is dropped.
                let code = stall.write(text, to: 1)
                if code == ETIMEDOUT {
                    failure.withLock { $0 = $0 ?? "its reader stopped reading, and the command was asked to stop" }
                } else if let code, code != EPIPE {
                    failure.withLock { $0 = $0 ?? Errno(code: code).description }
                }
            },
            // The log's reader may stall too (`2> >(...)`): its lines are dropped the same way.
            err: { text in _ = stall.write(text, to: 2) },
            stdinChunks: { n in
                if stdinClosed {
                    errno = EBADF
                    return nil
                }
                return LineReader.readChunk(fd: 0, n)
            },
            stdoutIsTerminal: isatty(1) == 1, stderrIsTerminal: isatty(2) == 1,
            lostOutput: { failure.withLock { $0 } },
            stallBreaker: { giveUp in stall.setGiveUp(giveUp) })
    }

    /// From now on a write to stdout or stderr that finds no room waits only until `giveUp`
    /// holds (a stop request, the end of --max-time); then it and later ones to that stream
    /// are dropped, and lost.
    package func stopWaitingForOutput(when giveUp: @escaping () -> Bool) { stallBreaker?(giveUp) }

    package func out(_ line: String) { writeOut(line + "\n") }
    /// Writes text as is (for streaming a large document in pieces).
    package func write(_ text: String) { writeOut(text) }
    package func err(_ line: String) { writeErr(line + "\n") }
    package func rawErr(_ text: String) { writeErr(text) }
    /// Up to n bytes of stdin (empty at its end, nil when it cannot be read).
    package func stdinChunk(_ n: Int) -> [UInt8]? { readIn(n) }
    /// Why output to stdout was lost, or nil.
    package var outputLost: String? { lostOutput() }

    /// All of stdin, refusing (E_INVALID naming `what`) more than `limit` bytes before reading them;
    /// stdin that cannot be read is E_FILE_MISSING, as for a file.
    package func readStdin(limit: Int, what: String) throws(OutboxError) -> [UInt8] {
        var out: [UInt8] = []
        while true {
            guard let chunk = readIn(min(65_536, limit + 1 - out.count)) else {
                throw .fileMissing("\(what): cannot read stdin: \(Paths.errnoMessage())")
            }
            if chunk.isEmpty { return out }
            out += chunk
            if out.count > limit { throw .invalid("\(what): stdin is over \(Units.formatBytes(Int64(limit)))") }
        }
    }
}

/// Whether a write to stdout or stderr may stop waiting for its reader, and which stream's did.
private final class OutputStall: Sendable {
    private let state = Locked<(giveUp: (() -> Bool)?, stalled: Set<Int32>)>((nil, []))

    func setGiveUp(_ giveUp: @escaping () -> Bool) { state.withLock { $0.giveUp = giveUp } }

    /// Writes to fd 1 or 2; ETIMEDOUT once that stream's reader stalled past `giveUp`.
    func write(_ text: String, to fd: Int32) -> Int32? {
        let (giveUp, stalled) = state.withLock { ($0.giveUp, $0.stalled.contains(fd)) }
        if stalled { return ETIMEDOUT }
        guard let giveUp else { return FileIO.writeAll(fd, text) }
        let code = FileIO.writeAll(fd, text, until: giveUp)
        if code == ETIMEDOUT { state.withLock { _ = $0.stalled.insert(fd) } }
        return code
    }
}

enum FileIO {
    /// Writes all of `text` without blocking for longer than 100 ms at a time: it waits for
    /// room (a pipe whose reader is slow) until `giveUp` holds. The errno of a write that
    /// failed, ETIMEDOUT when it gave up, or nil.
    static func writeAll(_ fd: Int32, _ text: String, until giveUp: () -> Bool) -> Int32? {
        var bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            var ready = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
            let n = poll(&ready, 1, 100)
            if n < 0 && errno != EINTR { return errno }
            if n <= 0 {
                if giveUp() { return ETIMEDOUT }
                continue
            }
            // Room for PIPE_BUF bytes at least: a write of that much does not block.
            let slice = min(bytes.count - offset, Int(PIPE_BUF))
            let written = bytes.withUnsafeMutableBytes { write(fd, $0.baseAddress! + offset, slice) }
            if written < 0 {
                if errno == EINTR || errno == EAGAIN { continue }
                return errno
            }
            offset += written
        }
        return nil
    }

    /// Writes all of `text`; the errno of a write that failed, or nil.
    @discardableResult
    static func writeAll(_ fd: Int32, _ text: String) -> Int32? {
        var bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeMutableBytes { write(fd, $0.baseAddress! + offset, $0.count - offset) }
            if n < 0 {
                if errno == EINTR { continue }
                return errno
            }
            offset += n
        }
        return nil
    }
}

extension Console: EventConsole {}
