import Foundation
import OutboxModel
import Testing
import TestSupport

@testable import OutboxStore

/// A connection whose server end is cut (`pg_terminate_backend`, waited for): a runner's
/// reconnects and runs again a transaction that surely rolled back, and refuses to guess
/// about one whose COMMIT left without an answer.
struct PostgresReconnectTests {
    /// A connection with a runner's policy, one to cut it with, and a table of its own.
    static func connections() throws -> (db: PGConnection, killer: PGConnection, table: String, logged: Locked<[String]>) {
        let cluster = try PostgresCluster.shared()
        let url = try PostgresURL(cluster.url(schema: "public"))
        let db = try PGConnection(uri: url.connectionURI, name: url.redacted)
        let killer = try PGConnection(uri: url.connectionURI, name: url.redacted)
        let table = PostgresCluster.uniqueSchema("cut")
        try db.execute("CREATE TABLE \(table) (n INT)")
        let (policy, logged) = loggingPolicy()
        db.reconnect = policy
        return (db, killer, table, logged)
    }

    /// A runner's policy (it never gives up), and the lines it logs.
    static func loggingPolicy() -> (ReconnectPolicy, Locked<[String]>) {
        let logged = Locked<[String]>([])
        return (ReconnectPolicy(giveUp: { false }, log: { line in logged.withLock { $0.append(line) } }), logged)
    }

    static func cut(_ db: PGConnection, by killer: PGConnection) throws(OutboxError) {
        let pid = try db.queryOne("SELECT pg_backend_pid()") { $0.int(0) } ?? 0
        let ended = try killer.queryOne("SELECT pg_terminate_backend(?::int, 10000)", [.int(pid)]) { $0.text(0) }
        #expect(ended == "t", "the backend \(pid) ended")
    }

    static func count(_ killer: PGConnection, _ table: String, _ n: Int) throws -> Int64 {
        try killer.queryOne("SELECT COUNT(*) FROM \(table) WHERE n = ?::int", [.int(Int64(n))]) { $0.int(0) } ?? -1
    }

    // Cut before a statement of the body: the transaction rolled back, so it runs again whole.
    @Test func aTransactionCutBeforeItsCommitRunsAgainOnANewConnection() throws {
        let (db, killer, table, logged) = try Self.connections()
        var runs = 0
        try db.transaction(lock: 1) { () throws(OutboxError) in
            runs += 1
            if runs == 1 { try Self.cut(db, by: killer) }
            try db.run("INSERT INTO \(table) VALUES (1)")
        }
        #expect(runs == 2)
        #expect(try Self.count(killer, table, 1) == 1)
        #expect(logged.withLock { $0 }.contains { $0.contains("reconnecting") })
        #expect(logged.withLock { $0 }.contains { $0.contains("connected again") })
        // The new connection works for what comes next.
        #expect(try db.queryOne("SELECT 1") { $0.int(0) } == 1)
    }

    // Cut with only the COMMIT left: no answer comes, so the server is asked on a new
    // connection what became of the transaction (by its id); rolled back, it runs again.
    @Test func aCommitWithoutAnAnswerIsResolvedByTheServer() throws {
        let (db, killer, table, _) = try Self.connections()
        var runs = 0
        try db.transaction(lock: 1) { () throws(OutboxError) in
            runs += 1
            try db.run("INSERT INTO \(table) VALUES (2)")
            if runs == 1 { try Self.cut(db, by: killer) }
        }
        #expect(runs == 2)
        #expect(try Self.count(killer, table, 2) == 1)
    }

    // A transaction that did commit is found committed (not run again); one whose id the
    // server cannot place leaves the caller an error that says whether it happened is unknown.
    @Test func aCommittedTransactionIsFoundCommitted() throws {
        let (db, killer, _, _) = try Self.connections()
        try db.execute("BEGIN")
        let xid = try #require(try db.queryOne("SELECT txid_current()") { $0.int(0) })
        try db.execute("COMMIT")
        try Self.cut(db, by: killer)
        #expect(try db.resolveCommit(xid, after: .storage("cut")) == true)
        try Self.cut(db, by: killer)
        #expect(try db.resolveCommit(xid + 1_000_000, after: .storage("cut")) == nil)
        // Without a runner's reconnect policy nothing is asked.
        db.reconnect = nil
        #expect(try db.resolveCommit(xid, after: .storage("cut")) == nil)
    }

    /// Makes the next row inserted into `table` end its own session, once (a sequence is
    /// not rolled back, so the transaction run again inserts freely).
    static func cutAtNextInsert(into table: String, _ store: PostgresStore) throws(OutboxError) {
        try store.db.execute(
            """
            CREATE SEQUENCE cut_once;
            CREATE FUNCTION cut_once() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF nextval('cut_once') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
              RETURN NEW;
            END $$;
            CREATE TRIGGER cut_once BEFORE INSERT ON \(table) FOR EACH ROW EXECUTE FUNCTION cut_once();
            """)
    }

    /// A store whose runner reconnects, and the lines it logs.
    static func reconnecting(_ c: Conformance) throws -> (PostgresStore, Locked<[String]>) {
        let store = try #require(c.store as? PostgresStore)
        let (policy, logged) = loggingPolicy()
        store.reconnectWhenDropped(policy)
        return (store, logged)
    }

    // A runner's batch cut after its settle chained a follow-up, at the follow-up's insert:
    // the batch runs again whole on a new connection, and applies once (the follow-up is
    // enqueued once, the settle counts once, nothing is reported fenced out).
    @Test func aRunnerBatchCutBeforeItsCommitAppliesOnceOnANewConnection() throws {
        let c = try Conformance(.postgres)
        let (store, logged) = try Self.reconnecting(c)
        try c.enqueue("x")
        let held = try c.claim("x")[0]
        var followUp = try c.entry("f-minted")
        followUp.idWasMinted = true
        try Self.cutAtNextInsert(into: "entries", store)
        let applied = try store.apply(
            [
                .count([CounterIncrement(.attempts, [("key", "note"), ("result", "success")], by: 1)]),
                .settle(c.settlement(held, .completed, .completed, followUps: [followUp])),
            ], by: StoreConformance.runnerA, now: StoreConformance.t0)
        #expect(applied.fencedOut.isEmpty)
        #expect(logged.withLock { $0 }.contains { $0.contains("reconnecting") })
        let other = try c.instance.another()
        #expect(try other.list(ListFilter()).map(\.id).sorted() == ["f-minted", "x"])
        #expect(try other.entry(id: "x")?.state == .completed)
        #expect(try c.journal("x") == ["x g1 completed pending"])
        #expect(try other.counters().filter { $0.counter == .attempts }.map(\.value) == [1])
    }

    // An acknowledgement cut at its count, and meanwhile another runner took the delivery
    // over: the transaction run again is fenced as the first run was (by this runner's
    // delivery claim), so it acknowledges nothing.
    @Test func anAcknowledgementRunAgainKeepsItsDeliveryFence() throws {
        let c = try Conformance(.postgres)
        let (store, logged) = try Self.reconnecting(c)
        try c.bring("a", to: .completed)
        let seq = try #require(try store.unacknowledgedOutcomes().first?.seq)
        #expect(try store.claimDeliveries(seqs: [seq], lease: StoreConformance.runnerA)[seq] == 1)
        let other = try #require(try c.instance.another() as? PostgresStore)
        let reconnected = store.db.beforeRetry
        store.db.beforeRetry = {
            reconnected?()
            _ = try? other.db.run("UPDATE outcomes SET delivery_owner = 'runner-b' WHERE seq = ?", [.int(seq)])
        }
        try Self.cutAtNextInsert(into: "counters", store)
        try store.acknowledge(seq: seq, followUps: [], now: StoreConformance.t0 + 1)
        #expect(logged.withLock { $0 }.contains { $0.contains("reconnecting") })
        #expect(try c.journal("a") == ["a g1 completed pending"])
        #expect(try other.counters().filter { $0.counter == .hookDeliveries }.isEmpty)
    }

    // Two transactions that lock two rows in opposite orders: the server breaks the deadlock
    // by rolling one back, which then runs again whole (nothing was lost, no process stops).
    @Test func aTransactionRolledBackForADeadlockRunsAgain() throws {
        let (a, killer, table, _) = try Self.connections()
        let b = try PGConnection(uri: try PostgresURL(PostgresCluster.shared().url(schema: "public")).connectionURI, name: "b")
        try a.execute("INSERT INTO \(table) VALUES (1), (2)")
        let aHolds = DispatchSemaphore(value: 0)
        let bHolds = DispatchSemaphore(value: 0)
        let bDone = DispatchSemaphore(value: 0)
        let bRuns = Locked(0)
        let bError = Locked<OutboxError?>(nil)
        // Each takes its first row, waits (its first run only) until the other has taken its own, then wants the other's.
        DispatchQueue.global().async {
            do throws(OutboxError) {
                try b.quietTransaction { () throws(OutboxError) in
                    let run = bRuns.withLock {
                        $0 += 1; return $0
                    }
                    try b.run("UPDATE \(table) SET n = n + 10 WHERE n % 10 = 2")
                    if run == 1 {
                        bHolds.signal()
                        aHolds.wait()
                    }
                    try b.run("UPDATE \(table) SET n = n + 10 WHERE n % 10 = 1")
                }
            } catch { bError.withLock { $0 = error } }
            bDone.signal()
        }
        var aRuns = 0
        try a.quietTransaction { () throws(OutboxError) in
            aRuns += 1
            try a.run("UPDATE \(table) SET n = n + 10 WHERE n % 10 = 1")
            if aRuns == 1 {
                aHolds.signal()
                bHolds.wait()
            }
            try a.run("UPDATE \(table) SET n = n + 10 WHERE n % 10 = 2")
        }
        bDone.wait()
        #expect(bError.withLock { $0 } == nil)
        // At least one ran again; on a busy machine the rerun can meet the other again
        // before it took the freed row, and a second deadlock makes that one run again too.
        #expect(aRuns + bRuns.withLock { $0 } >= 3, "one of them ran again")
        // Both committed once: each row went up by 10 twice.
        #expect(try Self.count(killer, table, 21) == 1)
        #expect(try Self.count(killer, table, 22) == 1)
    }
}
