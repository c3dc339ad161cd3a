import OutboxModel

/// Several runners on one schema: claims committed before their transfers start, leases
/// renewed while work is held and requeued when they run out, hook deliveries leased too.
extension PostgresStore {
    package var sharesRunners: Bool { true }

    /// Every runner is admitted: claims, leases and fencing keep them apart. Each holds the
    /// schema's runner lock shared (a store copy takes it alone) and listens for wake-ups.
    package func lockForRunner() throws(OutboxError) -> RunnerLock {
        guard try db.tryLock(key: lockKey, shared: true) else {
            throw .running("a store copy holds the store \(url.redacted)")
        }
        try listen()
        return PostgresRunnerLock(store: self, shared: true)
    }

    /// The schema's runner lock alone, for a store copy: E_RUNNING (exit 75) while any runner
    /// runs. A session lock the server drops with the connection.
    package func lockExclusively() throws(OutboxError) -> RunnerLock {
        guard try db.tryLock(key: lockKey) else {
            throw .running("a runner holds the store \(url.redacted)")
        }
        return PostgresRunnerLock(store: self, shared: false)
    }

    /// Puts back in the queue the running entries whose lease ended by the database's
    /// clock, keeping accepted parts; never the caller's own (it renews those).
    /// Every runner runs it every third of a lease: it wakes the others only when it
    /// requeued something.
    package func requeueAbandoned(lease: Lease, now: Int64) throws(OutboxError) -> Int {
        try db.quietTransaction { () throws(OutboxError) -> Int in
            let requeued = try db.run(
                """
                UPDATE entries SET state = 'queued', lease_owner = NULL, lease_token = NULL, lease_until = NULL, updated_at = ?
                WHERE state = 'running' AND (lease_owner IS NULL OR lease_owner <> ?) AND COALESCE(lease_until, 0) < ?
                """, [.int(now), .text(lease.owner), .int(databaseTime(now))])
            if requeued > 0 { try wakeRunners() }
            return requeued
        }
    }

    /// Whether a running entry's lease has ended by the database's clock (its runner stopped
    /// or lost the database); nil when the entry is not running.
    package func leaseEnded(entryID: String, now: Int64) throws(OutboxError) -> Bool? {
        try db.queryOne("SELECT COALESCE(lease_until, 0) FROM entries WHERE id = ? AND state = 'running'", [.text(entryID)]) {
            $0.int(0) < databaseTime(now)
        }
    }

    /// Bumps the data version and notifies the schema's runners from a quiet transaction
    /// whose change they should see (work that became due).
    func wakeRunners() throws(OutboxError) {
        try db.run("UPDATE data_version SET version = version + 1 WHERE one = 1")
        try db.run("SELECT pg_notify(?, '')", [.text("outbox_\(url.schema)")])
    }

    /// Claims in a commit of its own: rows another runner is claiming are skipped, not
    /// waited for; an entry another runner took, rescheduled or replaced since it was read
    /// is left, and so is one whose scope has a running entry or an older live one (a
    /// scope runs one entry at a time, in enqueue order, across runners). Each claim writes
    /// a fresh token and the lease's end by the database clock.
    package func claim(_ entries: [Entry], lease: Lease, now: Int64) throws(OutboxError) -> [Entry] {
        guard !entries.isEmpty else { return [] }
        let token = Identifiers.uuid()
        let wanted = JSON.array(entries.map { .array([.int64($0.seq), .int64($0.generation)]) }).serialized()
        // The seqs again as an array: the planner then reaches the rows by key, not by a scan.
        let seqs = "{" + entries.map { String($0.seq) }.joined(separator: ",") + "}"
        let claimed = try db.quietTransaction { () throws(OutboxError) -> [Entry] in
            try db.query(
                """
                UPDATE entries SET state = 'running', lease_owner = ?, lease_token = ?, lease_until = ?, updated_at = ?
                WHERE seq = ANY (?::bigint[]) AND seq IN (
                  SELECT e.seq FROM entries e
                  JOIN (SELECT (w->>0)::bigint AS seq, (w->>1)::bigint AS generation FROM jsonb_array_elements(?::jsonb) w) x
                    ON x.seq = e.seq AND x.generation = e.generation
                  WHERE e.seq = ANY (?::bigint[]) AND e.state = 'queued' AND e.waits_for_delivery = 0
                    AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= ?) AND (e.not_before IS NULL OR e.not_before <= ?)
                    AND \(onThisHost)
                    AND (e.scope IS NULL OR NOT EXISTS (
                      SELECT 1 FROM entries o WHERE o.scope = e.scope AND o.seq <> e.seq
                        AND (o.state = 'running' OR (o.seq < e.seq AND o.state IN ('queued', 'awaiting-auth')))))
                  FOR UPDATE OF e SKIP LOCKED)
                RETURNING \(Self.entryColumns)
                """,
                [
                    .text(lease.owner), .text(token), .int(databaseTime(now) + lease.durationMs), .int(now), .text(seqs), .text(wanted),
                    .text(seqs), .int(now), .int(now),
                ]
                    + onThisHostValues, entryFromRow)
        }
        for entry in claimed {
            claimTokens[entry.id] = token
            lostClaims.remove(entry.id)
        }
        let order = Dictionary(entries.enumerated().map { ($1.seq, $0) }, uniquingKeysWith: { first, _ in first })
        return claimed.sorted { order[$0.seq, default: 0] < order[$1.seq, default: 0] }
    }

    /// One UPDATE for every entry this object claimed (fenced by token) and one for its hook
    /// deliveries; an entry the renewal misses is lost for good: its changes stay fenced out.
    package func renewLeases(_ lease: Lease) throws(OutboxError) -> Set<String> {
        let held = claimTokens.filter { !lostClaims.contains($0.key) }
        guard !held.isEmpty || !deliveryClaims.isEmpty else { return [] }
        let until = databaseTime(Identifiers.nowMs()) + lease.durationMs
        let pairs = JSON.array(held.map { .array([.string($0.key), .string($0.value)]) }).serialized()
        let renewed = try db.quietTransaction { () throws(OutboxError) -> Set<String> in
            var renewed: Set<String> = []
            if !held.isEmpty {
                renewed = Set(
                    try db.query(
                        """
                        UPDATE entries SET lease_until = ?
                        WHERE state = 'running' AND lease_owner = ?
                          AND (id, lease_token) IN (SELECT w->>0, w->>1 FROM jsonb_array_elements(?::jsonb) w)
                        RETURNING id
                        """, [.int(until), .text(lease.owner), .text(pairs)]
                    ) { $0.text(0) })
            }
            if !deliveryClaims.isEmpty {
                try db.run(
                    "UPDATE outcomes SET delivery_until = ? WHERE acknowledged = 0 AND delivery_owner = ?",
                    [.int(until), .text(lease.owner)])
            }
            return renewed
        }
        let lost = Set(held.keys).subtracting(renewed)
        lostClaims.formUnion(lost)
        return lost
    }

    /// Claims deliveries no other runner holds (or whose delivery lease ran out) and counts
    /// them, in one commit; the acknowledgement is then fenced on this runner. Rows another
    /// runner is changing right now are skipped, not waited for: two runners claiming
    /// overlapping sets in different orders deadlocked (the caller looks again soon).
    package func claimDeliveries(seqs: [Int64], lease: Lease) throws(OutboxError) -> [Int64: Int64] {
        guard !seqs.isEmpty else { return [:] }
        let list = JSON.array(seqs.map { .int64($0) }).serialized()
        let now = databaseTime(Identifiers.nowMs())
        let rows = try db.quietTransaction { () throws(OutboxError) -> [(Int64, Int64)] in
            try db.query(
                """
                UPDATE outcomes SET deliveries = deliveries + 1, reason = NULL, delivery_owner = ?, delivery_until = ?
                WHERE seq IN (
                  SELECT seq FROM outcomes
                  WHERE seq IN (SELECT jsonb_array_elements_text(?::jsonb)::bigint) AND acknowledged = 0
                    AND (delivery_owner IS NULL OR delivery_owner = ? OR COALESCE(delivery_until, 0) < ?)
                  ORDER BY seq FOR UPDATE SKIP LOCKED)
                RETURNING seq, deliveries
                """, [.text(lease.owner), .int(now + lease.durationMs), .text(list), .text(lease.owner), .int(now)]
            ) { ($0.int(0), $0.int(1)) }
        }
        deliveryOwner = lease.owner
        for (seq, _) in rows { deliveryClaims.insert(seq) }
        return Dictionary(rows, uniquingKeysWith: { first, _ in first })
    }

    /// The condition that makes a change to an outcome apply only while this runner's
    /// delivery lease on it holds (nothing for an outcome it never claimed).
    func deliveryFence(_ seq: Int64) -> (sql: String, values: [SQLValue]) {
        guard deliveryClaims.contains(seq), let owner = deliveryOwner else { return ("", []) }
        return (" AND delivery_owner = ?", [.text(owner)])
    }

    /// The database keeps its own files; a shared staging folder's modes are the sharers' choice.
    package func tightenModes() -> [String] { [] }

    /// The server queues lock waiters itself; a runner waits there for as long as it takes.
    package func reportLockWaits(_ log: @escaping (String) -> Void) {}

    package func endIdleTransactions(afterMs ms: Int64) throws(OutboxError) {
        try db.setSession("idle", "SET idle_in_transaction_session_timeout = \(max(1_000, ms))")
    }

    package func reconnectWhenDropped(_ policy: ReconnectPolicy) {
        db.reconnect = policy
        // A transaction run again builds its file lists again. Returns it journaled stay in
        // the move journal (its commit may have happened): the next store open settles them.
        db.beforeRetry = { [unowned self] in
            obsoleteFiles.removeAll()
            returns.removeAll()
            returnsTicket = nil
        }
    }

    /// Subscribes this connection to the schema's wake-ups (every commit that changes the
    /// queue notifies them).
    func listen() throws(OutboxError) {
        try db.setSession("listen", "LISTEN \"outbox_\(url.schema)\"")
        listening = true
    }
}

/// The runner lock of a PostgreSQL schema, shared by runners (with their subscription to
/// wake-ups) or held alone by a store copy; released with `release()` or the connection.
final class PostgresRunnerLock: RunnerLock {
    private var store: PostgresStore?
    private let shared: Bool

    init(store: PostgresStore, shared: Bool) {
        self.store = store
        self.shared = shared
    }

    func release() {
        guard let store else { return }
        if shared {
            try? store.db.execute("UNLISTEN *")
            try? store.db.setSession("listen", nil)
            store.listening = false
        }
        store.db.unlock(key: store.lockKey, shared: shared)
        self.store = nil
    }

    deinit { release() }
}
