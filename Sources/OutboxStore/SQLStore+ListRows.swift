import OutboxModel

/// The rows of `list`, read straight from the columns: the same on both stores.
extension SQLStore {
    /// Entries with an outcome that waits because no definition has its key.
    package func unhandledKeyEntryIDs() throws(OutboxError) -> Set<String> {
        Set(try unacknowledgedOutcomes().filter { $0.reason == "unhandled-key" }.map(\.entryID))
    }

    /// The columns of a `list` row, in queue order; a `paused` filter reads queued rows. A
    /// running entry has no reason (its row keeps the last failure's, for a later expiry). Last,
    /// the request of a row that may name secret vars; requests are looked at only once some
    /// entry had them (the setting is read once per query, in the query's own snapshot).
    static func listQuery(_ filter: ListFilter) -> (String, [SQLValue]) {
        let (conditions, values) = filterConditions(filter)
        let sql = """
            SELECT id, key, vars, state, CASE WHEN state = 'running' THEN NULL ELSE reason END, bytes_sent, total_bytes,
              attempts, created_at, updated_at, next_attempt_at, generation, parent,
              CASE WHEN EXISTS (SELECT 1 FROM settings WHERE name = '\(secretVarsSetting)')
                AND request LIKE '%"\(StoredRequest.secretVarsMember)"%' THEN request END,
              waits_for_delivery, not_before
            FROM entries WHERE 1=1
            """
        return (sql + conditions + " ORDER BY seq", values)
    }

    package func forEachListRow(_ filter: ListFilter, _ body: (ListRow) throws(OutboxError) -> Void) throws(OutboxError) {
        let (sql, values) = Self.listQuery(filter)
        let unhandled = try unhandledKeyEntryIDs()
        try db.forEach(sql, values) { r throws(OutboxError) in
            let id = r.text(0)
            // Shown as ages: a time no outbox writes would overflow there.
            for column in [Int32(9), 10] where !r.isNull(column) && !Self.plausibleTime.contains(r.int(column)) {
                throw Self.damaged("the stored entry \(id) is damaged: a time \(r.int(column)) is out of range", id: id)
            }
            var row = ListRow(
                id: id, key: r.text(1), state: r.text(3), reason: unhandled.contains(id) ? "unhandled-key" : r.optionalText(4),
                bytesSent: r.int(5), totalBytes: r.int(6), attempts: r.int(7), updatedAt: r.int(9), nextAttemptAt: r.optionalInt(10))
            row.waitsForDelivery = r.int(14) != 0
            row.notBefore = r.optionalInt(15)
            try body(row)
        }
    }

    /// `list --json`: the array of rows written as JSON text straight from the columns,
    /// without parsing the stored request or vars (vars are kept as compact JSON), so 100,000
    /// rows stream in well under a second. `displayState` maps a stored state to the one shown.
    /// Vars that are not JSON (a hand-edited row) fail it with E_STORAGE before anything is
    /// written: they are checked first, in the same snapshot as the rows.
    package func writeListRows(
        _ filter: ListFilter, displayState: (String, String) -> String,
        _ write: (String) -> Void
    ) throws(OutboxError) {
        try db.read { () throws(OutboxError) in
            let (conditions, values) = Self.filterConditions(filter)
            try db.forEach("SELECT id, vars FROM entries WHERE 1=1" + conditions, values) { r throws(OutboxError) in
                guard r.withText(1, JSON.isWellFormed) else {
                    throw Self.damaged("the stored entry \(r.text(0)) is damaged: its vars are not JSON", id: r.text(0))
                }
            }
            try writeCheckedListRows(filter, displayState: displayState, write)
        }
    }

    private func writeCheckedListRows(
        _ filter: ListFilter, displayState: (String, String) -> String,
        _ write: (String) -> Void
    ) throws(OutboxError) {
        let (sql, values) = Self.listQuery(filter)
        // An outcome no definition handles shows on its entry's row (the entry's own reason is its settle's).
        var rows = ListJSONWriter(unhandled: try unhandledKeyEntryIDs())
        var written = 0
        try db.forEach(sql, values) { r throws(OutboxError) in
            let key = r.text(1)
            let state = displayState(r.text(3), key)
            if let wanted = filter.state, wanted != state { return }
            // The limit counts the rows written, after the displayed-state filter.
            if let limit = filter.limit, written >= limit { return }
            written += 1
            rows.append(r, state: state, masked: try Self.maskedVars(r))
            if rows.count >= 1 << 16 { write(rows.take()) }
        }
        rows.finish()
        write(rows.take())
    }

    /// The vars of a row whose request names secret vars, redacted; nil for the others (the
    /// query hands their request over only when its text may name some).
    static func maskedVars(_ r: Database.Row) throws(OutboxError) -> JSON? {
        guard !r.isNull(13) else { return nil }
        let request = try StoredRequest(json: try storedJSON(r.text(13), what: "stored request"))
        guard !request.secretVars.isEmpty else { return nil }
        return SecretVars.masking(try storedJSON(r.text(2), what: "stored vars"), request.secretVars)
    }
}

/// The JSON array of `list --json`, built as bytes straight from SQLite's column buffers (no
/// String per column) in memory it owns, written through a pointer: an `[UInt8]` paid a
/// uniqueness and capacity check per append, 30 appends a row, a fifth of the command; and
/// local functions capturing such a buffer had every append checked for overlapping access.
/// Not copyable: the memory has one owner, which frees it.
///
/// Room is checked where a row starts and after each column of unbounded length, for
/// `fixedRoom` bytes beyond it: the rest of a row (names, numbers, quotes) fits in that.
struct ListJSONWriter: ~Copyable {
    private static let fixedRoom = 512
    private var base: UnsafeMutablePointer<UInt8>
    private var capacity: Int
    private(set) var count = 0
    private var first = true
    let unhandled: Set<String>

    init(unhandled: Set<String>, capacity: Int = 1 << 17) {
        self.unhandled = unhandled
        self.capacity = max(capacity, Self.fixedRoom)
        base = .allocate(capacity: self.capacity)
        literal("[")
    }

    deinit { base.deallocate() }

    /// Appends one row of the list query; `masked` replaces the stored vars when given.
    mutating func append(_ r: some SQLRowReading, state: String, masked: JSON?) {
        reserve(Self.fixedRoom)
        literal(first ? "{\"id\":" : ",{\"id\":")
        first = false
        string(r, 0)
        literal(",\"key\":")
        string(r, 1)
        literal(",\"vars\":")
        if let masked {
            var text = masked.serialized()
            text.withUTF8 { bytes($0) }
        } else {
            r.withText(2) { bytes($0) }  // stored as compact JSON, checked before
        }
        literal(",\"state\":")
        var state = state
        state.withUTF8 { string($0) }
        literal(",\"reason\":")
        if !unhandled.isEmpty, unhandled.contains(r.text(0)) { literal("\"unhandled-key\"") } else { string(r, 4) }
        literal(",\"bytes_sent\":")
        number(r, 5)
        literal(",\"total_bytes\":")
        number(r, 6)
        literal(",\"attempts\":")
        number(r, 7)
        literal(",\"created_at\":")
        number(r, 8)
        literal(",\"updated_at\":")
        number(r, 9)
        literal(",\"next_attempt_at\":")
        number(r, 10)
        literal(",\"generation\":")
        number(r, 11)
        literal(",\"parent\":")
        string(r, 12)
        literal("}")
    }

    /// Closes the array.
    mutating func finish() {
        reserve(Self.fixedRoom)
        literal("]\n")
    }

    /// The text so far, emptied from the buffer.
    mutating func take() -> String {
        defer { count = 0 }
        return String(decoding: UnsafeBufferPointer(start: base, count: count), as: UTF8.self)
    }

    /// Room for `extra` more bytes.
    private mutating func reserve(_ extra: Int) {
        guard count + extra > capacity else { return }
        let grown = UnsafeMutablePointer<UInt8>.allocate(capacity: max(capacity * 2, count + extra))
        grown.update(from: base, count: count)
        base.deallocate()
        base = grown
        capacity = max(capacity * 2, count + extra)
    }

    /// Text of any length, and room for the fixed part after it.
    private mutating func bytes(_ text: UnsafeBufferPointer<UInt8>) {
        reserve(text.count + Self.fixedRoom)
        put(text)
    }

    /// Fixed text: its room was reserved before.
    private mutating func literal(_ text: StaticString) { text.withUTF8Buffer { put($0) } }

    private mutating func put(_ text: UnsafeBufferPointer<UInt8>) {
        guard let start = text.baseAddress, !text.isEmpty else { return }
        assert(count + text.count <= capacity)
        (base + count).update(from: start, count: text.count)
        count += text.count
    }

    private mutating func string(_ r: some SQLRowReading, _ i: Int32) {
        if r.isNull(i) { literal("null") } else { r.withText(i) { string($0) } }
    }

    /// A JSON string: copied between quotes when nothing in it needs an escape (ids, keys, states).
    private mutating func string(_ text: UnsafeBufferPointer<UInt8>) {
        if JSON.needsNoEscape(utf8: text) {
            literal("\"")
            bytes(text)
            literal("\"")
        } else {
            var escaped: [UInt8] = []
            JSON.appendString(utf8: text, to: &escaped)
            escaped.withUnsafeBufferPointer { bytes($0) }
        }
    }

    private mutating func number(_ r: some SQLRowReading, _ i: Int32) {
        if r.isNull(i) { literal("null") } else { decimal(r.int(i)) }
    }

    /// The decimal digits of `value`, written in place from the last (at most 20 bytes, in the
    /// reserved room).
    private mutating func decimal(_ value: Int64) {
        assert(count + 20 <= capacity)
        if value < 0 {
            base[count] = UInt8(ascii: "-")
            count += 1
        }
        var magnitude = value.magnitude
        var digits = 1
        var rest = magnitude / 10
        while rest > 0 {
            digits += 1
            rest /= 10
        }
        var at = count + digits - 1
        repeat {
            base[at] = UInt8(ascii: "0") + UInt8(magnitude % 10)
            magnitude /= 10
            at -= 1
        } while magnitude > 0
        count += digits
    }
}
