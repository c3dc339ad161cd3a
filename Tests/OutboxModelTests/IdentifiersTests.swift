import OutboxModel
import Testing

struct IdentifiersTests {
    @Test func uuidIsVersion4Lowercase() {
        var seen = Set<String>()
        for _ in 0..<200 {
            let id = Identifiers.uuid()
            let bytes = Array(id.utf8)
            #expect(bytes.count == 36)
            for (i, b) in bytes.enumerated() {
                if [8, 13, 18, 23].contains(i) {
                    #expect(b == UInt8(ascii: "-"), "\(id)")
                } else {
                    #expect((b >= 0x30 && b <= 0x39) || (b >= 0x61 && b <= 0x66), "\(id)")
                }
            }
            #expect(bytes[14] == UInt8(ascii: "4"), "version nibble in \(id)")
            #expect("89ab".utf8.contains(bytes[19]), "variant nibble in \(id)")
            #expect(Identifiers.validateUserID(id) == nil)
            seen.insert(id)
        }
        #expect(seen.count == 200)
    }

    /// Ids come from a pool of kernel random bytes refilled every 64 draws: across many
    /// refills, from several threads at once, no draw repeats and the bits look random.
    @Test func pooledRandomNeverRepeatsAcrossRefillsAndThreads() async {
        let drawn = await withTaskGroup(of: [UInt64].self) { group in
            for _ in 0..<4 {
                group.addTask {
                    var rng = PooledSystemRandom()
                    return (0..<5_000).map { _ in rng.next() }
                }
            }
            var all: [UInt64] = []
            for await part in group { all += part }
            return all
        }
        #expect(drawn.count == 20_000)
        #expect(Set(drawn).count == 20_000)
        // Each bit is set in about half of the draws (20,000 draws: 50 % ± 2 %).
        for bit in 0..<64 {
            let ones = drawn.filter { $0 >> UInt64(bit) & 1 == 1 }.count
            #expect((9_600...10_400).contains(ones), "bit \(bit) set in \(ones) of 20,000 draws")
        }
    }

    @Test func entryUUIDIsVersion7AndSortsInTheOrderItWasMade() throws {
        let before = Identifiers.nowMs()
        let ids = (0..<5000).map { _ in Identifiers.entryUUID() }
        let after = Identifiers.nowMs()
        // Many ids fall in one millisecond: the counter keeps them strictly increasing.
        #expect(ids == ids.sorted())
        #expect(Set(ids).count == ids.count)
        for id in [ids.first!, ids.last!] {
            let bytes = Array(id.utf8)
            #expect(bytes.count == 36)
            #expect(bytes[14] == UInt8(ascii: "7"), "version nibble in \(id)")
            #expect("89ab".utf8.contains(bytes[19]), "variant nibble in \(id)")
            #expect(Identifiers.validateUserID(id) == nil)
            // The first 48 bits are Unix milliseconds.
            let hex = String(id.filter { $0 != "-" }.prefix(12))
            let ms = try #require(Int64(hex, radix: 16))
            #expect(ms >= before)
            #expect(ms <= after + 5000 / 4096 + 1, "the counter carries into the millisecond only past 4096 ids")
        }
    }

    @Test(arguments: [
        ("letters", "abc"),
        ("single character", "a"),
        ("every allowed character", "Az09._:@-"),
        ("uuid", "0f8fad5b-d9cb-469f-a165-70867728950e"),
        ("email-like", "user@example.com:42"),
        ("starts with a digit", "1-2"),
        ("starts with underscore", "_x"),
        ("dot inside and at the end", "a.b."),
        ("128 characters", String(repeating: "x", count: 128)),
    ])
    func acceptsID(_ name: String, _ id: String) {
        #expect(Identifiers.validateUserID(id) == nil, "\(name)")
    }

    @Test(arguments: [
        ("empty", "", "id must not be empty"),
        ("space", "a b", #"id "a b" contains " " (allowed: A-Z a-z 0-9 . _ : @ -)"#),
        ("slash", "a/b", #"id "a/b" contains "/" (allowed: A-Z a-z 0-9 . _ : @ -)"#),
        ("non-ASCII", "café", #"id "café" contains "é" (allowed: A-Z a-z 0-9 . _ : @ -)"#),
        ("newline is escaped as in JSON", "a\nb", #"id "a\nb" contains "\n" (allowed: A-Z a-z 0-9 . _ : @ -)"#),
        ("a control character too", "a\u{1}b", #"id "a\u0001b" contains "\u0001" (allowed: A-Z a-z 0-9 . _ : @ -)"#),
        ("quote is escaped", "a\"b", #"id "a\"b" contains "\"" (allowed: A-Z a-z 0-9 . _ : @ -)"#),
        ("leading dot", ".hidden", #"id ".hidden" must not start with ".""#),
        ("leading dash", "-rf", #"id "-rf" must not start with "-""#),
        (
            "129 characters", String(repeating: "x", count: 129),
            "id \"" + String(repeating: "x", count: 40) + "…\" is 129 characters long (at most 128)"
        ),
        (
            "long with a bad character is cut", String(repeating: "y", count: 50) + "!",
            "id \"" + String(repeating: "y", count: 40) + "…\" contains \"!\" (allowed: A-Z a-z 0-9 . _ : @ -)"
        ),
    ])
    func rejectsID(_ name: String, _ id: String, _ message: String) {
        #expect(Identifiers.validateUserID(id) == message, "\(name)")
    }

    @Test func clocks() {
        let now = Identifiers.nowMs()
        // After 2024-01-01 and before 2100: a real epoch in milliseconds.
        #expect(now > 1_704_067_200_000 && now < 4_102_444_800_000)
        let a = Identifiers.monotonicMs()
        let b = Identifiers.monotonicMs()
        #expect(a >= 0 && b >= a)
    }
}
