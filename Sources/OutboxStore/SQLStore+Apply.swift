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
        // Held only while follow-ups stage bodies (audit leaves those files alone meanwhile).
        let lock = followUps.isEmpty ? nil : stagingLock(exclusive: false)
        defer { withExtendedLifetime(lock) {} }
        let staged = try stageBatch(followUps, repeatsAllowed: true)
        let settles = changes.contains { if case .settle = $0 { true } else { false } }
        if !followUps.isEmpty { Fault.point("followup.staged") }
        if settles { Fault.point("settle.before-commit") }
        if changes.contains(where: { if case .partAccepted = $0 { true } else { false } }) { Fault.point("part.accepted") }
        var remove: [String] = []
        var selection = FollowUpSelection(all: followUps, staged: staged)
        var result = AppliedChanges()
        do throws(OutboxError) {
            try transaction(!followUps.isEmpty) { () throws(OutboxError) in
                (remove, selection, result) = ([], FollowUpSelection(all: followUps, staged: staged), AppliedChanges())
                // Follow-ups are enqueued only with a settle that applied: a settle fenced out
                // (its entry was cancelled, replaced or taken meanwhile) leaves no half of its chain.
                var offset = 0
                for change in changes {
                    guard case var .settle(settlement) = change else {
                        remove += try otherChange(change, into: &result)
                        continue
                    }
                    let range = offset..<(offset + settlement.followUps.count)
                    offset = range.upperBound
                    // A follow-up naming an entry being sent now with another body: not half a
                    // chain, and not lost either. The outcome waits for a delivery (its entry
                    // kept), which builds the chain again and is retried until it applies.
                    let conflict = try runningConflict(settlement.followUps.filter { $0.id != settlement.entryID })
                    if let conflict {
                        Settlement.markThenForDelivery(
                            &settlement.payload,
                            because: "\(conflict.message); the then follow-ups are built again when this outcome is delivered")
                        settlement.hookExists = true
                    }
                    let (files, applied) = try settle(settlement)
                    // Tests hold a runner here, inside a transaction that enqueues (a writer's locks held).
                    if !settlement.followUps.isEmpty { Fault.hold("settle.in-transaction") }
                    remove += files
                    if !applied {
                        selection.drop(range)
                        result.fencedOut.insert(settlement.entryID)
                    } else if let conflict {
                        selection.drop(range)
                        result.followUpConflicts[settlement.entryID] = conflict.message
                    } else {
                        selection.keep(range)
                    }
                }
                try selection.apply { (kept, keptStaged) throws(OutboxError) in _ = try applyBatch(kept, staged: keptStaged, now: now) }
                try journalReturns()
            }
        } catch {
            for s in staged.bodies { staging.rollback(s) }
            moves.end(staged.ticket)
            dropReturns()
            throw error
        }
        if !selection.kept.isEmpty { Fault.point("followup.committed") }
        if settles { Fault.point("settle.committed") }
        if changes.contains(where: { if case .cancelScope = $0 { true } else { false } }) { Fault.point("scope.cancelled") }
        if changes.contains(where: { if case .partAccepted = $0 { true } else { false } }) { Fault.point("part.recorded") }
        staging.afterCommit(selection.keptStaged.bodies)
        for s in selection.dropped { staging.rollback(s) }
        moves.end(staged.ticket)
        finishForget(remove)
        return result
    }

    /// The acknowledgements of a batch, inside the caller's transaction: one whose enqueue
    /// lines the same-id rules refuse is left unacknowledged (in `refused`, with why); the
    /// lines of one not acknowledged (its outcome forgotten, or another runner's) are dropped.
    /// Returns the files to remove after the commit.
    func acknowledgeEach(
        _ batch: [Acknowledgement], selection: inout FollowUpSelection, refused: inout [Int64: String],
        _ acknowledgeOne: (Acknowledgement) throws(OutboxError) -> ([String], Bool)
    ) throws(OutboxError) -> [String] {
        var remove: [String] = []
        var offset = 0
        for acknowledgement in batch {
            let range = offset..<(offset + acknowledgement.followUps.count)
            offset = range.upperBound
            if let conflict = try runningConflict(acknowledgement.followUps) {
                refused[acknowledgement.seq] = conflict.message
                selection.drop(range)
                continue
            }
            let (files, acknowledged) = try acknowledgeOne(acknowledgement)
            remove += files
            if acknowledged { selection.keep(range) } else { selection.drop(range) }
        }
        return remove
    }

    /// The first follow-up that names an entry being sent now with another body: the
    /// same-id rules refuse it (an `enqueue` would exit 75), so its chain cannot be applied.
    func runningConflict(_ followUps: [NewEntry]) throws(OutboxError) -> (index: Int, key: String, message: String)? {
        for (index, followUp) in followUps.enumerated() where !followUp.idWasMinted {
            guard let e = try entry(id: followUp.id), e.state == .running,
                try decide(e, followUp.prepared.bodyHash) == .rejectRunning
            else { continue }
            return (index, followUp.key, "entry \(followUp.id) is being sent now and the new body differs")
        }
        return nil
    }
}

/// Which of a batch's staged follow-ups are enqueued: those of the settles or
/// acknowledgements that applied, and of one id only the last (as if applied one after
/// another); the rest are dropped and their staged bodies rolled back after the commit.
struct FollowUpSelection {
    let all: [NewEntry]
    let staged: StagedBatch
    private(set) var kept: [NewEntry] = []
    private(set) var keptStaged = StagedBatch()
    private(set) var dropped: [StagedBody] = []

    init(all: [NewEntry], staged: StagedBatch) {
        self.all = all
        self.staged = staged
    }

    mutating func keep(_ range: Range<Int>) {
        kept += all[range]
        keptStaged.bodies += staged.bodies[range]
        keptStaged.internals += staged.internals[range]
    }

    mutating func drop(_ range: Range<Int>) { dropped += staged.bodies[range] }

    /// Leaves out follow-ups a later one of the same id replaces, then writes the rest.
    mutating func apply(_ write: ([NewEntry], StagedBatch) throws(OutboxError) -> Void) throws(OutboxError) {
        for position in kept.supersededPositions.sorted(by: >) {
            kept.remove(at: position)
            dropped.append(keptStaged.bodies.remove(at: position))
            keptStaged.internals.remove(at: position)
        }
        if !kept.isEmpty { try write(kept, keptStaged) }
    }
}
