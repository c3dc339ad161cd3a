import Foundation
import Testing

@testable import OutboxModel

/// The parsing cases of JSONTestSuite (Fixtures/JSONTestSuite, MIT, by Nicolas Seriot):
/// every `y_` file is accepted, every `n_` file refused, and every `i_` file (what the RFC
/// leaves to the parser) either, without a crash.
@Suite struct JSONTestSuiteTests {
    static let folder = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures/JSONTestSuite").path

    /// The case files by name; empty when the folder is missing, which `theCasesAreAllThere` reports.
    static let files: [String] = ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? [])
        .filter { $0.hasSuffix(".json") }.sorted()

    /// Valid JSON that outbox refuses on purpose: a repeated key in vars or a body would keep
    /// one value and drop the other without a word, so the parser says which key repeats.
    static let refusedDuplicateKeys: Set<String> = ["y_object_duplicated_key.json", "y_object_duplicated_key_and_value.json"]

    @Test func theCasesAreAllThere() {
        #expect(Self.files.count == 318, "\(Self.folder)")
        #expect(Self.files.filter { $0.hasPrefix("y_") }.count == 95)
        #expect(Self.files.filter { $0.hasPrefix("n_") }.count == 188)
        #expect(Self.files.filter { $0.hasPrefix("i_") }.count == 35)
        #expect(Self.refusedDuplicateKeys.isSubset(of: Self.files))
    }

    @Test(arguments: files)
    func parserAnswersTheCase(_ name: String) throws {
        var bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: Self.folder + "/" + name)))
        let result = Result { () throws(JSONParseError) in try JSON.parse(bytes: &bytes) }
        switch name.prefix(2) {
        case "y_" where Self.refusedDuplicateKeys.contains(name):
            guard case let .failure(error) = result else {
                Issue.record("\(name): a repeated key was accepted")
                return
            }
            #expect(error.message.hasPrefix("duplicate key"), "\(name): \(error)")
        case "y_":
            if case let .failure(error) = result { Issue.record("\(name): refused: \(error)") }
        case "n_":
            if case let .success(value) = result { Issue.record("\(name): accepted as \(value.serialized().prefix(80))") }
        default:
            // Either answer is right; reaching here means the parser did not crash.
            break
        }
    }
}
