import CSystem
import OutboxModel
import OutboxRunner
import Glibc
import OutboxStore
import Synchronization

enum RunCommand {
    static let options: [OptionSpec] = [
        OptionSpec(name: "drain", valueName: nil, help: "return when nothing is due within the horizon (for cron and timers)"),
        OptionSpec(name: "horizon", valueName: "D", help: "with --drain: how far ahead counts as due (default 10s)", completes: .nothing),
        OptionSpec(name: "max-time", valueName: "D", help: "stop after this long, as on SIGTERM", completes: .nothing),
        OptionSpec(
            name: "grace", valueName: "D", help: "on stop, how long attempts in flight may finish (default 30s)", completes: .nothing),
        OptionSpec(
            name: "events", valueName: "-", help: "write state, progress and attempt events as JSON lines to stdout",
            completes: .words(["-"])),
        OptionSpec(
            name: "progress", valueName: "auto|always|never", help: "the live display on a terminal (default auto)",
            completes: .words(["auto", "always", "never"])),
        OptionSpec(
            name: "concurrency", valueName: "N", help: "entries in flight at once, 1-1024 (default: the config's concurrency)",
            completes: .nothing),
        OptionSpec(
            name: "per-host", valueName: "N", help: "requests in flight to one host, 1-256 (default: the config's per_host)",
            completes: .nothing),
        OptionSpec(
            name: "part-concurrency", valueName: "N",
            help: "parts of one chunked entry in flight, 1-64 (default: the config's part_concurrency)", completes: .nothing),
        OptionSpec(
            name: "metrics-listen", valueName: "ADDR",
            help: "serve GET /metrics (Prometheus) on [HOST:]PORT, 127.0.0.1 unless HOST names an address", completes: .nothing),
        OptionSpec(
            name: "log-format", valueName: "text|json", help: "log lines on stderr as text (default) or one JSON object a line",
            completes: .words(["text", "json"])),
        OptionSpec(name: "quiet", valueName: nil, help: "log only warnings and errors"),
        OptionSpec(name: "verbose", valueName: nil, help: "log debug lines too (also -v)"),
        CLI.json,
    ]
    static let details = """
        Runs until SIGINT or SIGTERM (the first lets attempts in flight finish within --grace; a
        second stops at once), or with --drain until nothing is due. One runner holds a store at a time.
        """

    static func run(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        var options = RunOptions()
        // First: a SIGHUP while the store opens asks for a reload, as later; it must not end the run.
        options.reloadRequests = StopSignals.installReload()
        try Runner.checkOpenFilesLimit()
        options.drain = i.args.flag("drain")
        func duration(_ name: String) throws(OutboxError) -> Int64? {
            guard let text = i.args.value(name) else { return nil }
            do { return try Units.parseDuration(text) } catch { throw .usage("--\(name): \(error.message)") }
        }
        if let h = try duration("horizon") {
            guard options.drain else { throw .usage("--horizon goes with --drain") }
            options.horizonMs = h
        }
        options.maxTimeMs = try duration("max-time")
        if let g = try duration("grace") { options.graceMs = g }
        let events = i.args.value("events")
        if let events, events != "-" { throw .usage("--events takes - (stdout); use events.command in the config for a plugin") }
        if events != nil && i.json { throw .usage("--json cannot be combined with --events -") }
        if let p = i.args.value("progress") {
            guard let mode = ProgressMode(rawValue: p) else {
                throw .usage("--progress takes auto, always or never, not \(Units.quoted(p, limit: 40))")
            }
            options.progress = mode
        }
        options.stderrIsTerminal = i.console.stderrIsTerminal
        options.eventsToTerminal = events != nil && i.console.stdoutIsTerminal
        for (flag, range, limit) in [
            ("concurrency", 1...1024, \LimitOverrides.concurrency), ("per-host", 1...256, \.perHost),
            ("part-concurrency", 1...64, \.partConcurrency),
        ] as [(String, ClosedRange<Int>, WritableKeyPath<LimitOverrides, Int?>)] {
            guard let text = i.args.value(flag) else { continue }
            guard let n = Units.wholeNumber(text, in: range) else {
                throw .usage(
                    "--\(flag) takes a whole number from \(range.lowerBound) to \(range.upperBound), not \(Units.quoted(text, limit: 20))")
            }
            options.limits[keyPath: limit] = n
        }
        guard let format = LogFormat(rawValue: i.args.value("log-format") ?? "text") else {
            throw .usage("--log-format takes text or json, not \"\(i.args.value("log-format")?.prefix(20) ?? "")\"")
        }
        if i.args.flag("quiet") && i.args.flag("verbose") { throw .usage("--quiet and --verbose (-v) cannot be combined") }
        let metricsAddress = try i.args.value("metrics-listen").map { (text) throws(OutboxError) in try MetricsListener.Address.parse(text)
        }
        let project = try i.project()
        // A runner that reads no definitions would send, then hold every outcome unhandled.
        if let problem = project.definitionsFolderProblem { throw OutboxError(.config, problem) }
        var config = project.config
        options.limits.apply(to: &config)
        let store = try project.store()
        let lock = try store.lockForRunner()
        defer { lock.release() }
        options.stopRequests = StopSignals.install()
        let console = i.console
        let logger = Logger(
            format: format, minimum: i.args.flag("quiet") ? .warn : i.args.flag("verbose") ? .debug : .info,
            write: { console.err($0) })
        let metrics = try metricsAddress.map { (address) throws(OutboxError) in
            try MetricsListener(
                address: address, contentType: Statistics.prometheusContentType, render: metricsPage(config: config))
        }
        defer { metrics?.stop() }
        if let metrics { logger.log(.info, "outbox: metrics at \(metrics.url)") }
        // Under systemd: ready once the store is ours (and the metrics address, if asked).
        options.notifier = SystemdNotifier(environment: i.environment)
        options.notifier?.send("READY=1\nMAINPID=\(getpid())")
        // A reader of `--events -` or of the log that stops reading holds the runner only until a stop.
        let stopRequests = options.stopRequests
        let stopAt = options.maxTimeMs.map { Identifiers.monotonicMs() + $0 }
        console.stopWaitingForOutput { stopRequests() > 0 || stopAt.map { Identifiers.monotonicMs() >= $0 } ?? false }
        let liveLine = LiveLine(write: { console.rawErr($0) })
        options.drawProgress = { liveLine.draw($0) }
        let sink = EventSink(
            console: events != nil ? console : nil, command: config.eventsCommand, config: config,
            environment: i.environment, log: { line in liveLine.logging { logger.log(.warn, line) } })
        defer { sink.close() }
        let runner = Runner(
            config: config, definitions: project.definitions, store: store, environment: i.environment, cwd: try i.cwd,
            options: options, emit: { sink.send($0) }, logger: logger)
        runner.eventsEnabled = events != nil || config.eventsCommand != nil
        let environment = i.environment
        runner.eventsReload = { sink.reload(command: $0.eventsCommand, config: $0, environment: environment) }
        runner.runnerLock = lock
        let summary = try runner.run()
        // The plugin's last output and its drops are logged before the summary line.
        sink.close()
        if i.json {
            console.out(summary.json.serialized())
        } else {
            logger.log(summary.failureStatus == 0 ? .info : .warn, summary.line, fields: [("summary", summary.json)])
        }
        // A drain is what cron and timers call: it says, by its status, whether anything failed.
        return options.drain ? summary.failureStatus : 0
    }
}

/// The metrics page, read from the store through a connection of the listener's own thread
/// (opened at the first request), so scrapes never wait for the runner.
private func metricsPage(config: Config) -> @Sendable () -> (status: Int, body: String) {
    final class Connection: @unchecked Sendable { var store: (any Store)? }
    let connection = Connection()
    return {
        // A connection the store lost (a PostgreSQL server restarted) is opened again: at once,
        // and else at the next scrape; kept, it would answer 500 until the runner stopped.
        var answer = (status: 500, body: "")
        for _ in 0..<2 {
            do throws(OutboxError) {
                if connection.store == nil { connection.store = try Project.openStore(config) }
                return (200, try Statistics.read(from: connection.store!, now: Identifiers.nowMs()).prometheus)
            } catch {
                connection.store = nil
                answer = (500, "\(error.code.rawValue): \(error.message)\n")
                if error.code != .storage { break }
            }
        }
        return answer
    }
}

/// SIGINT and SIGTERM while `outbox run` runs: counted, and read by the runner each turn
/// (the first drains, the second stops at once); SIGQUIT stops at once; SIGHUP: a reload. A
/// signal the parent had ignored (a script's `&` job ignores SIGINT and SIGQUIT, `nohup`
/// SIGHUP) stays ignored. The library installs no handler itself.
enum StopSignals {
    static let count = Atomic<Int>(0)

    static func install() -> @Sendable () -> Int {
        count.store(0, ordering: .relaxed)
        let stop: @convention(c) (Int32) -> Void = { _ in StopSignals.count.add(1, ordering: .relaxed) }
        handle(SIGINT, stop)
        handle(SIGTERM, stop)
        // Quit means now: as two stop requests, so hooks and transfers are stopped and put back.
        handle(SIGQUIT) { _ in StopSignals.count.add(2, ordering: .relaxed) }
        return { count.load(ordering: .relaxed) }
    }

    static let reloads = Atomic<Int>(0)

    /// SIGHUP asks the runner to read its config and definitions again.
    static func installReload() -> @Sendable () -> Int {
        reloads.store(0, ordering: .relaxed)
        handle(SIGHUP) { _ in StopSignals.reloads.add(1, ordering: .relaxed) }
        return { reloads.load(ordering: .relaxed) }
    }

    /// Installs `handler` unless the signal was ignored when the process started, and unblocks
    /// it: a parent may have started us with it blocked (e.g. spawned from a libdispatch worker
    /// thread, which blocks signals), and then it would never reach the handler.
    private static func handle(_ number: Int32, _ handler: @convention(c) (Int32) -> Void) {
        guard csystem_signal_ignored(number) == 0 else { return }
        signal(number, handler)
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, number)
        pthread_sigmask(SIG_UNBLOCK, &set, nil)
    }
}
