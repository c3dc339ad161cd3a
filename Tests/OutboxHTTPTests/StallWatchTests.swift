import Testing
@testable import OutboxHTTP

// The stall check as a table: a transfer's byte count over time, observed at a given
// cadence, and the window in which it must first be declared stalled (or never).

struct StallCase: CustomTestStringConvertible, Sendable {
    var name: String
    var below = 1024
    var forMs = 1000
    /// How often the engine looks, in ms.
    var everyMs: Int64 = 50
    var untilMs: Int64 = 10_000
    /// Bytes moved in all by a time (ms).
    var bytes: @Sendable (Int64) -> Int64
    /// First stall inside this range (ms), or nil: never within `untilMs`.
    var stallsWithin: ClosedRange<Int64>?
    var testDescription: String { name }
}

@Suite struct StallWatchTests {
    static let cases: [StallCase] = [
        // 1 MiB in the first 100 ms, then nothing: given up `for` after the last byte, plus at
        // most one step (100 ms) and one look (50 ms); libcurl took ~6 s here.
        StallCase(name: "dead after a burst", bytes: { $0 < 100 ? 0 : 1 << 20 }, stallsWithin: 1100...1250),
        StallCase(name: "silent from the start", bytes: { _ in 0 }, stallsWithin: 1000...1150),
        StallCase(name: "steady at twice the limit", bytes: { $0 * 2048 / 1000 }, stallsWithin: nil),
        StallCase(name: "steady just above the limit", bytes: { $0 * 1100 / 1000 }, stallsWithin: nil),
        StallCase(name: "a trickle at half the limit", bytes: { $0 * 512 / 1000 }, stallsWithin: 1000...1150),
        // Bytes in bursts 0.8 s apart still average above the limit over any second.
        StallCase(name: "bursts of 4 KiB every 800 ms", bytes: { ($0 / 800 + 1) * 4096 }, stallsWithin: nil),
        // The last burst comes at 2.4 s.
        StallCase(name: "bursts that stop", bytes: { (min($0, 3000) / 800 + 1) * 4096 }, stallsWithin: 3400...3550),
        // Looks 700 ms apart: late, never early.
        StallCase(name: "sparse looks", everyMs: 700, bytes: { _ in 0 }, stallsWithin: 1400...1400),
        // The default: 60 s; samples 1.875 s apart keep ~34 of them.
        StallCase(
            name: "60 s after a burst", forMs: 60_000, everyMs: 100, untilMs: 120_000,
            bytes: { $0 < 5000 ? $0 * 100_000 : 500_000_000 }, stallsWithin: 65_000...67_000),
    ]

    @Test(arguments: cases)
    func firstStallFallsInItsWindow(_ c: StallCase) throws {
        var watch = try #require(StallWatch(belowBytesPerSecond: c.below, forMs: c.forMs))
        var first: Int64?
        var t: Int64 = 0
        while t <= c.untilMs && first == nil {
            if watch.observe(bytes: c.bytes(t), nowMs: t) { first = t }
            t += c.everyMs
        }
        if let window = c.stallsWithin {
            let at = try #require(first, "never stalled")
            #expect(window.contains(at), "stalled at \(at) ms")
        } else {
            #expect(first == nil, "stalled at \(first ?? -1) ms")
        }
    }

    @Test func resetRestartsTheWindow() throws {
        var watch = try #require(StallWatch(belowBytesPerSecond: 1024, forMs: 1000))
        var stalledAt: [Int64] = []
        for t in stride(from: Int64(0), through: 900, by: 50) where watch.observe(bytes: 0, nowMs: t) { stalledAt.append(t) }
        // Still connecting: no time counts until bytes can move.
        watch.reset()
        for t in stride(from: Int64(950), through: 2000, by: 50) where watch.observe(bytes: 0, nowMs: t) { stalledAt.append(t) }
        // A full `for` after the restart, not after the first look.
        #expect(stalledAt.first == 1950)
    }

    @Test func zeroInEitherLimitTurnsTheCheckOff() {
        #expect(StallWatch(belowBytesPerSecond: 0, forMs: 1000) == nil)
        #expect(StallWatch(belowBytesPerSecond: 1024, forMs: 0) == nil)
    }

    @Test func messageNamesTheLimits() throws {
        let watch = try #require(StallWatch(belowBytesPerSecond: 1024, forMs: 60_000))
        #expect(watch.message == "stalled: less than 1 KiB/s over 1m")
    }
}
