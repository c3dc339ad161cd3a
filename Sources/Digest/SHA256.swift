import CDigest

/// SHA-256 (FIPS 180-4): body identity for the same-id rule needs no crypto library. Whole
/// blocks go through the CPU's SHA instructions where it has them (1.2-1.4 GB/s of CPU here,
/// against 0.25 GB/s for the Swift rounds, which every other CPU uses).
package enum SHA256 {
    /// Whether this CPU has the SHA extensions, asked once.
    package static let hardware = cdigest_sha256_hardware() != 0

    /// The lowercase hex SHA-256 of `bytes`.
    package static func hex(_ bytes: [UInt8]) -> String {
        var hasher = Hasher()
        hasher.update(bytes)
        return hasher.finalizeHex()
    }

    /// Incremental SHA-256 for input that arrives in pieces.
    package struct Hasher: Sendable {
        private var h0: UInt32 = 0x6a09_e667, h1: UInt32 = 0xbb67_ae85
        private var h2: UInt32 = 0x3c6e_f372, h3: UInt32 = 0xa54f_f53a
        private var h4: UInt32 = 0x510e_527f, h5: UInt32 = 0x9b05_688c
        private var h6: UInt32 = 0x1f83_d9ab, h7: UInt32 = 0x5be0_cd19
        /// Bytes of an incomplete block, waiting for more input.
        private var pending: [UInt8] = []
        private var totalBytes: UInt64 = 0
        private let hardware: Bool

        /// A hasher at the initial state; `portable` keeps to the Swift rounds (tests compare both).
        package init(portable: Bool = false) {
            hardware = SHA256.hardware && !portable
            pending.reserveCapacity(64)
        }

        /// Feeds bytes.
        package mutating func update(_ bytes: UnsafeRawBufferPointer) {
            guard bytes.count > 0 else { return }
            totalBytes &+= UInt64(bytes.count)
            var offset = 0
            if !pending.isEmpty {
                let take = Swift.min(64 - pending.count, bytes.count)
                pending.append(contentsOf: bytes[0..<take])
                offset = take
                if pending.count < 64 { return }
                let block = pending
                block.withUnsafeBytes { compress($0.baseAddress!, blocks: 1) }
                pending.removeAll(keepingCapacity: true)
            }
            // Whole blocks straight from the caller's memory: no copy.
            let blocks = (bytes.count - offset) / 64
            if blocks > 0 {
                compress(bytes.baseAddress! + offset, blocks: blocks)
                offset += blocks * 64
            }
            if offset < bytes.count {
                pending.append(contentsOf: bytes[offset...])
            }
        }

        /// Feeds bytes.
        package mutating func update(_ bytes: [UInt8]) {
            bytes.withUnsafeBytes { update($0) }
        }

        /// Pads, finishes and returns the lowercase hex digest; the hasher must not be fed afterwards.
        package mutating func finalizeHex() -> String {
            let bitLength = totalBytes &* 8
            var tail: [UInt8] = [0x80]
            let used = (pending.count + 1) % 64
            let zeros = used <= 56 ? 56 - used : 64 + 56 - used
            tail.append(contentsOf: repeatElement(0, count: zeros))
            for shift in stride(from: 56, through: 0, by: -8) {
                tail.append(UInt8(truncatingIfNeeded: bitLength >> UInt64(shift)))
            }
            let savedTotal = totalBytes
            tail.withUnsafeBytes { update($0) }
            totalBytes = savedTotal
            precondition(pending.isEmpty, "SHA-256 padding must end on a block boundary")

            let digits: [UInt8] = Array("0123456789abcdef".utf8)
            var out: [UInt8] = []
            out.reserveCapacity(64)
            for word in [h0, h1, h2, h3, h4, h5, h6, h7] {
                for shift in stride(from: 28, through: 0, by: -4) {
                    out.append(digits[Int((word >> UInt32(shift)) & 0xF)])
                }
            }
            return String(decoding: out, as: UTF8.self)
        }

        private mutating func compress(_ start: UnsafeRawPointer, blocks: Int) {
            guard hardware else {
                for n in 0..<blocks { compress(start + n * 64) }
                return
            }
            var state = (h0, h1, h2, h3, h4, h5, h6, h7)
            withUnsafeMutableBytes(of: &state) { raw in
                cdigest_sha256_blocks(
                    raw.baseAddress!.assumingMemoryBound(to: UInt32.self), start.assumingMemoryBound(to: UInt8.self), blocks)
            }
            (h0, h1, h2, h3, h4, h5, h6, h7) = state
        }

        private mutating func compress(_ block: UnsafeRawPointer) {
            withUnsafeTemporaryAllocation(of: UInt32.self, capacity: 64) { w in
                for i in 0..<16 {
                    let p = block + i * 4
                    w[i] =
                        UInt32(p.load(as: UInt8.self)) << 24
                        | UInt32(p.load(fromByteOffset: 1, as: UInt8.self)) << 16
                        | UInt32(p.load(fromByteOffset: 2, as: UInt8.self)) << 8
                        | UInt32(p.load(fromByteOffset: 3, as: UInt8.self))
                }
                for i in 16..<64 {
                    let x = w[i - 15], y = w[i - 2]
                    let s0 = rotr(x, 7) ^ rotr(x, 18) ^ (x >> 3)
                    let s1 = rotr(y, 17) ^ rotr(y, 19) ^ (y >> 10)
                    w[i] = w[i - 16] &+ s0 &+ w[i - 7] &+ s1
                }
                var a = h0, b = h1, c = h2, d = h3, e = h4, f = h5, g = h6, h = h7
                SHA256.k.withUnsafeBufferPointer { k in
                    for i in 0..<64 {
                        let s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)
                        let ch = (e & f) ^ (~e & g)
                        let t1 = h &+ s1 &+ ch &+ k[i] &+ w[i]
                        let s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)
                        let maj = (a & b) ^ (a & c) ^ (b & c)
                        let t2 = s0 &+ maj
                        h = g; g = f; f = e; e = d &+ t1
                        d = c; c = b; b = a; a = t1 &+ t2
                    }
                }
                h0 &+= a; h1 &+= b; h2 &+= c; h3 &+= d
                h4 &+= e; h5 &+= f; h6 &+= g; h7 &+= h
            }
        }

        @inline(__always)
        private func rotr(_ x: UInt32, _ n: UInt32) -> UInt32 {
            (x >> n) | (x << (32 - n))
        }
    }

    /// Round constants: the first 32 bits of the fractional parts of the cube roots of the first 64 primes.
    fileprivate static let k: [UInt32] = [
        0x428a_2f98, 0x7137_4491, 0xb5c0_fbcf, 0xe9b5_dba5, 0x3956_c25b, 0x59f1_11f1, 0x923f_82a4, 0xab1c_5ed5,
        0xd807_aa98, 0x1283_5b01, 0x2431_85be, 0x550c_7dc3, 0x72be_5d74, 0x80de_b1fe, 0x9bdc_06a7, 0xc19b_f174,
        0xe49b_69c1, 0xefbe_4786, 0x0fc1_9dc6, 0x240c_a1cc, 0x2de9_2c6f, 0x4a74_84aa, 0x5cb0_a9dc, 0x76f9_88da,
        0x983e_5152, 0xa831_c66d, 0xb003_27c8, 0xbf59_7fc7, 0xc6e0_0bf3, 0xd5a7_9147, 0x06ca_6351, 0x1429_2967,
        0x27b7_0a85, 0x2e1b_2138, 0x4d2c_6dfc, 0x5338_0d13, 0x650a_7354, 0x766a_0abb, 0x81c2_c92e, 0x9272_2c85,
        0xa2bf_e8a1, 0xa81a_664b, 0xc24b_8b70, 0xc76c_51a3, 0xd192_e819, 0xd699_0624, 0xf40e_3585, 0x106a_a070,
        0x19a4_c116, 0x1e37_6c08, 0x2748_774c, 0x34b0_bcb5, 0x391c_0cb3, 0x4ed8_aa4a, 0x5b9c_ca4f, 0x682e_6ff3,
        0x748f_82ee, 0x78a5_636f, 0x84c8_7814, 0x8cc7_0208, 0x90be_fffa, 0xa450_6ceb, 0xbef9_a3f7, 0xc671_78f2,
    ]
}
