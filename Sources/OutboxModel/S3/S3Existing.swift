/// What the HEAD of an object says about a `skip_existing` upload: the object is already
/// there (same size, same SHA-256 checksum), it is not (or cannot be compared), or the HEAD failed.
package enum S3Existing: Sendable, Equatable {
    /// The object holds these bytes: the entry completes without an upload.
    case skip
    /// Upload as usual; the reason is for the log.
    case upload(String)
    /// Not an answer about the object (403, 5xx, a connection failure): classified as any attempt.
    case failed

    /// The header a HEAD sends so that S3 answers the object's checksum.
    package static let checksumModeHeader = ("x-amz-checksum-mode", "ENABLED")

    /// Decides from a HEAD's status and headers (names lowercased). `checksum` is what this
    /// upload would give the object: the SHA-256 of its bytes (base64), or for a multipart
    /// upload of `parts` parts S3's checksum of the parts' checksums (`BASE64-N`); `size` its length.
    package static func decide(
        status: Int?, headers: [String: String], size: Int64, checksum: String?, parts: Int
    ) -> S3Existing {
        guard let status else { return .failed }
        if status == 404 { return .upload("no object at the key") }
        guard (200...299).contains(status) else { return .failed }
        guard let length = headers["content-length"].flatMap({ Int64($0) }), length == size else {
            return .upload("the object has another size (\(headers["content-length"] ?? "none"), not \(size))")
        }
        guard let checksum, let theirs = headers[S3Checksum.header], !theirs.isEmpty else {
            // Without a checksum on both sides nothing proves the bytes are the same.
            return .upload("the object has no SHA-256 checksum to compare")
        }
        if checksumMatches(theirs, ours: checksum, parts: parts) { return .skip }
        return .upload("the object has another SHA-256 checksum")
    }

    /// A multipart object's checksum is answered as `BASE64-N` by S3 and as the bare `BASE64`
    /// by some servers (moto); either way it hashes the N parts' digests, so both forms match.
    static func checksumMatches(_ theirs: String, ours: String, parts: Int) -> Bool {
        if theirs == ours { return true }
        return parts > 0 && "\(theirs)-\(parts)" == ours
    }
}
