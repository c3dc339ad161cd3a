import OutboxModel
import Testing

struct BackoffTests {
    struct DelayCase: Sendable, CustomTestStringConvertible {
        let name: String
        let failures: Int
        var policy = BackoffPolicy()
        let random: Double
        let expected: Int64
        var testDescription: String { name }
    }

    static let delays: [DelayCase] = [
        DelayCase(name: "first failure, middle random", failures: 1, random: 0.5, expected: 1000),
        DelayCase(name: "first failure, lowest random", failures: 1, random: 0, expected: 800),
        DelayCase(name: "first failure, highest random", failures: 1, random: 0.999_999_9, expected: 1200),
        DelayCase(name: "second failure doubles", failures: 2, random: 0.5, expected: 2000),
        DelayCase(name: "third failure", failures: 3, random: 0.5, expected: 4000),
        DelayCase(name: "13th failure below the cap", failures: 13, random: 0.5, expected: 4_096_000),
        DelayCase(name: "14th failure hits the cap", failures: 14, random: 0.5, expected: 7_200_000),
        DelayCase(name: "capped, lowest random", failures: 14, random: 0, expected: 5_760_000),
        DelayCase(name: "capped, highest random", failures: 20, random: 0.999_999, expected: 8_639_997),
        DelayCase(name: "10,000 failures", failures: 10_000, random: 0.5, expected: 7_200_000),
        DelayCase(name: "Int.max failures", failures: Int.max, random: 0.5, expected: 7_200_000),
        DelayCase(name: "zero failures count as one", failures: 0, random: 0.5, expected: 1000),
        DelayCase(name: "negative failures count as one", failures: -3, random: 0.5, expected: 1000),
        DelayCase(
            name: "no jitter ignores random", failures: 2, policy: BackoffPolicy(jitter: 0), random: 0.9,
            expected: 2000),
        DelayCase(name: "zero base", failures: 5, policy: BackoffPolicy(baseMs: 0), random: 0.5, expected: 0),
        DelayCase(name: "zero max", failures: 5, policy: BackoffPolicy(maxMs: 0), random: 0.9, expected: 0),
        DelayCase(
            name: "base above max is capped", failures: 1, policy: BackoffPolicy(baseMs: 5000, maxMs: 3000, jitter: 0),
            random: 0.5, expected: 3000),
        DelayCase(
            name: "negative jitter counts as none", failures: 1, policy: BackoffPolicy(jitter: -0.5), random: 0,
            expected: 1000),
        DelayCase(name: "jitter above 1 counts as 1", failures: 1, policy: BackoffPolicy(jitter: 3), random: 0, expected: 0),
        DelayCase(name: "random above 1 counts as 1", failures: 1, random: 7, expected: 1200),
        DelayCase(name: "negative random counts as 0", failures: 1, random: -1, expected: 800),
        DelayCase(name: "NaN random counts as the middle", failures: 1, random: .nan, expected: 1000),
        DelayCase(
            name: "huge max does not overflow", failures: 200,
            policy: BackoffPolicy(baseMs: 1000, maxMs: Int64.max, jitter: 0.2), random: 0.999, expected: Int64.max),
        DelayCase(
            name: "shift just below the cap", failures: 53,
            policy: BackoffPolicy(baseMs: 1, maxMs: Int64.max, jitter: 0), random: 0.5, expected: 1 << 52),
    ]

    @Test(arguments: delays)
    func delay(_ c: DelayCase) {
        #expect(Backoff.delay(failures: c.failures, policy: c.policy, random: c.random) == c.expected)
    }

    @Test func delayStaysWithinBoundsForEveryFailureCount() {
        let policy = BackoffPolicy()
        for n in 1...10_000 {
            for r in [0.0, 0.25, 0.5, 0.75, 0.999_999] {
                let d = Backoff.delay(failures: n, policy: policy, random: r)
                #expect(d >= 0 && d <= 8_640_000, "n=\(n) r=\(r)")
                if d < 0 || d > 8_640_000 { return }
            }
        }
    }

    struct NextCase: Sendable, CustomTestStringConvertible {
        let name: String
        var now: Int64 = 1_000_000
        var failures = 1
        var retryAfter: Int64? = nil
        var expiresAt: Int64? = nil
        var random = 0.5
        let expected: Int64
        var testDescription: String { name }
    }

    static let nexts: [NextCase] = [
        NextCase(name: "plain backoff", expected: 1_001_000),
        NextCase(name: "third failure", failures: 3, expected: 1_004_000),
        NextCase(name: "Retry-After replaces backoff", failures: 5, retryAfter: 120, random: 0, expected: 1_120_000),
        NextCase(name: "Retry-After shorter than backoff still wins", failures: 10, retryAfter: 1, expected: 1_001_000),
        NextCase(name: "Retry-After zero waits the backoff base", retryAfter: 0, expected: 1_001_000),
        NextCase(name: "a negative Retry-After waits the backoff base", retryAfter: -30, expected: 1_001_000),
        NextCase(name: "Retry-After clamped to max", retryAfter: 86_400, expected: 1_000_000 + 7_200_000),
        NextCase(name: "Retry-After overflow clamped to max", retryAfter: Int64.max, expected: 1_000_000 + 7_200_000),
        NextCase(name: "expiry before the backoff", failures: 14, expiresAt: 2_000_000, expected: 2_000_000),
        NextCase(name: "expiry before the Retry-After", retryAfter: 3600, expiresAt: 1_500_000, expected: 1_500_000),
        NextCase(name: "expiry after the backoff changes nothing", expiresAt: 9_000_000, expected: 1_001_000),
        NextCase(name: "expiry exactly at the time", expiresAt: 1_001_000, expected: 1_001_000),
        NextCase(name: "expiry already past", expiresAt: 500_000, expected: 500_000),
        NextCase(name: "saturates instead of overflowing", now: Int64.max - 10, expected: Int64.max),
    ]

    @Test(arguments: nexts)
    func nextAttemptAt(_ c: NextCase) {
        let at = Backoff.nextAttemptAt(
            now: c.now, failures: c.failures, policy: BackoffPolicy(), retryAfterSeconds: c.retryAfter,
            expiresAt: c.expiresAt, random: c.random)
        #expect(at == c.expected)
    }

    /// An HTTP-date is counted from the time of the call, not from when the header arrived:
    /// seconds counted then (3,601 here, the header read 999.5 s earlier) are ignored, and the
    /// next attempt falls in the date's second however long the settle took.
    @Test(arguments: [Int64(6_400_000), 6_400_500, 6_400_999, 9_999_999, 10_000_000, 12_000_000])
    func anHTTPDateIsCountedFromTheCall(now: Int64) {
        let date: Int64 = 10_000_000
        let at = Backoff.nextAttemptAt(
            now: now, failures: 1, policy: BackoffPolicy(baseMs: 0, maxMs: 7_200_000), retryAfterSeconds: 3_601,
            retryAfterDate: date, expiresAt: nil, random: 0)
        #expect(at >= max(date, now) && at < max(date, now) + 1000, "at \(at)")
    }

    /// Sun, 06 Nov 1994 08:49:37 GMT, in epoch ms.
    static let rfcExampleMs: Int64 = 784_111_777_000
    /// 2025-06-15T16:26:40Z, for two-digit years.
    static let mid2025Ms: Int64 = 1_750_004_800_000

    struct RetryAfterCase: Sendable, CustomTestStringConvertible {
        let name: String
        let value: String
        var now: Int64 = BackoffTests.rfcExampleMs - 10_000
        let seconds: Int64?
        var testDescription: String { name }
    }

    static let retryAfters: [RetryAfterCase] = [
        RetryAfterCase(name: "delta seconds", value: "120", seconds: 120),
        RetryAfterCase(name: "delta with spaces", value: " 120\t", seconds: 120),
        RetryAfterCase(name: "zero", value: "0", seconds: 0),
        RetryAfterCase(name: "huge delta saturates", value: "99999999999999999999", seconds: Int64.max),
        RetryAfterCase(name: "empty", value: "", seconds: nil),
        RetryAfterCase(name: "blank", value: "  ", seconds: nil),
        RetryAfterCase(name: "negative", value: "-5", seconds: nil),
        RetryAfterCase(name: "fraction", value: "1.5", seconds: nil),
        RetryAfterCase(name: "IMF-fixdate", value: "Sun, 06 Nov 1994 08:49:37 GMT", seconds: 10),
        RetryAfterCase(name: "RFC 850", value: "Sunday, 06-Nov-94 08:49:37 GMT", seconds: 10),
        RetryAfterCase(name: "asctime", value: "Sun Nov  6 08:49:37 1994", seconds: 10),
        RetryAfterCase(name: "date in the past", value: "Sun, 06 Nov 1994 08:49:37 GMT", now: rfcExampleMs + 5000, seconds: 0),
        RetryAfterCase(name: "date equal to now", value: "Sun, 06 Nov 1994 08:49:37 GMT", now: rfcExampleMs, seconds: 0),
        RetryAfterCase(
            name: "partial second rounds up", value: "Sun, 06 Nov 1994 08:49:37 GMT",
            now: rfcExampleMs - 1500, seconds: 2),
        RetryAfterCase(
            name: "leap day", value: "Thu, 29 Feb 2024 00:00:00 GMT", now: 1_709_164_800_000 - 60_000,
            seconds: 60),
        RetryAfterCase(
            name: "leap day in a 400th year", value: "Tue, 29 Feb 2000 00:00:00 GMT",
            now: 951_782_400_000 - 1000, seconds: 1),
        RetryAfterCase(
            name: "new year", value: "Wed, 01 Jan 2025 00:00:00 GMT", now: 1_735_689_600_000 - 3_000,
            seconds: 3),
        RetryAfterCase(
            name: "leap second", value: "Sat, 31 Dec 2016 23:59:60 GMT", now: 1_483_228_800_000 - 2000,
            seconds: 2),
        RetryAfterCase(
            name: "RFC 850 year within 50 years ahead stays in this century",
            value: "Monday, 01-Jan-74 00:00:00 GMT", now: mid2025Ms,
            seconds: 3_281_990_400 - 1_750_004_800),
        RetryAfterCase(
            name: "RFC 850 year exactly 50 years ahead stays in this century",
            value: "Tuesday, 01-Jan-75 00:00:00 GMT", now: mid2025Ms,
            seconds: 3_313_526_400 - 1_750_004_800),
        RetryAfterCase(
            name: "RFC 850 year over 50 years ahead is last century",
            value: "Thursday, 01-Jan-76 00:00:00 GMT", now: mid2025Ms, seconds: 0),
        RetryAfterCase(name: "no leap day in 2023", value: "Wed, 29 Feb 2023 00:00:00 GMT", seconds: nil),
        RetryAfterCase(name: "no leap day in 1900", value: "Thu, 29 Feb 1900 00:00:00 GMT", seconds: nil),
        RetryAfterCase(name: "31 November", value: "Thu, 31 Nov 1994 00:00:00 GMT", seconds: nil),
        RetryAfterCase(name: "hour 24", value: "Sun, 06 Nov 1994 24:00:00 GMT", seconds: nil),
        RetryAfterCase(name: "not GMT", value: "Sun, 06 Nov 1994 08:49:37 UTC", seconds: nil),
        RetryAfterCase(name: "unknown day", value: "Sux, 06 Nov 1994 08:49:37 GMT", seconds: nil),
        RetryAfterCase(name: "unknown month", value: "Sun, 06 Nox 1994 08:49:37 GMT", seconds: nil),
        RetryAfterCase(name: "two-digit year in IMF form", value: "Sun, 06 Nov 94 08:49:37 GMT", seconds: nil),
        RetryAfterCase(name: "long day name in IMF form", value: "Sunday, 06 Nov 1994 08:49:37 GMT", seconds: nil),
        RetryAfterCase(name: "missing seconds", value: "Sun, 06 Nov 1994 08:49 GMT", seconds: nil),
        RetryAfterCase(name: "words", value: "soon", seconds: nil),
    ]

    @Test(arguments: retryAfters)
    func parsesRetryAfter(_ c: RetryAfterCase) {
        #expect(Backoff.parseRetryAfter(c.value, now: c.now) == c.seconds)
    }

    @Test(
        arguments: [
            ("clock behind creation never expires", Int64(100), Int64(200), Int64?.some(50), false),
            ("no expiry", 10_000, 0, nil, false),
            ("before expiry", 999, 0, 1000, false),
            ("exactly at expiry", 1000, 0, 1000, true),
            ("after expiry", 1001, 0, 1000, true),
            ("created and expiring now", 500, 500, 500, true),
            ("clock behind creation without expiry", 1, 2, nil, false),
        ] as [(String, Int64, Int64, Int64?, Bool)])
    func expiry(_ name: String, _ now: Int64, _ createdAt: Int64, _ expiresAt: Int64?, _ expected: Bool) {
        #expect(Expiry.isExpired(now: now, createdAt: createdAt, expiresAt: expiresAt) == expected, "\(name)")
    }
}
