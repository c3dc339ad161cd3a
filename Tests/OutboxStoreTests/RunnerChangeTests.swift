import OutboxModel
import OutboxStore
import Testing

/// A batch drops the attempt records of exactly the entries a settle in it forgets.
struct RunnerChangeTests {
    static func attempt(_ id: String, generation: Int64 = 1) -> RunnerChange {
        .attempt(entryID: id, generation: generation, at: 1, payload: .object([]), requestID: "r-\(id)")
    }

    static func settle(_ id: String, generation: Int64 = 1, state: EntryState, hook: Bool) -> RunnerChange {
        .settle(
            Settlement(
                entryID: id, generation: generation, state: state, reason: nil, outcome: state == .completed ? .completed : .error,
                payload: .object([]), hookExists: hook))
    }

    static func attemptIDs(_ changes: [RunnerChange]) -> [String] {
        changes.compactMap { if case let .attempt(id, _, _, _, _) = $0 { id } else { nil } }
    }

    @Test func anAttemptOfAnEntryForgottenInTheSameBatchIsNotWritten() {
        let batch = [Self.attempt("a"), Self.settle("a", state: .completed, hook: false)]
        let spared = batch.sparingForgottenAttempts()
        #expect(Self.attemptIDs(spared).isEmpty)
        #expect(spared.count == 1)
    }

    @Test(arguments: [
        ("a hook will read the outcome", settle("a", state: .completed, hook: true)),
        ("an error entry stays to be looked at", settle("a", state: .error, hook: false)),
        ("another generation settles", settle("a", generation: 2, state: .completed, hook: false)),
        ("another entry settles", settle("b", state: .completed, hook: false)),
    ])
    func anAttemptIsKeptWhen(_ why: String, _ settle: RunnerChange) {
        let spared = [Self.attempt("a"), settle].sparingForgottenAttempts()
        #expect(Self.attemptIDs(spared) == ["a"], "\(why)")
        #expect(spared.count == 2)
    }

    @Test func aCancelledEntryWithoutAHookLosesItsAttemptToo() {
        let batch = [Self.attempt("a"), Self.attempt("b"), Self.settle("a", state: .cancelled, hook: false)]
        #expect(Self.attemptIDs(batch.sparingForgottenAttempts()) == ["b"])
    }
}
