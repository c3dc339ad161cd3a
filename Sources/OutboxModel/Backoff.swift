/// How long to wait between failed attempts: exponential from `baseMs` up to `maxMs`, with jitter.
package struct BackoffPolicy: Sendable, Equatable {
    package var baseMs: Int64
    package var maxMs: Int64
    /// Fraction of the delay to spread randomly either way (0.2 = ±20%).
    package var jitter: Double

    package init(baseMs: Int64 = 1000, maxMs: Int64 = 7_200_000, jitter: Double = 0.2) {
        self.baseMs = baseMs
        self.maxMs = maxMs
        self.jitter = jitter
    }
}

/// When to try again after a failure; pure, with the random value supplied by the caller.
package enum Backoff {
    /// Delay in ms after the n-th failure (n ≥ 1): base·2^(n−1) capped at max, times a factor in [1−jitter, 1+jitter].
    ///
    /// `random` in [0, 1) picks the factor (0 → 1−jitter, 0.5 → 1, →1 → 1+jitter).
    /// Out-of-range inputs are clamped rather than trusted: n < 1 counts as 1, jitter to
    /// [0, 1], random to [0, 1], negative base or max to 0. The result lies in
    /// [0, max·(1+jitter)].
    package static func delay(failures n: Int, policy: BackoffPolicy, random: Double) -> Int64 {
        let base = Swift.max(0, policy.baseMs)
        let cap = Swift.max(0, policy.maxMs)
        let exponent = Swift.max(1, n) - 1
        // base·2^e > cap  ⇔  base > cap >> e: decided without ever computing the power.
        let raw: Int64
        if base == 0 {
            raw = 0
        } else if exponent >= 63 || base > cap >> Int64(exponent) {
            raw = cap
        } else {
            raw = base << Int64(exponent)
        }
        let jitter = clamp(policy.jitter.isNaN ? 0 : policy.jitter, 0, 1)
        let r = clamp(random.isNaN ? 0.5 : random, 0, 1)
        let factor = 1 - jitter + 2 * jitter * r
        let upper = Double(cap) * (1 + jitter)
        let value = clamp((Double(raw) * factor).rounded(), 0, upper)
        return value >= 9.2e18 ? Int64.max : Int64(value)
    }

    /// The epoch-ms time of the next attempt: now + backoff, or now + Retry-After when the server gave one, never past expiry.
    ///
    /// A Retry-After replaces the computed backoff (clamped to [0, maxMs], no jitter: the
    /// server said when). A time past `expiresAt` becomes `expiresAt`, so the expiry
    /// check settles the entry then instead of it waiting beyond its life.
    /// `retryAfterDate` (epoch ms, from an HTTP-date) wins over `retryAfterSeconds`: the wait
    /// is measured from `now`, so time spent between the response and this call is not added.
    package static func nextAttemptAt(
        now: Int64, failures: Int, policy: BackoffPolicy, retryAfterSeconds: Int64?, retryAfterDate: Int64? = nil,
        expiresAt: Int64?, random: Double
    ) -> Int64 {
        let wait: Int64
        if let seconds = retryAfterDate.map({ secondsUntil($0, from: now) }) ?? retryAfterSeconds {
            let (ms, overflow) = Swift.max(0, seconds).multipliedReportingOverflow(by: 1000)
            // Floored at the base: "Retry-After: 0" from a struggling server is no reason to hammer it.
            wait = Swift.min(Swift.max(overflow ? Int64.max : ms, policy.baseMs), Swift.max(0, policy.maxMs))
        } else {
            wait = delay(failures: failures, policy: policy, random: random)
        }
        let (sum, overflow) = now.addingReportingOverflow(wait)
        let at = overflow ? Int64.max : sum
        if let expiresAt, at > expiresAt { return expiresAt }
        return at
    }

    /// Seconds to wait from a `Retry-After` value: delta-seconds or an HTTP-date; nil when unreadable.
    ///
    /// Dates may be IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), RFC 850
    /// (`Sunday, 06-Nov-94 08:49:37 GMT`) or asctime (`Sun Nov  6 08:49:37 1994`); a date
    /// in the past gives 0; a partial second rounds up. `now` is epoch ms.
    package static func parseRetryAfter(_ value: String, now: Int64) -> Int64? {
        let bytes = trimmedBlanks(value)
        guard !bytes.isEmpty else { return nil }
        if bytes.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) {
            var seconds: Int64 = 0
            for b in bytes {
                let (t, o1) = seconds.multipliedReportingOverflow(by: 10)
                let (s, o2) = t.addingReportingOverflow(Int64(b - 0x30))
                // A huge delta is still a valid "later"; the caller clamps it to max.
                if o1 || o2 { return Int64.max }
                seconds = s
            }
            return seconds
        }
        guard let dateMs = retryAfterDate(value, now: now) else { return nil }
        // A date beyond 64-bit milliseconds.
        if dateMs == Int64.max { return Int64.max / 1000 }
        return secondsUntil(dateMs, from: now)
    }

    /// The time (epoch ms) a `Retry-After` HTTP-date names (Int64.max or .min beyond 64 bits);
    /// nil for delta-seconds or an unreadable value.
    package static func retryAfterDate(_ value: String, now: Int64) -> Int64? {
        let bytes = trimmedBlanks(value)
        guard !bytes.isEmpty, !bytes.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
        guard let epochSeconds = RetryAfterDate.parse(String(decoding: bytes, as: UTF8.self), now: now) else { return nil }
        let (dateMs, overflow) = epochSeconds.multipliedReportingOverflow(by: 1000)
        if overflow { return epochSeconds > 0 ? Int64.max : Int64.min }
        return dateMs
    }

    /// The header value without leading and trailing spaces and tabs.
    private static func trimmedBlanks(_ value: String) -> ArraySlice<UInt8> {
        let bytes = Array(value.utf8)
        let start = bytes.firstIndex { $0 != 0x20 && $0 != 0x09 } ?? bytes.count
        let end = bytes.lastIndex { $0 != 0x20 && $0 != 0x09 }.map { $0 + 1 } ?? start
        return bytes[start..<max(start, end)]
    }

    /// Whole seconds from `now` to `dateMs`, a partial second rounded up; 0 for the past.
    static func secondsUntil(_ dateMs: Int64, from now: Int64) -> Int64 {
        let diff = dateMs.subtractingReportingOverflow(now)
        if diff.overflow { return now < 0 ? Int64.max / 1000 : 0 }
        if diff.partialValue <= 0 { return 0 }
        return diff.partialValue / 1000 + (diff.partialValue % 1000 == 0 ? 0 : 1)
    }

    private static func clamp(_ x: Double, _ lo: Double, _ hi: Double) -> Double {
        Swift.min(Swift.max(x, lo), hi)
    }
}

/// Whether an entry has outlived its `expires_in`.
package enum Expiry {
    /// Expired when `expiresAt` is set and `now >= expiresAt`, but never while `now < createdAt`.
    ///
    /// Devices boot with a wrong clock; a clock behind the entry's creation time cannot be
    /// trusted, and expiring then would fail whole queues after an NTP jump.
    package static func isExpired(now: Int64, createdAt: Int64, expiresAt: Int64?) -> Bool {
        if now < createdAt { return false }
        guard let expiresAt else { return false }
        return now >= expiresAt
    }
}

/// HTTP-date parsing (RFC 9110 §5.6.7) without Foundation; UTC only.
enum RetryAfterDate {
    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    private static let shortDays = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    private static let longDays = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

    /// Epoch seconds of an IMF-fixdate, RFC 850 or asctime date; nil when malformed.
    static func parse(_ text: String, now: Int64) -> Int64? {
        let words = text.split(separator: " ", omittingEmptySubsequences: true)
        guard let first = words.first else { return nil }
        if first.hasSuffix(",") {
            let dayName = String(first.dropLast())
            if words.count == 6 {
                // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
                guard shortDays.contains(dayName), words[5] == "GMT",
                    let day = number(words[1], digits: 1...2),
                    let month = month(words[2]),
                    let year = number(words[3], digits: 4...4),
                    let time = clock(words[4])
                else { return nil }
                return epoch(year: year, month: month, day: day, time: time)
            }
            if words.count == 4 {
                // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT
                let parts = words[1].split(separator: "-", omittingEmptySubsequences: false)
                guard longDays.contains(dayName), words[3] == "GMT", parts.count == 3,
                    let day = number(parts[0], digits: 1...2),
                    let month = month(parts[1]),
                    let yy = number(parts[2], digits: 2...2),
                    let time = clock(words[2])
                else { return nil }
                return epoch(year: fullYear(twoDigit: yy, now: now), month: month, day: day, time: time)
            }
            return nil
        }
        // asctime: Sun Nov  6 08:49:37 1994
        guard words.count == 5, shortDays.contains(String(first)),
            let month = month(words[1]),
            let day = number(words[2], digits: 1...2),
            let time = clock(words[3]),
            let year = number(words[4], digits: 4...4)
        else { return nil }
        return epoch(year: year, month: month, day: day, time: time)
    }

    /// RFC 9110: a two-digit year more than 50 years ahead means the previous century.
    private static func fullYear(twoDigit yy: Int64, now: Int64) -> Int64 {
        let currentYear = yearOf(days: floorDiv(now, 86_400_000))
        var year = currentYear - currentYear % 100 + yy
        if year > currentYear + 50 { year -= 100 }
        return year
    }

    private static func epoch(year: Int64, month: Int64, day: Int64, time: (Int64, Int64, Int64)) -> Int64? {
        guard day >= 1 && day <= daysIn(month: month, year: year) else { return nil }
        return daysFromCivil(year: year, month: month, day: day) * 86_400 + time.0 * 3600 + time.1 * 60 + time.2
    }

    private static func daysIn(month: Int64, year: Int64) -> Int64 {
        switch month {
        case 2: return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
    static func daysFromCivil(year: Int64, month: Int64, day: Int64) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = floorDiv(y, 400)
        let yoe = y - era * 400
        let doy = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }

    /// The year containing a day counted from 1970-01-01 (inverse of `daysFromCivil`).
    static func yearOf(days: Int64) -> Int64 {
        let z = days + 719_468
        let era = floorDiv(z, 146_097)
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let month = mp < 10 ? mp + 3 : mp - 9
        return yoe + era * 400 + (month <= 2 ? 1 : 0)
    }

    private static func floorDiv(_ a: Int64, _ b: Int64) -> Int64 {
        a >= 0 ? a / b : -((-a + b - 1) / b)
    }

    private static func month(_ word: Substring) -> Int64? {
        months.firstIndex(of: String(word)).map { Int64($0 + 1) }
    }

    /// `HH:MM:SS`; a leap second (60) is allowed as RFC 9110 permits it.
    private static func clock(_ word: Substring) -> (Int64, Int64, Int64)? {
        let parts = word.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 3,
            let h = number(parts[0], digits: 2...2), h <= 23,
            let m = number(parts[1], digits: 2...2), m <= 59,
            let s = number(parts[2], digits: 2...2), s <= 60
        else { return nil }
        return (h, m, s)
    }

    private static func number(_ word: Substring, digits: ClosedRange<Int>) -> Int64? {
        guard digits.contains(word.utf8.count) else { return nil }
        var value: Int64 = 0
        for b in word.utf8 {
            guard b >= 0x30 && b <= 0x39 else { return nil }
            value = value * 10 + Int64(b - 0x30)
        }
        return value
    }
}
