/// Vars that went into a secret header (`Authorization: "Bearer {{ vars.token }}"`): the
/// header is shown redacted, so the var must be too, or `show` would print the token beside
/// it. Found once at enqueue, by value, and kept as paths into the vars: a later `headers
/// update` that replaces the header must not bring the old token back into view.
package enum SecretVars {
    /// The paths (member names and array indexes) of the string (or number) vars that a secret
    /// value holds or that hold one; those under 6 bytes are left, as `secretValues` leaves them.
    /// `secrets` is asked for only when some var is a string that long (most vars are not).
    package static func paths(in vars: JSON, secrets secretValues: () -> [[UInt8]]) -> [[JSON]] {
        // Most entries have no secret at all: then no path is built.
        guard hasLongValue(vars) else { return [] }
        let secrets = secretValues()
        guard !secrets.isEmpty else { return [] }
        var found: [[JSON]] = []
        func walk(_ value: JSON, _ path: [JSON]) {
            switch value {
            case let .string(s), let .number(s):
                guard s.utf8.count >= 6 else { return }
                let bytes = Array(s.utf8)
                if secrets.contains(where: { contains(bytes, $0) || contains($0, bytes) }) { found.append(path) }
            case let .array(items):
                for (i, item) in items.enumerated() { walk(item, path + [.int(i)]) }
            case let .object(members):
                for (name, member) in members { walk(member, path + [.string(name)]) }
            default:
                return
            }
        }
        walk(vars, [])
        return found
    }

    private static func hasLongValue(_ value: JSON) -> Bool {
        switch value {
        case let .string(s), let .number(s): s.utf8.count >= 6
        case let .array(items): items.contains(where: hasLongValue)
        case let .object(members): members.contains { hasLongValue($0.1) }
        default: false
        }
    }

    /// The paths of the vars of a template tree (a `then` item's) whose template reads `env`:
    /// what they render is a secret however the entry uses it.
    package static func environmentPaths(in template: JSON) -> [[JSON]] {
        var found: [[JSON]] = []
        func walk(_ value: JSON, _ path: [JSON]) {
            switch value {
            case let .string(text): if Template.readsEnvironment(text) { found.append(path) }
            case let .array(items): for (i, item) in items.enumerated() { walk(item, path + [.int(i)]) }
            case let .object(members): for (name, member) in members { walk(member, path + [.string(name)]) }
            default: return
            }
        }
        walk(template, [])
        return found
    }

    /// Every text (string or number) of `vars` at or under `paths`.
    package static func texts(at paths: [[JSON]], in vars: JSON) -> [String] {
        func value(_ node: JSON, _ path: ArraySlice<JSON>) -> JSON? {
            guard let step = path.first else { return node }
            switch (node, step) {
            case let (.object(members), .string(name)): return members.first { $0.0 == name }.flatMap { value($0.1, path.dropFirst()) }
            case let (.array(items), .number(text)):
                guard let index = Int(text), items.indices.contains(index) else { return nil }
                return value(items[index], path.dropFirst())
            default: return nil
            }
        }
        func leaves(_ node: JSON) -> [String] {
            switch node {
            case let .string(s), let .number(s): [s]
            case let .array(items): items.flatMap(leaves)
            case let .object(members): members.flatMap { leaves($0.1) }
            default: []
            }
        }
        return paths.compactMap { value(vars, $0[...]) }.flatMap(leaves)
    }

    /// `vars` with the value at each path written as the redacted mark.
    package static func masking(_ vars: JSON, _ paths: [[JSON]]) -> JSON {
        var out = vars
        for path in paths { out = replacing(out, path[...]) }
        return out
    }

    private static func replacing(_ value: JSON, _ path: ArraySlice<JSON>) -> JSON {
        guard let step = path.first else { return .string(HeaderRules.redactedMark) }
        switch (value, step) {
        case let (.object(members), .string(name)):
            return .object(members.map { $0.0 == name ? ($0.0, replacing($0.1, path.dropFirst())) : $0 })
        case let (.array(items), .number(text)):
            guard let index = Int(text), items.indices.contains(index) else { return value }
            var items = items
            items[index] = replacing(items[index], path.dropFirst())
            return .array(items)
        default:
            return value
        }
    }

    private static func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard !needle.isEmpty, needle.count <= haystack.count else { return needle.isEmpty }
        for start in 0...(haystack.count - needle.count) where haystack[start] == needle[0] {
            if haystack[start..<start + needle.count].elementsEqual(needle) { return true }
        }
        return false
    }
}
