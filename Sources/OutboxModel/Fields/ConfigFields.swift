/// Every field of `config/outbox.yaml`: the loader's known fields, ranges and defaults.
package enum ConfigFields {
    static let path = FieldType.path

    package static let top = FieldMapping(
        "", "Every field may be left out; relative paths are the project root's.",
        [
            Field(
                "root", path, .described("the folder that holds `config/`"), example: "..",
                "the project root, relative to the config file's folder; hooks and plugins run in it"),
            Field(
                "store", path, .value(".outbox"), example: "/var/lib/outbox",
                "the store folder (`outbox.db` and staged bodies), created 0700; or a PostgreSQL schema, "
                    + "`postgres://user:password@host:port/db?schema=NAME` (file bodies are then staged in `.outbox`)"),
            Field("definitions", path, .value("definitions"), example: "requests", "the folder of definition files"),
            Field("lifetime", .duration, .value("14d"), example: "30d", "the `expires_in` of definitions that give none"),
            Field(
                "max_vars_bytes", .size, .value("1MiB"), example: "256KiB",
                "the largest vars an entry may have, as compact JSON; also caps what `--vars @FILE` and `--from` read"),
            Field(
                "max_response_bytes", .size, .value("1MiB"), example: "4MiB",
                "response body bytes kept for outcomes; the rest is read and dropped (`body_truncated`)"),
            Field(
                "retry", .mapping(retry),
                .value(["backoff": ["base": "1s", "max": "2h", "jitter": 0.2], "terminal_http": ["exempt": [404]]]),
                example: ["backoff": ["base": "500ms", "max": "10m", "jitter": 0.1]],
                "retry rules of definitions that give none"),
            Field(
                "headers", .headers, .value([:]), example: ["User-Agent": "acme-sync/2"],
                "headers of every request, rendered at enqueue (the lowest rank)"),
            Field(
                "headers_command", .nullable(.command), .none, example: "hooks/headers.sh",
                "a plugin run at each enqueue: gets `{\"key\", \"vars\"}`, prints a JSON object of headers"),
            Field(
                "auth_refresh_command", .nullable(.command), .none, example: ["python3", "hooks/refresh-token.py"],
                "a plugin run while entries wait `awaiting-auth`: prints a header patch"),
            Field(
                "redact_headers", .list(.string("a header name")), .value([]), example: ["X-Api-Key"],
                "more headers never printed (`Authorization`, `Cookie`, `Proxy-Authorization`, `Set-Cookie`, headers rendered from `env` and headers from `headers_command` always are)"
            ),
            Field(
                "events", .mapping(events), .value(["command": nil]), example: ["command": "hooks/events.sh"],
                "where event lines go besides `run --events -`"),
            Field(
                "account", .nullable(.template("the account that enqueues")), .none, example: "{{ env.USER }}",
                "who enqueues, rendered from the `enqueue` process's environment; a runner sends only its own account's entries"),
            Field("concurrency", .integer(1...1024), .value(16), example: 32, "entries in flight at once (a chunked entry counts once)"),
            Field("per_host", .integer(1...256), .value(4), example: 8, "requests in flight to one host and port"),
            Field("part_concurrency", .integer(1...64), .value(3), example: 4, "parts of one chunked entry in flight"),
            Field(
                "hooks", .mapping(hooks), .value(["concurrency": 32, "warn_after": "30s", "timeout": nil]), example: ["timeout": "10m"],
                "how hooks run"),
            Field(
                "network", .mapping(network), .value(["wifi_check": "builtin", "wifi_interval": "30s"]),
                example: ["wifi_check": "hooks/on-wifi.sh"], "how wifi-only entries learn they are on Wi-Fi"),
            Field(
                "timeouts", .mapping(timeouts), .value(["connect": "30s", "stall": ["below": "1KiB", "for": "60s"], "attempt": nil]),
                example: ["connect": "10s"], "when a transfer is given up"),
            Field(
                "tls", .mapping(tls), .value(["ca_file": nil, "cert": nil, "key": nil]), example: ["ca_file": "certs/ca.pem"],
                "certificates; verification is always on"),
            Field("plugins", .mapping(plugins), .value(["timeout": "30s"]), example: ["timeout": "1m"], "how long plugins may run"),
            Field("hosts", .mapping(hosts), .value(["hold_after": 5]), example: ["hold_after": 0], "holding a host that does not answer"),
            Field(
                "staging", .mapping(staging), .value(["path": nil, "shared": false]), example: ["path": "/mnt/outbox", "shared": true],
                "where file bodies are staged with a PostgreSQL store"),
            Field(
                "lease", .duration, .value("30s"), example: "1m",
                "on a PostgreSQL store, how long a runner's claim on an entry or a hook delivery lasts unless renewed "
                    + "(every third of it); another runner takes over once it runs out. At least 1s"),
        ])

    static let staging = FieldMapping(
        "staging", "File bodies with a PostgreSQL store (a folder store stages in itself).",
        [
            Field(
                "path", .nullable(path), .described("`.outbox` in the project root"), example: "/mnt/outbox",
                "the folder of staged file bodies"),
            Field(
                "shared", .bool, .value(false), example: true,
                "whether every host sees `path` at the same place, so any runner may send a file body; otherwise only a runner on the host that enqueued it"
            ),
        ])

    /// Shared by the config and definitions: each object given must be complete.
    package static let retry = FieldMapping(
        "retry", "A definition's `retry` replaces the config's whole; an object left out takes the built-in default.",
        [
            Field(
                "backoff", .mapping(backoff), .value(["base": "1s", "max": "2h", "jitter": 0.2]),
                example: ["base": "200ms", "max": "2s", "jitter": 0.2], "the delay between attempts"),
            Field(
                "terminal_http", .mapping(terminalHTTP), .value(["exempt": [404]]), example: ["exempt": [404, 409]],
                "4xx answers retried rather than settled `error`"),
        ])

    static let backoff = FieldMapping(
        "retry.backoff", "The delay after the n-th failure is base·2^(n−1), capped at max, then jittered; give all three.",
        [
            Field("base", .duration, .required, example: "500ms", "the delay after the first failure; also the floor of a `Retry-After`"),
            Field("max", .duration, .required, example: "10m", "the largest delay; also caps a `Retry-After`"),
            Field(
                "jitter", .number(0...1), .required, example: 0.1,
                "each delay is multiplied by a random factor in [1 − jitter, 1 + jitter]"),
        ])

    static let terminalHTTP = FieldMapping(
        "retry.terminal_http", "4xx statuses retried like a 5xx (401 and 403 still wait for credentials).",
        [Field("exempt", .list(.integer(400...499)), .required, example: [404, 409], "the 4xx statuses that are retried")])

    static let events = FieldMapping(
        "events", "The events plugin.",
        [
            Field(
                "command", .nullable(.command), .none, example: ["python3", "hooks/events.py"],
                "a long-lived plugin that reads event lines on stdin while `outbox run` runs")
        ])

    static let hooks = FieldMapping(
        "hooks", "How hooks run.",
        [
            Field("concurrency", .integer(1...256), .value(32), example: 4, "hooks running at once"),
            Field("warn_after", .duration, .value("30s"), example: "2m", "a hook running longer is logged (and still waited for)"),
            Field(
                "timeout", .nullable(.duration), .none, example: "10m",
                "a hook running longer is stopped (SIGTERM, then SIGKILL 2 s later to what of its group is left) and its delivery failed"),
        ])

    static let hosts = FieldMapping(
        "hosts", "Holding a host that does not answer.",
        [
            Field(
                "hold_after", .integer(0...1000), .value(5), example: 10,
                "connection failures in a row (no HTTP answer) after which a host is held: one probe at a time; 0 never holds")
        ])

    static let plugins = FieldMapping(
        "plugins", "Plugins: request_command, headers_command, auth_refresh_command, response parsers, the Wi-Fi check.",
        [
            Field(
                "timeout", .duration, .value("30s"), example: "1m",
                "how long a plugin may run before its process group is stopped (SIGTERM, then SIGKILL 2 s later to what of "
                    + "its group is left) and it counts as failed")
        ])

    static let network = FieldMapping(
        "network", "Wi-Fi checks for wifi-only entries.",
        [
            Field(
                "wifi_check", .command, .value("builtin"), example: "hooks/on-wifi.sh",
                "`builtin` (an interface under /sys/class/net with a `wireless` folder is up) or a command: exit 0 means on Wi-Fi"),
            Field(
                "wifi_interval", .duration, .value("30s"), example: "1m",
                "how long a Wi-Fi check's answer holds: it runs at most once per interval for the whole queue"),
        ])

    static let timeouts = FieldMapping(
        "timeouts", "When a transfer is given up (error kind `timeout`, retried).",
        [
            Field("connect", .duration, .value("30s"), example: "10s", "the longest a connection may take"),
            Field(
                "attempt", .nullable(.duration), .none, example: "2h",
                "the longest one HTTP request (one part of a chunked upload) may take, connecting included, to the answer's last byte"),
            Field(
                "stall", .mapping(stall), .value(["below": "1KiB", "for": "60s"]), example: ["below": "10KiB", "for": "30s"],
                "a transfer slower than `below` a second on average over `for` is given up"),
        ])

    static let stall = FieldMapping(
        "timeouts.stall", "A stalled transfer is given up and retried; connecting does not count.",
        [
            Field("below", .size, .value("1KiB"), example: "10KiB", "bytes per second under which a transfer counts as stalled"),
            Field("for", .duration, .value("60s"), example: "30s", "how long the average is taken over"),
        ])

    static let tls = FieldMapping(
        "tls", "Certificates; relative paths are the project root's.",
        [
            Field(
                "ca_file", .nullable(path), .described("the system's CA store"), example: "certs/ca.pem",
                "a CA bundle (PEM) that verifies servers instead of the system store"),
            Field(
                "cert", .nullable(path), .none, example: "certs/client.pem",
                "a client certificate (PEM) for servers that ask for one; give `key` too"),
            Field("key", .nullable(path), .none, example: "certs/client.key", "the client certificate's private key (PEM)"),
        ])
}
