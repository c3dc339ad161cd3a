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

/// Runs plugins: those that answer with JSON on stdout (request_command, headers_command,
/// parsers) and the Wi-Fi check, which answers with its exit status.
package enum Plugin {
    /// A plugin that did not answer: an error the caller may try again later.
    static func failed(_ message: String) -> OutboxError {
        var error = OutboxError.invalid(message)
        error.mayPassLater = true
        return error
    }

    package static func runJSON(
        _ command: CommandSpec, input: JSON, name: String, config: Config,
        environment: [String: String], heartbeat: Heartbeat? = nil
    ) throws(OutboxError) -> JSON {
        let result = try run(
            command, input: input.serializedBytes(), name: name, config: config, environment: environment, heartbeat: heartbeat)
        guard result.succeeded else {
            var firstLine = String(decoding: result.stderr, as: UTF8.self).split(separator: "\n").first.map(String.init) ?? ""
            // The file says why better than the shell does.
            if let why = CommandRef(field: name, command: command).whyNotRun(
                status: result.exitStatus, root: config.root, searchPath: environment["PATH"] ?? ProcessRunner.defaultPath)
            {
                firstLine = why
            }
            let how = result.exitStatus.map { "exited \($0)" } ?? "was killed by signal \(result.signal ?? 0)"
            throw failed("\(name) \(how)\(firstLine.isEmpty ? "" : ": \(firstLine.prefix(200))")")
        }
        var stdout = result.stdout
        guard stdout.contains(where: { ![0x20, 0x09, 0x0A, 0x0D].contains($0) }) else {
            throw failed("\(name) printed nothing; a JSON answer was expected on its stdout")
        }
        do {
            return try JSON.parse(bytes: &stdout)
        } catch {
            throw failed("\(name) printed invalid JSON: \(error)")
        }
    }

    /// A check that answers by its exit status: true on 0, false on another status. Throws
    /// when it cannot start, runs past plugins.timeout or is killed: no answer at all.
    package static func check(
        _ command: CommandSpec, name: String, config: Config, environment: [String: String], heartbeat: Heartbeat? = nil
    ) throws(OutboxError) -> Bool {
        let result = try run(command, input: [], name: name, config: config, environment: environment, heartbeat: heartbeat)
        if let signal = result.signal { throw failed("\(name) was killed by signal \(signal)") }
        // A shell reports a command killed by signal N as status 128+N: no answer either.
        if case .shell = command, let status = result.exitStatus, status > 128, status <= 128 + 64 {
            throw failed("\(name) was killed by signal \(status - 128) (its shell exited \(status))")
        }
        // A shell that could not run the command (126, 127) gives no answer either: the file says why.
        if let why = CommandRef(field: name, command: command).whyNotRun(
            status: result.exitStatus, root: config.root, searchPath: environment["PATH"] ?? ProcessRunner.defaultPath)
        {
            throw failed("\(name) could not start: it exited \(result.exitStatus ?? -1) (\(why))")
        }
        return result.succeeded
    }

    /// Runs it to its end; what is left of its group goes with it (a background child would
    /// outlive the run).
    private static func run(
        _ command: CommandSpec, input: [UInt8], name: String, config: Config, environment: [String: String],
        heartbeat: Heartbeat?
    ) throws(OutboxError) -> ProcessResult {
        var spec = ProcessSpec(
            command: ProcessCommand(command), stdin: input,
            environment: HookEnvironment.withPluginOwner(environment, store: config.store), workingDirectory: config.root,
            outputCap: 16 << 20, timeoutMs: Int(config.pluginTimeoutMs))
        spec.heartbeat = heartbeat
        spec.stopWhenStdoutOverflows = true
        spec.stopGroupWhenLeaderExits = true
        let result: ProcessResult
        do throws(ProcessSpawnError) {
            if Fault.fails("plugin.start") { throw ProcessSpawnError(message: "Too many open files (a test's fault)", transient: true) }
            result = try ProcessRunner.run(spec)
        } catch {
            var failure = failed("\(name) could not start: \(error.message)")
            failure.couldNotStart = error.transient
            throw failure
        }
        if result.abandoned {
            throw failed("\(name) was stopped: the run was asked to stop at once")
        }
        if result.stdoutTruncated {
            throw failed("\(name) printed more than \(Units.formatBytes(Int64(spec.outputCap))) and was stopped")
        }
        if result.timedOut {
            throw failed("\(name) ran past plugins.timeout (\(Units.formatDuration(ms: config.pluginTimeoutMs))) and was stopped")
        }
        return result
    }
}
