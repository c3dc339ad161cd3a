import Foundation

/// The names the binary-driven tests (parts, ownership, folders, S3) grew up with, over
/// `TestProject`, `CommandResult` and `RunningProcess`.
public typealias OutboxRun = CommandResult
public typealias OutboxProcess = RunningProcess

extension CommandResult {
    /// The exit status (`exitCode`).
    public var status: Int32 { exitCode }
}

/// A project with `config/outbox.yaml` (`config` as its text) whose `show` and `list`
/// answer in Foundation types, for `as? [String: Any]` checks.
public final class OutboxSandbox: TestProject, @unchecked Sendable {
    public init(config: String = "", function: String = #function) throws {
        try super.init(config: config, name: function)
    }

    /// An executable built next to the test bundle (`outbox`, `outbox-testserver`).
    public static func binary(_ name: String) -> String { builtExecutable(name) }

    /// `outbox show ID --json` as a dictionary.
    public func show(_ id: String) async throws -> [String: Any]? {
        try await outbox(["show", id, "--json"]).jsonObject as? [String: Any]
    }

    /// `outbox list --json` rows.
    public func list() async throws -> [[String: Any]] {
        (try await outbox(["list", "--json"]).jsonObject as? [[String: Any]]) ?? []
    }
}
