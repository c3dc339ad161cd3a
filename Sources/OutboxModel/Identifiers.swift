#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import CSystem
import Synchronization

/// xoshiro256**: a fast generator seeded once from the system's, for ids that must be unique
/// but need not be secret (X-Request-Id).
package struct FastRandom: RandomNumberGenerator, Sendable {
    private var s: (UInt64, UInt64, UInt64, UInt64)

    package init() {
        var system = SystemRandomNumberGenerator()
        s = (system.next(), system.next(), system.next(), system.next() | 1)
    }

    package mutating func next() -> UInt64 {
        let result = rotl(s.1 &* 5, 7) &* 9
        let t = s.1 << 17
        s.2 ^= s.0
        s.3 ^= s.1
        s.1 ^= s.2
        s.0 ^= s.3
        s.2 ^= t
        s.3 = rotl(s.3, 45)
        return result
    }

    private func rotl(_ x: UInt64, _ k: UInt64) -> UInt64 { (x << k) | (x >> (64 - k)) }
}

/// The kernel's CSPRNG drawn 512 bytes at a time (one getrandom call per 32 UUIDs instead of
/// two per UUID). Ids and idempotency keys stay unpredictable: the bytes are the kernel's.
package struct PooledSystemRandom: RandomNumberGenerator, Sendable {
    private static let pool = Locked(Pool())

    private struct Pool: ~Copyable {
        var bytes = [UInt64](repeating: 0, count: 64)
        var next = 64

        mutating func take() -> UInt64 {
            if next == bytes.count {
                let rc = bytes.withUnsafeMutableBytes { csystem_random($0.baseAddress, $0.count) }
                // Linux has had getrandom since 3.17; without entropy nothing here is safe.
                precondition(rc == 0, "getrandom failed: errno \(-rc)")
                next = 0
            }
            defer { next += 1 }
            return bytes[next]
        }
    }

    package init() {}

    package mutating func next() -> UInt64 {
        Self.pool.withLock { $0.take() }
    }
}

/// Entry ids and clocks.
package enum Identifiers {
    /// Longest user id accepted.
    package static let maxUserIDLength = 128

    /// A random (version 4) UUID in lowercase, e.g. `0f8fad5b-d9cb-469f-a165-70867728950e`.
    package static func uuid() -> String {
        var rng = PooledSystemRandom()
        return uuid(using: &rng)
    }

    /// A version 4 UUID from `generator` (the runner uses a seeded one for request ids, to
    /// spare two getrandom calls per attempt).
    package static func uuid<G: RandomNumberGenerator>(using generator: inout G) -> String {
        // Two 64-bit draws: drawing byte by byte cost 16 getrandom calls per id.
        let high = (generator.next() & ~0xF000) | 0x4000  // version 4
        return format(high: high, low: generator.next())
    }

    /// The last (milliseconds << 12 | counter) handed out by `entryUUID`, so ids made in one
    /// process sort in the order they were made, even within a millisecond.
    private static let lastTimeOrdered = Atomic<UInt64>(0)

    /// A time-ordered (version 7, RFC 9562) UUID: 48 bits of Unix milliseconds, a 12-bit
    /// counter, 62 random bits. Default entry ids use it, so the store's id index grows and
    /// shrinks at its ends as entries are enqueued and forgotten in queue order, instead of
    /// touching a random page per entry.
    package static func entryUUID() -> String {
        let now = UInt64(max(0, nowMs())) << 12
        var last = lastTimeOrdered.load(ordering: .relaxed)
        var stamp: UInt64
        repeat {
            stamp = max(now, last + 1)
            let (exchanged, current) = lastTimeOrdered.compareExchange(expected: last, desired: stamp, ordering: .relaxed)
            if exchanged { break }
            last = current
        } while true
        var system = PooledSystemRandom()
        // 48 bits of milliseconds, version 7, the 12-bit counter.
        let high = (stamp >> 12) << 16 | 0x7000 | (stamp & 0x0FFF)
        return format(high: high, low: system.next())
    }

    /// The 36 characters of a UUID whose bytes are `high` then `low`, big-endian, with the
    /// RFC 4122 variant set; written straight into the string's storage.
    private static func format(high: UInt64, low: UInt64) -> String {
        let low = (low & ~(0xC0 << 56)) | (0x80 << 56)  // RFC 4122 variant
        return String(unsafeUninitializedCapacity: 36) { out in
            var at = 0
            for i in 0..<16 {
                if i == 4 || i == 6 || i == 8 || i == 10 { out[at] = UInt8(ascii: "-"); at += 1 }
                let byte = UInt8(truncatingIfNeeded: (i < 8 ? high : low) >> UInt64(56 - 8 * (i % 8)))
                out[at] = hexDigits[Int(byte >> 4)]
                out[at + 1] = hexDigits[Int(byte & 0x0F)]
                at += 2
            }
            return at
        }
    }

    private static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)

    /// Nil when `id` is a valid user id (`[A-Za-z0-9._:@-]`, 1–128 characters, not starting with `.` or `-`); else why not.
    ///
    /// Ids end up in logs, JSON and shell hooks, so the alphabet is narrow; a leading `-`
    /// would read as an option on a command line, a leading `.` as a hidden file.
    package static func validateUserID(_ id: String) -> String? {
        let allowedText = "allowed: A-Z a-z 0-9 . _ : @ -"
        if id.isEmpty { return "id must not be empty" }
        for scalar in id.unicodeScalars where !isAllowed(scalar) {
            let shown = Units.quoted(String(scalar))
            return "id \(Units.quoted(id)) contains \(shown) (\(allowedText))"
        }
        // Only ASCII is left, so bytes are characters.
        let length = id.utf8.count
        if length > maxUserIDLength {
            return "id \(Units.quoted(id)) is \(length) characters long (at most \(maxUserIDLength))"
        }
        if let first = id.utf8.first, first == UInt8(ascii: ".") || first == UInt8(ascii: "-") {
            return "id \(Units.quoted(id)) must not start with \"\(Character(Unicode.Scalar(first)))\""
        }
        return nil
    }

    /// The times a store records: epoch milliseconds from 1970 to the end of year 9999.
    package static let recordableMs: ClosedRange<Int64> = 0...253_402_300_799_999

    /// The expiry of a lifetime that starts `now`: one that would end past the end of year
    /// 9999 ends there, as no later time can be recorded.
    package static func expiry(now: Int64, lifetimeMs: Int64) -> Int64 {
        min(now + lifetimeMs, recordableMs.upperBound)
    }

    /// E_STORAGE when the system clock is outside `recordableMs` (a device clock set before
    /// 1970): what a command would write under it, every reader would take for damage.
    package static func checkClock() throws(OutboxError) {
        var now = nowMs()
        #if DEBUG
        // Tests give the clock a machine's clock cannot be set to without privileges.
        if let text = getenv("OUTBOX_TEST_CLOCK_MS"), let given = Int64(String(cString: text)) { now = given }
        #endif
        guard !recordableMs.contains(now) else { return }
        throw .storage(
            "the system clock reads \(now) ms from 1970, outside the years 1970 to 9999 a store records: set the clock, then run the command again"
        )
    }

    /// Wall-clock time in epoch milliseconds (CLOCK_REALTIME).
    package static func nowMs() -> Int64 {
        milliseconds(CLOCK_REALTIME)
    }

    /// Milliseconds of a clock that never jumps (CLOCK_MONOTONIC), for timers within one run.
    package static func monotonicMs() -> Int64 {
        milliseconds(CLOCK_MONOTONIC)
    }

    private static func milliseconds(_ clock: clockid_t) -> Int64 {
        var ts = timespec()
        _ = clock_gettime(clock, &ts)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }

    private static func isAllowed(_ s: Unicode.Scalar) -> Bool {
        switch s {
        case "A"..."Z", "a"..."z", "0"..."9", ".", "_", ":", "@", "-": return true
        default: return false
        }
    }
}
