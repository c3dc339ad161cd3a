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

    /// The repository's config and definitions, as JSON documents, by path.
    static func repositoryDocuments() throws -> [(String, JSON, schema: String)] {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
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
    }
}
