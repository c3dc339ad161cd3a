import CSystem
import Glibc
import OutboxEnqueue
import OutboxModel
import OutboxProcess
import OutboxStore

/// Delivery: outcomes handed to their hooks, acknowledged only when the hook exits 0.
extension Runner {
    /// How much of a hook's stdout is read (for its enqueue lines), and of its stderr (for the log).
    package static let hookOutputCap = 1 << 20

    /// Starts hooks for due outcomes: one at a time per id, in order; `hooks.concurrency` at once.
    /// The hooks that exited 0 since the last turn are acknowledged in the same commit that
    /// counts the deliveries about to start.
    func deliver(now: Int64) throws(OutboxError) {
        // Hooks that ended wait for the commit below, but no longer hold a slot.
        let room = openFiles.hookConcurrency - delivery.hooksRunning.count + delivery.finished.count
        var starting: [(outcome: OutcomeRecord, hook: CommandSpec)] = []
        if room > 0 {
            let keys = Set(definitions.definitions.keys)
            let busy = Set(delivery.hooksRunning.values)
            var candidates = try store.deliverableOutcomes(
                now: now, keys: keys, excludingIDs: busy, limit: store.sharesRunners ? room * 8 : room, horizon: drainHorizon)
            if store.sharesRunners {
                // Runners that all took the oldest outcomes would mostly claim the same ones:
                // each takes a random few of them (order holds per id, not across ids).
                candidates = Array(candidates.shuffled().prefix(room))
            }
            for var outcome in candidates {
                guard let definition = definitions.definitions[outcome.key] else { continue }
                // A chain whose build runs a plugin is built beside this thread first; the
                // outcome is delivered once it is (the next turns).
                if try buildsChainBeside(definition, outcome: outcome) { continue }
                guard let hook = outcome.outcome == .completed ? definition.onSuccess : definition.onError else {
                    // The definition present now has no hook for this outcome: nothing to wait for.
                    var followUps: [NewEntry] = []
                    if Settlement.thenWaitsForDelivery(outcome.payload) {
                        // Stopped at once while a follow-up's plugin ran: left for the next run.
                        guard let built = try thenAtDelivery(definition, outcome: &outcome) else { continue }
                        switch built {
                        case let .success(entries): followUps = entries
                        case let .failure(failure):
                            try thenWaits(outcome, failure: failure, hookStarted: true, now: now)
                            continue
                        }
                    }
                    let refused = try store.acknowledge([Acknowledgement(seq: outcome.seq, followUps: followUps)], now: now)
                    if let why = refused[outcome.seq] {
                        // A follow-up names an entry being sent now with another body: tried again.
                        try thenWaits(
                            outcome, failure: .running("its then follow-ups could not be applied: \(why)"), hookStarted: true, now: now)
                    } else {
                        delivery.thenTries[outcome.seq] = nil
                    }
                    continue
                }
                starting.append((outcome, hook))
            }
        }
        if !starting.isEmpty { Fault.hold("deliver.chosen") }
        // The process group recorded on an outcome due again is its earlier delivery's hook,
        // whose runner died (on a shared store, while this one ran): stopped before the outcome
        // goes again. That group only: another outcome's may be a live hook of this runner, or
        // of another runner on this host.
        let live = Set(delivery.groups.values.map { "\($0.pgid):\($0.startTime)" })
        for (outcome, _) in starting {
            guard let pgid = outcome.hookPgid, let start = outcome.hookStart else { continue }
            let group = "\(pgid):\(start)"
            guard !live.contains(group), !delivery.stoppedEarlierGroups.contains(group), stopEarlierGroup(pgid: pgid, start: start)
            else { continue }
            log("outbox: stopped hook process group \(pgid) left by a runner that stopped", level: .warn)
            delivery.stoppedEarlierGroups.insert(group)
        }
        // Counted before, maybe by a runner that died between starting its hook and recording
        // the group: looked for once this runner holds the delivery (below).
        let unrecorded = starting.filter {
            $0.outcome.deliveries > 0 && $0.outcome.hookPgid == nil && !delivery.countedHere.contains($0.outcome.seq)
        }
        guard !starting.isEmpty else {
            guard !delivery.finished.isEmpty else { return }
            try acknowledgeFinished(now: now)
            // The next outcome of an id just acknowledged may go now, not at the next look.
            return try deliver(now: now)
        }
        // Every delivery is counted before its hook starts, all of this turn's in one commit.
        let seqs = starting.map(\.outcome.seq)
        var counts: [Int64: Int64]
        if store.sharesRunners {
            // Claimed under this runner's lease too (another runner may hold some): the
            // acknowledgements commit first, on their own.
            try acknowledgeFinished(now: now)
            counts = try store.claimDeliveries(seqs: seqs, lease: lease)
            // A chain built beside for an outcome another runner claimed is that runner's to build.
            for seq in seqs where counts[seq] == nil { delivery.chainsBuilt[seq] = nil }
        } else {
            // The only runner counts them with the acknowledgements of the hooks that ended.
            if !delivery.finished.isEmpty { Fault.point("hook.before-ack") }
            let done = try store.acknowledge(acknowledgements, thenBegin: seqs, now: now)
            counts = done.counts
            try acknowledged(refused: done.refused, now: now)
        }
        // Only now, with the delivery this runner's: on a shared store the outcome read above
        // may be one another runner has just claimed and started a hook for, which is alive.
        let orphaned = unrecorded.filter { counts[$0.outcome.seq] != nil }
        if !orphaned.isEmpty {
            let tokens = Set(orphaned.map { HookEnvironment.token(store: config.store, outcomeSeq: $0.outcome.seq) })
            for pgid in StaleHooks.stopLeaders(withVariable: HookEnvironment.tokenName, in: tokens) {
                log("outbox: stopped hook process group \(pgid) left by a runner that stopped before recording it", level: .warn)
            }
        }
        delivery.countedHere.formUnion(counts.keys)
        Fault.point("hook.counted")
        if counts.count < starting.count {
            contended = true
            delivery.due = true
        }
        // A chain that waits for the delivery is applied once the delivery is this runner's: built
        // beside this thread before (`buildsChainBeside`), or here when no plugin builds it.
        for i in starting.indices
        where counts[starting[i].outcome.seq] != nil && Settlement.thenWaitsForDelivery(starting[i].outcome.payload) {
            guard let definition = definitions.definitions[starting[i].outcome.key] else { continue }
            let built =
                try thenAtDelivery(definition, outcome: &starting[i].outcome)
                ?? .failure(.invalid("its then follow-ups were not built: the run was asked to stop at once"))
            switch built {
            case let .success(entries):
                delivery.thenAtDelivery[starting[i].outcome.seq] = entries.isEmpty ? nil : entries
                delivery.thenTries[starting[i].outcome.seq] = nil
            case let .failure(failure):
                // Not started: its count is taken back and the outcome is delivered again.
                counts[starting[i].outcome.seq] = nil
                try thenWaits(starting[i].outcome, failure: failure, hookStarted: false, now: now)
            }
        }
        // Before the first spawn, so the reactor thread made with it and the hooks see the normal policy.
        followHooksWithPolicy(starting: true)
        let reactor = hookReactor()
        var processes: [HookProcess] = []
        let mailbox = self.mailbox
        var specs: [ProcessSpec] = []
        var spawning: [Int64] = []
        for (outcome, hook) in starting where counts[outcome.seq] != nil {
            var spec = Self.hookSpec(
                hook, outcome: outcome, deliveries: counts[outcome.seq] ?? 1, config: config, environment: hookEnvironment)
            let seq = outcome.seq
            spec.onWarn = { pid in mailbox.post(.hookSlow(seq: seq, pid: pid)) }
            delivery.hooksRunning[seq] = outcome.entryID
            delivery.commands[seq] = (outcome.outcome.hookField, hook, outcome.key)
            specs.append(spec)
            spawning.append(seq)
        }
        for (seq, result) in zip(spawning, Self.startHooks(specs)) {
            let started: ProcessRunner.Started
            switch result {
            case let .success(value): started = value
            case let .failure(error):
                mailbox.post(.hookDone(seq: seq, result: .failure(error)))
                continue
            }
            processes.append(HookProcess(seq: seq, pgid: started.pid, startTime: started.startTime))
            delivery.groups[seq] = (started.pid, started.startTime)
            if let reactor {
                reactor.add(started) { result in mailbox.post(.hookDone(seq: seq, result: .success(result))) }
            } else {
                Threads.detach { mailbox.post(.hookDone(seq: seq, result: .success(ProcessRunner.finish(started)))) }
            }
        }
        // The turn's process groups are recorded before anything else: a runner killed later
        // never leaves a hook that the next runner does not stop (killed before, see `unrecorded`).
        if !processes.isEmpty { Fault.point("hook.started") }
        try store.recordHookProcesses(processes)
        if !processes.isEmpty { Fault.point("hook.running") }
    }

    /// Stops a hook process group an earlier runner recorded: the whole group while its hook
    /// (a hook of this store) runs, or what the hook left running in it once it exited.
    /// Whether anything was stopped.
    func stopEarlierGroup(pgid: Int32, start: UInt64) -> Bool {
        if StaleHooks.isHook(pgid, ofStore: config.store) { return ProcessRunner.killStaleGroup(pgid: pgid, startTime: start) }
        return StaleHooks.stopRemains(ofGroup: pgid, leaderStart: start, store: config.store) > 0
    }

    /// Threads that help start a turn's hooks, at most 4.
    static let spawnHelpers = max(1, min(4, sysconf(Int32(_SC_NPROCESSORS_ONLN))))

    /// Starts a turn's hooks on several threads: a vfork parent waits until its child has
    /// exec'd, and meanwhile another thread starts the next one. Results follow `specs`.
    package static func startHooks(_ specs: [ProcessSpec]) -> [Result<ProcessRunner.Started, ProcessSpawnError>] {
        let results = Locked([Result<ProcessRunner.Started, ProcessSpawnError>?](repeating: nil, count: specs.count))
        let next = Locked(0)
        let work: @Sendable () -> Void = {
            while true {
                let index = next.withLock { value in
                    defer { value += 1 }
                    return value
                }
                guard index < specs.count else { return }
                let result: Result<ProcessRunner.Started, ProcessSpawnError>
                do throws(ProcessSpawnError) { result = .success(try ProcessRunner.start(specs[index])) } catch {
                    result = .failure(error)
                }
                results.withLock { $0[index] = result }
            }
        }
        // One helper per core (measured: 3 threads on 2 cores beat 2); with one spawn, or no thread, this one does all.
        let helpers = (0..<min(spawnHelpers, max(0, specs.count - 1))).compactMap { _ in
            try? Threads.start(detached: false, work).get()
        }
        work()
        for helper in helpers { pthread_join(helper, nil) }
        return results.withLock { $0.map { $0! } }
    }

    /// While hooks run, this thread takes the normal policy: as SCHED_BATCH it waited for a
    /// core at each wake-up behind the hooks it had started, and the next ones started late.
    func followHooksWithPolicy(starting: Bool = false) {
        let batch = delivery.hooksRunning.isEmpty && !starting
        guard batch != delivery.batchPolicy else { return }
        _ = csystem_sched_batch_self(batch ? 1 : 0)
        delivery.batchPolicy = batch
    }

    /// The thread that feeds, watches and reaps this run's hooks; nil when the process is
    /// out of fds, and each hook then gets a thread of its own.
    func hookReactor() -> ProcessReactor? {
        if delivery.reactor == nil { delivery.reactor = try? ProcessReactor() }
        return delivery.reactor
    }

    /// Commits the acknowledgements of the hooks that exited 0 since the last turn, in one
    /// transaction; their outcomes stay out of `deliver` (still running) until it commits.
    func acknowledgeFinished(now: Int64) throws(OutboxError) {
        guard !delivery.finished.isEmpty else { return }
        Fault.point("hook.before-ack")
        let refused = try store.acknowledge(acknowledgements, now: now)
        try acknowledged(refused: refused, now: now)
    }

    private var acknowledgements: [Acknowledgement] {
        delivery.finished.map { Acknowledgement(seq: $0.seq, key: $0.key, followUps: $0.followUps) }
    }

    /// After the acknowledgements of `delivery.finished` committed. One the store refused
    /// (its enqueue lines name an entry being sent now with another body) is a failed
    /// delivery: nothing of it was applied, and it is delivered again.
    private func acknowledged(refused: [Int64: String], now: Int64) throws(OutboxError) {
        let batch = delivery.finished
        guard !batch.isEmpty else { return }
        delivery.finished.removeAll()
        for item in batch {
            delivery.countedHere.remove(item.seq)
            guard let entryID = delivery.hooksRunning.removeValue(forKey: item.seq) else { continue }
            if let reason = refused[item.seq] {
                try failDelivery(
                    seq: item.seq, entryID: entryID, failure: "a follow-up (of then, or a line of the hook) was refused: \(reason)",
                    now: now)
            }
        }
        summary.delivered += batch.count - refused.count
        delivery.due = true
        // An acknowledgement can make entries due (a hold released, follow-ups enqueued).
        readAhead.storeChanged()
        if batch.contains(where: { !$0.followUps.isEmpty }) { readAhead.discard() }
    }

    /// What a hook reads on stdin: the journaled outcome with `meta.deliveries`.
    package static func hookPayload(_ outcome: JSON, deliveries: Int64) -> JSON {
        var payload = outcome
        var meta = payload["meta"] ?? .object([])
        meta.set("deliveries", .int64(deliveries))
        payload.set("meta", meta)
        return payload
    }

    /// How a hook is started for an outcome: its payload on stdin with `meta.deliveries`, the
    /// `OUTBOX_*` variables, the project root as its folder, the output cap and the timeouts.
    package static func hookSpec(
        _ hook: CommandSpec, outcome: OutcomeRecord, deliveries: Int64, config: Config, environment: EncodedEnvironment
    ) -> ProcessSpec {
        let payload = hookPayload(outcome.payload, deliveries: deliveries)
        let values = HookEnvironment.Values(
            id: outcome.entryID, key: outcome.key, outcome: outcome.outcome.rawValue, deliveries: deliveries,
            generation: outcome.generation, token: HookEnvironment.token(store: config.store, outcomeSeq: outcome.seq))
        var set: [String: String] = [:]
        for variable in HookEnvironment.variables { set[variable.name] = variable.value(values) }
        let env = ProcessEnvironment(base: environment, setting: set)
        var spec = ProcessSpec(
            command: ProcessCommand(hook), stdin: payload.serializedBytes(), environment: env,
            workingDirectory: config.root, outputCap: hookOutputCap,
            timeoutMs: config.hookTimeoutMs.map { Int($0) }, warnAfterMs: Int(config.hookWarnAfterMs))
        spec.stopGroupWhenLeaderFails = true
        return spec
    }

    func hookFinished(seq: Int64, result: Result<ProcessResult, ProcessSpawnError>) throws(OutboxError) {
        delivery.groups[seq] = nil
        let command = delivery.commands.removeValue(forKey: seq)
        guard let entryID = delivery.hooksRunning.removeValue(forKey: seq) else { return }
        // A hook slot is free, and the next outcome of this id may go.
        delivery.due = true
        let now = Identifiers.nowMs()
        var failure: String?
        var followUps: [NewEntry] = []
        switch result {
        case let .failure(error):
            failure = "the hook could not start: \(error.message)"
            delivery.unstartedInARow = error.transient ? delivery.unstartedInARow + 1 : 0
        case let .success(process):
            delivery.unstartedInARow = 0
            logStderr(of: process, entryID: entryID)
            if process.timedOut {
                failure = "the hook ran past hooks.timeout and was stopped"
            } else if let signal = process.signal {
                failure = "the hook was killed by signal \(signal)"
            } else if process.exitStatus != 0 {
                let why = command.flatMap {
                    Self.whyHookDidNotRun(process.exitStatus, hook: $0.hook, field: $0.field, config: config, environment: environment)
                }
                failure = "the hook exited \(process.exitStatus ?? -1)" + (why.map { " (\($0))" } ?? "")
            } else if hookLinesRunPlugins(process.stdout) {
                // A plugin that reads them must not hold the queue: the delivery goes on when they are built.
                return buildHookLines(seq: seq, entryID: entryID, key: command?.key, process: process)
            } else {
                switch Self.acknowledgedHookEnqueues(process, parent: entryID, factory: factory, stagedSources: stagedSources) {
                case let .success(entries): followUps = (delivery.thenAtDelivery.removeValue(forKey: seq) ?? []) + entries
                case let .failure(problem): failure = problem.message
                }
            }
        }
        if let failure {
            // A hook the system had no fds, memory or processes to start was not delivered to:
            // its count is taken back. A missing or unrunnable hook is a failed delivery, so
            // its backoff grows as for any other.
            var started = true
            if case let .failure(error) = result, error.transient { started = false }
            try failDelivery(seq: seq, entryID: entryID, failure: failure, hookStarted: started, now: now)
            return
        }
        // Acknowledged with the others that ended this turn; until then it counts as running.
        delivery.hooksRunning[seq] = entryID
        delivery.finished.append((seq, command?.key, followUps))
    }

    /// Up to 20 lines of what a hook wrote on stderr, each prefixed `hook ID:`.
    func logStderr(of process: ProcessResult, entryID: String) {
        let stderr = String(decoding: process.stderr, as: UTF8.self).trimmingSpaces
        guard !stderr.isEmpty else { return }
        for line in stderr.split(separator: "\n").prefix(20) {
            // A log line stays a line: past 4 KiB the rest of it is left out.
            let shown = line.utf8.count > 4096 ? String(decoding: line.utf8.prefix(4096), as: UTF8.self) + " [...]" : String(line)
            log("hook \(entryID): \(TerminalText.visible(shown))", fields: [("id", .string(entryID))])
        }
    }

    /// What the hooks stopped at the end of the grace wrote on stderr, logged as for a hook that
    /// ends: their ends come through the mailbox once their groups are killed, waited for 2 s
    /// at most in all (a process that left its group may hold a hook's stderr open).
    func logStderrOfStoppedHooks(_ stopped: [Int64: String]) {
        var waiting = stopped
        let deadline = Identifiers.monotonicMs() + 2_000
        while !waiting.isEmpty {
            let left = deadline - Identifiers.monotonicMs()
            guard left > 0 else { return }
            for event in mailbox.take(timeoutMs: left) {
                guard case let .hookDone(seq, result) = event, let entryID = waiting.removeValue(forKey: seq) else { continue }
                if case let .success(process) = result { logStderr(of: process, entryID: entryID) }
            }
        }
    }

    /// Why a hook its shell could not run did not run, named by its field (`on_success: ...`).
    package static func whyHookDidNotRun(
        _ status: Int32?, hook: CommandSpec, field: String, config: Config, environment: [String: String]
    ) -> String? {
        CommandRef(field: field, command: hook).whyNotRun(
            status: status, root: config.root, searchPath: environment["PATH"] ?? ProcessRunner.defaultPath
        ).map { "\(field): \($0)" }
    }

    /// An outcome whose `then` follow-ups could not be built or applied yet (a plugin failed,
    /// an entry is being sent): its delivery fails, with a backoff that grows with each try
    /// in this run.
    func thenWaits(_ outcome: OutcomeRecord, failure: OutboxError, hookStarted: Bool, now: Int64) throws(OutboxError) {
        delivery.thenTries[outcome.seq, default: 0] += 1
        // The chain waits, not a hook: the summary names it with the chains not applied.
        try failDelivery(
            seq: outcome.seq, entryID: outcome.entryID, failure: failure.message, hookStarted: hookStarted,
            tries: delivery.thenTries[outcome.seq], hookFailed: false, now: now)
        // (Past the 1,000 the summary shows, one more changes nothing it says.)
        if summary.unbuiltFollowUpIDs.count < 1000, !summary.unbuiltFollowUpIDs.contains(outcome.entryID) {
            summary.unbuiltFollowUpIDs.append(outcome.entryID)
        }
    }

    /// A delivery that did not end in an acknowledgement: due again after a backoff (of
    /// `tries` failures, when given, instead of the deliveries counted).
    func failDelivery(
        seq: Int64, entryID: String, failure: String, hookStarted: Bool = true, tries: Int? = nil, hookFailed: Bool = true,
        now: Int64
    ) throws(OutboxError) {
        delivery.thenAtDelivery[seq] = nil
        let outcome = try store.outcomes(entryID: entryID).first { $0.seq == seq }
        let deliveries = Int(outcome?.deliveries ?? 1)
        var delay = Backoff.delay(failures: tries ?? deliveries, policy: config.retry.backoff, random: Double.random(in: 0..<1))
        let streak = hookStarted ? 0 : delivery.unstartedInARow
        if streak > 0 {
            // The count is taken back, so the backoff would not grow: the streak makes it.
            delay = max(delay, min(30_000, Int64(250) << Int64(min(streak - 1, 7))))
        }
        try store.deliveryFailed(
            seq: seq, nextDeliveryAt: now + delay, reason: failure, hookStarted: hookStarted, hookFailed: hookFailed)
        // Its next try moved: a drain judges its end by the due times read after this write
        // (a store whose writes `ownWrites` does not count would keep the old ones a while).
        readAhead.storeChanged()
        if streak <= 1 || streak & (streak - 1) == 0 {
            let inARow = streak > 1 ? " (\(streak) hooks in a row could not start)" : ""
            let which = tries.map { "try \($0)" } ?? "delivery \(deliveries)"
            // A runner that is stopping makes no more deliveries: the next run does.
            let when =
                shutdown.isStopping
                ? "by the next run (not before \(Units.formatDuration(ms: delay)) from now)" : "in \(Units.formatDuration(ms: delay))"
            log(
                "outbox: \(failure) for \(entryID) (\(which)); it will be delivered again \(when)\(inARow)",
                level: .warn, fields: [("id", .string(entryID))])
        }
        summary.deliveryFailures += 1
        if hookFailed { delivery.failedIDs.insert(entryID) }
    }

    /// What a hook that exited 0 asks to enqueue, or why its delivery fails instead: stdout
    /// past the cap (enqueue lines after it would be lost) or an invalid enqueue line.
    package static func acknowledgedHookEnqueues(
        _ process: ProcessResult, parent: String, factory: EntryFactory,
        stagedSources: (String) throws(OutboxError) -> [String: FileIdentity] = { _ in [:] }
    ) -> Result<[NewEntry], OutboxError> {
        if process.stdoutTruncated {
            return .failure(
                .invalid(
                    "the hook printed more than \(Units.formatBytes(Int64(hookOutputCap))) on stdout, so its enqueue lines cannot all be read"
                ))
        }
        do {
            return .success(try hookEnqueues(process.stdout, parent: parent, factory: factory, stagedSources: stagedSources))
        } catch  where error.mayPassLater {
            // The line is fine; what it names cannot be built yet (its plugin failed, its definition has errors).
            return .failure(error)
        } catch {
            return .failure(.invalid("the hook printed an invalid enqueue line: \(error.message)"))
        }
    }

    /// Why a line looks like an enqueue request printed so that it would not be read (indented,
    /// after a byte order mark, or spread over lines as `jq` prints by default), or nil: the
    /// delivery fails and says so, rather than the follow-up being lost without a word.
    static func misprintedEnqueue(_ line: ArraySlice<UInt8>) -> String? {
        var rest = line
        if rest.starts(with: [0xEF, 0xBB, 0xBF]) { rest = rest.dropFirst(3) }
        rest = rest.drop { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") }
        if rest.starts(with: Array(#""enqueue""#.utf8)) {
            return "a line starts with \"enqueue\": print each enqueue request as one line of JSON ({\"enqueue\": {...}}, as `jq -c` does)"
        }
        guard rest.count < line.count, rest.first == UInt8(ascii: "{"), String(decoding: rest, as: UTF8.self).contains("\"enqueue\"") else {
            return nil
        }
        return "an enqueue line must start with { (this one is indented or starts with a byte order mark)"
    }

    /// Lines `{"enqueue": {"key", "vars", "id"?, "delay"?}}` printed by a hook; other lines are
    /// ignored. Any invalid enqueue line fails the whole delivery (nothing is applied).
    package static func hookEnqueues(
        _ stdout: [UInt8], parent: String, factory: EntryFactory,
        stagedSources: (String) throws(OutboxError) -> [String: FileIdentity] = { _ in [:] }
    ) throws(OutboxError) -> [NewEntry] {
        var entries: [NewEntry] = []
        for line in stdout.split(separator: UInt8(ascii: "\n")) {
            if let problem = misprintedEnqueue(line) { throw .invalid(problem) }
            // Only a line that starts with `{` (as documented).
            guard line.first == UInt8(ascii: "{"), String(decoding: line, as: UTF8.self).contains("\"enqueue\"") else { continue }
            let json: JSON
            // Parsed as printed: a line that is not UTF-8 is refused, not repaired.
            var bytes = Array(line)
            do { json = try JSON.parse(bytes: &bytes) } catch { throw .invalid("not JSON: \(error)") }
            guard case let .object(top) = json, let request = json["enqueue"] else { continue }
            // A field beside `enqueue` (an `id` one level too high) would be dropped without a word.
            if let other = top.map(\.0).first(where: { $0 != "enqueue" }) {
                throw .invalid("an enqueue line has a field \(Units.quoted(other, limit: 40)) beside enqueue (only {\"enqueue\": {...}})")
            }
            guard case let .object(fields) = request else { throw .invalid("enqueue must be an object, not \(request.typeName)") }
            // A misspelt `id` would enqueue under a fresh id at every redelivery.
            if let unknown = fields.map(\.0).first(where: { !["key", "vars", "id", "delay"].contains($0) }) {
                throw .invalid("enqueue has an unknown field \(Units.quoted(unknown, limit: 40)) (known: key, vars, id, delay)")
            }
            guard let key = request["key"]?.stringValue else { throw .invalid("enqueue needs a key") }
            if let id = request["id"], id.stringValue == nil { throw .invalid("enqueue id must be a string, not \(id.typeName)") }
            var notBefore: Int64?
            if let delayValue = request["delay"] {
                guard let delay = delayValue.stringValue else {
                    throw .invalid("delay must be a duration string, not \(delayValue.typeName)")
                }
                do { notBefore = Identifiers.nowMs() + (try Units.parseDuration(delay)) } catch {
                    throw .invalid("delay: \(error.message)")
                }
            }
            let id = request["id"]?.stringValue
            do {
                entries.append(
                    try factory.make(
                        key: key, vars: request["vars"] ?? .null, id: id, parent: parent, notBefore: notBefore,
                        movedFiles: try id.map(stagedSources) ?? [:]))
            } catch  where error.mayPassLater {
                var later = OutboxError.invalid("an enqueue line of the hook (key \(key)) could not be built yet: \(error.message)")
                later.mayPassLater = true
                throw later
            }
        }
        return entries
    }
}
