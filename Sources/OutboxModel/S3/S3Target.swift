/// The S3 object an `s3` request puts: rendered and checked at enqueue, signed when sent.
package struct S3Target: Sendable, Equatable {
    package var bucket: String
    /// The object key, as S3 stores it (not percent-encoded).
    package var key: String
    package var region: String
    /// `scheme://host[:port]`, without a trailing slash.
    package var endpoint: String
    package var pathStyle: Bool
    package var storageClass: String?
    /// HEAD the object before sending it, and settle without uploading when it is already there.
    package var skipExisting: Bool

    package init(
        bucket: String, key: String, region: String, endpoint: String, pathStyle: Bool, storageClass: String?,
        skipExisting: Bool = false
    ) {
        self.bucket = bucket
        self.key = key
        self.region = region
        self.endpoint = endpoint
        self.pathStyle = pathStyle
        self.storageClass = storageClass
        self.skipExisting = skipExisting
    }

    /// The endpoint used when none is given: AWS's regional one.
    package static func defaultEndpoint(region: String) -> String { "https://s3.\(region).amazonaws.com" }

    /// libcurl's signing provider: AWS's algorithm name, the `amz` header prefix, the region and the service.
    package var signingProvider: String { "aws:amz:\(region):s3" }

    /// The object's URL. The key is encoded the way SigV4 canonicalises a path (each segment
    /// with only A-Z a-z 0-9 - . _ ~ left as they are), since libcurl signs the path as sent.
    package var objectURL: String {
        let path = Self.encodeKey(key)
        if pathStyle { return "\(endpoint)/\(bucket)/\(path)" }
        guard let schemeEnd = endpoint.firstRange(of: "://") else { return "\(endpoint)/\(bucket)/\(path)" }
        return "\(endpoint[..<schemeEnd.upperBound])\(bucket).\(endpoint[schemeEnd.upperBound...])/\(path)"
    }

    package static func encodeKey(_ key: String) -> String {
        key.split(separator: "/", omittingEmptySubsequences: false).map { URLCheck.encodeComponent(String($0)) }
            .joined(separator: "/")
    }

    package var json: JSON {
        var members: [(String, JSON)] = [
            ("bucket", .string(bucket)), ("key", .string(key)), ("region", .string(region)),
            ("endpoint", .string(endpoint)), ("path_style", .bool(pathStyle)),
        ]
        if let storageClass { members.append(("storage_class", .string(storageClass))) }
        if skipExisting { members.append(("skip_existing", .bool(true))) }
        return .object(members)
    }

    /// Reads a stored target back; a missing field is damage, never a default.
    package init(json: JSON) throws(OutboxError) {
        let fields = StoredFields(json, what: "stored request")
        bucket = try fields.string("bucket")
        key = try fields.string("key")
        region = try fields.string("region")
        endpoint = try fields.string("endpoint")
        guard let pathStyle = json["path_style"]?.boolValue else { throw fields.damage("s3.path_style", "not a boolean") }
        self.pathStyle = pathStyle
        storageClass = try fields.optionalString("storage_class")
        // Rows written before the option have no such field: they always upload.
        guard let skipExisting = (json["skip_existing"] ?? .bool(false)).boolValue else {
            throw fields.damage("s3.skip_existing", "not a boolean")
        }
        self.skipExisting = skipExisting
    }
}

/// The checks of an `s3` request's fields: each problem names the field and the value.
package enum S3Rules {
    /// S3's bucket naming rules: 3-63 lowercase letters, digits, dots and hyphens, a letter
    /// or digit at both ends, no two dots in a row.
    package static func bucketProblem(_ bucket: String) -> String? {
        let b = Array(bucket.utf8)
        let allowed = b.allSatisfy { isLowerOrDigit($0) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "-") }
        guard (3...63).contains(b.count), allowed, isLowerOrDigit(b.first!), isLowerOrDigit(b.last!), !bucket.contains("..") else {
            return "request.s3.bucket must be 3 to 63 lowercase letters, digits, dots or hyphens, "
                + "starting and ending with a letter or digit, not \(Units.quoted(bucket, limit: 80))"
        }
        return nil
    }

    /// A key is 1 to 1024 bytes; `.` and `..` segments are refused, since HTTP clients and
    /// proxies squash them and the object would land under another key.
    package static func keyProblem(_ key: String) -> String? {
        if key.isEmpty || key.utf8.count > 1024 { return "request.s3.key must be 1 to 1024 bytes, not \(key.utf8.count)" }
        if key.utf8.contains(where: { $0 < 0x20 || $0 == 0x7F }) { return "request.s3.key must not contain control characters" }
        if key.split(separator: "/", omittingEmptySubsequences: false).contains(where: { $0 == "." || $0 == ".." }) {
            return "request.s3.key must not have . or .. segments, not \(Units.quoted(key, limit: 80))"
        }
        return nil
    }

    package static func regionProblem(_ region: String) -> String? {
        let r = Array(region.utf8)
        guard (1...64).contains(r.count), r.allSatisfy({ isLowerOrDigit($0) || $0 == UInt8(ascii: "-") }) else {
            return "request.s3.region must be a region name such as eu-west-3, not \(Units.quoted(region, limit: 80))"
        }
        return nil
    }

    package static func storageClassProblem(_ value: String) -> String? {
        let v = Array(value.utf8)
        let ok = v.allSatisfy { ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x30 && $0 <= 0x39) || $0 == UInt8(ascii: "_") }
        guard (1...64).contains(v.count), ok else {
            return "request.s3.storage_class must be a storage class such as STANDARD_IA, not \(Units.quoted(value, limit: 80))"
        }
        return nil
    }

    /// Checks an endpoint (`http(s)://host[:port]`, a trailing slash allowed) and returns it
    /// without the slash, with whether its host is an IP address or `localhost` (no virtual hosts there).
    package static func endpoint(_ value: String) throws(OutboxError) -> (endpoint: String, literalHost: Bool) {
        var text = value
        while text.hasSuffix("/") { text.removeLast() }
        let checked = try URLCheck.validate(text, field: "request.s3.endpoint")
        guard let schemeEnd = checked.firstRange(of: "://") else { throw .invalid("request.s3.endpoint must be an http or https URL") }
        let authority = checked[schemeEnd.upperBound...]
        if authority.contains("/") || authority.contains("?") || authority.contains("#") || authority.contains("@") {
            throw .invalid(
                "request.s3.endpoint must be scheme://host[:port] without a path, query or user, not \(Units.quoted(value, limit: 120))")
        }
        let host: Substring
        if authority.hasPrefix("[") {
            host = authority.prefix { $0 != "]" }
        } else {
            host = authority.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)[0]
        }
        let lower = host.lowercased()
        let literal = host.hasPrefix("[") || lower == "localhost" || isIPv4(host)
        return (checked, literal)
    }

    private static func isLowerOrDigit(_ b: UInt8) -> Bool { (b >= 0x61 && b <= 0x7A) || (b >= 0x30 && b <= 0x39) }

    private static func isIPv4(_ s: Substring) -> Bool {
        let parts = s.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts.allSatisfy { !$0.isEmpty && $0.count <= 3 && $0.allSatisfy(\.isNumber) }
    }
}
