import Foundation
import OutboxModel
import Testing
import TestSupport

/// The built `outbox` on a PostgreSQL store (`OUTBOX_STORE=postgres://...`), against the
/// throwaway cluster and the in-repo HTTP server: every command works as on SQLite.
struct PostgresCLITests {
    static func project(config: String = "") throws -> (TestProject, String) {
        let cluster = try PostgresCluster.shared()
        let p = try TestProject(
            config: config,
            definitions: [
                "note": """
                key: note
                request:
                  url: "{{ env.SERVER | raw }}/notes/{{ vars.n }}"
                  data:
                    n: "{{ vars.n }}"
                """,
                "upload": """
                key: upload
                request:
                  method: PUT
                  url: "{{ env.SERVER | raw }}/files/{{ vars.name }}"
                  file: "{{ vars.path }}"
                """,
            ])
        let url = cluster.url(schema: PostgresCluster.uniqueSchema("cli"))
        p.environment["OUTBOX_STORE"] = url
        p.environment["SERVER"] = p.server.baseURL
        return (p, url)
    }

    // enqueue, run --drain, list, show, cancel, stats and audit, all on the server's schema;
    // no SQLite database is made, and the file body is staged in the local .outbox folder.
    @Test func everyCommandWorksOnAPostgresStore() async throws {
        let (p, _) = try Self.project()
        let enqueue = try await p.outbox(["enqueue", "note", "--vars", #"{"n": 1}"#, "--id", "a"])
        #expect(enqueue.exitCode == 0, "\(enqueue)")
        #expect(enqueue.stdout == "a\n")
        try p.write("doc.bin", String(repeating: "x", count: 100_000))
        let file = try await p.outbox(["enqueue", "upload", "--vars", #"{"name": "doc", "path": "doc.bin"}"#, "--id", "f"])
        #expect(file.exitCode == 0, "\(file)")
        let later = try await p.outbox(["enqueue", "note", "--vars", #"{"n": 3}"#, "--id", "later", "--delay", "1h"])
        #expect(later.exitCode == 0, "\(later)")
        #expect((try FileManager.default.contentsOfDirectory(atPath: p.path(".outbox/bodies"))).count == 1)

        let drain = try await p.outbox(["run", "--drain", "--json"])
        #expect(drain.exitCode == 0, "\(drain)")
        #expect(p.server.requests(path: "/notes/1").count == 1)
        #expect(p.server.requests(path: "/files/doc").map(\.bodySize) == [100_000])

        let list = try await p.outbox(["list", "--json"])
        #expect(list.exitCode == 0, "\(list)")
        let rows = try JSON.parse(list.stdout).arrayValue ?? []
        #expect(rows.map { $0["id"] } == [.string("later")])
        #expect(rows.map { $0["state"] } == [.string("queued")])
        let show = try await p.outbox(["show", "later", "--json"])
        #expect(show.exitCode == 0, "\(show)")
        #expect(try JSON.parse(show.stdout)["state"] == .string("queued"))
        let stats = try await p.outbox(["stats", "--json"])
        #expect(stats.exitCode == 0, "\(stats)")
        #expect(try JSON.parse(stats.stdout)["entries"]?["queued"] == .int64(1))
        let audit = try await p.outbox(["audit"])
        #expect(audit.exitCode == 0, "\(audit)")

        let cancel = try await p.outbox(["cancel", "later"])
        #expect(cancel.exitCode == 0, "\(cancel)")
        let empty = try await p.outbox(["list", "--json"])
        #expect(try JSON.parse(empty.stdout).arrayValue?.isEmpty == true)
        #expect(!p.exists(".outbox/outbox.db"))
        #expect((try FileManager.default.contentsOfDirectory(atPath: p.path(".outbox/bodies"))).isEmpty)
    }

    // A second runner on the schema is admitted: it leaves the entry the first holds alone.
    // (A lease and a stall limit far longer than the test: on a busy machine the held request
    // must not be given up and sent again, nor its lease run out; that is not what is tested.)
    /// SQLite → PostgreSQL (used from another project that stages elsewhere) → a new SQLite
    /// folder: the staged bodies go along at each hop, from wherever the rows name them, so
    /// the first project can go and the last store still sends them.
    @Test func stagedBodiesFollowACopyThroughAnotherProject() async throws {
        let (a, url) = try Self.project()
        let server = a.server.baseURL
        a.environment["OUTBOX_STORE"] = nil
        try a.write("doc.bin", String(repeating: "y", count: 5_000))
        #expect(try await a.outbox(["enqueue", "upload", "--vars", #"{"name": "doc", "path": "doc.bin"}"#, "--id", "f"]).exitCode == 0)
        try FileManager.default.removeItem(atPath: a.path("doc.bin"))
        let toServer = try await a.outbox(["store", "copy", "--to", url, "--json"])
        #expect(toServer.exitCode == 0, "\(toServer)")

        let b = try TestProject(config: "staging: { path: stage }\n")
        b.environment["OUTBOX_STORE"] = url
        b.environment["SERVER"] = server
        try b.define(
            "upload",
            "key: upload\nrequest: { method: PUT, url: \"{{ env.SERVER | raw }}/files/{{ vars.name }}\", file: \"{{ vars.path }}\" }\n")
        let back = try await b.outbox(["store", "copy", "--to", b.path("newstore"), "--json"])
        #expect(back.exitCode == 0, "\(back)")
        #expect(back.json?["files"] == .int(1), "\(back.stdout)")
        try FileManager.default.removeItem(atPath: a.root)

        b.environment["OUTBOX_STORE"] = b.path("newstore")
        let run = try await b.outbox(["run", "--drain"])
        #expect(run.exitCode == 0, "\(run)")
        #expect(a.server.requests(path: "/files/doc").map(\.bodySize) == [5_000])
    }

    /// A copy onto the project's own schema, spelled with other options, is a usage error
    /// (it said a runner held the store when none ran).
    @Test func storeCopyOntoItsOwnSchemaIsAUsageError() async throws {
        let (p, url) = try Self.project()
        #expect(try await p.outbox(["enqueue", "note", "--vars", #"{"n": 1}"#]).exitCode == 0)
        let r = try await p.outbox(["store", "copy", "--to", url + "&application_name=x"])
        #expect(r.exitCode == 64, "\(r)")
        #expect(r.stderr.contains("is the project's own store"), "\(r.stderr)")
    }

    @Test func aSecondRunnerOnTheSchemaRunsBesideTheFirst() async throws {
        let (p, _) = try Self.project(config: heldRequestConfig)
        try await p.outbox(["enqueue", "note", "--vars", #"{"n": 1}"#, "--id", "held"])
        p.server.script("/notes/1", [.hold("first")])
        let first = try p.start(["run"])
        #expect(await p.server.waitForHeld("first"))
        let second = try await p.outbox(["run", "--drain"])
        #expect(second.exitCode == 0, "\(second)")
        #expect(p.server.requests(path: "/notes/1").count == 1)
        _ = p.server.release("first")
        try await eventually("the first runner settles the entry") {
            try JSON.parse(try await p.outbox(["list", "--json"]).stdout).arrayValue?.isEmpty == true
        }
        first.signal(SIGTERM)
        #expect(await first.wait().exitCode == 0)
        #expect(p.server.requests(path: "/notes/1").count == 1)
    }

    /// A runner stopped inside a transaction that holds the schema's writer lock (a frozen
    /// process, a stalled host): the server ends that transaction once it has been idle a
    /// lease, so the other runners go on, and take over its entries, while it is still held.
    @Test func aRunnerHeldInsideATransactionStopsTheOthersForALeaseAtMost() async throws {
        let chained = """
            key: chained
            request:
              url: "{{ env.SERVER | raw }}/chained/{{ vars.n }}"
              data: { n: "{{ vars.n }}" }
            then:
              on_success:
                - key: note
                  id: "after-{{ entry.id }}"
                  vars: { n: "{{ vars.n }}0" }
            """
        let (p, _) = try Self.project(config: "lease: 2s\nretry:\n  backoff: { base: 50ms, max: 200ms, jitter: 0 }\n")
        try p.define("chained", chained)
        try await p.outbox(["enqueue", "chained", "--vars", #"{"n": 1}"#, "--id", "a"])
        let go = p.path("go")
        let held = try p.start(["run"], environment: ["OUTBOX_FAULT_HOLD": "settle.in-transaction:\(go)"])
        defer { held.signal(SIGKILL) }
        await eventually("the first runner to hold inside its transaction") { FileManager.default.fileExists(atPath: go + ".reached") }

        try await p.outbox(["enqueue", "chained", "--vars", #"{"n": 2}"#, "--id", "b"])
        let other = try await p.outbox(["run", "--drain"])
        #expect(other.exitCode == 0, "\(other)")
        #expect(held.isRunning, "the first runner is still held")
        // b and its follow-up, and a again (its lease ran out) with its follow-up.
        #expect(p.server.requests(path: "/chained/2").count == 1)
        #expect(p.server.requests(path: "/notes/20").count == 1)
        #expect(p.server.requests(path: "/chained/1").count == 2, "sent by each runner")
        #expect(Set(p.server.requests(path: "/chained/1").map { $0.header("idempotency-key") }).count == 1, "with one key")
        #expect(p.server.requests(path: "/notes/10").count == 1)

        // Let go, the first runner finds its transaction ended and its lease taken: it settles nothing twice.
        _ = FileManager.default.createFile(atPath: go, contents: nil)
        await eventually("the first runner to see its lease lost") { held.stderrSoFar.contains("lost the lease on a") }
        held.signal(SIGTERM)
        #expect(await held.wait().exitCode == 0)
        #expect(p.server.requests(path: "/notes/10").count == 1)
        #expect(try JSON.parse(try await p.outbox(["list", "--json"]).stdout).arrayValue?.isEmpty == true)
    }

    // A same-id enqueue with another body of an entry whose runner died and let its lease run
    // out is refused (75) in words that say so, not as if a runner were sending it now.
    @Test func aSameIdEnqueueOfAnEntryWhoseLeaseRanOutSaysSo() async throws {
        let (p, _) = try Self.project(config: "lease: 1s\n")
        try await p.outbox(["enqueue", "note", "--vars", #"{"n": 1}"#, "--id", "r1"])
        // The runner dies (SIGKILL) as soon as its claim of r1 committed.
        let killed = try await p.outbox(["run", "--drain"], environment: ["OUTBOX_FAULT": "run.claimed:1"])
        #expect(killed.exitCode == -9, "\(killed)")
        #expect(p.server.requests(path: "/notes/1").isEmpty)
        await eventually("r1's lease to run out") {
            ((try? await p.outbox(["explain", "r1"]))?.stdout ?? "").contains("let its lease run out")
        }
        let r = try await p.outbox(["enqueue", "note", "--vars", #"{"n": 2}"#, "--id", "r1"])
        #expect(r.exitCode == 75)
        #expect(
            r.stderr.hasPrefix(
                "outbox: E_RUNNING: entry r1 was being sent by a runner that let its lease run out (stopped, killed or cut off from the database) and the new body differs; a live runner puts it back in the queue: enqueue it again then"
            ), "\(r.stderr)")
    }

    // A wrong password is E_STORAGE (74) with the server's message and without the password.
    @Test func aWrongPasswordExits74() async throws {
        let (p, _) = try Self.project()
        let cluster = try PostgresCluster.shared()
        let bad = cluster.url(schema: "cli_wrong", password: "wrong-secret-7")
        let r = try await p.outbox(["list"], environment: ["OUTBOX_STORE": bad])
        #expect(r.exitCode == 74, "\(r)")
        #expect(r.stderr.contains("password authentication failed"))
        #expect(!r.stderr.contains("wrong-secret-7"))
    }

    // A bad schema name in the URL is a config error (78) naming it.
    @Test func aBadSchemaExits78() async throws {
        let (p, _) = try Self.project()
        let r = try await p.outbox(["list"], environment: ["OUTBOX_STORE": "postgres://u@127.0.0.1:1/db?schema=Bad-Name"])
        #expect(r.exitCode == 78, "\(r)")
        #expect(r.stderr.contains("schema \"Bad-Name\""))
    }

    // A URL parameter libpq refuses (misspelt, or a value of the wrong kind) is a mistake in
    // the config (78), not a server out of reach (74), and the password stays hidden.
    @Test(arguments: ["sslmod=disable", "connect_timeout=abc"])
    func aURLParameterLibpqRefusesExits78(_ parameter: String) async throws {
        let (p, url) = try Self.project()
        let r = try await p.outbox(["list"], environment: ["OUTBOX_STORE": url + "&" + parameter])
        #expect(r.exitCode == 78, "\(r)")
        #expect(r.stderr.hasPrefix("outbox: E_CONFIG: store: the PostgreSQL URL "), "\(r)")
        #expect(r.stderr.contains(" is refused: invalid "), "\(r)")
        #expect(!r.stderr.contains(PostgresCluster.password), "\(r)")
    }
}
