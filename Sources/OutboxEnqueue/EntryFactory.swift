import OutboxModel
import OutboxProcess

/// Renders definitions into entries ready to enqueue: vars checks, plugins, templates.
///
/// Used by `enqueue` and by the runner for `then` follow-ups and hook-printed enqueues, so
/// both apply exactly the same rules.
package struct EntryFactory {
    package let config: Config
    package let environment: [String: String]
    package let cwd: String
    let definition: (String) throws(OutboxError) -> Definition
    /// The `env` root, built once: sorting the environment for every entry of a 100,000-line
    /// `--from` file cost a fifth of the enqueue.
    let environmentJSON: JSON
    let ownFiles: OwnFiles
    /// Kept beating while a plugin runs (the runner's leases), on the thread that made it.
    package var heartbeat: Heartbeat?
    /// A runner (and `explain`, which speaks for one) with the account's variable unset has
    /// no account: it runs only entries without one. `enqueue` refuses it instead, since an
    /// entry left without an account would run on every runner.
    package var unsetAccountIsNone = false

    package init(
        config: Config, environment: [String: String], cwd: String,
        definition: @escaping (String) throws(OutboxError) -> Definition
    ) {
        self.config = config
        self.environment = environment
        self.cwd = cwd
        self.definition = definition
        environmentJSON = RequestBuilder.environmentJSON(environment)
        ownFiles = OwnFiles(config)
    }

    /// Checks vars: an object or null, within `max_vars_bytes` of compact JSON, nested no
    /// deeper than JSON input may be. Vars a follow-up renders from an outcome (which holds
    /// the vars before them) would otherwise nest deeper each generation, until the store
    /// could not read them back.
    package func checkVars(_ vars: JSON) throws(OutboxError) {
        switch vars {
        case .object, .null: break
        default: throw .invalid("vars must be a JSON object, not \(vars.typeName)")
        }
        if vars.nests(deeperThan: JSON.maxDepth) {
            throw .invalid("vars nest deeper than \(JSON.maxDepth) levels")
        }
        let size = vars.serialized().utf8.count
        if Int64(size) > config.maxVarsBytes {
            throw .invalid("vars are \(size) bytes of JSON, over max_vars_bytes (\(config.maxVarsBytes))")
        }
    }

    /// The account of this process, rendered from its environment; nil when the config has
    /// none or it renders empty (`{{ env.X | default("") }}`). A variable it names that is
    /// unset is an error (see `unsetAccountIsNone`).
    package func account() throws(OutboxError) -> String? {
        guard let template = config.account else { return nil }
        var inputs = RenderInputs(id: "", vars: .null, environment: environment, cwd: cwd)
        inputs.environmentJSON = environmentJSON
        let value: JSON
        do {
            value = try Template.render(template, context: RequestBuilder.context(inputs), mode: .value, field: "account")
        } catch {
            if unsetAccountIsNone { return nil }
            throw error
        }
        if value == .null { return nil }
        let s = value.stringValue ?? value.serialized()
        return s.isEmpty ? nil : s
    }

    package func make(
        key: String, vars: JSON, id: String?, parent: String? = nil, notBefore: Int64? = nil,
        expiresAt: Int64? = nil, outcome: JSON? = nil, movedFiles: [String: FileIdentity] = [:]
    ) throws(OutboxError) -> NewEntry {
        let def = try definition(key)
        return try make(
            definition: def, vars: vars, id: id, parent: parent, notBefore: notBefore, expiresAt: expiresAt, outcome: outcome,
            movedFiles: movedFiles)
    }

    /// `movedFiles`: files the existing entry of this id moved into the store (see `RenderInputs`).
    package func make(
        definition def: Definition, vars: JSON, id: String?, parent: String? = nil, notBefore: Int64? = nil,
        expiresAt: Int64? = nil, outcome: JSON? = nil, movedFiles: [String: FileIdentity] = [:]
    ) throws(OutboxError) -> NewEntry {
        try checkVars(vars)
        let entryID = id ?? Identifiers.entryUUID()
        if let problem = Identifiers.validateUserID(entryID) { throw .invalid(problem) }
        var inputs = RenderInputs(id: entryID, vars: vars, environment: environment, cwd: cwd)
        inputs.outcome = outcome
        inputs.movedFiles = movedFiles
        inputs.environmentJSON = environmentJSON
        inputs.ownFiles = ownFiles
        if let command = config.headersCommand {
            let answer = try Plugin.runJSON(
                command, input: .object([("key", .string(def.key)), ("vars", vars)]),
                name: "headers_command", config: config, environment: environment, heartbeat: heartbeat)
            inputs.commandHeaders = try HeaderRules.fromPlugin(answer, plugin: "headers_command")
        }
        let prepared: PreparedRequest
        if let command = def.requestCommand {
            let descriptor = try Plugin.runJSON(
                command, input: .object([("vars", vars), ("entry", .object([("id", .string(entryID))]))]),
                name: "request_command", config: config, environment: environment, heartbeat: heartbeat)
            // The answer is data: only its part.* tags are rendered, per part.
            let (tree, literals) = PluginAnswer.literalized(descriptor)
            var literalInputs = inputs
            literalInputs.literals = literals
            prepared = try RequestBuilder.prepare(
                request: tree, definition: def, config: config,
                inputs: literalInputs, fromCommand: true)
        } else {
            prepared = try RequestBuilder.prepare(request: def.request ?? .object([]), definition: def, config: config, inputs: inputs)
        }
        // Held past its expiry, or expired already, an entry could only expire unsent: refused,
        // not accepted to be lost. Less than a second to be sent in counts too: a hold as long
        // as the lifetime (`--delay 14d`) ends a few milliseconds before the expiry.
        let now = Identifiers.nowMs()
        let expires = expiresAt ?? Identifiers.expiry(now: now, lifetimeMs: prepared.expiresInMs)
        if let notBefore, expires - max(notBefore, now) < NewEntry.shortestWindowMs {
            throw .invalid(
                "the entry would expire (\(Units.rfc3339(ms: expires))) before it may be sent (\(Units.rfc3339(ms: notBefore))) or within a second of it: give a later expiry (--expires-at, expires_in) or an earlier hold"
            )
        }
        if expires - now < NewEntry.shortestWindowMs {
            throw .invalid(
                "the entry would expire (\(Units.rfc3339(ms: expires))) before it could be sent: give a later expiry (--expires-at, expires_in)"
            )
        }
        var entry = NewEntry(
            id: entryID, key: def.key, vars: vars, prepared: prepared, account: try account(), parent: parent,
            notBefore: notBefore, expiresAt: expiresAt)
        entry.idWasMinted = id == nil
        return entry
    }
}
