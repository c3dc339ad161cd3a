/// Renders a definition with an entry's vars and validates the result (docs/definitions.md).
package enum RequestBuilder {
    /// The longest rendered `scope`, in bytes.
    static let maxScopeBytes = 1024

    package static func context(_ inputs: RenderInputs, file: JSON? = nil) -> TemplateContext {
        var roots: [String: JSON] = [
            "vars": inputs.vars,
            "entry": .object([("id", .string(inputs.id))]),
            "env": inputs.environmentJSON ?? environmentJSON(inputs.environment),
        ]
        if let file { roots["file"] = file }
        if let outcome = inputs.outcome { roots["outcome"] = outcome }
        if let literals = inputs.literals { roots[PluginAnswer.root] = literals }
        return TemplateContext(roots: roots)
    }

    /// The `env` template root: the environment as a JSON object in name order.
    package static func environmentJSON(_ environment: [String: String]) -> JSON {
        .object(environment.sorted { $0.key < $1.key }.map { ($0.key, .string($0.value)) })
    }

    /// Renders the config's header templates (lowest precedence).
    package static func configHeaders(_ config: Config, inputs: RenderInputs) throws(OutboxError) -> [(String, String)] {
        let ctx = context(inputs)
        var out: [(String, String)] = []
        for (name, template) in config.headers {
            let value = try Template.render(template, context: ctx, mode: .header, field: "config headers.\(name)")
            out.append((name, value.stringValue ?? value.serialized()))
        }
        return out
    }

    /// Builds the prepared request from a definition's template tree (or a request_command's
    /// descriptor, with `descriptorFields` true so accept/retry/expires_in are read from it).
    package static func prepare(
        request tree: JSON, definition: Definition, config: Config, inputs: RenderInputs,
        fromCommand: Bool = false
    ) throws(OutboxError) -> PreparedRequest {
        guard case let .object(members) = tree else {
            throw .invalid("request must be an object, not \(tree.typeName)")
        }
        let descriptorFields = fromCommand ? ["accept", "retry", "expires_in"] : []
        for (name, _) in members where !DefinitionFields.request.names.contains(name) && !descriptorFields.contains(name) {
            throw .invalid("request: unknown field \"\(name)\"")
        }
        var ctx = context(inputs)

        // The file comes first: its size and name are template roots of everything else.
        var fileIdentity: FileIdentity?
        // False for a file enqueue moved into the store earlier, whose source path is gone.
        var fileIsAtItsPath = false
        if let fileTemplate = tree["file"] {
            let rendered = try Template.renderTree(fileTemplate, context: ctx, field: "request.file")
            guard let path = rendered.stringValue, !path.isEmpty else {
                throw .invalid(
                    rendered == .string("") ? "request.file is an empty path" : "request.file must be a file path, not \(rendered.typeName)"
                )
            }
            let absolute = Paths.absolute(path, relativeTo: inputs.cwd)
            let identity: FileIdentity
            if let moved = inputs.movedFiles[absolute], !Paths.exists(absolute) {
                identity = moved
            } else {
                let found = try FileIdentity.of(absolute, field: "request.file")
                identity = found.identity
                try (inputs.ownFiles ?? OwnFiles(config)).refuse(absolute, field: "request.file", unlinked: found.unlinked)
                fileIsAtItsPath = true
            }
            fileIdentity = identity
            ctx.roots["file"] = .object([
                ("size", .int64(identity.size)), ("name", .string(Paths.basename(identity.path))),
                ("path", .string(identity.path)),
            ])
        }

        func field(_ name: String, mode: TemplateMode = .value) throws(OutboxError) -> JSON? {
            guard let t = tree[name] else { return nil }
            if case let .string(s) = t { return try Template.render(s, context: ctx, mode: mode, field: "request.\(name)") }
            return try Template.renderTree(t, context: ctx, field: "request.\(name)")
        }

        // An s3 request is a PUT of its file to the object's URL, signed when it is sent.
        var s3: S3Rendered?
        if let t = tree["s3"] { s3 = try renderS3(t, request: tree, ctx: ctx) }
        let methodValue = s3 != nil ? JSON.string("PUT") : try field("method") ?? .string("POST")
        guard let methodText = methodValue.stringValue, Definition.methods.contains(methodText.uppercased()) else {
            throw .invalid(
                "request.method must be one of \(Definition.methods.joined(separator: ", ")), not \(methodValue.serialized().prefix(40))")
        }
        let method = methodText.uppercased()

        var url = s3?.target.objectURL
        if let u = try field("url", mode: .url) {
            guard let s = u.stringValue else { throw .invalid("request.url must be a string, not \(u.typeName)") }
            url = try URLCheck.validate(s, field: "request.url")
        }

        var headers = try configHeaders(config, inputs: inputs)
        headers = HeaderRules.merge(headers, inputs.commandHeaders)
        if let h = tree["headers"] {
            headers = HeaderRules.merge(headers, try renderHeaders(h, ctx: ctx, field: "request.headers"))
        }
        if let storageClass = s3?.target.storageClass { headers = HeaderRules.merge(headers, [("x-amz-storage-class", storageClass)]) }
        let secretHeaders = HeaderRules.secretNames(config: config, commandHeaders: inputs.commandHeaders, request: tree)

        let present = Definition.bodyKinds.filter { tree[$0] != nil }
        if present.count > 1 {
            throw .invalid("request has more than one body kind (\(present.joined(separator: ", "))): give at most one")
        }
        if tree["parts"] != nil && fileIdentity == nil {
            throw .invalid("request.parts needs request.file")
        }
        if method == "GET", let kind = present.first {
            throw .invalid("a GET request cannot have a body (request.\(kind))")
        }

        let ownershipValue = try field("ownership")
        var ownership: Ownership?
        if let o = ownershipValue {
            guard let s = o.stringValue, let parsed = Ownership(rawValue: s) else {
                throw .invalid("request.ownership must be copy, move or reference, not \(o.serialized().prefix(40))")
            }
            ownership = parsed
        }
        // A copied or referenced file is read, not renamed: one this user cannot read fails now, not at its first attempt.
        if let file = fileIdentity, fileIsAtItsPath, (ownership ?? (tree["parts"] == nil ? .copy : .move)) != .move,
            let problem = Paths.readProblem(file.path)
        {
            throw .fileMissing("request.file: cannot read \(file.path): \(problem)")
        }

        var contentType: String?
        var body = PreparedBody.none
        if let data = try field("data") {
            body = .bytes(data.serializedBytes(), kind: .data)
            contentType = "application/json"
        } else if let t = tree["text"] {
            guard case let .string(template) = t else { throw .invalid("request.text must be a string template") }
            let text = try Template.render(template, context: ctx, mode: .text, field: "request.text")
            body = .bytes(Array((text.stringValue ?? text.serialized()).utf8), kind: .text)
            contentType = "text/plain; charset=utf-8"
        } else if tree["form"] != nil {
            body = .form(try renderForm(try field("form") ?? .null, inputs: inputs, config: config))
        } else if let file = fileIdentity {
            if tree["parts"] != nil {
                let parts = try renderParts(tree["parts"]!, file: file, ctx: ctx, hasURL: url != nil)
                body = .parts(file, ownership ?? .move, parts)
            } else {
                body = .file(file, ownership ?? .copy)
            }
            contentType = "application/octet-stream"
        }
        // A body held in memory and staged whole: each value renders at most 16 MiB, so many of them could add up.
        if case let .bytes(bytes, kind) = body, bytes.count > TemplateRenderer.maxRenderedBytes {
            throw .invalid(
                "request.\(kind.rawValue) renders to \(Units.formatBytes(Int64(bytes.count))), more than \(TemplateRenderer.maxRenderedBytes >> 20) MiB"
            )
        }
        if let s3, let file = fileIdentity { (body, headers) = try s3Body(s3, file: file, ownership: ownership, headers: headers) }
        if tree["parts"] == nil && url == nil {
            throw .invalid("request needs a url")
        }

        var explicitContentType = s3?.contentType
        if let ct = try field("content_type") {
            guard let s = ct.stringValue else { throw .invalid("request.content_type must be a string") }
            if let problem = HeaderRules.valueProblem(s) { throw .invalid("request.content_type: \(problem)") }
            explicitContentType = s
        }
        if case .form = body {
            // libcurl writes the multipart Content-Type with its boundary.
            headers = HeaderRules.removing(headers, "Content-Type")
        } else if let explicitContentType {
            // `content_type` beats a Content-Type header: it is the more specific field.
            headers = HeaderRules.merge(headers, [("Content-Type", explicitContentType)])
        } else if let contentType, HeaderRules.value(headers, "Content-Type") == nil {
            // The body kind's default applies only when no header names a type.
            headers.append(("Content-Type", contentType))
        }

        var followRedirects = 0
        if let f = try field("follow_redirects") {
            guard let n = f.int64Value, (0...50).contains(n) else {
                // Text that reads as a number is still text: a template keeps its value's type.
                let what = f.stringValue != nil ? "the text " : ""
                throw .invalid(
                    "request.follow_redirects must be a whole number from 0 to 50, not \(what)\(f.serialized().prefix(40))"
                        + (f.stringValue.flatMap { Int($0) } != nil
                            ? " (a template keeps its value's type: give the var a number, 3 not \"3\")" : ""))
            }
            followRedirects = Int(n)
        }
        var redirectMethodChange = false
        if let r = try field("redirect_method_change"), !r.isNull {
            guard let b = r.boolValue else { throw .invalid("request.redirect_method_change must be true or false") }
            redirectMethodChange = b
        }
        var wifiOnly: Bool?
        if let w = try field("wifi_only"), !w.isNull {
            guard let b = w.boolValue else { throw .invalid("request.wifi_only must be true or false") }
            wifiOnly = b
        }
        var idempotent = method != "GET"
        if let i = try field("idempotency_key") {
            guard let b = i.boolValue else { throw .invalid("request.idempotency_key must be true or false") }
            idempotent = b
        }
        var idempotencyKey: String?
        var minted = false
        if let explicit = HeaderRules.value(headers, "Idempotency-Key") {
            idempotencyKey = explicit
            headers = HeaderRules.removing(headers, "Idempotency-Key")
        } else if idempotent {
            idempotencyKey = Identifiers.uuid()
            minted = true
        }
        for (name, value) in headers {
            if let problem = HeaderRules.nameProblem(name) ?? HeaderRules.givenProblem(name) {
                throw .invalid("request.headers: \(problem)")
            }
            if let problem = HeaderRules.valueProblem(value) { throw .invalid("request.headers.\(name): \(problem)") }
        }
        do { try HeaderRules.checkHead(method: method, url: url, headers: headers) } catch {
            throw .invalid("\(error.field): \(error.message)")
        }

        var accept = definition.accept
        var retry = definition.retry ?? config.retry
        var expires = definition.expiresInMs ?? config.lifetimeMs
        if let t = definition.expiresInTemplate {
            // A template giving null keeps the config's lifetime.
            let rendered = try Template.render(t, context: ctx, mode: .value, field: "expires_in")
            if rendered != .null {
                // A number counts as its digits, as one written in the file does.
                let text: String
                switch rendered {
                case let .string(s): text = s
                case let .number(digits): text = digits
                default: throw .invalid("expires_in must give a duration such as \"14d\", not \(rendered.serialized().prefix(40))")
                }
                do { expires = try Units.parseDuration(text) } catch { throw .invalid("expires_in: \(error.message)") }
            }
        }
        if fromCommand {
            if let a = tree["accept"] { accept = try acceptRules(a) }
            if let r = tree["retry"] { retry = try retryRules(r, base: config.retry) }
            if let e = tree["expires_in"] {
                guard let s = e.stringValue else { throw .invalid("expires_in must be a duration such as 14d") }
                do { expires = try Units.parseDuration(s) } catch { throw .invalid("expires_in: \(error.message)") }
            }
        }
        var scope: String?
        if let s = definition.scope {
            let rendered = try Template.render(s, context: ctx, mode: .value, field: "scope")
            scope = rendered.stringValue ?? rendered.serialized()
            // The store keeps text: a NUL would cut the scope short and join it to another.
            if scope?.utf8.contains(0) == true { throw .invalid("scope: the rendered value contains a NUL character") }
            // A name, kept in every row of its entries and printed by show: not a place for data.
            if let length = scope?.utf8.count, length > Self.maxScopeBytes {
                throw .invalid("scope: the rendered value is \(length) bytes long (at most \(Self.maxScopeBytes))")
            }
            // An empty value (a var left blank) is no scope, not one scope every such entry shares.
            if scope == "" { scope = nil }
        }
        var prepared = PreparedRequest(
            method: method, url: url, headers: headers, body: body, accept: accept, retry: retry,
            expiresInMs: expires, response: definition.response, scope: scope,
            cancelScopeOnError: definition.cancelScopeOnError, followRedirects: followRedirects,
            wifiOnly: wifiOnly, idempotencyKey: idempotencyKey)
        prepared.idempotencyKeyIsExplicit = idempotencyKey != nil && !minted
        prepared.redirectMethodChange = redirectMethodChange
        prepared.secretHeaders = secretHeaders
        prepared.secretURL = Self.urlReadsEnvironment(tree)
        prepared.secretVars = SecretVars.paths(in: inputs.vars) {
            // A URL's password is shown redacted too: a var it came from must be.
            HeaderRules.secretValues(headers, names: config.redactedHeaderNames.union(secretHeaders))
                + (url.map(URLCheck.passwordTexts) ?? [])
        }
        prepared.s3 = s3?.target
        return prepared
    }

    /// Whether the request's URL or a part's is a template that reads `env`.
    static func urlReadsEnvironment(_ tree: JSON) -> Bool {
        var templates = [tree["url"]]
        switch tree["parts"] {
        case let .array(items)?: templates += items.map { $0["url"] }
        case let plan?: templates.append(plan["url"])
        case nil: break
        }
        return templates.contains { if case let .string(t)? = $0 { Template.readsEnvironment(t) } else { false } }
    }

    static func renderHeaders(_ tree: JSON, ctx: TemplateContext, field: String) throws(OutboxError) -> [(String, String)] {
        guard case let .object(members) = tree else { throw .invalid("\(field) must be an object of header names to values") }
        var out: [(String, String)] = []
        // A definition's YAML refuses this at load; a request_command's answer is checked here.
        var seen: Set<String> = []
        for (name, template) in members {
            guard seen.insert(name.lowercased()).inserted else {
                throw .invalid("\(field): header \(name) is given twice (names are compared without regard to case)")
            }
            let value: JSON
            if case let .string(s) = template {
                value = try Template.render(s, context: ctx, mode: .header, field: "\(field).\(name)")
            } else {
                value = template
            }
            let text: String
            switch value {
            case let .string(s): text = s
            case let .number(n): text = n
            case let .bool(b): text = b ? "true" : "false"
            default: throw .invalid("\(field).\(name) must be a string, not \(value.typeName)")
            }
            if let problem = HeaderRules.nameProblem(name) { throw .invalid("\(field): \(problem)") }
            if let problem = HeaderRules.valueProblem(text) { throw .invalid("\(field).\(name): \(problem)") }
            out.append((name, text))
        }
        return out
    }

    static func renderForm(_ value: JSON, inputs: RenderInputs, config: Config) throws(OutboxError) -> [PreparedFormField] {
        guard case let .array(items) = value else { throw .invalid("request.form must be a list of fields") }
        var fields: [PreparedFormField] = []
        for (i, item) in items.enumerated() {
            let at = "request.form[\(i)]"
            guard case let .object(members) = item else { throw .invalid("\(at) must be an object") }
            for (name, _) in members where !DefinitionFields.form.names.contains(name) {
                throw .invalid("\(at): unknown field \"\(name)\"")
            }
            guard let name = item["name"]?.stringValue else { throw .invalid("\(at).name must be a string") }
            // Given, a filename or type of another type is refused: dropped, a guess would go instead.
            func text(_ member: String) throws(OutboxError) -> String? {
                guard let value = item[member], value != .null else { return nil }
                guard let text = value.stringValue else { throw .invalid("\(at).\(member) must be a string, not \(value.typeName)") }
                return text
            }
            var field = PreparedFormField(
                name: name, value: nil, file: nil, filename: try text("filename"), contentType: try text("content_type"))
            switch (item["value"], item["file"]) {
            case let (v?, nil):
                switch v {
                case let .string(s): field.value = s
                case .number, .bool: field.value = v.serialized()
                default: field.value = v.serialized()
                }
            case let (nil, f?):
                guard let path = f.stringValue else { throw .invalid("\(at).file must be a path") }
                let absolute = Paths.absolute(path, relativeTo: inputs.cwd)
                let found = try FileIdentity.of(absolute, field: "\(at).file")
                field.file = found.identity
                try (inputs.ownFiles ?? OwnFiles(config)).refuse(absolute, field: "\(at).file", unlinked: found.unlinked)
                if let problem = Paths.readProblem(absolute) { throw .fileMissing("\(at).file: cannot read \(absolute): \(problem)") }
            default:
                throw .invalid("\(at) needs exactly one of value or file")
            }
            // Each goes into the part's Content-Disposition or Content-Type line: a NUL would cut
            // it there, a line break be escaped by libcurl into another name.
            for (member, text) in [("name", field.name), ("filename", field.filename), ("content_type", field.contentType)] {
                if let text, let problem = HeaderRules.valueProblem(text) { throw .invalid("\(at).\(member): \(problem)") }
            }
            fields.append(field)
        }
        return fields
    }

    static func renderParts(_ tree: JSON, file: FileIdentity, ctx: TemplateContext, hasURL: Bool) throws(OutboxError) -> [PreparedPart] {
        var listValue: JSON?
        switch tree {
        case let .string(s):
            listValue = try Template.render(s, context: ctx, mode: .value, field: "request.parts")
        case .array:
            listValue = try Template.renderTree(tree, context: ctx, field: "request.parts")
        case .object:
            break
        default:
            throw .invalid("request.parts must be a plan or a list of parts")
        }
        if let listValue {
            guard case let .array(items) = listValue else {
                throw .invalid("request.parts must be a list of {url, headers?, range}, not \(listValue.typeName)")
            }
            var parts: [PreparedPart] = []
            for (i, item) in items.enumerated() {
                let at = "request.parts[\(i)]"
                guard case let .object(members) = item else { throw .invalid("\(at) must be an object") }
                for (name, _) in members where !DefinitionFields.partsItem.names.contains(name) {
                    throw .invalid("\(at): unknown field \"\(name)\"")
                }
                guard let u = item["url"]?.stringValue else { throw .invalid("\(at).url must be a string") }
                let url = try URLCheck.validate(u, field: "\(at).url")
                guard let start = item["range"]?["start"]?.int64Value, let end = item["range"]?["end"]?.int64Value else {
                    throw .invalid("\(at).range needs whole-number start and end")
                }
                let headers =
                    try item["headers"].map { h throws(OutboxError) in try renderHeaders(h, ctx: ctx, field: "\(at).headers") } ?? []
                parts.append(
                    PreparedPart(range: ByteRange(start: start, end: end), url: url, headers: headers.map { HeaderPair($0.0, $0.1) }))
            }
            if let problem = ChunkPlan.tilingProblem(parts.map(\.range), size: file.size) {
                throw .invalid("request.parts do not tile the file (\(file.size) bytes): \(problem)")
            }
            return parts
        }
        // A plan: ranges from the chunk plan, url and headers rendered per part.
        let plan = tree["plan"] ?? .object([])
        /// A plan field, rendered when it is a template; the definition's loader checked a literal.
        func value(_ name: String) throws(OutboxError) -> (value: JSON, rendered: Bool)? {
            guard let v = plan[name] else { return nil }
            guard case let .string(s) = v, s.contains("{{") else { return (v, false) }
            return (try Template.render(s, context: ctx, mode: .value, field: "request.parts.plan.\(name)"), true)
        }
        func size(_ name: String, _ fallback: Int64) throws(OutboxError) -> Int64 {
            guard let (v, rendered) = try value(name) else { return fallback }
            let n: Int64
            if let whole = v.int64Value {
                n = whole
            } else if let s = v.stringValue {
                do { n = try Units.parseSize(s) } catch { throw .invalid("request.parts.plan.\(name): \(error.message)") }
            } else {
                throw .invalid("request.parts.plan.\(name) must be a size such as \"8MiB\", not \(v.serialized().prefix(40))")
            }
            if rendered && n <= 0 { throw .invalid("request.parts.plan.\(name) must be above 0, not \(v.serialized().prefix(40))") }
            return n
        }
        let min = try size("min", ChunkPlan.defaultMin)
        let max = try size("max", ChunkPlan.defaultMax)
        var maxParts = ChunkPlan.defaultMaxParts
        if let (v, _) = try value("max_parts") {
            guard let n = v.int64Value, let small = Int(exactly: n), (1...ChunkPlan.maxPartsLimit).contains(small) else {
                throw .invalid(
                    "request.parts.plan.max_parts must be a whole number from 1 to \(ChunkPlan.maxPartsLimit), not \(v.serialized().prefix(40))"
                )
            }
            maxParts = small
        }
        let ranges: [ByteRange]
        do { ranges = try ChunkPlan.plan(size: file.size, min: min, max: max, maxParts: maxParts) } catch {
            throw .invalid("request.parts.plan: \(error.message)")
        }
        guard case let .string(urlTemplate)? = tree["url"] else { throw .invalid("request.parts.url must be a template string") }
        var parts: [PreparedPart] = []
        parts.reserveCapacity(ranges.count)
        for (i, range) in ranges.enumerated() {
            var partCtx = ctx
            partCtx.roots["part"] = .object([
                ("index", .int(i)), ("number", .int(i + 1)), ("start", .int64(range.start)),
                ("end", .int64(range.end)), ("last", .int64(Swift.max(range.start, range.end - 1))),
            ])
            let u = try Template.render(urlTemplate, context: partCtx, mode: .url, field: "request.parts.url")
            guard let us = u.stringValue else { throw .invalid("request.parts.url must render to a string") }
            let url = try URLCheck.validate(us, field: "request.parts.url")
            let headers =
                try tree["headers"].map { h throws(OutboxError) in try renderHeaders(h, ctx: partCtx, field: "request.parts.headers") }
                ?? []
            parts.append(PreparedPart(range: range, url: url, headers: headers.map { HeaderPair($0.0, $0.1) }))
        }
        return parts
    }

    static func acceptRules(_ value: JSON) throws(OutboxError) -> [AcceptRule] {
        guard case let .array(items) = value else { throw .invalid("accept must be a list of {status, body_includes?}") }
        var rules: [AcceptRule] = []
        for item in items {
            guard let status = item["status"]?.int64Value, (100...599).contains(status) else {
                throw .invalid("accept items need a status from 100 to 599")
            }
            rules.append(AcceptRule(status: Int(status), bodyIncludes: item["body_includes"]?.stringValue))
        }
        return rules
    }

    static func retryRules(_ value: JSON, base: RetryRules) throws(OutboxError) -> RetryRules {
        var rules = base
        // Held to the rules of a definition's `retry`: known fields, 4xx exemptions.
        guard case let .object(members) = value else { throw .invalid("retry must be an object") }
        for (name, _) in members where name != "backoff" && name != "terminal_http" {
            throw .invalid("retry has no field \"\(name)\" (backoff, terminal_http)")
        }
        if let t = value["terminal_http"] {
            guard let items = t["exempt"]?.arrayValue, t.objectValue?.count == 1 else {
                throw .invalid("retry.terminal_http must give exempt, a list of 4xx status codes, and nothing else")
            }
            for item in items where !(400...499).contains(item.int64Value ?? 0) {
                throw .invalid("retry.terminal_http.exempt items must be 4xx status codes, not \(item.serialized())")
            }
        }
        if let b = value["backoff"] {
            func duration(_ name: String) throws(OutboxError) -> Int64 {
                guard let s = b[name]?.stringValue else { throw .invalid("retry.backoff.\(name) is missing") }
                do { return try Units.parseDuration(s) } catch { throw .invalid("retry.backoff.\(name): \(error.message)") }
            }
            rules.backoff.baseMs = try duration("base")
            rules.backoff.maxMs = try duration("max")
            if let problem = RetryRules.backoffProblem(baseMs: rules.backoff.baseMs, maxMs: rules.backoff.maxMs, context: "retry") {
                throw .invalid(problem)
            }
            guard let j = b["jitter"]?.doubleValue, (0...1).contains(j) else { throw .invalid("retry.backoff.jitter must be from 0 to 1") }
            rules.backoff.jitter = j
        }
        if let e = value["terminal_http"]?["exempt"]?.arrayValue {
            rules.exempt = e.compactMap { $0.int64Value.map(Int.init) }
        }
        return rules
    }
}
