import Foundation

/// The names the binary-driven tests (parts, ownership, folders, S3) grew up with, over
/// `TestProject`, `CommandResult` and `RunningProcess`.
package typealias OutboxRun = CommandResult
package typealias OutboxProcess = RunningProcess

extension CommandResult {
    /// The exit status (`exitCode`).
    package var status: Int32 { exitCode }
}

/// A project with `config/outbox.yaml` (`config` as its text) whose `show` and `list`
/// answer in Foundation types, for `as? [String: Any]` checks.
package final class OutboxSandbox: TestProject, @unchecked Sendable {
    package init(config: String = "", function: String = #function) throws {
        try super.init(config: config, name: function)
    }

    /// An executable built next to the test bundle (`outbox`, `outbox-testserver`).
    package static func binary(_ name: String) -> String { builtExecutable(name) }

    /// `outbox show ID --json` as a dictionary.
    package func show(_ id: String) async throws -> [String: Any]? {
        try await outbox(["show", id, "--json"]).jsonObject as? [String: Any]
    }

    /// `outbox list --json` rows.
    package func list() async throws -> [[String: Any]] {
        (try await outbox(["list", "--json"]).jsonObject as? [[String: Any]]) ?? []
    }
}
