import OutboxModel

/// The frame both stores apply a runner's changes in: follow-ups staged before the
/// transaction and enqueued only with a settle that applied, the crash-test fault points
/// around the commit, and staged files rolled back when the transaction fails.
extension SQLStore {
    /// Applies `changes` in one transaction that `transaction` runs (told whether follow-ups
    /// are enqueued in it); a settle goes through `settle`, every other change through
    /// `other` (the entries behind a scope's failed one through `settleUnclaimed`), each
    /// returning the files to remove after the commit. The body builds its
    /// lists afresh each time it runs: a transaction cut before its commit runs again whole.
    func applyInFrame(
        _ changes: [RunnerChange], now: Int64,
        transaction: (_ enqueues: Bool, () throws(OutboxError) -> Void) throws(OutboxError) -> Void,
        // Escaping only to be called inside `transaction`'s body.
        settle: @escaping (Settlement) throws(OutboxError) -> (files: [String], applied: Bool),
        settleUnclaimed: @escaping (Settlement) throws(OutboxError) -> [String],
        other: @escaping (RunnerChange) throws(OutboxError) -> [String]
    ) throws(OutboxError) -> AppliedChanges {
        func otherChange(_ change: RunnerChange, into result: inout AppliedChanges) throws(OutboxError) -> [String] {
            guard case let .cancelScope(scope, afterSeq, payloadFor) = change else { return try other(change) }
            // The entries behind the failed one in its scope settle cancelled, each with its outcome.
            let behind = try db.query(
                """
                SELECT \(Self.entryColumns) FROM entries WHERE scope = ? AND seq > ? AND state IN ('queued', 'awaiting-auth')
                ORDER BY seq
                """, [.text(scope), .int(afterSeq)], entryFromRow)
            var files: [String] = []
            for e in behind {
                let (payload, hookExists) = payloadFor(e)
                files += try settleUnclaimed(
                    Settlement(
                        entryID: e.id, generation: e.generation, state: .cancelled, reason: "scope",
                        outcome: .error, payload: payload, hookExists: hookExists))
            }
            result.scopeCancelled += behind
            return files
        }
        let followUps = changes.flatMap { change -> [NewEntry] in
            if case let .settle(s) = change { return s.followUps }
            return []
        }
        let lock = stagingLock(exclusive: false)
        defer { withExtendedLifetime(lock) {} }
        let staged = try stageBatch(followUps, repeatsAllowed: true)
        let settles = changes.contains { if case .settle = $0 { true } else { false } }
        if !followUps.isEmpty { Fault.point("followup.staged") }
        if settles { Fault.point("settle.before-commit") }
        if changes.contains(where: { if case .partAccepted = $0 { true } else { false } }) { Fault.point("part.accepted") }
        var remove: [String] = []
        var keptStaged = StagedBatch()
        var dropped: [StagedBody] = []
        var result = AppliedChanges()
        var anyKept = false
        do throws(OutboxError) {
            try transaction(!followUps.isEmpty) { () throws(OutboxError) in
                (remove, keptStaged, dropped, result) = ([], StagedBatch(), [], AppliedChanges())
                // Follow-ups are enqueued only with a settle that applied: a settle fenced out
                // (its entry was cancelled, replaced or taken meanwhile) leaves no half of its chain.
                var kept: [NewEntry] = []
                var offset = 0
                for change in changes {
                    guard case let .settle(settlement) = change else {
                        remove += try otherChange(change, into: &result)
                        continue
                    }
                    let (files, applied) = try settle(settlement)
                    remove += files
                    let range = offset..<(offset + settlement.followUps.count)
                    offset = range.upperBound
                    if applied {
                        kept += followUps[range]
                        keptStaged.bodies += staged.bodies[range]
                        keptStaged.internals += staged.internals[range]
                    } else {
                        dropped += staged.bodies[range]
                        result.fencedOut.insert(settlement.entryID)
                    }
                }
                // Two settles' `then` may name the same id: the last of an id is the one enqueued.
                for position in kept.supersededPositions.sorted(by: >) {
                    kept.remove(at: position)
                    dropped.append(keptStaged.bodies.remove(at: position))
                    keptStaged.internals.remove(at: position)
                }
                if !kept.isEmpty {
                    _ = try applyBatch(kept, staged: keptStaged, now: now)
                }
                anyKept = !kept.isEmpty
                try journalReturns()
            }
        } catch {
            for s in staged.bodies { staging.rollback(s) }
            moves.end(staged.ticket)
            dropReturns()
            throw error
        }
        if anyKept { Fault.point("followup.committed") }
        if settles { Fault.point("settle.committed") }
        if changes.contains(where: { if case .cancelScope = $0 { true } else { false } }) { Fault.point("scope.cancelled") }
        if changes.contains(where: { if case .partAccepted = $0 { true } else { false } }) { Fault.point("part.recorded") }
        staging.afterCommit(keptStaged.bodies)
        for s in dropped { staging.rollback(s) }
        moves.end(staged.ticket)
        finishForget(remove)
        return result
    }
}
