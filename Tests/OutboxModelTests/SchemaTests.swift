import Foundation
import Testing
import YAML

@testable import OutboxModel

/// `outbox schema` describes exactly what the loader reads, and the repository's own files
/// pass it.
struct SchemaTests {
    /// YAML putting an unknown field `zz_unknown` in the mapping at a schema path
    /// ("retry.backoff", "accept items").
    static func yamlWithUnknownField(at path: String) -> String {
        var lines: [String] = []
        var indent = ""
        var dash = false
        func add(_ text: String) {
            // The first line inside a list item starts with its dash.
            lines.append(dash ? String(indent.dropLast(2)) + "- " + text : indent + text)
            dash = false
        }
        for step in path.split(separator: ".").map(String.init) {
            let isItems = step.hasSuffix(" items")
            add((isItems ? String(step.dropLast(" items".count)) : step) + ":")
            indent += isItems ? "    " : "  "
            dash = isItems
        }
        add("zz_unknown: 1")
        return lines.joined(separator: "\n") + "\n"
    }

    /// The fields the loader names in its "unknown field" error for that YAML.
    static func knownFields(in diagnostics: [Diagnostic]) -> Set<String>? {
        guard let message = diagnostics.map(\.message).first(where: { $0.hasPrefix("unknown field \"zz_unknown\"") }),
            let open = message.range(of: "(known fields: ")
        else { return nil }
        let list = message[open.upperBound...].dropLast()
        return Set(list.components(separatedBy: ", "))
    }

    @Test func everyMappingTheConfigLoaderReadsIsInTheSchema() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let mappings = JSONSchemas.mappings(JSONSchemas.config())
        #expect(mappings.count >= 12)
        for (path, fields) in mappings {
            let yaml = Self.yamlWithUnknownField(at: path)
            let diagnostics: [Diagnostic]
            switch try loadConfig(yaml, in: folder) {
            case .success: diagnostics = []
            case let .failure(error): diagnostics = error.diagnostics
            }
            #expect(Self.knownFields(in: diagnostics) == fields, "config \(path.isEmpty ? "(top)" : path):\n\(yaml)")
        }
    }

    @Test func everyMappingTheDefinitionLoaderReadsIsInTheSchema() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let mappings = JSONSchemas.mappings(JSONSchemas.definition())
        #expect(mappings.count >= 10)
        for (path, fields) in mappings {
            let yaml = "key: k\n" + Self.yamlWithUnknownField(at: path)
            _ = try folder.write("defs/k.yaml", yaml)
            let set = DefinitionSet.load(folder: folder.path + "/defs")
            #expect(Self.knownFields(in: set.diagnostics) == fields, "definition \(path.isEmpty ? "(top)" : path):\n\(yaml)")
        }
    }

    static let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    /// The field names of every table in a reference page, by its heading.
    static func referenceTables(_ markdown: String) -> [String: Set<String>] {
        var out: [String: Set<String>] = [:]
        var heading = ""
        for line in markdown.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("### ") { heading = String(line.dropFirst(4)) }
            guard line.hasPrefix("| `"), heading.hasPrefix("config: ") || heading.hasPrefix("definition: ") else { continue }
            let name = line.dropFirst(3).prefix { $0 != "`" }
            out[heading, default: []].insert(String(name))
        }
        return out
    }

    /// Every mapping the loader reads (checked against the schema above) has a table in the
    /// reference with exactly its fields.
    @Test(arguments: ["config", "definition"])
    func everyMappingTheLoaderReadsIsInTheReference(_ kind: String) throws {
        let tables = Self.referenceTables(ReferencePage.markdown(commands: "")).filter { $0.key.hasPrefix(kind + ": ") }
        let schema = kind == "config" ? JSONSchemas.config() : JSONSchemas.definition()
        let mappings = JSONSchemas.mappings(schema)
        #expect(tables.count >= (kind == "config" ? 12 : 10))
        for (path, fields) in mappings {
            #expect(tables.values.contains(fields), "\(kind) \(path.isEmpty ? "(top)" : path): no reference table lists \(fields.sorted())")
        }
        // And no table lists a mapping the schema (so the loader) does not have.
        for (heading, fields) in tables {
            #expect(mappings.values.contains(fields), "\(heading): \(fields.sorted())")
        }
        let top = try #require(tables["\(kind): top level"])
        #expect(top == mappings[""])
    }

    /// Every `OUTBOX_*` name in the sources, and every variable read with `getenv` or from an
    /// environment dictionary, is listed in the reference.
    @Test func everyEnvironmentVariableTheCodeReadsIsInTheReference() throws {
        let reference = ReferencePage.markdown(commands: "")
        let sources = Self.repositoryRoot + "/Sources"
        var names: Set<String> = []
        let files = (FileManager.default.enumerator(atPath: sources)?.allObjects as? [String]) ?? []
        for file in files where file.hasSuffix(".swift") && !file.hasPrefix("OutboxTestServer") {
            let text = try String(contentsOfFile: sources + "/" + file, encoding: .utf8)
            for pattern in [#"OUTBOX_[A-Z][A-Z_]*"#, #"getenv\("([A-Z_]+)"\)"#, #"environment\["([A-Z_]+)"\]"#, #"env\["([A-Z_]+)"\]"#] {
                let regex = try NSRegularExpression(pattern: pattern)
                for match in regex.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
                    let range = match.numberOfRanges > 1 ? match.range(at: 1) : match.range
                    names.insert(String(text[Range(range, in: text)!]))
                }
            }
        }
        #expect(names.isSuperset(of: ["OUTBOX_CONFIG", "OUTBOX_STORE", "OUTBOX_ID", "NOTIFY_SOCKET", "PATH"]), "\(names.sorted())")
        for name in names.sorted() {
            #expect(reference.contains("| `\(name)` |"), "\(name) is read by the code but not listed in the reference")
        }
    }

    /// Writing a config field's documented default changes nothing the loader produces.
    @Test func theConfigDefaultsInTheTableAreTheLoaders() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let empty = String(describing: try loadConfig("", in: folder).get())
        var checked = 0
        for mapping in ConfigFields.top.all {
            for field in mapping.fields {
                guard case let .value(value) = field.defaultValue else { continue }
                let steps = mapping.path.split(separator: ".").map(String.init) + [field.name]
                let yaml =
                    steps.enumerated().map { String(repeating: "  ", count: $0.offset) + $0.element + ":" }
                    .joined(separator: "\n") + " " + ReferencePage.yaml(value) + "\n"
                let loaded = try loadConfig(yaml, in: folder)
                #expect(try String(describing: loaded.get()) == empty, "\(yaml)")
                checked += 1
            }
        }
        #expect(checked >= 25)
    }

    /// The definition fields whose defaults the loader or the request builder applies.
    @Test func theDefinitionDefaultsInTheTableAreTheLoaders() throws {
        let base = "key: k\nrequest:\n  url: https://h.example/x\n  idempotency_key: false\n"
        func described(_ yaml: String) throws -> String {
            let (definition, diagnostics) = readDefinition(yaml)
            let loaded = try #require(definition, "\(diagnostics)")
            #expect(diagnostics.isEmpty, "\(diagnostics)")
            let inputs = RenderInputs(id: "e1", vars: .null, environment: [:], cwd: "/work")
            let request = try RequestBuilder.prepare(
                request: try #require(loaded.request), definition: loaded, config: Config(root: "/project"), inputs: inputs)
            var withoutRequest = loaded
            withoutRequest.request = nil
            return "\(withoutRequest)\n\(request)"
        }
        let plain = try described(base)
        for name in ["response", "accept", "on_rejected"] {
            guard case let .value(value) = DefinitionFields.top[name].defaultValue else { throw TestFailure("\(name) has no default") }
            #expect(try described(base + "\(name): \(ReferencePage.yaml(value))\n") == plain, "\(name)")
        }
        for name in ["method", "headers", "follow_redirects", "redirect_method_change"] {
            guard case let .value(value) = DefinitionFields.request[name].defaultValue else { throw TestFailure("\(name) has no default") }
            #expect(try described(base + "  \(name): \(ReferencePage.yaml(value))\n") == plain, "request.\(name)")
        }
        let plan = DefinitionFields.plan
        guard case let .value(min) = plan["min"].defaultValue, case let .value(max) = plan["max"].defaultValue,
            case let .value(parts) = plan["max_parts"].defaultValue
        else { throw TestFailure("the plan has no defaults") }
        #expect(try Units.parseSize(min.stringValue ?? "") == ChunkPlan.defaultMin)
        #expect(try Units.parseSize(max.stringValue ?? "") == ChunkPlan.defaultMax)
        #expect(parts.int64Value == Int64(ChunkPlan.defaultMaxParts))
    }

    /// Each filter the reference lists parses as that filter, and the parser knows no other.
    @Test func theTemplateFiltersAndRootsAreTheParsers() throws {
        for filter in TemplateVocabulary.filters {
            let usage = filter.filter == nil ? "\(filter.name)(\"x\")" : filter.name
            #expect(Template.validate("{{ vars.a | \(usage) }}") == nil, "\(usage)")
        }
        let unknown = try #require(Template.validate("{{ vars.a | nope }}"))
        #expect(unknown.contains("(filters: \(TemplateVocabulary.filters.map(\.usage).joined(separator: ", ")))"), "\(unknown)")
        for root in TemplateVocabulary.roots {
            #expect(Template.validate("{{ \(root.name).x }}") == nil, "\(root.name)")
        }
        let badRoot = try #require(Template.validate("{{ nope.x }}"))
        #expect(badRoot.contains("(roots: \(TemplateVocabulary.roots.map(\.name).sorted().joined(separator: ", ")))"), "\(badRoot)")
    }

    /// The repository's config and definitions, as JSON documents, by path.
    static func repositoryDocuments() throws -> [(String, JSON, schema: String)] {
        let root = repositoryRoot
        var found: [(String, JSON, schema: String)] = []
        let all = (FileManager.default.enumerator(atPath: root)?.allObjects as? [String]) ?? []
        for relative in all.sorted() where relative.hasSuffix(".yaml") && !relative.hasPrefix(".build") {
            let kind: String
            if relative.hasSuffix("config/outbox.yaml") {
                kind = "config"
            } else if relative.hasPrefix("definitions/") || relative.contains("/definitions/") {
                kind = "definition"
            } else {
                continue
            }
            let text = try String(contentsOfFile: root + "/" + relative, encoding: .utf8)
            var reader = YAMLReader(path: relative)
            let node = try #require(try YAMLParser.parse(text))
            let json = reader.json(node, relative)
            found.append((relative, try #require(json), kind))
        }
        return found
    }

    @Test func theRepositorysConfigsAndDefinitionsPassTheSchema() throws {
        let documents = try Self.repositoryDocuments()
        #expect(documents.filter { $0.schema == "definition" }.count >= 4)
        #expect(documents.contains { $0.0 == "config/outbox.yaml" })
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let config = try folder.write("config.json", JSONSchemas.config().serialized())
        let definition = try folder.write("definition.json", JSONSchemas.definition().serialized())
        let list = JSON.array(documents.map { .array([.string($0.0), .string($0.schema), $0.1]) })
        let input = try folder.write("documents.json", list.serialized())
        // jsonschema comes from PyPI into the test venv (.ci/run); without it this fails.
        let script = """
            import json, sys
            import jsonschema
            schemas = {"config": json.load(open(sys.argv[1])), "definition": json.load(open(sys.argv[2]))}
            for kind, schema in schemas.items():
                jsonschema.Draft202012Validator.check_schema(schema)
            bad = 0
            examples = 0
            def walk(node, where):
                global bad, examples
                if isinstance(node, dict):
                    for value in node.get("examples", []) + ([node["default"]] if "default" in node else []):
                        examples += 1
                        for error in jsonschema.Draft202012Validator(node).iter_errors(value):
                            bad += 1
                            print(f"{where}: example or default {value!r}: {error.message}")
                    for key, child in node.items():
                        walk(child, f"{where}/{key}")
                elif isinstance(node, list):
                    for i, child in enumerate(node):
                        walk(child, f"{where}/{i}")
            for kind, schema in schemas.items():
                walk(schema, kind)
            print(f"checked {examples} examples and defaults")
            for path, kind, doc in json.load(open(sys.argv[3])):
                for error in jsonschema.Draft202012Validator(schemas[kind]).iter_errors(doc):
                    bad += 1
                    print(f"{path}: {'/'.join(map(str, error.path))}: {error.message}")
            print(f"checked {len(json.load(open(sys.argv[3])))} documents")
            sys.exit(1 if bad else 0)
            """
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-c", script, config, definition, input]
        let out = Pipe()
        process.standardOutput = out
        process.standardError = out
        try process.run()
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        #expect(process.terminationStatus == 0, "\(text)")
        #expect(text.contains("checked \(documents.count) documents"), "\(text)")
        #expect(text.range(of: #"checked [1-9][0-9]+ examples and defaults"#, options: .regularExpression) != nil, "\(text)")
    }
}
