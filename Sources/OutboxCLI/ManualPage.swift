import OutboxModel

/// `outbox man`: the manual page outbox(1) in roff, from the same command table as `--help`
/// and the completions, so the three cannot disagree.
enum ManualPage {
    static func run(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        if i.json { throw .usage("`outbox man` prints a manual page (roff), not JSON: leave out --json") }
        i.console.write(page())
        return 0
    }

    static let description = [
        """
        outbox is a durable, declarative queue of outbound HTTP requests. Each kind of request is \
        described once in a YAML definition; outbox enqueue renders it with the entry's vars and makes \
        the entry and its body durable on disk before it prints the id; outbox run sends entries with \
        libcurl, retries them by class, and hands every outcome to a shell hook, which acknowledges it by \
        exiting 0. Nothing is lost across crashes, and a request the server already accepted is not sent again.
        """,
        """
        A project is a folder with config/outbox.yaml (it may be empty: every field has a default), \
        definitions/*.yaml, the hook scripts, and the store .outbox/. Commands find the config in the \
        current folder or above it, or take --config. Every command has --help; with --json a command \
        prints exactly one JSON document on stdout, and human text and logs go to stderr.
        """,
    ]

    /// What each error code means, for EXIT STATUS (a new code cannot be left out).
    static func meaning(_ code: ErrorCode) -> String {
        switch code {
        case .usage: return "a usage error: unknown command or option, a missing or extra argument, an option given twice"
        case .invalid: return "invalid input: vars, an id, an unknown key, a template or URL that does not render or pass"
        case .fileMissing: return "a file that was named does not exist (a body file, --vars @FILE, --from, --config)"
        case .storage: return "the store cannot be created, read or written; libcurl cannot be loaded; audit found a problem"
        case .running: return "another runner holds the store, or an entry with a different body is running"
        case .config: return "the config or a definition has errors, or no config was found"
        }
    }

    /// The page, ending in a newline.
    static func page() -> String {
        var out = [
            ".\\\" outbox(1), printed by `outbox man` from the command table",
            ".TH OUTBOX 1 \"\" \"outbox \(escape(outboxVersion))\" \"User Commands\"",
            // Not hyphenated: names and options must read as typed.
            ".nh",
            ".SH NAME", "outbox \\- a durable queue of outbound HTTP requests",
            ".SH SYNOPSIS",
            ".B outbox", ".RB [ \\-\\-config", ".IR FILE ]", ".RB [ \\-\\-json ]", ".I COMMAND", ".RI [ arguments ]",
            ".RI [ options ]", ".br", ".B outbox \\-\\-help", "|", ".B \\-\\-version",
            ".SH DESCRIPTION",
        ]
        out += description.flatMap { [escape($0), ".PP"] }.dropLast()
        out.append(".SH COMMANDS")
        for command in CLI.commands {
            out.append(".SS " + argument(command.name))
            let options = command.options.filter { !$0.hidden }
            if command.forms.isEmpty {
                out.append(".B outbox " + escape(command.name))
                if !command.positionals.isEmpty { out.append(".I " + argument(command.positionals)) }
                if !options.isEmpty { out.append(".RI [ options ]") }
            } else {
                for (n, form) in command.forms.enumerated() { out += (n > 0 ? [".br"] : []) + [".B outbox " + escape(form)] }
            }
            out += [".PP", escape(command.summary) + "."]
            if !command.details.isEmpty {
                out.append(".PP")
                out += command.details.split(separator: "\n").map { escape($0.drop { $0 == " " }) }
            }
            for option in options { out += optionItem(option) }
        }
        out.append(".SH GLOBAL OPTIONS")
        out.append("These work before the command or after it.")
        for option in CLI.globalOptions where !option.hidden { out += optionItem(option) }
        out += [".TP", ".B \\-\\-version", "print the version and exit."]
        out += [
            ".SH EXIT STATUS",
            ".TP", ".B 0", "success; outbox run without \\-\\-drain exits 0 when it stops.",
            ".TP", ".B 1\\(en7",
            escape(
                "outbox run --drain only: the sum of 1 (an entry settled error in the run), 2 (an entry parked "
                    + "awaiting-auth in the run, or entries left so at its end) and 4 (a hook delivery failed in the run)."),
        ]
        for code in ErrorCode.allCases {
            out += [".TP", ".B \(code.exitStatus)", "\(escape(code.rawValue)): \(escape(meaning(code)))."]
        }
        out += [
            ".PP",
            escape("An error prints \"outbox: E_CODE: message\" on stderr; with --json, {\"error\": {\"code\", \"message\"}} on stdout."),
        ]
        out.append(".SH ENVIRONMENT")
        out += [".TP", ".B OUTBOX_CONFIG", escape("the config file, when --config is not given.")]
        for (variable, field) in Config.environmentOverrides {
            let bounds = ConfigFields.top[field].type.integerRange.map { " (\($0.lowerBound)-\($0.upperBound))" } ?? ""
            out += [".TP", ".B " + escape(variable), escape("overrides the config's \(field)\(bounds), for a service manager.")]
        }
        out += [
            ".TP", ".BR NOTIFY_SOCKET \" and \" WATCHDOG_USEC",
            escape("under systemd (Type=notify), outbox run reports READY=1, STOPPING=1 and watchdog pings."),
            ".PP",
            escape(
                "A hook runs in the project root with OUTBOX_ID, OUTBOX_KEY, OUTBOX_OUTCOME, OUTBOX_DELIVERIES and "
                    + "OUTBOX_GENERATION added to the runner's environment, and the outcome as JSON on stdin."),
            ".SH FILES",
            ".TP", ".I config/outbox.yaml", escape("the project's config, looked for in the current folder and upward."),
            ".TP", ".I definitions/*.yaml", escape("one definition per file: the request, its retries, its hooks."),
            ".TP", ".I .outbox/", escape("the store: outbox.db (SQLite, WAL) and staged bodies; 0700, files 0600."),
            ".SH SEE ALSO",
            ".BR curl (1),", ".BR sqlite3 (1),", ".BR systemd.service (5),", ".BR crontab (5)",
        ]
        return out.joined(separator: "\n") + "\n"
    }

    /// One option as a tagged paragraph: the flag in bold, its value's name in italics.
    static func optionItem(_ option: OptionSpec) -> [String] {
        let flag = "\\-\\-" + escape(option.name)
        // `.BI` alternates bold and italics: the flag, then " VALUE" as one quoted argument.
        let label = option.valueName.map { ".BI \(flag) \" \(escape($0).replacing("\"", with: "\\(dq"))\"" } ?? ".B \(flag)"
        return [".TP", label, escape(option.help) + "."]
    }

    /// Text for a roff line: backslashes and hyphens escaped (a hyphen in an option must stay
    /// the ASCII one when copied), other characters than ASCII as `\[uXXXX]`, and a leading
    /// `.` or `'` guarded so it is not read as a request.
    static func escape(_ text: some StringProtocol) -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\\": out += "\\e"
            case "-": out += "\\-"
            case _ where scalar.value > 0x7E || scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16, uppercase: true)
                out += "\\[u" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex + "]"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out.hasPrefix(".") || out.hasPrefix("'") ? "\\&" + out : out
    }

    /// A macro argument: escaped and in double quotes (a quote inside is `\(dq`).
    static func argument(_ text: some StringProtocol) -> String {
        "\"" + escape(text).replacing("\"", with: "\\(dq") + "\""
    }
}
