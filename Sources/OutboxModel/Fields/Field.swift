/// What a field of the config or of a definition file holds. The loader reads its ranges and
/// names from here, `JSONSchemas` turns it into JSON Schema and `ReferencePage` into a table.
package indirect enum FieldType: Sendable {
    /// Text taken as it is; the hint says what it names ("a header name").
    case string(String)
    /// A file or folder path, relative to the project root.
    case path
    /// A template string; the hint says what it renders to.
    case template(String)
    case duration
    case size
    case integer(ClosedRange<Int64>)
    case number(ClosedRange<Double>)
    case bool
    case enumeration([String])
    case list(FieldType)
    case mapping(FieldMapping)
    /// Header names to template values.
    case headers
    /// A shell command line, or an argument list run directly.
    case command
    /// Any YAML value (strings in it are templates).
    case any
    case nullable(FieldType)
    case anyOf([FieldType])

    /// The integer range of this type, also inside a list, `null` or an alternative.
    package var integerRange: ClosedRange<Int64>? {
        switch self {
        case let .integer(range): return range
        case let .list(item), let .nullable(item): return item.integerRange
        case let .anyOf(options): return options.lazy.compactMap(\.integerRange).first
        default: return nil
        }
    }

    var numberRange: ClosedRange<Double>? {
        switch self {
        case let .number(range): return range
        case let .nullable(item): return item.numberRange
        default: return nil
        }
    }

    var enumValues: [String]? {
        switch self {
        case let .enumeration(values): return values
        case let .nullable(item): return item.enumValues
        case let .anyOf(options): return options.lazy.compactMap(\.enumValues).first
        default: return nil
        }
    }

    /// The mappings this type holds, directly or as list items.
    var mappings: [FieldMapping] {
        switch self {
        case let .mapping(m): return [m]
        case let .list(item), let .nullable(item): return item.mappings
        case let .anyOf(options): return options.flatMap(\.mappings)
        default: return []
        }
    }
}

/// A field's default as the loader applies it.
package enum FieldDefault: Sendable {
    /// The field must be given.
    case required
    /// Left out, the field is unset (no hook, no limit, ...).
    case none
    /// Left out, the loader uses this value.
    case value(JSON)
    /// The default depends on something else; the text says what.
    case described(String)
}

/// One field of a mapping: its name, type, default, an example value and what it does.
package struct Field: Sendable {
    package let name: String
    package let type: FieldType
    package let defaultValue: FieldDefault
    package let example: JSON
    package let summary: String

    package init(_ name: String, _ type: FieldType, _ defaultValue: FieldDefault, example: JSON, _ summary: String) {
        self.name = name
        self.type = type
        self.defaultValue = defaultValue
        self.example = example
        self.summary = summary
    }

    package var isRequired: Bool {
        if case .required = defaultValue { return true }
        return false
    }
}

/// The fields of one mapping, by the path people write it at ("retry.backoff", "accept items").
package struct FieldMapping: Sendable {
    package let path: String
    package let summary: String
    package let fields: [Field]
    /// The names the loader accepts here; any other is an unknown field. Made once: every
    /// enqueue checks each member of its request against them.
    package let names: [String]

    package init(_ path: String, _ summary: String, _ fields: [Field]) {
        self.path = path
        self.summary = summary
        self.fields = fields
        names = fields.map(\.name)
    }

    package subscript(name: String) -> Field {
        guard let field = fields.first(where: { $0.name == name }) else {
            preconditionFailure("no field \(name) in the mapping \(path)")
        }
        return field
    }

    /// The whole-number range of a field (or of its list items), for the loader's checks.
    package func range(_ name: String) -> ClosedRange<Int64> {
        guard let range = self[name].type.integerRange else { preconditionFailure("\(path).\(name) is not a whole number") }
        return range
    }

    package func numberRange(_ name: String) -> ClosedRange<Double> {
        guard let range = self[name].type.numberRange else { preconditionFailure("\(path).\(name) is not a number") }
        return range
    }

    package func values(_ name: String) -> [String] {
        guard let values = self[name].type.enumValues else { preconditionFailure("\(path).\(name) has no list of values") }
        return values
    }

    /// This mapping and every mapping under it, depth first, each once.
    package var all: [FieldMapping] {
        var out: [FieldMapping] = [self]
        var seen: Set<String> = [path]
        for field in fields {
            for child in field.type.mappings.flatMap(\.all) where seen.insert(child.path).inserted {
                out.append(child)
            }
        }
        return out
    }
}

// The field tables write defaults and examples as literals, in the order they are written.
extension JSON: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral, ExpressibleByBooleanLiteral,
    ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral
{
    package init(stringLiteral value: String) { self = .string(value) }
    package init(integerLiteral value: Int) { self = .int(value) }
    package init(floatLiteral value: Double) { self = .number(String(value)) }
    package init(booleanLiteral value: Bool) { self = .bool(value) }
    package init(arrayLiteral elements: JSON...) { self = .array(elements) }
    package init(dictionaryLiteral elements: (String, JSON?)...) { self = .object(elements.map { ($0.0, $0.1 ?? .null) }) }
}
