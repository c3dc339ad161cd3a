import Glibc
import OutboxEnqueue
import OutboxModel
import OutboxProcess

/// Where event lines go: stdout (`--events -`) and/or a long-lived `events.command` plugin.
/// Events to the plugin are best-effort: a plugin that reads slowly loses lines (counted
/// and logged at the end) rather than stalling the runner.
package final class EventSink {
    let write: ((String) -> Void)?
    let console: (any EventConsole)?
    let log: @Sendable (String) -> Void
    var plugin: StreamingChild?
    /// Set once lost stdout has been reported, so a long run says it once, at once.
    var reportedLostOutput = false
    /// Lines of the plugin's output logged so far; past `pluginLinesLogged` the rest is dropped.
    var pluginLines = 0
    static let pluginLinesLogged = 1000
    /// When the plugin's output was last read (monotonic ms): at most every 100 ms, not at
    /// every event (two reads each).
    var pluginOutputReadAt: Int64 = 0

    /// The `events.command` the plugin was started with.
    private(set) var command: CommandSpec?
    /// How long a plugin whose input was closed has to exit before its group is killed.
    let closeGraceMs: Int64
    /// Threads ending plugins a reload replaced: joined by `close`, so none outlives the run.
    private var endingThreads: [pthread_t] = []

    package init(
        console: (any EventConsole)?, command: CommandSpec?, config: Config, environment: [String: String],
        log: @escaping @Sendable (String) -> Void, closeGraceMs: Int64 = 2000
    ) {
        self.closeGraceMs = closeGraceMs
        write = console.map { c in { c.out($0) } }
        self.console = console
        self.log = log
        start(command, config: config, environment: environment)
    }

    private func start(_ command: CommandSpec?, config: Config, environment: [String: String]) {
        self.command = command
        guard let command else { return }
        do {
            plugin = try StreamingChild.start(
                ProcessSpec(
                    command: ProcessCommand(command), environment: HookEnvironment.withPluginOwner(environment, store: config.store),
                    workingDirectory: config.root))
        } catch {
            log("outbox: events.command: \(error.message); events go to no plugin")
        }
    }

    /// After a reload (SIGHUP): a changed `events.command` is ended as at the end of a run
    /// (its input closed, 2 s to exit) and the new one started; an unchanged one runs on.
    /// The old one ends on a thread of its own: the runner never waits on `events.command`.
    /// Returns whether events have a reader now.
    package func reload(command: CommandSpec?, config: Config, environment: [String: String]) -> Bool {
        if command != self.command {
            if let old = plugin {
                plugin = nil
                let handoff = Handoff(plugin: old, linesLogged: pluginLines)
                let (log, grace) = (log, closeGraceMs)
                let body: @Sendable () -> Void = {
                    var lines = handoff.linesLogged
                    for line in Self.end(handoff.plugin, graceMs: grace, linesLogged: &lines) { log(line) }
                }
                switch Threads.start(detached: false, body) {
                case let .success(thread): endingThreads.append(thread)
                case .failure: body()
                }
            }
            pluginLines = 0
            start(command, config: config, environment: environment)
        }
        return write != nil || plugin != nil
    }

    /// A plugin handed to the thread that ends it; this side no longer touches it.
    private struct Handoff: @unchecked Sendable {
        let plugin: StreamingChild
        let linesLogged: Int
    }

    package func send(_ event: JSON) {
        // Without a reader, serializing every event costs the runner real time.
        guard write != nil || plugin != nil else { return }
        let line = event.serialized()
        write?(line)
        if let plugin {
            plugin.send(line: line)
            let now = Identifiers.monotonicMs()
            if now - pluginOutputReadAt >= 100 {
                pluginOutputReadAt = now
                logPluginOutput(plugin.takeOutput())
            }
        }
        if !reportedLostOutput, let lost = console?.outputLost {
            reportedLostOutput = true
            log("outbox: events to stdout are being lost (\(lost)); the run goes on and will end with E_STORAGE")
        }
    }

    /// Closes the plugin's stdin and gives it 2 s to finish before its group is killed; and
    /// waits for the ends of plugins a reload replaced, which get the same.
    package func close() {
        if let plugin {
            self.plugin = nil
            for line in Self.end(plugin, graceMs: closeGraceMs, linesLogged: &pluginLines) { log(line) }
        }
        for thread in endingThreads { pthread_join(thread, nil) }
        endingThreads.removeAll()
    }

    /// Ends a plugin; returns the log lines that say how: its last output, and what it lost.
    static func end(_ plugin: StreamingChild, graceMs: Int64, linesLogged: inout Int) -> [String] {
        plugin.close(graceMs: graceMs)
        var log = outputLines(plugin.takeOutput(), linesLogged: &linesLogged)
        let events = "\(plugin.dropped) event\(plugin.dropped == 1 ? " was" : "s were")"
        // A plugin that failed says so; one gone before the run ended is not slow but stopped.
        let failed = plugin.ended.flatMap { e in
            e.signal.map { "was killed by signal \($0)" } ?? (e.status == 0 ? nil : "exited \(e.status ?? -1)")
        }
        if plugin.stoppedReading {
            log.append("outbox: events.command \(failed ?? "stopped reading its input") before the run ended: \(events) not delivered")
        } else {
            if let failed { log.append("outbox: events.command \(failed)") }
            // Killed at the end, it may not have handled the last lines it read.
            if plugin.killedAfterGrace {
                log.append(
                    "outbox: events.command did not exit within \(Units.formatDuration(ms: graceMs)) of its input's end and was stopped")
            }
            if plugin.dropped > 0 { log.append("outbox: events.command did not keep up: \(events) dropped") }
        }
        return log
    }

    /// The plugin's output goes to the log, never to stdout (where `run --json` prints its
    /// document): a line each, control characters escaped, up to a number of lines a run.
    func logPluginOutput(_ lines: [String]) {
        for line in Self.outputLines(lines, linesLogged: &pluginLines) { log(line) }
    }

    static func outputLines(_ lines: [String], linesLogged: inout Int) -> [String] {
        var out: [String] = []
        for line in lines {
            linesLogged += 1
            if linesLogged <= pluginLinesLogged {
                out.append("events.command: \(TerminalText.visible(line))")
            } else if linesLogged == pluginLinesLogged + 1 {
                out.append("events.command: printed more than \(pluginLinesLogged) lines; the rest is not logged")
            }
        }
        return out
    }
}

/// Something that prints lines on stdout (the CLI's console).
package protocol EventConsole: AnyObject {
    func out(_ line: String)
    /// Why lines written to stdout were lost (a full disk), or nil.
    var outputLost: String? { get }
}
