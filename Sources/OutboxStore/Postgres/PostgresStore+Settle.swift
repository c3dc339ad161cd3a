import OutboxModel

/// The entries a runner's turn settles without a hook, completed or cancelled, are forgotten
/// together: one statement for all their rows, attempts, outcomes and parts.
extension PostgresStore {
    /// A settlement that forgets its entry at once (no outcome waits for a hook), with the
    /// entry as the runner holds it.
    static func forgetsAtOnce(_ s: Settlement) -> Bool {
        s.snapshot != nil && s.forgetsEntry
    }

    /// Deletes every such entry of `changes` whose generation (and this runner's claim on it,
    /// with a lease) still holds; returns the seqs deleted.
    func forgetSettled(_ changes: [RunnerChange], lease: Lease?) throws(OutboxError) -> Set<Int64> {
        let wanted = changes.compactMap { change -> JSON? in
            guard case let .settle(s) = change, Self.forgetsAtOnce(s), let e = s.snapshot else { return nil }
            let token: JSON = lease == nil ? .null : claimTokens[s.entryID].map { .string($0) } ?? .null
            return .array([.int64(e.seq), .int64(s.generation), token])
        }
        // The seqs again as an array: the planner then reaches the rows by key, not by a scan.
        let seqs = "{" + wanted.compactMap { $0.arrayValue?.first?.int64Value.map(String.init) }.joined(separator: ",") + "}"
        // The fence of `fence(_:_:)`, per row: the claim's token, or unclaimed and queued.
        let fence =
            lease == nil
            ? ""
            : """
             AND ((w.token IS NOT NULL AND e.lease_owner = ?::text AND e.lease_token = w.token)
                OR (w.token IS NULL AND (e.lease_owner = ?::text OR (e.state = 'queued' AND e.lease_owner IS NULL))))
            """
        let rows = try db.query(
            """
            WITH w AS (
                SELECT (x->>0)::bigint AS seq, (x->>1)::bigint AS generation, x->>2 AS token FROM jsonb_array_elements(?::jsonb) x),
              d AS (
                DELETE FROM entries e USING w WHERE e.seq = ANY (?::bigint[]) AND e.seq = w.seq AND e.generation = w.generation\(fence)
                RETURNING e.id, e.seq, e.generation),
              a AS (DELETE FROM attempts WHERE entry_id IN (SELECT id FROM d)),
              o AS (DELETE FROM outcomes t USING d WHERE t.entry_id = d.id AND t.generation <= d.generation),
              p AS (DELETE FROM parts WHERE entry_seq IN (SELECT seq FROM d))
            SELECT seq FROM d
            """, [.text(JSON.array(wanted).serialized()), .text(seqs)] + (lease.map { [.text($0.owner), .text($0.owner)] } ?? [])
        ) { $0.int(0) }
        return Set(rows)
    }

    /// What settling one such entry came to: its files once its row was deleted, or nothing
    /// (fenced out). Each deleted seq counts once.
    func settledForgotten(_ s: Settlement, _ forgotten: inout Set<Int64>?) -> (files: [String], applied: Bool) {
        claimTokens[s.entryID] = nil
        guard var settled = s.snapshot, forgotten?.remove(settled.seq) != nil else { return ([], false) }
        settled.state = s.state
        return (forgottenFiles(settled, returnMovedFile: s.state == .cancelled), true)
    }
}
