/// The header lines of the final response, kept as the bytes libcurl hands over and
/// parsed only when someone reads them: an outcome nobody will read (a request that
/// succeeded with no hook) never pays for names, values and an index.
///
/// The header callback also sees 1xx and redirect responses, so every status
/// line starts a fresh set.
package struct ResponseHeaders: Sendable {
    /// The final response's header lines, each without its line ending, each ending in LF.
    private var lines: [UInt8] = []
    /// Seen while collecting, so the transfer asks libcurl for the value only when sent.
    private(set) var hasRetryAfter = false
    /// The first Content-Length value, as a number of bytes.
    private var contentLength: Int64?
    /// Why the Content-Length cannot be trusted: two different values, or one that is not a
    /// number of bytes (libcurl 7.88 reads "1e5" as 1 and a value past 2^63 as its largest).
    private(set) var contentLengthProblem: String?
    /// Whether the blank line that ends the last response's headers arrived (a connection
    /// closed inside the headers leaves it false).
    private(set) var ended = false

    init() {}

    /// Headers given as fields (results built by tests and the runner).
    init(fields: [(name: String, value: String)]) {
        for (name, value) in fields { consume("\(name): \(value)") }
    }

    /// Feeds one raw header line (with or without its CRLF).
    mutating func consume(_ raw: UnsafeRawBufferPointer) {
        var end = raw.count
        while end > 0, raw[end - 1] == 0x0A || raw[end - 1] == 0x0D { end -= 1 }
        if end == 0 {
            ended = true
            return
        }
        if raw.starts(with: Self.statusPrefix) {
            ended = false
            lines.removeAll(keepingCapacity: true)
            hasRetryAfter = false
            contentLength = nil
            contentLengthProblem = nil
            return
        }
        if lines.isEmpty { lines.reserveCapacity(512) }
        lines.append(contentsOf: UnsafeRawBufferPointer(rebasing: raw[0..<end]))
        lines.append(0x0A)
        if end > Self.retryAfter.count, raw[Self.retryAfter.count] == 0x3A,
            zip(raw, Self.retryAfter).allSatisfy({ $0 == $1 || (0x41...0x5A).contains($0) && $0 | 0x20 == $1 })
        {
            hasRetryAfter = true
        }
        if end > Self.contentLengthName.count, raw[Self.contentLengthName.count] == 0x3A,
            zip(raw, Self.contentLengthName).allSatisfy({ $0 | 0x20 == $1 })
        {
            let value = Self.trimmed(raw[(Self.contentLengthName.count + 1)..<end])
            if contentLengthProblem == nil {
                if let n = Self.byteCount(value) {
                    if let first = contentLength, first != n {
                        contentLengthProblem = "two different Content-Length values (\(first), \(n))"
                    }
                    if contentLength == nil { contentLength = n }
                } else {
                    contentLengthProblem = "Content-Length \"\(value.prefix(40))\" is not a number of bytes"
                }
            }
        }
    }

    /// Feeds a line given as a string (tests).
    mutating func consume(_ line: String) {
        var copy = Array(line.utf8)
        copy.withUnsafeMutableBytes { consume(UnsafeRawBufferPointer($0)) }
    }

    /// Names lowercased, in order of first appearance; repeats joined with ", ", folded
    /// continuation lines joined with a space to the field of the line they follow; lines
    /// without a colon skipped, with their continuations.
    package var fields: [(name: String, value: String)] {
        var fields: [(name: String, value: String)] = []
        var index: [String: Int] = [:]
        lines.withUnsafeBytes { all in
            var start = 0
            // The field the previous line wrote to, which a folded line continues.
            var previous: Int?
            while start < all.count {
                var end = start
                while all[end] != 0x0A { end += 1 }
                let line = UnsafeRawBufferPointer(rebasing: all[start..<end])
                start = end + 1
                // Lines built from fields may hold line breaks of their own, so empty ones occur.
                guard !line.isEmpty else { previous = nil; continue }
                if line[0] == 0x20 || line[0] == 0x09 {
                    // Obsolete line folding: the line continues the previous value.
                    guard let at = previous else { continue }
                    let more = Self.trimmed(line[...])
                    if !more.isEmpty {
                        fields[at].value += (fields[at].value.isEmpty || fields[at].value.hasSuffix(", ") ? "" : " ") + more
                    }
                    continue
                }
                guard let colon = line.firstIndex(of: 0x3A) else { previous = nil; continue }
                let name = asciiLowercased(String(decoding: UnsafeRawBufferPointer(rebasing: line[0..<colon]), as: UTF8.self))
                let value = Self.trimmed(line[(colon + 1)...])
                if let at = index[name] {
                    fields[at].value += ", " + value
                    previous = at
                } else {
                    index[name] = fields.count
                    previous = fields.count
                    fields.append((name: name, value: value))
                }
            }
        }
        return fields
    }

    /// The value of a header, by lowercase name.
    func value(_ name: String) -> String? {
        fields.first(where: { $0.name == name })?.value
    }

    private static let statusPrefix = Array("HTTP/".utf8)
    private static let retryAfter = Array("retry-after".utf8)
    private static let contentLengthName = Array("content-length".utf8)

    /// A Content-Length value as a number: digits (RFC 9110), or a list of the same number
    /// repeated (which a proxy may have merged); nil for anything else or a number past 2^63.
    static func byteCount(_ value: String) -> Int64? {
        var number: Int64?
        for item in value.split(separator: ",", omittingEmptySubsequences: false) {
            let words = item.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard words.count == 1, words[0].utf8.allSatisfy({ (0x30...0x39).contains($0) }), let n = Int64(words[0]) else { return nil }
            if let number, number != n { return nil }
            number = n
        }
        return number
    }

    private static func trimmed(_ slice: Slice<UnsafeRawBufferPointer>) -> String {
        var lo = slice.startIndex
        var hi = slice.endIndex
        while lo < hi, slice[lo] == 0x20 || slice[lo] == 0x09 { lo += 1 }
        while hi > lo, slice[hi - 1] == 0x20 || slice[hi - 1] == 0x09 { hi -= 1 }
        return String(decoding: UnsafeRawBufferPointer(rebasing: slice.base[lo..<hi]), as: UTF8.self)
    }
}
