import OutboxModel
import Testing

private let MiB: Int64 = 1 << 20

/// Ranges from a list of boundaries: [0, a, b] → [{0,a}, {a,b}].
private func cuts(_ bounds: [Int64]) -> [ByteRange] {
    zip(bounds, bounds.dropFirst()).map { ByteRange(start: $0, end: $1) }
}

/// Evenly spaced boundaries `from, from+step, ... ≤ through`, then `end` if given.
private func steps(_ from: Int64, through: Int64, by step: Int64, end: Int64? = nil) -> [Int64] {
    var out = Array(stride(from: from, through: through, by: Int(step)))
    if let end { out.append(end) }
    return out
}

struct ChunkPlanTests {
    struct Case: Sendable, CustomTestStringConvertible {
        let name: String
        let size: Int64
        var min: Int64 = ChunkPlan.defaultMin
        var max: Int64 = ChunkPlan.defaultMax
        var maxParts: Int = ChunkPlan.defaultMaxParts
        let expected: [ByteRange]
        var testDescription: String { name }
    }

    static let plans: [Case] = [
        Case(name: "empty file is one empty chunk", size: 0, expected: [ByteRange(start: 0, end: 0)]),
        Case(name: "one byte", size: 1, expected: cuts([0, 1])),
        Case(name: "smaller than min", size: 5 * MiB, expected: cuts([0, 5 * MiB])),
        Case(name: "exactly max", size: 20 * MiB, expected: cuts([0, 20 * MiB])),
        Case(name: "short remainder joins the only chunk", size: 25 * MiB, expected: cuts([0, 25 * MiB])),
        Case(name: "remainder exactly min stands alone", size: 28 * MiB, expected: cuts([0, 20 * MiB, 28 * MiB])),
        Case(name: "remainder one byte under min joins", size: 28 * MiB - 1, expected: cuts([0, 28 * MiB - 1])),
        Case(name: "two whole chunks", size: 40 * MiB, expected: cuts([0, 20 * MiB, 40 * MiB])),
        Case(name: "short remainder joins the last of two", size: 45 * MiB, expected: cuts([0, 20 * MiB, 45 * MiB])),
        Case(
            name: "long remainder is its own part", size: 48 * MiB,
            expected: cuts([0, 20 * MiB, 40 * MiB, 48 * MiB])),
        Case(name: "small numbers, remainder joins", size: 10, min: 3, max: 4, expected: cuts([0, 4, 10])),
        Case(name: "small numbers, remainder stays", size: 11, min: 3, max: 4, expected: cuts([0, 4, 8, 11])),
        Case(name: "min equals max", size: 10, min: 5, max: 5, expected: cuts([0, 5, 10])),
        Case(name: "min 1 keeps every remainder", size: 9, min: 1, max: 4, expected: cuts([0, 4, 8, 9])),
        Case(
            name: "max parts: chunk grows to size/maxParts", size: 100 * MiB, min: MiB, max: MiB, maxParts: 10,
            expected: cuts(steps(0, through: 100 * MiB, by: 10 * MiB))),
        Case(
            name: "max parts: chunk rounded up to a whole MiB", size: 100 * MiB + 1, min: MiB, max: MiB, maxParts: 10,
            expected: cuts(steps(0, through: 99 * MiB, by: 11 * MiB, end: 100 * MiB + 1))),
        Case(
            name: "max parts: remainder under min still joins", size: 100 * MiB + 1, min: 2 * MiB, max: 2 * MiB,
            maxParts: 10,
            expected: cuts(steps(0, through: 88 * MiB, by: 11 * MiB, end: 100 * MiB + 1))),
        Case(
            name: "max parts exactly reached keeps max", size: 100, min: 1, max: 10, maxParts: 10,
            expected: cuts(steps(0, through: 100, by: 10))),
        Case(name: "one part allowed", size: 1 << 40, maxParts: 1, expected: cuts([0, 1 << 40])),
    ]

    @Test(arguments: plans)
    func plan(_ c: Case) throws {
        let ranges = try ChunkPlan.plan(size: c.size, min: c.min, max: c.max, maxParts: c.maxParts)
        #expect(ranges == c.expected)
        #expect(ChunkPlan.tilingProblem(ranges, size: c.size) == nil)
    }

    @Test func fiveTiBWithTheS3LimitFits() throws {
        let size: Int64 = 5 << 40
        let ranges = try ChunkPlan.plan(size: size)
        // ceil(5 TiB / 10,000) = 524.29 MiB → 525 MiB chunks; 5,242,880 MiB = 9,986·525 + 230.
        #expect(ranges.count == 9_987)
        #expect(ranges.dropLast().allSatisfy { $0.count == 525 * MiB })
        #expect(ranges.last == ByteRange(start: 9_986 * 525 * MiB, end: size))
        #expect(ChunkPlan.tilingProblem(ranges, size: size) == nil)
    }

    @Test func largestSizeStaysWithinMaxParts() throws {
        let ranges = try ChunkPlan.plan(size: Int64.max)
        #expect(ranges.count <= ChunkPlan.defaultMaxParts)
        #expect(ChunkPlan.tilingProblem(ranges, size: Int64.max) == nil)
    }

    /// Every plan over a grid of sizes tiles, respects maxParts, and only the last part differs.
    @Test(
        arguments: [
            (Int64(3), Int64(4), 5), (1, 1, 7), (8 * MiB, 20 * MiB, 10_000), (2, 7, 3), (5, 5, 2),
        ] as [(Int64, Int64, Int)])
    func invariantsHold(_ min: Int64, _ max: Int64, _ maxParts: Int) throws {
        for size in [
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 19, 20, 21, 33, 99, 100, 101, 1000, 12_345, 8 * MiB - 1,
            20 * MiB + 1, 1 << 33,
        ] as [Int64] {
            let ranges = try ChunkPlan.plan(size: size, min: min, max: max, maxParts: maxParts)
            #expect(ChunkPlan.tilingProblem(ranges, size: size) == nil, "size \(size)")
            #expect(ranges.count <= maxParts, "size \(size)")
            if ranges.count > 1 {
                let chunk = ranges[0].count
                #expect(ranges.dropLast().allSatisfy { $0.count == chunk }, "size \(size)")
                #expect(ranges.last!.count >= min && ranges.last!.count < chunk + min, "size \(size)")
            }
        }
    }

    struct Bad: Sendable, CustomTestStringConvertible {
        let name: String
        let size: Int64
        var min: Int64 = ChunkPlan.defaultMin
        var max: Int64 = ChunkPlan.defaultMax
        var maxParts: Int = ChunkPlan.defaultMaxParts
        let message: String
        var testDescription: String { name }
    }

    static let badPlans: [Bad] = [
        Bad(
            name: "min greater than max", size: 100, min: 20 * MiB, max: 8 * MiB,
            message: "plan min (20 MiB) is greater than max (8 MiB)"),
        Bad(name: "zero min", size: 100, min: 0, message: "plan min must be more than 0 bytes (got 0)"),
        Bad(name: "negative max", size: 100, min: 1, max: -1, message: "plan max must be more than 0 bytes (got -1)"),
        Bad(name: "negative size", size: -1, message: "file size -1 is negative"),
        Bad(name: "zero max parts", size: 100, maxParts: 0, message: "plan max_parts must be 1 to 1000000 (got 0)"),
        Bad(
            name: "max parts over the limit", size: 100, maxParts: 1_000_001,
            message: "plan max_parts must be 1 to 1000000 (got 1000001)"),
    ]

    @Test(arguments: badPlans)
    func rejects(_ c: Bad) {
        #expect(throws: OutboxError(.invalid, c.message)) {
            try ChunkPlan.plan(size: c.size, min: c.min, max: c.max, maxParts: c.maxParts)
        }
    }

    struct Tiling: Sendable, CustomTestStringConvertible {
        let name: String
        let ranges: [ByteRange]
        let size: Int64
        let problem: String?
        var testDescription: String { name }
    }

    static let tilings: [Tiling] = [
        Tiling(name: "exact tiling", ranges: cuts([0, 40, 90, 120]), size: 120, problem: nil),
        Tiling(name: "single part", ranges: cuts([0, 120]), size: 120, problem: nil),
        Tiling(name: "empty file", ranges: [ByteRange(start: 0, end: 0)], size: 0, problem: nil),
        Tiling(
            name: "empty file with no parts", ranges: [], size: 0,
            problem: "a file of 0 bytes needs exactly one part {0, 0} (got 0 parts)"),
        Tiling(
            name: "empty file with a non-empty part", ranges: cuts([0, 1]), size: 0,
            problem: "a file of 0 bytes needs exactly one part {0, 0} (got 1 parts)"),
        Tiling(name: "no parts", ranges: [], size: 10, problem: "no parts, but the file has 10 bytes"),
        Tiling(name: "does not start at zero", ranges: cuts([5, 10]), size: 10, problem: "parts[0] starts at 5, not 0"),
        Tiling(
            name: "gap",
            ranges: [
                ByteRange(start: 0, end: 50), ByteRange(start: 50, end: 90),
                ByteRange(start: 100, end: 120),
            ], size: 120,
            problem: "parts[2] starts at 100 but parts[1] ended at 90 (a gap)"),
        Tiling(
            name: "overlap", ranges: [ByteRange(start: 0, end: 50), ByteRange(start: 40, end: 120)], size: 120,
            problem: "parts[1] starts at 40 but parts[0] ended at 50 (an overlap)"),
        Tiling(
            name: "unsorted reads as an overlap",
            ranges: [
                ByteRange(start: 0, end: 60), ByteRange(start: 60, end: 120),
                ByteRange(start: 30, end: 60),
            ], size: 120,
            problem: "parts[2] starts at 30 but parts[1] ended at 120 (an overlap)"),
        Tiling(
            name: "reversed range", ranges: [ByteRange(start: 0, end: 50), ByteRange(start: 50, end: 40)], size: 120,
            problem: "parts[1] ends at 40, before its start 50"),
        Tiling(
            name: "empty part in a non-empty file",
            ranges: [
                ByteRange(start: 0, end: 50), ByteRange(start: 50, end: 50),
                ByteRange(start: 50, end: 120),
            ], size: 120,
            problem: "parts[1] is empty (50 to 50)"),
        Tiling(
            name: "short of the end", ranges: cuts([0, 50, 100]), size: 120,
            problem: "the last part ends at 100 but the file has 120 bytes (20 not covered)"),
        Tiling(
            name: "past the end", ranges: cuts([0, 50, 130]), size: 120,
            problem: "parts[1] ends at 130, past the end of the file (120 bytes)"),
        Tiling(name: "negative size", ranges: [], size: -1, problem: "file size -1 is negative"),
    ]

    @Test(arguments: tilings)
    func tiling(_ c: Tiling) {
        #expect(ChunkPlan.tilingProblem(c.ranges, size: c.size) == c.problem)
    }
}
