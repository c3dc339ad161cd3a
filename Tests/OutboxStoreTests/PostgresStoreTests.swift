import Foundation
import OutboxModel
import Testing
import TestSupport

@testable import OutboxStore

/// The PostgreSQL store's own rules (the shared ones are in the conformance suite): its
/// URL, its connection errors, its schema and migrations, against the throwaway cluster.
struct PostgresStoreTests {
    struct URLCase: Sendable, CustomTestStringConvertible {
        var text: String
        var schema: String
        var redacted: String
        var testDescription: String { text }
    }

    // The schema comes out of the URL, the password never shows, libpq gets a connect timeout.
    @Test(arguments: [
        URLCase(
            text: "postgres://u:secret@db.example:5433/app?schema=proj_1", schema: "proj_1",
            redacted: "postgres://u:***@db.example:5433/app?schema=proj_1"),
        URLCase(text: "postgresql://u@h/app", schema: "outbox", redacted: "postgresql://u@h/app?schema=outbox"),
        URLCase(
            text: "postgres://u:p%40ss@h/app?sslmode=require&schema=a", schema: "a", redacted: "postgres://u:***@h/app?schema=a"),
    ])
    func urlsAreParsed(_ c: URLCase) throws {
        let url = try PostgresURL(c.text)
        #expect(url.schema == c.schema)
        #expect(url.redacted == c.redacted)
        #expect(!url.connectionURI.contains("schema="))
        #expect(url.connectionURI.contains("connect_timeout=10"))
        #expect(url.connectionURI.contains("keepalives_idle=10") && url.connectionURI.contains("tcp_user_timeout=30000"))
    }

    // A raw '@', '/', '?' or '#' in the user or password would be read by libpq in part as
    // the host or the query, and quoted back in its error: refused, without quoting the password.
    @Test(arguments: [
        "postgres://u:pw@tail99@h/app", "postgres://u:pw/tail99@h/app", "postgresql://u:pw@h/a@tail99",
        "postgres://u:hunter?2@127.0.0.1:1/db", "postgres://u:pw@tail?99@127.0.0.1:1/db",
        "postgres://odd:p@ss/w:rd?#x y@127.0.0.1:55433/obdb?schema=x", "postgres://u:a#b@h/db",
    ])
    func aRawAtSlashQuestionMarkOrHashInThePasswordIsRefused(_ text: String) {
        let error = #expect(throws: OutboxError.self) { try PostgresURL(text) }
        #expect(error?.code == .config)
        #expect(
            error?.message
                == "store: the PostgreSQL URL's user or password holds a raw \"@\", \"/\", \"?\" or \"#\": write them as %40, %2F, %3F and %23"
        )
    }

    // A schema that is not a plain lowercase identifier is a config error naming it.
    @Test(arguments: ["Proj", "1abc", "a-b", "a;drop", "", String(repeating: "a", count: 64)])
    func aBadSchemaIsRefused(_ schema: String) {
        let error = #expect(throws: OutboxError.self) { try PostgresURL("postgres://u@h/db?schema=\(schema)") }
        #expect(error?.code == .config)
        #expect(error?.message.contains("schema") == true)
    }

    /// A store folder inside the test cluster's, which goes with it when the tests end.
    static func folder() throws -> String {
        try PostgresCluster.shared().folder + "/stores/\(UUID().uuidString.prefix(12))"
    }

    // A wrong password is E_STORAGE with the server's message, and the password is not in it.
    @Test func aWrongPasswordIsAStorageErrorWithoutThePassword() throws {
        let cluster = try PostgresCluster.shared()
        let url = try PostgresURL(cluster.url(schema: "wrong_pw", password: "not-the-password-42"))
        let error = #expect(throws: OutboxError.self) { try PostgresStore(url: url, folder: Self.folder()) }
        #expect(error?.code == .storage)
        #expect(error?.message.contains("password authentication failed") == true)
        #expect(error?.message.contains("not-the-password-42") == false)
    }

    // A wrong password that is also part of libpq's words ("pass", "s") leaves them whole:
    // masked everywhere, the cut words would spell the password out.
    @Test(arguments: ["pass", "s"])
    func aShortWrongPasswordLeavesTheServersMessageWhole(_ password: String) throws {
        let cluster = try PostgresCluster.shared()
        let url = try PostgresURL(cluster.url(schema: "short_pw", password: password))
        let error = #expect(throws: OutboxError.self) { try PostgresStore(url: url, folder: Self.folder()) }
        #expect(error?.code == .storage)
        #expect(error?.message.contains("password authentication failed for user") == true, "\(error?.message ?? "")")
        #expect(error?.message.contains("postgres://outbox:***@") == true, "\(error?.message ?? "")")
    }

    // A store copy at work holds the schema's writer lock in its long transaction: a store
    // opened meanwhile (a runner starting) does not wait behind it for its migrations, and
    // the runner is refused at once (75) instead of sending once the copy is done.
    @Test func aRunnerStartedDuringACopyIsRefusedAtOnce() throws {
        let cluster = try PostgresCluster.shared()
        let url = try PostgresURL(cluster.url(schema: PostgresCluster.uniqueSchema("copying")))
        let source = try PostgresStore(url: url, folder: Self.folder())
        let copying = try source.lockExclusively()
        defer { copying.release() }
        let holder = try PGConnection(uri: url.connectionURI, name: url.redacted)
        try holder.execute("BEGIN; SELECT pg_advisory_xact_lock(7361200, \(url.lockKey))")
        defer { try? holder.execute("ROLLBACK") }
        let runner = try PostgresStore(url: url, folder: Self.folder())
        let refused = #expect(throws: OutboxError.self) { _ = try runner.lockForRunner() }
        #expect(refused?.code == .running)
        #expect(refused?.message.contains("a store copy holds the store") == true)
    }

    // A URL that cannot be read never shows its password.
    @Test(arguments: ["postgres://u:PGSECRET42@[bad/db", "postgres://u:PG%zzSECRET42@127.0.0.1:1/db", "postgres://u:PG%41SECRET42@[bad/db"])
    func libpqsMessageNeverShowsThePassword(_ text: String) throws {
        // An IPv6 host left open is refused before libpq reads it; a percent escape libpq
        // refuses is the config's mistake too, quoted back with the password taken out.
        let error = #expect(throws: OutboxError.self) { try PostgresStore(url: try PostgresURL(text), folder: Self.folder()) }
        #expect(error?.code == .config, "\(error?.message ?? "")")
        #expect(error?.message.contains("SECRET42") == false, "\(error?.message ?? "")")
        if text.contains("%zz") { #expect(error?.message.contains("***") == true) }
    }

    // A server that is not there is E_STORAGE naming the store.
    @Test func aServerThatIsDownIsAStorageError() throws {
        let cluster = try PostgresCluster.shared()
        // A port nobody listens on: the cluster's own, plus one, on a loopback address it does not use.
        let url = try PostgresURL("postgres://outbox:x@127.0.0.2:\(cluster.port)/postgres?schema=down&connect_timeout=2")
        let error = #expect(throws: OutboxError.self) { try PostgresStore(url: url, folder: Self.folder()) }
        #expect(error?.code == .storage)
        #expect(error?.message.contains("cannot connect to the PostgreSQL store postgres://outbox:***@127.0.0.2") == true)
    }

    // Each schema is a project of its own: what one holds, another does not see.
    @Test func schemasKeepProjectsApart() throws {
        let cluster = try PostgresCluster.shared()
        let a = try PostgresStore(url: try PostgresURL(cluster.url(schema: PostgresCluster.uniqueSchema("apart"))), folder: Self.folder())
        let b = try PostgresStore(url: try PostgresURL(cluster.url(schema: PostgresCluster.uniqueSchema("apart"))), folder: Self.folder())
        try a.setQueuePaused(true)
        #expect(try a.control().queuePaused)
        #expect(try b.control() == QueueControl())
    }

    // Opening twice applies each migration once; a schema with a migration this version does
    // not know was made by a newer outbox and is refused, naming it, with nothing changed.
    @Test func aSchemaFromANewerOutboxIsRefused() throws {
        let cluster = try PostgresCluster.shared()
        let url = try PostgresURL(cluster.url(schema: PostgresCluster.uniqueSchema("newer")))
        let store = try PostgresStore(url: url, folder: Self.folder())
        _ = try PostgresStore(url: url, folder: Self.folder())
        let names = try store.db.query("SELECT name FROM migrations ORDER BY name") { $0.text(0) }
        #expect(names == PostgresSchema.migrations.map(\.name))
        try store.db.run("INSERT INTO migrations (name, applied_at) VALUES ('999-from-the-future', 0)")
        let error = #expect(throws: OutboxError.self) { try PostgresStore(url: url, folder: Self.folder()) }
        #expect(error?.code == .storage)
        #expect(error?.message.contains("newer outbox (it has migration 999-from-the-future)") == true)
    }

    // A schema made before migration 007 marks the entries of the keys paused in it when it
    // is opened, gets the runner's partial indexes, and its read of due entries leaves the
    // paused ones out as before.
    @Test func aSchemaFromBeforeThePausedMarksIsUpgradedInPlace() throws {
        let cluster = try PostgresCluster.shared()
        let url = try PostgresURL(cluster.url(schema: PostgresCluster.uniqueSchema("marks")))
        let base = try Self.folder()
        let store = try PostgresStore(url: url, folder: base + "/staging")
        _ = try store.enqueue(try PostgresHostTests.entries(root: base + "/project"), now: PostgresHostTests.t0)
        try store.setPaused(keys: ["note"], paused: true)
        // Back to the schema of 006.
        try store.db.execute(
            """
            DROP TRIGGER paused_keys_marked ON paused_keys; DROP FUNCTION mark_paused_entries();
            DROP INDEX entries_queued; DROP INDEX entries_held; DROP INDEX entries_stuck; DROP INDEX entries_waiting;
            DROP INDEX entries_delayed; ALTER TABLE entries DROP COLUMN paused;
            CREATE INDEX entries_queued ON entries (seq) WHERE state = 'queued';
            DELETE FROM migrations WHERE name = '007-runner-indexes-and-paused-marks';
            """)
        let reopened = try PostgresStore(url: url, folder: base + "/staging")
        let marks = try reopened.db.query("SELECT id, paused FROM entries ORDER BY seq") { "\($0.text(0))=\($0.int(1))" }
        #expect(marks == ["file=0", "data=1"])
        let indexes = try reopened.db.query(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'entries' ORDER BY indexname"
        ) { $0.text(0) }
        #expect(
            indexes == [
                "entries_delayed", "entries_held", "entries_id_key", "entries_key", "entries_pkey", "entries_queued", "entries_running",
                "entries_scope", "entries_stuck", "entries_waiting",
            ])
        #expect(try reopened.dueEntries(now: PostgresHostTests.t0, limit: 10, excluding: []).map(\.id) == ["file"])
        try reopened.setPaused(keys: ["note"], paused: false)
        #expect(try reopened.dueEntries(now: PostgresHostTests.t0, limit: 10, excluding: []).map(\.id) == ["file", "data"])
        #expect(try reopened.audit() == [])
    }

    // Placeholders are numbered outside quoted text only.
    @Test func placeholdersAreNumbered() {
        #expect(PGConnection.numbered("SELECT ?, '?', \"a?\" WHERE x = ?") == "SELECT $1, '?', \"a?\" WHERE x = $2")
    }

    // A data body (and any bytes) round-trips through bytea unchanged.
    @Test func bytesRoundTrip() throws {
        let cluster = try PostgresCluster.shared()
        let store = try PostgresStore(
            url: try PostgresURL(cluster.url(schema: PostgresCluster.uniqueSchema("bytes"))), folder: Self.folder())
        let bytes = (0..<1024).map { UInt8($0 % 256) }
        let back = try store.db.queryOne("SELECT ?::bytea", [.blob(bytes)]) { $0.blob(0) }
        #expect(back == bytes)
    }
}

/// File bodies stay on the host that staged them: runners elsewhere do not see them as due
/// nor claim them, unless the staging folder is shared by every host.
struct PostgresHostTests {
    static let t0: Int64 = 1_800_000_000_000

    /// A project folder with a `copy` definition (a staged file) and a `note` (a data body).
    static func entries(root: String) throws -> [NewEntry] {
        try FileManager.default.createDirectory(atPath: root + "/definitions", withIntermediateDirectories: true)
        try "key: copy\nrequest:\n  method: PUT\n  url: https://x.example/f\n  file: \"{{ vars.path }}\"\n"
            .write(toFile: root + "/definitions/copy.yaml", atomically: false, encoding: .utf8)
        try "key: note\nrequest:\n  url: https://x.example/n\n  data:\n    n: 1\n"
            .write(toFile: root + "/definitions/note.yaml", atomically: false, encoding: .utf8)
        try "a file".write(toFile: root + "/doc.txt", atomically: false, encoding: .utf8)
        let definitions = DefinitionSet.load(folder: root + "/definitions")
        let config = Config(root: root)
        return try [("file", "copy", #"{"path": "doc.txt"}"#), ("data", "note", "{}")].map { id, key, vars in
            let definition = try #require(definitions.definitions[key])
            let inputs = RenderInputs(id: id, vars: try JSON.parse(vars), environment: [:], cwd: root)
            let prepared = try RequestBuilder.prepare(
                request: try #require(definition.request), definition: definition, config: config, inputs: inputs)
            return NewEntry(id: id, key: key, vars: try JSON.parse(vars), prepared: prepared)
        }
    }

    @Test func aFileBodyIsClaimedOnlyOnItsHost() throws {
        let cluster = try PostgresCluster.shared()
        let url = try PostgresURL(cluster.url(schema: PostgresCluster.uniqueSchema("hosts")))
        let base = try PostgresStoreTests.folder()
        let here = try PostgresStore(url: url, folder: base + "/a", host: "host-a")
        let there = try PostgresStore(url: url, folder: base + "/b", host: "host-b")
        let shared = try PostgresStore(url: url, folder: base + "/a", host: "host-c", sharedStaging: true)
        _ = try here.enqueue(try Self.entries(root: base + "/project"), now: Self.t0)
        #expect(try here.dueEntries(now: Self.t0, limit: 10, excluding: []).map(\.id) == ["file", "data"])
        #expect(try there.dueEntries(now: Self.t0, limit: 10, excluding: []).map(\.id) == ["data"])
        #expect(try shared.dueEntries(now: Self.t0, limit: 10, excluding: []).map(\.id) == ["file", "data"])
        // A claim from the other host takes the data entry only.
        let seqs = try here.list(ListFilter()).map(\.seq)
        try there.apply([.markRunning(entrySeqs: seqs, lease: Lease(owner: "b", durationMs: 60_000))], now: Self.t0)
        #expect(try here.entry(id: "file")?.state == .queued)
        #expect(try here.entry(id: "data")?.state == .running)
        // Both hosts audit the shared schema clean.
        #expect(try there.audit() == [])
        #expect(try here.audit() == [])
    }
}
