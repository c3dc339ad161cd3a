import OutboxEnqueue
import OutboxHTTP
import OutboxModel
import OutboxProcess
import OutboxRunner
import OutboxStore

/// `outbox simulate`: a definition's accept rules, response parser and hook run on a made-up
/// response, with no network and no store: how a user tries a hook script.
enum SimulateCommand {
    static let options: [OptionSpec] = [
        EnqueueCommand.varsOption,
        OptionSpec(name: "id", valueName: "ID", help: "the entry id the hook sees (default simulate-1)", completes: .ids),
        OptionSpec(name: "status", valueName: "N", help: "the response's final HTTP status, 200-599 (required)", completes: .nothing),
        OptionSpec(
            name: "header", valueName: "'Name: value'", help: "a response header (repeatable)", repeatable: true, completes: .nothing),
        OptionSpec(name: "body", valueName: "B", help: "the response body", completes: .nothing),
        OptionSpec(name: "body-file", valueName: "F", help: "the response body, from a file"),
        OptionSpec(name: "plugins", valueName: nil, help: "run request_command and headers_command to render the request"),
        CLI.json,
    ]

    static let details = """
        Classifies the response as the runner would (accept rules, retry and terminal classes),
        builds the outcome (the response parser runs for a success), and runs the matching hook
        with it on stdin. Nothing is sent and nothing is stored; `then` follow-ups and enqueue
        lines a hook prints are listed, not enqueued. The exit status is the hook's (0 when no
        hook runs: a retry, a park, or no hook for that outcome).
        """

    static func run(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        let key = i.args.positionals[0]
        guard let statusText = i.args.value("status") else { throw .usage("simulate needs --status N") }
        // A 1xx answer is never a request's last: a runner reads on, and one that ends there is
        // a failed attempt (network), not a status to classify.
        guard let status = Units.wholeNumber(statusText, in: 200...599) else {
            throw .usage("--status must be a final HTTP status from 200 to 599, not \(Units.quoted(statusText, limit: 20))")
        }
        var headers: [(name: String, value: String)] = []
        let given = i.args.values("header")
        for (position, text) in given.enumerated() {
            // A header may hold a credential (a cookie, a token): named by its position, never echoed.
            let which = "--header \(position + 1) of \(given.count)"
            guard let colon = text.firstIndex(of: ":") else {
                throw .usage("\(which) has no ':': headers are written 'Name: value' (not shown: it may hold a credential)")
            }
            // A line break would end the header where a server's would: refuse it, never cut.
            if let problem = HeaderRules.valueProblem(text) { throw .usage("\(which): \(problem)") }
            let name = String(text[..<colon]).trimmingSpaces
            if name.isEmpty { throw .usage("\(which) has no name before its ':' (not shown: it may hold a credential)") }
            if HeaderRules.nameProblem(name) != nil {
                throw .usage("\(which): the text before its ':' is not a header name (not shown: it may hold a credential)")
            }
            let value = String(text[text.index(after: colon)...]).trimmingSpaces
            headers.append((name: name.lowercased(), value: value))
        }
        if i.args.value("body") != nil && i.args.value("body-file") != nil { throw .usage("give --body or --body-file, not both") }
        let project = try i.project()
        let config = project.config
        var body = Array((i.args.value("body") ?? "").utf8)
        if let file = i.args.value("body-file") {
            // Read a byte past the cap: a bigger body is truncated as the runner would.
            body = try EnqueueCommand.readFile(
                Paths.absolute(file, relativeTo: i.cwd), limit: Int(min(config.maxResponseBytes, 1 << 40)) + 1, what: "--body-file",
                truncating: true)
        }
        let truncated = Int64(body.count) > config.maxResponseBytes
        if truncated { body = Array(body.prefix(Int(config.maxResponseBytes))) }
        let definition = try project.definition(key)
        let (rendered, _) = try EnqueueCommand.preview(&i, key: key, defaultID: "simulate-1")
        guard let new = rendered else { throw .usage("\(key) is built by its request_command: simulate it with --plugins") }
        let entry = simulated(new)
        let result = HTTPResult(status: status, headers: headers, body: body, bodyTruncated: truncated)
        let klass = AttemptClassifier.classify(
            status: status, failure: nil, body: body, accept: entry.request.accept, exempt: Set(entry.request.retry.exempt))
        let now = Identifiers.nowMs()
        var payload: JSON
        let outcome: Outcome
        switch klass {
        case let .retry(reason):
            return report(&i, klass: klass, note: "the runner would retry it later (\(reason)); no hook runs", outcome: nil)
        case .awaitingAuth:
            return report(&i, klass: klass, note: "the runner would park it awaiting-auth; no hook runs", outcome: nil)
        case .success:
            let built = OutcomePayloads.success(
                entry, result: result, parts: nil, attempts: 1, requestID: "simulated", at: now, maxResponseBytes: config.maxResponseBytes,
                parse: { Runner.parse($0, mode: $1, vars: $2, config: config, environment: i.environment) })
            (payload, outcome) = (built.payload, built.outcome)
        case let .terminal(reason):
            let error = OutcomePayloads.error(.http, reason, status: status, body: body)
            payload = OutcomePayloads.failed(entry, error: error, response: result, attempts: 1, requestID: "simulated", at: now)
            outcome = .error
        }
        // The follow-ups as the runner builds them: one that cannot be built voids the chain,
        // and the hook's input names it.
        let factory = try followUpFactory(project, i)
        let built = Runner.thenFollowUps(definition, entry: entry, outcome: outcome, payload: &payload, factory: factory)
        let followUps = built.followUps.map(\.key)
        let followUpErrors = built.failures.map {
            "then.\(outcome.hookField)[\($0.index)]: \($0.message)"
                + ($0.mayPassLater ? " (it may pass later: a runner builds the chain again when it delivers the outcome)" : "")
        }
        if let later = built.failures.first(where: \.mayPassLater) {
            // The runner holds such an outcome, its hook not run, and delivers it once the
            // chain can be built: a failed delivery until then.
            return report(
                &i, klass: klass,
                note:
                    "outcome \(outcome.rawValue); the runner would hold it and run no hook until its then follow-ups can be built (\(later.message)); each delivery until then fails",
                outcome: Runner.hookPayload(payload, deliveries: 1), followUpErrors: followUpErrors, status: 1)
        }
        let record = OutcomeRecord(
            seq: 0, entryID: entry.id, key: key, generation: 1, outcome: outcome, payload: payload, deliveries: 0, acknowledged: false,
            nextDeliveryAt: nil, reason: nil, hookPgid: nil, hookStart: nil, createdAt: now)
        guard let hook = outcome == .completed ? definition.onSuccess : definition.onError else {
            return report(
                &i, klass: klass, note: "outcome \(outcome.rawValue); the definition has no hook for it",
                outcome: Runner.hookPayload(payload, deliveries: 1), followUps: followUps, followUpErrors: followUpErrors)
        }
        let ran: ProcessResult
        do {
            ran = try ProcessRunner.run(
                Runner.hookSpec(hook, outcome: record, deliveries: 1, config: config, environment: EncodedEnvironment(i.environment)))
        } catch {
            throw .invalid("the hook could not start: \(error.message)")
        }
        let exited = ran.exitStatus ?? (128 + (ran.signal ?? 0))
        var exit = exited
        // The lines of a hook that exited 0 are applied, by the runner's rules; an invalid one
        // fails the delivery (nothing applied, delivered again), so simulate fails too.
        var enqueues: [String] = []
        var lineProblem: String?
        if exit == 0 {
            switch Runner.acknowledgedHookEnqueues(ran, parent: entry.id, factory: factory) {
            case let .success(entries): enqueues = entries.map(\.key)
            case let .failure(problem):
                lineProblem = problem.message
                exit = 1
            }
        }
        if i.json {
            i.console.out(
                JSON.object([
                    ("class", .string(klass.name)), ("outcome", Runner.hookPayload(payload, deliveries: 1)),
                    ("hook_exit", .int(Int(exited))),
                    ("hook_stdout", .string(String(decoding: ran.stdout, as: UTF8.self))),
                    ("hook_stderr", .string(String(decoding: ran.stderr, as: UTF8.self))),
                    ("follow_ups", .array(followUps.map { .string($0) })),
                    ("follow_up_errors", .array(followUpErrors.map { .string($0) })),
                    ("hook_enqueues", .array(enqueues.map { .string($0) })), ("hook_problem", .optionalString(lineProblem)),
                ]).serialized())
        } else {
            i.console.write(String(decoding: ran.stdout, as: UTF8.self))
            i.console.rawErr(String(decoding: ran.stderr, as: UTF8.self))
            if let lineProblem { i.console.err("outbox: \(lineProblem)") }
            let why = Runner.whyHookDidNotRun(
                ran.exitStatus, hook: hook, field: outcome.hookField, config: config, environment: i.environment)
            i.console.err(
                "outbox: outcome \(outcome.rawValue) delivered to the hook, which exited \(exited)" + (why.map { " (\($0))" } ?? "")
                    + (exit == 0 ? " (acknowledged)" : " (it would be delivered again)"))
            reportFollowUps(&i, followUps, followUpErrors)
            if !enqueues.isEmpty { i.console.err("outbox: the hook's enqueue lines would enqueue: \(enqueues.joined(separator: ", "))") }
        }
        return exit
    }

    /// The runner's rules for what an outcome enqueues; plugins run only with --plugins (a
    /// follow-up whose definition needs its request_command is then an error naming it).
    static func followUpFactory(_ project: Project, _ i: Invocation) throws(OutboxError) -> EntryFactory {
        var config = project.config
        let plugins = i.args.flag("plugins")
        if !plugins { config.headersCommand = nil }
        var factory = EntryFactory(config: config, environment: i.environment, cwd: try i.cwd) { (key: String) throws(OutboxError) in
            let definition: Definition
            do throws(OutboxError) { definition = try project.definition(key) } catch {
                let broken = project.definitions.brokenKeys[key] != nil
                throw error.code == .invalid || broken ? Runner.unknownKey(key, in: project.definitions) : error
            }
            if !plugins, definition.requestCommand != nil {
                throw .usage("\(key) is built by its request_command (--plugins runs it)")
            }
            return definition
        }
        // As the runner builds follow-ups: the account's variable unset is no account.
        factory.unsetAccountIsNone = true
        return factory
    }

    static func reportFollowUps(_ i: inout Invocation, _ followUps: [String], _ errors: [String]) {
        if !followUps.isEmpty { i.console.err("outbox: then would enqueue: \(followUps.joined(separator: ", "))") }
        for error in errors { i.console.err("outbox: then would enqueue nothing: \(error)") }
    }

    /// What happened when no hook ran.
    static func report(
        _ i: inout Invocation, klass: AttemptOutcomeClass, note: String, outcome: JSON?, followUps: [String] = [],
        followUpErrors: [String] = [], status: Int32 = 0
    ) -> Int32 {
        if i.json {
            i.console.out(
                JSON.object([
                    ("class", .string(klass.name)), ("outcome", outcome ?? .null), ("hook_exit", .null), ("note", .string(note)),
                    ("follow_ups", .array(followUps.map { .string($0) })),
                    ("follow_up_errors", .array(followUpErrors.map { .string($0) })),
                ]).serialized())
        } else {
            if let outcome { i.console.out(outcome.pretty()) }
            i.console.err("outbox: \(note)")
            reportFollowUps(&i, followUps, followUpErrors)
        }
        return status
    }

    /// The entry the runner would hold: the rendered request as stored, not yet attempted.
    static func simulated(_ new: NewEntry) -> Entry {
        let request = StoredRequest(prepared: new.prepared, form: [])
        let now = Identifiers.nowMs()
        return Entry(
            seq: 0, id: new.id, internalID: new.id, key: new.key, vars: new.vars, state: .running, reason: nil, generation: 1,
            request: request, body: .none, bodyHash: new.prepared.bodyHash, totalBytes: 0, bytesSent: 0, attempts: 1,
            idempotencyKey: new.prepared.idempotencyKey, account: new.account, scope: new.prepared.scope, parent: nil,
            headerGeneration: 0, createdAt: now, updatedAt: now, expiresAt: nil, notBefore: nil, nextAttemptAt: nil, leaseOwner: nil,
            lastRequestID: nil, waitsForDelivery: false)
    }
}
