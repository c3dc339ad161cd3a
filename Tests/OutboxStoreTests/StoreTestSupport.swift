import Foundation
import OutboxModel
@testable import OutboxStore
import TestSupport

struct StoreTestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// One test's project folder (the fixture's, without a config): definitions, user files
/// and a real store under `.outbox`, opened in-process.
final class StoreFixture {
    let project: TestProject
    var root: String { project.root }
    var storeFolder: String { project.storeFolder }
    let store: SQLiteStore
    let definitions: DefinitionSet
    let config: Config

    static let definitionFiles: [String: String] = [
        "note.yaml": """
        key: note
        request:
          url: "https://x.example/notes/{{ vars.n }}"
          headers:
            X-Version: "{{ vars.hv | default(\\"0\\") }}"
          data:
            n: "{{ vars.n }}"

        """,
        "text.yaml": """
        key: text
        request:
          url: https://x.example/text
          text: "{{ vars.t }}"

        """,
        "copy.yaml": """
        key: file.copy
        request:
          method: PUT
          url: https://x.example/files
          file: "{{ vars.path }}"

        """,
        "move.yaml": """
        key: file.move
        request:
          method: PUT
          url: https://x.example/files
          file: "{{ vars.path }}"
          ownership: move

        """,
        "reference.yaml": """
        key: file.reference
        request:
          method: PUT
          url: https://x.example/files
          file: "{{ vars.path }}"
          ownership: reference

        """,
        "form.yaml": """
        key: form
        request:
          url: https://x.example/form
          form:
            - { name: note, value: "{{ vars.note }}" }
            - { name: upload, file: "{{ vars.path }}" }

        """,
        "parts.yaml": """
        key: parts
        request:
          method: PUT
          file: "{{ vars.path }}"
          parts:
            plan: { min: 10, max: 20 }
            url: "https://up.example/parts/{{ part.number }}"
            headers:
              Content-Range: "bytes {{ part.start }}-{{ part.last }}/{{ file.size }}"

        """,
    ]

    init(function: String = #function) throws {
        project = try TestProject(config: nil, name: function)
        for (name, text) in Self.definitionFiles { try project.write("definitions/" + name, text) }
        definitions = DefinitionSet.load(folder: project.root + "/definitions")
        guard definitions.diagnostics.isEmpty else {
            throw StoreTestFailure("definitions do not load: \(definitions.diagnostics.map(\.message))")
        }
        config = Config(root: project.root)
        store = try SQLiteStore(folder: project.storeFolder)
    }

    var database: String { storeFolder + "/outbox.db" }
    var bodies: String { storeFolder + "/bodies" }

    /// A rendered entry of one of the fixture's definitions.
    func entry(_ id: String, _ key: String, _ vars: String, expiresAt: Int64? = nil) throws -> NewEntry {
        guard let definition = definitions.definitions[key], let request = definition.request else {
            throw StoreTestFailure("no definition \(key)")
        }
        let json = try JSON.parse(vars)
        let inputs = RenderInputs(id: id, vars: json, environment: [:], cwd: root)
        let prepared = try RequestBuilder.prepare(request: request, definition: definition, config: config, inputs: inputs)
        return NewEntry(id: id, key: key, vars: json, prepared: prepared, expiresAt: expiresAt)
    }

    @discardableResult
    func enqueue(_ entries: [NewEntry], now: Int64 = 1_000) throws -> [EnqueueResult] {
        try store.enqueue(entries, now: now)
    }

    @discardableResult
    func enqueue(_ id: String, _ key: String, _ vars: String, now: Int64 = 1_000) throws -> EnqueueResult {
        try store.enqueue([entry(id, key, vars)], now: now)[0]
    }

    func get(_ id: String) throws -> Entry {
        guard let e = try store.entry(id: id) else { throw StoreTestFailure("no entry \(id)") }
        return e
    }

    /// Seeds a state the runner would have set, straight in the database.
    func setState(_ id: String, _ state: EntryState, attempts: Int64? = nil, bytesSent: Int64? = nil) throws {
        try store.db.run("UPDATE entries SET state = ? WHERE id = ?", [.text(state.rawValue), .text(id)])
        if let attempts { try store.db.run("UPDATE entries SET attempts = ? WHERE id = ?", [.int(attempts), .text(id)]) }
        if let bytesSent { try store.db.run("UPDATE entries SET bytes_sent = ? WHERE id = ?", [.int(bytesSent), .text(id)]) }
    }

    /// Journals an outcome for the entry's current generation.
    func addOutcome(_ id: String, _ outcome: String, acknowledged: Bool) throws {
        let e = try get(id)
        try store.db.run(
            """
            INSERT INTO outcomes (entry_id, key, generation, outcome, payload, acknowledged, created_at)
            VALUES (?, ?, ?, ?, '{}', ?, 0)
            """, [.text(id), .text(e.key), .int(e.generation), .text(outcome), .bool(acknowledged)])
    }

    /// Writes a user file under the fixture root and returns its absolute path.
    @discardableResult
    func userFile(_ relative: String, _ text: String, mode: Int = 0o644) throws -> String {
        try project.write(relative, text, mode: mode)
    }

    /// Every path under the store folder (relative), except the database and its WAL files.
    func storeFiles() -> [String] {
        let all = (FileManager.default.enumerator(atPath: storeFolder)?.allObjects as? [String]) ?? []
        return all.filter { !$0.hasPrefix("outbox.db") }.sorted()
    }

    func stagedFiles() -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: bodies)) ?? []).sorted()
    }

    func rowCount() throws -> Int64 {
        try store.db.queryOne("SELECT COUNT(*) FROM entries") { $0.int(0) } ?? -1
    }

    /// The sqlite3 command-line tool's answer, as an outside process sees the file.
    func sqlite(_ sql: String) throws -> String {
        try project.sqlite(sql).trimmingCharacters(in: .whitespacesAndNewlines)
    }
}

func fileText(_ path: String) -> String? {
    FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) }
}

func exists(_ path: String) -> Bool { FileManager.default.fileExists(atPath: path) }
