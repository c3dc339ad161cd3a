import OutboxModel

/// What a shell completes for a value: the project's definition keys, its entry ids, fixed
/// words, or (`files`) whatever the shell offers by default.
enum ValueCompletion: Equatable {
    case files
    case keys
    case ids
    case words([String])
    /// Nothing to offer (a command that takes no argument, a size, a header line).
    case nothing
}

/// A flag or option a command accepts.
struct OptionSpec {
    var name: String
    /// nil for a flag without a value.
    var valueName: String?
    var help: String
    var repeatable = false
    /// What the shell completes for its value.
    var completes: ValueCompletion = .files
    /// Left out of help, the manual and completion (for the completion scripts' own calls).
    var hidden = false
}

/// One command of the tree: drives both parsing and `--help`.
struct CommandInfo {
    var path: [String]
    var summary: String
    var positionals: String = ""
    var minPositionals = 0
    var maxPositionals = 0
    var options: [OptionSpec] = []
    var details: String = ""
    /// What the shell completes for the positionals.
    var completes: ValueCompletion = .nothing
    /// The forms of the call, when one line of positionals and `[options]` would show one that
    /// is refused (after `outbox`).
    var forms: [String] = []
    /// Global options this command refuses (`init` makes its project here, `man` prints roff):
    /// help, completion and the manual do not offer them.
    var refusedGlobals: Set<String> = []
    var handler: @Sendable (inout Invocation) throws(OutboxError) -> Int32

    var name: String { path.joined(separator: " ") }

    func help() -> String {
        let usage =
            forms.isEmpty
            ? ["outbox \(name)\(positionals.isEmpty ? "" : " " + positionals)\(options.allSatisfy(\.hidden) ? "" : " [options]")"]
            : forms.map { "outbox " + $0 }
        var lines = ["outbox \(name) — \(summary)", "", "Usage: " + usage[0]] + usage.dropFirst().map { "       " + $0 }
        if !details.isEmpty { lines += ["", details] }
        let all = visibleOptions
        lines += ["", "Options:"]
        let width = all.map { optionLabel($0).count }.max() ?? 0
        for option in all {
            let label = optionLabel(option)
            lines.append("  " + label + String(repeating: " ", count: width - label.count + 2) + option.help)
        }
        return lines.joined(separator: "\n")
    }

    /// What help, completion and the manual offer: the command's options, then the global
    /// ones it has no option of its own for (`--json` of the reading commands), none hidden.
    var visibleOptions: [OptionSpec] {
        let own = Set(options.map(\.name)).union(refusedGlobals)
        return (options + CLI.globalOptions.filter { !own.contains($0.name) }).filter { !$0.hidden }
    }

    func optionLabel(_ o: OptionSpec) -> String {
        "--\(o.name)" + (o.valueName.map { " \($0)" } ?? "")
    }
}

/// The parsed words of one call.
struct ParsedArguments {
    var options: [String: [String]] = [:]
    var positionals: [String] = []

    func value(_ name: String) -> String? { options[name]?.last }
    func values(_ name: String) -> [String] { options[name] ?? [] }
    func flag(_ name: String) -> Bool { options[name] != nil }
}

enum ArgumentParser {
    /// A word as an error message names it: cut short when long (one argument may be 128 KiB).
    static func shortened(_ word: String) -> String {
        word.count > 60 ? word.prefix(60) + "…" : word
    }

    /// Parses `--name value`, `--name=value`, flags and `--` against a command's options.
    static func parse(_ words: [String], command: CommandInfo) throws(OutboxError) -> ParsedArguments {
        var parsed = ParsedArguments()
        let specs = command.options + CLI.globalOptions
        var i = 0
        var onlyPositionals = false
        while i < words.count {
            var word = words[i]
            i += 1
            if onlyPositionals || !word.hasPrefix("-") || word == "-" {
                parsed.positionals.append(word)
                continue
            }
            if word == "--" { onlyPositionals = true; continue }
            // `-v` is `--verbose`, given twice as well as mixed with it.
            if word == "-v", specs.contains(where: { $0.name == "verbose" }) { word = "--verbose" }
            guard word.hasPrefix("--") else {
                if word == "-h" { parsed.options["help", default: []].append(""); continue }
                throw .usage("unknown option \(Self.shortened(word)) for `outbox \(command.name)` (see outbox \(command.name) --help)")
            }
            var name = String(word.dropFirst(2))
            var inlineValue: String?
            if let eq = name.firstIndex(of: "=") {
                inlineValue = String(name[name.index(after: eq)...])
                name = String(name[..<eq])
            }
            guard let spec = specs.first(where: { $0.name == name }) else {
                throw .usage("unknown option --\(Self.shortened(name)) for `outbox \(command.name)` (see outbox \(command.name) --help)")
            }
            if spec.valueName == nil {
                if inlineValue != nil { throw .usage("--\(name) takes no value") }
                if !spec.repeatable, name != "help", parsed.options[name] != nil {
                    throw .usage("--\(name) is given twice")
                }
                parsed.options[name, default: []].append("")
                continue
            }
            let value: String
            if let inlineValue {
                value = inlineValue
            } else {
                guard i < words.count else { throw .usage("--\(name) needs a value (\(spec.valueName!))") }
                // `--id --json` is a forgotten value, not an id: a value that looks so is given inline.
                let next = words[i]
                if next.hasPrefix("--"),
                    specs.contains(where: { "--" + $0.name == next.split(separator: "=", maxSplits: 1).first.map(String.init) })
                {
                    throw .usage(
                        "--\(name) needs a value (\(spec.valueName!)), not the option \(next.prefix(40)) (to mean it, write --\(name)=VALUE)"
                    )
                }
                value = next
                i += 1
            }
            if !spec.repeatable, parsed.options[name] != nil {
                throw .usage("--\(name) is given twice")
            }
            // An empty name would be taken for the folder it is resolved in (`--from-dir "$UNSET"`
            // would enqueue, or move in, every file of the current folder).
            if value.isEmpty, let what = Self.pathValues[spec.valueName!] { throw .usage("--\(name) needs \(what)") }
            parsed.options[name, default: []].append(value)
        }
        if parsed.flag("help") { return parsed }
        if parsed.positionals.count < command.minPositionals {
            throw .usage("`outbox \(command.name)` needs \(command.positionals) (see outbox \(command.name) --help)")
        }
        if parsed.positionals.count > command.maxPositionals {
            let extra = parsed.positionals[command.maxPositionals]
            throw .usage("unexpected argument \(Units.quoted(extra, limit: 60)) for `outbox \(command.name)`")
        }
        return parsed
    }

    /// Values that name a file or folder, by how the option's help spells them.
    static let pathValues = ["FILE": "a file name", "FILE.jsonl": "a file name", "F": "a file name", "DIR": "a folder name"]
}
