/// What kind of body a request carries.
package enum BodyKind: String, Sendable, CaseIterable {
    case none, data, text, form, file, parts
}

/// A form field as persisted: a value, or a file staged into the store.
package struct StoredFormField: Sendable, Equatable {
    package var name: String
    package var value: String?
    package var stagedFile: String?
    package var filename: String?
    package var contentType: String?

    package init(name: String, value: String?, stagedFile: String?, filename: String?, contentType: String?) {
        self.name = name
        self.value = value
        self.stagedFile = stagedFile
        self.filename = filename
        self.contentType = contentType
    }
}

/// The request an entry sends, fixed at enqueue: later edits of its definition do not
/// change what a queued entry sends.
package struct StoredRequest: Sendable {
    package var method: String
    package var url: String?
    package var headers: [(String, String)]
    package var bodyKind: BodyKind
    package var form: [StoredFormField]
    package var file: FileIdentity?
    package var ownership: Ownership?
    package var accept: [AcceptRule]
    package var retry: RetryRules
    package var response: ResponseMode
    package var followRedirects: Int
    package var redirectMethodChange = false
    /// Header names (lowercased) redacted wherever the request is shown, as `PreparedRequest`'s.
    package var secretHeaders: Set<String> = []
    /// The URL came from `env` in part: shown by its origin alone, as `PreparedRequest`'s.
    package var secretURL = false
    /// Paths of the vars that went into a secret header, redacted wherever the vars are shown.
    package var secretVars: [[JSON]] = []
    package var wifiOnly: Bool?
    package var cancelScopeOnError: Bool
    /// The object of an `s3` request: signed with the runner's credentials at each attempt.
    package var s3: S3Target?

    /// A `headers update` patch over its headers, ranking above every other source; the
    /// patch's values are secrets, as headers_command's are (it answers awaiting-auth).
    package mutating func apply(headerPatch patch: [(String, String)]) {
        headers = HeaderRules.merge(headers, patch)
        secretHeaders.formUnion(patch.map { $0.0.lowercased() })
    }

    /// A form file's staged path as the stored text writes it (`"staged_file":"PATH`, without
    /// the closing quote, so a folder prefix matches too): what a moved or copied store rewrites.
    package static func stagedFileMember(_ path: String) -> String {
        String(JSON.object([("staged_file", .string(path))]).serialized().dropFirst().dropLast(2))
    }

    /// Its member in the stored text; `list --json` looks for it to find the rows to redact.
    package static let secretVarsMember = "secret_vars"

    /// The request as the store keeps it: compact JSON text, written straight from the
    /// fields (every enqueue writes one, and a tree of values would be built only to be freed).
    package var text: String {
        var o = JSONObjectText(capacity: 512)
        o.add("method", string: method)
        o.add("url", string: url)
        o.add("headers") { out in
            out.append(UInt8(ascii: "["))
            for i in headers.indices {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                out.append(UInt8(ascii: "["))
                JSON.appendString(headers[i].0, to: &out)
                out.append(UInt8(ascii: ","))
                JSON.appendString(headers[i].1, to: &out)
                out.append(UInt8(ascii: "]"))
            }
            out.append(UInt8(ascii: "]"))
        }
        o.add("body_kind", string: bodyKind.rawValue)
        if !form.isEmpty {
            o.add(
                "form",
                .array(
                    form.map { f in
                        .object([
                            ("name", .string(f.name)), ("value", .optionalString(f.value)),
                            ("staged_file", .optionalString(f.stagedFile)),
                            ("filename", .optionalString(f.filename)), ("content_type", .optionalString(f.contentType)),
                        ])
                    }))
        }
        if let file {
            var f = JSONObjectText()
            f.add("path", string: file.path)
            f.add("size", integer: file.size)
            f.add("mtime_ns", integer: file.mtimeNs)
            f.add("inode", integer: file.inode)
            if let mode = file.mode { f.add("mode", integer: Int64(mode)) }
            o.add("file", object: f)
        }
        if let ownership { o.add("ownership", string: ownership.rawValue) }
        o.add("accept", .array(accept.map { .object([("status", .int($0.status)), ("body_includes", .optionalString($0.bodyIncludes))]) }))
        o.add("retry", retry.json)
        o.add("response", response.json)
        o.add("follow_redirects", integer: Int64(followRedirects))
        o.add("wifi_only", bool: wifiOnly)
        o.add("cancel_scope_on_error", bool: cancelScopeOnError)
        if redirectMethodChange { o.add("redirect_method_change", .bool(true)) }
        if secretURL { o.add("secret_url", .bool(true)) }
        if !secretHeaders.isEmpty { o.add("secret_headers", .array(secretHeaders.sorted().map { .string($0) })) }
        if !secretVars.isEmpty { o.add(Self.secretVarsMember, .array(secretVars.map { .array($0) })) }
        if let s3 { o.add("s3", s3.json) }
        return o.text
    }

    /// Reads a stored request back. A field that is missing or of the wrong type is damage
    /// (E_STORAGE naming the field), never a default: a wrong default would send another request.
    package init(json: JSON) throws(OutboxError) {
        let fields = StoredFields(json, what: "stored request")
        guard json.objectValue != nil else { throw fields.damage("request", "not a JSON object") }
        method = try fields.string("method")
        url = try Self.url(fields)
        headers = try fields.array("headers").map { pair throws(OutboxError) in
            guard let a = pair.arrayValue, a.count == 2, let n = a[0].stringValue, let v = a[1].stringValue else {
                throw fields.damage("headers", "a header is not a [name, value] pair")
            }
            return (n, v)
        }
        let kind = try fields.string("body_kind")
        guard let bodyKind = BodyKind(rawValue: kind) else { throw fields.damage("body_kind", "unknown body kind \"\(kind)\"") }
        self.bodyKind = bodyKind
        form = try (json["form"]?.arrayValue ?? []).map { f throws(OutboxError) in
            guard let name = f["name"]?.stringValue else { throw fields.damage("form", "a field has no name") }
            return StoredFormField(
                name: name, value: f["value"]?.stringValue, stagedFile: f["staged_file"]?.stringValue,
                filename: f["filename"]?.stringValue, contentType: f["content_type"]?.stringValue)
        }
        file = try Self.file(fields)
        if let own = try fields.optionalString("ownership") {
            guard let ownership = Ownership(rawValue: own) else { throw fields.damage("ownership", "unknown ownership \"\(own)\"") }
            self.ownership = ownership
        }
        accept = try fields.array("accept").map { a throws(OutboxError) in
            guard let status = a["status"]?.int64Value else { throw fields.damage("accept", "a rule has no status") }
            return AcceptRule(status: Int(status), bodyIncludes: a["body_includes"]?.stringValue)
        }
        retry = RetryRules(json: try fields.value("retry"))
        guard let response = ResponseMode(json: try fields.value("response")) else {
            throw fields.damage("response", "unknown response mode")
        }
        self.response = response
        followRedirects = Int(try fields.int("follow_redirects"))
        wifiOnly = json["wifi_only"]?.boolValue
        guard let cancel = json["cancel_scope_on_error"]?.boolValue else { throw fields.damage("cancel_scope_on_error", "not a boolean") }
        cancelScopeOnError = cancel
        // Added later: rows written before it have none, and meant false.
        redirectMethodChange = json["redirect_method_change"]?.boolValue ?? false
        // Added later too: rows without it showed their URL.
        secretURL = json["secret_url"]?.boolValue ?? false
        // Also added later; rows without it name none.
        if let names = json["secret_headers"] {
            guard let list = names.arrayValue?.compactMap(\.stringValue), list.count == names.arrayValue?.count else {
                throw fields.damage("secret_headers", "not a list of header names")
            }
            secretHeaders = Set(list)
        }
        if let paths = json[Self.secretVarsMember] {
            guard let list = paths.arrayValue?.compactMap(\.arrayValue), list.count == paths.arrayValue?.count,
                list.allSatisfy({ $0.allSatisfy { $0.stringValue != nil || $0.int64Value != nil } })
            else { throw fields.damage(Self.secretVarsMember, "not a list of paths into the vars") }
            secretVars = list
        }
        if let target = json["s3"] { s3 = try S3Target(json: target) }
    }

    static func url(_ fields: StoredFields) throws(OutboxError) -> String? {
        try fields.optionalString("url")
    }

    static func file(_ fields: StoredFields) throws(OutboxError) -> FileIdentity? {
        guard let f = fields.json["file"] else { return nil }
        guard let path = f["path"]?.stringValue, let size = f["size"]?.int64Value, let mtime = f["mtime_ns"]?.int64Value,
            case let .number(inodeText)? = f["inode"], let inode = UInt64(inodeText)
        else {
            throw fields.damage("file", "the file identity is incomplete")
        }
        return FileIdentity(
            path: path, size: size, mtimeNs: mtime, inode: inode, mode: f["mode"]?.int64Value.map { UInt32(truncatingIfNeeded: $0) })
    }

    package init(prepared p: PreparedRequest, form: [StoredFormField]) {
        method = p.method
        url = p.url
        headers = p.headers
        bodyKind = p.body.kind
        self.form = form
        switch p.body {
        case let .file(identity, own), let .parts(identity, own, _):
            file = identity
            ownership = own
        default:
            file = nil
            ownership = nil
        }
        accept = p.accept
        retry = p.retry
        response = p.response
        followRedirects = p.followRedirects
        redirectMethodChange = p.redirectMethodChange
        secretHeaders = p.secretHeaders
        secretURL = p.secretURL
        secretVars = p.secretVars
        wifiOnly = p.wifiOnly
        cancelScopeOnError = p.cancelScopeOnError
        s3 = p.s3
    }
}

/// Reads the fields of a stored JSON document, failing with E_STORAGE on damage.
package struct StoredFields {
    let json: JSON
    let what: String

    package init(_ json: JSON, what: String) {
        self.json = json
        self.what = what
    }

    package func damage(_ field: String, _ why: String) -> OutboxError {
        .storage("the \(what) is damaged: \(field): \(why)")
    }

    package func value(_ field: String) throws(OutboxError) -> JSON {
        guard let v = json[field] else { throw damage(field, "missing") }
        return v
    }

    package func string(_ field: String) throws(OutboxError) -> String {
        guard let v = try value(field).stringValue else { throw damage(field, "not a string") }
        return v
    }

    package func optionalString(_ field: String) throws(OutboxError) -> String? {
        guard let v = json[field], v != .null else { return nil }
        guard let s = v.stringValue else { throw damage(field, "not a string") }
        return s
    }

    package func int(_ field: String) throws(OutboxError) -> Int64 {
        guard let v = try value(field).int64Value else { throw damage(field, "not an integer") }
        return v
    }

    package func array(_ field: String) throws(OutboxError) -> [JSON] {
        guard let v = try value(field).arrayValue else { throw damage(field, "not an array") }
        return v
    }
}
