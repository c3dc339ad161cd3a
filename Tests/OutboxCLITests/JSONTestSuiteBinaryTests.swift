import Foundation
import OutboxModel
import Testing
import TestSupport

/// JSONTestSuite's parsing cases as `outbox enqueue KEY --vars @FILE` through the built
/// binary, in a project made by `outbox init`: no case crashes it, and no refused case
/// leaves anything in the store.
struct JSONTestSuiteBinaryTests {
    static let folder = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("OutboxModelTests/Fixtures/JSONTestSuite").path

    /// Valid JSON with a repeated key, which outbox refuses on purpose.
    static let duplicateKeys: Set<String> = ["y_object_duplicated_key.json", "y_object_duplicated_key_and_value.json"]

    @Test func everyCaseEnqueuesOrIsRefusedWithoutACrash() async throws {
        let files = ((try? FileManager.default.contentsOfDirectory(atPath: Self.folder)) ?? []).filter { $0.hasSuffix(".json") }.sorted()
        try #require(files.count == 318, "JSONTestSuite cases missing in \(Self.folder)")
        let p = try TestProject(config: nil)
        let initialized = try await p.outbox(["init"])
        try #require(initialized.exitCode == 0, "init: \(initialized)")
        // Takes any vars: what is checked here is only how --vars is read.
        try p.define("any-vars", "key: any.vars\nrequest:\n  url: http://127.0.0.1:9/any\n  data: {fixed: 1}\n")

        var accepted: [String] = []
        for (n, name) in files.enumerated() {
            let id = "case-\(n)"
            let r = try await p.outbox(["enqueue", "any.vars", "--id", id, "--vars", "@" + Self.folder + "/" + name], timeout: 60)
            #expect(r.exitCode >= 0 && r.exitCode < 128 && !r.timedOut, "\(name): \(r)")
            if r.exitCode == 0 { accepted.append(id) }
            switch name.prefix(2) {
            case "n_":
                #expect(r.exitCode == 65 && r.stderr.hasPrefix("outbox: E_INVALID: --vars"), "\(name) was not refused as bad vars: \(r)")
            case "y_" where Self.duplicateKeys.contains(name):
                #expect(r.exitCode == 65 && r.stderr.contains("duplicate key"), "\(name): \(r)")
            case "y_":
                // Valid JSON: an object enqueues; any other value (null too) is refused as vars
                // that are not an object.
                let text = try String(contentsOfFile: Self.folder + "/" + name, encoding: .utf8)
                let value = try JSON.parse(text)
                let enqueues = value.objectValue != nil
                #expect(enqueues ? r.exitCode == 0 : r.exitCode == 65 && r.stderr.contains("vars"), "\(name): \(r)")
            default:
                #expect(r.exitCode == 0 || r.exitCode == 65, "\(name): \(r)")
            }
        }

        // The store holds exactly the accepted cases: a refused one left nothing behind.
        let list = try await p.outbox(["list", "--json"])
        #expect(list.exitCode == 0, "list: \(list)")
        let ids = list.json?.arrayValue?.compactMap { $0["id"]?.stringValue } ?? []
        #expect(ids.sorted() == accepted.sorted())
        #expect(!accepted.isEmpty)
    }
}
