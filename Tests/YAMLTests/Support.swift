import YAML

/// Parses text that must be valid and non-empty.
func load(_ text: String) throws -> YAMLNode {
    guard let node = try YAMLParser.parse(text) else { throw Unexpected.empty }
    return node
}

/// The error a text must fail with; nil when it parsed.
func loadError(_ text: String) -> YAMLError? {
    do {
        _ = try YAMLParser.parse(text)
        return nil
    } catch {
        return error
    }
}

enum Unexpected: Error { case empty, notAMapping, notASequence, missingKey(String) }

extension YAMLNode {
    /// The value under a key of a mapping node.
    func value(_ key: String) throws -> YAMLNode {
        guard case .mapping(let pairs) = kind else { throw Unexpected.notAMapping }
        guard let pair = pairs.first(where: { if case .scalar(key, _) = $0.key.kind { true } else { false } }) else {
            throw Unexpected.missingKey(key)
        }
        return pair.value
    }

    /// The key node of a mapping node.
    func keyNode(_ key: String) throws -> YAMLNode {
        guard case .mapping(let pairs) = kind else { throw Unexpected.notAMapping }
        guard let pair = pairs.first(where: { if case .scalar(key, _) = $0.key.kind { true } else { false } }) else {
            throw Unexpected.missingKey(key)
        }
        return pair.key
    }

    func items() throws -> [YAMLNode] {
        guard case .sequence(let items) = kind else { throw Unexpected.notASequence }
        return items
    }

    func keys() throws -> [String] {
        guard case .mapping(let pairs) = kind else { throw Unexpected.notAMapping }
        return pairs.map { if case .scalar(let text, _) = $0.key.kind { text } else { "?" } }
    }

    /// The scalar text, or nil for collections.
    var text: String? {
        if case .scalar(let text, _) = kind { text } else { nil }
    }
}

func at(_ line: Int, _ column: Int) -> Mark { Mark(line: line, column: column) }
