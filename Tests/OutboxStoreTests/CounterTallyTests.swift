import OutboxModel
import OutboxStore
import Testing

/// An attempt tallied by its key writes exactly the series that the general `add` and
/// `observeDuration` write for it.
struct CounterTallyTests {
    struct Attempt: Sendable, CustomTestStringConvertible {
        var key: String
        var result: String
        var sent: Int64
        var accepted: Bool
        var microseconds: Int64
        var testDescription: String { "\(key) \(result) \(sent) B \(microseconds) µs" }
    }

    static let batches: [(String, [Attempt])] = [
        ("one success", [Attempt(key: "a", result: "success", sent: 120, accepted: true, microseconds: 3_000)]),
        (
            "keys, results and buckets mixed",
            [
                Attempt(key: "a", result: "success", sent: 120, accepted: true, microseconds: 3_000),
                Attempt(key: "b", result: "retry", sent: 0, accepted: false, microseconds: 0),
                Attempt(key: "a", result: "error", sent: 7, accepted: false, microseconds: 10_000),
                Attempt(key: "a", result: "success", sent: 1, accepted: true, microseconds: 10_001),
                Attempt(key: "b", result: "auth", sent: 5, accepted: false, microseconds: 301_000_000),
                Attempt(key: "a", result: "retry", sent: 9, accepted: false, microseconds: -4),
            ]
        ),
        (
            "nothing sent, nothing timed",
            [
                Attempt(key: "k", result: "retry", sent: 0, accepted: false, microseconds: 0),
                Attempt(key: "k", result: "retry", sent: 0, accepted: true, microseconds: 0),
            ]
        ),
    ]

    @Test(arguments: batches.map(\.1))
    func attemptsTallyAsTheGeneralIncrementsDo(_ attempts: [Attempt]) {
        var general = CounterTally()
        var fast = CounterTally()
        for a in attempts {
            general.add(.attempts, [("key", a.key), ("result", a.result)], by: 1)
            general.add(.sentBytes, [("key", a.key)], by: a.sent)
            if a.accepted { general.add(.acceptedBytes, [("key", a.key)], by: a.sent) }
            general.observeDuration(microseconds: a.microseconds)
            fast.addAttempt(
                key: a.key, result: a.result, sentBytes: a.sent, accepted: a.accepted, durationMicroseconds: a.microseconds)
        }
        #expect(!fast.isEmpty)
        let expected = general.take()
        #expect(fast.take() == expected)
        #expect(fast.isEmpty && fast.take().isEmpty, "take empties the tally")
    }

    // Attempts and other increments in one tally are summed into the same series.
    @Test func attemptsAndGeneralIncrementsShareSeries() {
        var tally = CounterTally()
        tally.add(.sentBytes, [("key", "a")], by: 10)
        tally.addAttempt(key: "a", result: "success", sentBytes: 5, accepted: true, durationMicroseconds: 1)
        let sent = tally.take().filter { $0.counter == .sentBytes }
        #expect(sent == [CounterIncrement(.sentBytes, [("key", "a")], by: 15)])
    }
}
