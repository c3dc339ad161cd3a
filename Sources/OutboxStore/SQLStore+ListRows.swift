import OutboxModel

/// The rows of `list`, read straight from the columns: the same on both stores.
extension SQLStore {
    /// Entries with an outcome that waits because no definition has its key.
    package func unhandledKeyEntryIDs() throws(OutboxError) -> Set<String> {
        Set(try unacknowledgedOutcomes().filter { $0.reason == "unhandled-key" }.map(\.entryID))
    }

    /// The columns of a `list` row, in queue order; a `paused` filter reads queued rows. Last,
    /// the request of a row that may name secret vars; requests are looked at only once some
    /// entry had them (the setting is read once per query, in the query's own snapshot).
    static func listQuery(_ filter: ListFilter) -> (String, [SQLValue]) {
        let (conditions, values) = filterConditions(filter)
        let sql = """
            SELECT id, key, vars, state, reason, bytes_sent, total_bytes, attempts, created_at, updated_at, next_attempt_at,
              generation, parent,
              CASE WHEN EXISTS (SELECT 1 FROM settings WHERE name = '\(secretVarsSetting)')
                AND request LIKE '%"\(StoredRequest.secretVarsMember)"%' THEN request END
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
            try body(
                ListRow(
                    id: id, key: r.text(1), state: r.text(3), reason: unhandled.contains(id) ? "unhandled-key" : r.optionalText(4),
                    bytesSent: r.int(5), totalBytes: r.int(6), attempts: r.int(7), updatedAt: r.int(9), nextAttemptAt: r.optionalInt(10)))
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
        // Built as bytes straight from SQLite's column buffers: no String per column.
        var out: [UInt8] = [UInt8(ascii: "[")]
        out.reserveCapacity(1 << 17)
        var first = true
        var written = 0
        func literal(_ text: StaticString) { text.withUTF8Buffer { out.append(contentsOf: $0) } }
        func string(_ r: Database.Row, _ i: Int32) {
            if r.isNull(i) { literal("null") } else { r.withText(i) { JSON.appendString(utf8: $0, to: &out) } }
        }
        func number(_ r: Database.Row, _ i: Int32) {
            if r.isNull(i) { literal("null") } else { Self.appendDecimal(r.int(i), to: &out) }
        }
        // An outcome no definition handles shows on its entry's row (the entry's own reason is its settle's).
        let unhandled = try unhandledKeyEntryIDs()
        try db.forEach(sql, values) { r throws(OutboxError) in
            let key = r.text(1)
            let state = displayState(r.text(3), key)
            if let wanted = filter.state, wanted != state { return }
            // The limit counts the rows written, after the displayed-state filter.
            if let limit = filter.limit, written >= limit { return }
            written += 1
            literal(first ? "{\"id\":" : ",{\"id\":")
            first = false
            string(r, 0)
            literal(",\"key\":")
            string(r, 1)
            literal(",\"vars\":")
            if let masked = try Self.maskedVars(r) {
                out += masked.serialized().utf8
            } else {
                r.withText(2) { out.append(contentsOf: $0) }  // stored as compact JSON, checked above
            }
            literal(",\"state\":")
            JSON.appendString(state, to: &out)
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
            if out.count >= 1 << 16 {
                write(String(decoding: out, as: UTF8.self))
                out.removeAll(keepingCapacity: true)
            }
        }
        literal("]\n")
        write(String(decoding: out, as: UTF8.self))
    }

    /// The vars of a row whose request names secret vars, redacted; nil for the others (the
    /// query hands their request over only when its text may name some).
    static func maskedVars(_ r: Database.Row) throws(OutboxError) -> JSON? {
        guard !r.isNull(13) else { return nil }
        let request = try StoredRequest(json: try storedJSON(r.text(13), what: "stored request"))
        guard !request.secretVars.isEmpty else { return nil }
        return SecretVars.masking(try storedJSON(r.text(2), what: "stored vars"), request.secretVars)
    }

    /// Appends the decimal digits of `value`.
    static func appendDecimal(_ value: Int64, to out: inout [UInt8]) {
        if value < 0 { out.append(UInt8(ascii: "-")) }
        var magnitude = value.magnitude
        var digits:
            (
                UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8
            ) =
                (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var count = 0
        withUnsafeMutableBytes(of: &digits) { buffer in
            repeat {
                buffer[19 - count] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
                count += 1
            } while magnitude > 0
            out.append(contentsOf: buffer[(20 - count)...])
        }
    }
}
