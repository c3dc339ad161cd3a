import Foundation
@testable import OutboxModel
import Digest
import Testing

struct SHA256Tests {
    @Test(arguments: [
        ("empty", "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        ("abc", "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        (
            "448 bits", "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        ),
        (
            "896 bits",
            "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"
        ),
    ])
    func nistVectors(_ name: String, _ input: String, _ digest: String) {
        #expect(SHA256.hex(Array(input.utf8)) == digest, "\(name)")
    }

    @Test func oneMillionA() {
        let digest = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        #expect(SHA256.hex([UInt8](repeating: UInt8(ascii: "a"), count: 1_000_000)) == digest)
        // Fed in uneven pieces, through the raw-buffer entry point.
        var hasher = SHA256.Hasher()
        let piece = [UInt8](repeating: UInt8(ascii: "a"), count: 997)
        var fed = 0
        while fed < 1_000_000 {
            let n = min(piece.count, 1_000_000 - fed)
            piece.withUnsafeBytes { hasher.update(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
            fed += n
        }
        #expect(hasher.finalizeHex() == digest)
    }

    /// Lengths around the padding boundaries (55/56 bytes and 64-byte blocks).
    @Test(arguments: [
        (55, "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072"),
        (56, "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e"),
        (57, "ae14a2563ccf969d99aca69ce6bb74981f734bbf9f655f73b8f06db68cab5217"),
        (63, "75220b47218278e656f2013bb8f0c455a25eaf01e86c64924e9d48d89776d6f2"),
        (64, "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c"),
        (65, "9537c5fdf120482f7d58d25e9ed583f52c02b4e304ea814db1633ad565aed7e9"),
        (119, "000b48d4edf0fa7bee3c6236ecd2785baa5db4eeb8bb54341b029e0d9fa5fb0c"),
        (120, "13f05a0b594787f5ecd315edc96141bd3243203d1b7d4f0836f37308b276ba98"),
    ])
    func paddingBoundaries(_ length: Int, _ digest: String) {
        let input = [UInt8](repeating: UInt8(ascii: "x"), count: length)
        #expect(SHA256.hex(input) == digest)
        // Every split point gives the same digest as one update.
        for split in 0...length {
            var hasher = SHA256.Hasher()
            hasher.update(Array(input[..<split]))
            hasher.update(Array(input[split...]))
            #expect(hasher.finalizeHex() == digest, "split at \(split)")
        }
    }

    @Test func allByteValues() {
        let input = (0..<1024).map { UInt8($0 % 256) }
        #expect(SHA256.hex(input) == "785b0751fc2c53dc14a4ce3d800e69ef9ce1009eb327ccf458afe09c242c26c9")
    }
}

/// The CPU's SHA instructions and the Swift rounds give the same digests, fed whole or in pieces.
@Suite struct SHA256HardwareTests {
    @Test func bothPathsAgree() {
        var generator = SystemRandomNumberGenerator()
        for length in [0, 1, 55, 56, 63, 64, 65, 127, 128, 129, 1000, 4096, 65_537, 1 << 20] {
            let input = (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
            var portable = SHA256.Hasher(portable: true)
            portable.update(input)
            let expected = portable.finalizeHex()
            #expect(SHA256.hex(input) == expected, "\(length) bytes")
            var pieces = SHA256.Hasher()
            var fed = 0
            while fed < length {
                let n = min(Int.random(in: 1...300, using: &generator), length - fed)
                pieces.update(Array(input[fed..<(fed + n)]))
                fed += n
            }
            #expect(pieces.finalizeHex() == expected, "\(length) bytes in pieces")
        }
    }

    @Test func theHardwarePathIsTakenWhereTheCPUHasIt() throws {
        let flags = try String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8)
        let hasSHA = flags.split(separator: "\n").first { $0.hasPrefix("flags") }?.split(separator: " ").contains("sha_ni") ?? false
        #expect(SHA256.hardware == hasSHA, "/proc/cpuinfo says sha_ni: \(hasSHA)")
    }
}

/// Parts of a file hashed on threads in C give the digests the Swift hasher gives each part.
@Suite struct SHA256FileRangesTests {
    @Test func everyPartMatchesTheSwiftHasher() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<(3 << 20) + 77).map { _ in UInt8.random(in: 0...255, using: &generator) }
        let path = folder.path + "/data"
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        // Empty, under a block, exactly a block, across the 1 MiB read buffer, the whole file.
        let bounds: [(Int, Int)] = [
            (0, 0), (5, 60), (64, 128), (1000, (1 << 20) + 1001), ((1 << 20) - 3, (2 << 20) + 55), (0, bytes.count),
        ]
        let ranges = bounds.map { ByteRange(start: Int64($0.0), end: Int64($0.1)) }
        let sums = try S3Checksum.sha256Base64(path: path, ranges: ranges)
        #expect(sums.count == bounds.count)
        for ((start, end), sum) in zip(bounds, sums) {
            let expected = S3Checksum.base64(S3Checksum.bytes(hex: SHA256.hex(Array(bytes[start..<end]))))
            #expect(sum == expected, "bytes \(start)..<\(end)")
        }
        // Many parts, more than threads: each still lands at its own index.
        let many = (0..<40).map { (i: Int) -> ByteRange in
            let start = Int64(i) * 70_001
            return ByteRange(start: start, end: start + 65_536 + Int64(i))
        }
        let manySums = try S3Checksum.sha256Base64(path: path, ranges: many)
        for (range, sum) in zip(many, manySums) {
            let expected = try S3Checksum.sha256Base64(path: path, range: range)
            #expect(sum == expected, "\(range)")
        }
    }

    @Test func aPartPastTheEndOfTheFileIsAnError() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let path = try folder.write("short", String(repeating: "x", count: 1000))
        do throws(OutboxError) {
            _ = try S3Checksum.sha256Base64(path: path, ranges: [ByteRange(start: 0, end: 500), ByteRange(start: 500, end: 2000)])
            Issue.record("a file shorter than its parts was checksummed")
        } catch {
            #expect(error.code == .invalid)
            #expect(error.message.contains(path))
        }
    }
}
