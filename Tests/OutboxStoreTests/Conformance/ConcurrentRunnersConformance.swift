import Foundation
import OutboxModel
import OutboxStore
import Testing

extension StoreConformance {
    /// Runners claiming and settling at the same time on their own connections: claims and
    /// settles take no schema-wide lock, so row locks and the scope check must keep them apart.
    struct ConcurrentRunners {
        static let shared = StoreUnderTest.all.filter(\.sharedByRunners)

        // Four runners drain scoped and unscoped entries at once: each entry runs once, a scope one entry at a time in enqueue order.
        @Test(arguments: shared)
        func concurrentClaimersKeepScopesSerialAndClaimEachEntryOnce(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            var batch: [NewEntry] = []
            for n in 1...12 {
                for scope in ["p", "q", "r"] { batch.append(try c.entry("\(scope)\(n)", "scoped", #"{"n": \#(n), "s": "\#(scope)"}"#)) }
                batch.append(try c.entry("u\(n)", "note", #"{"n": \#(n)}"#))
            }
            _ = try c.store.enqueue(batch, now: t0)
            let runners = try (0..<4).map { _ in StoreBox(try c.instance.another()) }
            let log = ClaimLog()
            let settlementFor = { (e: Entry) in c.settlement(e, .completed, .completed, hook: false) }
            let settle = SettlementMaker(settlementFor)
            DispatchQueue.concurrentPerform(iterations: runners.count) { i in
                log.record(worker: i, Self.drain(runners[i].store, lease: Lease(owner: "runner-\(i)", durationMs: 60_000), log, settle))
            }
            #expect(log.failures == [])
            #expect(log.claimed.count == batch.count)
            #expect(Set(log.claimed.map(\.id)).count == batch.count)
            for scope in ["p", "q", "r"] {
                #expect(log.claimed.filter { $0.id.hasPrefix(scope) }.map(\.id) == (1...12).map { "\(scope)\($0)" })
            }
            #expect(try c.ids() == [])
        }

        // A runner's own claims, attempts, settles and renewals wake no other runner; an enqueue, a pause and a requeue of an abandoned claim do.
        @Test(arguments: shared)
        func onlyChangesOtherRunnersMustSeeMoveTheDataVersion(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            let other = try c.instance.another()
            try c.enqueue("x")
            try c.enqueue("y")
            var seen = try other.dataVersion()
            let held = try c.store.claim([try c.get("x"), try c.get("y")], lease: runnerA, now: t0)
            try c.store.apply([.attempt(entryID: "x", generation: 1, at: t0, payload: .object([]), requestID: "r1")], by: runnerA, now: t0)
            try c.store.apply([.settle(c.settlement(held[0], .completed, .completed, hook: false))], by: runnerA, now: t0)
            #expect(try c.store.renewLeases(runnerA) == [])
            #expect(try other.dataVersion() == seen)
            #expect(try c.get("y").state == .running)
            try c.enqueue("z")
            #expect(try other.dataVersion() != seen)
            seen = try other.dataVersion()
            try c.store.setPaused(keys: ["note"], paused: true)
            #expect(try other.dataVersion() != seen)
            seen = try other.dataVersion()
            let later = Int64(Date().timeIntervalSince1970 * 1000) + runnerA.durationMs + 1
            #expect(try other.requeueAbandoned(lease: runnerB, now: later) == 1)
            #expect(try c.store.dataVersion() != seen)
        }

        // A turn's settles without a hook are forgotten together, each fenced by its own claim: those another runner took stay.
        @Test(arguments: shared)
        func settlesWithoutAHookAreFencedEachByItsClaim(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            for id in ["x", "y", "z"] { try c.enqueue(id) }
            let first = try c.store.claim([try c.get("x"), try c.get("y")], lease: runnerA, now: t0)
            // The renewal runs on this host's clock: the requeue looks past that lease's end.
            #expect(try c.store.renewLeases(runnerA) == [])
            let other = try c.instance.another()
            let later = Int64(Date().timeIntervalSince1970 * 1000) + runnerA.durationMs + 1
            #expect(try other.requeueAbandoned(lease: runnerB, now: later) == 2)
            #expect(try other.claim([try c.get("y")], lease: runnerB, now: t0).map(\.id) == ["y"])
            let z = try c.store.claim([try c.get("z")], lease: runnerA, now: t0)
            let applied = try c.store.apply(
                (first + z).map { .settle(c.settlement($0, .completed, .completed, hook: false)) }, by: runnerA, now: t0)
            #expect(applied.fencedOut == ["x", "y"])
            #expect(try c.ids() == ["x", "y"])
            #expect(try c.get("x").state == .queued)
            #expect(try c.get("y").state == .running)
        }

        /// One runner's loop: read, claim, check no scope runs two entries, settle; until the
        /// queue is empty (or a deadline that fails the test).
        private static func drain(_ store: any Store, lease: Lease, _ log: ClaimLog, _ settle: SettlementMaker) -> String? {
            let deadline = Date().addingTimeInterval(120)
            do {
                while Date() < deadline {
                    let due = try store.dueEntries(now: t0, limit: 4, excluding: [])
                    if due.isEmpty {
                        if try store.list(ListFilter()).isEmpty { return nil }
                        continue
                    }
                    let held = try store.claim(due, lease: lease, now: t0)
                    let running = try store.list(ListFilter(state: "running"))
                    let scopes = running.compactMap(\.scope)
                    if Set(scopes).count != scopes.count { return "two entries of a scope ran at once: \(running.map(\.id))" }
                    log.claim(held)
                    _ = try store.apply(held.map { .settle(settle.make($0)) }, by: lease, now: t0)
                }
                return "the queue was not drained in time: \(try store.list(ListFilter()).map(\.id))"
            } catch {
                return "\(error)"
            }
        }
    }
}

/// A store one worker thread uses alone.
private final class StoreBox: @unchecked Sendable {
    let store: any Store
    init(_ store: any Store) { self.store = store }
}

/// Builds the settlement of a held entry (the conformance helper, shared read-only by workers).
private final class SettlementMaker: @unchecked Sendable {
    let make: (Entry) -> Settlement
    init(_ make: @escaping (Entry) -> Settlement) { self.make = make }
}

/// The claims of all workers in the order they happened, and what went wrong.
private final class ClaimLog: @unchecked Sendable {
    private let lock = NSLock()
    private(set) var claimed: [Entry] = []
    private(set) var failures: [String] = []

    func claim(_ entries: [Entry]) {
        lock.lock()
        claimed += entries
        lock.unlock()
    }

    func record(worker: Int, _ failure: String?) {
        guard let failure else { return }
        lock.lock()
        failures.append("runner \(worker): \(failure)")
        lock.unlock()
    }
}
