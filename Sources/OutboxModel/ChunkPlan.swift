/// A half-open byte range `[start, end)` of a file.
package struct ByteRange: Sendable, Equatable, Hashable, CustomStringConvertible {
    package var start: Int64
    /// Exclusive.
    package var end: Int64

    package init(start: Int64, end: Int64) {
        self.start = start
        self.end = end
    }

    /// Number of bytes in the range.
    package var count: Int64 { end - start }

    package var description: String { "{\(start), \(end)}" }
}

/// Splits a file size into upload parts (docs/definitions.md, parts), and checks explicit part lists.
///
/// Rules of `plan`:
/// - greedy chunks of `max`; a final remainder smaller than `min` joins the previous chunk
///   (so the last part may be up to `max + min - 1` bytes); a file no larger than `max`
///   is one chunk; size 0 is the single chunk `{0, 0}`.
/// - when that would need more than `maxParts` parts, the chunk size becomes
///   ceil(size / maxParts) rounded up to a whole MiB and the same rules apply. That chunk
///   is then always larger than `max` (more parts than allowed means size > max·maxParts),
///   so `min` ≤ `max` < chunk still holds and `min` keeps its meaning; and since
///   chunk·maxParts ≥ size, the result never has more than `maxParts` parts.
package enum ChunkPlan {
    package static let defaultMin: Int64 = 8 << 20
    package static let defaultMax: Int64 = 20 << 20
    package static let defaultMaxParts = 10_000
    /// Upper bound on `maxParts`, so a typo cannot make a plan allocate billions of ranges.
    package static let maxPartsLimit = 1_000_000

    private static let mib: Int64 = 1 << 20

    /// The parts of a file of `size` bytes under the rules above; E_INVALID on bad arguments.
    package static func plan(
        size: Int64, min: Int64 = defaultMin, max: Int64 = defaultMax, maxParts: Int = defaultMaxParts
    ) throws(OutboxError) -> [ByteRange] {
        guard size >= 0 else { throw .invalid("file size \(size) is negative") }
        guard min > 0 else { throw .invalid("plan min must be more than 0 bytes (got \(min))") }
        guard max > 0 else { throw .invalid("plan max must be more than 0 bytes (got \(max))") }
        guard min <= max else {
            throw .invalid("plan min (\(Units.formatBytes(min))) is greater than max (\(Units.formatBytes(max)))")
        }
        guard maxParts >= 1 && maxParts <= maxPartsLimit else {
            throw .invalid("plan max_parts must be 1 to \(maxPartsLimit) (got \(maxParts))")
        }
        if size == 0 { return [ByteRange(start: 0, end: 0)] }

        var chunk = max
        if partCount(size: size, chunk: chunk, min: min) > Int64(maxParts) {
            let parts = Int64(maxParts)
            let needed = size / parts + (size % parts == 0 ? 0 : 1)
            let (rounded, overflow) = (needed / mib + (needed % mib == 0 ? 0 : 1)).multipliedReportingOverflow(by: mib)
            // Rounding past Int64 only happens for chunks bigger than any file: one part.
            chunk = overflow ? size : rounded
        }

        let count = partCount(size: size, chunk: chunk, min: min)
        var ranges: [ByteRange] = []
        ranges.reserveCapacity(Int(count))
        var start: Int64 = 0
        for _ in 0..<(count - 1) {
            ranges.append(ByteRange(start: start, end: start + chunk))
            start += chunk
        }
        ranges.append(ByteRange(start: start, end: size))
        return ranges
    }

    /// How many parts greedy chunking gives for a non-empty file, without building them.
    private static func partCount(size: Int64, chunk: Int64, min: Int64) -> Int64 {
        let full = size / chunk
        let remainder = size % chunk
        if full == 0 { return 1 }
        if remainder == 0 { return full }
        // A short remainder joins the previous chunk instead of being its own part.
        return remainder < min ? full : full + 1
    }

    /// Nil when `ranges` tile `[0, size)` exactly in order; otherwise what is first wrong.
    ///
    /// A file of 0 bytes needs exactly `[{0, 0}]`; otherwise empty parts are refused
    /// (they would send zero-byte requests that carry nothing).
    package static func tilingProblem(_ ranges: [ByteRange], size: Int64) -> String? {
        if size < 0 { return "file size \(size) is negative" }
        if size == 0 {
            if ranges == [ByteRange(start: 0, end: 0)] { return nil }
            return "a file of 0 bytes needs exactly one part {0, 0} (got \(ranges.count) parts)"
        }
        guard let first = ranges.first else { return "no parts, but the file has \(size) bytes" }
        if first.start != 0 { return "parts[0] starts at \(first.start), not 0" }
        for (i, range) in ranges.enumerated() {
            if range.end < range.start {
                return "parts[\(i)] ends at \(range.end), before its start \(range.start)"
            }
            if range.end == range.start { return "parts[\(i)] is empty (\(range.start) to \(range.end))" }
            if i > 0 {
                let previousEnd = ranges[i - 1].end
                if range.start > previousEnd {
                    return "parts[\(i)] starts at \(range.start) but parts[\(i - 1)] ended at \(previousEnd) (a gap)"
                }
                if range.start < previousEnd {
                    return "parts[\(i)] starts at \(range.start) but parts[\(i - 1)] ended at \(previousEnd) (an overlap)"
                }
            }
            if range.end > size {
                return "parts[\(i)] ends at \(range.end), past the end of the file (\(size) bytes)"
            }
        }
        let lastEnd = ranges[ranges.count - 1].end
        if lastEnd < size {
            return "the last part ends at \(lastEnd) but the file has \(size) bytes (\(size - lastEnd) not covered)"
        }
        return nil
    }
}
