import Glibc
import OutboxModel

extension String {
    func trimmingCharacters(in set: String) -> String {
        let chars = Set(set)
        var s = Substring(self)
        while let c = s.first, chars.contains(c) { s.removeFirst() }
        while let c = s.last, chars.contains(c) { s.removeLast() }
        return String(s)
    }
}

/// Times on the command line: epoch milliseconds, or RFC 3339 (`2026-11-30T08:00:00Z`).
enum TimeText {
    /// 9999-12-31T23:59:59.999Z: later times (and times before 1970) are typing mistakes, and
    /// bounding them keeps every difference with now exact.
    static let latestMs = Identifiers.recordableMs.upperBound

    static func parse(_ text: String, field: String) throws(OutboxError) -> Int64 {
        let ms = try parseUnbounded(text, field: field)
        guard (0...latestMs).contains(ms) else {
            throw .invalid("\(field): \(Units.quoted(text, limit: 40)) is out of range (from 1970 to the end of year 9999)")
        }
        return ms
    }

    private static func parseUnbounded(_ text: String, field: String) throws(OutboxError) -> Int64 {
        if let ms = Int64(text) { return ms }
        // Epoch milliseconds beyond 64 bits are a time too, and out of range.
        let number = text.utf8.dropFirst(text.hasPrefix("-") || text.hasPrefix("+") ? 1 : 0)
        if !number.isEmpty, number.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) { return text.hasPrefix("-") ? .min : .max }
        let b = Array(text.utf8)
        func num(_ from: Int, _ count: Int) -> Int64? {
            guard from + count <= b.count else { return nil }
            var v: Int64 = 0
            for c in b[from..<(from + count)] {
                guard c >= 0x30 && c <= 0x39 else { return nil }
                v = v * 10 + Int64(c - 0x30)
            }
            return v
        }
        guard b.count >= 20, let y = num(0, 4), b[4] == 0x2D, let mo = num(5, 2), b[7] == 0x2D, let d = num(8, 2),
            b[10] == 0x54 || b[10] == 0x74 || b[10] == 0x20, let h = num(11, 2), b[13] == 0x3A, let mi = num(14, 2),
            b[16] == 0x3A, let s = num(17, 2), (1...12).contains(mo), (1...31).contains(d), h < 24, mi < 60, s < 61
        else {
            throw .invalid("\(field): \(Units.quoted(text, limit: 40)) is not a time (use RFC 3339 like 2026-11-30T08:00:00Z, or epoch ms)")
        }
        // A day the month does not have (2026-02-30) is a mistake, not the 2nd of March.
        let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
        let monthDays: [Int64] = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        guard d <= monthDays[Int(mo) - 1] else {
            throw .invalid(
                "\(field): \(Units.quoted(text, limit: 40)) is not a time (\(String(String(text.utf8.prefix(7))!)) has \(monthDays[Int(mo) - 1]) days)"
            )
        }
        var i = 19
        var ms: Int64 = 0
        if i < b.count, b[i] == 0x2E {
            i += 1
            var digits = 0
            while i < b.count, b[i] >= 0x30, b[i] <= 0x39 {
                if digits < 3 { ms = ms * 10 + Int64(b[i] - 0x30) }
                digits += 1
                i += 1
            }
            // RFC 3339 has a digit at least after the dot.
            guard digits > 0 else { throw .invalid("\(field): \(Units.quoted(text, limit: 40)) is not a time (no digit after the dot)") }
            while digits < 3 { ms *= 10; digits += 1 }
        }
        var offset: Int64 = 0
        if i < b.count, b[i] == 0x5A || b[i] == 0x7A {
            i += 1
        } else if i + 6 == b.count, b[i] == 0x2B || b[i] == 0x2D, let oh = num(i + 1, 2), b[i + 3] == 0x3A, let om = num(i + 4, 2) {
            guard oh < 24, om < 60 else {
                throw .invalid("\(field): \(Units.quoted(text, limit: 40)) is not a time (its offset is past ±23:59)")
            }
            offset = (oh * 60 + om) * 60_000 * (b[i] == 0x2B ? 1 : -1)
            i += 6
        } else {
            throw .invalid("\(field): \(Units.quoted(text, limit: 40)) needs a time zone (Z or +HH:MM)")
        }
        guard i == b.count else { throw .invalid("\(field): \(Units.quoted(text, limit: 40)) is not a time") }
        // Second 60 is a leap second, which comes at 23:59 UTC alone: elsewhere it is a
        // mistake, not the next minute.
        if s == 60, ((h * 60 + mi - offset / 60_000) % 1440 + 1440) % 1440 != 1439 {
            throw .invalid("\(field): \(Units.quoted(text, limit: 40)) is not a time (second 60 is a leap second, at 23:59:60 UTC only)")
        }
        // Days from the civil date (Howard Hinnant's algorithm).
        let yy = mo <= 2 ? y - 1 : y
        let era = (yy >= 0 ? yy : yy - 399) / 400
        let yoe = yy - era * 400
        let doy = (153 * (mo + (mo > 2 ? -3 : 9)) + 2) / 5 + d - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146_097 + doe - 719_468
        return ((days * 24 + h) * 60 + mi) * 60_000 + s * 1000 + ms - offset
    }
}
