import OutboxModel
import OutboxProcess

extension ProcessCommand {
    package init(_ spec: CommandSpec) {
        switch spec {
        case let .shell(s): self = .shell(s)
        case let .argv(a): self = .argv(a)
        }
    }
}

/// Runs a plugin that answers with JSON on stdout (request_command, headers_command, parsers).
package enum Plugin {
    package static func runJSON(
        _ command: CommandSpec, input: JSON, name: String, config: Config,
        environment: [String: String], heartbeat: Heartbeat? = nil
    ) throws(OutboxError) -> JSON {
        var spec = ProcessSpec(
            command: ProcessCommand(command), stdin: input.serializedBytes(),
            environment: environment, workingDirectory: config.root, outputCap: 16 << 20,
            timeoutMs: Int(config.pluginTimeoutMs))
        spec.heartbeat = heartbeat
        spec.stopWhenStdoutOverflows = true
        spec.stopGroupWhenLeaderExits = true
        let result: ProcessResult
        do {
            result = try ProcessRunner.run(spec)
        } catch {
            throw .invalid("\(name) could not start: \(error.message)")
        }
        if result.stdoutTruncated {
            throw .invalid("\(name) printed more than \(Units.formatBytes(Int64(spec.outputCap))) and was stopped")
        }
        if result.timedOut {
            throw .invalid("\(name) ran past plugins.timeout (\(Units.formatDuration(ms: config.pluginTimeoutMs))) and was stopped")
        }
        guard result.succeeded else {
            let firstLine = String(decoding: result.stderr, as: UTF8.self).split(separator: "\n").first.map(String.init) ?? ""
            let how = result.exitStatus.map { "exited \($0)" } ?? "was killed by signal \(result.signal ?? 0)"
            throw .invalid("\(name) \(how)\(firstLine.isEmpty ? "" : ": \(firstLine.prefix(200))")")
        }
        do {
            var stdout = result.stdout
            return try JSON.parse(bytes: &stdout)
        } catch {
            throw .invalid("\(name) printed invalid JSON: \(error)")
        }
    }
}
