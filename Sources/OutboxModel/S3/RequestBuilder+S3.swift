/// The `s3` request kind at enqueue: its templates rendered into an object URL and a target.
extension RequestBuilder {
    /// Fields of `request` an `s3` request cannot have: it is always a PUT of its object's URL.
    static let s3Excludes = ["method", "url", "parts", "data", "text", "form"]

    /// S3's limit for one PutObject.
    package static let s3MaxPutBytes: Int64 = 5 << 30

    static func checkS3Size(_ file: FileIdentity) throws(OutboxError) {
        guard file.size > s3MaxPutBytes else { return }
        throw .invalid("request.file: \(file.path) has \(file.size) bytes; an s3 request puts at most 5 GiB (one PutObject)")
    }

    /// Renders `request.s3`; returns the target and the content type it names, if any.
    static func renderS3(_ tree: JSON, request: JSON, ctx: TemplateContext) throws(OutboxError) -> (S3Target, String?) {
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
        var pathStyle = literalHost
        if let p = tree["path_style"] {
            var value = p
            if case let .string(s) = p { value = try Template.render(s, context: ctx, mode: .value, field: "request.s3.path_style") }
            switch value {
            case .bool(let b): pathStyle = b
            case .string("true"): pathStyle = true
            case .string("false"): pathStyle = false
            case .null: break
            case let other: throw .invalid("request.s3.path_style must be true or false, not \(other.serialized().prefix(40))")
            }
        }
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
        let target = S3Target(
            bucket: bucket, key: key, region: region, endpoint: endpoint, pathStyle: pathStyle, storageClass: storageClass)
        _ = try URLCheck.validate(target.objectURL, field: "request.s3 (the object URL)")
        return (target, contentType)
    }
}
