/// The `s3` request kind at enqueue: its templates rendered into an object URL and a target.
extension RequestBuilder {
    /// Fields of `request` an `s3` request cannot have: it is always a PUT of its object's URL.
    static let s3Excludes = ["method", "url", "parts", "data", "text", "form"]

    /// S3's limits: parts of 5 MiB (but the last) to 5 GiB, at most 10,000, objects up to 5 TiB.
    package static let s3MinPart: Int64 = 5 << 20
    package static let s3MaxPart: Int64 = 5 << 30
    package static let s3MaxObject: Int64 = 5 << 40
    package static let s3DefaultThreshold: Int64 = 64 << 20
    package static let s3DefaultPartSize: Int64 = 16 << 20

    /// A file over the threshold is a multipart upload: its parts, each `?partNumber=N` of the
    /// object (the upload id is added when it is sent); nil for one PutObject.
    static func s3Parts(_ s3: S3Rendered, file: FileIdentity) throws(OutboxError) -> [PreparedPart]? {
        if file.size <= s3.threshold { return nil }
        guard file.size <= s3MaxObject else {
            throw .invalid("request.file: \(file.path) has \(file.size) bytes; an S3 object holds at most 5 TiB")
        }
        let ranges = try s3Ranges(size: file.size, partSize: s3.partSize)
        if let largest = ranges.map(\.count).max(), largest > s3MaxPart {
            throw .invalid("request.file: \(file.path) needs parts of \(largest) bytes, over S3's 5 GiB")
        }
        let url = s3.target.objectURL
        let sums = try S3Checksum.sha256Base64(path: file.path, ranges: ranges)
        var parts: [PreparedPart] = []
        for (i, (range, sum)) in zip(ranges, sums).enumerated() {
            parts.append(PreparedPart(range: range, url: "\(url)?partNumber=\(i + 1)", headers: [HeaderPair(S3Checksum.header, sum)]))
        }
        return parts
    }

    /// The body of an s3 request: one PutObject (its checksum a header) up to the threshold
    /// (at most 5 GiB, S3's limit for one PutObject), parts over it. A file is checksummed at
    /// enqueue, so `move` (whose same-id enqueue may name a file already gone) is refused.
    static func s3Body(
        _ s3: S3Rendered, file: FileIdentity, ownership: Ownership?, headers: [(String, String)]
    ) throws(OutboxError) -> (PreparedBody, [(String, String)]) {
        if ownership == .move {
            throw .invalid(
                "request.ownership: an s3 request cannot move its file into the store (it is checksummed at enqueue); give copy or reference"
            )
        }
        if let parts = try s3Parts(s3, file: file) { return (.parts(file, ownership ?? .copy, parts), headers) }
        let sum = try S3Checksum.sha256Base64(path: file.path, range: ByteRange(start: 0, end: file.size))
        // The algorithm's name too, as AWS's SDKs send it: servers that keep a checksum only
        // when it is named (moto) then answer it to a HEAD, which `skip_existing` compares.
        let checksum = [(S3Checksum.header, sum), (S3Checksum.algorithmHeader, "SHA256")]
        return (.file(file, ownership ?? .copy), HeaderRules.merge(headers, checksum))
    }

    /// The parts of a multipart upload: `partSize` each (grown to fit 10,000), a last piece
    /// under 5 MiB joined to the part before it.
    package static func s3Ranges(size: Int64, partSize: Int64) throws(OutboxError) -> [ByteRange] {
        try ChunkPlan.plan(size: size, min: s3MinPart, max: partSize, maxParts: 10_000)
    }

    /// What `request.s3` renders to.
    struct S3Rendered {
        var target: S3Target
        var contentType: String?
        var threshold: Int64
        var partSize: Int64
    }

    /// Renders `request.s3`.
    static func renderS3(_ tree: JSON, request: JSON, ctx: TemplateContext) throws(OutboxError) -> S3Rendered {
        guard case let .object(members) = tree else { throw .invalid("request.s3 must be an object, not \(tree.typeName)") }
        for (name, _) in members where !DefinitionFields.s3.names.contains(name) {
            throw .invalid("request.s3: unknown field \"\(name)\"")
        }
        for name in s3Excludes where request[name] != nil {
            throw .invalid("request.s3 cannot be given with request.\(name): an s3 request is a PUT of its file to the object's URL")
        }
        guard request["file"] != nil else { throw .invalid("request.s3 needs request.file (the object's bytes)") }
        if request["content_type"] != nil, tree["content_type"] != nil {
            throw .invalid("give the content type once: request.content_type or request.s3.content_type")
        }

        func text(_ name: String, required: Bool) throws(OutboxError) -> String? {
            guard let t = tree[name] else {
                if required { throw .invalid("request.s3.\(name) is required") }
                return nil
            }
            let value: JSON
            if case let .string(s) = t {
                value = try Template.render(s, context: ctx, mode: .value, field: "request.s3.\(name)")
            } else {
                value = t
            }
            if value.isNull, !required { return nil }
            guard let s = value.stringValue else {
                throw .invalid("request.s3.\(name) must be a string, not \(value.typeName)")
            }
            return s
        }

        let bucket = try text("bucket", required: true)!
        if let problem = S3Rules.bucketProblem(bucket) { throw .invalid(problem) }
        let key = try text("key", required: true)!
        if let problem = S3Rules.keyProblem(key) { throw .invalid(problem) }
        let region = try text("region", required: true)!
        if let problem = S3Rules.regionProblem(region) { throw .invalid(problem) }

        var endpoint = S3Target.defaultEndpoint(region: region)
        var literalHost = false
        if let given = try text("endpoint", required: false), !given.isEmpty {
            (endpoint, literalHost) = try S3Rules.endpoint(given)
        }
        func flag(_ name: String) throws(OutboxError) -> Bool? {
            guard let p = tree[name] else { return nil }
            var value = p
            if case let .string(s) = p { value = try Template.render(s, context: ctx, mode: .value, field: "request.s3.\(name)") }
            switch value {
            case .bool(let b): return b
            case .string("true"): return true
            case .string("false"): return false
            case .null: return nil
            case let other: throw .invalid("request.s3.\(name) must be true or false, not \(other.serialized().prefix(40))")
            }
        }
        let pathStyle = try flag("path_style") ?? literalHost
        if !pathStyle && literalHost {
            throw .invalid(
                "request.s3.path_style cannot be false with endpoint \(endpoint): an IP address or localhost has no bucket subdomains")
        }
        if !pathStyle && bucket.contains(".") && endpoint.hasPrefix("https://") {
            // A dotted bucket as a subdomain does not match the endpoint's wildcard certificate.
            throw .invalid(
                "request.s3.bucket \"\(bucket)\" has dots: give path_style: true (TLS certificates do not cover it as a subdomain)")
        }

        var storageClass: String?
        if let s = try text("storage_class", required: false), !s.isEmpty {
            if let problem = S3Rules.storageClassProblem(s) { throw .invalid(problem) }
            storageClass = s
        }
        var contentType: String?
        if let c = try text("content_type", required: false), !c.isEmpty {
            if let problem = HeaderRules.valueProblem(c) { throw .invalid("request.s3.content_type: \(problem)") }
            contentType = c
        }
        func size(_ name: String, _ fallback: Int64, _ range: ClosedRange<Int64>) throws(OutboxError) -> Int64 {
            guard let t = tree[name] else { return fallback }
            var value = t
            if case let .string(s) = t { value = try Template.render(s, context: ctx, mode: .value, field: "request.s3.\(name)") }
            var n = value.int64Value
            if n == nil, let s = value.stringValue {
                do { n = try Units.parseSize(s) } catch { throw .invalid("request.s3.\(name): \(error.message)") }
            }
            guard let n, range.contains(n) else {
                throw .invalid("request.s3.\(name) must be a size from 5MiB to 5GiB, not \(value.serialized().prefix(40))")
            }
            return n
        }
        let target = S3Target(
            bucket: bucket, key: key, region: region, endpoint: endpoint, pathStyle: pathStyle, storageClass: storageClass,
            skipExisting: try flag("skip_existing") ?? false)
        _ = try URLCheck.validate(target.objectURL, field: "request.s3 (the object URL)")
        return S3Rendered(
            target: target, contentType: contentType,
            threshold: try size("multipart_threshold", s3DefaultThreshold, s3MinPart...s3MaxPart),
            partSize: try size("part_size", s3DefaultPartSize, s3MinPart...s3MaxPart))
    }
}
