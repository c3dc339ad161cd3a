/// The commands section of the reference page (`outbox schema reference`), from the same
/// command table as `--help`, the manual and the completion scripts.
enum CommandReference {
    static func markdown() -> String {
        var out = [
            "## Commands",
            "",
            "Each command's `--help` says the same. The global options (`--config FILE`, `--json`, `--help`) go before or after the command; `outbox --version` (`--version --json`) prints the version.",
        ]
        for command in CLI.commands {
            out += ["", "### `outbox \(command.name)`", ""]
            let forms =
                command.forms.isEmpty ? [command.name + (command.positionals.isEmpty ? "" : " " + command.positionals)] : command.forms
            out.append(forms.map { "`outbox \(cell($0))`" }.joined(separator: " · ") + ": " + command.summary + ".")
            if !command.details.isEmpty {
                out += ["", command.details.split(separator: "\n").map { String($0.drop { $0 == " " }) }.joined(separator: " ")]
            }
            let options = command.visibleOptions
            guard !options.isEmpty else { continue }
            out += ["", "| option | meaning |", "|---|---|"]
            for option in options { out.append("| `\(cell(command.optionLabel(option)))` | \(cell(option.help)) |") }
        }
        return out.joined(separator: "\n")
    }

    /// Text for a table cell: a `|` would end it.
    private static func cell(_ text: String) -> String { text.replacing("|", with: "\\|") }
}
