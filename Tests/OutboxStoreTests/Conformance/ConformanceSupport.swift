import Foundation
import OutboxModel
import OutboxStore
import Testing

/// Rules every `Store` keeps, checked through the protocol alone (no SQL, no store files),
/// for each implementation in `StoreUnderTest.all`. Each area is a nested suite.
struct StoreConformance {
    /// Times are passed to the store, never read from the clock: every test starts here.
    static let t0: Int64 = 1_800_000_000_000
    /// Two runners, as on two hosts; a lease lasts a minute.
    static let runnerA = Lease(owner: "runner-a", durationMs: 60_000)
    static let runnerB = Lease(owner: "runner-b", durationMs: 60_000)
    /// What a store that one runner uses at a time does where the lease rules apply.
    static let oneRunner: Comment =
        "SQLiteStore writes no lease: its runner lock admits one runner, so it treats every running entry as that runner's"
}

struct ConformanceFailure: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// A conformance test's store and project: definitions to render entries from, a folder
/// for user files, and the runner's moves (claim, settle) written once.
final class Conformance {
    let kind: StoreUnderTest
    let instance: StoreInstance
    /// The project folder: definitions, user files; relative paths resolve against it.
    let root: String
    let definitions: DefinitionSet
    let config: Config

    var store: any Store { instance.store }

    static let definitionFiles: [String: String] = [
        "note.yaml": #"""
        key: note
        request:
          url: "https://x.example/notes/{{ vars.n }}"
          headers:
            X-Version: "{{ vars.hv | default(\"0\") }}"
          data:
            n: "{{ vars.n }}"

        """#,
        "bearer.yaml": #"""
        key: bearer
        request:
          url: https://x.example/bearer
          headers:
            Authorization: "Bearer {{ vars.token }}"
          data: { n: 1 }

        """#,
        "text.yaml": #"""
        key: text
        request:
          url: https://x.example/text
          text: "{{ vars.t }}"

        """#,
        "copy.yaml": #"""
        key: copy
        request:
          method: PUT
          url: https://x.example/files
          file: "{{ vars.path }}"

        """#,
        "scoped.yaml": #"""
        key: scoped
        scope: "{{ vars.s }}"
        request:
          url: "https://x.example/scoped/{{ vars.n }}"
          data:
            n: "{{ vars.n }}"

        """#,
        "parts.yaml": #"""
        key: parts
        request:
          method: PUT
          file: "{{ vars.path }}"
          ownership: reference
          parts:
            plan: { min: 100, max: 100 }
            url: "https://{{ vars.host | raw }}/parts/{{ part.number }}"
            headers:
              Content-Range: "bytes {{ part.start }}-{{ part.last }}/{{ file.size }}"

        """#,
    ]

    init(_ kind: StoreUnderTest) throws {
        self.kind = kind
        instance = try kind.make()
        root = instance.folder + "/project"
        try FileManager.default.createDirectory(atPath: root + "/definitions", withIntermediateDirectories: true)
        for (name, text) in Self.definitionFiles {
            try text.write(toFile: root + "/definitions/" + name, atomically: false, encoding: .utf8)
        }
        definitions = DefinitionSet.load(folder: root + "/definitions")
        guard definitions.diagnostics.isEmpty else {
            throw ConformanceFailure("definitions do not load: \(definitions.diagnostics.map(\.message))")
        }
        config = Config(root: root)
    }

    // MARK: Entries

    /// A rendered entry of one of the definitions, as `enqueue` builds it.
    func entry(
        _ id: String, _ key: String = "note", _ vars: String = #"{"n": 1}"#, notBefore: Int64? = nil,
        expiresAt: Int64? = nil, parent: String? = nil
    ) throws -> NewEntry {
        guard let definition = definitions.definitions[key], let request = definition.request else {
            throw ConformanceFailure("no definition \(key)")
        }
        let json = try JSON.parse(vars)
        let inputs = RenderInputs(id: id, vars: json, environment: [:], cwd: root)
        let prepared = try RequestBuilder.prepare(request: request, definition: definition, config: config, inputs: inputs)
        return NewEntry(id: id, key: key, vars: json, prepared: prepared, parent: parent, notBefore: notBefore, expiresAt: expiresAt)
    }

    /// Enqueues one entry; returns what the store decided.
    @discardableResult
    func enqueue(
        _ id: String, _ key: String = "note", _ vars: String = #"{"n": 1}"#, notBefore: Int64? = nil,
        now: Int64 = StoreConformance.t0
    ) throws -> SameIdDecision {
        let results = try store.enqueue([try entry(id, key, vars, notBefore: notBefore)], now: now)
        guard results.count == 1, results[0].id == id else { throw ConformanceFailure("enqueue of \(id) returned \(results)") }
        return results[0].decision
    }

    /// A chunked upload of a 300-byte file in three parts of 100; `host` changes its body.
    func chunked(_ id: String, host: String = "a.example") throws -> NewEntry {
        let path = root + "/upload.bin"
        if !FileManager.default.fileExists(atPath: path) {
            try Data(repeating: 7, count: 300).write(to: URL(fileURLWithPath: path))
        }
        return try entry(id, "parts", #"{"path": "upload.bin", "host": "\#(host)"}"#)
    }

    /// Writes a user file in the project folder and returns its path.
    @discardableResult
    func userFile(_ name: String, _ text: String) throws -> String {
        let path = root + "/" + name
        try text.write(toFile: path, atomically: false, encoding: .utf8)
        return path
    }

    func get(_ id: String) throws -> Entry {
        guard let e = try store.entry(id: id) else { throw ConformanceFailure("no entry \(id)") }
        return e
    }

    func ids(_ filter: ListFilter = ListFilter()) throws -> [String] { try store.list(filter).map(\.id) }

    func dueIDs(at now: Int64, limit: Int = 100, excluding: Set<String> = []) throws -> [String] {
        try store.dueEntries(now: now, limit: limit, excluding: excluding).map(\.id)
    }

    // MARK: The runner's moves

    /// Claims entries as a runner does (by seq, with its lease) and returns them as it holds them.
    @discardableResult
    func claim(
        _ ids: String..., lease: Lease = StoreConformance.runnerA, now: Int64 = StoreConformance.t0,
        on other: (any Store)? = nil
    ) throws -> [Entry] {
        let entries = try ids.map(get)
        try (other ?? store).apply([.markRunning(entrySeqs: entries.map(\.seq), lease: lease)], now: now)
        return entries.map { e in
            var held = e
            held.state = .running
            return held
        }
    }

    func payload(_ e: Entry, _ outcome: Outcome) -> JSON {
        .object([("id", .string(e.id)), ("generation", .int64(e.generation)), ("outcome", .string(outcome.rawValue))])
    }

    /// A settlement as the runner makes it: with the entry it holds as the snapshot.
    func settlement(
        _ e: Entry, _ state: EntryState, _ outcome: Outcome, hook: Bool = true, reason: String? = nil,
        followUps: [NewEntry] = []
    ) -> Settlement {
        var s = Settlement(
            entryID: e.id, generation: e.generation, state: state, reason: reason, outcome: outcome,
            payload: payload(e, outcome), hookExists: hook, followUps: followUps)
        s.snapshot = e
        return s
    }

    func settle(
        _ e: Entry, _ state: EntryState, _ outcome: Outcome, hook: Bool = true, reason: String? = nil,
        followUps: [NewEntry] = [], by lease: Lease? = nil, now: Int64 = StoreConformance.t0
    ) throws {
        try store.apply([.settle(settlement(e, state, outcome, hook: hook, reason: reason, followUps: followUps))], by: lease, now: now)
    }

    /// An enqueued entry brought to `state` the way a runner gets it there (a hook exists, so
    /// a settled entry's outcome waits for delivery).
    @discardableResult
    func bring(
        _ id: String, _ key: String = "note", _ vars: String = #"{"n": 1}"#, to state: EntryState,
        now: Int64 = StoreConformance.t0
    ) throws -> Entry {
        try enqueue(id, key, vars, now: now)
        if state == .queued { return try get(id) }
        let held = try claim(id, now: now)[0]
        switch state {
        case .running: break
        case .awaitingAuth: try store.apply([.park(entryID: id)], now: now)
        case .completed: try settle(held, .completed, .completed, now: now)
        case .error: try settle(held, .error, .error, reason: "http", now: now)
        case .cancelled: try settle(held, .cancelled, .error, reason: "cancelled", now: now)
        case .queued, .paused: throw ConformanceFailure("cannot bring an entry to \(state)")
        }
        return try get(id)
    }

    /// The entry's outcomes in one line each: id, generation, outcome, acknowledged or not.
    func journal(_ id: String) throws -> [String] { try store.outcomes(entryID: id).map(Self.line) }

    func pendingJournal() throws -> [String] { try store.unacknowledgedOutcomes().map(Self.line) }

    static func line(_ o: OutcomeRecord) -> String {
        "\(o.entryID) g\(o.generation) \(o.outcome.rawValue) \(o.acknowledged ? "acknowledged" : "pending")"
    }

    /// The pending outcome of an entry (the oldest).
    func pending(_ id: String) throws -> OutcomeRecord {
        guard let o = try store.outcomes(entryID: id).first(where: { !$0.acknowledged }) else {
            throw ConformanceFailure("no pending outcome of \(id)")
        }
        return o
    }

    // MARK: Reading bodies

    /// The bytes a body sends, read wherever the store keeps them.
    static func bytes(_ body: StoredBody) -> [UInt8]? {
        switch body {
        case let .bytes(b): return b
        case let .file(path), let .parts(path): return FileManager.default.contents(atPath: path).map(Array.init)
        case .none, .form: return nil
        }
    }

    /// The bytes a prepared data or text body holds.
    static func bytes(_ prepared: PreparedRequest) -> [UInt8]? {
        if case let .bytes(b, _) = prepared.body { return b }
        return nil
    }

    static func headerLines(_ headers: [(String, String)]) -> [String] { headers.map { "\($0.0): \($0.1)" } }
}

extension OutboxError {
    /// Whether `error` is an OutboxError with this code (for `#expect(throws:)` checks).
    static func has(_ code: ErrorCode, _ error: any Error) -> Bool { (error as? OutboxError)?.code == code }
}
