import Foundation
import OutboxModel
import OutboxStore
import Testing

extension StoreConformance {
    /// The cumulative counters: added with the changes they count, summed by series, kept
    /// across openings, and moved by hook acknowledgements and failures.
    struct Counters {
        private func values(_ store: any Store) throws -> [String: Int64] {
            var out: [String: Int64] = [:]
            for sample in try store.counters() {
                let labels = sample.labels.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ",")
                out["\(sample.counter.rawValue){\(labels)}"] = sample.value
            }
            return out
        }

        // Increments of one series add up, within a batch and across batches.
        @Test(arguments: StoreUnderTest.all)
        func incrementsAddUpBySeries(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            #expect(try values(c.store).isEmpty, "a new store counts nothing")
            try c.store.apply(
                [
                    .count([
                        CounterIncrement(.attempts, [("result", "retry"), ("key", "note")], by: 2),
                        CounterIncrement(.sentBytes, [("key", "note")], by: 100),
                    ])
                ], now: t0)
            try c.store.apply(
                [
                    .count([
                        CounterIncrement(.attempts, [("key", "note"), ("result", "retry")], by: 1),
                        CounterIncrement(.attempts, [("key", "note"), ("result", "success")], by: 1),
                    ])
                ], now: t0 + 1)
            #expect(
                try values(c.instance.another()) == [
                    "outbox_attempts_total{key=note,result=retry}": 3,
                    "outbox_attempts_total{key=note,result=success}": 1,
                    "outbox_sent_bytes_total{key=note}": 100,
                ])
        }

        // Counters commit with the batch they came with: a batch that fails adds nothing.
        @Test(arguments: StoreUnderTest.all)
        func aFailedBatchAddsNothing(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            // A follow-up whose file is gone by the time the batch applies fails the batch.
            let userFile = try c.userFile("gone.txt", "x")
            let followUp = try c.entry("f", "copy", #"{"path": "\#(userFile)"}"#)
            try FileManager.default.removeItem(atPath: userFile)
            let e = try c.bring("x", to: .running)
            #expect(throws: OutboxError.self) {
                try c.store.apply(
                    [
                        .count([CounterIncrement(.attempts, [("key", "note"), ("result", "success")], by: 1)]),
                        .settle(c.settlement(e, .completed, .completed, followUps: [followUp])),
                    ], now: t0)
            }
            #expect(try values(c.instance.another()).isEmpty)
        }

        // An acknowledgement counts a delivery, a failed delivery a hook failure, by key.
        @Test(arguments: StoreUnderTest.all)
        func deliveriesAndHookFailuresAreCountedByKey(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .completed)
            try c.bring("t", "text", #"{"t": "x"}"#, to: .error)
            let x = try c.pending("x").seq
            _ = try c.store.beginDelivery(seq: x)
            try c.store.deliveryFailed(seq: x, nextDeliveryAt: t0 + 1, reason: "hook exited 1")
            // A delivery that waits for its chain is no hook failure.
            _ = try c.store.beginDelivery(seq: x)
            try c.store.deliveryFailed(seq: x, nextDeliveryAt: t0 + 1, reason: "a follow-up waits", hookStarted: false, hookFailed: false)
            _ = try c.store.beginDelivery(seq: x)
            try c.store.acknowledge(seq: x, followUps: [], now: t0 + 2)
            try c.store.acknowledge(seq: try c.pending("t").seq, followUps: [], now: t0 + 3)
            #expect(
                try values(c.instance.another()) == [
                    "outbox_hook_failures_total{key=note}": 1,
                    "outbox_hook_deliveries_total{key=note}": 1,
                    "outbox_hook_deliveries_total{key=text}": 1,
                ])
        }

        // Hooks that ended together are counted by key in their one commit; an outcome named
        // twice, or already acknowledged, counts once.
        @Test(arguments: StoreUnderTest.all)
        func aBatchOfAcknowledgementsCountsEachDeliveryOnce(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .completed)
            try c.bring("y", to: .completed)
            try c.bring("t", "text", #"{"t": "x"}"#, to: .error)
            let (x, y, t) = (try c.pending("x").seq, try c.pending("y").seq, try c.pending("t").seq)
            try c.store.acknowledge(seq: y, followUps: [], now: t0)
            try c.store.acknowledge(
                [x, y, t, x].map { Acknowledgement(seq: $0, followUps: []) }, now: t0 + 1)
            #expect(
                try values(c.instance.another()) == [
                    "outbox_hook_deliveries_total{key=note}": 2,
                    "outbox_hook_deliveries_total{key=text}": 1,
                ])
            #expect(try c.store.unacknowledgedOutcomes().isEmpty)
        }

        // A hook that exited 0 after its outcome was forgotten (its entry cancelled while the
        // hook ran) is still a delivery of the key it was given; without a key, none is counted.
        @Test(arguments: StoreUnderTest.all)
        func anAcknowledgementOfAForgottenOutcomeCountsByItsKey(_ sut: StoreUnderTest) throws {
            let c = try Conformance(sut)
            try c.bring("x", to: .completed)
            try c.bring("y", to: .completed)
            let (x, y) = (try c.pending("x").seq, try c.pending("y").seq)
            #expect(try c.store.cancel(ids: ["x", "y"], key: nil, now: t0) == ["x", "y"])
            #expect(try c.store.unacknowledgedOutcomes().isEmpty, "forgotten with their entries")
            try c.store.acknowledge(
                [Acknowledgement(seq: x, key: "note", followUps: []), Acknowledgement(seq: y, followUps: [])], now: t0 + 1)
            #expect(try values(c.instance.another()) == ["outbox_hook_deliveries_total{key=note}": 1])
        }
    }
}
