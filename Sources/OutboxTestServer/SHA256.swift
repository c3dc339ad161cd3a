/// Incremental SHA-256, so multi-GB request bodies are hashed as they stream in.
///
/// Written here because the server may import only Glibc; it works on raw pointers
/// so a debug build still hashes tens of MB per second.
public struct SHA256: Sendable {
    private var h: (UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32) = (
        0x6a09_e667, 0xbb67_ae85, 0x3c6e_f372, 0xa54f_f53a,
        0x510e_527f, 0x9b05_688c, 0x1f83_d9ab, 0x5be0_cd19
    )
    /// Bytes of an incomplete block, waiting for more input.
    private var pending: [UInt8] = []
    private var totalBytes: UInt64 = 0

    private static let k: [UInt32] = [
        0x428a_2f98, 0x7137_4491, 0xb5c0_fbcf, 0xe9b5_dba5, 0x3956_c25b, 0x59f1_11f1, 0x923f_82a4, 0xab1c_5ed5,
        0xd807_aa98, 0x1283_5b01, 0x2431_85be, 0x550c_7dc3, 0x72be_5d74, 0x80de_b1fe, 0x9bdc_06a7, 0xc19b_f174,
        0xe49b_69c1, 0xefbe_4786, 0x0fc1_9dc6, 0x240c_a1cc, 0x2de9_2c6f, 0x4a74_84aa, 0x5cb0_a9dc, 0x76f9_88da,
        0x983e_5152, 0xa831_c66d, 0xb003_27c8, 0xbf59_7fc7, 0xc6e0_0bf3, 0xd5a7_9147, 0x06ca_6351, 0x1429_2967,
        0x27b7_0a85, 0x2e1b_2138, 0x4d2c_6dfc, 0x5338_0d13, 0x650a_7354, 0x766a_0abb, 0x81c2_c92e, 0x9272_2c85,
        0xa2bf_e8a1, 0xa81a_664b, 0xc24b_8b70, 0xc76c_51a3, 0xd192_e819, 0xd699_0624, 0xf40e_3585, 0x106a_a070,
        0x19a4_c116, 0x1e37_6c08, 0x2748_774c, 0x34b0_bcb5, 0x391c_0cb3, 0x4ed8_aa4a, 0x5b9c_ca4f, 0x682e_6ff3,
        0x748f_82ee, 0x78a5_636f, 0x84c8_7814, 0x8cc7_0208, 0x90be_fffa, 0xa450_6ceb, 0xbef9_a3f7, 0xc671_78f2,
    ]

    /// Starts an empty hash.
    public init() {}

    /// Hashes `bytes` in one call and returns lowercase hex.
    public static func hex<S: Sequence>(_ bytes: S) -> String where S.Element == UInt8 {
        var hasher = SHA256()
        let array = Array(bytes)
        array.withUnsafeBytes { hasher.update($0) }
        return hasher.finalizeHex()
    }

    /// Feeds more input.
    public mutating func update(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { update($0) }
    }

    /// Feeds more input from raw memory (no copy for whole blocks).
    public mutating func update(_ buffer: UnsafeRawBufferPointer) {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return }
        totalBytes &+= UInt64(buffer.count)
        var offset = 0
        let count = buffer.count
        if !pending.isEmpty {
            let take = min(64 - pending.count, count)
            pending.append(contentsOf: UnsafeRawBufferPointer(start: base, count: take))
            offset = take
            if pending.count == 64 {
                let block = pending
                block.withUnsafeBytes { compress($0.baseAddress!, blocks: 1) }
                pending.removeAll(keepingCapacity: true)
            }
        }
        let whole = (count - offset) / 64
        if whole > 0 {
            compress(base + offset, blocks: whole)
            offset += whole * 64
        }
        if offset < count {
            pending.append(contentsOf: UnsafeRawBufferPointer(start: base + offset, count: count - offset))
        }
    }

    /// Finishes the hash and returns the 32-byte digest.
    public mutating func finalize() -> [UInt8] {
        let bitLength = totalBytes &* 8
        var tail = pending
        tail.append(0x80)
        while tail.count % 64 != 56 { tail.append(0) }
        for shift in stride(from: 56, through: 0, by: -8) {
            tail.append(UInt8(truncatingIfNeeded: bitLength >> UInt64(shift)))
        }
        tail.withUnsafeBytes { compress($0.baseAddress!, blocks: tail.count / 64) }
        pending = []
        var out: [UInt8] = []
        out.reserveCapacity(32)
        for word in [h.0, h.1, h.2, h.3, h.4, h.5, h.6, h.7] {
            out.append(UInt8(truncatingIfNeeded: word >> 24))
            out.append(UInt8(truncatingIfNeeded: word >> 16))
            out.append(UInt8(truncatingIfNeeded: word >> 8))
            out.append(UInt8(truncatingIfNeeded: word))
        }
        return out
    }

    /// Finishes the hash and returns lowercase hex.
    public mutating func finalizeHex() -> String {
        let digits: [UInt8] = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(64)
        for byte in finalize() {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: text, as: UTF8.self)
    }

    @_transparent
    private static func rotr(_ x: UInt32, _ n: UInt32) -> UInt32 { (x >> n) | (x << (32 &- n)) }

    private mutating func compress(_ data: UnsafeRawPointer, blocks: Int) {
        let w = UnsafeMutablePointer<UInt32>.allocate(capacity: 64)
        defer { w.deallocate() }
        Self.k.withUnsafeBufferPointer { kb in
            let k = kb.baseAddress!
            var (a0, b0, c0, d0, e0, f0, g0, h0) = h
            var block = 0
            while block < blocks {
                let p = data + block * 64
                block += 1
                // `while` loops, not ranges: debug builds call into the iterator per step.
                var i = 0
                while i < 16 {
                    let q = p + i * 4
                    w[i] = UInt32(q.load(fromByteOffset: 0, as: UInt8.self)) << 24
                        | UInt32(q.load(fromByteOffset: 1, as: UInt8.self)) << 16
                        | UInt32(q.load(fromByteOffset: 2, as: UInt8.self)) << 8
                        | UInt32(q.load(fromByteOffset: 3, as: UInt8.self))
                    i += 1
                }
                while i < 64 {
                    let x = w[i &- 15], y = w[i &- 2]
                    let s0 = Self.rotr(x, 7) ^ Self.rotr(x, 18) ^ (x >> 3)
                    let s1 = Self.rotr(y, 17) ^ Self.rotr(y, 19) ^ (y >> 10)
                    w[i] = w[i &- 16] &+ s0 &+ w[i &- 7] &+ s1
                    i += 1
                }
                var a = a0, b = b0, c = c0, d = d0, e = e0, f = f0, g = g0, hh = h0
                i = 0
                while i < 64 {
                    let s1 = Self.rotr(e, 6) ^ Self.rotr(e, 11) ^ Self.rotr(e, 25)
                    let ch = (e & f) ^ (~e & g)
                    let t1 = hh &+ s1 &+ ch &+ k[i] &+ w[i]
                    let s0 = Self.rotr(a, 2) ^ Self.rotr(a, 13) ^ Self.rotr(a, 22)
                    let maj = (a & b) ^ (a & c) ^ (b & c)
                    let t2 = s0 &+ maj
                    hh = g; g = f; f = e; e = d &+ t1
                    d = c; c = b; b = a; a = t1 &+ t2
                    i += 1
                }
                a0 = a0 &+ a; b0 = b0 &+ b; c0 = c0 &+ c; d0 = d0 &+ d
                e0 = e0 &+ e; f0 = f0 &+ f; g0 = g0 &+ g; h0 = h0 &+ hh
            }
            h = (a0, b0, c0, d0, e0, f0, g0, h0)
        }
    }
}
