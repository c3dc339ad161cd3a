import OutboxModel
import Testing

struct UnitsTests {
    struct Good: Sendable, CustomTestStringConvertible {
        let name: String
        let text: String
        let value: Int64
        var testDescription: String { name }
    }

    struct Bad: Sendable, CustomTestStringConvertible {
        let name: String
        let text: String
        let message: String
        var testDescription: String { name }
    }

    static let goodDurations: [Good] = [
        Good(name: "milliseconds", text: "500ms", value: 500),
        Good(name: "100 years, the longest", text: "36600d", value: 36600 * 86_400_000),
        Good(name: "seconds", text: "30s", value: 30_000),
        Good(name: "minutes", text: "10m", value: 600_000),
        Good(name: "hours", text: "2h", value: 7_200_000),
        Good(name: "days", text: "14d", value: 1_209_600_000),
        Good(name: "bare zero", text: "0", value: 0),
        Good(name: "zero with unit", text: "0s", value: 0),
        Good(name: "one space before unit", text: "30 s", value: 30_000),
        Good(name: "leading zeros", text: "007s", value: 7000),
    ]

    static let badDurations: [Bad] = [
        Bad(name: "unknown unit", text: "10x", message: #"bad duration "10x" (use 500ms, 30s, 10m, 2h or 14d)"#),
        Bad(
            name: "bare non-zero number", text: "30",
            message: #"bad duration "30" (a unit is required: use 500ms, 30s, 10m, 2h or 14d)"#),
        Bad(name: "empty", text: "", message: #"bad duration "" (use 500ms, 30s, 10m, 2h or 14d)"#),
        Bad(name: "negative", text: "-5s", message: #"bad duration "-5s" (use 500ms, 30s, 10m, 2h or 14d)"#),
        Bad(name: "fraction", text: "1.5h", message: #"bad duration "1.5h" (use 500ms, 30s, 10m, 2h or 14d)"#),
        Bad(name: "upper-case unit", text: "10S", message: #"bad duration "10S" (use 500ms, 30s, 10m, 2h or 14d)"#),
        Bad(name: "unit only", text: "s", message: #"bad duration "s" (use 500ms, 30s, 10m, 2h or 14d)"#),
        Bad(name: "two spaces", text: "10  s", message: #"bad duration "10  s" (use 500ms, 30s, 10m, 2h or 14d)"#),
        Bad(name: "trailing space", text: "10s ", message: #"bad duration "10s " (use 500ms, 30s, 10m, 2h or 14d)"#),
        Bad(name: "compound", text: "1h30m", message: #"bad duration "1h30m" (use 500ms, 30s, 10m, 2h or 14d)"#),
        Bad(name: "overflow in the multiply", text: "106751991168d", message: #"duration "106751991168d" is over 100 years"#),
        Bad(
            name: "overflow in the digits", text: "99999999999999999999ms",
            message: #"duration "99999999999999999999ms" is over 100 years"#),
        Bad(
            name: "the largest Int64 of ms (now + it would overflow)", text: "9223372036854775807ms",
            message: #"duration "9223372036854775807ms" is over 100 years"#),
        Bad(name: "a day over 100 years", text: "36601d", message: #"duration "36601d" is over 100 years"#),
    ]

    @Test(arguments: goodDurations)
    func parsesDuration(_ c: Good) throws {
        #expect(try Units.parseDuration(c.text) == c.value)
    }

    @Test(arguments: badDurations)
    func rejectsDuration(_ c: Bad) {
        #expect(throws: OutboxError(.invalid, c.message)) { try Units.parseDuration(c.text) }
    }

    static let goodSizes: [Good] = [
        Good(name: "plain bytes", text: "1234", value: 1234),
        Good(name: "zero", text: "0", value: 0),
        Good(name: "B suffix", text: "512B", value: 512),
        Good(name: "KiB", text: "1KiB", value: 1024),
        Good(name: "MiB", text: "8MiB", value: 8 << 20),
        Good(name: "MiB with a space", text: "8 MiB", value: 8 << 20),
        Good(name: "GiB", text: "3GiB", value: 3 << 30),
        Good(name: "TiB", text: "5TiB", value: 5 << 40),
        Good(name: "KB is 1000", text: "2KB", value: 2000),
        Good(name: "MB is 10^6", text: "20MB", value: 20_000_000),
        Good(name: "GB is 10^9", text: "1GB", value: 1_000_000_000),
        Good(name: "TB is 10^12", text: "1TB", value: 1_000_000_000_000),
        Good(name: "Int64.max bytes", text: "9223372036854775807", value: Int64.max),
        Good(name: "largest TiB that fits", text: "8388607TiB", value: 8_388_607 << 40),
    ]

    static let badSizes: [Bad] = [
        Bad(name: "unknown unit", text: "8XB", message: #"bad size "8XB" (use bytes, or KiB, MiB, GiB, TiB, e.g. 8MiB)"#),
        Bad(name: "lower-case unit", text: "8mib", message: #"bad size "8mib" (use bytes, or KiB, MiB, GiB, TiB, e.g. 8MiB)"#),
        Bad(name: "negative", text: "-1", message: #"bad size "-1" (use bytes, or KiB, MiB, GiB, TiB, e.g. 8MiB)"#),
        Bad(name: "empty", text: "", message: #"bad size "" (use bytes, or KiB, MiB, GiB, TiB, e.g. 8MiB)"#),
        Bad(name: "space with no unit", text: "8 ", message: #"bad size "8 " (use bytes, or KiB, MiB, GiB, TiB, e.g. 8MiB)"#),
        Bad(name: "fraction", text: "1.5MiB", message: #"bad size "1.5MiB" (use bytes, or KiB, MiB, GiB, TiB, e.g. 8MiB)"#),
        Bad(name: "overflow in the multiply", text: "8388608TiB", message: #"size "8388608TiB" is too large"#),
        Bad(name: "overflow in the digits", text: "9223372036854775808", message: #"size "9223372036854775808" is too large"#),
        Bad(
            name: "quotes and controls escaped", text: "8\"\n",
            message: #"bad size "8\"\n" (use bytes, or KiB, MiB, GiB, TiB, e.g. 8MiB)"#),
    ]

    @Test(arguments: goodSizes)
    func parsesSize(_ c: Good) throws {
        #expect(try Units.parseSize(c.text) == c.value)
    }

    @Test(arguments: badSizes)
    func rejectsSize(_ c: Bad) {
        #expect(throws: OutboxError(.invalid, c.message)) { try Units.parseSize(c.text) }
    }

    @Test func longTextIsCutInTheMessage() {
        let text = String(repeating: "9", count: 45) + "x"
        let expected = "bad size \"" + String(repeating: "9", count: 40) + "…\" (use bytes, or KiB, MiB, GiB, TiB, e.g. 8MiB)"
        #expect(throws: OutboxError(.invalid, expected)) { try Units.parseSize(text) }
    }

    @Test(
        arguments: [
            ("zero", Int64(0), "0 B"),
            ("bytes", 1023, "1023 B"),
            ("one KiB", 1024, "1 KiB"),
            ("KiB and a half", 1536, "1.5 KiB"),
            ("one and a half MiB", 3 << 19, "1.5 MiB"),
            ("20 MiB", 20 << 20, "20 MiB"),
            ("rounds to tenths", 1_100_000, "1 MiB"),
            ("just under a twentieth rounds down", 1024 + 51, "1 KiB"),
            ("just over a twentieth rounds up", 1024 + 52, "1.1 KiB"),
            ("rounding up to the next unit", (1 << 20) - 1, "1 MiB"),
            ("rounding to the next whole", (2 << 30) - 1, "2 GiB"),
            ("TiB", 5 << 40, "5 TiB"),
            ("largest", Int64.max, "8 EiB"),
            ("negative", -1536, "-1.5 KiB"),
            ("most negative", Int64.min, "-8 EiB"),
        ] as [(String, Int64, String)])
    func formatsBytes(_ name: String, _ n: Int64, _ expected: String) {
        #expect(Units.formatBytes(n) == expected, "\(name)")
    }

    @Test(
        arguments: [
            ("zero", Int64(0), "0ms"),
            ("milliseconds", 850, "850ms"),
            ("one second", 1000, "1s"),
            ("tenths of a second", 1500, "1.5s"),
            ("tenths truncated", 1999, "1.9s"),
            ("under a minute", 59_999, "59.9s"),
            ("one minute", 60_000, "1m"),
            ("minutes and seconds", 90_000, "1m 30s"),
            ("hours and minutes", 7_500_000, "2h 5m"),
            ("whole hours", 7_200_000, "2h"),
            ("hours drop seconds", 7_200_000 + 59_000, "2h"),
            ("days and hours", 3 * 86_400_000 + 4 * 3_600_000 + 5 * 60_000, "3d 4h"),
            ("fourteen days", 1_209_600_000, "14d"),
            ("negative", -90_000, "-1m 30s"),
        ] as [(String, Int64, String)])
    func formatsDuration(_ name: String, _ ms: Int64, _ expected: String) {
        #expect(Units.formatDuration(ms: ms) == expected, "\(name)")
    }

    @Test func formatDurationHandlesExtremes() {
        #expect(Units.formatDuration(ms: Int64.max) == "106751991167d 7h")
        #expect(Units.formatDuration(ms: Int64.min) == "-106751991167d 7h")
    }
}
