/// A 1-based position in a YAML source file.
public struct Mark: Sendable, Equatable, Hashable {
    public var line: Int
    public var column: Int
    public init(line: Int, column: Int) {
        self.line = line
        self.column = column
    }
}

/// How a scalar was written; resolution of plain scalars depends on it.
public enum ScalarStyle: Sendable, Equatable {
    case plain, singleQuoted, doubleQuoted, literal, folded
}

/// A scalar resolved by the YAML 1.2 core schema.
public enum YAMLScalar: Sendable, Equatable {
    case null
    case bool(Bool)
    /// Integer text normalised to decimal (`0x1F` → `31`), so it fits a JSON number.
    case int(String)
    /// Float text as a JSON number, or nil text for `.inf`/`.nan`, which JSON cannot hold.
    case float(String?)
    case string(String)
}

/// One key/value pair of a mapping, in source order.
public struct YAMLPair: Sendable {
    public var key: YAMLNode
    public var value: YAMLNode
    public init(key: YAMLNode, value: YAMLNode) {
        self.key = key
        self.value = value
    }
}

/// A node of a parsed YAML document; every node knows where it was written.
public struct YAMLNode: Sendable {
    public indirect enum Kind: Sendable {
        case scalar(String, ScalarStyle)
        case sequence([YAMLNode])
        case mapping([YAMLPair])
    }

    public var kind: Kind
    public var mark: Mark
    /// An explicit tag such as `!!str`, if one was written.
    public var tag: String?

    public init(kind: Kind, mark: Mark, tag: String? = nil) {
        self.kind = kind
        self.mark = mark
        self.tag = tag
    }
}
