import Glibc
import Digest

/// Reading a request: the head, lines, and bodies by their framing, from one buffer.
extension TestHTTPConnection {
    enum HeadResult {
        case head(RequestHead)
        case eof
        case bad(Int, String)
        /// A TLS handshake arrived on this plain port.
        case tls
    }

    /// Reads more bytes into the buffer; false on EOF or error.
    func fill() -> Bool {
        if start == end {
            start = 0
            end = 0
        } else if end == buffer.count {
            let base = buffer.baseAddress!
            memmove(base, base + start, end - start)
            end -= start
            start = 0
        }
        while true {
            let n = recv(fd, buffer.baseAddress! + end, buffer.count - end, 0)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            end += n
            return true
        }
    }

    func readHead() -> HeadResult {
        var scanned = start
        while true {
            // The head ends at an empty line: "\r\n\r\n", or "\n\n" from lenient clients.
            var index = max(scanned, start)
            while index < end {
                if buffer[index] == 10 {
                    let next = index + 1
                    if next < end && buffer[next] == 10 { return parseHead(upTo: next + 1) }
                    if next + 1 < end && buffer[next] == 13 && buffer[next + 1] == 10 { return parseHead(upTo: next + 2) }
                }
                index += 1
            }
            // 0x16: a TLS handshake record (an https:// URL on this port); no HTTP request starts so.
            if end > start && buffer[start] == 0x16 { return .tls }
            scanned = max(start, end - 2)
            if end - start > Self.maxHeadSize { return .bad(431, "request head too large\n") }
            let before = start
            if !fill() { return .eof }
            scanned -= before - start
        }
    }

    func parseHead(upTo headEnd: Int) -> HeadResult {
        let raw = Array(UnsafeRawBufferPointer(rebasing: buffer[start..<headEnd]))
        start = headEnd
        var lines = raw.split(separator: 10, omittingEmptySubsequences: false).map { line -> String in
            let trimmed = line.last == 13 ? line.dropLast() : line[...]
            return String(decoding: trimmed, as: UTF8.self)
        }
        while let first = lines.first, first.isEmpty { lines.removeFirst() }  // stray CRLF between requests
        guard let requestLine = lines.first else { return .bad(400, "empty request\n") }
        let parts = requestLine.split(separator: " ", omittingEmptySubsequences: true)
        guard parts.count == 3, parts[2].hasPrefix("HTTP/") else { return .bad(400, "bad request line\n") }
        var headers: [(String, String)] = []
        for line in lines.dropFirst() where !line.isEmpty {
            guard let colon = line.firstIndex(of: ":") else { return .bad(400, "bad header line\n") }
            let name = String(line[..<colon])
            let value = line[line.index(after: colon)...].trimmingSpaces
            headers.append((name, value))
        }
        return .head(RequestHead(method: String(parts[0]), target: String(parts[1]), version: String(parts[2]), headers: headers))
    }

    /// Reads one line (without its CRLF); nil when the client left or the line is too long.
    func readLine() -> [UInt8]? {
        var index = start
        while true {
            while index < end {
                if buffer[index] == 10 {
                    var line = Array(UnsafeRawBufferPointer(rebasing: buffer[start..<index]))
                    if line.last == 13 { line.removeLast() }
                    start = index + 1
                    return line
                }
                index += 1
            }
            if end - start > Self.maxLineSize { return nil }
            let offset = index - start
            if !fill() { return nil }
            index = start + offset
        }
    }

    /// Moves up to `limit` buffered (or newly received) bytes into the sink; 0 when the client left.
    func consume(upTo limit: Int64, into sink: inout BodySink) -> Int {
        if start == end && !fill() { return 0 }
        let n = Int(min(Int64(end - start), limit))
        sink.take(UnsafeRawBufferPointer(rebasing: buffer[start..<(start + n)]))
        start += n
        return n
    }

    func readExactly(_ count: Int64, into sink: inout BodySink, stopAfter: Int64?) -> BodyResult {
        var remaining = count
        while remaining > 0 {
            var limit = remaining
            if let stopAfter {
                let allowed = stopAfter - sink.size
                if allowed <= 0 { return .stoppedAtLimit }
                limit = min(limit, allowed)
            }
            let n = consume(upTo: limit, into: &sink)
            if n == 0 { return .clientGone }
            remaining -= Int64(n)
        }
        return .complete
    }

    func readBody(_ framing: BodyFraming, into sink: inout BodySink, stopAfter: Int64?) -> BodyResult {
        switch framing {
        case .length(let length):
            return readExactly(length, into: &sink, stopAfter: stopAfter)
        case .chunked:
            while true {
                guard let line = readLine() else { return .clientGone }
                let sizeText = String(decoding: line.prefix { $0 != UInt8(ascii: ";") }, as: UTF8.self).trimmingSpaces
                guard let size = Int64(sizeText, radix: 16), size >= 0 else { return .malformed }
                if size == 0 {
                    // Trailer fields (ignored) up to the empty line.
                    while true {
                        guard let trailer = readLine() else { return .clientGone }
                        if trailer.isEmpty { return .complete }
                    }
                }
                let result = readExactly(size, into: &sink, stopAfter: stopAfter)
                if result != .complete { return result }
                guard let terminator = readLine() else { return .clientGone }
                guard terminator.isEmpty else { return .malformed }
            }
        }
    }
}
