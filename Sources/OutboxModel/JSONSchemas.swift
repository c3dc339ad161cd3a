/// JSON Schemas (draft 2020-12) of the config file and of a definition file, for editors
/// (`outbox schema config|definition`), generated from the field tables the loader reads
/// (`ConfigFields`, `DefinitionFields`): names, types, ranges, values, defaults, descriptions
/// and examples.
package enum JSONSchemas {
    package static func config() -> JSON {
        document(title: "outbox config (config/outbox.yaml)", ConfigFields.top)
    }

    package static func definition() -> JSON {
        var schema = document(title: "outbox definition (definitions/*.yaml)", DefinitionFields.top)
        // A definition says how to build its request: written out, or by a plugin.
        schema.set("anyOf", .array(["request", "request_command"].map { .object([("required", .array([.string($0)]))]) }))
        return schema
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

    // MARK: From the tables

    private static func document(title: String, _ mapping: FieldMapping) -> JSON {
        var pairs: [(String, JSON)] = [("$schema", .string("https://json-schema.org/draft/2020-12/schema")), ("title", .string(title))]
        if case let .object(fields) = object(mapping) { pairs += fields }
        return .object(pairs)
    }

    private static func object(_ mapping: FieldMapping) -> JSON {
        var pairs: [(String, JSON)] = [
            ("type", .string("object")), ("properties", .object(mapping.fields.map { ($0.name, property($0)) })),
            ("additionalProperties", .bool(false)),
        ]
        let required = mapping.fields.filter(\.isRequired).map { JSON.string($0.name) }
        if !required.isEmpty { pairs.append(("required", .array(required))) }
        pairs.append(("description", .string(mapping.summary)))
        return .object(pairs)
    }

    /// A field's schema: its type's, with the field's description, default and example.
    private static func property(_ field: Field) -> JSON {
        var schema = self.schema(field.type)
        let hint = field.type.isMapping ? nil : schema["description"]?.stringValue
        schema.set("description", .string(hint.map { "\(field.summary) (\($0))" } ?? field.summary))
        switch field.defaultValue {
        case let .value(value): schema.set("default", value)
        case .none where field.type.isNullable: schema.set("default", .null)
        case .none, .required, .described: break
        }
        schema.set("examples", .array([field.example]))
        return schema
    }

    private static func schema(_ type: FieldType) -> JSON {
        switch type {
        case let .string(hint): return string(hint)
        case .path: return string("a path")
        case let .template(hint): return string("a template giving \(hint)")
        case .duration: return duration
        case .size: return size
        case let .integer(range): return integer(range)
        case let .number(range):
            return .object([
                ("type", .string("number")), ("minimum", .number(String(range.lowerBound))),
                ("maximum", .number(String(range.upperBound))),
            ])
        case .bool: return .object([("type", .string("boolean"))])
        case let .enumeration(values): return .object([("enum", .array(values.map { .string($0) }))])
        case let .list(item): return .object([("type", .string("array")), ("items", schema(item))])
        case let .mapping(mapping): return object(mapping)
        case .headers: return headers
        case .command: return command
        case .any: return .object([("description", .string("any YAML value; strings are templates"))])
        case let .nullable(item): return anyOf([schema(item), .object([("type", .string("null"))])])
        case let .anyOf(options): return anyOf(options.map(schema))
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

    private static func string(_ description: String, pattern: String? = nil) -> JSON {
        var pairs: [(String, JSON)] = [("type", .string("string"))]
        if !description.isEmpty { pairs.append(("description", .string(description))) }
        if let pattern { pairs.append(("pattern", .string(pattern))) }
        return .object(pairs)
    }

    private static func integer(_ range: ClosedRange<Int64>) -> JSON {
        .object([("type", .string("integer")), ("minimum", .int64(range.lowerBound)), ("maximum", .int64(range.upperBound))])
    }

    private static func anyOf(_ options: [JSON]) -> JSON { .object([("anyOf", .array(options))]) }
}

extension FieldType {
    var isMapping: Bool {
        if case .mapping = self { return true }
        return false
    }

    var isNullable: Bool {
        if case .nullable = self { return true }
        return false
    }
}
