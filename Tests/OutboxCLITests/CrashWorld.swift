import Digest
import Foundation
import OutboxModel
import Testing
import TestSupport

/// How an entry of a crash test must end once everything has run.
enum Ending: String, Sendable {
    /// Sent, its outcome acknowledged, forgotten.
    case completed
    /// Refused for good: listed as `error`, its outcome acknowledged, its bytes kept.
    case error
    /// Cancelled by the error of the entry ahead in its scope: outcome delivered, forgotten.
    case cancelledByScope
    /// Cancelled by `outbox cancel`: no outcome, forgotten.
    case cancelledByUser
}

/// A file of the user's that an entry sends.
struct UserFile: Sendable {
    var relative: String
    var bytes: [UInt8]
    var ownership: String
    var sha: String { SHA256.hex(bytes) }
}

/// One entry a crash test enqueued, or a follow-up it expects a runner to enqueue.
struct Planned: Sendable {
    var id: String
    var ending: Ending
    var file: UserFile?
    /// The server paths that carry the entry (one per part of a chunked upload), each with
    /// the body hash it must arrive with (nil: any body).
    var targets: [(path: String, sha: String?)]
    /// Answers the server gives before it accepts (a scripted 503 or 401).
    var refusals = 0
}

/// What was durable when a process was killed, and what the server had read by then.
struct KillSnapshot: Sendable {
    /// Requests the server had recorded once every connection of the dead process ended.
    var recordCount: Int
    /// Target paths the store had accepted for good (or settled: never to be sent again).
    var settled: Set<String>
}

/// An `outbox init` project with definitions that reach every crash point, the in-process
/// test server, and the bookkeeping that checks nothing was lost or received twice.
final class CrashWorld: @unchecked Sendable {
    let project: TestProject
    let server: TestHTTPServer
    private(set) var planned: [String: Planned] = [:]
    private(set) var kills: [KillSnapshot] = []

    /// The default `part_concurrency` (the project's config does not set it).
    static let partConcurrency = 3

    static let common = """
        retry:
          backoff: { base: 20ms, max: 100ms, jitter: 0.2 }
        on_success: hooks/log.sh
        on_error: hooks/log.sh

        """

    static let definitions: [String: String] = [
        "post": """
        key: post
        request:
          method: POST
          url: "{{ env.CRASH_BASE | raw }}/e/{{ entry.id }}"
          data: { n: "{{ vars.n }}" }

        """,
        "held": """
        key: held
        request:
          method: POST
          url: "{{ env.CRASH_BASE | raw }}/hold/crash/e/{{ entry.id }}"
          data: { n: "{{ vars.n }}" }

        """,
        "file-copy": fileDefinition("copy"),
        "file-move": fileDefinition("move"),
        "file-reference": fileDefinition("reference"),
        "chunked": """
        key: chunked
        request:
          method: PUT
          file: "{{ vars.path }}"
          parts:
            plan: { min: 64KiB, max: 256KiB }
            url: "{{ env.CRASH_BASE | raw }}/put/c/{{ entry.id }}/{{ part.number }}"

        """,
        "chain": """
        key: chain
        request:
          method: POST
          url: "{{ env.CRASH_BASE | raw }}/e/{{ entry.id }}"
          data: { n: 1 }
        then:
          on_success:
            - key: "file.{{ vars.ownership }}"
              id: "{{ entry.id }}-next"
              vars: { path: "{{ vars.path }}" }

        """,
        "scoped": """
        key: scoped
        request:
          method: PUT
          url: "{{ env.CRASH_BASE | raw }}/put/f/{{ entry.id }}"
          file: "{{ vars.path }}"
          ownership: move
        scope: "group-{{ vars.group }}"
        on_rejected: cancel-scope

        """,
    ]

    static func fileDefinition(_ ownership: String) -> String {
        """
        key: file.\(ownership)
        request:
          method: PUT
          url: "{{ env.CRASH_BASE | raw }}/put/f/{{ entry.id }}"
          file: "{{ vars.path }}"
          ownership: \(ownership)

        """
    }

    /// One line per delivery; with `block-first-delivery` present a first delivery never
    /// ends by itself, so a runner dies while its hook runs and the next one must stop it
    /// (its output goes nowhere: a write to the dead runner's pipe would end it by SIGPIPE).
    static let hook = """
        #!/bin/sh
        cat > /dev/null
        echo "$OUTBOX_ID $OUTBOX_GENERATION $OUTBOX_OUTCOME $OUTBOX_DELIVERIES" >> hook.log
        if [ -e block-first-delivery ] && [ "$OUTBOX_DELIVERIES" = 1 ]; then
          echo $$ >> blocked-hooks
          exec tail -f /dev/null > /dev/null 2>&1
        fi

        """

    private init(project: TestProject) throws {
        self.project = project
        server = try project.startServer()
        project.environment["CRASH_BASE"] = server.baseURL
    }

    /// A fresh project made by `outbox init`, plus the crash definitions and the logging hook.
    static func make(name: String = #function) async throws -> CrashWorld {
        let project = try TestProject(config: nil, name: name)
        project.remove("definitions")
        let world = try CrashWorld(project: project)
        let initialized = try await project.outbox(["init"])
        guard initialized.exitCode == 0 else { throw FixtureError("outbox init failed: \(initialized)") }
        for (name, yaml) in definitions { try project.write("definitions/\(name).yaml", yaml + common) }
        try project.writeHook("log.sh", hook)
        let checked = try await project.outbox(["check"])
        guard checked.exitCode == 0 else { throw FixtureError("outbox check failed: \(checked)") }
        return world
    }

    // MARK: Planning

    /// Deterministic bytes for a file of `size` bytes, different per `seed`.
    static func content(size: Int, seed: Int) -> [UInt8] {
        var state = UInt64(truncatingIfNeeded: seed) &* 0x9E37_79B9_7F4A_7C15 | 1
        return (0..<size).map { _ in
            state ^= state << 13
            state ^= state >> 7
            state ^= state << 17
            return UInt8(truncatingIfNeeded: state)
        }
    }

    /// Writes a user file under `data/` and returns it.
    func userFile(_ name: String, size: Int, ownership: String) throws -> UserFile {
        let seed = name.utf8.reduce(5381) { ($0 &* 33) &+ Int($1) }
        let file = UserFile(relative: "data/\(name)", bytes: Self.content(size: size, seed: seed), ownership: ownership)
        let path = project.path(file.relative)
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        guard FileManager.default.createFile(atPath: path, contents: Data(file.bytes)) else { throw FixtureError("cannot write \(path)") }
        return file
    }

    func plan(_ entry: Planned) { planned[entry.id] = entry }

    /// A small POST; `refusals` scripted answers (503, or 401 with `auth`) come before its 200.
    func post(_ id: String, refusals: Int = 0, auth: Bool = false) -> String {
        if refusals > 0 {
            let refusal = TestResponse.json(auth ? 401 : 503, #"{"refused":true}"#)
            server.script("/e/\(id)", Array(repeating: refusal, count: refusals) + [.json(200, #"{"ok":true}"#)])
        }
        plan(Planned(id: id, ending: .completed, targets: [("/e/\(id)", nil)], refusals: refusals))
        return #"{"id": "\#(id)", "vars": {"n": "\#(id)"}}"#
    }

    /// A POST the server holds at `crash` until the test releases it.
    func held(_ id: String) -> String {
        plan(Planned(id: id, ending: .completed, targets: [("/hold/crash/e/\(id)", nil)]))
        return #"{"id": "\#(id)", "vars": {"n": "\#(id)"}}"#
    }

    /// A whole-file PUT with this ownership.
    func file(_ id: String, size: Int, ownership: String) throws -> String {
        let file = try userFile("\(id).bin", size: size, ownership: ownership)
        plan(Planned(id: id, ending: .completed, file: file, targets: [("/put/f/\(id)", file.sha)]))
        return #"{"id": "\#(id)", "vars": {"path": "\#(file.relative)"}}"#
    }

    /// A moved file sent as parts of 256 KiB (`parts` of them).
    func chunked(_ id: String, parts: Int) throws -> String {
        let size = parts * 256 * 1024
        let file = try userFile("\(id).bin", size: size, ownership: "move")
        let targets = (0..<parts).map { n -> (String, String?) in
            ("/put/c/\(id)/\(n + 1)", SHA256.hex(Array(file.bytes[(n * 256 * 1024)..<((n + 1) * 256 * 1024)])))
        }
        plan(Planned(id: id, ending: .completed, file: file, targets: targets))
        return #"{"id": "\#(id)", "vars": {"path": "\#(file.relative)"}}"#
    }

    /// A POST whose success enqueues `ID-next`, a file of this ownership, in the settle's transaction.
    func chain(_ id: String, ownership: String = "copy") throws -> String {
        let file = try userFile("\(id)-next.bin", size: 3000, ownership: ownership)
        plan(Planned(id: id, ending: .completed, targets: [("/e/\(id)", nil)]))
        plan(Planned(id: "\(id)-next", ending: .completed, file: file, targets: [("/put/f/\(id)-next", file.sha)]))
        return #"{"id": "\#(id)", "vars": {"path": "\#(file.relative)", "ownership": "\#(ownership)"}}"#
    }

    /// A scope whose first entry is refused (422): the moved files behind it are cancelled
    /// with it and must come back to their source paths.
    func scope(_ group: String, behind: Int) throws -> [String] {
        var lines: [String] = []
        for n in 0...behind {
            let id = "\(group)-\(n)"
            let file = try userFile("\(id).bin", size: 2000 + n, ownership: "move")
            if n == 0 { server.script("/put/f/\(id)", [.json(422, #"{"refused":true}"#)]) }
            plan(Planned(id: id, ending: n == 0 ? .error : .cancelledByScope, file: file, targets: [("/put/f/\(id)", file.sha)]))
            lines.append(#"{"id": "\#(id)", "vars": {"path": "\#(file.relative)", "group": "\#(group)"}}"#)
        }
        return lines
    }

    /// Marks planned entries as cancelled by the user.
    func cancelledByUser(_ ids: [String]) { for id in ids { planned[id]?.ending = .cancelledByUser } }

    /// Writes JSON lines for `key` to a file; returns the arguments of `enqueue KEY --from FILE`.
    func batch(_ key: String, _ lines: [String]) throws -> [String] {
        try project.write("batch-\(key).jsonl", lines.joined(separator: "\n") + "\n")
        return ["enqueue", key, "--from", "batch-\(key).jsonl"]
    }

    // MARK: Kills

    /// Runs `outbox ARGS` with `OUTBOX_FAULT=point`; it must die by SIGKILL there.
    func runKilled(_ arguments: [String], at point: String, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let result = try await project.outbox(arguments, environment: ["OUTBOX_FAULT": point], timeout: 120)
        #expect(
            result.exitCode == -9, "\(arguments.joined(separator: " ")) must die by SIGKILL at \(point): \(result)",
            sourceLocation: sourceLocation)
        // Files first: any command that opens the store settles the move journals.
        try Self.filesAtKill(point, self)
        try await noteKill()
        try Self.storeAtKill(point, self)
    }

    /// Records what the store had made durable at a kill, once the server has read all
    /// the dead process sent.
    func noteKill() async throws {
        await eventually("the dead process's connections end") { server.openConnections == 0 }
        let count = server.requests.count
        kills.append(KillSnapshot(recordCount: count, settled: try settledTargets(recordedBefore: count)))
    }

    /// Target paths that must never be sent again: those of entries settled or forgotten
    /// (an entry that is not listed was forgotten if it had been enqueued: planned and not
    /// a follow-up, or seen by the server), and accepted parts.
    func settledTargets(recordedBefore count: Int) throws -> Set<String> {
        let rows = try listRows()
        let seen = Set(server.requests.prefix(count).map(\.path))
        var settled = Set<String>()
        for entry in planned.values {
            let state = rows[entry.id]
            let live = state == "queued" || state == "running" || state == "awaiting-auth" || state == "paused"
            if state == nil {
                guard entry.targets.contains(where: { seen.contains($0.path) }) else { continue }
                settled.formUnion(entry.targets.map(\.path))
            } else if !live {
                settled.formUnion(entry.targets.map(\.path))
            } else if entry.targets.count > 1 {
                let parts = try show(entry.id)["parts"]?.arrayValue ?? []
                for part in parts where part["accepted"]?.boolValue == true {
                    if let index = part["index"]?.int64Value { settled.insert("/put/c/\(entry.id)/\(index + 1)") }
                }
            }
        }
        return settled
    }

    // MARK: Reading the project

    /// `list --json` as id → state.
    func listRows() throws -> [String: String] {
        let result = project.run(["list", "--json"])
        guard result.exitCode == 0, let rows = try result.requireJSON().arrayValue else { throw FixtureError("list failed: \(result)") }
        var states: [String: String] = [:]
        for row in rows { if let id = row["id"]?.stringValue { states[id] = row["state"]?.stringValue ?? "?" } }
        return states
    }

    func show(_ id: String) throws -> JSON {
        let result = project.run(["show", id, "--json"])
        guard result.exitCode == 0 else { throw FixtureError("show \(id) failed: \(result)") }
        return try result.requireJSON()
    }

    /// Hook log lines: (id, generation, outcome, delivery).
    var hookLog: [(id: String, generation: String, outcome: String, delivery: Int)] {
        (project.read("hook.log") ?? "").split(separator: "\n").compactMap { line in
            let fields = line.split(separator: " ").map(String.init)
            guard fields.count == 4, let delivery = Int(fields[3]) else { return nil }
            return (fields[0], fields[1], fields[2], delivery)
        }
    }

    /// Hooks that blocked on their first delivery and are still alive (zombies are dead).
    var blockedHooksAlive: [Int32] {
        (project.read("blocked-hooks") ?? "").split(separator: "\n").compactMap { Int32($0) }.filter { pid in
            guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8) else { return false }
            let state = stat.split(separator: ")").last?.split(separator: " ").first
            return state != "Z" && state != "X"
        }
    }

    // MARK: The checks

    /// Everything a crash must not break, after the last drain: every planned entry ended as
    /// planned, every outcome was delivered and acknowledged once, every user file is at its
    /// source path or arrived whole, no accepted request reached the server again after a
    /// kill, and `audit` passes.
    func verify(sourceLocation: SourceLocation = #_sourceLocation) throws {
        let rows = try listRows()
        for (id, state) in rows {
            #expect(planned[id] != nil, "an entry nobody planned: \(id) (\(state))", sourceLocation: sourceLocation)
        }
        let log = hookLog
        for entry in planned.values.sorted(by: { $0.id < $1.id }) {
            let state = rows[entry.id]
            let deliveries = log.filter { $0.id == entry.id }
            switch entry.ending {
            case .completed, .cancelledByScope:
                #expect(state == nil, "\(entry.id) is forgotten once acknowledged, not \(state ?? "")", sourceLocation: sourceLocation)
                let outcome = entry.ending == .completed ? "completed" : "error"
                #expect(
                    deliveries.contains { $0.outcome == outcome }, "\(entry.id): its \(outcome) outcome reached the hook: \(deliveries)",
                    sourceLocation: sourceLocation)
            case .error:
                #expect(state == "error", "\(entry.id) stays as error, not \(state ?? "forgotten")", sourceLocation: sourceLocation)
                #expect(
                    deliveries.contains { $0.outcome == "error" }, "\(entry.id): the error reached the hook", sourceLocation: sourceLocation
                )
                let outcomes = try show(entry.id)["outcomes"]?.arrayValue ?? []
                #expect(
                    !outcomes.isEmpty && outcomes.allSatisfy { $0["acknowledged"]?.boolValue == true },
                    "\(entry.id): its outcome is acknowledged: \(outcomes)", sourceLocation: sourceLocation)
            case .cancelledByUser:
                #expect(state == nil, "\(entry.id) is forgotten after its cancel", sourceLocation: sourceLocation)
                #expect(deliveries.isEmpty, "a cancel runs no hook: \(deliveries)", sourceLocation: sourceLocation)
            }
            // A delivery number twice means an outcome journaled (or counted) twice.
            let numbers = deliveries.map { "\($0.generation)/\($0.delivery)" }
            #expect(Set(numbers).count == numbers.count, "\(entry.id): each delivery once: \(numbers)", sourceLocation: sourceLocation)
            #expect(
                deliveries.count <= 1 + kills.count, "\(entry.id): at most one redelivery per kill: \(numbers)",
                sourceLocation: sourceLocation)
            try verifyFile(entry, state: state, sourceLocation: sourceLocation)
        }
        let stats = project.run(["stats", "--json"])
        #expect(
            try stats.requireJSON()["outcomes_pending"]?.int64Value == 0, "no outcome pending: \(stats)", sourceLocation: sourceLocation)
        verifyReceipts(sourceLocation: sourceLocation)
        let journals = (try? FileManager.default.contentsOfDirectory(atPath: project.storeFolder + "/moves")) ?? []
        #expect(journals.isEmpty, "no move journal left: \(journals)", sourceLocation: sourceLocation)
        let audit = project.run(["audit"])
        #expect(audit.exitCode == 0, "audit: \(audit)", sourceLocation: sourceLocation)
    }

    /// A user file is where it was (copy, reference, a move that was cancelled or not
    /// sent), owned by the entry still listed, or arrived whole at the server.
    private func verifyFile(_ entry: Planned, state: String?, sourceLocation: SourceLocation) throws {
        guard let file = entry.file else { return }
        let atSource = FileManager.default.contents(atPath: project.path(file.relative)).map { SHA256.hex([UInt8]($0)) }
        if file.ownership != "move" || entry.ending == .cancelledByScope || entry.ending == .cancelledByUser {
            #expect(
                atSource == file.sha, "\(file.relative) of \(entry.id) is at its source path, unchanged", sourceLocation: sourceLocation)
        } else if state != nil {
            #expect(atSource == nil, "\(file.relative) is owned by \(entry.id) (\(state ?? ""))", sourceLocation: sourceLocation)
        }
    }

    /// Every completed entry arrived whole; nothing the store had settled at a kill was
    /// received again after it; and no target was received more often than its refusals,
    /// one acceptance and one resend per kill that caught it in flight allow.
    private func verifyReceipts(sourceLocation: SourceLocation) {
        let records = server.requests
        for entry in planned.values where entry.ending == .completed {
            for (path, sha) in entry.targets {
                #expect(
                    records.contains { $0.path == path && $0.completed && (sha == nil || $0.bodySHA256 == sha) },
                    "\(entry.id): \(path) arrived whole", sourceLocation: sourceLocation)
            }
        }
        for (k, kill) in kills.enumerated() {
            let end = k + 1 < kills.count ? kills[k + 1].recordCount : records.count
            let again = records[min(kill.recordCount, end)..<end].filter { kill.settled.contains($0.path) }.map(\.path)
            #expect(again.isEmpty, "settled before kill \(k + 1), received again: \(again)", sourceLocation: sourceLocation)
        }
        // Whatever the store says: a kill sends again at most the parts one upload has in flight.
        for (k, kill) in kills.enumerated() {
            let start = k == 0 ? 0 : kills[k - 1].recordCount
            let before = Set(records[start..<kill.recordCount].filter(\.completed).map(\.path))
            let after = Set(records[kill.recordCount...].filter(\.completed).map(\.path))
            for entry in planned.values where entry.targets.count > 1 {
                let again = entry.targets.map(\.path).filter { before.contains($0) && after.contains($0) }
                #expect(
                    again.count <= Self.partConcurrency, "\(entry.id): parts sent again after kill \(k + 1): \(again)",
                    sourceLocation: sourceLocation)
            }
        }
        for entry in planned.values {
            for (path, _) in entry.targets {
                let received = records.filter { $0.path == path && $0.completed }.count
                // Kills that caught it sent (in their run) but not settled.
                let inFlight = kills.indices.filter { k in
                    let start = k == 0 ? 0 : kills[k - 1].recordCount
                    return !kills[k].settled.contains(path) && records[start..<kills[k].recordCount].contains { $0.path == path }
                }.count
                #expect(
                    received <= 1 + entry.refusals + inFlight,
                    "\(path) received \(received) times (\(entry.refusals) refusals, in flight at \(inFlight) kills)",
                    sourceLocation: sourceLocation)
            }
        }
    }
}
