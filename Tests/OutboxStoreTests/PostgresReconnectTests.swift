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
        let logged = Locked<[String]>([])
        db.reconnect = ReconnectPolicy(giveUp: { false }, log: { line in logged.withLock { $0.append(line) } })
        return (db, killer, table, logged)
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

    // Cut with only the COMMIT left: whether it happened is not known, so it is not run
    // again; the caller gets an error that says so.
    @Test func aCommitWithoutAnAnswerIsNotRunAgain() throws {
        let (db, killer, table, _) = try Self.connections()
        var runs = 0
        do throws(OutboxError) {
            try db.transaction(lock: 1) { () throws(OutboxError) in
                runs += 1
                try db.run("INSERT INTO \(table) VALUES (2)")
                try Self.cut(db, by: killer)
            }
            Issue.record("the transaction reported success")
        } catch {
            #expect(error.code == .storage)
            #expect(error.message.hasPrefix(PGConnection.unknownCommit), "\(error.message)")
        }
        #expect(runs == 1)
        #expect(try Self.count(killer, table, 2) == 0)
    }
}
