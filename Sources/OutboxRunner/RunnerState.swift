import OutboxHTTP
import OutboxModel
import OutboxStore
import OutboxProcess

/// What the curl thread and hook threads post to the control thread.
enum RunnerEvent: Sendable {
    case transferDone(token: UInt64, result: HTTPResult)
    case progress(token: UInt64, sent: Int64)
    case hookDone(seq: Int64, result: Result<ProcessResult, ProcessSpawnError>)
    case hookSlow(seq: Int64, pid: Int32)
    /// A plugin beside the control thread answered for an entry; `abandoned` when the run's
    /// stop at once killed it.
    case pluginDone(entryID: String, token: UInt64, answer: PluginAnswer, abandoned: Bool)
    /// The answer of the Wi-Fi check plugin, run beside the control thread.
    case wifiChecked(Result<Bool, OutboxError>, abandoned: Bool)
    /// The answer of `auth_refresh_command`, run beside the control thread.
    case authRefreshed(Result<JSON, OutboxError>, abandoned: Bool)
    /// A chain that waits for its delivery, built beside the control thread for the outcome of
    /// `seq` (of its entry's `generation`).
    case chainBuilt(seq: Int64, generation: Int64, built: Runner.BuiltFollowUps, abandoned: Bool)
    /// The entries a hook's enqueue lines ask for, built beside the control thread.
    case hookLinesBuilt(seq: Int64, result: Result<[NewEntry], OutboxError>, abandoned: Bool)
}

/// What a plugin that runs beside the control thread gave for an entry's settle.
enum PluginAnswer: Sendable {
    /// The response parser's answer.
    case parsed(Result<JSON, OutboxError>)
    /// The outcome's `then` follow-ups, built with their plugins (request_command, headers_command).
    case followUps(Runner.BuiltFollowUps)
}

/// An entry whose settle waits for a plugin that runs beside the control thread: its
/// response parser, or the plugins of its `then` follow-ups. It keeps its slot meanwhile.
struct PluginWait {
    enum Step {
        case parse(result: HTTPResult, parts: JSON?, requestID: String, s3Parts: [StoredPart]?, skipped: Bool)
        case followUps(payload: JSON, outcome: Outcome, state: EntryState, reason: String?, cancelsScope: Bool)
    }

    var entry: Entry
    var step: Step
    var token: UInt64 = 0
    /// Set when the entry was cancelled or lost meanwhile: its plugin is killed.
    let cancelled = Locked(false)
}

/// One HTTP attempt in flight: a whole entry, or one part of a chunked upload.
struct Flight {
    var entryID: String
    var partIndex: Int?
    var transferID: UInt64 = 0
    var requestID: String
    var host: String
    var url: String
    var method: String
    var attempt: Int64
    var sent: Int64 = 0
    /// Waiting on the curl thread for a slot (see `Scheduler`), since when (monotonic ms).
    var standby = false
    var standbySince: Int64 = 0
    /// A step of an s3 multipart upload (not a part).
    var s3Step: S3Step?
    /// The HEAD of a `skip_existing` object, before its upload.
    var s3ExistingHead = false
    /// The headers this request carried (part headers and S3 signatures included) and the
    /// entry's secret names: a response that echoes a secret value shows `[redacted]` in
    /// events and `show`. The values are found only for a response with a body.
    var sentHeaders: [(name: String, value: String)] = []
    var secretHeaders: Set<String> = []
    /// The URL came from `env`: its path and query are a secret too.
    var secretURL = false
    /// The `headers update` generation its headers were built with (a 401 to older ones is sent again).
    var headerGeneration: Int64 = 0
    /// The access key id a signed request was signed with.
    var signingKeyID: String?
    /// The upload an `.abort` step ends, and its entry's row.
    var abortedUpload: (entrySeq: Int64, uploadID: String)?
}

/// A chunked entry while it runs: its parts and which are in flight.
struct PartJob {
    var parts: [StoredPart]
    /// The entry as claimed: parts still in flight when it settles report against it.
    var entry: Entry
    var inFlight: Set<Int> = []
    var sentByPart: [Int: Int64] = [:]
    /// Set when the entry stopped (settled, parked, rescheduled): no part starts again, and
    /// the job is dropped once the parts in flight have returned.
    var failed = false
    /// An s3 entry's multipart upload, once created; and its step in flight.
    var s3UploadID: String?
    var s3Step: S3Step?
    /// The HEAD of a `skip_existing` object found it missing or different: upload it.
    var s3Checked = false
    /// The entry settled error with parts in flight: its upload is aborted once they have
    /// returned, since S3 may still store a part that arrives after the abort.
    var abortWhenIdle = false

    /// Bytes of the parts accepted so far.
    var acceptedBytes: Int64 { parts.reduce(Int64(0)) { $0 + ($1.accepted ? $1.range.count : 0) } }

    /// Accepted bytes plus what the parts in flight have sent.
    var bytesSent: Int64 { acceptedBytes + sentByPart.filter { inFlight.contains($0.key) }.values.reduce(0, +) }
}

/// A standby transfer: its flight's token, and its entry and host, which every claim turn
/// looks at (read from the flight, each was a copy of the whole flight).
struct StandbyTransfer {
    var token: UInt64
    var entryID: String
    var host: String
}

/// The entries this runner holds and their transfers.
struct Flights {
    /// Transfers in flight (and standby), by the runner's token.
    var byToken: [UInt64: Flight] = [:]
    /// Entries claimed and not yet settled or given back.
    var running: [String: Entry] = [:]
    var partJobs: [String: PartJob] = [:]
    /// Standby transfers (waiting on the curl thread for a slot), by transfer id; the flight
    /// of each is in `byToken` for as long as it is here.
    var standby: [UInt64: StandbyTransfer] = [:]
    /// Transfers per host, started and standby, as the scheduler counts them.
    var slots = SlotState()
    /// Entries whose standby request was aborted because of another process: true when the
    /// entry goes back to the queue (its key or the queue was paused), false when it is
    /// dropped (cancelled or replaced).
    var withdrawn: [String: Bool] = [:]
    /// Failures in a row of an entry's S3 Create or Complete in this run: their backoff grows
    /// with these, not with the entry's attempts (every part sent counts one).
    var s3StepFailures: [String: Int] = [:]
    /// Entries whose settle waits for a plugin beside the control thread: each keeps its slot.
    var pluginWaits: [String: PluginWait] = [:]
    /// The tokens of plugins killed because their entry was cancelled or lost, until their
    /// thread reports them gone.
    var pluginsStopping: Set<UInt64> = []
    /// Whether a plugin beside the control thread runs, or is being killed, for an entry.
    var pluginsBusy: Bool { !pluginWaits.isEmpty || !pluginsStopping.isEmpty }
    var nextToken: UInt64 = 1

    /// The slots as they stand: every held entry not waiting as standby holds one.
    var currentSlots: SlotState {
        var current = slots
        current.entriesInFlight = running.count - standby.count
        current.standby = standby.count
        return current
    }

    /// Scopes with an entry held here: the next entry of such a scope waits.
    var busyScopes: Set<String> { Set(running.values.compactMap(\.scope)) }
}

/// Due entries read ahead of their claim, in queue order: one query feeds many claims.
struct ReadAhead {
    var ready: ArraySlice<Entry> = []
    /// The last read found fewer due entries than asked: no new read until the store
    /// changes or the first wait among queued entries ends (a read walks every queued entry
    /// when few are due, so reading every turn kept a waiting queue's runner busy).
    var exhausted = false
    /// Set by that read: the end of the first wait (wall ms), and the store's `ownWrites`.
    var waitEnd: Int64?
    var ownWritesAtRead: Int64 = 0
    var readAt: Int64 = 0
    /// The first seq the last full read returned, the first wait end after it, and the
    /// store's `ownWrites` then: every queued entry before it was left out then, and none of
    /// them can be due until a wait ends or the store changes otherwise than by this runner's
    /// claims and final settles. The next read starts there, so a backlog of waiting entries
    /// ahead of the due ones is not walked by every read. Seq 0: read from the start.
    private(set) var floor: (seq: Int64, waitEnd: Int64?, ownWrites: Int64) = (0, nil, 0)
    /// A drain's due times, read when nothing is in flight, kept until the store changes.
    private var dueTimes: (times: DueTimes, ownWrites: Int64, readAt: Int64)?

    /// Longest time between two reads of an exhausted queue: a bound on how late a change
    /// that no code path reported is seen.
    static let backstopMs: Int64 = 10_000

    /// What was read about due entries may be out of date: the store changed.
    mutating func storeChanged() {
        exhausted = false
        dueTimes = nil
        dropFloor()
    }

    /// The next read starts from the queue's head again.
    mutating func dropFloor() { floor = (0, nil, 0) }

    /// This runner committed `ownWrites.before` → `.after`; `keepingFloor`: only claims and
    /// settles that can make no entry before the floor due. Any other write of its own since
    /// the floor was set (an acknowledgement, a released hold) drops the floor.
    mutating func committed(keepingFloor: Bool, ownWrites: (before: Int64, after: Int64)) {
        let floor = floor
        storeChanged()
        if keepingFloor, floor.seq > 0, floor.ownWrites == ownWrites.before {
            self.floor = (floor.seq, floor.waitEnd, ownWrites.after)
        }
    }

    /// Where the next read starts (see `floor`): from the start once a wait ended or this
    /// process wrote anything the floor does not allow.
    mutating func startSeq(now: Int64, ownWrites: Int64) -> Int64 {
        if now >= floor.waitEnd ?? .max || ownWrites != floor.ownWrites { dropFloor() }
        return floor.seq
    }

    mutating func setFloor(_ seq: Int64, waitEnd: Int64?, ownWrites: Int64) { floor = (seq, waitEnd, ownWrites) }

    /// The due times `read` gives, read again only once the store changed: each read looks
    /// at every queued entry, and a drain waiting for a retry asks every turn.
    mutating func drainDueTimes(
        mono: Int64, ownWrites: Int64, read: () throws(OutboxError) -> DueTimes
    ) throws(OutboxError) -> DueTimes {
        if let dueTimes, dueTimes.ownWrites == ownWrites, mono - dueTimes.readAt < Self.backstopMs { return dueTimes.times }
        let times = try read()
        dueTimes = (times, ownWrites, mono)
        return times
    }

    /// Drops the entries read ahead: a same-id enqueue may have replaced one of them.
    mutating func discard() {
        ready = []
        storeChanged()
    }

    /// Whether a read now may find entries the last one did not: always, unless that read
    /// was exhausted; then at most every 10 ms, once a wait has ended or this process wrote.
    func mayFindMore(now: Int64, mono: Int64, ownWrites: Int64) -> Bool {
        guard exhausted else { return true }
        guard mono - readAt >= 10 else { return false }
        return now >= waitEnd ?? .max || ownWrites != ownWritesAtRead || mono - readAt >= Self.backstopMs
    }

    /// Removes from the front the `taken` entries looked at, except those `held` (ascending
    /// positions), which keep their place and order. Held entries are moved to the back of
    /// that window by swaps, and the window's front is dropped: no entry is copied.
    mutating func dropLeavers(taken: Int, held: [Int]) {
        guard held.count < taken else { return }
        var slot = ready.startIndex + taken
        for position in held.reversed() {
            slot -= 1
            if position != slot { ready.swapAt(position, slot) }
        }
        ready.removeFirst(taken - held.count)
    }
}

/// Hook deliveries in progress.
struct DeliveryState {
    /// Outcome seq → entry id of the hooks running.
    var hooksRunning: [Int64: String] = [:]
    /// Outcome seq → the command of a hook started and its field (to say why it could not run),
    /// and the outcome's key (to count its delivery should the outcome be forgotten meanwhile).
    var commands: [Int64: (field: String, hook: CommandSpec, key: String)] = [:]
    /// Hooks in a row the system could not start (no fds, memory or processes): their
    /// redeliveries back off, and the log says so once for each doubling, not every time.
    var unstartedInARow = 0
    /// The process groups of the hooks whose processes have not ended yet, by outcome seq.
    var groups: [Int64: (pgid: Int32, startTime: UInt64)] = [:]
    /// Groups of earlier runners' hooks this runner stopped (a killed leader may linger as a
    /// zombie until it is reaped, and is not stopped, nor reported, twice).
    var stoppedEarlierGroups: Set<String> = []  // "pgid:start time": a number alone may be reused
    /// Outcomes this runner counted a delivery of, until acknowledged: any other one counted
    /// before may have a hook of a dead runner running that no store row names.
    var countedHere: Set<Int64> = []
    /// `then` follow-ups built at delivery (their outcome was journaled before a definition of
    /// its key was loaded), applied with the acknowledgement of the hook started for it.
    var thenAtDelivery: [Int64: [NewEntry]] = [:]
    /// Outcomes whose `then` follow-ups could not be built yet, by seq: the tries so far.
    var thenTries: [Int64: Int] = [:]
    /// Chains that wait for their delivery and need a plugin, built beside the control thread
    /// before the delivery is chosen: being built, and built (with the outcome's generation).
    var chainsBuilding: Set<Int64> = []
    var chainsBuilt: [Int64: (generation: Int64, built: Runner.BuiltFollowUps)] = [:]
    /// Hooks that exited 0 whose enqueue lines are built beside the control thread (they stay
    /// in `hooksRunning` until then), with their outcome's key.
    var linesBuilding: [Int64: String?] = [:]
    /// Hooks that exited 0 this turn, acknowledged together (they stay in `hooksRunning` until then).
    var finished: [(seq: Int64, key: String?, followUps: [NewEntry])] = []
    /// Whether outcomes may have become deliverable since the last look.
    var due = true
    /// Entries whose hook failed in this run (the run's exit status and summary name them).
    var failedIDs: Set<String> = []
    var lastCheck: Int64 = 0
    /// Runs the hooks' processes, made with the first.
    var reactor: ProcessReactor?
    /// Whether the control thread runs as SCHED_BATCH now (it does while no hook runs).
    var batchPolicy = false

    /// Whether to look for deliverable outcomes now: when something changed, or every
    /// 50 ms (retries of failed deliveries come due with time).
    mutating func isDue(mono: Int64) -> Bool {
        guard due || mono - lastCheck >= 50 else { return false }
        due = false
        lastCheck = mono
        return true
    }
}

/// Limits progress events to a few a second per entry, whatever the part count.
struct ProgressGate {
    static let intervalMs: Int64 = 250
    private var last: [String: Int64] = [:]

    /// Whether an event for `id` may go out now; `force` (a final count) always may.
    mutating func allow(_ id: String, now: Int64, force: Bool) -> Bool {
        if !force, let previous = last[id], now - previous < Self.intervalMs { return false }
        if last.count > 4096 {
            // Long runs see many ids: forget the ones that have been quiet for a while.
            last = last.filter { now - $0.value < Self.intervalMs }
        }
        last[id] = now
        return true
    }
}
