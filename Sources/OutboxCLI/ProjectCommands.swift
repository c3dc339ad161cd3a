import Glibc
import OutboxModel
import OutboxStore

/// `outbox check`: every problem of the config and definitions, compiler style.
enum CheckCommand {
    static func run(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        let project = try i.project()
        // An empty folder is a project without definitions; a missing one is a wrong `definitions:`.
        if let problem = project.definitionsFolderProblem { throw OutboxError(.config, problem) }
        let set = project.definitions
        // A hook or plugin whose program is missing would fail at every delivery (exit 127).
        let searchPath = i.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
        // Also those of a definition disabled for a `then` key: each problem is named at once.
        let checked = Array(set.definitions.values) + Array(set.disabledByThen.values)
        let commands = project.config.commands + checked.sorted { $0.file < $1.file }.flatMap(\.commands)
        let missing = commands.compactMap { ref -> Diagnostic? in
            ref.problem(root: project.config.root, searchPath: searchPath).map {
                Diagnostic(path: ref.path, line: ref.mark.line, column: ref.mark.column, message: $0)
            }
        }
        let diagnostics = set.diagnostics + missing
        if !diagnostics.isEmpty {
            throw OutboxError(.config, "\(diagnostics.count) error\(diagnostics.count == 1 ? "" : "s")", diagnostics: diagnostics)
        }
        // What every other command would refuse about the store, without opening it.
        if Config.isServerStore(project.config.store) {
            _ = try PostgresURL(project.config.store)
        } else {
            try SQLiteStore.checkStoreFolder(project.config.store)
        }
        let n = set.definitions.count
        let summary = "ok: \(project.config.file ?? "defaults") and \(n) definition\(n == 1 ? "" : "s") in \(project.config.definitions)"
        if i.json {
            i.console.out(
                JSON.object([("ok", .bool(true)), ("definitions", .array(set.definitions.keys.sorted().map { .string($0) }))]).serialized())
        } else {
            i.console.out(summary)
        }
        return 0
    }
}

/// `outbox init`: a scaffold that `outbox check` passes.
enum InitCommand {
    static let config = """
        # outbox settings; every field has a default (see the README).
        store: .outbox
        definitions: definitions
        lifetime: 14d
        concurrency: 16
        per_host: 4
        retry:
          backoff: { base: 1s, max: 2h, jitter: 0.2 }
          terminal_http: { exempt: [404] }
        hooks: { concurrency: 32, warn_after: 30s }

        """
    static let definition = """
        # One kind of request. Enqueue with:
        #   outbox enqueue example.ping --vars '{"message": "hello"}'
        key: example.ping
        request:
          method: POST
          url: "http://127.0.0.1:8080/ping"
          data:
            message: "{{ vars.message }}"
        on_success: hooks/example-done.sh
        on_error: hooks/example-done.sh

        """
    static let hook = """
        #!/bin/sh
        # Gets the outcome as JSON on stdin; exit 0 acknowledges it.
        echo "outbox: $OUTBOX_OUTCOME for $OUTBOX_ID ($OUTBOX_KEY), delivery $OUTBOX_DELIVERIES" >&2
        cat > /dev/null

        """

    static func run(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        // The project is made here, whatever config another one names: said, not ignored.
        if i.args.value("config") != nil {
            throw .usage("init makes its project in the current folder (config/outbox.yaml here): cd there instead of giving --config")
        }
        let files: [(String, String, mode_t)] = [
            ("config/outbox.yaml", config, 0o644),
            ("definitions/example-ping.yaml", definition, 0o644),
            ("hooks/example-done.sh", hook, 0o755),
        ]
        let cwd = try i.cwd
        for (path, _, _) in files where Paths.exists(Paths.join(cwd, path)) {
            throw .invalid("\(Paths.join(cwd, path)) exists already; init writes nothing over existing files")
        }
        // Checked before any is made, so a file in the way leaves no half scaffold behind.
        for folder in ["config", "definitions", "hooks"] {
            let path = Paths.join(cwd, folder)
            if Paths.exists(path), !Paths.isDirectory(path) {
                throw .invalid("\(path) exists and is not a folder; init writes nothing over existing files")
            }
        }
        for folder in ["config", "definitions", "hooks"] {
            let path = Paths.join(cwd, folder)
            if !Paths.isDirectory(path), mkdir(path, 0o755) != 0 {
                throw .storage("cannot create \(path): \(Paths.errnoMessage())")
            }
        }
        // All three files or none: one cut short (a full disk) would trip `check` later, and
        // one left whole would make the next `init` refuse.
        var created: [String] = []
        for (path, text, mode) in files {
            let full = Paths.join(cwd, path)
            let fd = open(full, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode)
            if fd >= 0 { created.append(full) }
            let bytes = Array(text.utf8)
            let complete =
                fd >= 0 && bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) } == bytes.count
                && fchmod(fd, mode) == 0 && fsync(fd) == 0
            let problem = complete ? nil : Paths.errnoMessage()
            if fd >= 0 { close(fd) }
            if let problem {
                for file in created { unlink(file) }
                throw .storage("cannot write \(full): \(problem)")
            }
        }
        if i.json {
            // What a script needs: the files made (relative to here), nothing on stderr.
            i.console.out(JSON.object([("created", .array(files.map { .string($0.0) }))]).serialized())
            return 0
        }
        for (path, _, _) in files { i.console.err("created \(path)") }
        i.console.err(
            "next: point the url in definitions/example-ping.yaml at your server (it posts to http://127.0.0.1:8080/ping), then "
                + "outbox check; outbox enqueue example.ping --vars '{\"message\":\"hi\"}'; outbox run --drain")
        return 0
    }
}

/// Commands that change the queue's settings or entries.
enum ControlCommands {
    /// Which entries a command names: ids, or `--key K`, or its `flag` (exactly one of them);
    /// a bad key is E_INVALID before anything changes.
    static func selection(_ i: Invocation, command: String, flag: String) throws(OutboxError) -> (ids: [String]?, key: String?, flag: Bool)
    {
        // An id given twice is one entry: reported once.
        var seen = Set<String>()
        let ids = i.args.positionals.filter { seen.insert($0).inserted }
        let key = i.args.value("key")
        let flagged = i.args.flag(flag)
        guard [!ids.isEmpty, key != nil, flagged].filter({ $0 }).count == 1 else {
            throw .usage("\(command) takes ids, or --key K, or --\(flag) (exactly one of them)")
        }
        try checkKeys(key.map { [$0] } ?? [])
        // An id no entry can have is a mistake (two ids quoted as one), not an unknown id.
        for id in ids {
            if let problem = Identifiers.validateUserID(id) { throw .invalid(problem) }
        }
        return (ids.isEmpty ? nil : ids, key, flagged)
    }

    /// What a command that changes entries did: `{"NAME": [ids]}` with `--json`, a count on stderr otherwise.
    static func report(_ i: Invocation, _ name: String, _ ids: [String], _ said: String) {
        if i.json {
            i.console.out(JSON.object([(name, .array(ids.map { .string($0) }))]).serialized())
        } else {
            i.console.err("\(said) \(ids.count) entr\(ids.count == 1 ? "y" : "ies")")
        }
    }

    static func cancel(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        let (ids, key, _) = try selection(i, command: "cancel", flag: "all")
        let cancelled = try i.project().store().cancel(ids: ids, key: key, now: Identifiers.nowMs())
        report(i, "cancelled", cancelled, "cancelled")
        return 0
    }

    /// A key named on the command line: a bad one is E_INVALID before anything changes.
    static func checkKeys(_ keys: [String]) throws(OutboxError) {
        for key in keys {
            if let problem = Definition.keyProblem(key) { throw .invalid("--key \(Units.quoted(key, limit: 64)): \(problem)") }
        }
    }

    static func pause(_ i: inout Invocation, paused: Bool) throws(OutboxError) -> Int32 {
        // `--key a b c` as well as `--key a --key b`; a key alone, without --key, is a slip
        // (`pause` alone pauses the whole queue).
        if let stray = i.args.positionals.first, i.args.values("key").isEmpty {
            throw .usage(
                "\"\(TerminalText.visible(String(stray.prefix(60))))\": give keys with --key (outbox \(paused ? "pause" : "resume") --key K…)"
            )
        }
        let keys = i.args.values("key") + i.args.positionals
        try checkKeys(keys)
        let store = try i.project().store()
        if keys.isEmpty {
            try store.setQueuePaused(paused)
            if !i.json { i.console.err(paused ? "paused the whole queue (outbox resume to undo)" : "resumed the whole queue") }
        } else {
            try store.setPaused(keys: keys, paused: paused)
            if !i.json { i.console.err("\(paused ? "paused" : "resumed") \(keys.joined(separator: ", "))") }
        }
        if i.json {
            // The state after the change: what holds entries now.
            let control = try store.control()
            i.console.out(
                JSON.object([
                    ("queue_paused", .bool(control.queuePaused)),
                    ("paused_keys", .array(control.pausedKeys.sorted().map { .string($0) })),
                ]).serialized())
        }
        return 0
    }

    static func retry(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        let (ids, key, errors) = try selection(i, command: "retry", flag: "errors")
        let retried = try i.project().store().retry(ids: ids, key: key, errors: errors, now: Identifiers.nowMs())
        report(i, "retried", retried, "put back in the queue, due now,")
        return 0
    }

    static func headersUpdate(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        var patch: [(String, String)] = []
        // A patch holds credentials: a malformed one is named by its position, never echoed.
        for (position, text) in i.args.positionals.enumerated() {
            let which = "header \(position + 1) of \(i.args.positionals.count)"
            guard let colon = text.firstIndex(of: ":") else {
                throw .usage("headers are written 'Name: value'; \(which) has no ':' (not shown: it may hold a credential)")
            }
            let name = String(text[..<colon]).trimmingCharacters(in: " \t")
            let value = String(text[text.index(after: colon)...]).trimmingCharacters(in: " \t")
            if !name.isEmpty, !HeaderRules.isFraming(name), HeaderRules.nameProblem(name) != nil {
                throw .invalid("\(which): the text before its ':' is not a header name (not shown: it may hold a credential)")
            }
            if let problem = HeaderRules.nameProblem(name) { throw .invalid(problem) }
            if let problem = HeaderRules.valueProblem(value) { throw .invalid("\(name): \(problem)") }
            if let problem = HeaderRules.patchProblem(name) { throw .invalid(problem) }
            // A patch reaches every part of a chunked upload, whose ranges are each its own.
            if name.lowercased() == "content-range" {
                throw .invalid("header \(name) cannot be patched: each part of an upload has its own range")
            }
            // One value a name, as everywhere headers are given: the last would win unseen.
            if let first = patch.first(where: { $0.0.lowercased() == name.lowercased() }) {
                throw .invalid("header \(name) is given twice (also as \(first.0))")
            }
            patch.append((name, value))
        }
        let generation = try i.project().store().updateHeaders(patch, now: Identifiers.nowMs())
        if i.json {
            i.console.out(
                JSON.object([("header_generation", .int64(generation)), ("updated", .array(patch.map { .string($0.0) }))]).serialized())
        } else {
            i.console.err("header generation \(generation): updated \(patch.map(\.0).joined(separator: ", "))")
        }
        return 0
    }

    static func wifiOnly(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        let value = i.args.positionals[0]
        guard value == "on" || value == "off" else { throw .usage("wifi-only takes on or off, not \(Units.quoted(value, limit: 40))") }
        try i.project().store().setWifiOnly(value == "on")
        if i.json {
            i.console.out(JSON.object([("wifi_only", .bool(value == "on"))]).serialized())
        } else {
            i.console.err("wifi-only \(value)")
        }
        return 0
    }
}
