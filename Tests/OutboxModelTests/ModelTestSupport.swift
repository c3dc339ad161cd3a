import Foundation
@testable import OutboxModel

/// A fresh folder per test (removed by `remove()`), so tests can run in parallel.
struct ModelTempFolder {
    let path: String

    init() throws {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("outbox-model-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    /// Writes `text` at `relative` (creating folders) and returns the absolute path.
    @discardableResult
    func write(_ relative: String, _ text: String) throws -> String {
        let full = (path as NSString).appendingPathComponent(relative)
        try FileManager.default.createDirectory(atPath: (full as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        try text.write(toFile: full, atomically: false, encoding: .utf8)
        return full
    }

    func remove() { try? FileManager.default.removeItem(atPath: path) }
}

/// Loads a config text written at `folder/config/outbox.yaml`; returns the error if it fails.
func loadConfig(_ text: String, in folder: ModelTempFolder) throws -> Result<Config, OutboxError> {
    let file = try folder.write("config/outbox.yaml", text)
    do throws(OutboxError) {
        return .success(try Config.load(file: file))
    } catch {
        return .failure(error)
    }
}

/// Reads one definition from text, with the diagnostics it produced.
func readDefinition(_ yaml: String, path: String = "/defs/test.yaml") -> (Definition?, [Diagnostic]) {
    var reader = YAMLReader(path: path)
    let definition = Definition.read(text: yaml, reader: &reader)
    return (definition, reader.diagnostics)
}

/// Like `readDefinition`, with the diagnostics in file order (as `DefinitionSet` reports them).
func readDefinitionInSourceOrder(_ yaml: String, path: String = "/defs/test.yaml") -> (Definition?, [Diagnostic]) {
    var reader = YAMLReader(path: path)
    let definition = Definition.read(text: yaml, reader: &reader)
    return (definition, reader.diagnosticsInSourceOrder)
}

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}
