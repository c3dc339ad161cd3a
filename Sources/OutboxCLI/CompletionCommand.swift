import OutboxModel
import OutboxStore

/// `outbox completion bash|zsh|fish`: completion scripts generated from the command table, so
/// a new command or option completes without touching them. Definition keys and entry ids
/// come from the binary at completion time (`outbox completion --list keys|ids`).
enum CompletionCommand {
    static let shells = ["bash", "zsh", "fish"]
    /// The scripts' way back into the binary (also a quick list for people).
    static let listOption = OptionSpec(
        name: "list", valueName: "keys|ids", help: "print the project's definition keys or recent entry ids, one a line",
        completes: .words(["keys", "ids"]))
    /// Enough ids to find a recent one by its first letters, few enough to answer at once.
    static let idLimit = 1000

    static func run(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        if let what = i.args.value("list") {
            guard what == "keys" || what == "ids" else { throw .usage("--list takes keys or ids, not \(Units.quoted(what, limit: 40))") }
            guard i.args.positionals.isEmpty else { throw .usage("--list takes no shell name") }
            let found = values(what == "keys" ? .keys : .ids, i)
            if i.json {
                i.console.out(JSON.array(found.map { .string($0) }).serialized())
            } else {
                for value in found { i.console.out(value) }
            }
            return 0
        }
        guard let shell = i.args.positionals.first else { throw .usage("`outbox completion` needs bash, zsh or fish") }
        guard ["bash", "zsh", "fish"].contains(shell) else {
            throw .usage("completion takes bash, zsh or fish, not \(Units.quoted(shell, limit: 40))")
        }
        if i.json { throw .usage("`outbox completion \(shell)` prints a shell script, not JSON: leave out --json") }
        let table = CompletionTable()
        switch shell {
        case "bash": i.console.out(table.bash())
        case "zsh": i.console.out(table.zsh())
        case "fish": i.console.out(table.fish())
        default: throw .usage("completion takes bash, zsh or fish, not \(Units.quoted(shell, limit: 40))")
        }
        return 0
    }

    /// The project's keys or ids; empty (never an error) without a project or a store, since
    /// a completion must not print into the user's prompt.
    static func values(_ kind: ValueCompletion, _ i: Invocation) -> [String] {
        guard let project = try? i.project() else { return [] }
        switch kind {
        case .keys:
            let set = project.definitions
            // A key whose file has errors is still the project's (to simulate or fix it).
            return Set(set.definitions.keys).union(set.brokenKeys.keys).sorted()
        case .ids:
            return (try? SQLiteStore.recentIDs(folder: project.config.store, limit: idLimit)) ?? []
        case .files, .words, .nothing:
            return []
        }
    }
}

/// The command table as the scripts see it: visible commands and options only.
struct CompletionTable {
    let commands = CLI.commands
    /// Options offered before any command.
    let topOptions = CLI.globalOptions.filter { !$0.hidden }.map { "--" + $0.name } + ["--version"]

    /// First words of the commands, sorted, each once ("headers" for `headers update`).
    var firstWords: [String] { Set(commands.map { $0.path[0] }).sorted() }
    /// Words that start a command of two words, with the words that may follow.
    var groups: [(String, [String])] {
        firstWords.compactMap { first in
            let seconds = commands.filter { $0.path.count > 1 && $0.path[0] == first }.map { $0.path[1] }
            return seconds.isEmpty ? nil : (first, seconds)
        }
    }

    func options(_ command: CommandInfo) -> [OptionSpec] { command.visibleOptions }

    /// "command --option" for every option taking a value, by what completes it.
    func valuedOptions(where wanted: (ValueCompletion) -> Bool) -> [String] {
        commands.flatMap { command in
            options(command).filter { $0.valueName != nil && wanted($0.completes) }.map { "\(command.name) --\($0.name)" }
        }
    }

    /// Fixed words offered for an option value or a positional, grouped by their word list.
    func wordChoices() -> [(words: [String], patterns: [String])] {
        var out: [(words: [String], patterns: [String])] = []
        func add(_ words: [String], _ pattern: String) {
            if let n = out.firstIndex(where: { $0.words == words }) {
                out[n].patterns.append(pattern)
            } else {
                out.append((words, [pattern]))
            }
        }
        for command in commands {
            for option in options(command) where option.valueName != nil {
                if case let .words(words) = option.completes { add(words, "\(command.name) --\(option.name)") }
            }
        }
        return out
    }

    func positionalCommands(_ kind: ValueCompletion) -> [String] {
        commands.filter { $0.maxPositionals > 0 && $0.completes == kind }.map(\.name)
    }

    // MARK: bash

    func bash() -> String {
        /// One clause of a `case`, or nothing when no pattern needs it (an empty one would not parse).
        func clause(_ patterns: [String], _ action: String) -> [String] {
            patterns.isEmpty ? [] : ["    " + patterns.map { "\"\($0)\"" }.joined(separator: "|") + ") " + action + " ;;"]
        }
        func words(_ list: [String]) -> String { "COMPREPLY=($(compgen -W \"\(list.joined(separator: " "))\" -- \"$cur\"))" }
        let keys = "_outbox_reply \"$cur\" < <(_outbox_list keys)", ids = "_outbox_reply \"$cur\" < <(_outbox_list ids)"
        let files = "COMPREPLY=($(compgen -f -- \"$cur\"))"
        let optionCases = commands.flatMap { c in clause([c.name], "opts=\"\(options(c).map { "--" + $0.name }.joined(separator: " "))\"") }
        var valueCases = clause(valuedOptions { $0 == .keys }, keys) + clause(valuedOptions { $0 == .ids }, ids)
        for choice in wordChoices() { valueCases += clause(choice.patterns, words(choice.words)) }
        valueCases += clause(valuedOptions { $0 == .files }, files) + clause(valuedOptions { $0 == .nothing }, "")
        var positionalCases = clause(positionalCommands(.keys), keys) + clause(positionalCommands(.ids), ids)
        for command in commands where command.maxPositionals > 0 {
            if case let .words(list) = command.completes { positionalCases += clause([command.name], words(list)) }
        }
        positionalCases += clause(positionalCommands(.files), files)
        let groupCases = groups.flatMap { clause([$0.0], words($0.1) + "; return") }
        return """
            # bash completion for outbox: commands, options, and the keys and ids of the project here
            _outbox_list() {
              # the binary being completed answers; it prints nothing outside a project
              "$bin" completion --list "$1" "${config[@]}" 2>/dev/null
            }
            _outbox_reply() {
              # the lines on stdin that start with $1, read as data (keys may hold any character);
              # readline replaces only what follows the word's last :, so that much is left out
              local line trim=""
              [[ $1 == *:* && $COMP_WORDBREAKS == *:* ]] && trim=${1%:*}:
              while IFS= read -r line; do [[ $line == "$1"* ]] && COMPREPLY+=("${line#"$trim"}"); done
            }
            _outbox() {
              local cur prev="" cmd="" word i cword opts=""
              local -a words=() config=()
              # bash splits a word at each : (ids may hold one): glue the pieces back together
              for ((i = 0; i <= COMP_CWORD; i++)); do
                word=${COMP_WORDS[i]}
                if ((i > 0)) && [[ $word == ":" || ${COMP_WORDS[i-1]} == ":" ]]; then
                  words[${#words[@]}-1]+=$word
                else
                  words+=("$word")
                fi
              done
              cword=$((${#words[@]} - 1))
              cur=${words[cword]}
              local bin=${words[0]}
              COMPREPLY=()
              ((cword > 0)) && prev=${words[cword-1]}
              # --name=value arrives as three words: --name, =, value
              if [[ $cur == "=" ]]; then
                cur=""
              elif [[ $prev == "=" ]] && ((cword > 1)); then
                prev=${words[cword-2]}
              fi
              [[ $bin == "~/"* ]] && bin=$HOME/${bin#"~/"}
              command -v -- "$bin" >/dev/null 2>&1 || bin=outbox
              for ((i = 1; i < cword; i++)); do
                word=${words[i]}
                case $word in
                  --config)
                    [[ ${words[i+1]} == "=" ]] && ((i++))
                    ((i++))
                    ((i < cword)) && config=(--config "${words[i]}") ;;
                  -*|=) ;;
                  *)
                    if [[ -z $cmd ]]; then
                      cmd=$word
                    else
                      case $cmd in
            \(clause(groups.map(\.0), "cmd=\"$cmd $word\"").map { "          " + $0 }.joined(separator: "\n"))
                      esac
                    fi ;;
                esac
              done
              if [[ -z $cmd ]]; then
                if [[ $prev == --config ]]; then
                  COMPREPLY=($(compgen -f -- "$cur"))
                elif [[ $cur == -* ]]; then
                  COMPREPLY=($(compgen -W "\(topOptions.joined(separator: " "))" -- "$cur"))
                else
                  COMPREPLY=($(compgen -W "\(firstWords.joined(separator: " "))" -- "$cur"))
                fi
                return
              fi
              case $cmd in
            \(groupCases.joined(separator: "\n"))
              esac
              case "$cmd $prev" in
            \(valueCases.joined(separator: "\n"))
                *)
                  if [[ $cur == -* ]]; then
                    case $cmd in
            \(optionCases.map { "    " + $0 }.joined(separator: "\n"))
                    esac
                    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
                    return
                  fi
                  case $cmd in
            \(positionalCases.map { "    " + $0 }.joined(separator: "\n"))
                  esac ;;
              esac
            }
            complete -F _outbox outbox
            """
    }
}
