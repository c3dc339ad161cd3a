/// A child's environment: a base checked and encoded once (every hook of a run shares the
/// runner's), with a few variables set over it for one process.
package struct ProcessEnvironment: Sendable, ExpressibleByDictionaryLiteral {
    let base: EncodedEnvironment
    var overrides: [String: String]

    package init(_ variables: [String: String]) {
        self.init(base: EncodedEnvironment(variables), setting: [:])
    }

    package init(dictionaryLiteral elements: (String, String)...) {
        self.init(Dictionary(elements) { first, _ in first })
    }

    package init(base: EncodedEnvironment, setting overrides: [String: String]) {
        self.base = base
        self.overrides = overrides
    }

    package subscript(name: String) -> String? {
        overrides[name] ?? base.variables[name]
    }

    /// Every variable the child gets.
    package var variables: [String: String] {
        base.variables.merging(overrides) { _, set in set }
    }

    /// Why the environment cannot be passed to a child (a name with `=` or NUL, a value with
    /// NUL), or nil.
    var problem: String? {
        if let problem = base.problem { return problem }
        return overrides.sorted { $0.key < $1.key }.lazy.compactMap(EncodedEnvironment.problem).first
    }

    /// Calls `body` with a NULL-terminated `envp`, sorted by name.
    func withPointers<R>(_ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) -> R) -> R {
        guard !overrides.isEmpty else { return base.entries.withPointers(body) }
        let set = overrides.sorted { $0.key < $1.key }
        let encoded = CStringArray(set.map { "\($0.key)=\($0.value)" })
        return encoded.withPointers { setPointers in
            base.entries.withPointers { basePointers in
                var merged: [UnsafeMutablePointer<CChar>?] = []
                merged.reserveCapacity(base.names.count + set.count + 1)
                var next = 0
                for (index, name) in base.names.enumerated() {
                    while next < set.count && set[next].key < name {
                        merged.append(setPointers[next])
                        next += 1
                    }
                    if overrides[name] == nil { merged.append(basePointers[index]) }
                }
                while next < set.count {
                    merged.append(setPointers[next])
                    next += 1
                }
                merged.append(nil)
                return merged.withUnsafeBufferPointer { body($0.baseAddress!) }
            }
        }
    }
}

/// Variables checked and turned into C strings once.
package final class EncodedEnvironment: Sendable {
    let variables: [String: String]
    /// The names, sorted; `entries` holds "NAME=value" in the same order.
    let names: [String]
    let entries: CStringArray
    let problem: String?

    package init(_ variables: [String: String]) {
        self.variables = variables
        let sorted = variables.sorted { $0.key < $1.key }
        names = sorted.map(\.key)
        entries = CStringArray(sorted.map { "\($0.key)=\($0.value)" })
        problem = sorted.lazy.compactMap(Self.problem).first
    }

    /// C strings end at NUL, and `=` in a name would split differently in the child.
    static func problem(_ variable: (key: String, value: String)) -> String? {
        if variable.key.isEmpty || variable.key.utf8.contains(UInt8(ascii: "=")) || variable.key.utf8.contains(0) {
            return "invalid environment variable name '\(variable.key)'"
        }
        if variable.value.utf8.contains(0) {
            return "environment variable \(variable.key) contains a NUL byte"
        }
        return nil
    }
}
