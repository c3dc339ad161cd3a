import CSystem
import Glibc
import OutboxEnqueue
import OutboxModel
import OutboxStore

enum EnqueueCommand {
    static let varsOption = OptionSpec(name: "vars", valueName: "J|@FILE|-", help: "the entry's vars: JSON text, @file, or - for stdin")
    static let options: [OptionSpec] = [
        varsOption,
        OptionSpec(
            name: "id", valueName: "ID", help: "the entry id (default: a new UUID); same id again resumes or replaces",
            completes: .ids),
        OptionSpec(
            name: "from", valueName: "FILE.jsonl",
            help: "one entry per line: {\"vars\", \"id\"?, \"delay\"?, \"not_before\"?}; all or nothing; - reads stdin"),
        EnqueueDirectory.option,
        EnqueueDirectory.idTemplateOption,
        skipExistingOption,
        OptionSpec(name: "delay", valueName: "D", help: "hold the entry for a duration (10m, 2h)", completes: .nothing),
        OptionSpec(name: "not-before", valueName: "T", help: "hold the entry until a time (RFC 3339 or epoch ms)", completes: .nothing),
        OptionSpec(name: "expires-at", valueName: "T", help: "give up at this time instead of now + expires_in", completes: .nothing),
        CLI.json,
    ]
    static let details = """
        The entry and its staged body are durable on disk before the id is printed; the source
        file of a `file` body may be deleted afterwards (unless ownership is reference).
        --from-dir enqueues one entry per regular file under DIR (hidden files included, symbolic
        links skipped), with vars path, relative_path, name and size over the --vars object.
        --skip-existing (s3 requests only) has the runner HEAD each object before its upload and
        complete the entry without one when the object has the same size and SHA-256 checksum.
        """

    static let skipExistingOption = OptionSpec(
        name: "skip-existing", valueName: nil,
        help: "s3 requests only: HEAD each object when sent; one of the same size and checksum is not uploaded again")

    /// `--skip-existing` on an entry of KEY: an s3 request HEADs its object first; any other is refused.
    static func skipExisting(_ entry: inout NewEntry, key: String, _ i: Invocation) throws(OutboxError) {
        guard i.args.flag("skip-existing") else { return }
        guard entry.prepared.s3 != nil else {
            throw .invalid("--skip-existing applies to s3 requests only; the request of \(key) has no request.s3")
        }
        entry.prepared.s3?.skipExisting = true
    }

    static func factory(_ project: Project, _ i: Invocation) throws(OutboxError) -> EntryFactory {
        EntryFactory(config: project.config, environment: i.environment, cwd: try i.cwd) { (key: String) throws(OutboxError) in
            try project.definition(key)
        }
    }

    /// How much vars text is read from a file or stdin: room for any vars within
    /// `max_vars_bytes` once compacted, and never an endless read (`--vars @/dev/zero`).
    static func varsTextLimit(_ i: Invocation) throws(OutboxError) -> Int {
        Int(min(try i.project().config.maxVarsBytes, 1 << 40)) * 4 + 65_536
    }

    static func readVars(_ i: Invocation) throws(OutboxError) -> JSON {
        guard let text = i.args.value("vars") else { return .null }
        let source: String
        if text == "-" || text.hasPrefix("@") {
            var bytes: [UInt8]
            if text == "-" {
                bytes = try i.console.readStdin(limit: try varsTextLimit(i), what: "--vars -")
            } else {
                if text == "@" { throw .usage("--vars @FILE needs a file name after the @") }
                bytes = try readFile(
                    Paths.absolute(String(text.dropFirst()), relativeTo: i.cwd), limit: try varsTextLimit(i), what: "--vars")
            }
            // A byte order mark some editors write first is not content (as for --from).
            if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { bytes.removeFirst(3) }
            if let offset = Paths.invalidUTF8Offset(bytes) { throw .invalid("--vars is not valid UTF-8 (at byte \(offset + 1))") }
            source = String(decoding: bytes, as: UTF8.self)
        } else {
            source = text
        }
        let vars: JSON
        do { vars = try JSON.parse(source) } catch { throw .invalid("--vars is not valid JSON: \(error)") }
        // Given, vars are an object (leave --vars out for none).
        if vars == .null { throw .invalid("--vars must be a JSON object, not null") }
        return vars
    }

    /// The file an existing entry of this id moved or copied into the store, by its source
    /// path, so a same-id enqueue naming that path still finds it (nothing for a new id).
    static func movedFiles(_ project: Project, id: String?) throws(OutboxError) -> [String: FileIdentity] {
        // Only an existing store can hold one; a bad input must not create the store.
        guard let id, project.storeExists else { return [:] }
        return try project.store().entry(id: id)?.stagedSources ?? [:]
    }

    /// When a held entry may run; `names` are how the caller spells the two fields in messages.
    static func holdUntil(
        delay: String?, notBefore: String?, now: Int64,
        names: (delay: String, notBefore: String)
    ) throws(OutboxError) -> Int64? {
        if delay != nil && notBefore != nil { throw .usage("give \(names.delay) or \(names.notBefore), not both") }
        if let delay {
            do { return now + (try Units.parseDuration(delay)) } catch { throw .invalid("\(names.delay): \(error.message)") }
        }
        if let notBefore { return try TimeText.parse(notBefore, field: names.notBefore) }
        return nil
    }

    static func run(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        // Once the entries are committed a stop signal no longer ends the enqueue: a reader
        // that does not take the ids then holds it only until such a signal came.
        i.console.stopWaitingForOutput { csystem_stop_pending() != 0 }
        let key = i.args.positionals[0]
        let now = Identifiers.nowMs()
        if let folder = i.args.value("from-dir") {
            return try EnqueueDirectory.run(&i, key: key, folder: folder, now: now)
        }
        if i.args.flag("id-template") { throw .usage("--id-template goes with --from-dir") }
        if let from = i.args.value("from") {
            for conflicting in ["vars", "id", "delay", "not-before"] where i.args.flag(conflicting) {
                throw .usage("--from cannot be combined with --\(conflicting) (put it on each line)")
            }
            return try enqueueFile(&i, key: key, path: from, now: now)
        }
        let vars = try readVars(i)
        if let id = i.args.value("id"), let problem = Identifiers.validateUserID(id) { throw .invalid(problem) }
        let notBefore = try holdUntil(
            delay: i.args.value("delay"), notBefore: i.args.value("not-before"), now: now,
            names: ("--delay", "--not-before"))
        let expiresAt = try i.args.value("expires-at").map { t throws(OutboxError) in try TimeText.parse(t, field: "--expires-at") }
        let project = try i.project()
        var entry = try factory(project, i).make(
            key: key, vars: vars, id: i.args.value("id"), notBefore: notBefore, expiresAt: expiresAt,
            movedFiles: try movedFiles(project, id: i.args.value("id")))
        try skipExisting(&entry, key: key, i)
        let results = try project.enqueue([entry], now: now)
        if i.json {
            i.console.out(JSON.object([("id", .string(results[0].id))]).serialized())
        } else {
            i.console.out(results[0].id)
        }
        return 0
    }

    /// A whole file, refusing (E_INVALID) more than `limit` bytes before reading them.
    /// With `truncating`, the first `limit` bytes instead of an error.
    static func readFile(_ path: String, limit: Int, what: String, truncating: Bool = false) throws(OutboxError) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .unreadable("\(what): cannot read \(path): \(Paths.errnoMessage())", errno: errno) }
        defer { close(fd) }
        var out: [UInt8] = []
        while true {
            guard let chunk = LineReader.readChunk(fd: fd, min(65_536, limit + 1 - out.count)) else {
                throw .unreadable("\(what): cannot read \(path): \(Paths.errnoMessage())", errno: errno)
            }
            if chunk.isEmpty { return out }
            out += chunk
            if out.count > limit {
                if truncating { return Array(out.prefix(limit)) }
                throw .invalid("\(what): \(path) is over \(Units.formatBytes(Int64(limit)))")
            }
        }
    }

    /// Whether `fd` is a regular file (read at disk speed), not a pipe or terminal (-1: stdin).
    static func isRegularFile(_ fd: Int32) -> Bool {
        regularFileSize(fd) != nil
    }

    /// The size of `fd` when it is a regular file, else nil.
    static func regularFileSize(_ fd: Int32) -> Int64? {
        var info = stat()
        guard fd >= 0, fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else { return nil }
        return Int64(info.st_size)
    }

    /// Whether enqueueing `body` copies or moves a file of the user's into the store.
    static func takesAFileIn(_ body: PreparedBody) -> Bool {
        if case let .form(fields) = body { return fields.contains { $0.file != nil } }
        return sourceFile(body).map { $0.1 != .reference } ?? false
    }

    /// The user's file a body sends, and who owns it after enqueue.
    static func sourceFile(_ body: PreparedBody) -> (String, Ownership)? {
        switch body {
        case let .file(file, ownership), let .parts(file, ownership, _): return (file.path, ownership)
        default: return nil
        }
    }

    static func enqueueFile(_ i: inout Invocation, key: String, path: String, now: Int64) throws(OutboxError) -> Int32 {
        // `--from -` reads the lines from stdin (a pipeline: find, jq, ...), one at a time:
        // memory grows with the entries (a file's are written a batch at a time), never with
        // an endless line.
        let absolute = path == "-" ? "stdin" : Paths.absolute(path, relativeTo: try i.cwd)
        let maxLine = try varsTextLimit(i) + 4096
        var reader: LineReader
        var fd: Int32 = -1
        if path == "-" {
            let console = i.console
            reader = LineReader(maxLineBytes: maxLine) { n in console.stdinChunk(n) }
        } else {
            fd = open(absolute, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { throw .unreadable("--from: cannot read \(absolute): \(Paths.errnoMessage())", errno: errno) }
            // A file's lines are written in one transaction as they are read: one still being
            // appended to would hold the store's write lock for as long as its writer goes on.
            // A size of 0 may be no size at all (/proc, some FUSE files): such a file is read to its end.
            let size = Self.regularFileSize(fd)
            reader = LineReader(fd: fd, maxLineBytes: maxLine, limit: size == 0 ? .max : size ?? .max)
        }
        defer { if fd >= 0 { close(fd) } }
        let project = try i.project()
        let definition = try project.definition(key)
        let factory = try factory(project, i)
        let expiresAt = try i.args.value("expires-at").map { t throws(OutboxError) in try TimeText.parse(t, field: "--expires-at") }
        var seen: [String: Int] = [:]
        var movedBy: [String: Int] = [:]
        let renderer = LineRenderer(factory: factory, definition: definition, expiresAt: expiresAt)
        // The rendered lines' entries in order: an error names the first bad line, as if one by one.
        func checked(_ lines: [LineToRender], _ rendered: [Result<NewEntry, OutboxError>]) throws(OutboxError) -> [NewEntry] {
            var entries: [NewEntry] = []
            entries.reserveCapacity(lines.count)
            // By index: a line or render taken out of its array is a copy of every string in it.
            for index in lines.indices {
                do {
                    var entry = try rendered[index].get()
                    try skipExisting(&entry, key: key, i)
                    entries.append(entry)
                } catch {
                    let at = lines[index].at
                    throw OutboxError(error.code, error.message.hasPrefix(at) ? error.message : "\(at): \(error.message)")
                }
                // A file is moved into the store once: a later line naming it would find it gone.
                if let (file, ownership) = sourceFile(entries[entries.count - 1].prepared.body) {
                    if let first = movedBy[file] {
                        throw .invalid("\(lines[index].at): request.file \(file) is moved by line \(first) already")
                    }
                    if ownership == .move { movedBy[file] = lines[index].number }
                }
            }
            return entries
        }
        // The next lines, up to a batch; a bad line after lines not rendered yet: theirs is the first error, if any.
        func readBatch() throws(OutboxError) -> [LineToRender] {
            var lines: [LineToRender] = []
            while lines.count < LineRenderer.batch {
                let line: LineToRender?
                do throws(OutboxError) {
                    line = try nextLine(&reader, absolute: absolute, maxLine: maxLine, now: now, seen: &seen) { id throws(OutboxError) in
                        try movedFiles(project, id: id)
                    }
                } catch {
                    _ = try checked(lines, renderer.render(lines))
                    throw error
                }
                guard let line else { break }
                lines.append(line)
            }
            return lines
        }
        let results: [EnqueueResult]
        do {
            results = try renderer.enqueue(into: project, streaming: Self.isRegularFile(fd), now: now, read: readBatch, check: checked)
        } catch  where error.code == .running {
            // Like every other refusal of a line, it names the line (of the id given there).
            guard let line = seen.first(where: { error.message.hasPrefix("entry \($0.key) ") })?.value else { throw error }
            throw OutboxError(error.code, "\(absolute):\(line): \(error.message)")
        }
        if i.json {
            i.console.out(JSON.array(results.map { .object([("id", .string($0.id))]) }).serialized())
        } else if !results.isEmpty {
            i.console.out(results.map(\.id).joined(separator: "\n"))
        }
        return 0
    }

    /// `outbox render`: the request enqueue would persist, with secrets redacted; writes nothing.
    /// Renders KEY as enqueue would, writing nothing. Plugins (which may have side effects)
    /// run only with `--plugins`; each one skipped is named on stderr and returned. Without
    /// `--plugins`, a definition built by `request_command` has no request to show (nil).
    static func preview(_ i: inout Invocation, key: String, defaultID: String) throws(OutboxError) -> (NewEntry?, skipped: [String]) {
        let vars = try readVars(i)
        let project = try i.project()
        let definition = try project.definition(key)
        var config = project.config
        var skipped: [String] = []
        if !i.args.flag("plugins") {
            if definition.requestCommand != nil { skipped.append("request_command") }
            if config.headersCommand != nil { skipped.append("headers_command") }
            config.headersCommand = nil
        }
        for name in skipped { i.console.err("outbox: \(name) not run (--plugins runs it)") }
        if skipped.contains("request_command") { return (nil, skipped) }
        var renderer = EntryFactory(config: config, environment: i.environment, cwd: try i.cwd) { (_: String) throws(OutboxError) in
            definition
        }
        // A preview stores nothing: the account's variable unset shows as no account.
        renderer.unsetAccountIsNone = true
        return (try renderer.make(definition: definition, vars: vars, id: i.args.value("id") ?? defaultID), skipped)
    }

    static func render(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        let key = i.args.positionals[0]
        let (prepared, skipped) = try preview(&i, key: key, defaultID: "render-preview")
        guard let entry = prepared else {
            // The request is the plugin's answer: there is nothing else to show.
            let document = JSON.object([("key", .string(key)), ("skipped", .array(skipped.map { .string($0) }))])
            i.console.out(i.json ? document.serialized() : document.pretty())
            return 0
        }
        let p = entry.prepared
        let project = try i.project()
        // `headers update` patches rank above every other source, as enqueue stores them
        // (only an existing store holds any; render never creates one), and are secrets.
        let patch = project.storeExists ? try project.store().headerPatch() : []
        let redact = project.config.redactedHeaderNames.union(p.secretHeaders).union(patch.map { $0.0.lowercased() })
        var headers = HeaderRules.redacted(HeaderRules.merge(p.headers, patch), names: redact)
        if let k = p.idempotencyKey { headers.append(("Idempotency-Key", k)) }
        var body: JSON = .null
        switch p.body {
        case .none: break
        case let .bytes(bytes, kind):
            let text = String(decoding: bytes, as: UTF8.self)
            body = kind == .data ? ((try? JSON.parse(text)) ?? .string(text)) : .string(text)
        case let .form(fields):
            body = .array(
                fields.map { f in
                    .object([("name", .string(f.name)), ("value", .optionalString(f.value)), ("file", .optionalString(f.file?.path))])
                })
        case let .file(file, ownership):
            body = .object([("file", .string(file.path)), ("size", .int64(file.size)), ("ownership", .string(ownership.rawValue))])
        case let .parts(file, ownership, parts):
            body = .object([
                ("file", .string(file.path)), ("size", .int64(file.size)), ("ownership", .string(ownership.rawValue)),
                (
                    "parts",
                    .array(
                        parts.enumerated().map { index, part in
                            JSON.object([
                                ("index", .int(index)), ("start", .int64(part.range.start)), ("end", .int64(part.range.end)),
                                ("url", .string(URLCheck.shown(part.url, secret: p.secretURL))),
                                (
                                    "headers",
                                    HeaderRules.json(HeaderRules.redacted(part.headers.map { ($0.name, $0.value) }, names: redact))
                                ),
                            ])
                        })
                ),
            ])
        }
        var document = JSON.object([
            ("key", .string(key)), ("method", .string(p.method)),
            ("url", .optionalString(p.url.map { URLCheck.shown($0, secret: p.secretURL) })),
            ("headers", HeaderRules.json(headers)), ("body_kind", .string(p.body.kind.rawValue)), ("body", body),
            ("expires_in_ms", .int64(p.expiresInMs)), ("scope", .optionalString(p.scope)),
            ("follow_redirects", .int(p.followRedirects)), ("response", p.response.json),
            ("skipped", .array(skipped.map { .string($0) })),
        ])
        // The object only: its credentials are read, and its signature made, by the runner.
        if let s3 = p.s3 { document.set("s3", s3.json) }
        i.console.out(i.json ? document.serialized() : document.pretty())
        return 0
    }
}
