import OutboxModel
@testable import OutboxRunner
import OutboxStore
import Testing

/// The scheduler's rules, one table row each: which entries leave the queue, into which
/// slot, and which wait (and why).
struct SchedulerTests {
    struct ClaimCase: Sendable, CustomTestStringConvertible {
        let name: String
        var concurrency = 2
        var perHost = 8
        var inFlight = 0
        var standby = 0
        var hostLoad: [String: Int] = [:]
        var control = QueueControl()
        var account: String?
        var busyScopes: Set<String> = []
        var onWifi = true
        var wifiRecheckAt: Int64 = 0
        var heldHosts: [String: Int64] = [:]
        var fileProblems: [String: String] = [:]
        let entries: [Entry]
        /// One decision per entry looked at, in queue order.
        let expected: [ClaimDecision]
        var testDescription: String { name }
    }

    static let a = "a.example"
    static let b = "b.example"

    static let claimCases: [ClaimCase] = [
        ClaimCase(
            name: "free slots first, then standby, then nothing",
            entries: (1...5).map { Sample.entry("e\($0)") },
            expected: [
                .start(host: a, standby: false), .start(host: a, standby: false),
                .start(host: a, standby: true), .start(host: a, standby: true),
            ]),
        ClaimCase(
            name: "per_host sends the next host's entry first; a held entry keeps its place",
            concurrency: 4, perHost: 1,
            entries: [Sample.entry("a1"), Sample.entry("a2"), Sample.entry("a3"), Sample.entry("b1", host: b)],
            expected: [.start(host: a, standby: false), .start(host: a, standby: true), .hold, .start(host: b, standby: false)]),
        ClaimCase(
            name: "at most capacity + 2 entries are looked at", perHost: 1,
            entries: (1...6).map { Sample.entry("a\($0)") } + [Sample.entry("b1", host: b)],
            expected: [.start(host: a, standby: false), .start(host: a, standby: true), .hold, .hold, .hold, .hold]),
        ClaimCase(
            name: "no free slot and no standby slot: nothing is looked at", concurrency: 1, inFlight: 1, standby: 1,
            entries: [Sample.entry("e1")], expected: []),
        ClaimCase(
            name: "a host at per_host in flight waits as standby", concurrency: 4, perHost: 2, hostLoad: [a: 2],
            entries: [Sample.entry("e1")], expected: [.start(host: a, standby: true)]),
        ClaimCase(
            name: "a chunked entry needs a free slot, never standby", concurrency: 1, inFlight: 1,
            entries: [Sample.entry("c1", chunked: true), Sample.entry("p1")],
            expected: [.hold, .start(host: a, standby: true)]),
        ClaimCase(
            name: "a chunked entry takes a slot whatever its host's load", concurrency: 2, perHost: 1, hostLoad: [a: 1],
            entries: [Sample.entry("c1", chunked: true)], expected: [.start(host: a, standby: false)]),
        ClaimCase(
            name: "an entry expiring within 10 minutes only takes a free slot", concurrency: 1, inFlight: 1,
            entries: [Sample.entry("soon", expiresIn: 300_000), Sample.entry("later", expiresIn: 1_200_000)],
            expected: [.hold, .start(host: a, standby: true)]),
        ClaimCase(
            name: "an expired entry settles instead of starting",
            entries: [Sample.entry("old", expiresIn: -1), Sample.entry("fresh")],
            expected: [.expire, .start(host: a, standby: false)]),
        ClaimCase(
            name: "a clock behind the entry's creation never expires it",
            entries: [Sample.entry("future", expiresIn: -1, createdAt: Sample.now + 60_000)],
            expected: [.start(host: a, standby: false)]),
        ClaimCase(
            name: "another account's entry is dropped", account: "alice",
            entries: [Sample.entry("e1", account: "bob"), Sample.entry("e2", account: "alice")],
            expected: [.dropOtherAccount(current: "alice"), .start(host: a, standby: false)]),
        ClaimCase(
            name: "with no current account, an account's entry waits and others go",
            entries: [Sample.entry("e1", account: "bob"), Sample.entry("e2")],
            expected: [.holdBack(.account, until: Sample.now + 30_000), .start(host: a, standby: false)]),
        ClaimCase(
            name: "a wifi-only entry waits off Wi-Fi until the next check; others go", onWifi: false, wifiRecheckAt: Sample.now + 5_000,
            entries: [Sample.entry("w", wifiOnly: true), Sample.entry("any")],
            expected: [.holdBack(.wifi, until: Sample.now + 5_000), .start(host: a, standby: false)]),
        ClaimCase(
            name: "the queue's wifi-only applies unless the entry says otherwise",
            control: QueueControl(wifiOnly: true), onWifi: false,
            entries: [Sample.entry("inherits"), Sample.entry("own", wifiOnly: false)],
            expected: [.holdBack(.wifi, until: Sample.now + 1), .start(host: a, standby: false)]),
        ClaimCase(
            name: "on Wi-Fi a wifi-only entry goes", entries: [Sample.entry("w", wifiOnly: true)],
            expected: [.start(host: a, standby: false)]),
        ClaimCase(
            name: "a missing or changed file settles error", fileProblems: ["f": "the staged payload /x is missing"],
            entries: [Sample.entry("f"), Sample.entry("ok")],
            expected: [.fileProblem("the staged payload /x is missing"), .start(host: a, standby: false)]),
        ClaimCase(
            name: "a paused key stays queued; other keys go", control: QueueControl(pausedKeys: ["p"]),
            entries: [Sample.entry("e1", key: "p"), Sample.entry("e2", key: "q")],
            expected: [.paused, .start(host: a, standby: false)]),
        ClaimCase(
            name: "a paused queue sends nothing", control: QueueControl(queuePaused: true),
            entries: [Sample.entry("e1"), Sample.entry("e2")], expected: [.paused, .paused]),
        ClaimCase(
            name: "a scope with an entry held here waits", busyScopes: ["s"],
            entries: [Sample.entry("s2", scope: "s"), Sample.entry("t1", scope: "t")],
            expected: [.hold, .start(host: a, standby: false)]),
        ClaimCase(
            name: "a held host whose probe is due sends one entry; the others wait for it, other hosts go",
            concurrency: 4, heldHosts: [a: Sample.now],
            entries: [Sample.entry("a1"), Sample.entry("a2"), Sample.entry("b1", host: b)],
            expected: [
                .start(host: a, standby: false), .holdBack(.host, until: Sample.now + 60_000), .start(host: b, standby: false),
            ]),
        ClaimCase(
            name: "a held host's entries wait for its next probe, no attempt spent", heldHosts: [a: Sample.now + 4_000],
            entries: [Sample.entry("a1"), Sample.entry("a2", expiresIn: 1_000)],
            expected: [.holdBack(.host, until: Sample.now + 4_000), .holdBack(.host, until: Sample.now + 1_000)]),
        ClaimCase(
            name: "a held host with a request in flight: the probe is that request", hostLoad: [a: 1], heldHosts: [a: Sample.now],
            entries: [Sample.entry("a1")], expected: [.holdBack(.host, until: Sample.now + 60_000)]),
        ClaimCase(
            name: "a held host's probe needs a free slot, never standby", concurrency: 1, inFlight: 1, heldHosts: [a: Sample.now],
            entries: [Sample.entry("a1"), Sample.entry("b1", host: b)], expected: [.hold, .start(host: b, standby: true)]),
        ClaimCase(
            name: "a held host's probe may be a chunked entry: then it is the only one", concurrency: 4, heldHosts: [a: Sample.now],
            entries: [Sample.entry("c1", chunked: true), Sample.entry("c2", chunked: true), Sample.entry("a1")],
            expected: [
                .start(host: a, standby: false), .holdBack(.host, until: Sample.now + 60_000), .holdBack(.host, until: Sample.now + 60_000),
            ]),
        ClaimCase(
            name: "an expired entry of a held host settles", heldHosts: [a: Sample.now + 4_000],
            entries: [Sample.entry("a1", expiresIn: -1)], expected: [.expire]),
        ClaimCase(
            name: "two entries of one scope: only the first goes",
            entries: [Sample.entry("s1", scope: "s"), Sample.entry("s2", scope: "s")],
            expected: [.start(host: a, standby: false), .hold]),
    ]

    @Test(arguments: claimCases)
    func claims(_ c: ClaimCase) {
        let scheduler = Scheduler(limits: SchedulerLimits(concurrency: c.concurrency, perHost: c.perHost, partConcurrency: 2))
        var slots = SlotState(entriesInFlight: c.inFlight, standby: c.standby, hostLoad: c.hostLoad)
        var checks = ClaimChecks(now: Sample.now, control: c.control, currentAccount: c.account, busyScopes: c.busyScopes)
        checks.onWifi = { c.onWifi }
        checks.wifiRecheckAt = c.wifiRecheckAt
        checks.heldHosts = c.heldHosts
        checks.payloadProblem = { c.fileProblems[$0.id] }
        let plan = scheduler.claims(ArraySlice(c.entries), slots: &slots, checks: checks)
        #expect(plan.decisions.map(\.decision) == c.expected)
        #expect(plan.decisions.map(\.position) == Array(c.expected.indices))
        #expect(plan.taken == c.expected.count)
    }

    @Test func slotsCountWhatStarts() {
        let scheduler = Scheduler(limits: SchedulerLimits(concurrency: 2, perHost: 8, partConcurrency: 2))
        var slots = SlotState()
        let entries = [Sample.entry("e1"), Sample.entry("c1", host: Self.b, chunked: true), Sample.entry("e2"), Sample.entry("e3")]
        _ = scheduler.claims(ArraySlice(entries), slots: &slots, checks: ClaimChecks(now: Sample.now))
        // A chunked entry holds a slot; its parts are counted per host as they start.
        #expect(slots == SlotState(entriesInFlight: 2, standby: 2, hostLoad: [Self.a: 1], hostStandby: [Self.a: 2]))
    }

    @Test func standbyPerSlotDeepensTheStandbyInAllAndPerHost() {
        // Three per slot: 2 slots take 6 standby transfers; one host's share is 3 × per_host.
        let scheduler = Scheduler(limits: SchedulerLimits(concurrency: 2, perHost: 1, partConcurrency: 2, standbyPerSlot: 3))
        var slots = SlotState()
        let entries = (1...4).map { Sample.entry("a\($0)") } + (1...4).map { Sample.entry("b\($0)", host: Self.b) }
        let plan = scheduler.claims(ArraySlice(entries), slots: &slots, checks: ClaimChecks(now: Sample.now))
        let a = Self.a
        let b = Self.b
        #expect(
            plan.decisions.map(\.decision) == [
                .start(host: a, standby: false), .start(host: a, standby: true), .start(host: a, standby: true),
                .start(host: a, standby: true), .start(host: b, standby: false), .start(host: b, standby: true),
                .start(host: b, standby: true), .start(host: b, standby: true),
            ])
        #expect(slots == SlotState(entriesInFlight: 2, standby: 6, hostLoad: [a: 1, b: 1], hostStandby: [a: 3, b: 3]))
        // With one per slot (a store several runners share), the same queue gives 2.
        var shared = SlotState()
        let one = Scheduler(limits: SchedulerLimits(concurrency: 2, perHost: 1, partConcurrency: 2))
        let sharedPlan = one.claims(ArraySlice(entries), slots: &shared, checks: ClaimChecks(now: Sample.now))
        #expect(sharedPlan.decisions.filter { $0.decision == .start(host: a, standby: true) }.count == 1)
        #expect(shared.standby == 2)
    }

    @Test func aRunnerAloneOnItsStoreKeepsThreeStandbyPerSlotAndOneOnAShared() {
        var config = Config(root: "/p")
        config.concurrency = 5
        config.perHost = 2
        let alone = Runner.limits(config, concurrency: config.concurrency, sharedStore: false)
        #expect((alone.standby, alone.standbyPerHost) == (15, 6))
        let shared = Runner.limits(config, concurrency: config.concurrency, sharedStore: true)
        #expect((shared.standby, shared.standbyPerHost) == (5, 2))
    }

    /// What an open-files limit leaves: everything the config asks while it fits; then the
    /// entries first and the hooks what is left; below that hooks take at most a quarter, and
    /// each entry its transfers' sockets and files (`part_concurrency` of them) and a cached
    /// connection.
    @Test(arguments: [
        (0, 1024, 32, 1, 1024, 32, 2048),  // the limit unknown: as configured
        (20000, 1024, 32, 1, 1024, 32, 2048),
        (1024, 16, 32, 1, 16, 32, 32),
        (1024, 16, 256, 1, 16, 224, 32),
        (1024, 1024, 32, 1, 277, 32, 278),
        (1024, 1024, 32, 3, 118, 32, 124),
        (90, 64, 64, 1, 7, 1, 8),
        (90, 64, 64, 3, 3, 1, 4),
        (48, 64, 64, 1, 1, 1, 4),
    ])
    func theOpenFilesLimitBoundsWhatRunsAtOnce(
        limit: Int, concurrency: Int, hooks: Int, parts: Int, entries: Int, hooksRun: Int, cache: Int
    ) {
        let budget = OpenFilesBudget(limit: limit, concurrency: concurrency, hookConcurrency: hooks, partConcurrency: parts)
        #expect((budget.concurrency, budget.hookConcurrency, budget.connectionCache) == (entries, hooksRun, cache))
        // Whatever was lowered fits the limit, once the limit holds the reserve and one of each.
        let floor = OpenFilesBudget.reserved + OpenFilesBudget.perHook + 2 * parts + 4
        if limit >= floor, entries < concurrency || hooksRun < hooks {
            #expect(OpenFilesBudget.reserved + hooksRun * OpenFilesBudget.perHook + entries * 2 * parts + cache <= limit)
        }
    }

    @Test func theWifiCheckRunsOncePerPlan() {
        let scheduler = Scheduler(limits: SchedulerLimits(concurrency: 8, perHost: 8, partConcurrency: 2))
        var slots = SlotState()
        var checks = ClaimChecks(now: Sample.now)
        var asked = 0
        checks.onWifi = {
            asked += 1; return false
        }
        let entries = (1...5).map { Sample.entry("w\($0)", wifiOnly: true) }
        let plan = scheduler.claims(ArraySlice(entries), slots: &slots, checks: checks)
        #expect(plan.decisions.count == 5)
        #expect(asked == 1)
    }

    @Test func heldEntriesAreNeitherCheckedNorCounted() {
        let scheduler = Scheduler(limits: SchedulerLimits(concurrency: 1, perHost: 8, partConcurrency: 2))
        var slots = SlotState(entriesInFlight: 1)
        var checks = ClaimChecks(now: Sample.now)
        var checked: [String] = []
        checks.payloadProblem = {
            checked.append($0.id); return nil
        }
        // The chunked entry is held (no free slot): its file is not looked at.
        let plan = scheduler.claims(ArraySlice([Sample.entry("c", chunked: true), Sample.entry("p")]), slots: &slots, checks: checks)
        #expect(plan.held == [0])
        #expect(checked == ["p"])
    }

    // MARK: Standby promotion

    struct PromotionCase: Sendable, CustomTestStringConvertible {
        let name: String
        var concurrency = 2
        var inFlight = 1
        var hostLoad: [String: Int] = [:]
        let standby: [(transferID: UInt64, host: String)]
        let expected: [UInt64]
        var testDescription: String { name }
    }

    static let promotionCases: [PromotionCase] = [
        PromotionCase(name: "oldest first into the free slot", standby: [(3, a), (1, b), (2, a)], expected: [1]),
        PromotionCase(name: "a host at per_host is skipped", hostLoad: [b: 8], standby: [(1, b), (2, a)], expected: [2]),
        PromotionCase(name: "no free slot, no promotion", inFlight: 2, standby: [(1, a)], expected: []),
        PromotionCase(name: "several free slots", concurrency: 4, inFlight: 0, standby: [(2, a), (1, a), (3, b)], expected: [1, 2, 3]),
    ]

    @Test(arguments: promotionCases)
    func promotions(_ c: PromotionCase) {
        let scheduler = Scheduler(limits: SchedulerLimits(concurrency: c.concurrency, perHost: 8, partConcurrency: 2))
        var hostStandby: [String: Int] = [:]
        for (_, host) in c.standby { hostStandby[host, default: 0] += 1 }
        var slots = SlotState(entriesInFlight: c.inFlight, standby: c.standby.count, hostLoad: c.hostLoad, hostStandby: hostStandby)
        #expect(scheduler.promotions(c.standby, slots: &slots) == c.expected)
        #expect(slots.standby == c.standby.count - c.expected.count)
        #expect(slots.entriesInFlight == c.inFlight + c.expected.count)
    }

    // MARK: Parts

    struct PartCase: Sendable, CustomTestStringConvertible {
        let name: String
        var partConcurrency = 2
        var perHost = 8
        var hostLoad: [String: Int] = [:]
        var expiresIn: Int64?
        var fileProblem: String?
        var stop: PartStop?
        var heldHosts: [String: Int64] = [:]
        let parts: [StoredPart]
        var inFlight: Set<Int> = []
        let expected: PartDecision
        var testDescription: String { name }
    }

    static let partCases: [PartCase] = [
        PartCase(
            name: "every part accepted: complete", parts: [Sample.part(0, accepted: true), Sample.part(1, accepted: true)],
            expected: .complete),
        PartCase(
            name: "accepted but one still in flight: wait", parts: [Sample.part(0, accepted: true), Sample.part(1)], inFlight: [1],
            expected: .send(parts: [], giveBackUntil: nil)),
        PartCase(
            name: "parts start in order within part_concurrency", parts: (0..<5).map { Sample.part($0) },
            expected: .send(parts: [0, 1], giveBackUntil: nil)),
        PartCase(
            name: "parts in flight take part_concurrency slots", parts: (0..<5).map { Sample.part($0) }, inFlight: [0],
            expected: .send(parts: [1], giveBackUntil: nil)),
        PartCase(
            name: "a part waiting for its retry keeps its slot",
            parts: [Sample.part(0, retryIn: 500)] + (1..<5).map { Sample.part($0) },
            expected: .send(parts: [1], giveBackUntil: nil)),
        PartCase(
            name: "a part due for its retry is sent like an untried one, in index order",
            parts: [Sample.part(0, accepted: true), Sample.part(1), Sample.part(2, retryIn: -1)],
            expected: .send(parts: [1, 2], giveBackUntil: nil)),
        PartCase(
            name: "every slot waits for a retry: give the slot back until the earliest",
            parts: [Sample.part(0, retryIn: 500), Sample.part(1, retryIn: 300), Sample.part(2)],
            expected: .send(parts: [], giveBackUntil: Sample.now + 300)),
        PartCase(
            name: "per_host limits the parts started", perHost: 3, hostLoad: ["a.example": 2], parts: (0..<4).map { Sample.part($0) },
            expected: .send(parts: [0], giveBackUntil: nil)),
        PartCase(
            name: "per_host full: nothing starts, the slot is kept", perHost: 1, hostLoad: ["a.example": 1],
            parts: [Sample.part(0)], expected: .send(parts: [], giveBackUntil: nil)),
        PartCase(name: "expired before every part was accepted", expiresIn: -1, parts: [Sample.part(0)], expected: .expire),
        PartCase(
            name: "the file is checked before a part is sent", fileProblem: "changed", parts: [Sample.part(0)],
            expected: .fileProblem("changed")),
        PartCase(
            name: "paused: no new part starts while parts are in flight", stop: .paused, parts: (0..<3).map { Sample.part($0) },
            inFlight: [0], expected: .send(parts: [], giveBackUntil: nil)),
        PartCase(
            name: "paused and nothing in flight: the entry stops", stop: .paused, parts: [Sample.part(0, accepted: true), Sample.part(1)],
            expected: .stop(.paused)),
        PartCase(
            name: "off Wi-Fi between parts: the entry waits for the next check",
            stop: .held(.wifi, until: Sample.now + 30_000), parts: [Sample.part(0, accepted: true), Sample.part(1)],
            expected: .stop(.held(.wifi, until: Sample.now + 30_000))),
        PartCase(
            name: "a held host takes one part at a time", heldHosts: ["a.example": Sample.now], parts: (0..<3).map { Sample.part($0) },
            expected: .send(parts: [0], giveBackUntil: nil)),
        PartCase(
            name: "a held host with a part in flight starts no other", hostLoad: ["a.example": 1],
            heldHosts: ["a.example": Sample.now], parts: (0..<3).map { Sample.part($0) }, inFlight: [0],
            expected: .send(parts: [], giveBackUntil: nil)),
        PartCase(
            name: "a stop does not hold back a finished upload", stop: .paused, parts: [Sample.part(0, accepted: true)],
            expected: .complete),
        PartCase(
            name: "the file is not checked when no part is due", fileProblem: "changed", parts: [Sample.part(0, retryIn: 100)],
            expected: .send(parts: [], giveBackUntil: Sample.now + 100)),
    ]

    @Test(arguments: partCases)
    func nextParts(_ c: PartCase) {
        let scheduler = Scheduler(limits: SchedulerLimits(concurrency: 4, perHost: c.perHost, partConcurrency: c.partConcurrency))
        let entry = Sample.entry("c", chunked: true, expiresIn: c.expiresIn)
        let decision = scheduler.nextParts(
            of: entry, parts: c.parts, inFlight: c.inFlight, hostLoad: c.hostLoad, now: Sample.now,
            stop: c.stop, heldHosts: c.heldHosts, payloadProblem: { c.fileProblem })
        #expect(decision == c.expected)
    }

    // MARK: Drain

    static let horizonEnd = Sample.now + 10_000

    @Test(
        arguments: [
            (DueTimes(any: nil, fresh: nil), Sample.now, true, "nothing due at all"),
            (DueTimes(any: Sample.now, fresh: nil), Sample.now, false, "a retry due now, within the horizon"),
            (DueTimes(any: horizonEnd, fresh: nil), Sample.now, false, "a retry due at the horizon"),
            (DueTimes(any: horizonEnd + 1, fresh: nil), Sample.now, true, "a retry due past the horizon"),
            (DueTimes(any: horizonEnd + 5, fresh: nil), horizonEnd + 10, true, "a retry due now, but past the horizon fixed at the start"),
            (DueTimes(any: horizonEnd + 5, fresh: horizonEnd + 5), horizonEnd + 10, false, "new work due now, created by this run"),
            (DueTimes(any: horizonEnd + 50, fresh: horizonEnd + 50), horizonEnd + 10, true, "new work due later, past the horizon"),
        ] as [(DueTimes, Int64, Bool, String)])
    func aDrainEndsAtAHorizonFixedWhenItStarts(due: DueTimes, now: Int64, over: Bool, _ label: String) {
        #expect(Scheduler.drainIsOver(due: due, now: now, horizonEnd: Self.horizonEnd) == over, "\(label)")
    }

    // MARK: Host health

    @Test func aHostIsHeldAfterConsecutiveConnectionFailuresAndReleasedByItsFirstAnswer() {
        let policy = BackoffPolicy(baseMs: 1000, maxMs: 60_000, jitter: 0)
        var health = HostHealth(holdAfter: 3)
        func fail(_ host: String, at now: Int64) -> HostHealth.Change? {
            health.record(host: host, answered: false, connectionFailed: true, now: now, backoff: policy, random: 0.5)
        }
        #expect(fail("a", at: 0) == nil)
        #expect(fail("a", at: 0) == nil)
        // An HTTP answer, even an error status, starts the count again.
        #expect(health.record(host: "a", answered: true, connectionFailed: false, now: 0, backoff: policy, random: 0.5) == nil)
        #expect(fail("a", at: 10) == nil)
        #expect(fail("a", at: 10) == nil)
        // A failure that is not about reaching the host (a TLS or file problem) counts for nothing.
        #expect(health.record(host: "a", answered: false, connectionFailed: false, now: 10, backoff: policy, random: 0.5) == nil)
        #expect(fail("b", at: 10) == nil)
        #expect(fail("a", at: 10) == .held("a", failures: 3))
        #expect(health.held == ["a": 1010])
        // Each failed probe doubles the wait for the next one, as the entry's backoff would.
        #expect(fail("a", at: 2000) == .probeFailed("a", nextProbeAt: 4000))
        #expect(fail("a", at: 5000) == .probeFailed("a", nextProbeAt: 9000))
        #expect(
            health.record(host: "a", answered: true, connectionFailed: false, now: 9000, backoff: policy, random: 0.5) == .released("a"))
        #expect(health.held.isEmpty)
        #expect(fail("a", at: 9100) == nil)
    }

    @Test func holdAfterZeroNeverHoldsAHost() {
        var health = HostHealth(holdAfter: 0)
        for _ in 0..<50 {
            #expect(health.record(host: "a", answered: false, connectionFailed: true, now: 0, backoff: BackoffPolicy(), random: 0.5) == nil)
        }
        #expect(health.held.isEmpty)
    }

    // MARK: Wi-Fi gate

    /// A check plugin answers later: one starts when the answer is old, none while it runs,
    /// the last answer stands meanwhile, and entries held then wait an interval from its start.
    @Test func aWifiCheckBesideTheRunnerStartsOnceAndAnswersLater() {
        var gate = WifiGate(intervalMs: 30_000)
        var started = 0
        #expect(gate.isOnWifi(now: 100, startingCheck: { started += 1 }) == false)
        #expect(gate.isOnWifi(now: 200, startingCheck: { started += 1 }) == false)
        #expect(started == 1)
        #expect(gate.nextCheck(now: 200) == 30_100)
        gate.answered(true, now: 300)
        #expect(gate.isOnWifi(now: 400, startingCheck: { started += 1 }) == true)
        #expect(gate.nextCheck(now: 400) == 30_300)
        #expect(gate.isOnWifi(now: 30_300, startingCheck: { started += 1 }) == true, "the last answer stands while it runs")
        #expect(started == 2)
    }

    @Test func theWifiCheckRunsOncePerIntervalForTheWholeQueue() {
        var gate = WifiGate(intervalMs: 30_000)
        var checks = 0
        let answer = { () -> Bool in
            checks += 1; return false
        }
        #expect(gate.nextCheck(now: 100) == 100)
        #expect(gate.isOnWifi(now: 100, check: answer) == false)
        #expect(gate.isOnWifi(now: 29_999, check: answer) == false)
        #expect(checks == 1)
        #expect(gate.nextCheck(now: 200) == 30_100)
        #expect(
            gate.isOnWifi(
                now: 30_100,
                check: {
                    checks += 1; return true
                }) == true)
        #expect(checks == 2)
        // A clock that went back cannot keep an old answer forever.
        #expect(
            gate.isOnWifi(
                now: 50,
                check: {
                    checks += 1; return false
                }) == false)
        #expect(checks == 3)
    }
}
