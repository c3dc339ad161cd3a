import OutboxModel

/// The queue's storage, as the runner and every command see it. No SQL and no type of a
/// particular database appears here: SQLite is one implementation, and another store (a
/// server database shared by several runners) implements the same protocol and passes
/// the same conformance tests.
///
/// Fencing: a runner claims entries with a `Lease`; every later change it makes to an
/// entry (attempt, progress, part acceptance, settle, requeue) is applied only while that
/// entry is still the runner's (still `running`, same generation, and, in a store several
/// runners share, the same lease owner). A change to an entry someone else cancelled,
/// replaced or re-claimed in the meantime changes nothing.
package protocol Store: AnyObject {
    // MARK: Enqueue and reads

    /// Enqueues a batch in one transaction, applying the same-id rules to each entry.
    /// `committing` runs inside the transaction, once everything is written, just before the
    /// commit (again if a store runs the transaction's body again).
    func enqueue(_ batch: [NewEntry], now: Int64, committing: () -> Void) throws(OutboxError) -> [EnqueueResult]
    /// Enqueues the batches `next` gives (nil after the last), all in one transaction; a
    /// store may write each batch while `next` prepares the one after it.
    func enqueue(
        batches next: () throws(OutboxError) -> [NewEntry]?, now: Int64, committing: () -> Void
    ) throws(OutboxError) -> [EnqueueResult]
    func entry(id: String) throws(OutboxError) -> Entry?
    func list(_ filter: ListFilter) throws(OutboxError) -> [Entry]
    /// `list --json` rows as JSON text, one call of `write` per chunk, in queue order.
    /// `displayState(state, key)` maps a stored state to the one shown.
    func writeListRows(
        _ filter: ListFilter, displayState: (String, String) -> String,
        _ write: (String) -> Void) throws(OutboxError)
    /// `list` rows in queue order, read without parsing each entry's stored request.
    func forEachListRow(_ filter: ListFilter, _ body: (ListRow) throws(OutboxError) -> Void) throws(OutboxError)
    func parts(entrySeq: Int64) throws(OutboxError) -> [StoredPart]
    /// The last attempts of an entry (at most 20), oldest first.
    func attempts(entryID: String) throws(OutboxError) -> [JSON]
    func outcomes(entryID: String) throws(OutboxError) -> [OutcomeRecord]
    func unacknowledgedOutcomes() throws(OutboxError) -> [OutcomeRecord]
    /// Entries with an outcome that waits because no definition has its key (unhandled-key).
    func unhandledKeyEntryIDs() throws(OutboxError) -> Set<String>
    func counts() throws(OutboxError) -> StoreCounts
    /// Entries not completed or cancelled: `counts().remaining`, read from the indexes of
    /// those states instead of the whole table (a run's summary).
    func remainingCount() throws(OutboxError) -> Int64
    func pendingTotals(dueBy: Int64?) throws(OutboxError) -> PendingTotals
    /// The cumulative counters (attempts, bytes, hook deliveries, durations) since the
    /// store was created.
    func counters() throws(OutboxError) -> [CounterSample]
    /// Problems with the store's invariants (empty when all hold); `note` hears of checks
    /// that could not be made now.
    func audit(note: (String) -> Void) throws(OutboxError) -> [String]
    /// Removes staged files no entry owns (left by a process killed while it staged), when
    /// no enqueue is staging right now; returns what it removed.
    func cleanOrphans() throws(OutboxError) -> [String]
    /// Gives the store's files and folders that others may read back their private modes
    /// (`audit --fix`); says what it changed.
    func tightenModes() -> [String]

    // MARK: Control by other commands

    /// The pause, Wi-Fi and header state commands have set.
    func control() throws(OutboxError) -> QueueControl
    func setQueuePaused(_ paused: Bool) throws(OutboxError)
    func setPaused(keys: [String], paused: Bool) throws(OutboxError)
    func setWifiOnly(_ on: Bool) throws(OutboxError)
    /// Live entries settle cancelled and are forgotten; settled ones are forgotten with
    /// their unacknowledged outcomes. Unknown ids are not errors. Returns the ids cancelled.
    func cancel(ids: [String]?, key: String?, now: Int64) throws(OutboxError) -> [String]
    /// Puts entries back in the queue due now with their backoff reset: queued and
    /// awaiting-auth ones by id or key, and error ones reopened as a same-body enqueue would
    /// (by id, key, or all with `errors`). Running and settled entries are left alone;
    /// unknown ids are not errors. Returns the ids put back.
    func retry(ids: [String]?, key: String?, errors: Bool, now: Int64) throws(OutboxError) -> [String]
    /// `retry` of entries as the caller read them: one that changed since (a runner claimed
    /// it, it settled, it was replaced) is left alone. Returns the ids put back.
    func retry(asRead entries: [Entry], now: Int64) throws(OutboxError) -> [String]
    /// Merges a header patch into every entry, bumps the header generation and resumes
    /// awaiting-auth entries (reason `headersUpdatedReason` until their next attempt).
    /// Returns the new generation.
    func updateHeaders(_ patch: [(String, String)], now: Int64) throws(OutboxError) -> Int64
    /// What every `headers update` so far merged: applied to each entry enqueued after it.
    func headerPatch() throws(OutboxError) -> [(String, String)]
    /// Hosts the runner holds after connection failures (one probe at a time), for `explain`
    /// and `stats`; the runner sets them as they change.
    func heldHosts() throws(OutboxError) -> [String]
    func setHeldHosts(_ hosts: [String]) throws(OutboxError)
    /// The multipart upload an s3 entry started, if any.
    func s3UploadID(entrySeq: Int64) throws(OutboxError) -> String?
    /// Records (or with nil forgets) an s3 entry's multipart upload, committed at once: an
    /// upload is recorded before any of its parts is sent.
    func setS3UploadID(entrySeq: Int64, _ uploadID: String?) throws(OutboxError)
    /// Forgets an aborted multipart upload (when it is still the entry's) and the parts it
    /// accepted, so a retry of the entry starts a new upload.
    func forgetS3Upload(entrySeq: Int64, uploadID: String) throws(OutboxError)
    /// Entries settled `error` whose multipart upload was not aborted yet (the abort failed,
    /// or its runner died before it was answered).
    func erroredEntriesWithS3Uploads() throws(OutboxError) -> [Entry]
    /// Changes whenever another process commits; a runner polls it to notice new work.
    func dataVersion() throws(OutboxError) -> Int64
    /// Changes whenever this process writes, where `dataVersion` does not show it (SQLite:
    /// rows this connection changed; a store whose `dataVersion` counts every write: 0).
    var ownWrites: Int64 { get }
    /// The host whose runners alone may send this entry's staged file body, when that is
    /// not this host (a store shared by hosts without a shared staging folder); nil otherwise.
    func bodyHostElsewhere(entryID: String) throws(OutboxError) -> String?
    /// The staged files of an entry (body, form files) missing from the store's folder, each
    /// as "staged body PATH", as `audit` lists them; none for a body staged on another host.
    func missingStagedFiles(of entry: Entry) throws(OutboxError) -> [String]

    // MARK: The runner

    /// Whether several runners may run on this store at once. Such a store admits every
    /// runner, and a runner commits each claim (`claim`) before it starts any transfer.
    var sharesRunners: Bool { get }
    /// A runner's store reconnects when its server drops the connection, and runs the
    /// statement or transaction that failed again, until `policy` gives up.
    func reconnectWhenDropped(_ policy: ReconnectPolicy)
    /// A runner's session: a transaction of it left idle for `ms` (its process frozen, its
    /// host stalled) is ended by the server, so that the locks it holds do not stop the
    /// other runners for longer than a lease.
    func endIdleTransactions(afterMs ms: Int64) throws(OutboxError)
    /// Where a store that waits for another process's lock says, now and then, that it still waits.
    func reportLockWaits(_ log: @escaping (String) -> Void)
    /// Makes the caller the store's runner, or fails with E_RUNNING naming the holder (a
    /// store that shares runners admits every caller).
    func lockForRunner() throws(OutboxError) -> RunnerLock
    /// Holds the store so that no runner runs while the caller works (a store copy); E_RUNNING
    /// while one does.
    func lockExclusively() throws(OutboxError) -> RunnerLock
    /// Claims queued entries for `lease` in a commit of its own and returns the ones it got,
    /// as they are now in the store: another runner may have taken, rescheduled or replaced
    /// some, and an entry whose scope has a running or an older queued entry is left.
    func claim(_ entries: [Entry], lease: Lease, now: Int64) throws(OutboxError) -> [Entry]
    /// Extends the lease of every entry and hook delivery this runner holds, in one commit;
    /// returns the ids of entries whose claim is gone (requeued or taken by another runner).
    func renewLeases(_ lease: Lease) throws(OutboxError) -> Set<String>
    /// Claims hook deliveries for `lease` and counts them, in one commit; returns the new
    /// counts of the ones it got (another runner may hold a delivery's lease).
    func claimDeliveries(seqs: [Int64], lease: Lease) throws(OutboxError) -> [Int64: Int64]
    /// Puts entries left running by runners that are gone back in the queue, keeping
    /// accepted parts. Returns how many.
    func requeueAbandoned(lease: Lease, now: Int64) throws(OutboxError) -> Int
    /// Makes entries held back for `reasons` (off Wi-Fi, no account, a held host) due now,
    /// without their reason: a new runner judges its own Wi-Fi, account and hosts at once,
    /// and a held host's entries are looked at again when its probe ends.
    func releaseHolds(now: Int64, reasons: [HoldReason]) throws(OutboxError)
    /// Outcomes whose hook failed in an earlier run are due now: a failed delivery is tried
    /// again at the next run, its backoff holds only within a run.
    func releaseDeliveryBackoffs(now: Int64) throws(OutboxError)
    /// Queued entries that may start now, in enqueue order, honouring pauses, holds and
    /// scopes; `excluding` are ids the runner holds or has read already. A drain's `horizon`
    /// leaves out retries and delays due after it: they wait for the next run (an entry made
    /// due at once, as a follow-up with `delay: 0s`, is not delayed). Only entries from seq
    /// `fromSeq` on are read: a runner that knows none before it can be due skips them.
    func dueEntries(now: Int64, limit: Int, excluding: Set<String>, horizon: Int64?, fromSeq: Int64) throws(OutboxError) -> [Entry]
    /// For each of these entries still running, its generation (absent: cancelled,
    /// replaced or settled by someone else).
    func runningGenerations(seqs: [Int64]) throws(OutboxError) -> [Int64: Int64]
    /// The vars of these entries as stored now (a same-body enqueue of a running entry
    /// replaces them), by seq; absent when the row is gone.
    func currentVars(seqs: [Int64]) throws(OutboxError) -> [Int64: JSON]
    /// When something becomes due: an attempt, a hold, or a hook delivery for one of
    /// `deliverableKeys`. Paused and held (`HoldReason`) entries do not count.
    func dueTimes(deliverableKeys: Set<String>) throws(OutboxError) -> DueTimes
    /// The earliest end of a wait (a retry's backoff, a hold, a delay) among queued entries
    /// after `now`; nil when none waits. A runner that found nothing due reads again then.
    func nextWaitEnd(after now: Int64) throws(OutboxError) -> Int64?
    /// Entries parked awaiting-auth whose expiry is `now` or earlier, in queue order.
    func parkedPastExpiry(now: Int64) throws(OutboxError) -> [Entry]
    /// Applies a runner's changes in one transaction (claims, attempts, settles with their
    /// outcomes and follow-ups). `lease` is the runner's: a store shared by several runners
    /// applies a change to an entry only while that runner's claim on it holds. Nil: the
    /// caller is the only runner (the SQLite store's lock guarantees it).
    @discardableResult
    func apply(_ changes: [RunnerChange], by lease: Lease?, now: Int64) throws(OutboxError) -> AppliedChanges
    /// Marks outcomes whose key is not in `keys` as unhandled-key (never dropped).
    func markUnhandled(keys: Set<String>) throws(OutboxError)
    /// Maintenance after a run (folding SQLite's write-ahead log back, for example).
    func checkpoint()
    /// Bytes free where the store writes (nil for a store on a server, whose disk is its own):
    /// a runner sends nothing it could not record.
    func freeBytes() -> Int64?

    // MARK: Hook delivery

    /// The oldest unacknowledged outcome of each id, due now, for `keys`, at most `limit`. A
    /// drain's `horizon` leaves out deliveries due again after it (a hook that keeps failing).
    func deliverableOutcomes(
        now: Int64, keys: Set<String>, excludingIDs: Set<String>, limit: Int?, horizon: Int64?
    ) throws(OutboxError) -> [OutcomeRecord]
    /// Counts a delivery before its hook starts; returns the new count, nil for an outcome gone (no hook starts).
    func beginDelivery(seq: Int64) throws(OutboxError) -> Int64?
    /// Counts a delivery of each outcome before their hooks start; returns the new counts by seq.
    func beginDeliveries(seqs: [Int64]) throws(OutboxError) -> [Int64: Int64]
    /// Records a running hook's process group, so a later runner can stop it.
    func recordHookProcess(seq: Int64, pgid: Int32, startTime: UInt64) throws(OutboxError)
    /// Records the process groups of several running hooks at once.
    func recordHookProcesses(_ processes: [HookProcess]) throws(OutboxError)
    func recordedHookProcesses() throws(OutboxError) -> [(pgid: Int32, startTime: UInt64)]
    /// Acknowledges an outcome, applies the hook's enqueues, and forgets a completed or
    /// cancelled entry of that generation, all in one transaction.
    func acknowledge(seq: Int64, followUps: [NewEntry], now: Int64) throws(OutboxError)
    /// Acknowledges several outcomes, each as `acknowledge(seq:followUps:now:)` does. Returns
    /// those refused, by seq, with why: enqueue lines naming an entry being sent now with
    /// another body (the same-id rules refuse them), so nothing of that hook is applied.
    /// An outcome forgotten meanwhile (its entry cancelled) applies none of its lines either.
    @discardableResult
    func acknowledge(_ batch: [Acknowledgement], now: Int64) throws(OutboxError) -> [Int64: String]
    /// Acknowledges `batch` and counts a delivery of each of `begin`, returning the new
    /// counts by seq (and the refused acknowledgements): the hooks that ended and those
    /// about to start share one commit.
    func acknowledge(
        _ batch: [Acknowledgement], thenBegin begin: [Int64], now: Int64
    ) throws(OutboxError) -> (counts: [Int64: Int64], refused: [Int64: String])
    /// A failed delivery; `hookStarted` false takes back the delivery counted before its
    /// hook could not start (`deliveries` counts those that reached a hook). `hookFailed`
    /// false: no hook failed, the delivery waits for something else (its `then` chain), and
    /// `outbox_hook_failures_total` does not count it.
    func deliveryFailed(seq: Int64, nextDeliveryAt: Int64, reason: String, hookStarted: Bool, hookFailed: Bool) throws(OutboxError)
}

extension Store {
    /// Every batch first, then one `enqueue`: for a store whose transaction may run its body
    /// again (after a reconnect), which a stream of batches cannot give twice.
    package func enqueue(
        batches next: () throws(OutboxError) -> [NewEntry]?, now: Int64, committing: () -> Void
    ) throws(OutboxError) -> [EnqueueResult] {
        var all: [NewEntry] = []
        while let batch = try next() { all += batch }
        return try enqueue(all, now: now, committing: committing)
    }

    package func enqueue(_ batch: [NewEntry], now: Int64) throws(OutboxError) -> [EnqueueResult] {
        try enqueue(batch, now: now, committing: {})
    }

    package func enqueue(batches next: () throws(OutboxError) -> [NewEntry]?, now: Int64) throws(OutboxError) -> [EnqueueResult] {
        try enqueue(batches: next, now: now, committing: {})
    }

    package func audit() throws(OutboxError) -> [String] { try audit(note: { _ in }) }

    package func deliveryFailed(seq: Int64, nextDeliveryAt: Int64, reason: String) throws(OutboxError) {
        try deliveryFailed(seq: seq, nextDeliveryAt: nextDeliveryAt, reason: reason, hookStarted: true, hookFailed: true)
    }
}

/// What a runner holds while it runs; released by `release()` or when it is freed.
package protocol RunnerLock: AnyObject {
    func release()
    /// Checks the lock is still this runner's, taking it again if it can; true when it had to.
    /// Throws E_RUNNING when another runner has the store now.
    func keep() throws(OutboxError) -> Bool
}

extension Store {
    /// Due entries outside a drain.
    package func dueEntries(now: Int64, limit: Int, excluding: Set<String>) throws(OutboxError) -> [Entry] {
        try dueEntries(now: now, limit: limit, excluding: excluding, horizon: nil, fromSeq: 0)
    }

    /// Deliverable outcomes outside a drain.
    package func deliverableOutcomes(
        now: Int64, keys: Set<String>, excludingIDs: Set<String>, limit: Int?
    ) throws(OutboxError) -> [OutcomeRecord] {
        try deliverableOutcomes(now: now, keys: keys, excludingIDs: excludingIDs, limit: limit, horizon: nil)
    }
}

extension RunnerLock {
    package func keep() throws(OutboxError) -> Bool { false }
}

/// Who holds claimed entries, and until when. A store shared by several runners writes
/// both with each claim and ignores changes from a runner whose lease is gone.
package struct Lease: Sendable, Equatable {
    /// Unique per runner process.
    package var owner: String
    /// How long a claim lasts without renewal.
    package var durationMs: Int64

    package init(owner: String, durationMs: Int64 = 30_000) {
        self.owner = owner
        self.durationMs = durationMs
    }
}

/// State that commands set and runners obey.
package struct QueueControl: Sendable, Equatable {
    package var queuePaused = false
    package var pausedKeys: Set<String> = []
    package var wifiOnly = false
    /// Bumped by every `headers update`.
    package var headerGeneration: Int64 = 0

    package init(queuePaused: Bool = false, pausedKeys: Set<String> = [], wifiOnly: Bool = false, headerGeneration: Int64 = 0) {
        self.queuePaused = queuePaused
        self.pausedKeys = pausedKeys
        self.wifiOnly = wifiOnly
        self.headerGeneration = headerGeneration
    }

    /// Whether a queued entry of `key` is held by a pause.
    package func isPaused(key: String) -> Bool { queuePaused || pausedKeys.contains(key) }
}

/// Entries by stored state, and outcomes not yet acknowledged.
package struct StoreCounts: Sendable, Equatable {
    package var states: [EntryState: Int64]
    package var pendingOutcomes: Int64
    /// When the oldest queued entry was enqueued (epoch ms), nil when none is queued.
    package var oldestQueuedAt: Int64?
    /// The same counts, key by key (states with no entry left out).
    package var byKey: [String: [EntryState: Int64]]

    package init(
        states: [EntryState: Int64], pendingOutcomes: Int64, oldestQueuedAt: Int64? = nil, byKey: [String: [EntryState: Int64]] = [:]
    ) {
        self.states = states
        self.pendingOutcomes = pendingOutcomes
        self.oldestQueuedAt = oldestQueuedAt
        self.byKey = byKey
    }

    /// Entries not completed or cancelled: what a run leaves behind.
    package var remaining: Int64 {
        states.filter { $0.key != .completed && $0.key != .cancelled }.values.reduce(0, +)
    }
}

/// What is left to send, for the runner's live display.
package struct PendingTotals: Sendable, Equatable {
    /// Entries not yet settled (queued, running, awaiting-auth).
    package var entries: Int
    /// Their bytes.
    package var bytes: Int64
    /// Bytes of their parts already accepted.
    package var acceptedBytes: Int64

    package init(entries: Int, bytes: Int64, acceptedBytes: Int64) {
        self.entries = entries
        self.bytes = bytes
        self.acceptedBytes = acceptedBytes
    }
}

/// A hook's exit 0 for an outcome, with the entries its enqueue lines asked for.
package struct Acknowledgement: Sendable {
    package var seq: Int64
    /// The outcome's key: a hook that exited 0 after its outcome was forgotten (its entry
    /// cancelled meanwhile, maybe by the hook itself) still counts as a delivery of that key.
    package var key: String?
    package var followUps: [NewEntry]

    package init(seq: Int64, key: String? = nil, followUps: [NewEntry]) {
        self.seq = seq
        self.key = key
        self.followUps = followUps
    }
}

/// A hook process started for an outcome: its process group and its start time.
package struct HookProcess: Sendable {
    package var seq: Int64
    package var pgid: Int32
    package var startTime: UInt64

    package init(seq: Int64, pgid: Int32, startTime: UInt64) {
        self.seq = seq
        self.pgid = pgid
        self.startTime = startTime
    }
}

extension Store {
    /// One write per hook; a store that can group them does it in one transaction.
    package func recordHookProcesses(_ processes: [HookProcess]) throws(OutboxError) {
        for p in processes { try recordHookProcess(seq: p.seq, pgid: p.pgid, startTime: p.startTime) }
    }

    /// Two commits; a store that can group them does it in one transaction.
    package func acknowledge(
        _ batch: [Acknowledgement], thenBegin begin: [Int64], now: Int64
    ) throws(OutboxError) -> (counts: [Int64: Int64], refused: [Int64: String]) {
        let refused = try acknowledge(batch, now: now)
        return (try beginDeliveries(seqs: begin), refused)
    }

    /// One commit per outcome; a store that can group them does it in one transaction.
    package func beginDeliveries(seqs: [Int64]) throws(OutboxError) -> [Int64: Int64] {
        var counts: [Int64: Int64] = [:]
        for seq in seqs { counts[seq] = try beginDelivery(seq: seq) }
        return counts
    }

    /// The only runner of a store claims with the turn's other changes (`markRunning`).
    package var sharesRunners: Bool { false }

    /// An embedded store has no connection to lose.
    package func reconnectWhenDropped(_ policy: ReconnectPolicy) {}

    /// Its only runner waits for no other runner's locks.
    package func endIdleTransactions(afterMs ms: Int64) throws(OutboxError) {}

    /// Claims at once; every entry is the only runner's to take.
    package func claim(_ entries: [Entry], lease: Lease, now: Int64) throws(OutboxError) -> [Entry] {
        try apply([.markRunning(entrySeqs: entries.map(\.seq), lease: lease)], by: nil, now: now)
        return entries
    }

    /// A store on one host stages every body where its runner is.
    package func bodyHostElsewhere(entryID: String) throws(OutboxError) -> String? { nil }

    /// Nothing expires under the only runner.
    package func renewLeases(_ lease: Lease) throws(OutboxError) -> Set<String> { [] }

    /// Every delivery is the only runner's.
    package func claimDeliveries(seqs: [Int64], lease: Lease) throws(OutboxError) -> [Int64: Int64] {
        try beginDeliveries(seqs: seqs)
    }

    /// Applies changes as the only runner of the store (no lease to check).
    @discardableResult
    package func apply(_ changes: [RunnerChange], now: Int64) throws(OutboxError) -> AppliedChanges {
        try apply(changes, by: nil, now: now)
    }
}

/// The reason of an entry that a header update took out of awaiting-auth, until its next attempt.
package let headersUpdatedReason = "headers updated"
