import Glibc
import OutboxModel
import OutboxRunner
import OutboxStore

/// One call of a command: its arguments, environment, folder and console.
struct Invocation {
    var args: ParsedArguments
    let environment: [String: String]
    /// Nil when the process's folder was removed (or cannot be read): then nothing that
    /// resolves a path or finds the project may run, rather than take `/` for it.
    let folder: String?
    let console: Console
    var json: Bool { args.flag("json") }

    /// The folder the command runs in: what relative paths and the project's search start from.
    var cwd: String {
        get throws(OutboxError) {
            guard let folder else {
                throw .fileMissing("the current folder no longer exists (or cannot be read): cd to a folder that does, and run it again")
            }
            return folder
        }
    }

    /// Loads the project: config (found upward from cwd, or --config / OUTBOX_CONFIG).
    func project() throws(OutboxError) -> Project {
        // An empty name would be taken for the folder it is resolved in.
        let given = args.value("config")
        let fromEnvironment = environment["OUTBOX_CONFIG"]
        if given?.isEmpty == true { throw .usage("--config needs a file name") }
        if given == nil, fromEnvironment?.isEmpty == true {
            throw OutboxError(
                .config, "OUTBOX_CONFIG is empty: it names the config file (unset it to find config/outbox.yaml here or above)")
        }
        return try Project.load(explicitConfig: given ?? fromEnvironment, cwd: try cwd, environment: environment)
    }
}

/// The command-line interface as a library function (tests call it in-process): parse, run,
/// print errors.
package enum CLI {
    static let globalOptions: [OptionSpec] = [
        OptionSpec(name: "config", valueName: "FILE", help: "the config file (default: config/outbox.yaml here or above; OUTBOX_CONFIG)"),
        OptionSpec(name: "help", valueName: nil, help: "show this help"),
        // Global: a command that prints nothing of its own still reports its errors as JSON.
        OptionSpec(name: "json", valueName: nil, help: "print JSON on stdout (errors too)"),
    ]

    /// Runs one call and returns the process exit status. All error printing happens here.
    /// Output lost on the way to stdout fails the call (E_STORAGE): a script must not take
    /// a cut-off `list --json` for the whole of it.
    package static func run(arguments: [String], environment: [String: String], cwd: String?, console: Console) -> Int32 {
        let status = runCommand(arguments: arguments, environment: environment, cwd: cwd, console: console)
        guard let lost = console.outputLost else { return status }
        guard status == 0 else {
            console.err("outbox: \(ErrorCode.storage.rawValue): what the command wrote to stdout was lost too: \(lost)")
            return status
        }
        console.err("outbox: \(ErrorCode.storage.rawValue): the command ran, but what it wrote to stdout was lost: \(lost)")
        return ErrorCode.storage.exitStatus
    }

    /// Runs a call given as the bytes of its arguments: one that is not UTF-8 is refused
    /// (E_INVALID, naming its option), never repaired into other text or another file name.
    package static func run(rawArguments: [[UInt8]], environment: [String: String], cwd: String?, console: Console) -> Int32 {
        let arguments = rawArguments.map { String(decoding: $0, as: UTF8.self) }
        for (n, bytes) in rawArguments.enumerated() {
            guard let offset = Paths.invalidUTF8Offset(bytes) else { continue }
            let word = arguments[n]
            let option =
                word.hasPrefix("--") && word.contains("=")
                ? String(word.prefix { $0 != "=" })
                : n > 0 && arguments[n - 1].hasPrefix("--") ? arguments[n - 1] : "argument \(n + 1)"
            let error = OutboxError.invalid(
                "\(option) is not valid UTF-8 (at byte \(offset + 1)): outbox takes text and file names in UTF-8")
            report(error, json: asksJSON(arguments), console: console)
            return error.code.exitStatus
        }
        return run(arguments: arguments, environment: environment, cwd: cwd, console: console)
    }

    static func runCommand(arguments: [String], environment: [String: String], cwd: String?, console: Console) -> Int32 {
        // Global options may come before the command too (`outbox --config F list`): they are
        // read as if written right after it.
        var lifted: [String] = []
        // `--json` before the command and after it mean the same; twice in one place is a slip.
        var jsonBefore = 0
        var words = arguments
        while let first = words.first, first == "--json" || first == "--config" || first.hasPrefix("--config=") {
            if first == "--json" {
                jsonBefore += 1
                words.removeFirst()
                continue
            }
            lifted.append(words.removeFirst())
            if first == "--config", let value = words.first {
                lifted.append(value)
                words.removeFirst()
            }
        }
        if words.first == "--version" || words.first == "version" {
            let json = jsonBefore > 0 || words.contains("--json")
            console.out(json ? JSON.object([("version", .string(outboxVersion))]).serialized() : "outbox \(outboxVersion)")
            return 0
        }
        let wantsJSON = asksJSON(arguments)
        if words.first == "--help" || words.first == "-h" || words.first == "help" {
            // `outbox help "store copy"`: a command named in one quoted word.
            words = words.flatMap { word in word.contains(" ") ? word.split(separator: " ").map(String.init) : [word] }
            let named = words.dropFirst().filter { !$0.hasPrefix("-") }
            let asked = Array(words.dropFirst())
            // Every word must name the command: `help enqueue extra` is no command's help.
            if let (command, consumed) = match(asked), !asked.dropFirst(consumed).contains(where: { !$0.hasPrefix("-") }) {
                console.out(command.help())
            } else if named.count > 1 || named.first.map({ name in !commands.contains { $0.path[0] == name } }) == true {
                report(
                    .usage(
                        "unknown command \"\(TerminalText.visible(String(named.joined(separator: " ").prefix(40))))\" (see outbox --help)"),
                    json: wantsJSON, console: console)
                return ErrorCode.usage.exitStatus
            } else {
                console.out(overview(group: named.first))
            }
            return 0
        }
        guard let (command, consumed) = match(words) else {
            // A group alone (`outbox headers`) lists its commands; `--help` after it too.
            if let group = words.first, commands.contains(where: { $0.path.count > 1 && $0.path[0] == group }) {
                if words.dropFirst().contains(where: { $0 == "--help" || $0 == "-h" }) {
                    console.out(overview(group: group))
                    return 0
                }
                let names = commands.filter { $0.path[0] == group }.map { "outbox " + $0.name }
                // `outbox store paste`: the word given is named, not taken for a missing one.
                let given =
                    words.dropFirst().first { !$0.hasPrefix("-") }.map {
                        "unknown command \"\(group) \(TerminalText.visible(String($0.prefix(40))))\"; "
                    } ?? ""
                report(
                    .usage("\(given)\(group) needs a command: \(names.joined(separator: ", "))"), json: wantsJSON, console: console)
                return ErrorCode.usage.exitStatus
            }
            let message =
                if let first = words.first {
                    first.hasPrefix("-")
                        ? "unknown option \(TerminalText.visible(String(first.prefix(40)))) before the command (see outbox --help)"
                        : "unknown command \"\(TerminalText.visible(String(first.prefix(40))))\" (see outbox --help)"
                } else {
                    "no command given (see outbox --help)"
                }
            if words.isEmpty && !wantsJSON { console.out(overview()) }
            report(.usage(message), json: wantsJSON, console: console)
            return ErrorCode.usage.exitStatus
        }
        words.removeFirst(consumed)
        words.insert(contentsOf: lifted, at: 0)
        var logsJSON = false
        do throws(OutboxError) {
            var parsed = try ArgumentParser.parse(words, command: command)
            if jsonBefore > 1 { throw OutboxError.usage("--json is given twice") }
            if jsonBefore == 1, !parsed.flag("json") { parsed.options["json"] = [""] }
            if parsed.flag("help") {
                console.out(command.help())
                return 0
            }
            logsJSON = parsed.value("log-format") == LogFormat.json.rawValue
            var invocation = Invocation(args: parsed, environment: environment, folder: cwd, console: console)
            return try command.handler(&invocation)
        } catch {
            if logsJSON, !wantsJSON {
                // A run that logs JSON ends with JSON lines too, however it ends: a line for each
                // error in a file (where it is), then the error that ends the run.
                let logger = Logger(format: .json) { console.err($0) }
                let code: (String, JSON) = ("code", .string(error.code.rawValue))
                for d in error.diagnostics {
                    logger.log(
                        .error, "\(d.path):\(d.line):\(d.column): \(d.message)",
                        fields: [code, ("file", .string(d.path)), ("line", .int(d.line)), ("column", .int(d.column))])
                }
                let n = error.diagnostics.count
                let message = n == 0 ? error.message : "\(n) error\(n == 1 ? "" : "s")"
                logger.log(.error, "outbox: \(error.code.rawValue): \(message)", fields: [code])
            } else {
                report(error, json: wantsJSON, console: console)
            }
            return error.code.exitStatus
        }
    }

    /// Whether the call asks for JSON: `--json` as an option, not as an argument after `--`.
    static func asksJSON(_ arguments: [String]) -> Bool {
        arguments.prefix { $0 != "--" }.contains("--json")
    }

    /// The longest command path that matches the first words.
    static func match(_ words: [String]) -> (CommandInfo, Int)? {
        var best: (CommandInfo, Int)?
        for command in commands where words.count >= command.path.count && Array(words.prefix(command.path.count)) == command.path {
            if best == nil || command.path.count > best!.1 { best = (command, command.path.count) }
        }
        return best
    }

    /// The list of commands; of one group's (`headers`, `store`) when named.
    static func overview(group: String? = nil) -> String {
        var lines = [
            "outbox \(outboxVersion) — a durable queue of outbound HTTP requests",
            "",
            "Usage: outbox COMMAND [options]   (outbox COMMAND --help for details)",
            "",
            "Commands:",
        ]
        let inGroup = commands.filter { group == nil || $0.path[0] == group }
        let shown = inGroup.isEmpty ? commands : inGroup
        // A group's own page (`outbox headers --help`): its commands, named in full.
        if let group, !inGroup.isEmpty, inGroup.allSatisfy({ $0.path.count > 1 }) {
            lines[2] = "Usage: outbox \(group) COMMAND [options]   (outbox \(group) COMMAND --help for details)"
        }
        let width = shown.map(\.name.count).max() ?? 0
        for command in shown {
            lines.append("  " + command.name + String(repeating: " ", count: width - command.name.count + 2) + command.summary)
        }
        lines += [
            "", "outbox --version prints the version (--version --json as JSON).",
            "Exit codes: 0 ok, 64 usage, 65 invalid input, 66 file missing, 74 storage, 75 running/held, 78 config.",
        ]
        return lines.joined(separator: "\n")
    }

    static let json = OptionSpec(name: "json", valueName: nil, help: "print JSON on stdout")

    static var commands: [CommandInfo] {
        [
            CommandInfo(
                path: ["init"], summary: "scaffold config/, definitions/ and an example hook here", refusedGlobals: ["config"],
                handler: { (i: inout Invocation) throws(OutboxError) in try InitCommand.run(&i) }),
            CommandInfo(
                path: ["check"], summary: "validate the config and every definition",
                options: [json], handler: { (i: inout Invocation) throws(OutboxError) in try CheckCommand.run(&i) }),
            CommandInfo(
                path: ["render"], summary: "print the request enqueue would persist (secrets redacted)",
                positionals: "KEY", minPositionals: 1, maxPositionals: 1,
                options: [
                    EnqueueCommand.varsOption,
                    OptionSpec(name: "id", valueName: "ID", help: "the entry id to render with", completes: .ids),
                    OptionSpec(
                        name: "plugins", valueName: nil, help: "run request_command and headers_command too (they may have side effects)"),
                    json,
                ],
                details: """
                    Writes nothing. Plugins can have side effects (a presigned upload, a token fetched), so
                    render runs request_command and headers_command only with --plugins, and says which it skipped.
                    """,
                completes: .keys,
                handler: { (i: inout Invocation) throws(OutboxError) in try EnqueueCommand.render(&i) }),
            CommandInfo(
                path: ["enqueue"], summary: "persist one entry (or a JSONL file of entries) and print its id",
                positionals: "KEY", minPositionals: 1, maxPositionals: 1, options: EnqueueCommand.options,
                details: EnqueueCommand.details, completes: .keys,
                handler: { (i: inout Invocation) throws(OutboxError) in try EnqueueCommand.run(&i) }),
            CommandInfo(
                path: ["run"], summary: "send queued entries and deliver outcomes to hooks",
                options: RunCommand.options, details: RunCommand.details,
                handler: { (i: inout Invocation) throws(OutboxError) in try RunCommand.run(&i) }),
            CommandInfo(
                path: ["list"], summary: "list entries",
                options: [
                    OptionSpec(name: "key", valueName: "K", help: "only this key", completes: .keys),
                    OptionSpec(name: "id", valueName: "ID", help: "only this id", completes: .ids),
                    OptionSpec(
                        name: "state", valueName: "S",
                        help: "only this state (queued, running, paused, awaiting-auth, completed, error, cancelled)",
                        completes: .words(EntryState.allCases.map(\.rawValue))),
                    json,
                ],
                handler: { (i: inout Invocation) throws(OutboxError) in try ReadCommands.list(&i) }),
            CommandInfo(
                path: ["show"], summary: "one entry in full, with its parts, outcomes and last attempts",
                positionals: "ID", minPositionals: 1, maxPositionals: 1, options: [json], completes: .ids,
                handler: { (i: inout Invocation) throws(OutboxError) in try ReadCommands.show(&i) }),
            CommandInfo(
                path: ["cancel"], summary: "cancel entries and forget them at once (no hook runs; a file moved in goes back)",
                positionals: "ID…", minPositionals: 0, maxPositionals: Int.max,
                options: [
                    OptionSpec(name: "key", valueName: "K", help: "every entry of this key", completes: .keys),
                    OptionSpec(name: "all", valueName: nil, help: "every entry"), json,
                ],
                completes: .ids,
                handler: { (i: inout Invocation) throws(OutboxError) in try ControlCommands.cancel(&i) }),
            CommandInfo(
                path: ["simulate"],
                summary: "run a definition's accept rules, parser and hook on a made-up response (no network, no store)",
                positionals: "KEY", minPositionals: 1, maxPositionals: 1, options: SimulateCommand.options,
                details: SimulateCommand.details, completes: .keys,
                handler: { (i: inout Invocation) throws(OutboxError) in try SimulateCommand.run(&i) }),
            CommandInfo(
                path: ["retry"], summary: "send entries again now: backoff reset, error entries reopened",
                positionals: "ID…", minPositionals: 0, maxPositionals: Int.max,
                options: [
                    OptionSpec(name: "key", valueName: "K", help: "queued, awaiting-auth and error entries of this key", completes: .keys),
                    OptionSpec(name: "errors", valueName: nil, help: "every error entry"), json,
                ],
                details: """
                    Queued and awaiting-auth entries become due now; error entries are reopened as a
                    same-body enqueue would. Running and settled entries, and unknown ids, are left as
                    they are. A running `outbox run` sees the change within 100 ms.
                    """,
                completes: .ids,
                handler: { (i: inout Invocation) throws(OutboxError) in try ControlCommands.retry(&i) }),
            CommandInfo(
                path: ["pause"], summary: "pause the whole queue, or some keys",
                positionals: "[--key K…]", maxPositionals: Int.max,
                options: [
                    OptionSpec(
                        name: "key", valueName: "K", help: "pause this key (repeatable; more keys may follow it)", repeatable: true,
                        completes: .keys)
                ],
                handler: { (i: inout Invocation) throws(OutboxError) in try ControlCommands.pause(&i, paused: true) }),
            CommandInfo(
                path: ["resume"], summary: "resume the whole queue, or some keys",
                positionals: "[--key K…]", maxPositionals: Int.max,
                options: [
                    OptionSpec(
                        name: "key", valueName: "K", help: "resume this key (repeatable; more keys may follow it)", repeatable: true,
                        completes: .keys)
                ],
                handler: { (i: inout Invocation) throws(OutboxError) in try ControlCommands.pause(&i, paused: false) }),
            CommandInfo(
                path: ["headers", "update"], summary: "merge headers into every entry and resume awaiting-auth ones",
                positionals: "'Name: value'…", minPositionals: 1, maxPositionals: Int.max,
                handler: { (i: inout Invocation) throws(OutboxError) in try ControlCommands.headersUpdate(&i) }),
            CommandInfo(
                path: ["store", "copy"], summary: "copy the stopped store into an empty one (SQLite <-> PostgreSQL)",
                options: [
                    OptionSpec(name: "to", valueName: "URL", help: "the target: a postgres:// URL or a store folder"),
                    json,
                ],
                handler: { (i: inout Invocation) throws(OutboxError) in try StoreCopyCommand.run(&i) }),
            CommandInfo(
                path: ["wifi-only"], summary: "hold entries until the device is on Wi-Fi (on|off)",
                positionals: "on|off", minPositionals: 1, maxPositionals: 1, completes: .words(["on", "off"]),
                handler: { (i: inout Invocation) throws(OutboxError) in try ControlCommands.wifiOnly(&i) }),
            CommandInfo(
                path: ["chunk-plan"], summary: "print how a file of SIZE is cut into parts",
                positionals: "SIZE", minPositionals: 1, maxPositionals: 1,
                options: [
                    OptionSpec(name: "min", valueName: "M", help: "smallest part (default 8MiB)", completes: .nothing),
                    OptionSpec(name: "max", valueName: "M", help: "largest part (default 20MiB)", completes: .nothing),
                    OptionSpec(name: "max-parts", valueName: "N", help: "most parts (default 10000)", completes: .nothing), json,
                ],
                handler: { (i: inout Invocation) throws(OutboxError) in try ReadCommands.chunkPlan(&i) }),
            CommandInfo(
                path: ["stats"], summary: "counts by state and pending outcomes",
                options: [
                    json, OptionSpec(name: "prometheus", valueName: nil, help: "Prometheus text format"),
                    OptionSpec(
                        name: "output", valueName: "FILE",
                        help: "with --prometheus: write FILE atomically (node_exporter's textfile collector)"),
                ],
                handler: { (i: inout Invocation) throws(OutboxError) in try ReadCommands.stats(&i) }),
            CommandInfo(
                path: ["explain"], summary: "why an entry is not running right now",
                positionals: "ID", minPositionals: 1, maxPositionals: 1, options: [json], completes: .ids,
                handler: { (i: inout Invocation) throws(OutboxError) in try ReadCommands.explain(&i) }),
            CommandInfo(
                path: ["audit"], summary: "check the store's invariants",
                options: [
                    json,
                    OptionSpec(
                        name: "fix", valueName: nil,
                        help:
                            "first remove staged bodies no entry owns (left by a killed process), when no enqueue is staging, and make the store's files 0600 and folders 0700 again"
                    ),
                ],
                handler: { (i: inout Invocation) throws(OutboxError) in try ReadCommands.audit(&i) }),
            CommandInfo(
                path: ["completion"], summary: "print a shell completion script (bash|zsh|fish)",
                positionals: "bash|zsh|fish", minPositionals: 0, maxPositionals: 1, options: [CompletionCommand.listOption],
                details:
                    "--json goes with --list (a JSON array of the words); a script is no JSON, so `completion bash --json` is refused (64).",
                completes: .words(CompletionCommand.shells),
                forms: ["completion bash|zsh|fish", "completion --list keys|ids"],
                handler: { (i: inout Invocation) throws(OutboxError) in try CompletionCommand.run(&i) }),
            CommandInfo(
                path: ["man"], summary: "print the manual page outbox(1) as roff (man -l <(outbox man))", refusedGlobals: ["json"],
                handler: { (i: inout Invocation) throws(OutboxError) in try ManualPage.run(&i) }),
            CommandInfo(
                path: ["schema"], summary: "print the JSON Schema of the config or of a definition (for editors), or the reference page",
                positionals: "config|definition|reference", minPositionals: 1, maxPositionals: 1,
                details:
                    "The schemas are JSON with or without --json; the reference page is Markdown, so `schema reference --json` is refused (64).",
                completes: .words(["config", "definition", "reference"]),
                handler: { (i: inout Invocation) throws(OutboxError) in try ReadCommands.schema(&i) }),
        ]
    }
}

/// The process's working directory (for `main`); nil when it was removed.
package func currentDirectory() -> String? { Paths.currentDirectory() }
