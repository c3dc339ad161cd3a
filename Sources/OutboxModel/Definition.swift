import YAML

/// How a response body is handed to `on_success`.
package enum ResponseMode: Sendable, Equatable {
    case raw
    case json
    case command(CommandSpec)

    package var json: JSON {
        switch self {
        case .raw: return .string("raw")
        case .json: return .string("json")
        case let .command(c): return .object([("command", c.json)])
        }
    }

    package init?(json: JSON) {
        switch json {
        case .string("raw"), .null: self = .raw
        case .string("json"): self = .json
        default:
            guard let c = json["command"].flatMap(CommandSpec.init(json:)) else { return nil }
            self = .command(c)
        }
    }
}

/// One kind of request (a file in `definitions/`; fields in docs/definitions.md).
package struct Definition: Sendable {
    /// The longest key, in bytes: a key is indexed by every store (PostgreSQL refuses an index
    /// row over about 2.7 KB), and one this long is already no name to type.
    package static let maxKeyBytes = 200

    /// Why `key` cannot name a definition (empty, spaces or control characters, too long), or nil.
    package static func keyProblem(_ key: String) -> String? {
        // Unicode spaces and invisible characters too (NBSP, ZWSP): a key that looks like another is not one.
        let unseen = { (c: Unicode.Scalar) in
            c.value <= 0x20 || c.properties.isWhitespace || [.control, .format].contains(c.properties.generalCategory)
        }
        if key.isEmpty || key.unicodeScalars.contains(where: unseen) {
            return "key must be a non-empty name without spaces or control characters"
        }
        if key.utf8.count > maxKeyBytes { return "key is \(key.utf8.count) bytes long; at most \(maxKeyBytes)" }
        return nil
    }

    package var key: String
    package var file: String
    /// The `request` section as a template tree; nil when `request_command` builds it.
    package var request: JSON?
    package var requestCommand: CommandSpec?
    package var response: ResponseMode = .raw
    package var accept: [AcceptRule] = []
    package var retry: RetryRules?
    package var expiresInMs: Int64?
    /// `expires_in` written as one template (`"{{ vars.ttl }}"`), rendered at enqueue.
    package var expiresInTemplate: String?
    package var scope: String?
    package var cancelScopeOnError = false
    package var onSuccess: CommandSpec?
    package var onError: CommandSpec?
    /// `then` follow-ups as a template tree: `{on_success: [...], on_error: [...]}`.
    package var then: JSON?
    /// The `then` keys written as plain names (not templates), with where: each must name a definition.
    package var thenKeys: [(key: String, mark: Mark)] = []
    /// The hooks and plugins named in the file, with where (for `check`).
    package var commands: [CommandRef] = []

    package static let bodyKinds = ["data", "text", "form", "file"]
    /// The usual HTTP methods, and WebDAV's MKCOL, COPY and MOVE (RFC 4918): a tree migrated into a
    /// WebDAV server that does not create parent collections needs MKCOL first.
    package static let methods = ["POST", "PUT", "PATCH", "DELETE", "GET", "MKCOL", "COPY", "MOVE"]
}

/// Every definition of a project, with the problems of the files that could not be read.
package struct DefinitionSet: Sendable {
    package var definitions: [String: Definition] = [:]
    /// Problems by key, for files whose key could be read: only that key is disabled.
    package var brokenKeys: [String: [Diagnostic]] = [:]
    /// Definitions that read whole but are disabled because a `then` names a key no file
    /// defines: `check` still looks at their other parts (hooks, plugins).
    package var disabledByThen: [String: Definition] = [:]
    /// Every problem found, in file order.
    package var diagnostics: [Diagnostic] = []
    /// Source text of each file read, for printing carets.
    package var sources: [String: String] = [:]
    package var fileCount = 0

    package init() {}

    /// Reads every `*.yaml` / `*.yml` file of a folder. A missing folder is an empty set.
    package static func load(folder: String) -> DefinitionSet {
        var set = DefinitionSet()
        guard let listed = Paths.listNames(folder) else { return set }
        var firstFile: [String: String] = [:]
        var withErrors: [Definition] = []
        // Its name, spelled with `\xHH`, names no file: said as it is, not as a failed read.
        for name in listed.notUTF8 where name.hasSuffix(".yaml") || name.hasSuffix(".yml") {
            set.diagnostics.append(
                Diagnostic(
                    path: Paths.join(folder, name), line: 1, column: 1,
                    message: "the file name is not valid UTF-8, so its definition is not read; rename the file"))
        }
        for name in listed.names where name.hasSuffix(".yaml") || name.hasSuffix(".yml") {
            let path = Paths.join(folder, name)
            // A definition file that cannot be read is an error, not a file to skip: its key
            // would otherwise vanish without a word (a dangling link, mode 000, a folder).
            guard let bytes = Paths.readBytes(path) else {
                set.diagnostics.append(
                    Diagnostic(path: path, line: 1, column: 1, message: "cannot read this definition file: \(Paths.readFailure())"))
                continue
            }
            if let offset = Paths.invalidUTF8Offset(bytes) {
                set.diagnostics.append(Diagnostic.invalidUTF8(path: path, bytes: bytes, offset: offset))
                if let key = Definition.peekKey(text: String(decoding: bytes, as: UTF8.self)) {
                    set.brokenKeys[key, default: []].append(set.diagnostics.last!)
                }
                continue
            }
            let text = String(decoding: bytes, as: UTF8.self)
            set.fileCount += 1
            set.sources[path] = text
            var reader = YAMLReader(path: path)
            let definition = Definition.read(text: text, reader: &reader)
            let key = definition.flatMap { $0.key.isEmpty ? nil : $0.key } ?? Definition.peekKey(text: text)
            if let key {
                if let other = firstFile[key] {
                    reader.error(Mark(line: 1, column: 1), "key \"\(key)\" is defined twice: in \(other) and in \(path)")
                } else {
                    firstFile[key] = path
                }
            }
            let found = reader.diagnosticsInSourceOrder
            set.diagnostics += found
            if found.isEmpty, let definition {
                set.definitions[definition.key] = definition
            } else {
                if let key {
                    // The first file of a duplicate pair is disabled too; its `then` keys still checked.
                    if let first = set.definitions.removeValue(forKey: key) { withErrors.append(first) }
                    set.brokenKeys[key, default: []] += found
                }
                // Read as far as it goes: its `then` keys are checked too, so one pass of
                // `outbox check` names every error of the file, even one without a readable key.
                if let definition { withErrors.append(definition) }
            }
        }
        set.checkThenKeys(alsoIn: withErrors)
        return set
    }

    /// A `then` follow-up naming a key no file defines would be lost at every settle: the
    /// definition that names it is disabled, with the error at the key.
    /// `alsoIn`: definitions disabled by other errors, whose missing keys are named as well.
    mutating func checkThenKeys(alsoIn withErrors: [Definition] = []) {
        let known = Set(definitions.keys).union(brokenKeys.keys)
        // A file that does not parse far enough to show its key may be the one meant: named.
        let attributed = brokenKeys.values.flatMap { $0 }
        let unreadable = Set(diagnostics.filter { !attributed.contains($0) }.map(\.path)).sorted()
        let unreadableNote = unreadable.isEmpty ? "" : " (\(unreadable.joined(separator: ", ")) cannot be read: see its error)"
        let usable = definitions.values.map { (definition: $0, usable: true) }
        for (definition, usable) in (usable + withErrors.map { ($0, false) }).sorted(by: { $0.definition.file < $1.definition.file }) {
            let missing = definition.thenKeys.filter { !known.contains($0.key) }
            guard !missing.isEmpty else { continue }
            let found = missing.map {
                Diagnostic(
                    path: definition.file, line: $0.mark.line, column: $0.mark.column,
                    message: "then: no definition has key \"\($0.key)\"\(unreadableNote)")
            }
            diagnostics += found
            if !definition.key.isEmpty { brokenKeys[definition.key, default: []] += found }
            guard usable else { continue }
            definitions[definition.key] = nil
            disabledByThen[definition.key] = definition
        }
    }
}

extension Definition {
    /// The `key` of a file that may have other errors, so only that key is disabled.
    static func peekKey(text: String) -> String? {
        guard let node = try? YAMLParser.parse(text), case let .mapping(pairs) = node.kind else { return nil }
        for pair in pairs where pair.key.scalar == .string("key") {
            if case let .string(s)? = pair.value.scalar { return s }
        }
        return nil
    }

    static func read(text: String, reader: inout YAMLReader) -> Definition? {
        let root: YAMLNode
        do {
            guard let node = try YAMLParser.parse(text) else {
                reader.error(Mark(line: 1, column: 1), "the definition is empty (it needs at least key and request)")
                return nil
            }
            root = node
        } catch {
            reader.error(error.mark, error.message)
            return nil
        }
        reader.refuseUnknownTags(root)
        guard let f = reader.fields(root, DefinitionFields.top, context: "a definition") else { return nil }
        // Without a key the rest is still read, so one `outbox check` names every error of the
        // file; the definition comes back with an empty key, which no caller keeps.
        var key = ""
        if let keyNode = f["key"] {
            if let text = reader.string(keyNode, "key") {
                key = text
                if let problem = Definition.keyProblem(key) { reader.error(keyNode.mark, problem) }
            }
        } else {
            reader.error(root.mark, "a definition needs a key")
        }
        var d = Definition(key: key, file: reader.path)
        d.requestCommand = reader.command(f["request_command"], "request_command")
        if let r = f["request"] {
            d.request = readRequest(r, reader: &reader)
            if d.requestCommand != nil {
                reader.error(r.mark, "give either request or request_command, not both")
            }
        } else if d.requestCommand == nil {
            reader.error(root.mark, "a definition needs request (or request_command)")
        }
        if let r = f["response"] {
            switch r.kind {
            case .scalar:
                switch r.scalar {
                case .string("raw")?: d.response = .raw
                case .string("json")?: d.response = .json
                default: reader.error(r.mark, "response must be raw, json or {command: ...}")
                }
            case .mapping:
                let before = reader.diagnostics.count
                if let rf = reader.fields(r, DefinitionFields.response, context: "response"),
                    let c = reader.command(rf["command"], "response.command")
                {
                    d.response = .command(c)
                } else if reader.diagnostics.count == before {
                    reader.error(r.mark, "response needs a command")
                }
            case .sequence:
                reader.error(r.mark, "response must be raw, json or {command: ...}")
            }
        }
        if let a = f["accept"] { d.accept = readAccept(a, reader: &reader) }
        if let r = f["retry"] { d.retry = RetryRules.read(r, reader: &reader, context: "retry", base: RetryRules()) }
        if let e = f["expires_in"], case .string(let text)? = e.scalar, text.contains("{{") {
            if let problem = Template.validate(text) { reader.error(e.mark, "expires_in: \(problem)") }
            d.expiresInTemplate = text
        } else if let e = f["expires_in"], case .null? = e.scalar {
            // null: the config's lifetime, as when the field is left out.
        } else if let e = f["expires_in"], let v = reader.duration(e, "expires_in") {
            // Its entries would expire as they are enqueued, each one unsent.
            if v == 0 { reader.error(e.mark, "expires_in must be longer than 0 (entries would expire unsent)") } else { d.expiresInMs = v }
        }
        if let s = f["scope"], s.scalar != .null, let text = reader.string(s, "scope") {
            if let problem = Template.validate(text) { reader.error(s.mark, "scope: \(problem)") }
            d.scope = text
        }
        if let o = f["on_rejected"] {
            let values = DefinitionFields.top.values("on_rejected")
            switch reader.string(o, "on_rejected") {
            case let value? where values.contains(value): d.cancelScopeOnError = value == "cancel-scope"
            case let other?: reader.error(o.mark, "on_rejected must be \(values.joined(separator: " or ")), not \"\(other)\"")
            case nil: break
            }
        }
        d.onSuccess = reader.command(f["on_success"], "on_success")
        d.onError = reader.command(f["on_error"], "on_error")
        if let t = f["then"] { (d.then, d.thenKeys) = readThen(t, reader: &reader) }
        d.commands = reader.commands
        return d
    }

    static func readAccept(_ node: YAMLNode, reader: inout YAMLReader) -> [AcceptRule] {
        guard case let .sequence(items) = node.kind else {
            reader.error(node.mark, "accept must be a list of {status, body_includes?}")
            return []
        }
        return items.compactMap { item in
            guard let f = reader.fields(item, DefinitionFields.accept, context: "accept items") else { return nil }
            guard let s = f["status"] else {
                reader.error(item.mark, "accept items need a status")
                return nil
            }
            guard let status = reader.int(s, "accept.status", range: DefinitionFields.accept.range("status")) else { return nil }
            return AcceptRule(status: Int(status), bodyIncludes: reader.string(f["body_includes"], "accept.body_includes"))
        }
    }

    static func readThen(_ node: YAMLNode, reader: inout YAMLReader) -> (JSON?, [(key: String, mark: Mark)]) {
        guard let f = reader.fields(node, DefinitionFields.then, context: "then") else { return (nil, []) }
        var out: [(String, JSON)] = []
        var keys: [(key: String, mark: Mark)] = []
        for name in DefinitionFields.then.names {
            guard let list = f[name] else { continue }
            guard case let .sequence(items) = list.kind else {
                reader.error(list.mark, "then.\(name) must be a list of {key, vars?, id?, delay?}")
                continue
            }
            var followUps: [JSON] = []
            for item in items {
                guard let itemFields = reader.fields(item, DefinitionFields.followUp, context: "then.\(name) items") else {
                    continue
                }
                guard let keyNode = itemFields["key"] else {
                    reader.error(item.mark, "then.\(name) items need a key")
                    continue
                }
                if case let .string(key)? = keyNode.scalar, !key.contains("{{") { keys.append((key, keyNode.mark)) }
                checkLiteralFollowUpFields(itemFields, field: "then.\(name)", reader: &reader)
                if let json = reader.json(item, "then.\(name)") {
                    checkTemplates(item, field: "then.\(name)", reader: &reader)
                    followUps.append(json)
                }
            }
            out.append((name, .array(followUps)))
        }
        return (.object(out), keys)
    }

    /// A `delay` or `id` written without a template is checked now: at every settle it would
    /// fail the same way, and the follow-ups with it.
    static func checkLiteralFollowUpFields(_ fields: [String: YAMLNode], field: String, reader: inout YAMLReader) {
        if let node = fields["delay"] {
            let templated = node.scalar.map { if case let .string(text) = $0 { text.contains("{{") } else { false } } ?? false
            if !templated { _ = reader.duration(node, "\(field) delay") }
        }
        if let node = fields["id"] {
            if case let .string(text)? = node.scalar {
                if !text.contains("{{"), let problem = Identifiers.validateUserID(text) {
                    reader.error(node.mark, "\(field) id: \(problem)")
                }
            } else {
                // Anything but a string would mint a fresh id at every settle, silently.
                reader.error(node.mark, "\(field) id must be a string (or a template giving one)")
            }
        }
    }

    /// Reports template syntax errors in every string of a tree, each at its own line and
    /// column; `skip` names fields whose templates were already checked (headers).
    static func checkTemplates(
        _ node: YAMLNode, field: String, skip: Set<String> = [], unavailable: Set<String> = [], reader: inout YAMLReader
    ) {
        switch node.kind {
        case .scalar:
            // `part` renders in a parts plan alone: elsewhere in a request, or in a follow-up, it can never resolve;
            // nor does `file` in a follow-up (it is the parent's `outcome`, not a file being read).
            let partless = (field.hasPrefix("request.") && !field.hasPrefix("request.parts")) || field.hasPrefix("then.")
            var roots = (partless ? Template.allRoots.subtracting(["part"]) : Template.allRoots).subtracting(unavailable)
            if field.hasPrefix("then.") { roots.remove("file") }
            if case let .string(s)? = node.scalar, let problem = Template.validate(s, roots: roots) {
                reader.error(node.mark, "\(field): \(problem)")
            }
        case let .sequence(items):
            for (i, item) in items.enumerated() {
                checkTemplates(item, field: "\(field)[\(i)]", skip: skip, unavailable: unavailable, reader: &reader)
            }
        case let .mapping(pairs):
            for pair in pairs {
                guard case let .scalar(name, _) = pair.key.kind else { continue }
                let path = "\(field).\(name)"
                if !skip.contains(path) { checkTemplates(pair.value, field: path, skip: skip, unavailable: unavailable, reader: &reader) }
            }
        }
    }

    /// Checks what can be seen before rendering, and keeps the section as a template tree.
    static func readRequest(_ node: YAMLNode, reader: inout YAMLReader) -> JSON? {
        guard let f = reader.fields(node, DefinitionFields.request, context: "request") else { return nil }
        let before = reader.diagnostics.count
        let bodies = bodyKinds.filter { f[$0] != nil }
        if bodies.count > 1 {
            reader.error(f[bodies[1]]!.mark, "request has more than one body kind (\(bodies.joined(separator: ", "))): give at most one")
        }
        if let p = f["parts"], f["file"] == nil {
            reader.error(p.mark, "request.parts needs request.file (the file the parts are cut from)")
        }
        if let m = f["method"], let method = reader.string(m, "request.method"), !method.contains("{{") {
            if !methods.contains(method.uppercased()) {
                reader.error(m.mark, "request.method must be one of \(methods.joined(separator: ", ")), not \"\(method)\"")
            } else if method.uppercased() == "GET", let body = bodies.first {
                reader.error(f[body]!.mark, "a GET request cannot have a body (request.\(body))")
            }
        }
        if let s = f["s3"] {
            checkS3(s, request: f, reader: &reader)
        } else if f["url"] == nil && f["parts"] == nil {
            reader.error(node.mark, "request needs a url")
        }
        var literalURL: String?
        if let u = f["url"], let url = reader.string(u, "request.url"), !url.contains("{{") {
            do { _ = try URLCheck.validate(url, field: "request.url") } catch { reader.error(u.mark, error.message) }
            literalURL = url
        } else if let u = f["url"], case let .string(url)? = u.scalar,
            let problem = Template.schemeOrHostProblem(url: url, field: "request.url")
        {
            reader.error(u.mark, problem)
        }
        let headers = f["headers"].map { Config.readHeaders($0, reader: &reader, context: "request.headers") } ?? []
        // What is written out already is at least what every request's head holds: over the
        // limit, each enqueue would be refused.
        let writtenHeaders = headers.filter { !$0.0.contains("{{") && !$0.1.contains("{{") }
        do { try HeaderRules.checkHead(method: "", url: literalURL, headers: writtenHeaders) } catch {
            // At the larger part: the URL or the headers.
            let headerBytes = writtenHeaders.reduce(0) { $0 + $1.0.utf8.count + $1.1.utf8.count }
            let atURL = error.field == "request" && (literalURL?.utf8.count ?? 0) > headerBytes
            reader.error((atURL ? f["url"] : f["headers"])?.mark ?? node.mark, "\(error.field): \(error.message)")
        }
        // A template is judged once it renders, at enqueue (E_INVALID).
        if let o = f["ownership"], let value = reader.string(o, "request.ownership"), !value.contains("{{"),
            !DefinitionFields.request.values("ownership").contains(value)
        {
            reader.error(o.mark, "request.ownership must be copy, move or reference, not \"\(value)\"")
        } else if let o = f["ownership"], f["s3"] != nil, o.scalar == .string("move") {
            // Every enqueue would be refused: the file is checksummed at enqueue.
            reader.error(
                o.mark,
                "request.ownership: an s3 request cannot move its file into the store (it is checksummed at enqueue); give copy or reference"
            )
        }
        // Written out (no template, not null), a field's type is judged here, as every enqueue would judge it.
        let written = { (node: YAMLNode) -> Bool in
            if case .string(let text)? = node.scalar, text.contains("{{") { return false }
            return node.scalar != .null
        }
        if let r = f["follow_redirects"], written(r) {
            if case .string(let text)? = r.scalar {
                // Text that is no template stays text, which is never a count.
                reader.error(
                    r.mark, "request.follow_redirects must be a whole number from 0 to 50 (or a template giving one), not \"\(text)\"")
            } else {
                _ = reader.int(r, "request.follow_redirects", range: DefinitionFields.request.range("follow_redirects"))
            }
        }
        if let c = f["content_type"], written(c) {
            if case .string(let text)? = c.scalar {
                if let problem = HeaderRules.valueProblem(text) { reader.error(c.mark, "request.content_type: \(problem)") }
            } else {
                reader.error(c.mark, "request.content_type must be text (a media type), not \(YAMLReader.describe(c))")
            }
        }
        for name in ["wifi_only", "idempotency_key", "redirect_method_change"] {
            if let n = f[name], written(n) { _ = reader.bool(n, "request.\(name)") }
        }
        if let t = f["text"], t.scalar == nil { reader.error(t.mark, "request.text must be text (the body), not a list or mapping") }
        if let file = f["file"], written(file) {
            // A path is text: a list or a number would fail every enqueue.
            if case .string(_)? = file.scalar {
            } else {
                reader.error(file.mark, "request.file must be a file path (or a template giving one), not \(YAMLReader.describe(file))")
            }
        }
        if let form = f["form"] { checkForm(form, reader: &reader) }
        if let parts = f["parts"] { checkParts(parts, reader: &reader) }
        guard let json = reader.json(node, "request") else { return nil }
        // `file` is the request's file: with none, it can never resolve.
        checkTemplates(
            node, field: "request", skip: ["request.headers", "request.parts.headers"], unavailable: f["file"] == nil ? ["file"] : [],
            reader: &reader)
        return reader.diagnostics.count == before ? json : nil
    }

    static func checkForm(_ node: YAMLNode, reader: inout YAMLReader) {
        switch node.kind {
        case .scalar:
            if case .string(let s)? = node.scalar, s.contains("{{") { return }
            reader.error(node.mark, "request.form must be a list of {name, value} or {name, file} fields")
        case let .sequence(items):
            for item in items {
                guard
                    let f = reader.fields(
                        item, DefinitionFields.form, context: "request.form items")
                else { continue }
                if f["name"] == nil { reader.error(item.mark, "request.form items need a name") }
                if (f["value"] == nil) == (f["file"] == nil) {
                    reader.error(item.mark, "request.form items need exactly one of value or file")
                }
                // Written out, as enqueue would refuse it (a template is judged as it renders).
                for member in ["name", "filename", "content_type", "file"] {
                    guard let n = f[member], n.scalar != .null else { continue }
                    guard case .string(let text)? = n.scalar else {
                        reader.error(
                            n.mark, "request.form item \(member) must be text (or a template giving it), not \(YAMLReader.describe(n))")
                        continue
                    }
                    if member != "file", !text.contains("{{"), let problem = HeaderRules.valueProblem(text) {
                        reader.error(n.mark, "request.form item \(member): \(problem)")
                    }
                }
            }
        case .mapping:
            reader.error(node.mark, "request.form must be a list of {name, value} or {name, file} fields")
        }
    }

    static func checkParts(_ node: YAMLNode, reader: inout YAMLReader) {
        switch node.kind {
        case .scalar:
            if case .string(let s)? = node.scalar, s.contains("{{") { return }
            reader.error(node.mark, "request.parts must be {plan, url, headers?}, a list of {url, range}, or a template")
        case let .sequence(items):
            for item in items {
                guard let f = reader.fields(item, DefinitionFields.partsItem, context: "request.parts items") else { continue }
                if f["url"] == nil { reader.error(item.mark, "request.parts items need a url") }
                guard let r = f["range"] else {
                    reader.error(item.mark, "request.parts items need a range {start, end}")
                    continue
                }
                if let rf = reader.fields(r, DefinitionFields.range, context: "request.parts range") {
                    if rf["start"] == nil || rf["end"] == nil { reader.error(r.mark, "a part range needs start and end") }
                }
            }
        case .mapping:
            guard let f = reader.fields(node, DefinitionFields.partsPlan, context: "request.parts") else { return }
            if f["url"] == nil { reader.error(node.mark, "request.parts needs a url template") }
            if let h = f["headers"] { _ = Config.readHeaders(h, reader: &reader, context: "request.parts.headers") }
            if let p = f["plan"], let pf = reader.fields(p, DefinitionFields.plan, context: "request.parts.plan") {
                // A template gives its value at enqueue, where it is checked.
                func literal(_ name: String) -> YAMLNode? {
                    guard let node = pf[name] else { return nil }
                    if case .string(let text)? = node.scalar, text.contains("{{") { return nil }
                    return node
                }
                let min = reader.size(literal("min"), "request.parts.plan.min")
                let max = reader.size(literal("max"), "request.parts.plan.max")
                _ = reader.int(literal("max_parts"), "request.parts.plan.max_parts", range: DefinitionFields.plan.range("max_parts"))
                if (min ?? ChunkPlan.defaultMin) > (max ?? ChunkPlan.defaultMax) {
                    reader.error(p.mark, "request.parts.plan: min is greater than max")
                }
                if min == 0 || max == 0 { reader.error(p.mark, "request.parts.plan: min and max must be above 0") }
            }
        }
    }
}
