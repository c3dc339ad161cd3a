import CSystem
import Glibc
import OutboxHTTP
import OutboxModel
import OutboxProcess
import OutboxStore
import Synchronization

public enum ProgressMode: String, Sendable { case auto, always, never }

public struct RunOptions: Sendable {
    public var drain = false
    public var horizonMs: Int64 = 10_000
    public var maxTimeMs: Int64?
    public var graceMs: Int64 = 30_000
    public var progress: ProgressMode = .auto
    public var stderrIsTerminal = false
    public init() {}
}

/// What a run did, for the one-line summary and `--json`.
public struct RunSummary: Sendable {
    public var attempts = 0
    public var completed = 0
    public var errors = 0
    public var retried = 0
    public var parked = 0
    public var cancelled = 0
    public var delivered = 0
    public var deliveryFailures = 0
    public var bytesSent: Int64 = 0
    public var elapsedMs: Int64 = 0
    public var remaining = 0

    public var json: JSON {
        .object([
            ("attempts", .int(attempts)), ("completed", .int(completed)), ("errors", .int(errors)), ("retried", .int(retried)),
            ("awaiting_auth", .int(parked)), ("cancelled", .int(cancelled)), ("delivered", .int(delivered)),
            ("delivery_failures", .int(deliveryFailures)), ("bytes_sent", .int64(bytesSent)), ("elapsed_ms", .int64(elapsedMs)),
            ("remaining", .int(remaining)),
        ])
    }

    public var line: String {
        "outbox: \(completed) completed, \(errors) error, \(retried) retried, \(parked) awaiting-auth, \(delivered) delivered"
            + (deliveryFailures > 0 ? " (\(deliveryFailures) hook failures)" : "")
            + ", \(remaining) left, \(attempts) attempts in \(Units.formatDuration(ms: elapsedMs))"
    }
}

enum RunnerEvent: Sendable {
    case transferDone(token: UInt64, result: HTTPResult)
    case progress(token: UInt64, sent: Int64)
    case hookStarted(seq: Int64, pid: Int32, start: UInt64)
    case hookDone(seq: Int64, result: Result<ProcessResult, ProcessSpawnError>)
    case hookSlow(seq: Int64, pid: Int32)
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
    /// Waiting on the curl thread for a slot (see `Runner.claim`).
    var standby = false
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
}

/// Sends queued entries, settles outcomes, and delivers them to hooks (SPEC 6-9).
///
/// One control thread (the caller's) owns the store connection and every decision; the
/// curl thread and hook threads only post events to its mailbox.
public final class Runner {
    let config: Config
    var definitions: DefinitionSet
    let store: SQLiteStore
    let environment: [String: String]
    let options: RunOptions
    let factory: EntryFactory
    let emit: (JSON) -> Void
    /// Writes a line to the log (stderr); use `log(_:)`, which keeps the live display intact.
    let writeLog: (String) -> Void
    let owner: String
    let mailbox = Mailbox<RunnerEvent>()
    var http: HTTPClient?

    var flights: [UInt64: Flight] = [:]
    var running: [String: Entry] = [:]
    var partJobs: [String: PartJob] = [:]
    var hostLoad: [String: Int] = [:]
    var hooksRunning: [Int64: String] = [:]
    var nextToken: UInt64 = 1
    var changes: [RunnerChange] = []
    /// Standby transfers (waiting on the curl thread for a slot): transfer id → flight token.
    var standby: [UInt64: UInt64] = [:]
    /// Standby transfers per host; `hostLoad` counts the transfers that started.
    var hostStandby: [String: Int] = [:]
    /// Entries whose standby request was aborted because of another process: true when the
    /// entry goes back to the queue (its key or the queue was paused), false when it is
    /// dropped (cancelled or replaced).
    var withdrawn: [String: Bool] = [:]
    /// Due entries read ahead of their claim, in queue order: one query feeds many claims.
    var ready: ArraySlice<Entry> = []
    /// The last read found fewer due entries than asked: no new read until something
    /// changes, or 10 ms have passed (retries and holds come due with time).
    var readyExhausted = false
    var readyReadAt: Int64 = 0
    /// The store's data_version when last seen: it moves when another process commits.
    var seenDataVersion: Int64?
    /// Whether outcomes may have become deliverable since the last look (see `deliver`).
    var deliveryDue = true
    var lastDeliveryCheck: Int64 = 0
    var summary = RunSummary()
    var progressDisplay: ProgressDisplay?
    var progressGate = ProgressGate()
    var headerGeneration: Int64 = 0
    /// `outbox wifi on` (another process's setting, read again when it commits).
    var queueWifiOnly = false
    var warnedUnhandled = Set<String>()
    var lastAuthRefresh: Int64 = -60_000
    /// False when nothing reads events: state and progress lines are then not even built.
    public var eventsEnabled = true
    var requestIDs = FastRandom()
    /// Set when an outcome of a key without a definition was settled: flush marks it unhandled-key.
    var settledUnhandled = false

    public init(config: Config, definitions: DefinitionSet, store: SQLiteStore, environment: [String: String], cwd: String,
                options: RunOptions, emit: @escaping (JSON) -> Void, log: @escaping (String) -> Void) {
        self.config = config
        self.definitions = definitions
        self.store = store
        self.environment = environment
        self.options = options
        self.emit = emit
        self.writeLog = log
        owner = "pid-\(getpid())-\(Identifiers.uuid().prefix(8))"
        factory = EntryFactory(config: config, environment: environment, cwd: cwd) { [definitions] (key: String) throws(OutboxError) in
            guard let d = definitions.definitions[key] else { throw .invalid("no definition has key \"\(key)\"") }
            return d
        }
    }

    /// Takes the store's runner lock (exit 75 when another runner holds it).
    public static func lock(store folder: String) throws(OutboxError) -> Int32 {
        let path = Paths.join(folder, "runner.lock")
        let fd = csystem_lock_file(path)
        if fd == -EWOULDBLOCK || fd == -EAGAIN {
            let holder = Paths.readText(path)?.trimmingSpaces ?? ""
            throw .running("another runner holds the store \(folder)\(holder.isEmpty ? "" : " (\(holder))")")
        }
        guard fd >= 0 else { throw .storage("cannot lock \(path): \(Paths.errnoMessage(-fd))") }
        ftruncate(fd, 0)
        let text = "pid \(getpid()) since \(Identifiers.nowMs())\n"
        _ = text.withCString { pwrite(fd, $0, strlen($0), 0) }
        return fd
    }

    // MARK: The loop

    public func run() throws(OutboxError) -> RunSummary {
        let started = Identifiers.monotonicMs()
        installStopSignals()
        do {
            // libcurl is loaded and initialised before any hook or curl thread starts (T-curl12).
            try HTTPClient.loadLibrary()
            http = try HTTPClient(maxTotalConnections: max(config.concurrency * 2, 16), perHost: config.perHost)
        } catch {
            throw .storage("cannot load libcurl: \(error)")
        }
        defer { http?.shutdown() }
        // The curl thread (started above, with the normal policy) moves the bytes; this thread
        // keeps the books. As SCHED_BATCH it does not preempt the curl thread each time a
        // transfer ends: it runs when a core is free or its share comes, and settles what
        // ended meanwhile in one commit. Hooks and plugins it starts get the normal policy.
        _ = csystem_sched_batch_self(1)
        defer { _ = csystem_sched_batch_self(0) }
        let requeued = try store.requeueAbandoned(owner: owner, now: Identifiers.nowMs())
        if requeued > 0 { log("outbox: put \(requeued) entr\(requeued == 1 ? "y" : "ies") left running by an earlier runner back in the queue") }
        for (pgid, start) in try store.recordedHookProcesses() where ProcessRunner.killStaleGroup(pgid: pgid, startTime: start) {
            log("outbox: stopped hook process group \(pgid) left by an earlier runner")
        }
        try store.markUnhandled(keys: Set(definitions.definitions.keys))
        for key in definitions.brokenKeys.keys.sorted() {
            log("outbox: the definition of \(key) has errors: its outcomes are held until it is fixed (outbox check)")
        }
        if options.progress == .always || (options.progress == .auto && options.stderrIsTerminal) {
            progressDisplay = ProgressDisplay(write: { text in _ = text.withCString { write(2, $0, strlen($0)) } },
                                              totals: { [store] in try? store.pendingTotals() })
        }

        var stopDeadline: Int64?
        var aborted = false
        var events: [RunnerEvent] = []
        while true {
            // Results of the last wait become changes, committed with this turn's claims in
            // one transaction (group commit).
            for event in events { try handle(event) }
            let now = Identifiers.nowMs()
            let mono = Identifiers.monotonicMs()
            let signals = stopSignals.load(ordering: .relaxed)
            if let max = options.maxTimeMs, stopDeadline == nil, mono - started >= max {
                stopDeadline = mono + options.graceMs
                log("outbox: --max-time reached; letting attempts in flight finish")
            }
            if signals >= 1, stopDeadline == nil {
                stopDeadline = mono + options.graceMs
                log("outbox: stopping; attempts in flight may finish within \(Units.formatDuration(ms: options.graceMs)) (signal again to stop now)")
            }
            let stopping = stopDeadline != nil
            // Stopping: what has not started stays in the queue (its entry is requeued).
            if stopping { for transferID in standby.keys { http?.cancel(transferID) } }
            if stopping, !aborted, signals >= 2 || mono >= stopDeadline! {
                aborted = true
                for flight in flights.values { http?.cancel(flight.transferID) }
            }
            if stopping && flights.isEmpty && (hooksRunning.isEmpty || aborted) {
                try flush(now: now)
                break
            }

            try noticeOtherWriters()
            if !stopping {
                try refreshAuthIfNeeded(now: now)
                try claim(now: now)
                try pumpParts(now: now)
                if deliveryDue || mono - lastDeliveryCheck >= 50 {
                    deliveryDue = false
                    lastDeliveryCheck = mono
                    try deliver(now: now)
                }
            }
            try flush(now: now)

            if options.drain && !stopping && flights.isEmpty && hooksRunning.isEmpty {
                let deliverable = Set(definitions.definitions.keys)
                let due = try store.nextDueTime(deliverableKeys: deliverable)
                if due == nil || due! > now + options.horizonMs { break }
            }
            progressDisplay?.draw(summary: summary, flights: flights.count, running: running.count)

            // Sleep until an event, or 50 ms to notice enqueues from other processes (T-sql6).
            events = mailbox.take(timeoutMs: 50)
        }
        progressDisplay?.finish()
        // Entries we hold go back in the queue, keeping accepted parts.
        for id in running.keys { changes.append(.requeue(entryID: id)) }
        try flush(now: Identifiers.nowMs())
        store.checkpoint()
        summary.elapsedMs = Identifiers.monotonicMs() - started
        let counts = try store.counts()
        summary.remaining = Int(counts.states.filter { !["completed", "cancelled"].contains($0.key) }.values.reduce(0, +))
        return summary
    }

    /// Logs a line; with the live display on, the line it drew is cleared first and drawn
    /// again below the log line at the next turn.
    func log(_ line: String) {
        progressDisplay?.clear()
        writeLog(line)
    }

    func flush(now: Int64) throws(OutboxError) {
        guard !changes.isEmpty else { return }
        let batch = changes
        changes.removeAll()
        try store.apply(batch, now: now)
        // What was committed can make entries due (follow-ups, requeues) and outcomes deliverable.
        readyExhausted = false
        deliveryDue = true
        if batch.contains(where: Self.insertsEntries) { readAheadIsStale() }
        if settledUnhandled {
            settledUnhandled = false
            try store.markUnhandled(keys: Set(definitions.definitions.keys))
        }
    }

    // MARK: Claiming

    /// Another process committed (enqueue, cancel, pause, headers update): what was read
    /// ahead may be stale, and the header generation may have moved.
    func noticeOtherWriters() throws(OutboxError) {
        let version = try store.dataVersion()
        guard version != seenDataVersion else { return }
        seenDataVersion = version
        readAheadIsStale()
        deliveryDue = true
        headerGeneration = Int64(try store.setting("header_generation") ?? "0") ?? 0
        queueWifiOnly = try store.setting("wifi_only") == "1"
        try dropWithdrawnStandby()
    }

    /// A standby request is not sent when, since its claim, another process cancelled or
    /// replaced its entry (the entry leaves the runner) or paused its key or the queue (the
    /// entry goes back to the queue): it is aborted on the curl thread.
    func dropWithdrawnStandby() throws(OutboxError) {
        guard !standby.isEmpty else { return }
        let held = standby.compactMap { transferID, token in
            flights[token].flatMap { running[$0.entryID] }.map { (transferID, $0) }
        }
        let current = try store.runningGenerations(seqs: held.map(\.1.seq))
        let queuePaused = try store.setting("queue_paused") == "1"
        let pausedKeys = try store.pausedKeys()
        for (transferID, entry) in held {
            if current[entry.seq] != entry.generation {
                withdrawn[entry.id] = false
            } else if queuePaused || pausedKeys.contains(entry.key) {
                withdrawn[entry.id] = true
            } else {
                continue
            }
            http?.cancel(transferID)
        }
    }

    /// Drops the entries read ahead: a same-id enqueue may have replaced one of them.
    func readAheadIsStale() {
        ready = []
        readyExhausted = false
    }

    /// Whether applying a change adds entries (`then` follow-ups), which may replace queued ones.
    static func insertsEntries(_ change: RunnerChange) -> Bool {
        if case let .settle(settlement) = change { return !settlement.followUps.isEmpty }
        return false
    }

    /// Reads due entries ahead when fewer than `capacity` are at hand. Entries the runner
    /// holds or has read already are left out (a claim is committed at the end of its turn,
    /// so a held entry may still look queued in the store).
    func readAhead(capacity: Int, now: Int64) throws(OutboxError) {
        let mono = Identifiers.monotonicMs()
        guard ready.count < capacity, !readyExhausted || mono - readyReadAt >= 10 else { return }
        readyReadAt = mono
        let want = max(capacity + 2, min(256, config.concurrency * 4))
        var excluded = Set(running.keys)
        for entry in ready { excluded.insert(entry.id) }
        let more = try store.dueEntries(now: now, limit: want, excluding: excluded)
        readyExhausted = more.count < want
        ready += more
    }

    /// Entries whose transfer has started (or, for chunked entries, may start parts).
    var entriesInFlight: Int { running.count - standby.count }

    /// Claims due entries: into free slots first, then as standby transfers that the curl
    /// thread starts the moment a slot frees (at most `concurrency` of them), so a finished
    /// request is followed at once, without a round trip through this thread.
    func claim(now: Int64) throws(OutboxError) {
        promoteStandby()
        var free = config.concurrency - entriesInFlight
        var standbyFree = config.concurrency - standby.count
        let capacity = free + standbyFree
        guard capacity > 0 else { return }
        try readAhead(capacity: capacity, now: now)
        guard !ready.isEmpty else { return }
        var claimed: [(entry: Entry, host: String, standby: Bool)] = []
        var held: [Int] = []
        var taken = 0
        // A few more than the free slots, so entries held by per_host do not starve the rest.
        for (position, entry) in zip(ready.indices, ready) {
            guard free + standbyFree > 0, taken < capacity + 2 else { break }
            taken += 1
            // Where it would go first: the checks below (a stat of the file, among others)
            // run only for an entry that leaves the queue now, not for each one that waits.
            let host = URLCheck.hostKey(entry.request.url ?? "")
            let isStandby: Bool
            if entry.request.bodyKind == "parts" {
                // Parts are scheduled by pumpParts, within per_host; the entry needs a slot.
                guard free > 0 else { held.append(position); continue }
                isStandby = false
            } else if free > 0, hostLoad[host, default: 0] < config.perHost {
                isStandby = false
            } else if standbyFree > 0, hostStandby[host, default: 0] < config.perHost, Self.mayWaitAsStandby(entry, now: now) {
                isStandby = true
            } else {
                // Held: no slot within per_host, or it may not wait as standby. It keeps its
                // place, and other entries go first.
                held.append(position)
                continue
            }
            if Expiry.isExpired(now: now, createdAt: entry.createdAt, expiresAt: entry.expiresAt) {
                settleError(entry, kind: "expired", message: Self.expiredMessage(attempts: entry.attempts, lastReason: entry.reason),
                            state: .error, reason: "expired")
                continue
            }
            if let account = entry.account, let current = factory.account(), account != current {
                log("outbox: dropped \(entry.id): enqueued by account \(account), not the current account \(current)")
                changes.append(.drop(entryID: entry.id, reason: "other-account"))
                emitState(entry, state: "cancelled", reason: "other-account")
                summary.cancelled += 1
                continue
            }
            if entry.request.wifiOnly ?? queueWifiOnly, !onWifi() {
                changes.append(.reschedule(entryID: entry.id, nextAttemptAt: now + 30_000, reason: "wifi"))
                continue
            }
            if let problem = payloadProblem(entry) {
                settleError(entry, kind: "file", message: problem, state: .error, reason: "file")
                continue
            }
            if isStandby {
                standbyFree -= 1
                hostStandby[host, default: 0] += 1
            } else {
                free -= 1
                if entry.request.bodyKind != "parts" { hostLoad[host, default: 0] += 1 }
            }
            claimed.append((entry, host, isStandby))
        }
        dropLeavers(taken: taken, held: held)
        guard !claimed.isEmpty else { return }
        // Committed with this turn's other changes: a crash before the commit leaves them
        // queued, after it `running`, and either way the next runner sends them again.
        changes.append(.markRunning(entrySeqs: claimed.map(\.entry.seq), owner: owner, leaseUntil: now + 300_000))
        for (claimedEntry, host, isStandby) in claimed {
            var entry = claimedEntry
            entry.state = .running
            running[entry.id] = entry
            emitState(entry, state: "running", reason: nil)
            if entry.request.bodyKind == "parts" {
                partJobs[entry.id] = PartJob(parts: try store.parts(entrySeq: entry.seq), entry: entry)
            } else {
                startTransfer(entry, part: nil, host: host, standby: isStandby)
            }
        }
    }

    /// Removes from the front of `ready` the `taken` entries looked at, except those `held`
    /// (ascending positions), which keep their place and order. Held entries are moved to the
    /// back of that window by swaps, and the window's front is dropped: no entry is copied.
    func dropLeavers(taken: Int, held: [Int]) {
        guard held.count < taken else { return }
        var slot = ready.startIndex + taken
        for position in held.reversed() {
            slot -= 1
            if position != slot { ready.swapAt(position, slot) }
        }
        ready.removeFirst(taken - held.count)
    }

    /// Whether an entry's request may wait on the curl thread. Expiry is checked before each
    /// attempt (SPEC 3), and a standby request starts later than that check: entries expiring
    /// within 10 minutes are claimed only into free slots. (A referenced file is checked
    /// again by the curl thread when it opens the file: `HTTPRequest.expectedFile`.)
    static func mayWaitAsStandby(_ entry: Entry, now: Int64) -> Bool {
        entry.expiresAt.map { $0 - now > 600_000 } ?? true
    }

    /// Free slots go first to standby transfers, oldest first, within per_host.
    func promoteStandby() {
        var free = config.concurrency - entriesInFlight
        guard free > 0, !standby.isEmpty else { return }
        for transferID in standby.keys.sorted() where free > 0 {
            guard let token = standby[transferID], let host = flights[token]?.host,
                  hostLoad[host, default: 0] < config.perHost else { continue }
            standbyStarted(transferID)
            http?.promote(transferID)
            free -= 1
        }
    }

    /// A standby transfer started (promoted here, or by the curl thread in a slot that freed).
    func standbyStarted(_ transferID: UInt64) {
        guard let token = standby.removeValue(forKey: transferID), let host = flights[token]?.host else { return }
        flights[token]?.standby = false
        hostStandby[host, default: 1] -= 1
        hostLoad[host, default: 0] += 1
    }

    /// The built-in Wi-Fi check: a wireless interface that is up, or the configured plugin.
    func onWifi() -> Bool {
        if let command = config.wifiCheck {
            let spec = ProcessSpec(command: ProcessCommand(command), environment: environment, workingDirectory: config.root,
                                   timeoutMs: 10_000)
            return (try? ProcessRunner.run(spec))?.succeeded ?? false
        }
        for name in Paths.list("/sys/class/net") ?? [] where Paths.isDirectory("/sys/class/net/\(name)/wireless") {
            if Paths.readText("/sys/class/net/\(name)/operstate")?.trimmingSpaces == "up" { return true }
        }
        return false
    }

    /// The identity a referenced file had at enqueue, which it must keep (SPEC 7).
    static func expectedFile(_ entry: Entry) -> FileIdentity? {
        entry.request.ownership == .reference ? entry.request.file : nil
    }

    /// Why an entry's bytes cannot be sent (staged file gone, referenced file changed), or nil.
    func payloadProblem(_ entry: Entry) -> String? {
        for file in [entry.bodyFile].compactMap({ $0 }) + entry.request.form.compactMap(\.stagedFile) {
            guard let info = FileInfo.stat(file) else {
                let referenced = entry.request.ownership == .reference && file == entry.bodyFile
                return referenced ? FileIdentity.missing(file) : "the staged payload \(file) is missing"
            }
            if let expected = Self.expectedFile(entry), !expected.matches(size: info.size, mtimeNs: info.mtimeNs, inode: info.inode) {
                return FileIdentity.changed(file)
            }
        }
        return nil
    }

    // MARK: Sending

    func baseHeaders(_ entry: Entry, requestID: String) -> [(name: String, value: String)] {
        var headers = entry.request.headers.map { (name: $0.0, value: $0.1) }
        headers.append((name: "X-Request-Id", value: requestID))
        if let key = entry.idempotencyKey { headers.append((name: "Idempotency-Key", value: key)) }
        if !headers.contains(where: { $0.name.lowercased() == "user-agent" }) {
            headers.append((name: "User-Agent", value: "outbox/\(Runner.version)"))
        }
        return headers
    }

    public static let version = "0.1.0"

    func startTransfer(_ entry: Entry, part: StoredPart?, host: String, standby isStandby: Bool = false) {
        let requestID = Identifiers.uuid(using: &requestIDs)
        var headers = baseHeaders(entry, requestID: requestID)
        var url = entry.request.url ?? ""
        var body: HTTPBody
        if let part {
            url = part.url
            for (name, value) in part.headers {
                headers.removeAll { $0.name.lowercased() == name.lowercased() }
                headers.append((name: name, value: value))
            }
            body = .file(path: entry.bodyFile ?? "", offset: part.range.start, length: part.range.end - part.range.start)
        } else if let inline = entry.bodyInline {
            body = .bytes(inline)
        } else if !entry.request.form.isEmpty {
            body = .form(entry.request.form.map {
                FormField(name: $0.name, value: $0.value, filePath: $0.stagedFile, filename: $0.filename, contentType: $0.contentType)
            })
        } else if let file = entry.bodyFile {
            body = .file(path: file, offset: 0, length: entry.totalBytes)
        } else {
            body = .none
        }
        var request = HTTPRequest(
            url: url, method: entry.request.method, headers: headers, body: body, followRedirects: entry.request.followRedirects,
            connectTimeoutMs: Int(config.connectTimeoutMs), stallBelowBytesPerSecond: Int(config.stallBelowBytes),
            stallForMs: Int(config.stallForMs), caFile: config.caFile,
            maxResponseBytes: Int(config.maxResponseBytes), userAgent: "outbox/\(Runner.version)")
        // A referenced file is checked again when the curl thread opens it: a standby request
        // may start well after its claim checked the file.
        if part == nil { request.expectedFile = Self.expectedFile(entry) }
        let token = nextToken
        nextToken += 1
        let attempt = (running[entry.id]?.attempts ?? entry.attempts) + 1
        running[entry.id]?.attempts = attempt
        var flight = Flight(entryID: entry.id, partIndex: part?.index, requestID: requestID, host: host, url: url,
                            method: entry.request.method, attempt: attempt, standby: isStandby)
        if part != nil { hostLoad[host, default: 0] += 1 }
        let mailbox = self.mailbox
        // Progress only feeds events and the display: with neither, curl is not asked for it
        // (two mailbox posts per small request otherwise).
        var progress: (@Sendable (Int64, Int64) -> Void)?
        if eventsEnabled || progressDisplay != nil {
            progress = { sent, _ in mailbox.post(.progress(token: token, sent: sent)) }
        }
        // A whole entry's transfer holds its slot; parts are counted by their entry.
        flight.transferID = http!.start(request, host: host, slot: part == nil, standby: isStandby, progress: progress,
                                        completion: { result in mailbox.post(.transferDone(token: token, result: result)) })
        flights[token] = flight
        if isStandby { standby[flight.transferID] = token }
        summary.attempts += 1
    }

    /// What an expired entry's error says: that nothing was sent, or how the attempts went.
    static func expiredMessage(attempts: Int64, lastReason: String?) -> String {
        guard attempts > 0 else { return "the entry expired before it could be sent" }
        let tries = attempts == 1 ? "1 attempt" : "\(attempts) attempts"
        return "the entry expired after \(tries) without success" + (lastReason.map { "; the last: \($0)" } ?? "")
    }

    /// Starts the next parts of chunked entries, within part_concurrency and per_host.
    func pumpParts(now: Int64) throws(OutboxError) {
        for (id, snapshot) in partJobs {
            guard let entry = running[id], !snapshot.failed else {
                // A stopped entry's job lives until its parts in flight have returned.
                if snapshot.inFlight.isEmpty {
                    partJobs[id] = nil
                    if snapshot.failed { running[id] = nil }
                }
                continue
            }
            var job = snapshot
            let pending = job.parts.filter { !$0.accepted && !job.inFlight.contains($0.index) }
            if pending.isEmpty && job.inFlight.isEmpty {
                partJobs[id] = nil
                try settleParts(entry, job: job, now: now)
                continue
            }
            if Expiry.isExpired(now: now, createdAt: entry.createdAt, expiresAt: entry.expiresAt) {
                stopParts(id)
                settleError(entry, kind: "expired", message: "the entry expired before all its parts were accepted",
                            state: .error, reason: "expired")
                continue
            }
            let ready = pending.filter { ($0.nextAttemptAt ?? 0) <= now }
            // A part waiting for its retry keeps its slot, as a retry in place would: when
            // the server is down, part_concurrency parts fail and wait, not every part once.
            let waiting = pending.count - ready.count
            var free = config.partConcurrency - job.inFlight.count - waiting
            if !ready.isEmpty && free > 0, let problem = payloadProblem(entry) {
                // Checked before each attempt, as for a whole body: a changed or missing file settles.
                stopParts(id)
                settleError(entry, kind: "file", message: problem, state: .error, reason: "file")
                continue
            }
            // Parts are tried in order, so parts due for a retry come before untried ones.
            for part in ready where free > 0 {
                let host = URLCheck.hostKey(part.url)
                if hostLoad[host, default: 0] >= config.perHost { continue }
                job.inFlight.insert(part.index)
                partJobs[id] = job
                free -= 1
                startTransfer(entry, part: part, host: host)
            }
            if job.inFlight.isEmpty && (ready.isEmpty || free <= 0),
               let next = pending.compactMap(\.nextAttemptAt).filter({ $0 > now }).min() {
                // Every slot waits for a retry: give the entry's slot back until the earliest is due.
                partJobs[id] = nil
                running[id] = nil
                changes.append(.reschedule(entryID: id, nextAttemptAt: next, reason: "part retry"))
                emitState(entry, state: "queued", reason: "part retry")
            }
        }
    }

    // MARK: Results

    func handle(_ event: RunnerEvent) throws(OutboxError) {
        switch event {
        case let .progress(token, sent):
            guard var flight = flights[token] else { return }
            flight.sent = sent
            flights[token] = flight
            if var job = partJobs[flight.entryID], let index = flight.partIndex {
                job.sentByPart[index] = sent
                partJobs[flight.entryID] = job
            }
            if let entry = running[flight.entryID] {
                if let job = partJobs[entry.id] {
                    let sent = entryBytesSent(entry, job: job)
                    emitProgress(entry, sent: sent, accepted: Self.acceptedBytes(job), force: false)
                } else {
                    emitProgress(entry, sent: sent, accepted: 0, force: entry.totalBytes > 0 && sent >= entry.totalBytes)
                }
            }
        case let .transferDone(token, result):
            if let next = result.startedInPlace { standbyStarted(next) }
            guard let flight = flights.removeValue(forKey: token) else { return }
            if flight.standby {
                // Aborted (or failed to start) before it ever started.
                standby[flight.transferID] = nil
                hostStandby[flight.host, default: 1] -= 1
            } else {
                hostLoad[flight.host, default: 1] -= 1
            }
            try finished(flight, result: result)
        case let .hookStarted(seq, pid, start):
            try store.recordHookProcess(seq: seq, pgid: pid, startTime: start)
        case let .hookSlow(seq, pid):
            log("outbox: the hook for \(hooksRunning[seq] ?? "?") (pid \(pid)) runs longer than \(Units.formatDuration(ms: config.hookWarnAfterMs)); waiting for it")
        case let .hookDone(seq, result):
            try hookFinished(seq: seq, result: result)
        }
    }

    func attemptEvent(_ entry: Entry, _ flight: Flight, _ result: HTTPResult, outcome: String) -> JSON {
        var event: JSON = .object([
            ("type", .string("attempt")), ("id", .string(entry.id)), ("key", .string(entry.key)), ("request_id", .string(flight.requestID)),
            ("attempt", .int64(flight.attempt)), ("url", .string(Self.redactURL(flight.url))), ("method", .string(flight.method)),
            ("part_index", flight.partIndex.map { .int($0) } ?? .null), ("outcome", .string(outcome)),
            ("http_code", result.status.map { .int($0) } ?? .null),
        ])
        bodyJSON(Array(result.body.prefix(4096)), into: &event)
        event.set("error_kind", .optionalString(result.failure?.kind.rawValue))
        event.set("error_message", .optionalString(result.failure?.message))
        event.set("at", .int64(Identifiers.nowMs()))
        return event
    }

    /// Query strings can carry presigned credentials: events show the URL without them.
    static func redactURL(_ url: String) -> String {
        guard let q = url.firstIndex(of: "?") else { return url }
        return String(url[..<q]) + "?[redacted]"
    }

    func finished(_ flight: Flight, result: HTTPResult) throws(OutboxError) {
        // (A withdrawn entry's request may have started just before the abort reached the
        // curl thread; then it settles as usual, and the settle finds no row to change.)
        let withdrawal = flight.partIndex == nil ? withdrawn.removeValue(forKey: flight.entryID) : nil
        guard var entry = running[flight.entryID] else {
            // A part still in flight when its entry settled: keep an acceptance, nothing more.
            if flight.partIndex != nil { partReturnedAfterSettle(flight, result: result) }
            return
        }
        let now = Identifiers.nowMs()
        summary.bytesSent += result.bytesSent
        if result.failure?.message == "aborted" {
            // Stopped by us (grace over, or withdrawn): not an attempt result; the entry goes
            // back to the queue when the run ends, or now if it was paused, or is dropped.
            if let requeue = withdrawal {
                running[entry.id] = nil
                if requeue { changes.append(.requeue(entryID: entry.id)) }
                return
            }
            if flight.partIndex != nil {
                partJobs[entry.id]?.inFlight.remove(flight.partIndex!)
                releaseStoppedParts(entry.id)
            }
            return
        }
        if let failure = result.failure, failure.kind == .file, flight.partIndex == nil {
            // The referenced file went missing or changed before its request started (it
            // waited as a standby request): settled like the check at claim, nothing was sent.
            running[entry.id] = nil
            settleError(entry, kind: "file", message: failure.message, state: .error, reason: "file")
            return
        }
        let failure: TransportFailure? = result.failure.map {
            switch $0.kind {
            case .network, .file: return .network($0.message)
            case .timeout: return .timeout($0.message)
            case .tls: return .tls($0.message)
            case .redirect: return .redirect($0.message)
            }
        }
        let klass = AttemptClassifier.classify(status: result.status, failure: failure, body: result.body,
                                               accept: entry.request.accept, exempt: Set(entry.request.retry.exempt))
        let outcomeName: String
        switch klass {
        case .success: outcomeName = "success"
        case .retry: outcomeName = "retry"
        case .awaitingAuth: outcomeName = "awaiting-auth"
        case .terminal: outcomeName = "error"
        }
        // A whole request that succeeds with nothing to deliver is forgotten in this very
        // transaction: its attempt log and progress would be deleted as they are written.
        var forgottenAtOnce = false
        if case .success = klass, flight.partIndex == nil, !eventsEnabled, !outcomeNeeded(entry, outcome: "completed") {
            forgottenAtOnce = true
        }
        if !forgottenAtOnce {
            let event = attemptEvent(entry, flight, result, outcome: outcomeName)
            emit(event)
            changes.append(.attempt(entryID: entry.id, generation: entry.generation, at: now, payload: event, requestID: flight.requestID))
        }
        entry.lastRequestID = flight.requestID
        running[entry.id] = entry

        if let index = flight.partIndex {
            try partFinished(entry, index: index, klass: klass, result: result, now: now)
            return
        }
        running[entry.id] = nil
        if forgottenAtOnce {
            settle(entry, payload: .object([]), outcome: "completed", state: .completed, reason: nil)
            return
        }
        changes.append(.progress(entryID: entry.id, bytesSent: result.bytesSent))
        // State events carry the row as it is after this attempt.
        entry.bytesSent = result.bytesSent
        switch klass {
        case .success:
            settleSuccess(entry, result: result, parts: nil, requestID: flight.requestID)
        case let .retry(reason):
            let next = Backoff.nextAttemptAt(now: now, failures: Int(entry.attempts), policy: entry.request.retry.backoff,
                                             retryAfterSeconds: result.retryAfterSeconds, expiresAt: entry.expiresAt,
                                             random: Double.random(in: 0..<1))
            changes.append(.reschedule(entryID: entry.id, nextAttemptAt: next, reason: reason))
            entry.nextAttemptAt = next
            emitState(entry, state: "queued", reason: reason)
            summary.retried += 1
        case .awaitingAuth:
            authRefused(entry, now: now)
        case let .terminal(reason):
            var error: JSON = .object([("kind", .string("http")), ("message", .string(failure.map { "\($0)" } ?? reason)),
                                       ("status", result.status.map { .int($0) } ?? .null)])
            bodyJSON(Array(result.body.prefix(65536)), into: &error)
            settleWithError(entry, error: error, response: result, state: .error, reason: "http", requestID: flight.requestID)
        }
    }

    /// A 401/403: parks the entry, unless it was sent with headers older than the latest
    /// `headers update`, in which case it is sent again at once with the new ones (SPEC 7).
    func authRefused(_ entry: Entry, now: Int64) {
        if entry.headerGeneration < headerGeneration {
            changes.append(.reschedule(entryID: entry.id, nextAttemptAt: now, reason: "auth"))
        } else {
            changes.append(.park(entryID: entry.id))
            emitState(entry, state: "awaiting-auth", reason: "auth")
            summary.parked += 1
        }
    }

    func partFinished(_ entry: Entry, index: Int, klass: AttemptOutcomeClass, result: HTTPResult, now: Int64) throws(OutboxError) {
        guard var job = partJobs[entry.id] else { return }
        job.inFlight.remove(index)
        job.sentByPart[index] = nil
        guard let position = job.parts.firstIndex(where: { $0.index == index }) else {
            partJobs[entry.id] = job
            return
        }
        if case .success = klass {
            // Durable the moment it is classified: flushed in this iteration's transaction.
            recordPartAccepted(&job, position: position, result: result)
        }
        partJobs[entry.id] = job
        if job.failed {
            // The entry already stopped (parked, rescheduled): keep the acceptance, start nothing.
            releaseStoppedParts(entry.id)
            return
        }
        let part = job.parts[position]
        switch klass {
        case .success:
            let accepted = Self.acceptedBytes(job)
            emitProgress(entry, sent: entryBytesSent(entry, job: job), accepted: accepted, force: accepted == entry.totalBytes)
        case .retry:
            job.parts[position].attempts += 1
            let next = Backoff.nextAttemptAt(now: now, failures: job.parts[position].attempts, policy: entry.request.retry.backoff,
                                             retryAfterSeconds: result.retryAfterSeconds, expiresAt: entry.expiresAt,
                                             random: Double.random(in: 0..<1))
            job.parts[position].nextAttemptAt = next
            changes.append(.partRetry(entrySeq: entry.seq, index: index, nextAttemptAt: next))
            partJobs[entry.id] = job
            summary.retried += 1
        case .awaitingAuth:
            stopParts(entry.id)
            authRefused(entry, now: now)
            releaseStoppedParts(entry.id)
        case .terminal:
            stopParts(entry.id)
            let status = result.status.map(String.init) ?? "none"
            let what = "part \(index + 1) of \(job.parts.count) (index \(index), bytes \(part.range.start)-\(max(part.range.start, part.range.end - 1)))"
            let message = result.failure.map { "\(what) failed: \($0.message)" } ?? "\(what) was refused with status \(status)"
            var error: JSON = .object([("kind", .string("http")), ("message", .string(message)),
                                       ("status", result.status.map { .int($0) } ?? .null), ("part_index", .int(index))])
            bodyJSON(Array(result.body.prefix(65536)), into: &error)
            settleWithError(entry, error: error, response: result, state: .error, reason: "http", requestID: running[entry.id]?.lastRequestID ?? "")
            releaseStoppedParts(entry.id)
        }
    }

    func settleParts(_ entry: Entry, job: PartJob, now: Int64) throws(OutboxError) {
        var entry = running[entry.id] ?? entry
        entry.bytesSent = entry.totalBytes
        changes.append(.progress(entryID: entry.id, bytesSent: entry.totalBytes))
        running[entry.id] = nil
        let parts = JSON.array(job.parts.map { p in
            .object([("index", .int(p.index)), ("status", p.status.map { .int($0) } ?? .null), ("headers", p.responseHeaders ?? .object([]))])
        })
        settleSuccess(entry, result: nil, parts: parts, requestID: entry.lastRequestID ?? "")
    }

    static func headersJSON(_ headers: [(name: String, value: String)]) -> JSON {
        .object(headers.map { ($0.name.lowercased(), .string($0.value)) })
    }

    // MARK: Outcomes

    func basePayload(_ entry: Entry, outcome: String, requestID: String) -> JSON {
        .object([
            ("outcome", .string(outcome)), ("id", .string(entry.id)), ("key", .string(entry.key)), ("vars", entry.vars),
            ("meta", .object([
                ("at", .int64(Identifiers.nowMs())), ("attempts", .int64(running[entry.id]?.attempts ?? entry.attempts)),
                ("request_id", .string(requestID)), ("idempotency_key", .optionalString(entry.idempotencyKey)),
                ("generation", .int64(entry.generation)), ("header_generation", .int64(entry.headerGeneration)),
                ("parent", .optionalString(entry.parent)),
            ])),
        ])
    }

    func responseJSON(_ result: HTTPResult, entry: Entry) -> JSON {
        var response: JSON = .object([("status", result.status.map { .int($0) } ?? .null), ("headers", Self.headersJSON(result.headers))])
        bodyJSON(result.body, into: &response)
        response.set("body_truncated", .bool(result.bodyTruncated))
        return response
    }

    /// Whether an outcome of this entry is read by anyone: its hook, a `then` follow-up, or
    /// (for a key without a usable definition) a later delivery.
    func outcomeNeeded(_ entry: Entry, outcome: String) -> Bool {
        guard let definition = definitions.definitions[entry.key], definitions.brokenKeys[entry.key] == nil else { return true }
        if entry.request.response != .raw { return true }
        let name = outcome == "completed" ? "on_success" : "on_error"
        let hook = outcome == "completed" ? definition.onSuccess : definition.onError
        return hook != nil || !(definition.then?[name]?.arrayValue ?? []).isEmpty
    }

    func settleSuccess(_ entry: Entry, result: HTTPResult?, parts: JSON?, requestID: String) {
        var payload = basePayload(entry, outcome: "completed", requestID: requestID)
        var data: JSON = .null
        var parseError: JSON?
        if let result {
            payload.set("response", responseJSON(result, entry: entry))
            if entry.request.response != .raw {
                if result.bodyTruncated {
                    parseError = .object([("kind", .string("truncated")),
                                          ("message", .string("the response is over max_response_bytes (\(config.maxResponseBytes)); it was not parsed")),
                                          ("status", result.status.map { .int($0) } ?? .null)])
                } else {
                    switch parse(result.body, mode: entry.request.response, vars: entry.vars) {
                    case let .success(value): data = value
                    case let .failure(error):
                        parseError = .object([("kind", .string("unknown")), ("message", .string(error.message)),
                                              ("status", result.status.map { .int($0) } ?? .null)])
                    }
                }
            }
        }
        if let parts { payload.set("parts", parts) }
        if let parseError {
            // The request was accepted: the entry is completed and never sent again, but the
            // hook hears that its data could not be read.
            payload.set("outcome", .string("error"))
            payload.set("error", parseError)
            payload.set("data", .null)
            settle(entry, payload: payload, outcome: "error", state: .completed, reason: parseError["kind"]?.stringValue)
            return
        }
        payload.set("data", data)
        settle(entry, payload: payload, outcome: "completed", state: .completed, reason: nil)
    }

    func parse(_ body: [UInt8], mode: ResponseMode, vars: JSON) -> Result<JSON, OutboxError> {
        switch mode {
        case .raw: return .success(.null)
        case .json:
            let text = String(decoding: body, as: UTF8.self)
            if text.trimmingSpaces.isEmpty { return .success(.null) }
            do { return .success(try JSON.parse(text)) } catch { return .failure(.invalid("the response is not valid JSON: \(error)")) }
        case let .command(command):
            var input: JSON = .object([("vars", vars)])
            bodyJSON(body, into: &input, field: "raw")
            do {
                return .success(try Plugin.runJSON(command, input: input, name: "the response parser", config: config, environment: environment))
            } catch {
                return .failure(error)
            }
        }
    }

    func settleError(_ entry: Entry, kind: String, message: String, state: EntryState, reason: String) {
        settleWithError(entry, error: .object([("kind", .string(kind)), ("message", .string(message)), ("status", .null)]),
                        response: nil, state: state, reason: reason, requestID: entry.lastRequestID ?? "")
    }

    func settleWithError(_ entry: Entry, error: JSON, response: HTTPResult?, state: EntryState, reason: String, requestID: String) {
        var payload = basePayload(entry, outcome: "error", requestID: requestID)
        payload.set("error", error)
        if let response { payload.set("response", responseJSON(response, entry: entry)) }
        payload.set("data", .null)
        settle(entry, payload: payload, outcome: "error", state: state, reason: reason)
        if entry.request.cancelScopeOnError, let scope = entry.scope {
            let hookFor: @Sendable (Entry) -> (JSON, Bool) = { [definitions] behind in
                var p: JSON = .object([
                    ("outcome", .string("error")), ("id", .string(behind.id)), ("key", .string(behind.key)), ("vars", behind.vars),
                    ("error", .object([("kind", .string("cancelled")), ("message", .string("cancelled because \(entry.id) in scope \(scope) settled error")),
                                       ("status", .null)])),
                    ("data", .null),
                    ("meta", .object([("at", .int64(Identifiers.nowMs())), ("attempts", .int64(behind.attempts)), ("request_id", .null),
                                      ("idempotency_key", .optionalString(behind.idempotencyKey)), ("generation", .int64(behind.generation))])),
                ])
                p.set("reason", .string("scope"))
                return (p, definitions.definitions[behind.key]?.onError != nil || definitions.definitions[behind.key] == nil)
            }
            changes.append(.cancelScope(scope: scope, afterSeq: entry.seq, payloadFor: hookFor))
        }
    }

    func settle(_ entry: Entry, payload: JSON, outcome: String, state: EntryState, reason: String?) {
        running[entry.id] = nil
        let definition = definitions.definitions[entry.key]
        let hook = outcome == "completed" ? definition?.onSuccess : definition?.onError
        // An outcome whose key has no definition waits (unhandled-key): never acknowledged here.
        let hookExists = definition == nil || definitions.brokenKeys[entry.key] != nil || hook != nil
        if definition == nil { settledUnhandled = true }
        var followUps: [NewEntry] = []
        if let then = definition?.then?[outcome == "completed" ? "on_success" : "on_error"]?.arrayValue {
            for item in then {
                do {
                    followUps.append(try followUp(item, entry: entry, outcome: payload))
                } catch {
                    log("outbox: follow-up of \(entry.id) not enqueued: \(error.message)")
                }
            }
        }
        var settlement = Settlement(entryID: entry.id, generation: entry.generation, state: state, reason: reason,
                                    outcome: outcome, payload: payload, hookExists: hookExists, followUps: followUps)
        settlement.snapshot = entry
        changes.append(.settle(settlement))
        emitState(entry, state: state.rawValue, reason: reason)
        if state == .completed && outcome == "completed" { summary.completed += 1 } else if state == .completed { summary.completed += 1 } else { summary.errors += 1 }
    }

    /// Renders one `then` item with `outcome.*` and builds its entry.
    func followUp(_ item: JSON, entry: Entry, outcome: JSON) throws(OutboxError) -> NewEntry {
        var inputs = RenderInputs(id: entry.id, vars: entry.vars, environment: environment, cwd: config.root)
        inputs.outcome = outcome
        let rendered = try Template.renderTree(item, context: RequestBuilder.context(inputs), field: "then")
        guard let key = rendered["key"]?.stringValue else { throw .invalid("then: key must be a string") }
        var notBefore: Int64?
        if let delay = rendered["delay"]?.stringValue {
            do { notBefore = Identifiers.nowMs() + (try Units.parseDuration(delay)) } catch { throw .invalid("then.delay: \(error.message)") }
        }
        return try factory.make(key: key, vars: rendered["vars"] ?? .null, id: rendered["id"]?.stringValue, parent: entry.id,
                                notBefore: notBefore, outcome: outcome)
    }

    func emitState(_ entry: Entry, state: String, reason: String?) {
        guard eventsEnabled || progressDisplay != nil else { return }
        var row = entry.listJSON(displayState: state)
        row.set("reason", .optionalString(reason))
        row.set("updated_at", .int64(Identifiers.nowMs()))
        var event: JSON = .object([("type", .string("state"))])
        for (k, v) in row.objectValue ?? [] { event.set(k, v) }
        publish(event)
    }
}
