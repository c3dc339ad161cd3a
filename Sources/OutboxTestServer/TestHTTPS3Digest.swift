/// S3's check of `x-amz-checksum-sha256` on the bytes it received, for the paths no route or
/// script answers: a body whose SHA-256 is not the one announced is refused as S3 refuses it
/// (moto's server checks nothing, so the refusal is tested here).
enum S3DigestCheck {
    static let refusalBody =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>BadDigest</Code>"
        + "<Message>The SHA256 you specified did not match the calculated checksum.</Message></Error>"

    /// 400 `BadDigest` when the request announces a checksum its body does not have; nil otherwise
    /// (no header, a body cut short, or a server that does not hash bodies).
    static func refusal(_ request: RecordedRequest) -> TestResponse? {
        guard let claimed = request.header("x-amz-checksum-sha256"), request.completed, !request.bodySHA256.isEmpty else {
            return nil
        }
        if claimed == base64(hex: request.bodySHA256) { return nil }
        return .status(400, body: refusalBody, headers: [("Content-Type", "application/xml")])
    }

    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    /// Base64 of the bytes a lowercase hex digest spells.
    static func base64(hex: String) -> String {
        var bytes: [UInt8] = []
        var high: UInt8?
        for c in hex.utf8 {
            let v = c <= 0x39 ? c &- 0x30 : c &- 0x61 &+ 10
            if let h = high {
                bytes.append(h << 4 | v)
                high = nil
            } else {
                high = v
            }
        }
        var out: [UInt8] = []
        var i = 0
        while i < bytes.count {
            let n = min(3, bytes.count - i)
            let b0 = bytes[i]
            let b1 = n > 1 ? bytes[i + 1] : 0
            let b2 = n > 2 ? bytes[i + 2] : 0
            out.append(alphabet[Int(b0 >> 2)])
            out.append(alphabet[Int((b0 & 0x03) << 4 | b1 >> 4)])
            out.append(n > 1 ? alphabet[Int((b1 & 0x0F) << 2 | b2 >> 6)] : UInt8(ascii: "="))
            out.append(n > 2 ? alphabet[Int(b2 & 0x3F)] : UInt8(ascii: "="))
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }
}
