import Foundation

/// A product built by `swift build` (`outbox`, `outbox-testserver`): it sits next to the test
/// bundle, which `swift test` builds with every product.
package func builtExecutable(_ name: String) -> String {
    var folder = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    // The runner may be `X.xctest` itself (Linux) or sit inside `X.xctest/...` (macOS).
    while folder.pathExtension == "xctest" || folder.path.contains(".xctest/") {
        folder = folder.deletingLastPathComponent()
    }
    let beside = folder.appendingPathComponent(name).path
    if FileManager.default.isExecutableFile(atPath: beside) { return beside }
    // Else the package's debug build (#filePath is Tests/TestSupport/BuiltExecutables.swift).
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    return root.appendingPathComponent(".build/debug/\(name)").path
}
