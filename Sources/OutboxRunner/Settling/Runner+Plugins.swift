import Glibc
import OutboxEnqueue
import OutboxHTTP
import OutboxModel
import OutboxProcess
import OutboxStore

/// Plugins beside the control thread. Those that work on one entry's outcome (its response
/// parser, the request_command and headers_command of its `then` follow-ups) run on threads
/// of their own: a slow one holds its own entry, and that entry's slot, until it answers,
/// never the rest of the queue. Its answer comes back as an event, and the settle goes on
/// from where it stopped. So do the plugins of a hook's enqueue lines and of a chain built
/// again before its delivery; `auth_refresh_command` and the Wi-Fi check use `runBeside` too.
extension Runner {
    /// Whether this success is read by the definition's parser command before it settles.
    static func needsParser(_ entry: Entry, result: HTTPResult) -> Bool {
        guard case .command = entry.request.response else { return false }
        // A body cut at max_response_bytes is not parsed: the outcome says so at once.
        return !result.bodyTruncated
    }

    /// Whether the entry's settle may wait for a plugin once its request ends (its parser, its
    /// follow-ups' plugins): its transfer then keeps its slot on the curl thread, so that no
    /// standby request starts in the slot the plugin still holds.
    func settleMayWaitForPlugin(_ entry: Entry) -> Bool {
        if case .command = entry.request.response { return true }
        return !chainsWithPlugins.isEmpty && chainsWithPlugins.contains(entry.key)
    }

    /// The keys whose `then` follow-ups may run a plugin to be built, for either outcome.
    static func chainsWithPlugins(_ config: Config, _ definitions: DefinitionSet) -> Set<String> {
        Set(
            definitions.definitions.values.filter { definition in
                [Outcome.completed, .error].contains {
                    followUpsRunPlugins(definition, outcome: $0, config: config, definitions: definitions)
                }
            }.map(\.key))
    }

    /// Whether building this outcome's `then` follow-ups may run a plugin: the config's
    /// headers_command, or the request_command of a definition an item names (any, for a key
    /// given by a template).
    func followUpsRunPlugins(_ definition: Definition, outcome: Outcome) -> Bool {
        Self.followUpsRunPlugins(definition, outcome: outcome, config: config, definitions: definitions)
    }

    static func followUpsRunPlugins(_ definition: Definition, outcome: Outcome, config: Config, definitions: DefinitionSet) -> Bool {
        let items = definition.then?[outcome.hookField]?.arrayValue ?? []
        guard !items.isEmpty else { return false }
        if config.headersCommand != nil { return true }
        return items.contains { item in
            guard let key = item["key"]?.stringValue, !key.contains("{{") else {
                return definitions.definitions.values.contains { $0.requestCommand != nil }
            }
            return definitions.definitions[key]?.requestCommand != nil
        }
    }

    /// Starts the plugin an entry's settle waits for; the entry stays held until `pluginFinished`.
    func startPlugin(_ waiting: PluginWait) {
        var wait = waiting
        wait.token = flights.nextToken
        flights.nextToken += 1
        let entry = wait.entry
        flights.running[entry.id] = flights.running[entry.id] ?? entry
        let work: @Sendable (Heartbeat) -> PluginAnswer
        switch wait.step {
        case let .parse(result, _, _, _, _):
            let (body, config, environment, stop, cancelled) = (result.body, config, environment, pluginsStop, wait.cancelled)
            work = { heartbeat in
                // A parser the system had no fds or processes for is started again shortly: the
                // answer is in hand, and judging it unread would lose it for good.
                var waitMs: UInt32 = 50
                while true {
                    let parsed = Runner.parse(
                        body, mode: entry.request.response, vars: entry.vars, config: config, environment: environment,
                        heartbeat: heartbeat)
                    guard case let .failure(error) = parsed, error.couldNotStart, !stop.withLock({ $0 }), !cancelled.withLock({ $0 })
                    else { return .parsed(parsed) }
                    usleep(waitMs * 1000)
                    waitMs = min(waitMs * 2, 2_000)
                }
            }
        case let .followUps(payload, outcome, _, _, _):
            // (`settle` asks only with a definition; held, the run's end puts the entry back.)
            guard let definition = definitions.definitions[entry.key] else { return keepUnsettled(entry, plugin: "follow-up's plugin") }
            let staged = stagedSources(of: followUpIDs(definition, entry: entry, outcome: outcome, payload: payload))
            let factory = SendableFactory(factory)
            work = { heartbeat in
                var builder = factory.value
                builder.heartbeat = heartbeat
                var built = payload
                let made = Runner.thenFollowUps(
                    definition, entry: entry, outcome: outcome, payload: &built, factory: builder, stagedSources: staged.files(of:))
                return .followUps((made.followUps, made.failures, built))
            }
        }
        flights.pluginWaits[entry.id] = wait
        let (mailbox, token) = (mailbox, wait.token)
        runBeside(cancelled: wait.cancelled, work) { answer, abandoned in
            mailbox.post(.pluginDone(entryID: entry.id, token: token, answer: answer, abandoned: abandoned))
        }
    }

    /// Runs `work` on a thread of its own, with a heartbeat that kills the plugin it runs on a
    /// stop at once or once `cancelled` is set; `done` gets its answer and whether it was killed so.
    func runBeside<Answer: Sendable>(
        cancelled: Locked<Bool>, _ work: @escaping @Sendable (Heartbeat) -> Answer,
        done: @escaping @Sendable (Answer, Bool) -> Void
    ) {
        let stop = pluginsStop
        Threads.detach {
            let killed = Locked(false)
            // Made on this thread, it is looked at here.
            let heartbeat = Heartbeat(
                everyMs: Int64(Int32.max),
                abandon: {
                    guard stop.withLock({ $0 }) || cancelled.withLock({ $0 }) else { return false }
                    killed.withLock { $0 = true }
                    return true
                }, beat: {})
            let answer = work(heartbeat)
            done(answer, killed.withLock { $0 })
        }
    }

    /// A plugin's answer: the settle goes on with it, unless the entry was cancelled or lost
    /// meanwhile (said when that was noticed), or the plugin was killed by a stop at once
    /// (then the entry goes back to the queue).
    func pluginFinished(entryID: String, token: UInt64, answer: PluginAnswer, abandoned: Bool) {
        if flights.pluginsStopping.remove(token) != nil { return }
        guard let wait = flights.pluginWaits[entryID], wait.token == token else { return }
        flights.pluginWaits[entryID] = nil
        guard let held = flights.running[entryID] else { return }
        var entry = wait.entry
        // A same-body enqueue meanwhile gave it new vars: its outcome and follow-ups use them.
        entry.vars = held.vars
        switch (wait.step, answer) {
        case let (.parse(result, parts, requestID, s3Parts, skipped), .parsed(parsed)):
            if abandoned { return keepUnsettled(entry, plugin: "response parser") }
            settleSuccess(entry, result: result, parts: parts, requestID: requestID, s3Parts: s3Parts, skipped: skipped, parsed: parsed)
        case let (.followUps(payload, outcome, state, reason, cancelsScope), .followUps(built)):
            if abandoned { return keepUnsettled(entry, plugin: "follow-up's plugin") }
            settle(entry, payload: payload, outcome: outcome, state: state, reason: reason, cancelsScope: cancelsScope, built: built)
        default:
            // Each step posts its own kind of answer.
            keepUnsettled(entry, plugin: "plugin")
        }
    }

    /// Kills the plugin of an entry cancelled or lost meanwhile and lets the entry go; false
    /// when no plugin works for it.
    @discardableResult
    func stopPlugin(_ entryID: String) -> Bool {
        guard let wait = flights.pluginWaits.removeValue(forKey: entryID) else { return false }
        wait.cancelled.withLock { $0 = true }
        // Waited for until its thread says the plugin is gone: it must not outlive the run.
        flights.pluginsStopping.insert(wait.token)
        flights.running[entryID] = nil
        return true
    }

    /// The ids this outcome's `then` items name (an item that cannot be rendered names none:
    /// its build fails the same way later).
    func followUpIDs(_ definition: Definition, entry: Entry, outcome: Outcome, payload: JSON) -> [String] {
        (definition.then?[outcome.hookField]?.arrayValue ?? []).compactMap { item in
            (try? Self.rendered(item, entry: entry, outcome: payload, factory: factory))?["id"]?.stringValue
        }
    }

    /// The files existing entries of these ids hold in the store, read on this thread (the
    /// store connection is its own) for a build on another.
    func stagedSources(of ids: [String]) -> StagedSources {
        var files: [String: Result<[String: FileIdentity], OutboxError>] = [:]
        for id in ids where files[id] == nil {
            do { files[id] = .success(try stagedSources(id)) } catch { files[id] = .failure(error) }
        }
        return StagedSources(byID: files)
    }

    // MARK: A chain that waits for its delivery

    /// Whether this outcome's delivery waits for its chain to be built beside this thread: a
    /// chain that waits for delivery (its plugin failed at the settle) and whose build may run a
    /// plugin is started here, once, and the outcome is delivered in a turn after it is built
    /// (`thenAtDelivery` takes the result). On a store runners share, the outcome is no other
    /// runner's yet either: one that claims it first builds the chain again for itself, and
    /// this build is dropped when the claim here fails.
    func buildsChainBeside(_ definition: Definition, outcome: OutcomeRecord) throws(OutboxError) -> Bool {
        guard Settlement.thenWaitsForDelivery(outcome.payload),
            delivery.chainsBuilt[outcome.seq] == nil, followUpsRunPlugins(definition, outcome: outcome.outcome)
        else { return false }
        if delivery.chainsBuilding.contains(outcome.seq) { return true }
        guard let entry = try store.entry(id: outcome.entryID), entry.generation == outcome.generation else { return false }
        var unbuilt = outcome.payload
        unbuilt.remove("follow_up_errors")
        let payload = unbuilt
        let staged = stagedSources(of: followUpIDs(definition, entry: entry, outcome: outcome.outcome, payload: payload))
        let (factory, mailbox, seq, kind) = (SendableFactory(factory), mailbox, outcome.seq, outcome.outcome)
        delivery.chainsBuilding.insert(seq)
        runBeside(cancelled: Locked(false)) { heartbeat -> BuiltFollowUps in
            var builder = factory.value
            builder.heartbeat = heartbeat
            var built = payload
            let made = Runner.thenFollowUps(
                definition, entry: entry, outcome: kind, payload: &built, factory: builder, stagedSources: staged.files(of:))
            return (made.followUps, made.failures, built)
        } done: { built, abandoned in
            mailbox.post(.chainBuilt(seq: seq, generation: entry.generation, built: built, abandoned: abandoned))
        }
        return true
    }

    // MARK: A hook's enqueue lines

    /// Whether reading a hook's enqueue lines may run a plugin: it printed one, and the config
    /// has a headers_command or a definition a request_command.
    func hookLinesRunPlugins(_ stdout: [UInt8]) -> Bool {
        guard config.headersCommand != nil || definitions.definitions.values.contains(where: { $0.requestCommand != nil }) else {
            return false
        }
        return String(decoding: stdout, as: UTF8.self).contains("\"enqueue\"")
    }

    /// Builds the entries a hook that exited 0 asks to enqueue beside this thread; its delivery
    /// counts as running until `hookLinesBuilt`.
    func buildHookLines(seq: Int64, entryID: String, key: String?, process: ProcessResult) {
        delivery.hooksRunning[seq] = entryID
        delivery.linesBuilding[seq] = key
        let ids = process.stdout.split(separator: UInt8(ascii: "\n")).compactMap { line -> String? in
            guard line.first == UInt8(ascii: "{") else { return nil }
            var bytes = Array(line)
            return (try? JSON.parse(bytes: &bytes))?["enqueue"]?["id"]?.stringValue
        }
        let (staged, factory, mailbox) = (stagedSources(of: ids), SendableFactory(factory), mailbox)
        // A delivery is not cancelled with its entry: only a stop at once kills its plugin.
        runBeside(cancelled: Locked(false)) { heartbeat in
            var builder = factory.value
            builder.heartbeat = heartbeat
            return Runner.acknowledgedHookEnqueues(process, parent: entryID, factory: builder, stagedSources: staged.files(of:))
        } done: { result, abandoned in
            mailbox.post(.hookLinesBuilt(seq: seq, result: result, abandoned: abandoned))
        }
    }

    /// A hook's enqueue lines, built: its delivery is acknowledged with them this turn, or fails.
    func hookLinesBuilt(seq: Int64, result: Result<[NewEntry], OutboxError>, abandoned: Bool) throws(OutboxError) {
        guard let key = delivery.linesBuilding.removeValue(forKey: seq), let entryID = delivery.hooksRunning[seq] else { return }
        let failure: String
        switch result {
        case _ where abandoned:
            failure = "the run stopped at once while a plugin read the hook's enqueue lines"
        case let .success(entries):
            delivery.finished.append((seq, key, (delivery.thenAtDelivery.removeValue(forKey: seq) ?? []) + entries))
            return
        case let .failure(problem):
            failure = problem.message
        }
        delivery.hooksRunning[seq] = nil
        try failDelivery(seq: seq, entryID: entryID, failure: failure, now: Identifiers.nowMs())
    }
}

/// Files existing entries hold in the store, by entry id, read ahead of a build on another thread.
struct StagedSources: Sendable {
    let byID: [String: Result<[String: FileIdentity], OutboxError>]

    func files(of id: String) throws(OutboxError) -> [String: FileIdentity] {
        guard let files = byID[id] else {
            // Rendered to another id than a moment ago: built again later.
            var error = OutboxError.invalid("the follow-up id \(id) changed while it was built")
            error.mayPassLater = true
            throw error
        }
        return try files.get()
    }
}

/// The factory, handed to a plugin's thread: its definition lookup reads a set of definitions
/// that no one changes (a reload makes a new factory).
private struct SendableFactory: @unchecked Sendable {
    let value: EntryFactory
    init(_ value: EntryFactory) { self.value = value }
}
