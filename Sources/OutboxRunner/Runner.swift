import CSystem
import Glibc
import OutboxEnqueue
import OutboxHTTP
import OutboxModel
import OutboxProcess
import OutboxStore

/// Sends queued entries, settles their outcomes, and delivers them to hooks.
///
/// One control thread (the caller's) owns the store connection and every decision; the
/// curl thread and hook threads only post events to its mailbox. Each turn of the loop
/// handles the events of the last wait, claims and starts work, and commits the turn's
/// changes in one transaction (group commit). The decisions are values tested on their
/// own (`Scheduler`, `Shutdown`, `OutcomePayloads`); the rooms of this class carry them
/// out: claiming, sending, parts, results, settling, delivery, events.
package final class Runner {
    var config: Config
    var definitions: DefinitionSet
    let store: any Store
    let environment: [String: String]
    /// `environment` checked and encoded once for every hook of the run.
    let hookEnvironment: EncodedEnvironment
    let options: RunOptions
    var factory: EntryFactory
    var scheduler: Scheduler
    let emit: (JSON) -> Void
    /// The log (stderr); use `log(_:)`, which keeps the live display intact.
    let logger: Logger
    let lease: Lease
    let mailbox = Mailbox<RunnerEvent>()
    var http: HTTPClient?

    /// Transfers, slots and the entries this runner holds.
    var flights = Flights()
    /// Due entries read ahead of their claim.
    var readAhead = ReadAhead()
    /// Hooks running, and when to look for deliverable outcomes.
    var delivery = DeliveryState()
    /// What other processes set (pauses, Wi-Fi, header generation), and when it was read.
    var control = QueueControl()
    var seenDataVersion: Int64?
    /// This turn's store changes, committed together by `flush`.
    var changes: [RunnerChange] = []
    /// Additions to the store's counters since the last flush.
    var counters = CounterTally()
    /// Set when an outcome of a key without a definition was settled: flush marks it unhandled-key.
    var settledUnhandled = false
    var lastAuthRefresh: Int64 = -60_000
    /// `auth_refresh_command` runs beside this thread now.
    var authRefreshRunning = false
    /// When `expireParked` last looked (epoch ms); the first turn looks at once.
    var lastParkedExpiry: Int64 = -60_000
    /// Why the Wi-Fi check plugin last gave no answer, logged once until it answers again.
    var wifiCheckProblem: String?
    /// On a shared store, no new standby claims before this (monotonic ms): see `returnStaleStandby`.
    var standbyHeldUntil: Int64 = 0
    /// When this runner next renews its leases (monotonic ms); the first turn does it at once.
    var nextLeaseTick: Int64 = 0
    /// When this runner last renewed its leases (monotonic ms).
    var leasesRenewedAt: Int64 = Identifiers.monotonicMs()
    /// Entries whose lease renewal failed, stopped by the turn's `keepLeases`.
    var leasesLost: Set<String> = []
    /// Among them, those gone from the store while this runner's lease still held: cancelled.
    var cancelledWhileHeld: Set<String> = []
    /// The others: taken by another runner, or gone after this runner's lease ran out. A
    /// settle of one that the store refuses is no cancel.
    var leaseLostIDs: Set<String> = []
    /// A drain's horizon: retries and delays due after it are not claimed in this run.
    var drainHorizon: Int64?
    /// The store's runner lock, looked at once a second (`keepRunnerLock`).
    package var runnerLock: (any RunnerLock)?
    var nextLockCheck: Int64 = 0
    /// Set when another runner took entries or deliveries this turn chose: the next turn
    /// comes soon instead of after the usual wait.
    var contended = false
    /// The Wi-Fi check's last answer, shared by every wifi-only entry.
    var wifiGate: WifiGate
    /// Hosts held after connection failures.
    var hostHealth: HostHealth
    /// Settles of this turn, reported (state events, summary) once the store has applied
    /// them: a settle that another process's cancel beat is reported as that cancel.
    var pendingSettles: [(entry: Entry, state: EntryState, reason: String?)] = []
    var requestIDs = FastRandom()
    var reloadsSeen = 0
    /// Entries parked awaiting-auth in this run, in order: a park is a failure of the run
    /// even when an auth refresh sends the entry again before it ends.
    var parkedInRun: [String] = []
    /// This runner's account (config `account`, from its environment): entries of another are dropped.
    var account: String?
    /// The soft open-files limit, raised to the hard one as the runner starts; <= 0 when unknown.
    let openFilesLimit = Int(csystem_raise_open_files())
    /// What that limit leaves for transfers and cached connections.
    var openFiles: OpenFilesBudget

    /// Running, draining or aborting: stepped each turn, and while a plugin runs.
    var shutdown: Shutdown
    /// Plugins killed because the run had to stop at once (`pluginMustStop`).
    var pluginsAbandoned = 0
    /// The keys whose `then` follow-ups may run a plugin to be built (see `followUpsRunPlugins`),
    /// known once per load: asked at every transfer's start.
    var chainsWithPlugins: Set<String> = []
    /// Set once the run stops at once: the plugins that run beside this thread are killed.
    let pluginsStop = Locked(false)
    var summary = RunSummary()
    var progressDisplay: ProgressDisplay?
    var progressGate = ProgressGate()
    /// False when nothing reads events: state and progress lines are then not even built.
    package var eventsEnabled = true
    /// Told the config a reload read (the CLI restarts a changed `events.command`); returns
    /// whether events have a reader now.
    package var eventsReload: ((Config) -> Bool)?

    package init(
        config: Config, definitions: DefinitionSet, store: any Store, environment: [String: String], cwd: String,
        options: RunOptions, emit: @escaping (JSON) -> Void, logger: Logger
    ) {
        self.config = config
        self.definitions = definitions
        self.store = store
        self.environment = environment
        hookEnvironment = EncodedEnvironment(environment)
        self.options = options
        self.emit = emit
        self.logger = logger
        shutdown = Shutdown(startedAt: Identifiers.monotonicMs(), graceMs: options.graceMs, maxTimeMs: options.maxTimeMs)
        lease = Lease(owner: "pid-\(getpid())-\(Identifiers.uuid().prefix(8))", durationMs: config.leaseMs)
        wifiGate = WifiGate(intervalMs: config.wifiIntervalMs)
        hostHealth = HostHealth(holdAfter: config.hostHoldAfter)
        openFiles = Self.openFilesBudget(config, limit: openFilesLimit)
        scheduler = Scheduler(limits: Self.limits(config, concurrency: openFiles.concurrency, sharedStore: store.sharesRunners))
        factory = Self.factory(config: config, definitions: definitions, environment: environment, cwd: cwd)
        chainsWithPlugins = Self.chainsWithPlugins(config, definitions)
        // Its factory renders an unset variable as no account: it cannot fail.
        account = (try? factory.account()) ?? nil
    }

    /// Moves the shutdown on with the clock and the stop requests, and does what it says.
    func stepShutdown(mono: Int64 = Identifiers.monotonicMs()) {
        let wasStopping = shutdown.isStopping
        for action in shutdown.step(now: mono, stopRequests: options.stopRequests()) {
            switch action {
            case let .log(line): log(line)
            case .abortStandby: for transferID in flights.standby.keys { http?.withdraw(transferID) }
            case .abortInFlight:
                for flight in flights.byToken.values { http?.cancel(flight.transferID) }
                pluginsStop.withLock { $0 = true }
            }
        }
        if !wasStopping && shutdown.isStopping { options.notifier?.send("STOPPING=1") }
    }

    /// Raises the open-files limit as a runner does, and refuses one below the floor: the runner
    /// would send, then fail to start every hook and retry them forever. Asked before anything
    /// is opened, so that a tiny limit is not taken for a damaged store.
    package static func checkOpenFilesLimit() throws(OutboxError) {
        let limit = Int(csystem_raise_open_files())
        guard limit > 0, limit < OpenFilesBudget.floor else { return }
        throw OutboxError(
            .config,
            "the open-files limit (\(limit)) is below the \(OpenFilesBudget.floor) a runner needs; nothing was sent: raise it (ulimit -n, LimitNOFILE=)"
        )
    }

    /// The scheduler's limits from the config. Standby transfers are the curl thread's work
    /// while this thread commits: three per slot, so a burst of ended requests does not empty
    /// them before the next claim (small POSTs: 4-9 % less time than with one per slot).
    /// On a store several runners share, one per slot: entries this runner holds in standby
    /// are entries an idle runner cannot take.
    static func limits(_ config: Config, concurrency: Int, sharedStore: Bool) -> SchedulerLimits {
        SchedulerLimits(
            concurrency: concurrency, perHost: config.perHost, partConcurrency: config.partConcurrency,
            standbyPerSlot: sharedStore ? 1 : 3)
    }

    /// What the open-files limit leaves for the config's concurrency, hooks and parts.
    static func openFilesBudget(_ config: Config, limit: Int) -> OpenFilesBudget {
        OpenFilesBudget(
            limit: limit, concurrency: config.concurrency, hookConcurrency: config.hookConcurrency,
            partConcurrency: config.partConcurrency)
    }

    /// The enqueue rules for follow-ups and hook enqueue lines, over these definitions.
    static func factory(config: Config, definitions: DefinitionSet, environment: [String: String], cwd: String) -> EntryFactory {
        var factory = EntryFactory(config: config, environment: environment, cwd: cwd) { (key: String) throws(OutboxError) in
            guard let d = definitions.definitions[key] else { throw unknownKey(key, in: definitions) }
            return d
        }
        // A runner without its account runs only entries without one (and its follow-ups have none).
        factory.unsetAccountIsNone = true
        return factory
    }

    /// A follow-up or enqueue line naming no usable definition, as the hook's input says it:
    /// a definition of that key with errors is named as such, with its first error.
    package static func unknownKey(_ key: String, in definitions: DefinitionSet) -> OutboxError {
        if let first = definitions.brokenKeys[key]?.first {
            // Fixed, it takes the entry: a follow-up waits for that instead of being dropped.
            var error = OutboxError.invalid("the definition of \"\(key)\" has errors (\(first.path):\(first.line): \(first.message))")
            error.mayPassLater = true
            return error
        }
        return .invalid("no definition has key \"\(key)\"")
    }

    /// Free space a run wants before it sends: its commits, the log's growth, staged answers.
    static let roomToRecord: Int64 = 64 << 10

    /// SIGHUP: config and definitions read again; work in flight carries on. A config with
    /// errors is logged like `outbox check` and the one in use is kept. Limits that shape
    /// connections already open (`per_host` on the curl thread) wait for the next run.
    func reload() {
        var newConfig = config
        if let file = config.file {
            do {
                newConfig = try Config.load(file: file, environment: environment)
                // The store is open and stays where it is; limits given as flags still win.
                newConfig.store = config.store
                options.limits.apply(to: &newConfig)
            } catch {
                // One line each in the log: the source line would be a second (and may hold a secret).
                for d in error.diagnostics { log(d.rendered(source: nil), level: .error) }
                log("outbox: reload: \(error.message) in \(file); the config in use is kept", level: .error)
                return
            }
        }
        // A definitions folder gone (or a typo in its path) would hold every outcome unhandled.
        guard Paths.isDirectory(newConfig.definitions) else {
            let what = Paths.exists(newConfig.definitions) ? "is not a folder" : "does not exist"
            log(
                "outbox: reload: the definitions folder \(newConfig.definitions) \(what); the config and definitions in use are kept",
                level: .error)
            return
        }
        // As at a start: a file with errors disables its own key (its outcomes are held until
        // it is fixed), never the others' fixes and changes.
        let newDefinitions = DefinitionSet.load(folder: newConfig.definitions)
        let newFactory = Self.factory(config: newConfig, definitions: newDefinitions, environment: environment, cwd: factory.cwd)
        let newAccount = (try? newFactory.account()) ?? nil
        config = newConfig
        definitions = newDefinitions
        factory = newFactory
        chainsWithPlugins = Self.chainsWithPlugins(config, definitions)
        account = newAccount
        factory.heartbeat = pluginHeartbeat()
        // The connection cache was sized as the run started; a reload changes what is sent at once.
        openFiles = Self.openFilesBudget(config, limit: openFilesLimit)
        noteOpenFilesBudget()
        scheduler = Scheduler(limits: Self.limits(config, concurrency: openFiles.concurrency, sharedStore: store.sharesRunners))
        wifiGate = WifiGate(intervalMs: config.wifiIntervalMs)
        hostHealth.holdAfter = config.hostHoldAfter
        if let eventsReload { eventsEnabled = eventsReload(config) }
        delivery.due = true
        readAhead.discard()
        let n = definitions.definitions.count
        log("outbox: reloaded \(config.file ?? "the config") and \(n) definition\(n == 1 ? "" : "s")")
        noteBrokenDefinitions()
        do {
            // What a reload may have fixed (a definition, a hook, a follow-up's plugin) is tried
            // now, not when the backoff of its last failure ends.
            try store.markUnhandled(keys: Set(definitions.definitions.keys))
            try store.releaseDeliveryBackoffs(now: Identifiers.nowMs())
            delivery.thenTries = [:]
            // Built with the definitions replaced now: built again.
            delivery.chainsBuilt = [:]
        } catch {
            log("outbox: reload: \(error.message)", level: .warn)
        }
    }

    /// Says where each definition file's errors are, as a start or a reload reads them, and
    /// names each definition with errors: its key is disabled, its outcomes held until it is fixed.
    func noteBrokenDefinitions() {
        for d in definitions.diagnostics { log(d.rendered(source: nil), level: .error) }
        for key in definitions.brokenKeys.keys.sorted() {
            log("outbox: the definition of \(key) has errors: its outcomes are held until it is fixed (outbox check)", level: .warn)
        }
    }

    /// Says so when the config names an account and this runner has none (its variable unset
    /// or empty): it leaves every entry enqueued with an account queued.
    func noteMissingAccount() {
        guard config.account != nil, account == nil else { return }
        log("outbox: this runner has no account (the config's account renders empty here): it sends only entries without one")
    }

    /// Says so when the open-files limit holds fewer entries in flight or hooks than the config.
    func noteOpenFilesBudget() {
        guard openFiles.concurrency < config.concurrency || openFiles.hookConcurrency < config.hookConcurrency else { return }
        log(
            "outbox: the open-files limit (\(openFilesLimit)) leaves room for \(openFiles.concurrency) "
                + "\(openFiles.concurrency == 1 ? "entry" : "entries") in flight and \(openFiles.hookConcurrency) "
                + "hook\(openFiles.hookConcurrency == 1 ? "" : "s") at once, not concurrency \(config.concurrency) and hooks.concurrency "
                + "\(config.hookConcurrency): raise it (ulimit -n, LimitNOFILE=) to run that many",
            level: .warn)
    }

    // MARK: The loop

    package func run() throws(OutboxError) -> RunSummary {
        let started = Identifiers.monotonicMs()
        do {
            // libcurl is loaded and initialised before any hook or curl thread starts:
            // curl_global_init is not thread-safe.
            try HTTPClient.loadLibrary()
            http = try HTTPClient(maxTotalConnections: openFiles.connectionCache, perHost: config.perHost)
        } catch {
            throw .storage("cannot load libcurl: \(error)")
        }
        defer { http?.shutdown() }
        defer { delivery.reactor?.stop() }
        noteOpenFilesBudget()
        noteMissingAccount()
        // The curl thread (started above, with the normal policy) moves the bytes; this thread
        // keeps the books. As SCHED_BATCH it does not preempt the curl thread each time a
        // transfer ends: it runs when a core is free or its share comes, and settles what
        // ended meanwhile in one commit. Hooks and plugins it starts get the normal policy, and
        // so does this thread while hooks run (it starts the next ones as others end).
        followHooksWithPolicy()
        defer { if delivery.batchPolicy { _ = csystem_sched_batch_self(0) } }
        // A store on a server reconnects when the server goes away, keeping this run's work,
        // until a stop request or --max-time: then the run ends with the storage error.
        let maxTimeEnd = options.maxTimeMs.map { started + $0 }
        store.reconnectWhenDropped(
            ReconnectPolicy(
                giveUp: { [stopRequests = options.stopRequests] in
                    stopRequests() > 0 || maxTimeEnd.map { Identifiers.monotonicMs() >= $0 } ?? false
                },
                log: { [logger] line in logger.log(.warn, line) },
                // Tries close enough together that a server back within the lease is seen before it ends.
                maxDelayMs: Int(min(5_000, max(100, lease.durationMs / 6)))))
        store.reportLockWaits { [logger] line in logger.log(.warn, line) }
        // A runner frozen inside a transaction would hold its locks, and so every other
        // runner, for as long as it stays frozen: the server ends such a transaction.
        try store.endIdleTransactions(afterMs: lease.durationMs)
        // A full disk would let requests go out whose answers cannot be written: each run
        // (cron's, every minute) would send them again. Nothing is sent then.
        if let free = store.freeBytes(), free < Self.roomToRecord {
            throw .storage(
                "the disk of the store has \(Units.formatBytes(free)) free, less than the \(Units.formatBytes(Self.roomToRecord)) a run needs to record what it sends: nothing was sent; free some space"
            )
        }
        try recoverFromEarlierRunners()
        // Sent now that the curl thread runs: their answers come in the loop's first turns.
        for entry in try store.erroredEntriesWithS3Uploads() {
            log("outbox: aborting the multipart upload of \(entry.id): it settled error, and no abort of it was answered yet", level: .warn)
            abortS3Upload(entry)
        }
        factory.heartbeat = pluginHeartbeat()
        shutdown = Shutdown(startedAt: started, graceMs: options.graceMs, maxTimeMs: options.maxTimeMs)
        // A drain's horizon is fixed now: retries and delays cannot push it on forever.
        let horizonEnd = Identifiers.nowMs() + options.horizonMs
        if options.drain { drainHorizon = horizonEnd }
        if options.showsProgress {
            // A drain's totals are what it will send: not entries delayed past its horizon.
            let dueBy = options.drain ? horizonEnd : nil
            progressDisplay = ProgressDisplay(
                write: options.drawProgress,
                totals: { [store] in try? store.pendingTotals(dueBy: dueBy) })
        }
        var events: [RunnerEvent] = []
        while true {
            // Results are judged against what other processes committed before they came
            // (a `headers update` makes a 401 to the old headers a reason to send again).
            try noticeOtherWriters()
            // Results of the last wait become changes, committed with this turn's claims.
            for event in events { try handle(event) }
            try keepLeases()
            try keepRunnerLock()
            // Follow-ups a hook asked for are enqueued before this turn's claims; other
            // acknowledgements wait to share the commit that counts the next deliveries.
            if delivery.finished.contains(where: { !$0.followUps.isEmpty }) { try acknowledgeFinished(now: Identifiers.nowMs()) }
            let now = Identifiers.nowMs()
            let mono = Identifiers.monotonicMs()
            options.notifier?.pingIfDue(monotonicMs: mono)
            // Tests hold here with a hook's exit seen and not yet acknowledged, and stop the runner.
            if !delivery.finished.isEmpty { Fault.hold("run.hook-finished") }
            stepShutdown(mono: mono)
            // A plugin beside this thread is waited for even when aborting (it is killed then): it
            // must not outlive the run.
            let pluginsRunning =
                flights.pluginsBusy || !delivery.linesBuilding.isEmpty || !delivery.chainsBuilding.isEmpty || authRefreshRunning
                || wifiGate.checkingSince != nil
            if shutdown.mayExit(transfersInFlight: !flights.byToken.isEmpty || pluginsRunning, hooksRunning: !delivery.hooksRunning.isEmpty)
            {
                // A hook that exited 0 by now is acknowledged, not delivered again by the next run.
                try acknowledgeFinished(now: now)
                try flush(now: now)
                break
            }

            let reloads = options.reloadRequests()
            if reloads != reloadsSeen {
                reloadsSeen = reloads
                reload()
            }
            if !shutdown.isStopping {
                try expireParked(now: now)
                try refreshAuthIfNeeded(now: now)
                try claim(now: now)
                // A part's slot goes to the next part only once its acceptance is durable, so
                // a kill sends again at most the parts in flight.
                if changes.contains(where: \.acceptsPart) { try flush(now: now) }
                try pumpParts(now: now)
            }
            try flush(now: now)
            // Hooks start after the commit: a kill while they start loses none of this turn's results.
            if !shutdown.isStopping && delivery.isDue(mono: mono) { try deliver(now: now) }
            try acknowledgeFinished(now: now)

            if options.drain && !shutdown.isStopping && flights.byToken.isEmpty && !flights.pluginsBusy
                && delivery.hooksRunning.isEmpty
            {
                let due = try readAhead.drainDueTimes(mono: mono, ownWrites: store.ownWrites) { () throws(OutboxError) in
                    Fault.point("run.due-times")
                    return try store.dueTimes(deliverableKeys: Set(definitions.definitions.keys))
                }
                // A refresh that may send parked entries again, or a Wi-Fi check that may let held
                // ones go, runs before the drain ends.
                if Scheduler.drainIsOver(due: due, now: now, horizonEnd: drainHorizon ?? horizonEnd), wifiGate.checkingSince == nil,
                    try !authRefreshDue(now: now)
                {
                    break
                }
            }
            // Entries sending: those claimed ahead as standby transfers wait for a connection.
            progressDisplay?.draw(
                summary: summary, flights: flights.byToken.count,
                running: Set(flights.byToken.values.lazy.filter { !$0.standby }.map(\.entryID)).count)
            followHooksWithPolicy()

            // Sleep until an event, or 50 ms to notice enqueues from other processes: SQLite
            // has no cross-process notification, so the runner polls its data_version (on
            // PostgreSQL the poll reads the schema's notifications first).
            events = mailbox.take(timeoutMs: contended ? 5 : 50)
            contended = false
        }
        progressDisplay?.finish()
        // Stopped past its grace: a hook still running is stopped too, not left to finish unseen
        // (its outcome stays unacknowledged and is delivered again by the next run).
        var stopped: [Int64: String] = [:]
        for (seq, (pgid, start)) in delivery.groups where ProcessRunner.killStaleGroup(pgid: pgid, startTime: start) {
            log("outbox: stopped hook process group \(pgid) at the end of the grace; its outcome is delivered again", level: .warn)
            if let entryID = delivery.hooksRunning[seq] { stopped[seq] = entryID }
            // A failed delivery, with its reason for `show`: the run's exit status says a delivery failed.
            guard let entryID = delivery.hooksRunning[seq] else {
                summary.deliveryFailures += 1
                continue
            }
            try failDelivery(
                seq: seq, entryID: entryID, failure: "the hook was still running at the end of the grace and was stopped",
                now: Identifiers.nowMs())
        }
        logStderrOfStoppedHooks(stopped)
        if !shutdown.isStopping { options.notifier?.send("STOPPING=1") }
        // Entries we hold go back in the queue, keeping accepted parts.
        let held = Array(flights.running.values)
        for entry in held { changes.append(.requeue(entryID: entry.id)) }
        try flush(now: Identifiers.nowMs())
        for entry in held { emitState(entry, state: .queued, reason: entry.reason) }
        if !hostHealth.held.isEmpty {
            try store.setHeldHosts([])
            try store.releaseHolds(now: Identifiers.nowMs(), reasons: [.host])
        }
        store.checkpoint()
        summary.elapsedMs = Identifiers.monotonicMs() - started
        summary.remaining = Int(try store.remainingCount())
        var seen = Set<String>()
        summary.awaitingAuthIDs = (parkedInRun + (try store.list(ListFilter(state: EntryState.awaitingAuth.rawValue)).map(\.id)))
            .filter { seen.insert($0).inserted }
        summary.undeliveredIDs = delivery.failedIDs.sorted()
        return summary
    }

    /// Puts back what a runner that died left: entries it held, hook processes it started,
    /// and marks outcomes that no definition handles. Entries an earlier runner held back
    /// for its Wi-Fi or account are looked at again.
    func recoverFromEarlierRunners() throws(OutboxError) {
        // Holds are this runner's to make: an earlier runner's say nothing about now.
        try store.setHeldHosts([])
        let requeued = try store.requeueAbandoned(lease: lease, now: Identifiers.nowMs())
        if requeued > 0 {
            log("outbox: put \(requeued) entr\(requeued == 1 ? "y" : "ies") left running by an earlier runner back in the queue")
        }
        try store.releaseHolds(now: Identifiers.nowMs(), reasons: HoldReason.allCases)
        try store.releaseDeliveryBackoffs(now: Identifiers.nowMs())
        for (pgid, start) in try store.recordedHookProcesses() where stopEarlierGroup(pgid: pgid, start: start) {
            log("outbox: stopped hook process group \(pgid) left by an earlier runner", level: .warn)
            delivery.stoppedEarlierGroups.insert("\(pgid):\(start)")
        }
        for owner in StaleHooks.stopOrphanedPlugins(store: config.store).sorted() {
            log("outbox: stopped plugin processes left running by outbox process \(owner), which has ended", level: .warn)
        }
        for path in try store.cleanOrphans() {
            log("outbox: removed \(path): a staged body no entry owns (left by a process that was killed)", level: .warn)
        }
        try store.markUnhandled(keys: Set(definitions.definitions.keys))
        noteBrokenDefinitions()
    }

    /// Logs a line; with the live display on, the line it drew is cleared first and drawn
    /// again below the log line at the next turn.
    func log(_ line: String, level: LogLevel = .info, fields: [(String, JSON)] = []) {
        progressDisplay?.clear()
        logger.log(level, line, fields: fields)
    }

    /// Commits this turn's changes in one transaction.
    func flush(now: Int64) throws(OutboxError) {
        // The counters of this turn's attempts commit with the changes they count.
        if !counters.isEmpty { changes.append(.count(counters.take())) }
        guard !changes.isEmpty else { return }
        let batch = changes
        changes.removeAll()
        let writesBefore = store.ownWrites
        let applied = try store.apply(batch, by: lease, now: now)
        if batch.contains(where: { if case .markRunning = $0 { true } else { false } }) { Fault.point("run.claimed") }
        reportSettles(fencedOut: applied.fencedOut)
        for (id, reason) in applied.followUpConflicts.sorted(by: { $0.key < $1.key }) {
            log("outbox: the follow-ups of \(id) wait for its delivery: \(reason)", level: .warn, fields: [("id", .string(id))])
        }
        for entry in applied.scopeCancelled {
            emitState(entry, state: .cancelled, reason: "scope")
            summary.cancelled += 1
        }
        // What was committed can make entries due (follow-ups, requeues) and outcomes deliverable;
        // claims and final settles of entries outside scopes make none due.
        readAhead.committed(keepingFloor: batch.allSatisfy(\.keepsReadFloor), ownWrites: (writesBefore, store.ownWrites))
        delivery.due = true
        if batch.contains(where: \.insertsEntries) { readAhead.discard() }
        if settledUnhandled {
            settledUnhandled = false
            try store.markUnhandled(keys: Set(definitions.definitions.keys))
        }
    }
}

extension RunnerChange {
    var acceptsPart: Bool {
        if case .partAccepted = self { return true }
        return false
    }

    /// Whether the read floor holds after the change (see `ReadAhead.floor`): claims and the
    /// records of a transfer change no queued entry, and a final settle of an entry outside a
    /// scope with no follow-ups takes its own entry out of the queue and lets no other in.
    var keepsReadFloor: Bool {
        switch self {
        case .markRunning, .count, .attempt, .progress, .partAccepted: return true
        case let .settle(s):
            guard let entry = s.snapshot else { return false }
            return s.followUps.isEmpty && entry.scope == nil && s.state != .queued
        default: return false
        }
    }

    /// Whether applying the change adds entries (`then` follow-ups), which may replace queued ones.
    var insertsEntries: Bool {
        if case let .settle(settlement) = self { return !settlement.followUps.isEmpty }
        return false
    }
}
