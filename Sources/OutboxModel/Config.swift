import Glibc
import YAML

/// A hook or plugin command: a string run with `/bin/sh -c`, or an argument list run directly.
package enum CommandSpec: Sendable, Equatable {
    case shell(String)
    case argv([String])

    package var json: JSON {
        switch self {
        case let .shell(s): return .string(s)
        case let .argv(a): return .array(a.map { .string($0) })
        }
    }

    package init?(json: JSON) {
        switch json {
        case let .string(s): self = .shell(s)
        case let .array(items):
            let strings = items.compactMap(\.stringValue)
            guard strings.count == items.count, !strings.isEmpty else { return nil }
            self = .argv(strings)
        default: return nil
        }
    }
}

/// Retry settings: backoff and the 4xx codes treated as transient.
package struct RetryRules: Sendable, Equatable {
    package var backoff = BackoffPolicy()
    package var exempt: [Int] = [404]
    package init() {}

    package var json: JSON {
        .object([
            (
                "backoff",
                .object([
                    ("base_ms", .int64(backoff.baseMs)), ("max_ms", .int64(backoff.maxMs)),
                    ("jitter", .number(String(backoff.jitter))),
                ])
            ),
            ("exempt", .array(exempt.map { .int($0) })),
        ])
    }

    package init(json: JSON) {
        if let b = json["backoff"] {
            backoff.baseMs = b["base_ms"]?.int64Value ?? backoff.baseMs
            backoff.maxMs = b["max_ms"]?.int64Value ?? backoff.maxMs
            backoff.jitter = b["jitter"]?.doubleValue ?? backoff.jitter
        }
        if let e = json["exempt"]?.arrayValue { exempt = e.compactMap { $0.int64Value.map(Int.init) } }
    }
}

/// The project's settings (`config/outbox.yaml`, docs/config.md); every field has a default.
package struct Config: Sendable {
    /// The project root: hooks run here and relative paths resolve against it.
    package var root: String
    /// The config file, or nil when none exists (all defaults).
    package var file: String?
    package var store: String
    package var definitions: String
    package var lifetimeMs: Int64 = 14 * 86_400_000
    package var maxVarsBytes: Int64 = 1 << 20
    package var maxResponseBytes: Int64 = 1 << 20
    package var retry = RetryRules()
    /// Header templates, rendered at enqueue.
    package var headers: [(String, String)] = []
    package var headersCommand: CommandSpec?
    package var authRefreshCommand: CommandSpec?
    package var redactHeaders: [String] = [] {
        didSet { redactedHeaderNames = Self.alwaysRedacted.union(redactHeaders.map { $0.lowercased() }) }
    }
    package var eventsCommand: CommandSpec?
    /// Template of the account that enqueues.
    package var account: String?
    package var concurrency = 16
    package var perHost = 4
    package var partConcurrency = 3
    package var hookConcurrency = 32
    package var hookWarnAfterMs: Int64 = 30_000
    package var hookTimeoutMs: Int64?
    /// nil means the built-in check.
    package var wifiCheck: CommandSpec?
    /// How long a Wi-Fi check's answer holds: the check runs at most once per interval for
    /// the whole queue.
    package var wifiIntervalMs: Int64 = 30_000
    /// Consecutive connection failures (no HTTP answer) after which a host is held: one
    /// probe request at a time until it answers. 0 never holds a host.
    package var hostHoldAfter = 5
    /// How long a runner's claim lasts on a store several runners share, unless renewed.
    package var leaseMs: Int64 = 30_000
    /// How long a plugin (request_command, headers_command, auth_refresh_command, a response
    /// parser, the Wi-Fi check) may run before it is stopped and counted as failed.
    package var pluginTimeoutMs: Int64 = 30_000
    /// The plugins named in the file, with where (for `check`).
    package var commands: [CommandRef] = []
    package var connectTimeoutMs: Int64 = 30_000
    /// The longest one HTTP request may take in all; nil: no limit (the stall check still applies).
    package var attemptTimeoutMs: Int64?
    package var stallBelowBytes: Int64 = 1024
    package var stallForMs: Int64 = 60_000
    package var caFile: String?
    /// A client certificate (PEM) and its private key, for servers that ask for one.
    package var clientCert: String?
    package var clientKey: String?

    package init(root: String) {
        self.root = root
        store = Paths.join(root, ".outbox")
        definitions = Paths.join(root, "definitions")
    }

    /// Header names never printed, lowercased: the fixed ones plus `redact_headers` (kept,
    /// not built at each use: every request and every enqueued entry asks).
    package private(set) var redactedHeaderNames = alwaysRedacted
    static let alwaysRedacted: Set<String> = ["authorization", "cookie", "proxy-authorization", "set-cookie"]

    /// Finds the config: `explicit` (from --config or OUTBOX_CONFIG), else
    /// `config/outbox.yaml` in `cwd` or a folder above it.
    package static func locate(explicit: String?, cwd: String) -> String? {
        if let explicit { return Paths.absolute(explicit, relativeTo: cwd) }
        var dir = Paths.normalize(cwd)
        while true {
            let candidate = Paths.join(dir, "config/outbox.yaml")
            // The nearest one that exists, even a folder, a FIFO or a broken link: the caller
            // refuses it rather than a project further up being used without a word.
            if Paths.entryExists(candidate) { return candidate }
            if dir == "/" { return nil }
            dir = Paths.dirname(dir)
        }
    }

    /// A store folder made absolute; a server URL (`postgres://...`) is kept as written.
    package static func storeLocation(_ text: String, root: String) -> String {
        isServerStore(text) ? text : Paths.absolute(text, relativeTo: root)
    }

    /// Why a store value can be neither a folder nor a server: a `~` no shell expands here,
    /// or a URL of another scheme (`POSTGRES://` would quietly be a folder of that name).
    package static func storeProblem(_ text: String) -> String? {
        if text.hasPrefix("~") { return "\(Units.quoted(text, limit: 40)) starts with ~, which is not expanded here; give the full path" }
        if !isServerStore(text), text.contains("://") {
            // Only the scheme is quoted: the rest may hold a password.
            let scheme = text.prefix { $0 != ":" }.prefix(20)
            return "a \(scheme):// URL is not a store; a server store is postgres:// or postgresql:// (lowercase)"
        }
        // `postgres:`, `postgresql:/db`: a server URL written short would quietly be a folder.
        let lowered = text.lowercased()
        if !isServerStore(text), lowered.hasPrefix("postgres:") || lowered.hasPrefix("postgresql:") {
            return
                "\"\(text.prefix { $0 != ":" }.prefix(20)):\" is not a server URL; a server store is postgres://user@host/db (a folder is named by its path)"
        }
        return nil
    }

    /// Whether `store` names a PostgreSQL server rather than a folder.
    package static func isServerStore(_ text: String) -> Bool {
        text.hasPrefix("postgres://") || text.hasPrefix("postgresql://")
    }

    /// Where file bodies are staged: the store folder, or with a server store `staging.path`
    /// (default `.outbox` in the root).
    package var stagingFolder: String {
        Self.isServerStore(store) ? stagingPath ?? Paths.join(root, ".outbox") : store
    }
    /// `staging.path`, absolute.
    package var stagingPath: String?
    /// `staging.shared`: every host sees the staging folder at the same path.
    package var stagingShared = false

    /// Fields a service manager may set from the environment, above the file's value:
    /// where the queue lives and how hard it pushes.
    package static let environmentOverrides: [(variable: String, field: String)] = [
        ("OUTBOX_STORE", "store"), ("OUTBOX_CONCURRENCY", "concurrency"), ("OUTBOX_PER_HOST", "per_host"),
        ("OUTBOX_PART_CONCURRENCY", "part_concurrency"),
    ]

    /// Loads and checks a config file, then applies the `OUTBOX_*` overrides found in
    /// `environment`. Errors are collected as diagnostics (E_CONFIG).
    package static func load(file: String, environment: [String: String] = [:]) throws(OutboxError) -> Config {
        var config = try parse(file: file)
        for (variable, field) in environmentOverrides {
            guard let text = environment[variable] else { continue }
            // The same range as the field in the file.
            guard let range = ConfigFields.top[field].type.integerRange else {
                guard !text.isEmpty, !text.utf8.contains(0) else {
                    throw OutboxError(.config, "\(variable) is empty: it names the store folder")
                }
                // The rules of `store:` in the file: no shell expands `~` here, and a URL is postgres's.
                if let problem = storeProblem(text) { throw OutboxError(.config, "\(variable): \(problem)") }
                config.store = storeLocation(text, root: config.root)
                continue
            }
            guard let n = Units.wholeNumber(text, in: Int(range.lowerBound)...Int(range.upperBound)) else {
                throw OutboxError(
                    .config,
                    "\(variable) (\(field)) must be a whole number from \(range.lowerBound) to \(range.upperBound), not \(Units.quoted(text, limit: 20))"
                )
            }
            switch field {
            case "concurrency": config.concurrency = n
            case "per_host": config.perHost = n
            default: config.partConcurrency = n
            }
        }
        return config
    }

    private static func parse(file: String) throws(OutboxError) -> Config {
        guard let bytes = Paths.readBytes(file) else {
            let code = errno
            // There but too big: a bad config, as a too-big definition file is.
            if code == EFBIG {
                let message = "cannot read this config file: \(Paths.readFailure(code))"
                throw OutboxError(.config, "1 error", diagnostics: [Diagnostic(path: file, line: 1, column: 1, message: message)])
            }
            throw .fileMissing("cannot read the config file \(file): \(Paths.readFailure(code))")
        }
        if let offset = Paths.invalidUTF8Offset(bytes) {
            throw OutboxError(.config, "1 error", diagnostics: [Diagnostic.invalidUTF8(path: file, bytes: bytes, offset: offset)])
        }
        let text = String(decoding: bytes, as: UTF8.self)
        let folder = Paths.dirname(file)
        let defaultRoot = Paths.basename(folder) == "config" ? Paths.dirname(folder) : folder
        var reader = YAMLReader(path: file)
        let node: YAMLNode?
        do {
            node = try YAMLParser.parse(text)
        } catch {
            reader.error(error.mark, error.message)
            throw OutboxError(.config, "1 error", diagnostics: reader.diagnostics)
        }
        var config = Config(root: defaultRoot)
        config.file = file
        if let node {
            reader.refuseUnknownTags(node)
            config.read(node, reader: &reader)
        }
        config.commands = reader.commands
        if !reader.diagnostics.isEmpty {
            let n = reader.diagnostics.count
            throw OutboxError(.config, "\(n) error\(n == 1 ? "" : "s")", diagnostics: reader.diagnosticsInSourceOrder)
        }
        return config
    }

    private mutating func read(_ node: YAMLNode, reader: inout YAMLReader) {
        if case .scalar = node.kind, case .null? = node.scalar { return }
        guard let f = reader.fields(node, ConfigFields.top, context: "the config") else { return }
        if let r = reader.path(f["root"], "root", relativeTo: Paths.dirname(reader.path)), let mark = f["root"]?.mark {
            root = r
            // A typo here would quietly start a new store (and find no definitions) in a new folder.
            if !Paths.isDirectory(root) {
                reader.error(mark, "root: \(root) \(Paths.exists(root) ? "is not a folder" : "does not exist")")
            }
        }
        store = Paths.join(root, ".outbox")
        if let n = f["store"], let text = reader.string(n, "store") {
            if !text.hasPrefix("~"), let problem = Self.storeProblem(text) { reader.error(n.mark, "store: \(problem)") }
            store = Self.isServerStore(text) ? text : reader.path(n, "store", relativeTo: root) ?? store
        }
        definitions = reader.path(f["definitions"], "definitions", relativeTo: root) ?? Paths.join(root, "definitions")
        if let node = f["lifetime"], let v = reader.duration(node, "lifetime") {
            // Entries would expire as they are enqueued, each one unsent.
            if v == 0 { reader.error(node.mark, "lifetime must be longer than 0 (entries would expire unsent)") } else { lifetimeMs = v }
        }
        if let v = reader.size(f["max_vars_bytes"], "max_vars_bytes") { maxVarsBytes = v }
        if let v = reader.size(f["max_response_bytes"], "max_response_bytes") { maxResponseBytes = v }
        if let n = f["retry"], let r = RetryRules.read(n, reader: &reader, context: "retry", base: retry) { retry = r }
        if let n = f["headers"] { headers = Self.readHeaders(n, reader: &reader, context: "headers") }
        headersCommand = reader.command(f["headers_command"], "headers_command")
        authRefreshCommand = reader.command(f["auth_refresh_command"], "auth_refresh_command")
        if let n = f["redact_headers"] {
            if case let .sequence(items) = n.kind {
                redactHeaders = items.compactMap { item in
                    guard let name = reader.string(item, "redact_headers items") else { return nil }
                    // Any token names a header to hide, the framing ones too (never set, still shown).
                    if let problem = HeaderRules.nameProblem(name), !HeaderRules.isFraming(name) {
                        reader.error(item.mark, "redact_headers: \(problem)")
                        return nil
                    }
                    return name
                }
            } else if !(n.scalar == .null) {
                reader.error(n.mark, "redact_headers must be a list of header names")
            }
        }
        if let n = f["events"], let e = reader.fields(n, ConfigFields.events, context: "events") {
            eventsCommand = reader.command(e["command"], "events.command")
        }
        if let n = f["account"], n.scalar != .null {
            account = reader.string(n, "account")
            // Rendered alike by enqueue and by the runner (its own account): the environment
            // is all both have, so vars or entry.id could only ever come out empty.
            if let template = account, let problem = Template.validate(template, roots: ["env"]) {
                reader.error(n.mark, "account: \(problem)")
            }
        }
        if let v = reader.int(f["concurrency"], "concurrency", range: ConfigFields.top.range("concurrency")) { concurrency = Int(v) }
        if let v = reader.int(f["per_host"], "per_host", range: ConfigFields.top.range("per_host")) { perHost = Int(v) }
        if let v = reader.int(f["part_concurrency"], "part_concurrency", range: ConfigFields.top.range("part_concurrency")) {
            partConcurrency = Int(v)
        }
        if let n = f["hooks"], let h = reader.fields(n, ConfigFields.hooks, context: "hooks") {
            if let v = reader.int(h["concurrency"], "hooks.concurrency", range: ConfigFields.hooks.range("concurrency")) {
                hookConcurrency = Int(v)
            }
            if let v = reader.duration(h["warn_after"], "hooks.warn_after") { hookWarnAfterMs = v }
            if let t = h["timeout"], t.scalar != .null, let v = reader.duration(t, "hooks.timeout") {
                // Zero would stop every hook as it starts; no limit is written null.
                if v == 0 { reader.error(t.mark, "hooks.timeout must be longer than 0 (null: no limit)") } else { hookTimeoutMs = v }
            }
        }
        if let n = f["hosts"], let h = reader.fields(n, ConfigFields.hosts, context: "hosts") {
            if let v = reader.int(h["hold_after"], "hosts.hold_after", range: ConfigFields.hosts.range("hold_after")) {
                hostHoldAfter = Int(v)
            }
        }
        if let n = f["staging"], let st = reader.fields(n, ConfigFields.staging, context: "staging") {
            if let c = st["path"], c.scalar != .null { stagingPath = reader.path(c, "staging.path", relativeTo: root) }
            if let v = reader.bool(st["shared"], "staging.shared") { stagingShared = v }
        }
        if let n = f["lease"], let v = reader.duration(n, "lease") {
            // Renewed every third of it: shorter would renew faster than a busy runner turns.
            if v < 1_000 { reader.error(n.mark, "lease must be at least 1s, not \(Units.formatDuration(ms: v))") } else { leaseMs = v }
        }
        if let n = f["plugins"], let pl = reader.fields(n, ConfigFields.plugins, context: "plugins") {
            if let t = pl["timeout"], let v = reader.duration(t, "plugins.timeout") {
                // Zero would fail every plugin as it starts.
                if v == 0 { reader.error(t.mark, "plugins.timeout must be longer than 0") } else { pluginTimeoutMs = v }
            }
        }
        if let n = f["network"], let net = reader.fields(n, ConfigFields.network, context: "network") {
            if let v = reader.duration(net["wifi_interval"], "network.wifi_interval") { wifiIntervalMs = max(1, v) }
            if let w = net["wifi_check"], w.scalar != .string("builtin") {
                wifiCheck = reader.command(w, "network.wifi_check")
            }
        }
        if let n = f["timeouts"], let t = reader.fields(n, ConfigFields.timeouts, context: "timeouts") {
            if let v = reader.duration(t["connect"], "timeouts.connect") { connectTimeoutMs = v }
            if let a = t["attempt"], a.scalar != .null, let v = reader.duration(a, "timeouts.attempt") {
                if v == 0 { reader.error(a.mark, "timeouts.attempt must be longer than 0 (null: no limit)") } else { attemptTimeoutMs = v }
            }
            if let s = t["stall"], let st = reader.fields(s, ConfigFields.stall, context: "timeouts.stall") {
                if let v = reader.size(st["below"], "timeouts.stall.below") { stallBelowBytes = v }
                if let v = reader.duration(st["for"], "timeouts.stall.for") { stallForMs = v }
            }
        }
        if let n = f["tls"], let t = reader.fields(n, ConfigFields.tls, context: "tls") {
            var paths: [String: String] = [:]
            for name in ConfigFields.tls.names {
                // A file that cannot be read would fail every attempt, one by one, at run time.
                if let c = t[name], c.scalar != .null, let path = reader.path(c, "tls.\(name)", relativeTo: root) {
                    if let problem = Paths.readProblem(path) {
                        reader.error(c.mark, "tls.\(name): cannot read \(path): \(problem)")
                    } else if !Paths.isRegularFile(path) {
                        reader.error(c.mark, "tls.\(name): \(path) is not a file")
                    } else if let problem = Self.pemProblem(path, field: name) {
                        reader.error(c.mark, "tls.\(name): \(path) \(problem)")
                    }
                    paths[name] = path
                }
            }
            caFile = paths["ca_file"]
            (clientCert, clientKey) = (paths["cert"], paths["key"])
            // A certificate is useless without its key, and the other way round.
            if (clientCert == nil) != (clientKey == nil) {
                reader.error(n.mark, "tls.cert and tls.key go together: give both or neither")
            }
        }
    }

    /// What is wrong with a `tls` PEM file for its field, or nil: every attempt would fail on it.
    /// `ca_file` and `cert` hold certificates, `key` a private key (the one libcurl reads: PEM),
    /// never one encrypted with a passphrase (OpenSSL would ask for it on the terminal).
    static func pemProblem(_ path: String, field: String) -> String? {
        guard let bytes = Paths.readBytes(path) else { return nil }
        let text = String(decoding: bytes, as: UTF8.self)
        if field != "ca_file", text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----") || text.contains("Proc-Type: 4,ENCRYPTED") {
            return
                "holds a private key encrypted with a passphrase, which outbox has no way to give; store it decrypted (openssl pkey -in KEY -out PLAIN), readable only by outbox's user"
        }
        if field == "key", !text.contains("PRIVATE KEY-----") { return "holds no private key in PEM form" }
        if field != "key", !text.contains("-----BEGIN CERTIFICATE-----") { return "holds no certificate in PEM form" }
        return nil
    }

    static func readHeaders(_ node: YAMLNode, reader: inout YAMLReader, context: String) -> [(String, String)] {
        if node.scalar == .null { return [] }
        guard case let .mapping(pairs) = node.kind else {
            reader.error(node.mark, "\(context) must be a mapping of header names to values")
            return []
        }
        var out: [(String, String)] = []
        // Names compare without case, so a second spelling would silently replace the first.
        var seen: [String: (name: String, line: Int)] = [:]
        for pair in pairs {
            guard let name = reader.string(pair.key, "header names in \(context)") else { continue }
            if let problem = HeaderRules.nameProblem(name) ?? HeaderRules.givenProblem(name) {
                reader.error(pair.key.mark, "\(context): \(problem)")
                continue
            }
            if let first = seen[name.lowercased()] {
                reader.error(pair.key.mark, "\(context): header \(name) is given twice (also as \(first.name) on line \(first.line))")
                continue
            }
            seen[name.lowercased()] = (name, pair.key.mark.line)
            guard let value = reader.string(pair.value, "\(context).\(name)") else { continue }
            if let problem = Template.validate(value) {
                reader.error(pair.value.mark, "\(context).\(name): \(problem)")
            } else if !value.contains("{{"), let problem = HeaderRules.valueProblem(value) {
                // Written into the file itself (not from vars): `check` can see it now.
                reader.error(pair.value.mark, "\(context).\(name): \(problem)")
            }
            out.append((name, value))
        }
        return out
    }
}

extension RetryRules {
    /// Why a backoff's base and max do not make one (nil when either is not known): a base of
    /// 0 asks a failing server again at once, without end, and a base over the max is never used.
    package static func backoffProblem(baseMs: Int64?, maxMs: Int64?, context: String) -> String? {
        guard let baseMs else { return nil }
        if baseMs <= 0 { return "\(context).backoff.base must be longer than 0 (a failing server would be asked again at once)" }
        guard let maxMs, baseMs > maxMs else { return nil }
        return
            "\(context).backoff.base \(Units.formatDuration(ms: baseMs)) is longer than \(context).backoff.max \(Units.formatDuration(ms: maxMs))"
    }

    /// Reads a `retry` section; each object given must be complete (no silent mix with defaults).
    static func read(_ node: YAMLNode, reader: inout YAMLReader, context: String, base: RetryRules) -> RetryRules? {
        guard let f = reader.fields(node, ConfigFields.retry, context: context) else { return nil }
        var rules = base
        if let b = f["backoff"], let bf = reader.fields(b, ConfigFields.backoff, context: "\(context).backoff") {
            for name in ConfigFields.backoff.names where bf[name] == nil {
                reader.error(b.mark, "\(context).backoff must give base, max and jitter (missing \(name))")
            }
            let baseMs = reader.duration(bf["base"], "\(context).backoff.base")
            let maxMs = reader.duration(bf["max"], "\(context).backoff.max")
            if let node = bf["base"], let problem = RetryRules.backoffProblem(baseMs: baseMs, maxMs: maxMs, context: context) {
                reader.error(node.mark, problem)
            }
            if let v = baseMs { rules.backoff.baseMs = v }
            if let v = maxMs { rules.backoff.maxMs = v }
            if let v = reader.double(bf["jitter"], "\(context).backoff.jitter", range: ConfigFields.backoff.numberRange("jitter")) {
                rules.backoff.jitter = v
            }
        }
        if let t = f["terminal_http"], let tf = reader.fields(t, ConfigFields.terminalHTTP, context: "\(context).terminal_http") {
            guard let e = tf["exempt"] else {
                reader.error(t.mark, "\(context).terminal_http must give exempt")
                return rules
            }
            if case let .sequence(items) = e.kind {
                rules.exempt = items.compactMap { item in
                    reader.int(item, "\(context).terminal_http.exempt items", range: ConfigFields.terminalHTTP.range("exempt")).map(
                        Int.init)
                }
            } else {
                reader.error(e.mark, "\(context).terminal_http.exempt must be a list of 4xx status codes")
            }
        }
        return rules
    }
}
