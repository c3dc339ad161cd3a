/// The sections of the generated reference that explain rules rather than list a table's
/// rows; each still takes its names from the code where the code has a table.
enum ReferenceSections {
    static func templates(_ page: inout Page) {
        page.add(
            """
            ## Templates

            Strings in definitions (and the config's `headers` and `account`, and `enqueue
            --id-template`) may hold `{{ path | filter | ... }}` tags, rendered once at enqueue (a
            follow-up: when its parent's outcome is journaled) and stored with the entry. A path is
            dot-separated names of letters, digits, `_` and `-`; a number indexes a list
            (`vars.items.0.id`). A path that does not resolve is `E_INVALID` naming where it stopped;
            nothing is silently empty.

            ### Roots
            """)
        var roots = TemplateVocabulary.roots.map { ["`\($0.name)`", $0.holds, $0.where_] }
        roots.append([
            "`loop`, and the loop variable", "`loop.index` (0-based), `loop.number` (1-based) and the element of a `{{ for }}` block",
            "inside that block (`request.text` only)",
        ])
        page.table(["root", "what it holds", "where"], roots)
        page.add(
            "`outbox check` refuses any other root.\n\n### Filters\n\nFilters apply left to right: `{{ vars.note | default(\"\") | xml }}`."
        )
        page.table(["filter", "effect"], TemplateVocabulary.filters.map { ["`\($0.usage)`", $0.effect] })
        page.add(
            """
            ### Whole values keep their type

            A string that is exactly one tag, with nothing around it, takes the value whole, with its
            JSON type (a number stays a number, a list a list), unless a `json` or `xml` filter makes
            it text. The result is then checked like a literal: a `url` must be a string,
            `follow_redirects` a whole number, `wifi_only` a boolean (`E_INVALID` otherwise). Inside a
            longer string a value becomes text: strings as they are, numbers as written, booleans as
            `true`/`false`; `null`, lists and objects are refused there (use `| default("...")` or
            `| json`). Substituted values are never rendered again: `{{` inside a var stays literal.

            ### How each field renders
            """)
        let modes: [TemplateMode] = [.url, .header, .text, .value]
        page.table(["mode", "fields", "rule"], modes.map { [$0.name, $0.fields, $0.rule] })
        page.add(
            """
            ### URLs

            In `request.url` and a parts plan's `url`, a tag inside a longer URL is percent-encoded:
            every byte but the unreserved characters `A-Z a-z 0-9 - . _ ~` becomes `%XX`, and a value
            made only of dots is encoded whole (`%2E%2E%2E`; exactly `.` or `..` gives `%2E` or
            `%2E%2E`, also as a path segment of its own). In the path, every other way a tag makes a
            segment `.` or `..` is `E_INVALID`: beside a dot of the template or another tag, with
            `| raw` and `| path`, and in a whole URL from one tag (a segment also ends at `%2F` and
            `%5C` here), since servers decode `%2E%2E` and `%2F` before they resolve dots. A tag in
            the scheme or host is `E_INVALID` unless it uses
            `| raw`. The rendered URL must be absolute `http://` or `https://` with a host and a port
            of 1–65535; spaces, control and non-ASCII characters are refused, and a `%` must start a
            `%XX` escape. The URL is sent exactly as rendered, never re-encoded or normalized.
            """)
    }

    static func scopes(_ page: inout Page) {
        page.add(
            """
            ## Scopes and cancel-scope

            Entries whose rendered `scope` is equal run one at a time, in enqueue order: an entry waits
            while an older entry of its scope is `queued`, `running` or `awaiting-auth`. An entry that
            settles `error` does not hold its scope.

            With `on_rejected: cancel-scope`, an entry that settles `error` also cancels, in the same
            transaction, every entry of its scope enqueued after it that is `queued` or
            `awaiting-auth`. Each settles `cancelled` (reason `scope`) and its own `on_error` hook gets
            an `error` outcome of kind `cancelled`, so it can undo its own effects; it is forgotten once
            that hook exits 0. `outbox cancel` is different: it forgets entries at once, with no hook.
            """)
    }

    static func environment(_ page: inout Page) {
        page.add(
            """
            ## Environment variables

            Templates read the whole environment of the process that renders as `env.NAME`; hooks and
            plugins inherit the runner's. outbox itself reads these:
            """)
        var rows: [[String]] = [
            ["`OUTBOX_CONFIG`", "every command that needs a project", "the config file, when `--config` is not given"]
        ]
        for (variable, field) in Config.environmentOverrides {
            let range = ConfigFields.top[field].type.integerRange.map { " (\($0.lowerBound)–\($0.upperBound))" } ?? ""
            rows.append([
                "`\(variable)`", "every command that needs a project",
                // Only the limits have `run` flags; no flag names the store.
                "overrides the config's `\(field)`\(range)"
                    + (field == "store" ? " (no flag does)" : "; the `run` flags win over it") + "; a bad value is `E_CONFIG`",
            ])
        }
        rows += HookEnvironment.variables.map { ["`\($0.name)`", "set for hooks", $0.meaning] }
        rows += [
            [
                "`\(HookEnvironment.pluginOwnerName)`", "set for plugins",
                "the store and the outbox process that runs the plugin: a runner stops a plugin (and what it started) whose outbox process was killed",
            ],
            ["`PATH`", "`outbox check`, hooks and plugins", "where a command's program without a `/` is looked up"],
            ["`NOTIFY_SOCKET`", "`outbox run`", "systemd `Type=notify`: `READY=1` once the store is held, `STOPPING=1` at the end"],
            ["`WATCHDOG_USEC`", "`outbox run`", "with `NOTIFY_SOCKET`: `WATCHDOG=1` at half this interval"],
            [
                "`WATCHDOG_PID`", "`outbox run`",
                "when set, the pings are sent only if it is the runner's own pid (as systemd's library does)",
            ],
            ["`AWS_ACCESS_KEY_ID`", "`outbox run` (native S3)", "with `AWS_SECRET_ACCESS_KEY`: the credentials that sign S3 requests"],
            ["`AWS_SECRET_ACCESS_KEY`", "`outbox run` (native S3)", "the secret of `AWS_ACCESS_KEY_ID`; never shown"],
            ["`AWS_SESSION_TOKEN`", "`outbox run` (native S3)", "with the two above: sent as `x-amz-security-token`"],
            [
                "`AWS_PROFILE`", "`outbox run` (native S3)",
                "without the two above: the profile read from the shared credentials file (default `default`)",
            ],
            [
                "`AWS_SHARED_CREDENTIALS_FILE`", "`outbox run` (native S3)",
                "the shared credentials file (default `$HOME/.aws/credentials`)",
            ],
            ["`HOME`", "`outbox run` (native S3)", "where the default shared credentials file is"],
            ["`OUTBOX_FAULT`", "debug builds only", "`name[:n]`: the process kills itself at a named point (crash tests)"],
            [
                "`OUTBOX_FAULT_HOLD`", "debug builds only",
                "`name:path`: the process waits at a named point, after writing `path.reached`, until `path` exists (race tests)",
            ],
            [
                "`OUTBOX_FAULT_FAIL`", "debug builds only",
                "`name[:n]`: the code at a named point fails on purpose its first n times (a plugin that cannot start)",
            ],
            ["`OUTBOX_TEST_CLOCK_MS`", "debug builds only", "the clock a command checks before it opens the store (clock tests)"],
            ["`OUTBOX_TEST_FREE_BYTES`", "debug builds only", "the free bytes a runner sees on its store's disk (full-disk tests)"],
        ]
        page.table(["variable", "read by", "meaning"], rows)
    }
}

extension TemplateMode {
    var name: String {
        switch self {
        case .url: return "URL"
        case .header: return "header"
        case .text: return "text"
        case .value: return "value"
        }
    }

    var fields: String {
        switch self {
        case .url: return "`request.url`, a parts plan's `url`"
        case .header: return "header values (the config's `headers`, `request.headers`, a plan's and explicit parts' `headers`)"
        case .text: return "`request.text`"
        case .value: return "everything else: `data`, `form`, `file`, `method`, `scope`, explicit `parts` lists, `then`, ..."
        }
    }

    var rule: String {
        switch self {
        case .url: return "tags inside a longer URL are percent-encoded; the result must be an absolute http(s) URL"
        case .header: return "always text; CR, LF and NUL are `E_INVALID`"
        case .text: return "always text; `{{ for NAME in PATH }} ... {{ end }}` blocks allowed"
        case .value: return "whole values keep their type"
        }
    }
}
