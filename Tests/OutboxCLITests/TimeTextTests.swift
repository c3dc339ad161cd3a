import OutboxModel
import Testing

@testable import OutboxCLI

/// The times `--not-before`, `--expires-at` and `not_before` lines take: RFC 3339 with a zone,
/// or epoch milliseconds, refused rather than rolled over.
struct TimeTextTests {
    @Test(arguments: [
        ("2016-12-31T23:59:60Z", Int64(1_483_228_800_000)),
        // 23:59:60 UTC, written in another zone.
        ("2017-01-01T01:59:60+02:00", Int64(1_483_228_800_000)),
        ("2027-03-10T08:00:00.5Z", Int64(1_804_665_600_500)),
        ("253402300799999", Int64(253_402_300_799_999)),
    ])
    func takes(_ text: String, _ ms: Int64) throws {
        #expect(try TimeText.parse(text, field: "--not-before") == ms)
    }

    @Test(arguments: [
        ("2027-03-10T08:59:60Z", "--not-before: \"2027-03-10T08:59:60Z\" is not a time (second 60 is a leap second, at 23:59:60 UTC only)"),
        (
            "2027-06-30T23:59:60+02:00",
            "--not-before: \"2027-06-30T23:59:60+02:00\" is not a time (second 60 is a leap second, at 23:59:60 UTC only)"
        ),
        ("2027-03-10T08:00:00.Z", "--not-before: \"2027-03-10T08:00:00.Z\" is not a time (no digit after the dot)"),
        ("9223372036854775808", "--not-before: \"9223372036854775808\" is out of range (from 1970 to the end of year 9999)"),
        ("-99999999999999999999", "--not-before: \"-99999999999999999999\" is out of range (from 1970 to the end of year 9999)"),
    ])
    func refuses(_ text: String, _ message: String) {
        #expect(throws: OutboxError.invalid(message)) { try TimeText.parse(text, field: "--not-before") }
    }
}
