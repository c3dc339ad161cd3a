import CLibPQ
import Glibc
import OutboxModel

/// A connection the server dropped: a runner's reconnects, restores its session and runs
/// again what surely rolled back.
extension PGConnection {
    /// Runs `attempt`; when it failed because the server dropped the connection and a
    /// reconnect policy is set, reconnects and runs it again from its start.
    func retrying<T>(_ attempt: () throws(OutboxError) -> T) throws(OutboxError) -> T {
        var conflicts = 0
        while true {
            lastSQLState = nil
            do throws(OutboxError) {
                return try attempt()
            } catch {
                if transactionDepth == 0, rerunRolledBack {
                    rerunRolledBack = false
                    beforeRetry?()
                    continue
                }
                // The server rolled the transaction back to break a deadlock (or a serialization
                // conflict), or cancelled a statement of it (`statement_timeout`, `lock_timeout`,
                // `pg_cancel_backend`): it surely did not happen, and runs again after a short
                // random wait.
                if transactionDepth == 0, Self.rolledBackStates.contains(lastSQLState ?? ""), conflicts < Self.conflictRetries {
                    conflicts += 1
                    usleep(UInt32.random(in: 1_000...(5_000 * UInt32(min(conflicts, 20)))))
                    continue
                }
                guard transactionDepth == 0, let policy = reconnect, pq.status(conn) != CONNECTION_OK,
                    !error.message.hasPrefix(Self.unknownCommit)
                else { throw error }
                try connectAgain(after: error, policy)
                beforeRetry?()
            }
        }
    }

    /// How many times a transaction the server rolled back for a deadlock runs again.
    static let conflictRetries = 50

    /// SQLSTATEs of a statement whose transaction the server surely rolled back: deadlock,
    /// serialization failure, statement cancelled (a timeout, or by request), lock not available.
    static let rolledBackStates: Set<String> = ["40P01", "40001", "57014", "55P03"]

    static let unknownCommit = "lost the connection to the PostgreSQL store while a commit was on its way"

    /// Whether transaction `xid`, whose COMMIT's answer was lost with the connection, happened:
    /// asked on a new connection (`txid_status`); nil when that cannot be known.
    func resolveCommit(_ xid: Int64, after error: OutboxError) throws(OutboxError) -> Bool? {
        guard let policy = reconnect else { return nil }
        try connectAgain(after: error, policy)
        // Still "in progress" while the old backend ends its work: asked again for a while.
        for _ in 0..<50 {
            // An id it cannot place (too old, or refused) leaves the answer unknown.
            switch (try? queryOne("SELECT txid_status(?::bigint)", [.int(xid)], { $0.isNull(0) ? nil : $0.text(0) })) ?? nil {
            case "committed": return true
            case "aborted": return false
            case "in progress": usleep(100_000)
            default: return nil
            }
        }
        return nil
    }

    /// A transaction is run again only when it surely rolled back: a claim that committed
    /// unseen would hold its entries under this runner's lease without sending them.
    func commitUnknown(_ error: OutboxError) -> OutboxError {
        .storage(
            "\(Self.unknownCommit), so whether it happened is unknown: stopping rather than guessing; "
                + "what this process held goes back to the queue when its leases run out (\(error.message))")
    }

    /// Connects again (every 0.1 s, backing off to the policy's longest wait) and restores the session, until
    /// that works or the policy gives up (then `error` is thrown).
    func connectAgain(after error: OutboxError, _ policy: ReconnectPolicy) throws(OutboxError) {
        // A runner stopping while the server is away does not announce a reconnect per statement.
        if policy.giveUp() { throw error }
        policy.log("outbox: \(error.message); reconnecting (work in flight goes on)")
        var delayMs = 100
        while true {
            var waited = 0
            while waited < delayMs {
                if policy.giveUp() { throw error }
                usleep(50_000)
                waited += 50
            }
            pq.reset(conn)
            statements.removeAll()
            if pq.status(conn) == CONNECTION_OK {
                do throws(OutboxError) {
                    for (_, sql) in session { try executeOnce(sql) }
                    for lock in sessionLocks {
                        let function = lock.shared ? "pg_try_advisory_lock_shared" : "pg_try_advisory_lock"
                        let result = try execOnce("SELECT \(function)(7361201, ?::int)", [.int(Int64(lock.key))])
                        defer { pq.clear(result) }
                        guard pq.getvalue(result, 0, 0).map({ String(cString: $0) }) == "t" else {
                            throw OutboxError.running("the store \(name) was locked by a store copy while this runner was away")
                        }
                    }
                    policy.log("outbox: connected again to the PostgreSQL store \(name)")
                    return
                } catch  where error.code == .running {
                    throw error
                } catch {}
            }
            delayMs = min(delayMs * 2, max(policy.maxDelayMs, 100))
        }
    }
}

/// How a runner's connection behaves when the server drops it: it reconnects until
/// `giveUp` says stop (a stop request), logging through `log`.
package struct ReconnectPolicy: Sendable {
    package var giveUp: @Sendable () -> Bool
    package var log: @Sendable (String) -> Void
    /// The longest wait between two tries: a runner keeps it well under its lease, so a server
    /// back within the lease is found in time to renew.
    package var maxDelayMs: Int

    package init(giveUp: @escaping @Sendable () -> Bool, log: @escaping @Sendable (String) -> Void, maxDelayMs: Int = 5_000) {
        self.giveUp = giveUp
        self.log = log
        self.maxDelayMs = maxDelayMs
    }
}
