import OutboxEnqueue
import OutboxHTTP
import OutboxModel
import OutboxProcess
import OutboxStore

/// Settling: an entry's generation ends (completed, error, cancelled); its outcome is
/// journaled with the state change and its `then` follow-ups, in one transaction.
extension Runner {
    /// Whether an outcome of this entry is read by anyone: its hook, a `then` follow-up, or
    /// (for a key without a usable definition) a later delivery.
    func outcomeNeeded(_ entry: Entry, outcome: Outcome) -> Bool {
        guard let definition = definitions.definitions[entry.key], definitions.brokenKeys[entry.key] == nil else { return true }
        if entry.request.response != .raw { return true }
        let hook = outcome == .completed ? definition.onSuccess : definition.onError
        return hook != nil || !(definition.then?[outcome.hookField]?.arrayValue ?? []).isEmpty
    }

    /// The number of attempts the outcome reports: the runner's count when it holds the entry.
    func attempts(of entry: Entry) -> Int64 { flights.running[entry.id]?.attempts ?? entry.attempts }

    /// `parsed`: the answer of the entry's response parser, once it ran (`startParser`).
    func settleSuccess(
        _ entry: Entry, result: HTTPResult?, parts: JSON?, requestID: String, s3Parts: [StoredPart]? = nil, skipped: Bool = false,
        parsed: Result<JSON, OutboxError>? = nil
    ) {
        if parsed == nil, let result, Self.needsParser(entry, result: result) {
            startPlugin(
                PluginWait(
                    entry: entry, step: .parse(result: result, parts: parts, requestID: requestID, s3Parts: s3Parts, skipped: skipped)))
            return
        }
        var built = OutcomePayloads.success(
            entry, result: result, parts: parts, attempts: attempts(of: entry), requestID: requestID, at: Identifiers.nowMs(),
            maxResponseBytes: config.maxResponseBytes,
            parse: { parsed ?? Runner.parse($0, mode: $1, vars: $2, config: config, environment: environment) })
        if entry.request.s3 != nil {
            built.payload.set("s3", Self.s3Outcome(entry, result: result, parts: s3Parts, skipped: skipped))
        }
        // Without an on_error hook nothing else would show it: the entry is completed, never sent again.
        if built.outcome == .error, let message = built.payload["error"]?["message"]?.stringValue {
            log(
                "outbox: \(entry.id) was answered and is completed, but its response was not read: \(message)", level: .warn,
                fields: [("id", .string(entry.id))])
        }
        // A skipped upload's state event and the run's summary say so.
        let reason = built.reason ?? (skipped && built.outcome == .completed ? "skipped" : nil)
        settle(entry, payload: built.payload, outcome: built.outcome, state: .completed, reason: reason)
    }

    /// Reads a response body as the definition's `response` says.
    package static func parse(
        _ body: [UInt8], mode: ResponseMode, vars: JSON, config: Config, environment: [String: String],
        heartbeat: Heartbeat? = nil
    )
        -> Result<JSON, OutboxError>
    {
        switch mode {
        case .raw: return .success(.null)
        case .json:
            if body.allSatisfy({ $0 == 0x20 || $0 == 0x09 || $0 == 0x0A || $0 == 0x0D }) { return .success(.null) }
            // Parsed as the bytes came: text that is not UTF-8 is refused, not repaired.
            var bytes = body
            do { return .success(try JSON.parse(bytes: &bytes)) } catch {
                return .failure(.invalid("the response is not valid JSON: \(error)"))
            }
        case let .command(command):
            var input: JSON = .object([("vars", vars)])
            bodyJSON(body, into: &input, field: "raw")
            do {
                return .success(
                    try Plugin.runJSON(
                        command, input: input, name: "the response parser \(command.json.serialized().prefix(120))", config: config,
                        environment: environment,
                        heartbeat: heartbeat))
            } catch {
                return .failure(error)
            }
        }
    }

    /// Settles with an error that came from no response (expired, file).
    func settleError(_ entry: Entry, kind: ErrorKind, message: String, state: EntryState, reason: String) {
        settleWithError(
            entry, error: OutcomePayloads.error(kind, message), response: nil, state: state, reason: reason,
            requestID: entry.lastRequestID ?? "")
    }

    func settleWithError(_ entry: Entry, error: JSON, response: HTTPResult?, state: EntryState, reason: String, requestID: String) {
        let payload = OutcomePayloads.failed(
            entry, error: error, response: response, attempts: attempts(of: entry),
            requestID: requestID, at: Identifiers.nowMs())
        settle(entry, payload: payload, outcome: .error, state: state, reason: reason, cancelsScope: entry.request.cancelScopeOnError)
    }

    /// What building an outcome's `then` follow-ups gave: the entries, the items that could not
    /// be built, and the payload (with `follow_up_errors` when one could not).
    package typealias BuiltFollowUps = (followUps: [NewEntry], failures: [FollowUpFailure], payload: JSON)

    /// Journals an entry's outcome with its state change and its `then` follow-ups. Follow-ups
    /// whose build may run a plugin are built beside this thread first (`startPlugin`), and
    /// the settle comes back here with them (`built`). `cancelsScope`: an error outcome that
    /// cancels the entries behind it in its scope (`cancel_scope_on_error`).
    func settle(
        _ entry: Entry, payload: JSON, outcome: Outcome, state: EntryState, reason: String?, cancelsScope: Bool = false,
        built prebuilt: BuiltFollowUps? = nil
    ) {
        let definition = definitions.definitions[entry.key]
        let hook = outcome == .completed ? definition?.onSuccess : definition?.onError
        // An outcome whose key has no definition waits (unhandled-key): never acknowledged here.
        var hookExists = definition == nil || definitions.brokenKeys[entry.key] != nil || hook != nil
        if definition == nil { settledUnhandled = true }
        var payload = payload
        var followUps: [NewEntry] = []
        var failures: [FollowUpFailure] = []
        // Most definitions chain nothing: spared the copy of the factory a call would make.
        if let definition, definition.then != nil {
            let built: BuiltFollowUps
            if let prebuilt {
                built = prebuilt
            } else if followUpsRunPlugins(definition, outcome: outcome) {
                startPlugin(
                    PluginWait(
                        entry: entry,
                        step: .followUps(payload: payload, outcome: outcome, state: state, reason: reason, cancelsScope: cancelsScope)))
                return
            } else {
                let abandoned = pluginsAbandoned
                var builtPayload = payload
                let made = Self.thenFollowUps(
                    definition, entry: entry, outcome: outcome, payload: &builtPayload, factory: factory, stagedSources: stagedSources)
                if pluginsAbandoned != abandoned {
                    keepUnsettled(entry, plugin: "follow-up's plugin")
                    return
                }
                built = (made.followUps, made.failures, builtPayload)
            }
            (followUps, failures) = (built.followUps, built.failures)
            if let later = failures.first(where: \.mayPassLater) {
                // A plugin that did not answer may answer later, a definition with errors may be
                // fixed: the chain is built again at delivery, which fails and is retried until
                // it can be (never dropped).
                Settlement.markThenForDelivery(
                    &payload,
                    because:
                        "a follow-up could not be built yet (\(later.message)); the then follow-ups are built again when this outcome is delivered"
                )
                log(
                    "outbox: the follow-ups of \(entry.id) wait for its delivery: \(later.message)", level: .warn,
                    fields: [("id", .string(entry.id))])
                failures = []
                hookExists = true
            } else {
                payload = built.payload
            }
        } else if definition == nil {
            // Its `then` lists, if any, are not known yet: they are built when the outcome is
            // delivered, from the definition loaded then (an outcome without one waits for it).
            Settlement.markThenForDelivery(
                &payload,
                because:
                    "no definition of \(entry.key) was loaded when the entry settled: its then follow-ups, if any, are enqueued when this outcome is delivered"
            )
        }
        flights.running[entry.id] = nil
        if outcome == .error { abortS3Upload(entry) }
        logUnbuilt(failures, of: entry.id)
        var settlement = Settlement(
            entryID: entry.id, generation: entry.generation, state: state, reason: reason,
            outcome: outcome, payload: payload, hookExists: hookExists, followUps: followUps)
        settlement.snapshot = entry
        changes.append(.settle(settlement))
        pendingSettles.append((entry, state, reason))
        if cancelsScope, let scope = entry.scope {
            // Entries behind it in its scope are cancelled in the same transaction, each with an error outcome.
            let payloadFor: @Sendable (Entry) -> (JSON, Bool) = { [definitions] behind in
                let payload = OutcomePayloads.cancelledByScope(behind, failed: entry.id, scope: scope, at: Identifiers.nowMs())
                let definition = definitions.definitions[behind.key]
                return (payload, definition?.onError != nil || definition == nil)
            }
            changes.append(.cancelScope(scope: scope, afterSeq: entry.seq, payloadFor: payloadFor))
        }
    }

    /// An entry whose settle needed a plugin that a stop at once killed: not settled, it stays
    /// held, and the run's end puts it back in the queue to be sent again.
    func keepUnsettled(_ entry: Entry, plugin: String) {
        flights.running[entry.id] = entry
        log(
            "outbox: the run stopped at once while the \(plugin) of \(entry.id) ran; the plugin was killed and the entry goes back to the queue",
            level: .warn, fields: [("id", .string(entry.id))])
    }

    /// Reports this turn's settles once the store applied them; one that another process's
    /// cancel beat reports that cancel instead.
    func reportSettles(fencedOut: Set<String>) {
        let settled = pendingSettles
        pendingSettles.removeAll()
        for (entry, state, reason) in settled {
            if fencedOut.contains(entry.id) {
                // Shared by runners, the entry may have been taken over, not cancelled: then
                // the runner that holds it now reports it.
                if lostToAnotherRunner(entry) {
                    log(
                        "outbox: lost the lease on \(entry.id) (another runner may send it); its result was not recorded",
                        level: .warn, fields: [("id", .string(entry.id))])
                    continue
                }
                reportCancelled(entry)
                continue
            }
            emitState(entry, state: state, reason: reason)
            // A completed entry whose response could not be parsed still counts as completed.
            if state == .completed {
                summary.completed += 1
                if reason == "skipped" { summary.skipped += 1 }
            } else {
                summary.errors += 1
                if state == .error { summary.erroredIDs.append(entry.id) }
            }
        }
    }

    /// An entry another process cancelled while this runner held it.
    func reportCancelled(_ entry: Entry) {
        // As far as this runner got: its attempts, and the bytes of the parts accepted.
        var shown = flights.running[entry.id] ?? entry
        if let job = flights.partJobs[entry.id] { shown.bytesSent = job.acceptedBytes }
        emitState(shown, state: .cancelled, reason: "user")
        summary.cancelled += 1
    }

    /// The file the stored entry of `id` holds in the store, by source path: a follow-up or
    /// hook line naming that path means those bytes (its source may have left).
    func stagedSources(_ id: String) throws(OutboxError) -> [String: FileIdentity] {
        try store.entry(id: id)?.stagedSources ?? [:]
    }

    /// A `then` item that could not be built: its place in the list, why, and whether it may
    /// be built later (a plugin failed, its definition has errors).
    package typealias FollowUpFailure = (index: Int, message: String, mayPassLater: Bool)

    /// The log's one line for a chain that was not applied (none of its follow-ups is).
    private func logUnbuilt(_ failures: [FollowUpFailure], of entryID: String) {
        guard !failures.isEmpty else { return }
        // A chain that stops here is a failure of the run, as an entry settled error is.
        summary.unbuiltFollowUpIDs.append(entryID)
        log(
            "outbox: the follow-ups of \(entryID) were not enqueued: \(failures.map(\.message).joined(separator: "; "))",
            level: .error, fields: [("id", .string(entryID))])
    }

    /// The `then` follow-ups of an outcome whose chain waits for its delivery, built now from
    /// `definition` (the one loaded at delivery) and applied with its acknowledgement. Its
    /// hook's input loses the note, and gets `follow_up_errors` of its own when one cannot be
    /// built (then none is enqueued, as at a settle). The entry replaced meanwhile (another
    /// generation), the note stays and nothing is built. When a follow-up may be built later (its
    /// plugin failed, its definition has errors), nothing changes and the failure is returned:
    /// the delivery fails and is tried again.
    /// Nil when a stop at once killed a follow-up's plugin meanwhile.
    func thenAtDelivery(_ definition: Definition, outcome: inout OutcomeRecord) throws(OutboxError) -> Result<[NewEntry], OutboxError>? {
        guard let entry = try store.entry(id: outcome.entryID), entry.generation == outcome.generation else { return .success([]) }
        var payload = outcome.payload
        payload.remove("follow_up_errors")
        let built: BuiltFollowUps
        if let ready = delivery.chainsBuilt.removeValue(forKey: outcome.seq), ready.generation == entry.generation {
            // Built beside this thread just before (`buildsChainBeside`).
            built = ready.built
            payload = built.payload
        } else {
            let abandoned = pluginsAbandoned
            let made = Self.thenFollowUps(
                definition, entry: entry, outcome: outcome.outcome, payload: &payload, factory: factory, stagedSources: stagedSources)
            if pluginsAbandoned != abandoned { return nil }
            built = (made.followUps, made.failures, payload)
        }
        if let later = built.failures.first(where: \.mayPassLater) {
            var failure = OutboxError.invalid("its then follow-ups could not be built: \(later.message)")
            failure.mayPassLater = true
            return .failure(failure)
        }
        logUnbuilt(built.failures, of: entry.id)
        outcome.payload = payload
        return .success(built.followUps)
    }

    /// Renders one `then` item with `outcome.*` and builds its entry (`simulate` too);
    /// The `then` follow-ups of an outcome (for `run` and `simulate` alike). Never half a chain:
    /// when one cannot be built none is, and the outcome (its hook's input, `show`) says why
    /// in `follow_up_errors`.
    package static func thenFollowUps(
        _ definition: Definition?, entry: Entry, outcome: Outcome, payload: inout JSON, factory: EntryFactory,
        stagedSources: (String) throws(OutboxError) -> [String: FileIdentity] = { _ in [:] }
    ) -> (followUps: [NewEntry], failures: [FollowUpFailure]) {
        var followUps: [NewEntry] = []
        var failures: [FollowUpFailure] = []
        var failed: [JSON] = []
        for (index, item) in (definition?.then?[outcome.hookField]?.arrayValue ?? []).enumerated() {
            do {
                followUps.append(try followUp(item, entry: entry, outcome: payload, factory: factory, stagedSources: stagedSources))
            } catch {
                failures.append((index, error.message, error.mayPassLater))
                failed.append(.object([("index", .int(index)), ("key", item["key"] ?? .null), ("message", .string(error.message))]))
            }
        }
        if failed.isEmpty { return (followUps, []) }
        payload.set("follow_up_errors", .array(failed))
        return ([], failures)
    }

    /// A `then` item with its templates rendered from the entry and its outcome.
    static func rendered(_ item: JSON, entry: Entry, outcome: JSON, factory: EntryFactory) throws(OutboxError) -> JSON {
        var inputs = RenderInputs(id: entry.id, vars: entry.vars, environment: factory.environment, cwd: factory.config.root)
        inputs.outcome = outcome
        return try Template.renderTree(item, context: RequestBuilder.context(inputs), field: "then")
    }

    /// `stagedSources` gives the files an existing entry of an id holds in the store.
    package static func followUp(
        _ item: JSON, entry: Entry, outcome: JSON, factory: EntryFactory,
        stagedSources: (String) throws(OutboxError) -> [String: FileIdentity] = { _ in [:] }
    ) throws(OutboxError) -> NewEntry {
        let rendered = try rendered(item, entry: entry, outcome: outcome, factory: factory)
        guard let key = rendered["key"]?.stringValue else { throw .invalid("then: key must be a string") }
        // A value of another type is refused, not dropped: an id lost would lose the same-id
        // rules, a delay lost would send at once. Inside other text a number renders as text.
        var notBefore: Int64?
        if let value = rendered["delay"], value != .null {
            // A number counts as its digits, as one written in the file does (a bare 0 is a duration).
            let delay: String
            switch value {
            case let .string(text): delay = text
            case let .number(digits): delay = digits
            default: throw .invalid("then.delay must give a duration such as \"5m\", not \(value.serialized())")
            }
            do { notBefore = Identifiers.nowMs() + (try Units.parseDuration(delay)) } catch {
                throw .invalid("then.delay: \(error.message)")
            }
        }
        var id: String?
        if let value = rendered["id"], value != .null {
            guard let text = value.stringValue else {
                throw .invalid("then.id must give a string, not \(value.serialized()) (write it inside text: \"order-{{ ... }}\")")
            }
            id = text
        }
        var made = try factory.make(
            key: key, vars: rendered["vars"] ?? .null, id: id, parent: entry.id, notBefore: notBefore, outcome: outcome,
            movedFiles: try id.map(stagedSources) ?? [:])
        made.resendsBeforeDelivery = made.id == entry.id
        // Vars rendered from `env` are secrets in the follow-up, as are vars holding a secret
        // var of the parent (down a chain of any length), and so is a header holding one.
        let fromEnvironment = SecretVars.environmentPaths(in: item["vars"] ?? .null)
        let inherited = SecretVars.texts(at: entry.request.secretVars, in: entry.vars)
        if !fromEnvironment.isEmpty || !inherited.isEmpty {
            let secrets = (SecretVars.texts(at: fromEnvironment, in: made.vars) + inherited).filter { !$0.isEmpty }
            let holding = SecretVars.paths(in: made.vars) { secrets.map { Array($0.utf8) } }
            for path in fromEnvironment + holding where !made.prepared.secretVars.contains(path) { made.prepared.secretVars.append(path) }
            for (name, value) in made.prepared.headers where secrets.contains(where: { value.contains($0) }) {
                made.prepared.secretHeaders.insert(name.lowercased())
            }
        }
        return made
    }
}
