/// Parsing and printing of the durations and sizes used in config, definitions and commands.
///
/// Durations are integer amounts with a unit (`500ms`, `30s`, `10m`, `2h`, `14d`, or a bare
/// `0`); sizes are bytes, or an amount with `B`, `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024)
/// or `KB`, `MB`, `GB`, `TB` (powers of 1000). One space may separate amount and unit.
/// Units are case-sensitive: `8mb` is rejected rather than guessed (bits or bytes?).
package enum Units {
    private static let durationUnits: [(String, Int64)] = [
        ("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000),
    ]
    private static let sizeUnits: [(String, Int64)] = [
        ("B", 1),
        ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40),
        ("KB", 1_000), ("MB", 1_000_000), ("GB", 1_000_000_000), ("TB", 1_000_000_000_000),
    ]

    /// Parses a duration such as `500ms`, `30s`, `10m`, `2h`, `14d` or `0` into milliseconds.
    package static func parseDuration(_ text: String) throws(OutboxError) -> Int64 {
        let hint = "use 500ms, 30s, 10m, 2h or 14d"
        guard let split = splitAmount(text) else {
            throw .invalid("bad duration \(quoted(text)) (\(hint))")
        }
        let factor: Int64
        if split.unit.isEmpty {
            // A bare number is ambiguous (seconds? ms?), except zero.
            guard split.amount == 0 else {
                throw .invalid("bad duration \(quoted(text)) (a unit is required: \(hint))")
            }
            factor = 1
        } else if let found = durationUnits.first(where: { $0.0 == split.unit }) {
            factor = found.1
        } else {
            throw .invalid("bad duration \(quoted(text)) (\(hint))")
        }
        guard let amount = split.amount else { throw .invalid("duration \(quoted(text)) is over 100 years") }
        let (ms, overflow) = amount.multipliedReportingOverflow(by: factor)
        // Times are milliseconds since 1970 in an Int64: a bound here keeps every `now + d` exact.
        guard !overflow, ms <= maxDurationMs else { throw .invalid("duration \(quoted(text)) is over 100 years") }
        return ms
    }

    /// The longest duration accepted anywhere (100 years).
    package static let maxDurationMs: Int64 = 100 * 366 * 86_400_000

    /// Parses a size: plain bytes, or an amount with `B`, `KiB`, `MiB`, `GiB`, `TiB`, `KB`, `MB`, `GB`, `TB`.
    package static func parseSize(_ text: String) throws(OutboxError) -> Int64 {
        let hint = "use bytes, or KiB, MiB, GiB, TiB, e.g. 8MiB"
        guard let split = splitAmount(text) else {
            throw .invalid("bad size \(quoted(text)) (\(hint))")
        }
        let factor: Int64
        if split.unit.isEmpty {
            factor = 1
        } else if let found = sizeUnits.first(where: { $0.0 == split.unit }) {
            factor = found.1
        } else {
            throw .invalid("bad size \(quoted(text)) (\(hint))")
        }
        guard let amount = split.amount else { throw .invalid("size \(quoted(text)) is too large") }
        let (bytes, overflow) = amount.multipliedReportingOverflow(by: factor)
        guard !overflow else { throw .invalid("size \(quoted(text)) is too large") }
        return bytes
    }

    /// A byte count for people: `512 B`, `1.5 MiB`, `20 MiB` (one decimal, dropped when zero).
    package static func formatBytes(_ n: Int64) -> String {
        let sign = n < 0 ? "-" : ""
        let magnitude = n.magnitude
        let names = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
        if magnitude < 1024 { return "\(sign)\(magnitude) B" }
        var index = 1
        while index + 1 < names.count && magnitude >= UInt64(1) << UInt64(10 * (index + 1)) {
            index += 1
        }
        var unit = UInt64(1) << UInt64(10 * index)
        var whole = magnitude / unit
        // Round to tenths with integers: remainder·10 stays far below UInt64's range.
        var tenths = (magnitude % unit * 10 + unit / 2) / unit
        if tenths == 10 { whole += 1; tenths = 0 }
        if whole == 1024 && index + 1 < names.count {
            // 1023.96 KiB rounds to 1024 KiB: say 1 MiB instead.
            index += 1; unit <<= 10; whole = 1; tenths = 0
        }
        let number = tenths == 0 ? "\(whole)" : "\(whole).\(tenths)"
        return "\(sign)\(number) \(names[index])"
    }

    /// A duration for people: `850ms`, `1.5s`, `30s`, `2h 5m`, `3d 4h` (two largest units, truncated).
    package static func formatDuration(ms: Int64) -> String {
        let sign = ms < 0 ? "-" : ""
        let total = ms.magnitude
        if total < 1000 { return "\(sign)\(total)ms" }
        if total < 60_000 {
            let tenths = total % 1000 / 100
            return tenths == 0 ? "\(sign)\(total / 1000)s" : "\(sign)\(total / 1000).\(tenths)s"
        }
        let steps: [(String, UInt64)] = [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)]
        let first = steps.firstIndex { total >= $0.1 }!
        let (bigName, bigSize) = steps[first]
        var out = "\(sign)\(total / bigSize)\(bigName)"
        if first + 1 < steps.count {
            let (smallName, smallSize) = steps[first + 1]
            let small = total % bigSize / smallSize
            if small > 0 { out += " \(small)\(smallName)" }
        }
        return out
    }

    /// A whole number written as plain digits (`5`, not `+5`, `05` or `0x5`), within `range`; nil otherwise.
    package static func wholeNumber(_ text: String, in range: ClosedRange<Int>) -> Int? {
        let digits = text.utf8
        guard let first = digits.first, digits.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), first != 0x30 || digits.count == 1,
            let n = Int(text), range.contains(n)
        else { return nil }
        return n
    }

    /// Splits `<digits>[ ]<unit>`; nil when the amount is missing or signed. An amount
    /// past Int64 comes back as nil in `.0` so callers can say "too large".
    private static func splitAmount(_ text: String) -> (amount: Int64?, unit: String)? {
        let bytes = Array(text.utf8)
        var amount: Int64? = 0
        var index = 0
        while index < bytes.count, bytes[index] >= 0x30, bytes[index] <= 0x39 {
            if let value = amount {
                let (times10, o1) = value.multipliedReportingOverflow(by: 10)
                let (sum, o2) = times10.addingReportingOverflow(Int64(bytes[index] - 0x30))
                amount = o1 || o2 ? nil : sum
            }
            index += 1
        }
        guard index > 0 else { return nil }
        if index < bytes.count && bytes[index] == 0x20 {
            index += 1
            // "8 " with nothing after the space is not a size.
            if index == bytes.count { return nil }
        }
        return (amount, String(decoding: bytes[index...], as: UTF8.self))
    }

    /// The text in quotes for an error message, cut short when long.
    package static func quoted(_ text: some StringProtocol, limit: Int = 40) -> String {
        var shown = ""
        var count = 0
        for scalar in text.unicodeScalars {
            if count == limit { shown += "…"; break }
            switch scalar {
            case "\"": shown += "\\\""
            case "\\": shown += "\\\\"
            // Escaped as in JSON, which is how the value was most likely given.
            case "\n": shown += "\\n"
            case "\t": shown += "\\t"
            case "\r": shown += "\\r"
            case _ where scalar.value < 0x20 || scalar.value == 0x7F:
                let hex = String(scalar.value, radix: 16)
                shown += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: shown.unicodeScalars.append(scalar)
            }
            count += 1
        }
        return "\"" + shown + "\""
    }
}

extension Units {
    /// Epoch milliseconds as RFC 3339 in UTC with milliseconds: `2026-12-01T08:00:00.123Z`.
    package static func rfc3339(ms: Int64) -> String {
        let seconds = ms >= 0 ? ms / 1000 : (ms - 999) / 1000
        let millis = ms - seconds * 1000
        var days = seconds >= 0 ? seconds / 86_400 : (seconds - 86_399) / 86_400
        let secondOfDay = seconds - days * 86_400
        // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
        days += 719_468
        let era = (days >= 0 ? days : days - 146_096) / 146_097
        let dayOfEra = days - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        func two(_ n: Int64) -> String { n < 10 ? "0\(n)" : "\(n)" }
        let milli = millis < 10 ? "00\(millis)" : millis < 100 ? "0\(millis)" : "\(millis)"
        return
            "\(year)-\(two(month))-\(two(day))T\(two(secondOfDay / 3600)):\(two(secondOfDay / 60 % 60)):\(two(secondOfDay % 60)).\(milli)Z"
    }
}
