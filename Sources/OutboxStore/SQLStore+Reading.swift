import OutboxModel

/// Reading entries, parts and outcomes, and the queue's settings: the same SQL on both stores.
extension SQLStore {
    static var entryColumns: String {
        """
        seq, id, internal, key, vars, state, reason, generation, request, body, body_file, body_hash, total_bytes,
        bytes_sent, attempts, idempotency_key, account, scope, parent, header_generation, created_at, updated_at,
        expires_at, not_before, next_attempt_at, lease_owner, last_request_id, waits_for_delivery
        """
    }

    static var outcomeColumns: String {
        """
        seq, entry_id, key, generation, outcome, payload, deliveries, acknowledged, next_delivery_at, reason, hook_pgid,
        hook_start, created_at
        """
    }

    package func currentVars(seqs: [Int64]) throws(OutboxError) -> [Int64: JSON] {
        var vars: [Int64: JSON] = [:]
        // One row each: a runner holds at most its concurrency, and asks only after another process wrote.
        for seq in seqs {
            guard let text = try db.queryOne("SELECT vars FROM entries WHERE seq = ?", [.int(seq)], { $0.text(0) }) else { continue }
            vars[seq] = try Self.storedJSON(text, what: "vars of an entry")
        }
        return vars
    }

    /// Entries of one definition share their stored request but for URL and file: the rest
    /// is parsed once.
    func storedRequest(_ text: String) throws(OutboxError) -> StoredRequest {
        try requestCache.request(text) { (text) throws(OutboxError) in
            try StoredRequest(json: try Self.storedJSON(text, what: "stored request"))
        }
    }

    /// Parses a JSON column; a column that does not parse is damage, reported with the row's table.
    static func storedJSON(_ text: String, what: String) throws(OutboxError) -> JSON {
        do { return try JSON.parse(text, maxDepth: JSON.storedMaxDepth) } catch { throw .storage("the \(what) is damaged: \(error)") }
    }

    /// A row that does not read back, with the way out: `cancel` removes it by its id.
    static func damaged(_ message: String, id: String) -> OutboxError {
        .storage("\(message); `outbox cancel \(id)` removes that entry")
    }

    /// Whether `error` is a row that does not read back (what `damaged` and the row's JSON report).
    static func isDamage(_ error: OutboxError) -> Bool {
        error.code == .storage && error.message.contains(" is damaged")
    }

    private func vars(_ text: String, id: String) throws(OutboxError) -> JSON {
        do throws(OutboxError) { return try Self.storedJSON(text, what: "vars of entry \(id)") } catch {
            throw Self.damaged(error.message, id: id)
        }
    }

    /// An entry from its row. A row that does not read back whole fails with E_STORAGE
    /// naming what is damaged: a default in its place could send another request.
    func entryFromRow(_ r: Database.Row) throws(OutboxError) -> Entry {
        let id = r.text(1)
        guard let state = EntryState(rawValue: r.text(5)) else {
            throw Self.damaged("the stored entry \(id) is damaged: unknown state \"\(r.text(5))\"", id: id)
        }
        // The request and body name what is damaged; the entry's id says where.
        let request: StoredRequest
        let body: StoredBody
        do throws(OutboxError) {
            request = try storedRequest(r.text(8))
            body = try StoredBody(kind: request.bodyKind, inline: r.blob(9), file: r.optionalText(10), form: request.form)
        } catch {
            throw Self.damaged("\(error.message) (entry \(id))", id: id)
        }
        // A framing header (or no header name) would go out as is and cut the body short.
        if let problem = request.headers.lazy.compactMap({ HeaderRules.nameProblem($0.0) }).first {
            throw Self.damaged("the stored entry \(id) is damaged: its request: \(problem)", id: id)
        }
        // Counts that no store of ours writes would overflow where the runner adds to them.
        for (column, name) in [(7, "generation"), (12, "total_bytes"), (13, "bytes_sent"), (14, "attempts"), (19, "header_generation")]
        where !Self.plausibleCount.contains(r.int(Int32(column))) {
            throw Self.damaged("the stored entry \(id) is damaged: \(name) \(r.int(Int32(column))) is out of range", id: id)
        }
        // A staged or referenced file is named by an absolute path (a damaged one would leave
        // the staged file to be removed as an orphan, perhaps a moved file's only copy).
        if let file = r.optionalText(10), !file.hasPrefix("/") || file.utf8.last == UInt8(ascii: "/") {
            throw Self.damaged("the stored entry \(id) is damaged: its body file \(Units.quoted(file, limit: 80)) is no path", id: id)
        }
        // Times in epoch milliseconds, 1970 to the end of 9999 (what every time outbox takes lies in).
        for (column, name) in [(20, "created_at"), (21, "updated_at"), (22, "expires_at"), (23, "not_before"), (24, "next_attempt_at")]
        where !r.isNull(Int32(column)) && !Self.plausibleTime.contains(r.int(Int32(column))) {
            throw Self.damaged("the stored entry \(id) is damaged: \(name) \(r.int(Int32(column))) is out of range", id: id)
        }
        return Entry(
            seq: r.int(0), id: id, internalID: r.text(2), key: r.text(3),
            vars: try vars(r.text(4), id: id),
            state: state, reason: r.optionalText(6), generation: r.int(7), request: request,
            body: body,
            bodyHash: r.text(11), totalBytes: r.int(12),
            bytesSent: r.int(13), attempts: r.int(14), idempotencyKey: r.optionalText(15), account: r.optionalText(16),
            scope: r.optionalText(17), parent: r.optionalText(18), headerGeneration: r.int(19), createdAt: r.int(20),
            updatedAt: r.int(21), expiresAt: r.optionalInt(22), notBefore: r.optionalInt(23), nextAttemptAt: r.optionalInt(24),
            leaseOwner: r.optionalText(25), lastRequestID: r.optionalText(26), waitsForDelivery: r.int(27) != 0)
    }

    /// What a stored count or byte offset can be: 0 to 2^53 (what every JSON reader holds
    /// exactly); far above any real one, far below where adding to it overflows.
    static var plausibleCount: ClosedRange<Int64> { 0...(1 << 53) }
    /// What a stored time can be: epoch milliseconds from 1970 to the end of year 9999.
    static var plausibleTime: ClosedRange<Int64> { Identifiers.recordableMs }

    package func entry(id: String) throws(OutboxError) -> Entry? {
        try db.queryOne("SELECT \(Self.entryColumns) FROM entries WHERE id = ?", [.text(id)], entryFromRow)
    }

    package func list(_ filter: ListFilter) throws(OutboxError) -> [Entry] {
        var (sql, values) = Self.entriesQuery(filter)
        sql += " ORDER BY seq"
        if let limit = filter.limit { sql += " LIMIT \(limit)" }
        return try db.query(sql, values, entryFromRow)
    }

    /// The entries `filter` names, without order or limit.
    static func entriesQuery(_ filter: ListFilter) -> (String, [SQLValue]) {
        let (conditions, values) = filterConditions(filter)
        return ("SELECT \(Self.entryColumns) FROM entries WHERE 1=1" + conditions, values)
    }

    /// The conditions `filter` puts on entries; a `paused` filter reads queued rows.
    static func filterConditions(_ filter: ListFilter) -> (String, [SQLValue]) {
        var sql = ""
        var values: [SQLValue] = []
        if let key = filter.key { sql += " AND key = ?"; values.append(.text(key)) }
        if let id = filter.id { sql += " AND id = ?"; values.append(.text(id)) }
        if let scope = filter.scope { sql += " AND scope = ?"; values.append(.text(scope)) }
        if let state = filter.state {
            sql += " AND state = ?"
            values.append(.text(state == "paused" ? "queued" : state))
            if state == EntryState.awaitingAuth.rawValue || state == EntryState.error.rawValue { sql += " AND \(stuckStates)" }
        }
        return (sql, values)
    }

    /// The entries `filter` names in queue order, a thousand at a time: a command over the
    /// whole queue (cancel, retry, headers update, audit) holds one chunk, not 400,000
    /// parsed entries. `body` may change or delete the rows it was given.
    /// With `damaged`, a row that does not read back is passed by its id instead of failing.
    func forEachChunk(
        _ filter: ListFilter, damaged: ((String) throws(OutboxError) -> Void)? = nil,
        _ body: ([Entry]) throws(OutboxError) -> Void
    ) throws(OutboxError) {
        let (sql, values) = Self.entriesQuery(filter)
        var after = Int64.min
        while true {
            var damagedIDs: [String] = []
            let rows = try db.query(sql + " AND seq > ? ORDER BY seq LIMIT 1000", values + [.int(after)]) {
                (r) throws(OutboxError) -> (seq: Int64, entry: Entry?) in
                do throws(OutboxError) { return (r.int(0), try entryFromRow(r)) } catch {
                    guard damaged != nil, Self.isDamage(error) else { throw error }
                    damagedIDs.append(r.text(1))
                    return (r.int(0), nil)
                }
            }
            guard let last = rows.last else { return }
            after = last.seq
            try body(rows.compactMap(\.entry))
            for id in damagedIDs { try damaged?(id) }
        }
    }

    package func parts(entrySeq: Int64) throws(OutboxError) -> [StoredPart] {
        try db.query(
            """
            SELECT idx, start, "end", url, headers, accepted, status, response_headers, attempts, next_attempt_at
            FROM parts WHERE entry_seq = ? ORDER BY idx
            """, [.int(entrySeq)]
        ) { r throws(OutboxError) in
            let (start, end) = (r.int(1), r.int(2))
            guard Self.plausibleCount.contains(start), Self.plausibleCount.contains(end), start <= end,
                Self.plausibleCount.contains(r.int(8)), Self.plausibleCount.contains(r.int(0))
            else {
                throw .storage(
                    "a part of an entry is damaged: the part at index \(r.int(0)) covers \(start)..<\(end) after \(r.int(8)) attempts")
            }
            // Checked as at enqueue: only http and https go out (another scheme failed every attempt).
            do throws(OutboxError) { _ = try URLCheck.validate(r.text(3), field: "the URL of the part at index \(r.int(0))") } catch {
                throw .storage("a part of an entry is damaged: \(error.message)")
            }
            let headers = HeaderRules.from(json: try Self.storedJSON(r.text(4), what: "headers of a part"))
            if let problem = headers.lazy.compactMap({ HeaderRules.nameProblem($0.0) }).first {
                throw .storage("a part of an entry is damaged: the part at index \(r.int(0)): \(problem)")
            }
            var responseHeaders: JSON?
            if let text = r.optionalText(7) { responseHeaders = try Self.storedJSON(text, what: "response headers of a part") }
            return StoredPart(
                index: Int(r.int(0)), range: ByteRange(start: r.int(1), end: r.int(2)), url: r.text(3), headers: headers,
                accepted: r.int(5) != 0,
                status: r.optionalInt(6).map(Int.init), responseHeaders: responseHeaders,
                attempts: Int(r.int(8)), nextAttemptAt: r.optionalInt(9))
        }
    }

    package func attempts(entryID: String) throws(OutboxError) -> [JSON] {
        try db.query("SELECT payload FROM attempts WHERE entry_id = ? ORDER BY seq DESC LIMIT 20", [.text(entryID)]) {
            (try? JSON.parse($0.text(0))) ?? .null
        }.reversed()
    }

    /// A recorded hook's process group and start time; nil when they name no process (a group
    /// is a positive pid, a start time a tick count), which converting would trap on.
    static func hookProcess(_ pgid: Int64, _ start: Int64) -> (pgid: Int32, startTime: UInt64)? {
        guard let group = Int32(exactly: pgid), group > 0, let ticks = UInt64(exactly: start) else { return nil }
        return (group, ticks)
    }

    static func outcome(_ r: Database.Row) throws(OutboxError) -> OutcomeRecord {
        guard let outcome = Outcome(rawValue: r.text(4)) else {
            throw .storage("the outcome of \(r.text(1)) is damaged: unknown outcome \"\(r.text(4))\"")
        }
        let pgid = r.optionalInt(10)
        let start = r.optionalInt(11)
        let hook = pgid.flatMap { hookProcess($0, start ?? 0) }
        let id = r.text(1)
        if let pgid, hook == nil {
            throw damaged("the outcome of \(id) is damaged: hook process group \(pgid) started at \(start ?? 0) names no process", id: id)
        }
        for (column, name) in [(3, "generation"), (6, "deliveries")] where !plausibleCount.contains(r.int(Int32(column))) {
            throw damaged("the outcome of \(id) is damaged: \(name) \(r.int(Int32(column))) is out of range", id: id)
        }
        return OutcomeRecord(
            seq: r.int(0), entryID: r.text(1), key: r.text(2), generation: r.int(3), outcome: outcome,
            payload: try storedJSON(r.text(5), what: "outcome payload of \(r.text(1))"), deliveries: r.int(6), acknowledged: r.int(7) != 0,
            nextDeliveryAt: r.optionalInt(8), reason: r.optionalText(9), hookPgid: hook?.pgid, hookStart: hook?.startTime,
            createdAt: r.int(12))
    }

    package func outcomes(entryID: String) throws(OutboxError) -> [OutcomeRecord] {
        try db.query("SELECT \(Self.outcomeColumns) FROM outcomes WHERE entry_id = ? ORDER BY seq", [.text(entryID)], Self.outcome)
    }

    package func unacknowledgedOutcomes() throws(OutboxError) -> [OutcomeRecord] {
        try db.query("SELECT \(Self.outcomeColumns) FROM outcomes WHERE acknowledged = 0 ORDER BY seq", [], Self.outcome)
    }

    // MARK: Settings

    static var queuePausedSetting: String { "queue_paused" }
    static var wifiOnlySetting: String { "wifi_only" }
    static var headerGenerationSetting: String { "header_generation" }
    /// Set once some entry's vars fed a secret header: only then does `list --json` read
    /// requests to redact vars (scanning them all costs it a third of its time).
    static var secretVarsSetting: String { "secret_vars" }
    static var heldHostsSetting: String { "held_hosts" }

    package func control() throws(OutboxError) -> QueueControl {
        try db.read { () throws(OutboxError) -> QueueControl in
            QueueControl(
                queuePaused: try setting(Self.queuePausedSetting) == "1", pausedKeys: try pausedKeys(),
                wifiOnly: try setting(Self.wifiOnlySetting) == "1",
                headerGeneration: try headerGeneration())
        }
    }

    /// The header generation as stored (the runner reads it every turn: the patch is not read).
    func headerGeneration() throws(OutboxError) -> Int64 {
        let text = try setting(Self.headerGenerationSetting) ?? "0"
        guard let generation = Int64(text), Self.plausibleCount.contains(generation) else {
            throw .storage("the store is damaged: the header generation \(Units.quoted(text, limit: 40)) is not a count")
        }
        return generation
    }

    /// The header generation and the `headers update` patch, as stored. A value no outbox
    /// writes (a generation that is no count, a patch that is not header names to values, or
    /// names a framing header) is damage: it would overflow, or go out on every request.
    func headerSettings() throws(OutboxError) -> HeaderSettings {
        let generation = try headerGeneration()
        guard let patchText = try setting("header_patch") else { return HeaderSettings(generation: generation, patch: nil) }
        let patch = try Self.storedJSON(patchText, what: "headers update patch")
        guard case let .object(members) = patch else { throw .storage("the headers update patch is damaged: not an object") }
        for (name, value) in members {
            if let problem = HeaderRules.nameProblem(name) { throw .storage("the headers update patch is damaged: \(problem)") }
            guard value.stringValue != nil else { throw .storage("the headers update patch is damaged: \(name) is not text") }
        }
        return HeaderSettings(generation: generation, patch: patch)
    }

    package func heldHosts() throws(OutboxError) -> [String] {
        guard let text = try setting(Self.heldHostsSetting) else { return [] }
        return (try Self.storedJSON(text, what: "held hosts").arrayValue ?? []).compactMap(\.stringValue)
    }

    package func setHeldHosts(_ hosts: [String]) throws(OutboxError) {
        try setSetting(Self.heldHostsSetting, hosts.isEmpty ? nil : JSON.array(hosts.sorted().map { .string($0) }).serialized())
    }

    package func setQueuePaused(_ paused: Bool) throws(OutboxError) {
        try setSetting(Self.queuePausedSetting, paused ? "1" : nil)
    }

    package func setWifiOnly(_ on: Bool) throws(OutboxError) {
        try writing { () throws(OutboxError) in
            try setSetting(Self.wifiOnlySetting, on ? "1" : nil)
            // Held for Wi-Fi, entries are due again once the setting is off (one whose own
            // request is wifi-only is held again when a runner next looks at it); `list` and
            // `explain` would say they wait for Wi-Fi until then.
            if !on {
                try db.run("UPDATE entries SET reason = NULL, next_attempt_at = NULL WHERE state = 'queued' AND reason = 'wifi'", [])
            }
        }
    }

    func setting(_ name: String) throws(OutboxError) -> String? {
        try db.queryOne("SELECT value FROM settings WHERE name = ?", [.text(name)]) { $0.text(0) }
    }

    func setSetting(_ name: String, _ value: String?) throws(OutboxError) {
        try writing { () throws(OutboxError) in
            // Unchanged: no write, so runners polling the data version are not woken for nothing.
            guard try setting(name) != value else { return }
            if let value {
                try db.run(
                    "INSERT INTO settings (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    [.text(name), .text(value)])
            } else {
                try db.run("DELETE FROM settings WHERE name = ?", [.text(name)])
            }
        }
    }

    func pausedKeys() throws(OutboxError) -> Set<String> {
        Set(try db.query("SELECT key FROM paused_keys") { $0.text(0) })
    }

    package func setPaused(keys: [String], paused: Bool) throws(OutboxError) {
        try writing { () throws(OutboxError) in
            for key in keys {
                if paused {
                    try db.run("INSERT INTO paused_keys (key) VALUES (?) ON CONFLICT DO NOTHING", [.text(key)])
                } else {
                    try db.run("DELETE FROM paused_keys WHERE key = ?", [.text(key)])
                }
            }
            // The keys' entries are marked by now (triggers), not yet committed.
            Fault.point("store.pause")
        }
    }
}
