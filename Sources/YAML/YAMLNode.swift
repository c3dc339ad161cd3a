/// A 1-based position in a YAML source file.
package struct Mark: Sendable, Equatable, Hashable {
    package var line: Int
    package var column: Int
    package init(line: Int, column: Int) {
        self.line = line
        self.column = column
    }
}

/// How a scalar was written; resolution of plain scalars depends on it.
package enum ScalarStyle: Sendable, Equatable {
    case plain, singleQuoted, doubleQuoted, literal, folded
}

/// A scalar resolved by the YAML 1.2 core schema.
package enum YAMLScalar: Sendable, Equatable {
    case null
    case bool(Bool)
    /// Integer text normalised to decimal (`0x1F` → `31`), so it fits a JSON number.
    case int(String)
    /// Float text as a JSON number, or nil text for `.inf`/`.nan`, which JSON cannot hold.
    case float(String?)
    case string(String)
}

/// One key/value pair of a mapping, in source order.
package struct YAMLPair: Sendable {
    package var key: YAMLNode
    package var value: YAMLNode
    package init(key: YAMLNode, value: YAMLNode) {
        self.key = key
        self.value = value
    }
}

/// A node of a parsed YAML document; every node knows where it was written.
package struct YAMLNode: Sendable {
    package indirect enum Kind: Sendable {
        case scalar(String, ScalarStyle)
        case sequence([YAMLNode])
        case mapping([YAMLPair])
    }

    package var kind: Kind
    package var mark: Mark
    /// An explicit tag such as `!!str`, if one was written.
    package var tag: String?

    package init(kind: Kind, mark: Mark, tag: String? = nil) {
        self.kind = kind
        self.mark = mark
        self.tag = tag
    }
}
