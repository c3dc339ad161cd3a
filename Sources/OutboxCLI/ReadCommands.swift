import OutboxModel
import OutboxStore

/// Commands that only read: list, show, chunk-plan, stats, explain, audit, schema.
enum ReadCommands {
    /// The state a person sees: a queued entry held by a queue or key pause shows `paused`.
    static func displayState(_ e: Entry, control: QueueControl) -> String {
        displayState(e.state.rawValue, key: e.key, control: control)
    }

    static func displayState(_ state: String, key: String, control: QueueControl) -> String {
        state == EntryState.queued.rawValue && control.isPaused(key: key) ? EntryState.paused.rawValue : state
    }

    static func list(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        if let state = i.args.value("state"), EntryState(rawValue: state) == nil {
            throw .usage(
                "--state must be one of \(EntryState.allCases.map(\.rawValue).joined(separator: ", ")), not \(Units.quoted(state))")
        }
        try ControlCommands.checkKeys(i.args.values("key"))
        // No entry has an empty id: asked for, it is a mistake (an unset shell variable), as for `show`.
        // An id no entry can have is refused as `show` and `cancel` refuse it, not answered "no entries".
        if let id = i.args.value("id"), let problem = Identifiers.validateUserID(id) { throw .invalid("--id: \(problem)") }
        let project = try i.project()
        guard !project.storeNotMadeYet else {
            // Said on stderr with --json too: a mistyped store path must not pass for an empty queue.
            if i.json { i.console.out("[]") }
            i.console.err(i.json ? "outbox: \(project.noStoreYet)" : "no entries (\(project.noStoreYet))")
            return 0
        }
        let store = try project.store()
        let control = try store.control()
        if i.json {
            let filter = ListFilter(key: i.args.value("key"), id: i.args.value("id"), state: i.args.value("state"))
            try store.writeListRows(filter, displayState: { displayState($0, key: $1, control: control) }) { i.console.write($0) }
            return 0
        }
        let filter = ListFilter(key: i.args.value("key"), id: i.args.value("id"), state: i.args.value("state"))
        let header = ["ID", "KEY", "STATE", "ATTEMPTS", "PROGRESS", "NEXT", "UPDATED"]
        // A row is kept as one line of cells (not as an entry): a list of 300,000 stays small.
        var lines: [String] = []
        var widths = header.map(\.count)
        let now = Identifiers.nowMs()
        try store.forEachListRow(filter) { r in
            let state = displayState(r.state, key: r.key, control: control)
            if let wanted = filter.state, wanted != state { return }
            let progress = r.totalBytes > 0 ? "\(Units.formatBytes(r.bytesSent))/\(Units.formatBytes(r.totalBytes))" : "-"
            // A queued entry is due at the later of its retry time and its delay (a new one now).
            let due = r.state == "queued" ? max(r.nextAttemptAt ?? 0, r.notBefore ?? 0) : r.nextAttemptAt
            var next = due.map { $0 > now ? "in " + Units.formatDuration(ms: $0 - now) : "now" } ?? "-"
            // Not before its previous generation's outcome is acknowledged (`explain` says so too).
            if r.waitsForDelivery && r.state == "queued" { next = "after delivery" }
            // Paused: not due at all until `resume`, whatever its own time says.
            if state == "paused" { next = "after resume" }
            let updated = Units.formatDuration(ms: max(0, now - r.updatedAt)) + " ago"
            let cells = [r.id, r.key, state + (r.reason.map { " (\($0))" } ?? ""), String(r.attempts), progress, next, updated]
                .map(TerminalText.cell)
            for (c, cell) in cells.enumerated() { widths[c] = max(widths[c], TerminalText.displayWidth(cell)) }
            lines.append(cells.joined(separator: "\u{1F}"))
        }
        if lines.isEmpty {
            i.console.err("no entries")
            return 0
        }
        func padded(_ cells: [Substring]) -> String {
            cells.enumerated().map { c, cell in
                c == cells.count - 1
                    ? String(cell) : cell + String(repeating: " ", count: widths[c] - TerminalText.displayWidth(String(cell)))
            }.joined(separator: "  ")
        }
        var out = padded(header.map { Substring($0) }) + "\n"
        for line in lines {
            out += padded(line.split(separator: "\u{1F}", omittingEmptySubsequences: false)) + "\n"
            if out.utf8.count >= 1 << 16 {
                i.console.write(out)
                out = ""
            }
        }
        i.console.write(out)
        return 0
    }

    static func formatTable(_ rawRows: [[String]]) -> String {
        let rows = rawRows.map { $0.map(TerminalText.cell) }
        var widths = [Int](repeating: 0, count: rows[0].count)
        for row in rows { for (c, cell) in row.enumerated() { widths[c] = max(widths[c], TerminalText.displayWidth(cell)) } }
        return rows.map { row in
            row.enumerated().map { c, cell in
                c == row.count - 1 ? cell : cell + String(repeating: " ", count: widths[c] - TerminalText.displayWidth(cell))
            }.joined(separator: "  ")
        }.joined(separator: "\n")
    }

    static func showJSON(_ e: Entry, store: any Store, config: Config) throws(OutboxError) -> JSON {
        var doc = e.listJSON(displayState: displayState(e, control: try store.control()))
        let outcomes = try store.outcomes(entryID: e.id)
        // The same reason `list` shows while an outcome waits for a definition of its key.
        if outcomes.contains(where: { !$0.acknowledged && $0.reason == "unhandled-key" }) {
            doc.set("reason", .string("unhandled-key"))
        }
        let redact = config.redactedHeaderNames.union(e.request.secretHeaders)
        var request: JSON = .object([
            ("method", .string(e.request.method)),
            ("url", .optionalString(e.request.url.map { URLCheck.shown($0, secret: e.request.secretURL) })),
            ("headers", HeaderRules.json(HeaderRules.redacted(e.request.headers, names: redact).map { ($0.0.lowercased(), $0.1) })),
            ("body_kind", .string(e.request.bodyKind.rawValue)), ("response", e.request.response.json),
            ("follow_redirects", .int(e.request.followRedirects)),
        ])
        if let s3 = e.request.s3 { request.set("s3", s3.json) }
        if let file = e.request.file {
            request.set(
                "file",
                .object([
                    ("source", .string(file.path)), ("size", .int64(file.size)),
                    ("ownership", .string(e.request.ownership?.rawValue ?? "copy")),
                ]))
        }
        doc.set("expires_at", .optionalInt(e.expiresAt))
        doc.set("scope", .optionalString(e.scope))
        doc.set("request", request)
        doc.set("idempotency_key", .optionalString(e.idempotencyKey))
        doc.set("account", .optionalString(e.account))
        doc.set("header_generation", .int64(e.headerGeneration))
        doc.set("not_before", .optionalInt(e.notBefore))
        // Every `show` has the same fields: an entry sent whole has no parts (null).
        doc.set("parts", .null)
        if e.isChunked {
            doc.set(
                "parts",
                .array(
                    try store.parts(entrySeq: e.seq).map { p in
                        .object([
                            ("index", .int(p.index)), ("start", .int64(p.range.start)), ("end", .int64(p.range.end)),
                            ("accepted", .bool(p.accepted)), ("status", p.status.map { .int($0) } ?? .null),
                            ("attempts", .int(p.attempts)),
                        ])
                    }))
        }
        doc.set(
            "outcomes",
            .array(
                outcomes.map { o in
                    .object([
                        ("outcome", .string(o.outcome.rawValue)), ("generation", .int64(o.generation)),
                        ("deliveries", .int64(o.deliveries)),
                        ("acknowledged", .bool(o.acknowledged)), ("reason", .optionalString(o.reason)),
                        ("next_delivery_at", .optionalInt(o.nextDeliveryAt)), ("at", .int64(o.createdAt)),
                        ("follow_up_errors", o.payload["follow_up_errors"] ?? .null),
                        ("error", Self.shownError(o.payload["error"])),
                    ])
                }))
        doc.set("attempts_log", .array(try store.attempts(entryID: e.id)))
        var chain: [JSON] = []
        var seen: Set<String> = [e.id]
        var parent = e.parent
        // An entry that enqueued its own id again is its own parent: the chain ends where it repeats.
        while let p = parent, chain.count < 50 {
            chain.append(.string(p))
            guard seen.insert(p).inserted else { break }
            parent = try store.entry(id: p)?.parent
        }
        doc.set("chain", .array(chain))
        return doc
    }

    /// Why an error outcome failed, as its hook is told (a file that changed after enqueue,
    /// which part), without the response body, which may echo a credential.
    static func shownError(_ error: JSON?) -> JSON {
        guard let error, case .object = error else { return .null }
        var shown: [(String, JSON)] = []
        for name in ["kind", "message", "status", "part_index"] { if let value = error[name] { shown.append((name, value)) } }
        return .object(shown)
    }

    static func show(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        let id = i.args.positionals[0]
        let project = try i.project()
        guard let e = try project.existingEntry(id: id) else { throw project.noEntry(id) }
        let store = try project.store()
        let doc = try showJSON(e, store: store, config: project.config)
        i.console.out(i.json ? doc.serialized() : doc.pretty())
        return 0
    }

    static func chunkPlan(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        func size(_ text: String, _ what: String) throws(OutboxError) -> Int64 {
            do { return try Units.parseSize(text) } catch { throw .usage("\(what): \(error.message)") }
        }
        let total = try size(i.args.positionals[0], "SIZE")
        let min = try i.args.value("min").map { t throws(OutboxError) in try size(t, "--min") } ?? ChunkPlan.defaultMin
        let max = try i.args.value("max").map { t throws(OutboxError) in try size(t, "--max") } ?? ChunkPlan.defaultMax
        var maxParts = ChunkPlan.defaultMaxParts
        if let text = i.args.value("max-parts") {
            guard let n = Units.wholeNumber(text, in: 1...ChunkPlan.maxPartsLimit) else {
                throw .usage(
                    "--max-parts must be a whole number from 1 to \(ChunkPlan.maxPartsLimit), not \(Units.quoted(text, limit: 40))")
            }
            maxParts = n
        }
        let plan = try ChunkPlan.plan(size: total, min: min, max: max, maxParts: maxParts)
        if i.json {
            var out = "["
            for (n, r) in plan.enumerated() {
                if n > 0 { out += "," }
                out += "{\"start\":\(r.start),\"end\":\(r.end)}"
            }
            i.console.out(out + "]")
        } else {
            var lines: [String] = []
            for (n, r) in plan.enumerated() {
                lines.append("part \(n + 1): bytes \(r.start)-\(r.end) (\(Units.formatBytes(r.end - r.start)))")
            }
            i.console.out(lines.joined(separator: "\n"))
            i.console.err("\(plan.count) part\(plan.count == 1 ? "" : "s") for \(Units.formatBytes(total))")
        }
        return 0
    }

    static func stats(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        if i.args.value("output") != nil && !i.args.flag("prometheus") { throw .usage("--output goes with --prometheus") }
        if i.json && i.args.flag("prometheus") { throw .usage("--prometheus and --json are two formats; give one") }
        // The file is checked before the store is opened: a command that fails makes no store.
        var outputPath: String?
        if let output = i.args.value("output") {
            if output.isEmpty { throw .usage("--output needs a file name") }
            // For node_exporter's textfile collector: it must never read half a file.
            // Through a link to the file it names; a device or FIFO is never replaced by a file.
            let path = Paths.followingLinks(Paths.absolute(output, relativeTo: try i.cwd))
            guard Paths.isDirectory(Paths.dirname(path)) else {
                throw .storage("--output: the folder \(Paths.dirname(path)) does not exist")
            }
            if let existing = FileInfo.stat(path), !existing.isRegular {
                throw .invalid("--output: \(path) exists and is not a regular file")
            }
            try OwnFiles(try i.project().config).refuse(path, field: "--output", why: "outbox does not write over its own files")
            outputPath = path
        }
        let project = try i.project()
        // A reading command makes no store: none yet holds nothing (said, for a mistyped path).
        if project.storeNotMadeYet { i.console.err("outbox: \(project.noStoreYet)") }
        let stats = project.storeNotMadeYet ? .empty : try Statistics.read(from: try project.store(), now: Identifiers.nowMs())
        if i.args.flag("prometheus") {
            if let path = outputPath {
                let existing = FileInfo.stat(path)
                try Paths.writeAtomically(Array(stats.prometheus.utf8), to: path, mode: existing.map { .init($0.mode) } ?? 0o644)
            } else {
                i.console.write(stats.prometheus)
            }
        } else if i.json {
            i.console.out(stats.json.serialized())
        } else {
            var table = [["STATE", "ENTRIES"]]
            for state in EntryState.allCases { table.append([state.rawValue, String(stats.states[state] ?? 0)]) }
            table.append(["outcomes pending", String(stats.pendingOutcomes)])
            table.append(["oldest queued", Units.formatDuration(ms: stats.oldestQueuedAgeMs)])
            for host in stats.heldHosts { table.append(["held host", host]) }
            let total = { (counter: Counter) in stats.counters.filter { $0.counter == counter }.reduce(0) { $0 + $1.value } }
            table.append(["attempts (all time)", String(total(.attempts))])
            table.append(["bytes sent (all time)", Units.formatBytes(total(.sentBytes))])
            table.append(["hook deliveries (all time)", String(total(.hookDeliveries))])
            table.append(["hook failures (all time)", String(total(.hookFailures))])
            i.console.out(formatTable(table))
        }
        return 0
    }

    static func explain(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        let id = i.args.positionals[0]
        let project = try i.project()
        guard let e = try project.existingEntry(id: id) else { throw project.noEntry(id) }
        let store = try project.store()
        let now = Identifiers.nowMs()
        var reasons: [String] = []
        switch e.state {
        case .running:
            // A SIGKILLed runner leaves its entries running until the next runner requeues them.
            if let sqlite = store as? SQLiteStore, sqlite.runnerHolderPID() == nil {
                reasons.append(
                    "it was running when its runner stopped (killed or crashed); the next `outbox run` puts it back in the queue, keeping accepted parts"
                )
            } else if let shared = store as? PostgresStore, try shared.leaseEnded(entryID: e.id, now: now) == true {
                reasons.append(
                    "its runner\(e.leaseOwner.map { " (\($0))" } ?? "") let its lease run out (stopped, killed or cut off from the database); a live runner puts it back in the queue, keeping accepted parts"
                )
            } else {
                // Answered already, its settle may wait for its parser beside the runner.
                var parsing = ""
                if case .command = e.request.response { parsing = ", answered and waiting for its response parser" }
                reasons.append(
                    "it is running now\(e.leaseOwner.map { " on runner \($0)" } ?? ""): sending\(parsing), or ready to start the moment a request ends (a standby request)"
                )
            }
        case .awaitingAuth where e.request.s3 != nil:
            // Signed by the runner: no header of the queue's changes what it sends.
            reasons.append(
                "it was refused for its credentials (none found, or S3 refused the signature: `outbox show` has the attempt's error); `outbox retry --key \(e.key)` sends it again once the runner can read valid ones"
            )
        case .awaitingAuth: reasons.append("the server answered 401/403; it waits for `outbox headers update`")
        case .completed, .cancelled:
            // A delivery that failed (or a chain not built yet, before any hook ran) says why.
            let pending = try store.outcomes(entryID: e.id).first { !$0.acknowledged && $0.reason != nil }
            if let pending, let why = pending.reason {
                reasons.append(
                    "it is \(e.state.rawValue); its outcome is not delivered yet (\(pending.deliveries) hook run\(pending.deliveries == 1 ? "" : "s")): \(why); it is tried again"
                )
            } else {
                reasons.append("it is \(e.state.rawValue); its outcome waits for its hook to exit 0")
            }
        case .error: reasons.append("it settled error (\(e.reason ?? "see outbox show")); it stays until cancelled or enqueued again")
        case .queued, .paused: break
        }
        let control = try store.control()
        if !e.state.isSettled, e.state != .running, let expiry = e.expiresAt, expiry <= now {
            // A runner does not look at a paused entry: it settles once the pause ends.
            let paused = e.state == .paused || control.queuePaused || control.pausedKeys.contains(e.key)
            reasons.append(
                "it expired at \(Units.rfc3339(ms: expiry)): \(paused ? "once resumed, " : "")the next `outbox run` settles it error (expired), and sends it no more"
            )
        }
        if control.queuePaused { reasons.append("the whole queue is paused (outbox resume)") }
        if control.pausedKeys.contains(e.key) { reasons.append("its key \(e.key) is paused (outbox resume --key \(e.key))") }
        if let nb = e.notBefore, nb > now {
            reasons.append("it is held until \(Units.rfc3339(ms: nb)) (in \(Units.formatDuration(ms: nb - now)))")
        }
        if let next = e.nextAttemptAt, next > now, e.attempts > 0 {
            reasons.append(
                "it backs off after \(e.attempts) attempt\(e.attempts == 1 ? "" : "s"); next in \(Units.formatDuration(ms: next - now))")
        }
        if e.waitsForDelivery { reasons.append("it waits until the outcome of its previous generation is acknowledged") }
        if let scope = e.scope {
            let ahead = try store.list(ListFilter(scope: scope)).filter { $0.seq < e.seq && !$0.state.isSettled }
            if let first = ahead.first { reasons.append("scope \(scope): \(first.id) runs first") }
        }
        let wifi = e.request.wifiOnly ?? control.wifiOnly
        if wifi { reasons.append("it is wifi-only; it runs only while the wifi check passes") }
        if let account = e.account {
            var factory = try EnqueueCommand.factory(project, i)
            // Said as a runner started here would see it: with the variable unset, no account.
            factory.unsetAccountIsNone = true
            if let current = try factory.account() {
                if account != current {
                    reasons.append("it was enqueued by account \(account), not the current \(current): the runner will drop it")
                }
            } else {
                reasons.append("it waits for its account \(account) to be the current one (config account)")
            }
        }
        // A hold for Wi-Fi that `wifi-only off` ended is over, though the row says it until a runner looks.
        if wifi, e.state == .queued, e.reason == HoldReason.wifi.rawValue { reasons.append("it is waiting for Wi-Fi") }
        let host = URLCheck.hostKey(e.request.url ?? "")
        if e.state == .queued, try store.heldHosts().contains(host) {
            reasons.append("its host \(host) is held after connection failures: one request at a time probes it until it answers")
        }
        if !e.state.isSettled, let missing = try store.missingStagedFiles(of: e).first {
            reasons.append(
                "its \(missing) is missing (`outbox audit` lists it): when its turn comes, it settles error (file), sending nothing")
        }
        if !e.state.isSettled, let holder = try store.bodyHostElsewhere(entryID: e.id) {
            reasons.append(
                "its file body is staged on host \(holder): only a runner there sends it (or share the folder: staging: {path, shared: true})"
            )
        }
        if project.definitions.definitions[e.key] == nil {
            // A file that defines the key with errors is not a missing definition: `check` names them.
            let why =
                project.definitions.brokenKeys[e.key] != nil || project.definitions.disabledByThen[e.key] != nil
                ? "the definition of \(e.key) has errors (`outbox check` names them)" : "no definition has its key \(e.key)"
            reasons.append("\(why): its outcome will wait (unhandled-key)")
        }
        if reasons.isEmpty { reasons.append("nothing holds it: the next `outbox run` sends it") }
        if i.json {
            i.console.out(
                JSON.object([
                    ("id", .string(e.id)), ("state", .string(displayState(e, control: control))),
                    ("reasons", .array(reasons.map { .string($0) })),
                ]).serialized())
        } else {
            i.console.out(reasons.map { "- " + TerminalText.visible($0) }.joined(separator: "\n"))
        }
        return 0
    }

    static func audit(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        let project = try i.project()
        guard !project.storeNotMadeYet else {
            if i.json {
                i.console.out(JSON.object([("ok", .bool(true)), ("problems", .array([]))]).serialized())
                i.console.err("outbox: \(project.noStoreYet)")
            } else {
                i.console.out("ok: \(project.noStoreYet), so nothing to check")
            }
            return 0
        }
        let store = try project.store()
        if i.args.flag("fix") {
            for path in try store.cleanOrphans() { i.console.err("outbox: removed \(path) (a staged body no entry owns)") }
            for change in store.tightenModes() { i.console.err("outbox: \(change)") }
        }
        let problems = try store.audit(note: { i.console.err("outbox: \($0)") })
        // A failed audit is an E_STORAGE error like any other, with the problems as its report.
        let failure = OutboxError.storage(
            "the store breaks \(problems.count == 1 ? "one of its invariants" : "\(problems.count) of its invariants") (\(i.json ? "problems" : "listed above"))"
        )
        if i.json {
            var doc = JSON.object([("ok", .bool(problems.isEmpty)), ("problems", .array(problems.map { .string($0) }))])
            if !problems.isEmpty {
                doc.set("error", .object([("code", .string(failure.code.rawValue)), ("message", .string(failure.message))]))
            }
            i.console.out(doc.serialized())
        } else if problems.isEmpty {
            i.console.out("ok: the store's invariants hold")
        } else {
            i.console.out(problems.joined(separator: "\n"))
            i.console.err("outbox: \(failure.description)")
        }
        return problems.isEmpty ? 0 : failure.code.exitStatus
    }

    /// A JSON Schema for editors (yaml-language-server), or the reference page; needs no project.
    static func schema(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        switch i.args.positionals[0] {
        case "config": i.console.out(JSONSchemas.config().pretty())
        case "definition": i.console.out(JSONSchemas.definition().pretty())
        case "reference":
            if i.json { throw .usage("`outbox schema reference` prints a Markdown page, not JSON: leave out --json") }
            i.console.out(ReferencePage.markdown(commands: CommandReference.markdown()))
        case let other: throw .usage("schema takes config, definition or reference, not \(Units.quoted(other, limit: 40))")
        }
        return 0
    }
}
