import Foundation
import OutboxModel
import TestSupport
@testable import OutboxCLI
import Testing

/// `outbox schema` prints JSON Schemas without a project.
struct SchemaCommandTests {
    static let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path
    @Test(arguments: ["config", "definition"])
    func printsASchemaWithoutAProject(_ kind: String) throws {
        let p = try TestProject(config: nil)
        let r = p.run(["schema", kind])
        #expect(r.status == 0, "\(r)")
        let schema = try r.json()
        #expect(schema["$schema"] == .string("https://json-schema.org/draft/2020-12/schema"))
        #expect(schema["type"] == .string("object"))
        #expect(schema["additionalProperties"] == .bool(false))
    }

    @Test func printsTheReferencePageWithoutAProject() throws {
        let p = try TestProject(config: nil)
        let r = p.run(["schema", "reference"])
        #expect(r.status == 0, "\(r)")
        #expect(r.out.hasPrefix("# outbox reference\n"))
        // Every command and each option its help offers has its place on the page.
        for command in CLI.commands {
            #expect(r.out.contains("### `outbox \(command.name)`"), "\(command.name)")
            for option in command.visibleOptions {
                #expect(
                    r.out.contains("| `\(command.optionLabel(option).replacing("|", with: "\\|"))` |"), "\(command.name) --\(option.name)")
            }
        }
        let committed = try String(contentsOfFile: Self.repositoryRoot + "/docs/reference.md", encoding: .utf8)
        let firstDifference = zip(committed.split(separator: "\n"), r.out.split(separator: "\n")).enumerated()
            .first { $0.element.0 != $0.element.1 }
        #expect(
            committed == r.out,
            """
            docs/reference.md is out of date: run `outbox schema reference > docs/reference.md` \
            (first difference at line \((firstDifference?.offset ?? 0) + 1): \(firstDifference.map { "\($0.element.0)" } ?? "length"))
            """)
        #expect(!p.storeExists)
    }

    @Test(arguments: [["schema"], ["schema", "yaml"], ["schema", "config", "definition"], ["schema", "reference", "config"]])
    func aBadKindIsAUsageError(_ arguments: [String]) throws {
        let p = try TestProject(config: nil)
        let r = p.run(arguments)
        #expect(r.status == 64, "\(r)")
        #expect(r.out.isEmpty)
        #expect(!p.storeExists)
    }
}
