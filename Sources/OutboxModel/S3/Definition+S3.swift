import YAML

extension Definition {
    /// Checks what can be seen of `request.s3` before rendering: its fields, the ones it
    /// needs, and the request fields it cannot be given with.
    static func checkS3(_ node: YAMLNode, request f: [String: YAMLNode], reader: inout YAMLReader) {
        guard let s = reader.fields(node, DefinitionFields.s3, context: "request.s3") else { return }
        for field in DefinitionFields.s3.fields where field.isRequired && s[field.name] == nil {
            reader.error(node.mark, "request.s3 needs \(field.name)")
        }
        for name in RequestBuilder.s3Excludes {
            guard let other = f[name] else { continue }
            reader.error(
                other.mark, "request.\(name) cannot be given with request.s3: an s3 request is a PUT of its file to the object's URL")
        }
        if f["file"] == nil { reader.error(node.mark, "request.s3 needs request.file (the object's bytes)") }
        if let c = s["content_type"], f["content_type"] != nil {
            reader.error(c.mark, "give the content type once: request.content_type or request.s3.content_type")
        }
        for name in ["path_style", "skip_existing"] {
            guard let p = s[name], case .string(let text)? = p.scalar, !text.contains("{{") else { continue }
            _ = reader.bool(p, "request.s3.\(name)")
        }
        if let c = s["content_type"], case .string(let text)? = c.scalar, !text.contains("{{"), let problem = HeaderRules.valueProblem(text)
        {
            reader.error(c.mark, "request.s3.content_type: \(problem)")
        }
        for name in ["multipart_threshold", "part_size"] {
            guard let n = s[name], case .string(let text)? = n.scalar, !text.contains("{{") else { continue }
            let size = try? Units.parseSize(text)
            if size.map({ !(RequestBuilder.s3MinPart...RequestBuilder.s3MaxPart).contains($0) }) ?? true {
                reader.error(n.mark, "request.s3.\(name) must be a size from 5MiB to 5GiB, not \"\(text)\"")
            }
        }
        for name in ["bucket", "region", "storage_class"] {
            guard let n = s[name], case .string(let text)? = n.scalar, !text.contains("{{") else { continue }
            let problem =
                switch name {
                case "bucket": S3Rules.bucketProblem(text)
                case "region": S3Rules.regionProblem(text)
                default: S3Rules.storageClassProblem(text)
                }
            if let problem { reader.error(n.mark, problem) }
        }
    }
}
