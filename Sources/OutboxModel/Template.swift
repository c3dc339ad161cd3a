import Synchronization

/// Values the templates can read. Roots: "vars", "entry", "env", "file", "part", "outcome" (and "loop" inside for-blocks).
package struct TemplateContext: Sendable {
    package var roots: [String: JSON]

    /// A context whose roots are exactly `roots`; a path under any other root does not resolve.
    package init(roots: [String: JSON]) {
        self.roots = roots
    }
}

/// How a rendered string is used, which decides encoding and checks (docs/templates.md).
package enum TemplateMode: Sendable {
    /// JSON data, parts lists, follow-up vars: a whole substitution keeps its JSON type.
    case value
    /// A request URL: inner substitutions are percent-encoded; the result must pass `URLCheck`.
    case url
    /// A header value: always text, never CR, LF or NUL.
    case header
    /// A text body: always text; `{{ for x in path }} ... {{ end }}` blocks allowed.
    case text
}

/// The `{{ path | filter }}` template language of definition files.
package enum Template {
    /// Renders one template string. If the whole string (trimmed of nothing: exactly, no surrounding text) is one `{{ path }}` substitution without a string-producing filter, the value is returned whole with its JSON type (value/url modes; in url mode a whole value must be a string or it is E_INVALID). Otherwise the result is a `.string`.
    ///
    /// In url mode the result is also checked with `URLCheck.validate`. A for/end tag alone on
    /// its line (only spaces or tabs around it) removes that whole line from the output.
    package static func render(_ template: String, context: TemplateContext, mode: TemplateMode, field: String) throws(OutboxError) -> JSON
    {
        let nodes: [TemplateNode]
        do {
            nodes = try parsed(template)
        } catch {
            throw .invalid("\(field): \(error.message)")
        }
        let renderer = TemplateRenderer(mode: mode, field: field)
        return try renderer.render(nodes, roots: context.roots)
    }

    /// Parsed templates by their text: a definition's few templates are rendered for every
    /// entry (`enqueue --from` renders them once per line), and parsing is most of the work.
    private static let parsedTemplates = Locked<[String: [TemplateNode]]>([:])

    private static func parsed(_ template: String) throws(TemplateSyntaxError) -> [TemplateNode] {
        if let nodes = parsedTemplates.withLock({ $0[template] }) { return nodes }
        let nodes = try TemplateParser.parse(template)
        parsedTemplates.withLock { cache in
            if cache.count >= 1_024 { cache.removeAll(keepingCapacity: true) }
            cache[template] = nodes
        }
        return nodes
    }

    /// Renders every string leaf of a tree (object keys are not templated) in `.value` mode; `field` is the dotted path used in error messages (e.g. "request.data").
    package static func renderTree(_ tree: JSON, context: TemplateContext, field: String) throws(OutboxError) -> JSON {
        switch tree {
        case .null, .bool, .number:
            return tree
        case let .string(s):
            return try render(s, context: context, mode: .value, field: field)
        case let .array(items):
            var out: [JSON] = []
            out.reserveCapacity(items.count)
            for (i, item) in items.enumerated() {
                out.append(try renderTree(item, context: context, field: "\(field)[\(i)]"))
            }
            return .array(out)
        case let .object(members):
            var out: [(String, JSON)] = []
            out.reserveCapacity(members.count)
            for (key, value) in members {
                out.append((key, try renderTree(value, context: context, field: field.isEmpty ? key : "\(field).\(key)")))
            }
            return .object(out)
        }
    }

    /// Checks a template's syntax without rendering (unbalanced braces, unknown filter, bad for/end). For `outbox check`.
    ///
    /// Also rejects roots other than vars, entry, env, file, part, outcome (plus the loop
    /// variable and `loop` inside a for-block). Whether a root fits the field is the caller's check.
    package static func validate(_ template: String, roots: Set<String> = allRoots) -> String? {
        let nodes: [TemplateNode]
        do {
            nodes = try TemplateParser.parse(template)
        } catch {
            return error.message
        }
        return unknownRoot(in: nodes, scope: roots)
    }

    package static let allRoots = Set(TemplateParser.knownRoots)

    /// A URL template whose own text puts a substitution without `| raw` in the scheme or
    /// host: every enqueue would be refused, so `check` says so. Nil when the first
    /// substitution is in the path or the query, is raw, or comes after a loop, and for a
    /// whole-value substitution (`"{{ vars.url }}"`, used as is).
    package static func schemeOrHostProblem(url template: String, field: String) -> String? {
        guard let nodes = try? TemplateParser.parse(template) else { return nil }
        if nodes.count == 1, case let .substitution(sub) = nodes[0], !sub.producesString { return nil }
        var position = URLPosition()
        for node in nodes {
            switch node {
            case let .text(s): position.feed(s)
            case let .substitution(sub):
                guard !sub.isRaw, position.part != .path, position.part != .query else { return nil }
                return inSchemeOrHost(sub, field: field)
            case .loop: return nil
            }
        }
        return nil
    }

    static func inSchemeOrHost(_ sub: TemplateSubstitution, field: String) -> String {
        "\(field): {{ \(sub.path.text) }} is in the URL's scheme or host; write {{ \(sub.path.text) | raw }} if the value is trusted"
    }

    /// Paths a template reads (e.g. ["vars.site_id", "env.API_TOKEN"]), for static checks.
    ///
    /// In order of first use, without duplicates. Paths under a loop variable or `loop` are
    /// left out (the for-block's own list path is included). Empty when `validate` fails.
    package static func paths(in template: String) -> [String] {
        guard let nodes = try? TemplateParser.parse(template) else { return [] }
        var seen = Set<String>()
        var out: [String] = []
        collectPaths(nodes, local: [], seen: &seen, out: &out)
        return out
    }

    /// Whether a template reads the environment: its rendered value is treated as a secret.
    package static func readsEnvironment(_ template: String) -> Bool {
        // Asked for every enqueued line: a template without the letters "env" is not parsed.
        guard mentionsEnv(template) else { return false }
        return paths(in: template).contains { $0 == "env" || $0.hasPrefix("env.") || $0.hasPrefix("env[") }
    }

    private static func mentionsEnv(_ template: String) -> Bool {
        var previous: (UInt8, UInt8) = (0, 0)
        for byte in template.utf8 {
            if byte == UInt8(ascii: "v") && previous == (UInt8(ascii: "e"), UInt8(ascii: "n")) { return true }
            previous = (previous.1, byte)
        }
        return false
    }

    private static func unknownRoot(in nodes: [TemplateNode], scope: Set<String>) -> String? {
        for node in nodes {
            switch node {
            case .text:
                continue
            case let .substitution(sub):
                if !scope.contains(sub.path.root) { return unknownRootMessage(sub.path.root, tag: sub.display, scope: scope) }
            case let .loop(variable, path, body):
                if !scope.contains(path.root) {
                    return unknownRootMessage(path.root, tag: "{{ for \(variable) in \(path.text) }}", scope: scope)
                }
                if let message = unknownRoot(in: body, scope: scope.union([variable, "loop"])) { return message }
            }
        }
        return nil
    }

    private static func unknownRootMessage(_ root: String, tag: String, scope: Set<String>) -> String {
        "unknown root \"\(root)\" in \(tag) (roots: \(scope.sorted().joined(separator: ", ")))"
    }

    private static func collectPaths(_ nodes: [TemplateNode], local: Set<String>, seen: inout Set<String>, out: inout [String]) {
        for node in nodes {
            switch node {
            case .text:
                continue
            case let .substitution(sub):
                if !local.contains(sub.path.root), seen.insert(sub.path.text).inserted { out.append(sub.path.text) }
            case let .loop(variable, path, body):
                if !local.contains(path.root), seen.insert(path.text).inserted { out.append(path.text) }
                collectPaths(body, local: local.union([variable, "loop"]), seen: &seen, out: &out)
            }
        }
    }
}
