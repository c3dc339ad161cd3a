/// JSON Schemas (draft 2020-12) of the config file and of a definition file, for editors
/// (`outbox schema config|definition`). The field names come from the loader's own tables
/// (`Config.fieldNames`, `Definition.fieldNames`, `Definition.requestFields`); a test checks
/// that every mapping the loader reads has exactly the fields described here.
package enum JSONSchemas {
    package static func config() -> JSON {
        document(
            title: "outbox config (config/outbox.yaml)",
            object(
                Config.fieldNames.map { ($0, configField($0)) },
                description: "Every field may be left out; relative paths are the project root's."))
    }

    package static func definition() -> JSON {
        document(
            title: "outbox definition (definitions/*.yaml)",
            object(Definition.fieldNames.map { ($0, definitionField($0)) }, required: ["key"]))
    }

    /// Every object a schema describes, by path ("retry.backoff", "accept items"), with its
    /// fields: what the test compares against the loader's own lists.
    package static func mappings(_ schema: JSON) -> [String: Set<String>] {
        var out: [String: Set<String>] = [:]
        func walk(_ node: JSON, _ path: String) {
            if let properties = node["properties"]?.objectValue {
                out[path] = Set(properties.map(\.0))
                for (name, child) in properties { walk(child, path.isEmpty ? name : path + "." + name) }
            }
            if let items = node["items"] { walk(items, path + " items") }
            for option in node["anyOf"]?.arrayValue ?? [] { walk(option, path) }
        }
        walk(schema, "")
        return out
    }

    // MARK: Fields

    private static func configField(_ name: String) -> JSON {
        switch name {
        case "root", "store", "definitions": return string("a path")
        case "lifetime": return duration
        case "max_vars_bytes", "max_response_bytes": return size
        case "retry": return retry
        case "headers": return headers
        case "headers_command", "auth_refresh_command": return nullable(command)
        case "redact_headers": return .object([("type", .string("array")), ("items", string("a header name"))])
        case "events": return object([("command", nullable(command))])
        case "account": return nullable(string("a template, e.g. {{ env.USER }}"))
        case "concurrency": return integer(1...1024)
        case "per_host": return integer(1...256)
        case "part_concurrency": return integer(1...64)
        case "hooks":
            return object([("concurrency", integer(1...256)), ("warn_after", duration), ("timeout", nullable(duration))])
        case "hosts": return object([("hold_after", integer(0...1000))])
        case "plugins": return object([("timeout", duration)])
        case "network": return object([("wifi_check", command), ("wifi_interval", duration)])
        case "timeouts":
            return object([("connect", duration), ("stall", object([("below", size), ("for", duration)]))])
        case "tls":
            return object([
                ("ca_file", nullable(string("a path"))), ("cert", nullable(string("a path"))), ("key", nullable(string("a path"))),
            ])
        default: return .object([])
        }
    }

    private static func definitionField(_ name: String) -> JSON {
        switch name {
        case "key": return string("the request kind, e.g. note.comment")
        case "request":
            return object(Definition.requestFields.map { ($0, requestField($0)) })
        case "response":
            return anyOf([enumeration(["raw", "json"]), object([("command", command)], required: ["command"])])
        case "accept":
            return .object([
                ("type", .string("array")),
                (
                    "items",
                    object([("status", integer(100...599)), ("body_includes", string("text the body must contain"))], required: ["status"])
                ),
            ])
        case "retry": return retry
        case "expires_in": return nullable(duration)
        case "scope": return nullable(string("a template naming a serial scope"))
        case "on_rejected": return enumeration(["continue", "cancel-scope"])
        case "on_success", "on_error", "request_command": return nullable(command)
        case "then":
            let item = object(
                [("key", string("a definition key")), ("vars", .object([])), ("id", string("a template")), ("delay", duration)],
                required: ["key"])
            let list = JSON.object([("type", .string("array")), ("items", item)])
            return object([("on_success", list), ("on_error", list)])
        default: return .object([])
        }
    }

    private static func requestField(_ name: String) -> JSON {
        switch name {
        case "method": return string("POST, PUT, PATCH, DELETE, GET, MKCOL, COPY, MOVE, or a template")
        case "url", "content_type", "text", "file", "idempotency_key": return string("a template")
        case "headers": return headers
        case "data": return .object([("description", .string("any YAML value; strings are templates"))])
        case "form":
            let item = object(
                [
                    ("name", string("")), ("value", .object([])), ("file", string("a template")), ("filename", string("")),
                    ("content_type", string("")),
                ],
                required: ["name"])
            return .object([("type", .string("array")), ("items", item)])
        case "parts":
            let item = object([
                ("url", string("a template")), ("headers", headers), ("range", object([("start", .object([])), ("end", .object([]))])),
            ])
            return anyOf([
                object([
                    ("plan", object([("min", size), ("max", size), ("max_parts", integer(1...1_000_000))])), ("url", string("a template")),
                    ("headers", headers),
                ]),
                .object([("type", .string("array")), ("items", item)]),
                string("a template giving the list"),
            ])
        case "ownership": return anyOf([enumeration(["copy", "move", "reference"]), string("a template")])
        case "follow_redirects": return anyOf([integer(0...50), string("a template")])
        case "redirect_method_change", "wifi_only": return anyOf([.object([("type", .string("boolean"))]), string("a template")])
        default: return .object([])
        }
    }

    // MARK: Building blocks

    private static let duration = string("a duration: 500ms, 30s, 10m, 2h or 14d", pattern: "^[0-9]+(\\.[0-9]+)?(ms|s|m|h|d)$")
    private static let size = anyOf([integer(0...Int64.max), string("a size: 512, 64KiB, 8MiB, 1GiB")])
    private static let command = anyOf([
        string("a shell command line"),
        .object([("type", .string("array")), ("items", .object([("type", .string("string"))])), ("minItems", .int(1))]),
    ])
    private static let headers = JSON.object([
        ("type", .string("object")),
        ("additionalProperties", .object([("type", .array([.string("string"), .string("number"), .string("boolean")]))])),
    ])
    private static var retry: JSON {
        object([
            ("backoff", object([("base", duration), ("max", duration), ("jitter", number(0...1))], required: ["base", "max", "jitter"])),
            (
                "terminal_http",
                object([("exempt", .object([("type", .string("array")), ("items", integer(400...499))]))], required: ["exempt"])
            ),
        ])
    }

    private static func document(title: String, _ body: JSON) -> JSON {
        var pairs: [(String, JSON)] = [("$schema", .string("https://json-schema.org/draft/2020-12/schema")), ("title", .string(title))]
        if case let .object(fields) = body { pairs += fields }
        return .object(pairs)
    }

    private static func object(_ properties: [(String, JSON)], required: [String] = [], description: String? = nil) -> JSON {
        var pairs: [(String, JSON)] = [
            ("type", .string("object")), ("properties", .object(properties)), ("additionalProperties", .bool(false)),
        ]
        if !required.isEmpty { pairs.append(("required", .array(required.map { .string($0) }))) }
        if let description { pairs.append(("description", .string(description))) }
        return .object(pairs)
    }

    private static func string(_ description: String, pattern: String? = nil) -> JSON {
        var pairs: [(String, JSON)] = [("type", .string("string"))]
        if !description.isEmpty { pairs.append(("description", .string(description))) }
        if let pattern { pairs.append(("pattern", .string(pattern))) }
        return .object(pairs)
    }

    private static func integer(_ range: ClosedRange<Int64>) -> JSON {
        .object([("type", .string("integer")), ("minimum", .int64(range.lowerBound)), ("maximum", .int64(range.upperBound))])
    }

    private static func number(_ range: ClosedRange<Double>) -> JSON {
        .object([
            ("type", .string("number")), ("minimum", .number(String(range.lowerBound))), ("maximum", .number(String(range.upperBound))),
        ])
    }

    private static func enumeration(_ values: [String]) -> JSON { .object([("enum", .array(values.map { .string($0) }))]) }
    private static func anyOf(_ options: [JSON]) -> JSON { .object([("anyOf", .array(options))]) }
    private static func nullable(_ schema: JSON) -> JSON { anyOf([schema, .object([("type", .string("null"))])]) }
}
