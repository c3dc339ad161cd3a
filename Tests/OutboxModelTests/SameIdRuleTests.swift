import OutboxModel
import Digest
import Testing

struct SameIdRuleTests {
    struct Case: Sendable, CustomTestStringConvertible {
        let state: EntryState
        let sameBody: Bool
        let acknowledged: Bool
        let expected: SameIdDecision
        var testDescription: String {
            "\(state.rawValue), \(sameBody ? "same" : "different") body, \(acknowledged ? "acknowledged" : "not acknowledged")"
        }
    }

    /// Every state × same/different body × acknowledged or not.
    static let cases: [Case] = [
        Case(state: .queued, sameBody: true, acknowledged: true, expected: .resume),
        Case(state: .queued, sameBody: true, acknowledged: false, expected: .resume),
        Case(state: .queued, sameBody: false, acknowledged: true, expected: .replace),
        Case(state: .queued, sameBody: false, acknowledged: false, expected: .replace),

        Case(state: .running, sameBody: true, acknowledged: true, expected: .resume),
        Case(state: .running, sameBody: true, acknowledged: false, expected: .resume),
        Case(state: .running, sameBody: false, acknowledged: true, expected: .rejectRunning),
        Case(state: .running, sameBody: false, acknowledged: false, expected: .rejectRunning),

        Case(state: .paused, sameBody: true, acknowledged: true, expected: .resume),
        Case(state: .paused, sameBody: true, acknowledged: false, expected: .resume),
        Case(state: .paused, sameBody: false, acknowledged: true, expected: .replace),
        Case(state: .paused, sameBody: false, acknowledged: false, expected: .replace),

        Case(state: .awaitingAuth, sameBody: true, acknowledged: true, expected: .resume),
        Case(state: .awaitingAuth, sameBody: true, acknowledged: false, expected: .resume),
        Case(state: .awaitingAuth, sameBody: false, acknowledged: true, expected: .replace),
        Case(state: .awaitingAuth, sameBody: false, acknowledged: false, expected: .replace),

        Case(state: .completed, sameBody: true, acknowledged: true, expected: .create),
        Case(state: .completed, sameBody: true, acknowledged: false, expected: .redeliver),
        Case(state: .completed, sameBody: false, acknowledged: true, expected: .create),
        Case(state: .completed, sameBody: false, acknowledged: false, expected: .replaceAfterDelivery),

        Case(state: .error, sameBody: true, acknowledged: true, expected: .reopen),
        Case(state: .error, sameBody: true, acknowledged: false, expected: .reopen),
        Case(state: .error, sameBody: false, acknowledged: true, expected: .replace),
        Case(state: .error, sameBody: false, acknowledged: false, expected: .replace),

        Case(state: .cancelled, sameBody: true, acknowledged: true, expected: .create),
        Case(state: .cancelled, sameBody: true, acknowledged: false, expected: .newGeneration),
        Case(state: .cancelled, sameBody: false, acknowledged: true, expected: .create),
        Case(state: .cancelled, sameBody: false, acknowledged: false, expected: .newGeneration),
    ]

    static let storedHash = SHA256.hex(Array("POST https://a.example/x {\"a\":1}".utf8))
    static let otherHash = SHA256.hex(Array("POST https://a.example/x {\"a\":2}".utf8))

    @Test(arguments: cases)
    func decides(_ c: Case) {
        let existing = ExistingEntry(state: c.state, bodyHash: Self.storedHash, outcomeAcknowledged: c.acknowledged)
        let decision = SameIdRule.decide(existing: existing, newBodyHash: c.sameBody ? Self.storedHash : Self.otherHash)
        #expect(decision == c.expected)
    }

    @Test func tableCoversEveryCombination() {
        let combos = Set(Self.cases.map { "\($0.state.rawValue)/\($0.sameBody)/\($0.acknowledged)" })
        #expect(combos.count == EntryState.allCases.count * 4)
        #expect(Self.cases.count == combos.count)
    }

    @Test func noEntryCreates() {
        #expect(SameIdRule.decide(existing: nil, newBodyHash: Self.storedHash) == .create)
    }

    @Test(arguments: [
        (EntryState.queued, "queued", false), (.running, "running", false), (.paused, "paused", false),
        (.awaitingAuth, "awaiting-auth", false), (.completed, "completed", true), (.error, "error", true),
        (.cancelled, "cancelled", true),
    ])
    func states(_ state: EntryState, _ raw: String, _ settled: Bool) {
        #expect(state.rawValue == raw)
        #expect(EntryState(rawValue: raw) == state)
        #expect(state.isSettled == settled)
    }
}
