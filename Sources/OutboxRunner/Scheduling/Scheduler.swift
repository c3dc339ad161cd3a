import OutboxModel
import OutboxStore

/// The limits the scheduler keeps (from the config).
struct SchedulerLimits: Equatable {
    /// Entries sending at once (a chunked entry counts once, whatever its parts).
    var concurrency: Int
    /// Transfers to one host at once (parts count one each).
    var perHost: Int
    /// Parts of one chunked entry in flight at once.
    var partConcurrency: Int
    /// Transfers waiting on the curl thread, and per host.
    var standby: Int
    var standbyPerHost: Int

    /// `standbyPerSlot` standby transfers for each slot, in all and per host.
    init(concurrency: Int, perHost: Int, partConcurrency: Int, standbyPerSlot: Int = 1) {
        self.concurrency = concurrency
        self.perHost = perHost
        self.partConcurrency = partConcurrency
        standby = concurrency * standbyPerSlot
        standbyPerHost = perHost * standbyPerSlot
    }
}

/// The runner's slots as the scheduler sees them.
struct SlotState: Equatable {
    /// Entries holding a slot: whole transfers that started, and chunked entries.
    var entriesInFlight = 0
    /// Transfers waiting on the curl thread to start the moment a slot frees.
    var standby = 0
    /// Transfers started, per host.
    var hostLoad: [String: Int] = [:]
    /// Standby transfers, per host.
    var hostStandby: [String: Int] = [:]
}

/// What the scheduler needs to know that takes I/O to learn. The closures run only for an
/// entry about to leave the queue, never for every entry that waits.
struct ClaimChecks {
    var now: Int64
    var control = QueueControl()
    /// The current process's account (nil: none configured).
    var currentAccount: String?
    /// Scopes with an entry this runner holds: the next entry of such a scope waits.
    var busyScopes: Set<String> = []
    /// Whether the machine is on Wi-Fi; asked at most once per plan.
    var onWifi: () -> Bool = { true }
    /// When an entry held for Wi-Fi is looked at again (the next check of the Wi-Fi gate).
    var wifiRecheckAt: Int64 = 0
    /// Hosts held after connection failures, with when the next probe request may start.
    var heldHosts: [String: Int64] = [:]
    /// Why the entry's bytes cannot be sent (a staged file gone, a referenced file changed), or nil.
    var payloadProblem: (Entry) -> String? = { _ in nil }
    /// Whether entries may be claimed as standby transfers (besides free slots).
    var standbyAllowed = true
}

/// What happens to one entry read ahead of its claim.
enum ClaimDecision: Equatable {
    /// It leaves the queue: into a free slot, or as a standby transfer.
    case start(host: String, standby: Bool)
    /// No slot within the limits now: it keeps its place, and entries behind it go first.
    case hold
    /// Its queue or key was paused since it was read: it stays queued, out of the read-ahead.
    case paused
    /// Its lifetime is over: it settles error, kind `expired`.
    case expire
    /// Enqueued by another account than the current one: dropped.
    case dropOtherAccount(current: String)
    /// It may not be sent now (off Wi-Fi; its account is not the current one yet): it
    /// stays queued, held back until `until`, with the reason `list` and `explain` show.
    case holdBack(HoldReason, until: Int64)
    /// Its body cannot be sent: it settles error, kind `file`.
    case fileProblem(String)
}

/// The decisions for the entries read ahead, in queue order.
struct ClaimPlan: Equatable {
    /// The entries looked at, by position in the read-ahead, with what happens to each.
    var decisions: [(position: Int, decision: ClaimDecision)] = []
    /// How many entries from the front were looked at.
    var taken = 0

    /// Positions that keep their place in the read-ahead.
    var held: [Int] { decisions.filter { $0.decision == .hold }.map(\.position) }

    static func == (a: ClaimPlan, b: ClaimPlan) -> Bool {
        a.taken == b.taken && a.decisions.elementsEqual(b.decisions) { $0.position == $1.position && $0.decision == $1.decision }
    }
}

/// What a chunked entry does next.
enum PartDecision: Equatable {
    /// Every part was accepted: the entry settles completed.
    case complete
    /// Its lifetime ended before every part was accepted.
    case expire
    /// Its file cannot be sent.
    case fileProblem(String)
    /// No part may start now (a pause, a hold) and none is in flight: the entry gives its slot back.
    case stop(PartStop)
    /// Start these parts (by index, in order); then, when every slot waits for a retry,
    /// give the entry's slot back until `giveBackUntil`.
    case send(parts: [Int], giveBackUntil: Int64?)
}

/// Why a running chunked entry starts no more parts; parts in flight finish, and their
/// acceptance is kept.
enum PartStop: Equatable {
    /// Its key or the queue was paused: it goes back to the queue (shown paused).
    case paused
    /// Off Wi-Fi: it waits in the queue until `until`.
    case held(HoldReason, until: Int64)
}

/// Decides which entries and parts go now. A pure value: it reads the queue as the
/// runner holds it, the slots and an injected clock, and returns decisions; the runner
/// carries them out (transfers, store changes, events).
///
/// Rules, each with its table test in SchedulerTests:
/// - at most `concurrency` entries hold a slot, and at most `limits.standby` more wait as
///   standby transfers that the curl thread starts the moment a slot frees;
/// - at most `per_host` transfers to one host, and `limits.standbyPerHost` standby transfers per host;
/// - a chunked entry needs a free slot (it never waits as standby); its parts are scheduled
///   within `part_concurrency` and `per_host`, and a part waiting for its retry keeps its slot;
/// - an entry expiring within 10 minutes only takes a free slot: a standby request starts
///   later than the expiry check before it;
/// - a paused queue or key, a busy scope, another account, Wi-Fi, an expired entry and a
///   missing or changed file are decided at the claim, before anything is sent;
/// - a held entry keeps its place; a few entries beyond the free slots are looked at, so
///   entries held by `per_host` do not starve the rest.
struct Scheduler {
    let limits: SchedulerLimits

    /// An entry whose expiry is nearer than this only takes a free slot.
    static let standbyExpiryMarginMs: Int64 = 600_000
    /// How long an entry waiting for its account stays out of the queue before it is looked at again.
    static let accountRecheckMs: Int64 = 30_000
    /// How long an entry for a held host waits while its probe is in flight; the probe's end
    /// looks at it again sooner.
    static let probeRecheckMs: Int64 = 60_000

    /// Decides the entries at the front of `ready`, updating `slots` for those that start.
    func claims(_ ready: ArraySlice<Entry>, slots: inout SlotState, checks: ClaimChecks) -> ClaimPlan {
        var plan = ClaimPlan()
        var free = limits.concurrency - slots.entriesInFlight
        var standbyFree = checks.standbyAllowed ? limits.standby - slots.standby : 0
        let capacity = free + standbyFree
        guard capacity > 0 else { return plan }
        var wifi: Bool?
        var scopes = checks.busyScopes
        // Held hosts whose probe this plan starts (a chunked entry adds no load until its parts start).
        var probing: Set<String> = []
        for (position, entry) in zip(ready.indices, ready) {
            guard free + standbyFree > 0, plan.taken < capacity + 2 else { break }
            plan.taken += 1
            let decision = decide(
                entry, free: free, standbyFree: standbyFree, slots: slots, scopes: scopes, probing: probing, checks: checks,
                wifi: &wifi)
            plan.decisions.append((position, decision))
            guard case let .start(host, standby) = decision else { continue }
            if let scope = entry.scope { scopes.insert(scope) }
            if checks.heldHosts[host] != nil { probing.insert(host) }
            if standby {
                standbyFree -= 1
                slots.standby += 1
                slots.hostStandby[host, default: 0] += 1
            } else {
                free -= 1
                slots.entriesInFlight += 1
                // Parts are counted per host as they start.
                if !entry.isChunked { slots.hostLoad[host, default: 0] += 1 }
            }
        }
        return plan
    }

    private func decide(
        _ entry: Entry, free: Int, standbyFree: Int, slots: SlotState, scopes: Set<String>, probing: Set<String>,
        checks: ClaimChecks, wifi: inout Bool?
    ) -> ClaimDecision {
        if checks.control.isPaused(key: entry.key) { return .paused }
        if let scope = entry.scope, scopes.contains(scope) { return .hold }
        // Where it would go first: the checks below (a stat of the file, among others) run
        // only for an entry that leaves the queue now, not for each one that waits.
        let host = URLCheck.hostKey(entry.request.url ?? "")
        // A held host gets one probe at a time, in a free slot once its backoff is over: the
        // others wait out of the read-ahead, no attempt spent, and are looked at again when
        // the probe ends.
        if let probeAt = checks.heldHosts[host] {
            if Expiry.isExpired(now: checks.now, createdAt: entry.createdAt, expiresAt: entry.expiresAt) { return .expire }
            let inFlight = probing.contains(host) || slots.hostLoad[host, default: 0] + slots.hostStandby[host, default: 0] > 0
            if inFlight || checks.now < probeAt {
                let until = inFlight ? checks.now + Self.probeRecheckMs : probeAt
                return .holdBack(.host, until: min(until, entry.expiresAt ?? .max))
            }
            guard free > 0 else { return .hold }
        }
        let standby: Bool
        if entry.isChunked {
            guard free > 0 else { return .hold }
            standby = false
        } else if free > 0, slots.hostLoad[host, default: 0] < limits.perHost {
            standby = false
        } else if standbyFree > 0, slots.hostStandby[host, default: 0] < limits.standbyPerHost,
            Self.mayWaitAsStandby(entry, now: checks.now)
        {
            standby = true
        } else {
            return .hold
        }
        if Expiry.isExpired(now: checks.now, createdAt: entry.createdAt, expiresAt: entry.expiresAt) { return .expire }
        if let account = entry.account {
            // Sent only while its own account is current; with none yet it waits, it is not lost.
            guard let current = checks.currentAccount else { return .holdBack(.account, until: checks.now + Self.accountRecheckMs) }
            if account != current { return .dropOtherAccount(current: current) }
        }
        if entry.request.wifiOnly ?? checks.control.wifiOnly {
            if wifi == nil { wifi = checks.onWifi() }
            if wifi == false { return .holdBack(.wifi, until: max(checks.now + 1, checks.wifiRecheckAt)) }
        }
        if let problem = checks.payloadProblem(entry) { return .fileProblem(problem) }
        return .start(host: host, standby: standby)
    }

    /// Whether an entry's request may wait on the curl thread: expiry is checked before each
    /// attempt, and a standby request starts later than that check. (A referenced file is
    /// checked again by the curl thread when it opens the file.)
    static func mayWaitAsStandby(_ entry: Entry, now: Int64) -> Bool {
        entry.expiresAt.map { $0 - now > standbyExpiryMarginMs } ?? true
    }

    /// Standby transfers to start now in free slots, oldest first, within `per_host`;
    /// `slots` moves each from standby to started.
    func promotions(_ standby: [(transferID: UInt64, host: String)], slots: inout SlotState) -> [UInt64] {
        var free = limits.concurrency - slots.entriesInFlight
        var promoted: [UInt64] = []
        for (transferID, host) in standby.sorted(by: { $0.transferID < $1.transferID }) where free > 0 {
            guard slots.hostLoad[host, default: 0] < limits.perHost else { continue }
            Self.standbyStarted(host: host, slots: &slots)
            promoted.append(transferID)
            free -= 1
        }
        return promoted
    }

    /// A standby transfer started (promoted, or by the curl thread in a slot that freed).
    static func standbyStarted(host: String, slots: inout SlotState) {
        slots.standby -= 1
        slots.entriesInFlight += 1
        slots.hostStandby[host, default: 1] -= 1
        slots.hostLoad[host, default: 0] += 1
    }

    /// What a running chunked entry does next. Parts are tried in order, so parts due for
    /// a retry come before untried ones; a part waiting for its retry keeps its slot, as a
    /// retry in place would: when the server is down, `part_concurrency` parts fail and
    /// wait, not every part once.
    func nextParts(
        of entry: Entry, parts: [StoredPart], inFlight: Set<Int>, hostLoad: [String: Int], now: Int64,
        stop: PartStop? = nil, heldHosts: [String: Int64] = [:], payloadProblem: () -> String?
    ) -> PartDecision {
        let pending = parts.filter { !$0.accepted && !inFlight.contains($0.index) }
        if pending.isEmpty && inFlight.isEmpty { return .complete }
        if Expiry.isExpired(now: now, createdAt: entry.createdAt, expiresAt: entry.expiresAt) { return .expire }
        if let stop { return inFlight.isEmpty ? .stop(stop) : .send(parts: [], giveBackUntil: nil) }
        let due = pending.filter { ($0.nextAttemptAt ?? 0) <= now }
        let waiting = pending.count - due.count
        var free = limits.partConcurrency - inFlight.count - waiting
        // Checked before each attempt, as for a whole body.
        if !due.isEmpty && free > 0, let problem = payloadProblem() { return .fileProblem(problem) }
        var load = hostLoad
        var start: [Int] = []
        for part in due where free > 0 {
            let host = URLCheck.hostKey(part.url)
            if load[host, default: 0] >= limits.perHost { continue }
            // A held host: one part at a time, the probe.
            if heldHosts[host] != nil && load[host, default: 0] > 0 { continue }
            load[host, default: 0] += 1
            start.append(part.index)
            free -= 1
        }
        var giveBack: Int64?
        if inFlight.isEmpty && start.isEmpty && (due.isEmpty || free <= 0) {
            giveBack = pending.compactMap(\.nextAttemptAt).filter { $0 > now }.min()
        }
        return .send(parts: start, giveBackUntil: giveBack)
    }

    /// Whether `run --drain` is done. The horizon is fixed when the drain starts, so retries
    /// and delays cannot keep a drain going forever; work never tried that is due now
    /// (follow-ups and outcomes this run created) is still done.
    static func drainIsOver(due: DueTimes, now: Int64, horizonEnd: Int64) -> Bool {
        if let fresh = due.fresh, fresh <= now { return false }
        guard let any = due.any else { return true }
        return any > horizonEnd
    }
}

/// The Wi-Fi check, asked at most once per interval for the whole queue: a check can be a
/// plugin process, and a queue of held entries must not start one per entry per turn.
struct WifiGate: Equatable {
    let intervalMs: Int64
    private(set) var checkedAt: Int64?
    private(set) var onWifi = false
    /// A check plugin runs beside the control thread (since then, wall ms): its answer comes
    /// with `answered`; until then the last answer stands (off Wi-Fi before the first).
    private(set) var checkingSince: Int64?

    init(intervalMs: Int64) { self.intervalMs = intervalMs }

    /// The last answer while it is younger than the interval, or a new one from `check`.
    mutating func isOnWifi(now: Int64, check: () -> Bool) -> Bool {
        if isFresh(now: now) { return onWifi }
        onWifi = check()
        checkedAt = now
        return onWifi
    }

    /// The last answer; once it is older than the interval `start` begins a check that answers
    /// later (`answered`), unless one runs already.
    mutating func isOnWifi(now: Int64, startingCheck start: () -> Void) -> Bool {
        if !isFresh(now: now) && checkingSince == nil {
            checkingSince = now
            start()
        }
        return onWifi
    }

    mutating func answered(_ on: Bool, now: Int64) {
        onWifi = on
        checkedAt = now
        checkingSince = nil
    }

    private func isFresh(now: Int64) -> Bool {
        guard let checkedAt else { return false }
        return now - checkedAt < intervalMs && now >= checkedAt
    }

    /// When the next check may run. Entries held while a check runs wait an interval, unless its
    /// answer says on Wi-Fi (then the runner lets them go at once).
    func nextCheck(now: Int64) -> Int64 {
        if let checkingSince { return max(now, checkingSince + intervalMs) }
        return checkedAt.map { max(now, $0 + intervalMs) } ?? now
    }
}

/// Consecutive connection failures per host, and the hosts held because of them: while a
/// host is down, one request at a time probes it, spaced by the backoff of the probe's
/// entry; the other entries for it wait without spending attempts; the first answer
/// releases them all.
struct HostHealth: Equatable {
    /// Changed by a reload; hosts held already stay held until they answer.
    var holdAfter: Int
    private(set) var failures: [String: Int] = [:]
    /// Held hosts, with when the next probe may start.
    private(set) var held: [String: Int64] = [:]

    init(holdAfter: Int) { self.holdAfter = holdAfter }

    enum Change: Equatable {
        case held(String, failures: Int)
        case probeFailed(String, nextProbeAt: Int64)
        case released(String)
    }

    /// Records one attempt's result: `answered` when any HTTP status came back,
    /// `connectionFailed` when none did because the host could not be reached. `now`,
    /// `backoff` and `random` space the probes of a held host; `random` is drawn only then (it
    /// cost every request a `getrandom` call).
    mutating func record(
        host: String, answered: Bool, connectionFailed: Bool, now: Int64, backoff: BackoffPolicy,
        random: @autoclosure () -> Double
    ) -> Change? {
        if answered {
            failures[host] = nil
            return held.removeValue(forKey: host) != nil ? .released(host) : nil
        }
        guard connectionFailed, holdAfter > 0 else { return nil }
        let count = failures[host, default: 0] + 1
        failures[host] = count
        guard count >= holdAfter else { return nil }
        let next = now + Backoff.delay(failures: count - holdAfter + 1, policy: backoff, random: random())
        let wasHeld = held[host] != nil
        held[host] = next
        return wasHeld ? .probeFailed(host, nextProbeAt: next) : .held(host, failures: count)
    }
}
