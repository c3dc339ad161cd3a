import Foundation
import OutboxModel
import TestSupport
import Testing

/// `outbox schema` prints JSON Schemas without a project.
struct SchemaCommandTests {
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
        #expect(r.out == ReferencePage.markdown() + "\n")
        #expect(r.out.hasPrefix("# outbox reference\n"))
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
