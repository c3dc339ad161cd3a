@testable import OutboxHTTP
@testable import OutboxModel

/// Response header parsing and Retry-After: the input is fed as header lines, either as
/// libcurl hands them over (split after each LF) or as arbitrary pieces (split at NUL,
/// as headers built from fields may be); the Retry-After value is parsed at fixed clocks.
enum FuzzHeaders {
    static func run(_ input: UnsafeBufferPointer<UInt8>) {
        guard let mode = input.first else { return }
        let rest = UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: input[1...]))
        var headers = ResponseHeaders()
        var start = 0
        let separator: UInt8 = mode & 1 == 0 ? 0x0A : 0x00
        for i in 0..<rest.count where rest[i] == separator {
            // libcurl keeps the LF on the line; a NUL separator is dropped.
            let end = separator == 0x0A ? i + 1 : i
            headers.consume(UnsafeRawBufferPointer(rebasing: rest[start..<end]))
            start = i + 1
        }
        if start < rest.count { headers.consume(UnsafeRawBufferPointer(rebasing: rest[start...])) }
        let fields = headers.fields
        if headers.hasRetryAfter, headers.value("retry-after") == nil { fatalError("hasRetryAfter without a retry-after field") }
        // Fields without line breaks (and values not ending in a blank, as repeats of an empty
        // value join to ", ") read back the same when fed again.
        if !fields.contains(where: { $0.name.utf8.contains(where: isBreak) || !isPlain($0.value) }) {
            let again = ResponseHeaders(fields: fields).fields
            if !again.elementsEqual(fields, by: { $0.name == $1.name && $0.value == $1.value }) {
                fatalError("header fields do not read back the same: \(fields) then \(again)")
            }
        }
        let value = headers.value("retry-after") ?? String(decoding: rest, as: UTF8.self)
        for now in clocks {
            guard let seconds = Backoff.parseRetryAfter(value, now: now) else { continue }
            if seconds < 0 { fatalError("Retry-After \(value) gave \(seconds) s") }
        }
    }

    private static func isBreak(_ byte: UInt8) -> Bool { byte == 0x0A || byte == 0x0D }

    private static func isPlain(_ value: String) -> Bool {
        let blank: (UInt8) -> Bool = { $0 == 0x20 || $0 == 0x09 }
        return !value.utf8.contains(where: isBreak) && !(value.utf8.first.map(blank) ?? false) && !(value.utf8.last.map(blank) ?? false)
    }

    /// 1970, 2026-12-01, 2069 (two-digit years turn the century) and 9999-12-31.
    private static let clocks: [Int64] = [0, 1_796_083_200_000, 3_155_760_000_000, 253_402_300_799_000]
}
