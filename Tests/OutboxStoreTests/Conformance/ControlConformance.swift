import Foundation
import OutboxModel
@testable import OutboxStore
import TestSupport
import Testing

extension StoreConformance {
    /// The state commands set and runners obey, and how a runner notices other processes.
    struct Control {
        // A new store is unpaused, not Wi-Fi only, at header generation 0.
        @Test(arguments: StoreUnderTest.all)
        func aNewStoreHasTheDefaultControl(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            #expect(try c.store.control() == QueueControl())
        }

        // Pausing and resuming the queue round-trips, and another process sees it.
        @Test(arguments: StoreUnderTest.all)
        func queuePauseRoundTrips(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let other = try c.instance.another()
            try c.store.setQueuePaused(true)
            #expect(try c.store.control().queuePaused)
            #expect(try other.control().queuePaused)
            #expect(try other.control().isPaused(key: "any"))
            try c.store.setQueuePaused(false)
            #expect(try other.control() == QueueControl())
        }

        // Keys pause and resume one by one; pausing twice is pausing once.
        @Test(arguments: StoreUnderTest.all)
        func keyPausesRoundTrip(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.store.setPaused(keys: ["a", "b"], paused: true)
            try c.store.setPaused(keys: ["b"], paused: true)
            #expect(try c.store.control().pausedKeys == ["a", "b"])
            try c.store.setPaused(keys: ["a", "never-paused"], paused: false)
            let control = try c.instance.another().control()
            #expect(control.pausedKeys == ["b"])
            #expect(!control.queuePaused)
            #expect(control.isPaused(key: "b"))
            #expect(!control.isPaused(key: "a"))
        }

        // A paused key's entries carry a mark, set as they are written and when the key is
        // paused or resumed, which the read of due entries seeks past in its index (a paused
        // backlog is not walked); the audit names a mark out of step with the key's pause.
        @Test(arguments: StoreUnderTest.all)
        func aPausedKeysEntriesAreMarked(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("before")
            try c.enqueue("other", "text", #"{"t": "x"}"#)
            try c.store.setPaused(keys: ["note"], paused: true)
            try c.enqueue("during", "note", #"{"n": 2}"#)
            #expect(try Self.marks(c) == "before=1 other=0 during=1")
            #expect(try c.dueIDs(at: t0 + 10) == ["other"])
            // A same-id replace writes a new row, marked too.
            #expect(try c.enqueue("during", "note", #"{"n": 3}"#, now: t0 + 5) == .replace)
            #expect(try Self.marks(c) == "before=1 other=0 during=1")
            #expect(try c.store.audit() == [])
            try Self.sql(c, "UPDATE entries SET paused = 1 WHERE id = 'other'")
            #expect(
                try c.store.audit() == [
                    "1 entry of key text marked paused against the key's pause (resume the key, and pause it again if it should stay paused)"
                ])
            try c.store.setPaused(keys: ["text"], paused: true)
            try c.store.setPaused(keys: ["text", "note"], paused: false)
            #expect(try Self.marks(c) == "before=0 other=0 during=0")
            #expect(try c.store.audit() == [])
            #expect(try c.dueIDs(at: t0 + 10) == ["before", "other", "during"])
        }

        static func marks(_ c: Conformance) throws -> String {
            let sql = "SELECT id, paused FROM entries ORDER BY seq"
            let rows: [String]
            if let store = c.store as? SQLiteStore {
                rows = try store.db.query(sql) { "\($0.text(0))=\($0.int(1))" }
            } else {
                rows = try #require(c.store as? PostgresStore).db.query(sql) { "\($0.text(0))=\($0.int(1))" }
            }
            return rows.joined(separator: " ")
        }

        static func sql(_ c: Conformance, _ sql: String) throws {
            if let store = c.store as? SQLiteStore {
                try store.db.run(sql)
            } else {
                try #require(c.store as? PostgresStore).db.run(sql)
            }
        }

        // Wi-Fi only round-trips.
        @Test(arguments: StoreUnderTest.all)
        func wifiOnlyRoundTrips(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.store.setWifiOnly(true)
            #expect(try c.instance.another().control() == QueueControl(wifiOnly: true))
            try c.store.setWifiOnly(false)
            #expect(try c.store.control() == QueueControl())
        }

        // The data version stays while nothing is committed, reads included.
        @Test(arguments: StoreUnderTest.all)
        func dataVersionStaysWithoutACommit(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.enqueue("x")
            let other = try c.instance.another()
            let version = try c.store.dataVersion()
            _ = try other.list(ListFilter())
            _ = try other.control()
            _ = try other.dueEntries(now: t0, limit: 10, excluding: [])
            #expect(try c.store.dataVersion() == version)
        }

        // Another process's commit changes the version a runner polls: an enqueue, a pause, a cancel.
        @Test(arguments: StoreUnderTest.all)
        func dataVersionChangesWhenAnotherProcessCommits(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let other = try c.instance.another()
            let v0 = try c.store.dataVersion()
            _ = try other.enqueue([try c.entry("x")], now: t0)
            let v1 = try c.store.dataVersion()
            #expect(v1 != v0)
            try other.setQueuePaused(true)
            let v2 = try c.store.dataVersion()
            #expect(v2 != v1)
            _ = try other.cancel(ids: ["x"], key: nil, now: t0 + 1)
            #expect(try c.store.dataVersion() != v2)
        }
    }

    /// Commands over the whole queue read it a chunk at a time: every entry is reached, past
    /// the chunk's size, and changed or forgotten once.
    struct WholeQueue {
        // 2,500 entries (chunks of 1,000): headers update, retry --key, audit and cancel --all reach each one.
        @Test(arguments: StoreUnderTest.all)
        func commandsOverTheWholeQueueReachEveryEntry(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let ids = (1...2_500).map { "w-\($0)" }
            _ = try c.store.enqueue(try ids.map { id in try c.entry(id) }, now: StoreConformance.t0)
            _ = try c.store.updateHeaders([("X-Patch", "p")], now: StoreConformance.t0 + 1)
            let patched = try c.store.list(ListFilter()).filter { $0.request.headers.contains { $0 == ("X-Patch", "p") } }
            #expect(patched.count == 2_500)
            #expect(Set(try c.store.retry(ids: nil, key: "note", errors: false, now: StoreConformance.t0 + 2)) == Set(ids))
            #expect(try c.store.audit() == [])
            let cancelled = try c.store.cancel(ids: nil, key: nil, now: StoreConformance.t0 + 3)
            #expect(cancelled.count == 2_500)
            #expect(Set(cancelled) == Set(ids))
            #expect(try c.store.list(ListFilter()).isEmpty)
        }
    }

    /// The runner lock: one runner per store, or any number on a store runners share.
    struct RunnerLocks {
        // A second runner is refused with E_RUNNING while the first holds the lock, and let in after release.
        @Test(arguments: StoreUnderTest.all.filter { !$0.sharedByRunners })
        func oneRunnerHoldsTheLock(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            #expect(!c.store.sharesRunners)
            let other = try c.instance.another()
            let lock = try c.store.lockForRunner()
            let error = #expect(throws: OutboxError.self) { _ = try other.lockForRunner() }
            #expect(error?.code == .running)
            lock.release()
            let second = try Self.onceReleased { try other.lockForRunner() }
            #expect(throws: OutboxError.self) { _ = try c.store.lockForRunner() }
            second.release()
            // A runner kept out by a store copy is told so, not that another runner runs.
            let copying = try Self.onceReleased { try c.store.lockExclusively() }
            let refused = #expect(throws: OutboxError.self) { _ = try other.lockForRunner() }
            #expect(refused?.code == .running)
            #expect(refused?.message.contains("a store copy holds the store") == true, "\(String(describing: refused))")
            copying.release()
        }

        /// Takes a lock this process has just released. Its descriptor is close-on-exec, but a
        /// child another test forks meanwhile holds it from its fork until it closes its
        /// descriptors or execs, which a loaded machine can delay: the lock is taken until then.
        static func onceReleased(_ take: () throws -> RunnerLock) throws -> RunnerLock {
            try retried(
                { Result { try take() } },
                until: { result in
                    guard case let .failure(error as OutboxError) = result else { return true }
                    return error.code != .running
                }
            ).get()
        }

        // A store several runners share admits each of them, and says so.
        @Test(arguments: StoreUnderTest.all.filter(\.sharedByRunners))
        func everyRunnerIsAdmitted(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let other = try c.instance.another()
            #expect(c.store.sharesRunners)
            let first = try c.store.lockForRunner()
            let second = try other.lockForRunner()
            // A store copy is refused while any runner runs, and keeps runners out while it copies.
            let copier = try c.instance.another()
            let busy = #expect(throws: OutboxError.self) { _ = try copier.lockExclusively() }
            #expect(busy?.code == .running)
            first.release()
            #expect(throws: OutboxError.self) { _ = try copier.lockExclusively() }
            second.release()
            let copy = try copier.lockExclusively()
            let refused = #expect(throws: OutboxError.self) { _ = try c.store.lockForRunner() }
            #expect(refused?.code == .running)
            copy.release()
            try c.store.lockForRunner().release()
        }
    }

    /// `outbox audit`: the store's invariants.
    struct Audit {
        // A store the protocol alone has written audits clean, whatever its entries' kinds and states.
        @Test(arguments: StoreUnderTest.all)
        func aStoreWrittenThroughTheProtocolAuditsClean(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            #expect(try c.store.audit() == [])
            try c.bring("queued", to: .queued)
            try c.bring("running", to: .running)
            try c.bring("parked", to: .awaitingAuth)
            try c.bring("failed", to: .error)
            try c.bring("done", to: .completed)
            try c.bring("cancelled", to: .cancelled)
            try c.enqueue("big", "text", #"{"t": "\#(String(repeating: "b", count: 100_000))"}"#)
            try c.userFile("doc.txt", "a document")
            try c.enqueue("copy", "copy", #"{"path": "doc.txt"}"#)
            _ = try c.store.enqueue([try c.chunked("parts")], now: t0)
            #expect(try c.store.cancel(ids: ["queued"], key: nil, now: t0 + 1) == ["queued"])
            #expect(try c.ids().count == 8)
            #expect(try c.store.audit() == [])
        }
    }
}
