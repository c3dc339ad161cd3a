/// The zsh and fish scripts of `outbox completion` (bash's is beside the command).
extension CompletionTable {
    func zsh() -> String {
        func clause(_ patterns: [String], _ action: String) -> [String] {
            patterns.isEmpty ? [] : ["    (" + patterns.map { "\"\($0)\"" }.joined(separator: "|") + ") " + action + " ;;"]
        }
        func words(_ list: [String]) -> String { "compadd -- \(list.joined(separator: " "))" }
        let keys = "_outbox_values keys", ids = "_outbox_values ids", files = "_files"
        let optionCases = commands.flatMap { c in clause([c.name], words(options(c).map { "--" + $0.name })) }
        var valueCases = clause(valuedOptions { $0 == .keys }, keys) + clause(valuedOptions { $0 == .ids }, ids)
        for choice in wordChoices() { valueCases += clause(choice.patterns, words(choice.words)) }
        valueCases += clause(valuedOptions { $0 == .files }, files) + clause(valuedOptions { $0 == .nothing }, "return 1")
        var positionalCases = clause(positionalCommands(.keys), keys) + clause(positionalCommands(.ids), ids)
        for command in commands where command.maxPositionals > 0 {
            if case let .words(list) = command.completes { positionalCases += clause([command.name], words(list)) }
        }
        positionalCases += clause(positionalCommands(.files), files)
        return """
            #compdef outbox
            # zsh completion for outbox: commands, options, and the keys and ids of the project here
            _outbox_values() {
              # the binary being completed answers; it prints nothing outside a project
              local -a values
              values=(${(f)"$("$bin" completion --list "$1" "${config[@]}" 2>/dev/null)"})
              compadd -a values
            }
            _outbox() {
              local cur=${words[CURRENT]} prev=${words[CURRENT-1]} cmd="" word i
              local bin=${~words[1]}
              local -a config
              (( $+commands[$bin] )) || [[ -x $bin ]] || bin=outbox
              for (( i = 2; i < CURRENT; i++ )); do
                word=${words[i]}
                case $word in
                  (--config) (( i++ )); (( i < CURRENT )) && config=(--config "${words[i]}") ;;
                  (--config=*) config=("$word") ;;
                  (-*) ;;
                  (*)
                    if [[ -z $cmd ]]; then
                      cmd=$word
                    else
                      case $cmd in
            \(clause(groups.map(\.0), "cmd=\"$cmd $word\"").map { "          " + $0 }.joined(separator: "\n"))
                      esac
                    fi ;;
                esac
              done
              # --name=value: complete the value after the sign
              if [[ $cur == --*=* ]]; then
                prev=${cur%%=*}
                compset -P '*='
              fi
              if [[ -z $cmd ]]; then
                if [[ $prev == --config ]]; then
                  _files
                elif [[ $cur == -* ]]; then
                  compadd -- \(topOptions.joined(separator: " "))
                else
                  compadd -- \(firstWords.joined(separator: " "))
                fi
                return
              fi
              case $cmd in
            \(groups.flatMap { clause([$0.0], words($0.1) + "; return") }.joined(separator: "\n"))
              esac
              case "$cmd $prev" in
            \(valueCases.joined(separator: "\n"))
                (*)
                  if [[ $cur == -* ]]; then
                    case $cmd in
            \(optionCases.map { "    " + $0 }.joined(separator: "\n"))
                    esac
                    return
                  fi
                  case $cmd in
            \(positionalCases.map { "    " + $0 }.joined(separator: "\n"))
                  esac ;;
              esac
            }
            # autoloaded from $fpath (the file is the function's body), or sourced
            if [[ $funcstack[1] == _outbox ]]; then
              _outbox "$@"
            else
              compdef _outbox outbox
            fi
            """
    }

    func fish() -> String {
        var lines = [
            "# fish completion for outbox: commands, options, and the keys and ids of the project here",
            "complete -c outbox -f",
            "function __outbox_command --description 'the outbox command on the line so far'",
            "    set -l tokens (commandline -opc)",
            "    set -e tokens[1]",
            "    set -l cmd ''",
            "    set -l skip 0",
            "    for token in $tokens",
            "        if test \"$skip\" = 1",
            "            set skip 0",
            "        else if test \"$token\" = --config",
            "            set skip 1",
            "        else if string match -q -- '-*' $token",
            "        else if test -z \"$cmd\"",
            "            set cmd $token",
            "        else if contains -- $cmd \(groups.map(\.0).joined(separator: " "))",
            "            set cmd \"$cmd $token\"",
            "        end",
            "    end",
            "    echo $cmd",
            "end",
            "function __outbox_is --description 'the command on the line is $argv[1]'",
            "    set -l cmd (__outbox_command)",
            "    test \"$cmd\" = \"$argv[1]\"",
            "end",
            "function __outbox_list --description 'keys or ids of the project here, from the binary being completed'",
            "    set -l tokens (commandline -opc)",
            "    set -l bin $tokens[1]",
            "    command -q $bin; or set bin outbox",
            "    set -l config",
            "    for n in (seq (count $tokens))",
            "        if test \"$tokens[$n]\" = --config; and test $n -lt (count $tokens)",
            "            set config --config $tokens[(math $n + 1)]",
            "        else if string match -q -- '--config=*' $tokens[$n]",
            "            set config $tokens[$n]",
            "        end",
            "    end",
            "    $bin completion --list $argv[1] $config 2>/dev/null",
            "end",
        ]
        func quoted(_ text: String) -> String {
            "'" + text.replacing("\\", with: "\\\\").replacing("'", with: "\\'") + "'"
        }
        func argument(_ kind: ValueCompletion) -> String {
            switch kind {
            case .keys: return " -a '(__outbox_list keys)'"
            case .ids: return " -a '(__outbox_list ids)'"
            case let .words(words): return " -a " + quoted(words.joined(separator: " "))
            case .files, .nothing: return ""
            }
        }
        let top = "-n '__outbox_is \"\"'"
        for first in firstWords {
            let summary = commands.first { $0.path[0] == first && $0.path.count == 1 }?.summary ?? "\(first) commands"
            lines.append("complete -c outbox \(top) -a \(first) -d \(quoted(summary))")
        }
        for option in CLI.globalOptions where !option.hidden {
            lines.append("complete -c outbox \(top) -l \(option.name)\(option.valueName == nil ? "" : " -r -F") -d \(quoted(option.help))")
        }
        lines.append("complete -c outbox \(top) -l version -d 'print the version'")
        for (first, seconds) in groups {
            for second in seconds {
                let summary = commands.first { $0.path == [first, second] }?.summary ?? ""
                lines.append("complete -c outbox -n '__outbox_is \(first)' -a \(second) -d \(quoted(summary))")
            }
        }
        for command in commands {
            let when = "-n " + quoted("__outbox_is \"\(command.name)\"")
            if command.maxPositionals > 0 {
                let files = command.completes == .files ? " -F" : ""
                if command.completes != .nothing { lines.append("complete -c outbox \(when)\(files)\(argument(command.completes))") }
            }
            for option in options(command) {
                var line = "complete -c outbox \(when) -l \(option.name)"
                if option.valueName != nil { line += option.completes == .files ? " -r -F" : " -x" + argument(option.completes) }
                lines.append(line + " -d " + quoted(option.help))
            }
        }
        return lines.joined(separator: "\n")
    }
}
