import Foundation
import Glibc
import OutboxModel
import OutboxRunner
import TestSupport
import Testing

/// Metrics: counters kept in the store (cumulative across runs), the exposition format
/// checked by a real parser, and `run --metrics-listen` serving them while work is in flight.
struct MetricsTests {
    /// Sample lines of `stats --prometheus`, by series (name and labels as printed).
    static func samples(_ text: String) -> [String: String] {
        var out: [String: String] = [:]
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " ") else { continue }
            out[String(line[..<space])] = String(line[line.index(after: space)...])
        }
        return out
    }

    /// An attempt outbox stopped after it went out (a cancel) counts as `aborted`, as its event
    /// says: not `retry`, since it is never sent again.
    @Test func aCancelledAttemptCountsAsAborted() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        defer { p.server.release("c") }
        try await p.enqueue("t", path: "/hold/c", id: "c")
        let runner = try p.start(["run", "--events", "-"])
        #expect(await p.server.waitForHeld("c"))
        #expect(try await p.outbox(["cancel", "c"]).exitCode == 0)
        await eventually("the cancel reported") { runner.stdoutSoFar.contains(#""outcome":"aborted""#) }
        runner.signal(SIGTERM)
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0 && !finished.timedOut, "\(finished)")
        let s = Self.samples(try await p.outbox(["stats", "--prometheus"]).stdout)
        #expect(s[#"outbox_attempts_total{key="t",result="aborted"}"#] == "1", "\(s)")
        #expect(s[#"outbox_attempts_total{key="t",result="retry"}"#] == nil, "\(s)")
    }

    @Test func countersAreKeptInTheStoreAcrossRuns() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/seq/m/503,200", id: "a")
        try await p.enqueue("t", path: "/status/400", id: "b")
        let first = try await p.drain(failures: 1)
        #expect(first.exitCode == 1, "b settles error: \(first.stderr)")
        var s = Self.samples(try await p.outbox(["stats", "--prometheus"]).stdout)
        #expect(s[#"outbox_attempts_total{key="t",result="retry"}"#] == "1", "\(s)")
        #expect(s[#"outbox_attempts_total{key="t",result="success"}"#] == "1")
        #expect(s[#"outbox_attempts_total{key="t",result="error"}"#] == "1")
        #expect(s[#"outbox_hook_deliveries_total{key="t"}"#] == "2")
        #expect(s["outbox_request_duration_seconds_count"] == "3")
        #expect(s[#"outbox_request_duration_seconds_bucket{le="+Inf"}"#] == "3")
        // Each attempt sent the same small JSON body; the one accepted is counted once more.
        let sent = try #require(s[#"outbox_sent_bytes_total{key="t"}"#].flatMap { Int($0) })
        let accepted = try #require(s[#"outbox_accepted_bytes_total{key="t"}"#].flatMap { Int($0) })
        #expect(sent > 0 && sent == 3 * accepted, "sent \(sent), accepted \(accepted)")

        // A second run adds to what the first left: the counters belong to the store.
        try await p.enqueue("t", path: "/status/201", id: "c")
        _ = try await p.drain(failures: 0)
        s = Self.samples(try await p.outbox(["stats", "--prometheus"]).stdout)
        #expect(s[#"outbox_attempts_total{key="t",result="success"}"#] == "2", "\(s)")
        #expect(s[#"outbox_hook_deliveries_total{key="t"}"#] == "3")
        #expect(s["outbox_request_duration_seconds_count"] == "4")
        let json = try JSON.parse(try await p.outbox(["stats", "--json"]).stdout)
        #expect(json["request_duration_seconds"]?["count"] == .int(4))
        let attempts = json["counters"]?.arrayValue?.filter { $0["name"]?.stringValue == "outbox_attempts_total" } ?? []
        #expect(attempts.count == 3, "\(attempts)")
    }

    /// A hook that cancels its own entry (which forgets the outcome it was given) and exits 0
    /// is a delivery in the run's summary and in the store's counters alike.
    @Test func aHookThatCancelsItsOwnEntryIsCountedAsDelivered() async throws {
        let p = try Project(definitions: ["t": definition("t", top: "on_success: hooks/cancel.sh", hooks: false)])
        try p.writeHook("cancel.sh", "#!/bin/sh\ncat > /dev/null\nexec \"\(p.executable)\" cancel \"$OUTBOX_ID\" > /dev/null\n")
        try await p.enqueue("t", path: "/status/200", id: "a")
        try await p.enqueue("t", path: "/status/200", id: "b")
        let run = try await p.drain(["--json"], failures: 0)
        #expect(run.json?.int("delivered") == 2, "\(run.stdout)")
        #expect(try await p.list().isEmpty, "both entries were cancelled and forgotten")
        let s = Self.samples(try await p.outbox(["stats", "--prometheus"]).stdout)
        #expect(s[#"outbox_hook_deliveries_total{key="t"}"#] == "2", "\(s)")
    }

    @Test func aHookThatFailsIsCounted() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        p.touch("hooks/fail")
        try await p.enqueue("t", path: "/status/200", id: "a")
        let runner = try p.start(["run"])
        await eventually("two failed deliveries") { p.deliveries("a").count >= 2 }
        p.remove("hooks/fail")
        try await eventually("the delivery is acknowledged") {
            Self.samples(try await p.outbox(["stats", "--prometheus"]).stdout)[#"outbox_hook_deliveries_total{key="t"}"#] == "1"
        }
        runner.signal(SIGTERM)
        #expect(await runner.wait().exitCode == 0)
        let s = Self.samples(try await p.outbox(["stats", "--prometheus"]).stdout)
        let failures = try #require(s[#"outbox_hook_failures_total{key="t"}"#].flatMap { Int($0) })
        #expect(failures == p.deliveries("a").count - 1, "every delivery but the last failed")
    }

    /// prometheus_client's own parser (from PyPI, in the test venv) reads the text: names,
    /// types, histogram buckets and label escaping are as the format wants.
    @Test func aRealParserReadsTheExposition() async throws {
        // A key with a quote and a backslash: label values must be escaped.
        let odd = #"odd"k\ey"#
        let p = try Project(definitions: ["t": definition("t"), "odd": definition(odd)])
        try await p.enqueue("t", path: "/seq/p/500,200", id: "a")
        try await p.enqueue(odd, path: "/status/200", id: "b")
        _ = try await p.drain(failures: 0)
        let text = try await p.outbox(["stats", "--prometheus"]).stdout
        let file = try p.write("metrics.prom", text)
        let script = """
            import json, sys
            from prometheus_client.parser import text_string_to_metric_families
            out = {}
            for family in text_string_to_metric_families(open(sys.argv[1]).read()):
                out[family.name] = {"type": family.type, "samples": [[s.name, s.labels, s.value] for s in family.samples]}
            print(json.dumps(out))
            """
        // python3 from PATH, as .ci/run sets it (the test venv first); waited for off the test pool.
        let environment = ProcessInfo.processInfo.environment
        let result = try await offload { try runProcess("/usr/bin/env", ["python3", "-c", script, file], environment: environment) }
        let stdout = result.stdout
        #expect(result.exitCode == 0, "prometheus_client must be installed (.ci/run puts it in the test venv): \(result.stderr)")
        let families = try JSON.parse(stdout)
        #expect(families["outbox_entries"]?["type"] == .string("gauge"))
        #expect(families["outbox_oldest_queued_age_seconds"]?["type"] == .string("gauge"))
        #expect(families["outbox_attempts"]?["type"] == .string("counter"), "\(stdout)")
        #expect(families["outbox_hook_deliveries"]?["type"] == .string("counter"))
        #expect(families["outbox_sent_bytes"]?["type"] == .string("counter"))
        #expect(families["outbox_request_duration_seconds"]?["type"] == .string("histogram"))
        // Each sample is [name, labels, value].
        func samples(_ family: String) -> [(name: String, labels: JSON, value: Double)] {
            (families[family]?["samples"]?.arrayValue ?? []).compactMap { sample in
                guard let a = sample.arrayValue, a.count == 3, let name = a[0].stringValue, let value = a[2].doubleValue else { return nil }
                return (name, a[1], value)
            }
        }
        let counts = samples("outbox_request_duration_seconds").filter { $0.name == "outbox_request_duration_seconds_bucket" }.map(\.value)
        #expect(counts.count == 15 && counts == counts.sorted() && counts.last == 3, "cumulative buckets: \(counts)")
        let attempts = samples("outbox_attempts")
        #expect(attempts.contains { $0.labels["key"] == .string("t") && $0.labels["result"] == .string("retry") && $0.value == 1 })
        #expect(
            attempts.contains { $0.labels["key"] == .string(odd) && $0.labels["result"] == .string("success") && $0.value == 1 },
            "\(attempts)")
    }

    @Test func theRunnerServesMetricsWhileWorkIsInFlight() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        defer { p.server.release("m") }
        try await p.enqueue("t", path: "/hold/m/status/200", id: "a")
        let runner = try p.start(["run", "--metrics-listen", "127.0.0.1:0"])
        #expect(await p.server.waitForHeld("m"), "\(runner.stderrSoFar)")
        // The claim is committed at the end of its turn, which may come after the request
        // left: the page reads the store, so it shows the entry running only once it is.
        try await eventually("the claim to be committed") { try await p.states()["a"] == "running" }
        var address: String?
        await eventually("the metrics address in the log") {
            address = runner.loggedMetricsURL
            return address != nil
        }
        let url = try #require(address)
        let during = try TestHTTPCurl.run(["-s", "-i", url])
        #expect(during.stdoutText.hasPrefix("HTTP/1.1 200"), "\(during.stdoutText)")
        #expect(during.stdoutText.contains("Content-Type: text/plain; version=0.0.4"))
        #expect(during.stdoutText.contains("\noutbox_entries{state=\"running\"} 1\n"), "\(during.stdoutText)")
        #expect(try TestHTTPCurl.statusCode(url.replacingOccurrences(of: "/metrics", with: "/other")).code == 404)
        #expect(try TestHTTPCurl.statusCode(url, ["-X", "POST"]).code == 405)
        _ = p.server.release("m")
        try await eventually("the attempt is counted, as the runner goes on") {
            let text = try TestHTTPCurl.run(["-s", url]).stdoutText
            return text.contains("\noutbox_attempts_total{key=\"t\",result=\"success\"} 1\n")
        }
        runner.signal(SIGTERM)
        #expect(await runner.wait().exitCode == 0)
        #expect(try TestHTTPCurl.statusCode(url).code == 0, "nothing listens once the runner is gone")
    }

    /// Clients that open a connection and never finish their request (slowloris) cannot keep
    /// a scrape out: connections are served side by side, and the oldest unfinished one makes
    /// room once all are taken. (One at a time, these 40 would have held it for 200 s.)
    @Test func slowClientsDoNotKeepAScrapeOut() throws {
        let listener = try MetricsListener(address: .parse("127.0.0.1:0"), contentType: "text/plain") { (200, "ok 1\n") }
        defer { listener.stop() }
        let port = try #require(URLComponents(string: listener.url)?.port)
        var slow: [Int32] = []
        defer { for s in slow { close(s) } }
        for _ in 0..<(MetricsListener.maxConnections + 8) {
            let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            _ = fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK)
            var a = sockaddr_in()
            a.sin_family = sa_family_t(AF_INET)
            a.sin_port = in_port_t(UInt16(port).bigEndian)
            inet_pton(AF_INET, "127.0.0.1", &a.sin_addr)
            _ = withUnsafePointer(to: &a) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(s, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            _ = "GET /metrics HTTP/1.1\r\nX-Slow: ".withCString { send(s, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
            slow.append(s)
        }
        let scrape = try TestHTTPCurl.run(["-s", "-m", "60", listener.url])
        #expect(scrape.stdoutText == "ok 1\n", "\(scrape)")
    }

    /// Bad addresses are usage errors before anything starts; a port another process holds
    /// is E_RUNNING naming it; the queue is left as it was.
    @Test(arguments: [
        ("0.0.0.0:9100", 64, "listens on every interface"), ("[::]:9100", 64, "listens on every interface"),
        ("metrics.example:9100", 64, "does not name an IP address"), ("127.0.0.1:70000", 64, "not a number from 0"),
        ("[::1:9100", 64, "is not [ADDRESS]:PORT"), ("abc", 64, "not a number from 0"),
    ])
    func badAddressesAreRefused(_ address: String, _ status: Int32, _ message: String) async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200", id: "a")
        let before = try await p.list()
        let r = try await p.outbox(["run", "--drain", "--metrics-listen", address])
        #expect(r.exitCode == status, "\(r.stderr)")
        #expect(r.stderr.contains("E_USAGE: --metrics-listen: ") && r.stderr.contains(message), "\(r.stderr)")
        #expect(try await p.list() == before)
        #expect(p.server.requests.isEmpty)
    }

    @Test func aPortInUseIsNamed() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200", id: "a")
        let busy = "127.0.0.1:\(p.server.port)"
        let r = try await p.outbox(["run", "--drain", "--metrics-listen", busy])
        #expect(r.exitCode == 75, "\(r.stderr)")
        #expect(r.stderr.contains("E_RUNNING: --metrics-listen: \(busy) is in use by another process"), "\(r.stderr)")
        #expect(try await p.states() == ["a": "queued"])
        #expect(p.server.requests.isEmpty)
    }
}
