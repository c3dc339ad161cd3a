import Foundation
import OutboxModel
import OutboxTestServer
import Testing
import TestSupport

/// A runner whose PostgreSQL server goes away mid-run (stopped by `pg_ctl`, a cluster of the
/// test's own): it keeps its requests in flight, reconnects once the server is back, and
/// settles them there without sending anything again; asked to stop while the server is
/// away, it ends with E_STORAGE instead of waiting on.
@Suite(.serialized)
struct PostgresOutageTests {
    /// A project on `store` whose `note` hook appends the entry id to `hook.log`. No stall
    /// limit and a long lease: requests held across an outage, which is slow under a
    /// sanitizer, must not be given up and sent again.
    static func project(store: String) throws -> TestProject {
        let p = try TestProject(
            config: heldRequestConfig,
            definitions: [
                "note": """
                key: note
                request:
                  url: "{{ env.SERVER | raw }}/notes/{{ vars.n }}"
                  data: { n: "{{ vars.n }}" }
                on_success: hooks/log.sh
                """
            ])
        try p.writeHook("log.sh", "#!/bin/sh\necho \"$OUTBOX_ID\" >> '\(p.path("hook.log"))'\n")
        p.environment["OUTBOX_STORE"] = store
        p.environment["SERVER"] = p.server.baseURL
        return p
    }

    @Test func aRunnerKeepsItsWorkWhileTheServerIsAway() async throws {
        let cluster = try PostgresCluster.makePrivate()
        let p = try Self.project(store: cluster.url(schema: "outage"))
        p.server.script("/notes/", [.hold("away"), .hold("away")])
        let lines = #"{"vars": {"n": 1}, "id": "e-1"}"# + "\n" + #"{"vars": {"n": 2}, "id": "e-2"}"# + "\n"
        let enqueued = try await p.outbox(["enqueue", "note", "--from", "-"], stdin: lines)
        #expect(enqueued.exitCode == 0, "\(enqueued)")

        let runner = try p.start(["run", "--metrics-listen", "127.0.0.1:0"])
        #expect(await p.server.waitForHeld("away", count: 2))
        var address: String?
        await eventually("the metrics address in the log") {
            address = runner.loggedMetricsURL
            return address != nil
        }
        let metrics = try #require(address)
        #expect(try TestHTTPCurl.statusCode(metrics).code == 200, "the metrics' own connection is open")
        try cluster.stop()
        await eventually("the runner notices the server is gone") { runner.stderrSoFar.contains("reconnecting") }
        // The answers arrive while the store cannot take them.
        #expect(p.server.release("away") == 2)
        let refused = try await p.outbox(["list", "--json"])
        #expect(refused.exitCode == 74, "a command fails at once while the server is away: \(refused)")
        #expect(refused.stdout.contains("\"E_STORAGE\""), "\(refused)")
        try cluster.start()
        await eventually("the runner is connected again") { runner.stderrSoFar.contains("connected again") }
        // The metrics' connection was lost with the server too: it is opened again.
        #expect(try TestHTTPCurl.statusCode(metrics).code == 200, "metrics after the server came back")
        await eventually("both outcomes are delivered") { (p.read("hook.log") ?? "").split(separator: "\n").count == 2 }
        // A hook writes its line before it exits, and the runner commits its acknowledgement
        // (which forgets the entry) after: until then `list` still shows it completed.
        var list = try await p.outbox(["list", "--json"])
        try await eventually("both acknowledgements are committed") {
            list = try await p.outbox(["list", "--json"])
            guard list.exitCode == 0 else { return true }
            return try JSON.parse(list.stdout).arrayValue?.isEmpty == true
        }
        #expect(list.exitCode == 0, "\(list)")
        #expect(try JSON.parse(list.stdout).arrayValue?.isEmpty == true, "\(list.stdout)")
        #expect(p.server.requests(path: "/notes/").count == 2, "nothing was sent again")
        #expect((p.read("hook.log") ?? "").split(separator: "\n").sorted() == ["e-1", "e-2"])

        // Away again, and asked to stop: the runner gives up waiting and says why.
        try cluster.stop()
        await eventually("the runner notices again") {
            runner.stderrSoFar.components(separatedBy: "reconnecting").count == 3
        }
        runner.signal(SIGTERM)
        let ended = await runner.wait(timeout: 120)
        #expect(ended.exitCode == 74 && !ended.timedOut, "\(ended)")
        #expect(ended.stderr.contains("E_STORAGE"), "\(ended.stderr)")
        // One "reconnecting" per loss: stopping while away announces no more.
        #expect(ended.stderr.components(separatedBy: "reconnecting").count == 3, "\(ended.stderr)")
        // Every line is the runner's own, in the log's format: libpq prints nothing of its own.
        let foreign = ended.stderr.split(separator: "\n").filter { !$0.hasPrefix("20") && !$0.hasPrefix("outbox: ") }
        #expect(foreign.isEmpty, "\(foreign)")
    }

    /// A statement the server cancels (here `statement_timeout`, while another session holds
    /// the table) rolled its transaction back: the runner runs it again instead of stopping
    /// with 74, and the request the server answered is not sent again.
    @Test func aCancelledStatementRunsAgain() async throws {
        let schema = PostgresCluster.uniqueSchema("cancel")
        let url = try PostgresCluster.shared().url(schema: schema)
        let plain = String(url.prefix { $0 != "?" })
        let p = try Self.project(store: url)
        #expect(try await p.outbox(["enqueue", "note", "--vars", #"{"n": 1}"#, "--id", "e-1"]).exitCode == 0)
        p.server.script("/notes/", [.hold("answer")])
        // Every statement of the runner's session is cancelled after a second. A statement is
        // run again at most 50 times (then the runner stops with 74): the polls below have
        // 50 s, not the 15 s that 300 ms left a loaded machine. Named after the schema, so the
        // polls see this runner's session only, not another test's on the shared cluster.
        let runner = try p.start(
            ["run"], environment: ["OUTBOX_STORE": url + "&options=-c%20statement_timeout%3D1000&application_name=\(schema)"])
        #expect(await p.server.waitForHeld("answer"))
        // Another session holds the entries table; the answer's settle waits for it.
        let locker = try RunningProcess(
            executable: "/usr/bin/psql",
            arguments: [
                plain, "-v", "ON_ERROR_STOP=1", "-c", "BEGIN; LOCK TABLE \(schema).entries IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(600);",
            ],
            cwd: p.root, environment: ["PATH": "/usr/bin:/bin", "PGAPPNAME": "outbox-test-locker"])
        defer { locker.signal(SIGKILL) }
        func psql(_ sql: String) throws -> String {
            let r = try RunningProcess(
                executable: "/usr/bin/psql", arguments: [plain, "-At", "-c", sql], cwd: p.root, environment: ["PATH": "/usr/bin:/bin"])
            let done = r.waitBlocking(timeout: 60)
            return done.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        await eventually("the test session holds the table") {
            (try? psql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-test-locker' AND wait_event = 'PgSleep'"))
                == "1"
        }
        #expect(p.server.release("answer") == 1)
        // The runner's statement waits for the lock, is cancelled, and waits again: two starts seen.
        var starts = Set<String>()
        await eventually("a cancelled statement run again", timeout: 60) {
            let waiting =
                (try? psql(
                    "SELECT query_start FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name = '\(schema)'"))
                ?? ""
            starts.formUnion(waiting.split(separator: "\n").map(String.init).filter { !$0.isEmpty })
            return starts.count >= 2 || !runner.isRunning
        }
        #expect(runner.isRunning, "the runner stopped: \(runner.stderrSoFar)")
        _ = try psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'outbox-test-locker'")
        await eventually("the outcome is delivered") { (p.read("hook.log") ?? "") == "e-1\n" || !runner.isRunning }
        runner.signal(SIGTERM)
        let ended = await runner.wait(timeout: 120)
        #expect(ended.exitCode == 0, "\(ended)")
        #expect(p.server.requests(path: "/notes/").count == 1, "nothing was sent again")
    }
}
