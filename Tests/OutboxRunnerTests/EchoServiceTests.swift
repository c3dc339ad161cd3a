import Foundation
import Testing
import TestSupport

// The repository's own config and example definitions (the demo's) against httpbin, an
// HTTP echo service written by others (Debian's python3-httpbin under gunicorn), on
// loopback: what the service says it received is what the definitions describe.

@Suite struct EchoServiceTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    /// httpbin under gunicorn, two workers, in `folder`.
    static func httpbin(_ folder: String) async throws -> LoopbackService {
        let environment = ["PATH": "/usr/bin:/bin", "HOME": folder, "PYTHONDONTWRITEBYTECODE": "1"]
        return try await LoopbackService(
            "httpbin", executable: "/usr/bin/gunicorn", folder: folder, environment: environment, readyPath: "/get"
        ) { port in ["--bind", "127.0.0.1:\(port)", "--workers", "2", "httpbin:app"] }
    }

    /// A project and httpbin serving it; nil, with the test failed, when httpbin is not
    /// installed (a missing service is a failure, never a silent pass).
    static func start() async throws -> (OutboxSandbox, LoopbackService)? {
        for (file, package) in [("/usr/bin/gunicorn", "gunicorn"), ("/usr/lib/python3/dist-packages/httpbin/core.py", "python3-httpbin")]
        where !FileManager.default.fileExists(atPath: file) {
            Issue.record("\(file) is missing: install Debian's \(package) (.ci/setup does with OUTBOX_SETUP_TESTS=1)")
            return nil
        }
        let sandbox = try OutboxSandbox()
        return (sandbox, try await httpbin(sandbox.path("server")))
    }

    /// Writes at `hook` a hook that keeps each outcome it is handed as `ID.json` in the
    /// folder it returns.
    static func keepingHook(_ sandbox: OutboxSandbox, at hook: String) throws -> String {
        let kept = sandbox.path("outcomes")
        try FileManager.default.createDirectory(atPath: kept, withIntermediateDirectories: true)
        _ = try sandbox.write(hook, "#!/bin/sh\ncat > '\(kept)'/\"$OUTBOX_ID.json\"\n", mode: 0o755)
        return kept
    }

    /// The outcome a hook kept for `id`, as a dictionary.
    static func outcome(_ folder: String, _ id: String) throws -> [String: Any] {
        let data = try Data(contentsOf: URL(fileURLWithPath: folder + "/" + id + ".json"))
        return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    /// What httpbin echoed: the outcome's parsed `data`, or its response body parsed here.
    static func echoed(_ outcome: [String: Any]) throws -> [String: Any] {
        if let data = outcome["data"] as? [String: Any] { return data }
        let body = try #require((outcome["response"] as? [String: Any])?["body"] as? String)
        return try #require(try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])
    }

    @Test func theExampleDefinitionsSendWhatTheySay() async throws {
        guard let (sandbox, httpbin) = try await Self.start() else { return }
        defer { httpbin.stop() }
        _ = try sandbox.write(
            "config/outbox.yaml", try String(contentsOfFile: Self.repository + "/config/outbox.yaml", encoding: .utf8))
        try? FileManager.default.removeItem(atPath: sandbox.path("definitions"))
        try copyClosedOnExec(Self.repository + "/definitions", to: sandbox.path("definitions"))
        // The hook the definitions name keeps each outcome it is handed.
        let kept = try Self.keepingHook(sandbox, at: "definitions/hooks/print-outcome.sh")
        let base = httpbin.url + "/anything"
        // A form, which the demo has none of: Werkzeug's multipart parser reads it back.
        _ = try sandbox.write(
            "definitions/form.yaml",
            """
            key: form.post
            request:
              method: POST
              url: "{{ env.OUTBOX_DEMO_URL | raw }}/form"
              form:
                - { name: note, value: "{{ vars.note }}" }
                - { name: count, value: "{{ vars.count }}" }
                - { name: photo, file: "{{ vars.photo }}", filename: "ph\\"oto ✓.txt", content_type: text/plain }
            on_success: definitions/hooks/print-outcome.sh
            on_error: definitions/hooks/print-outcome.sh

            """)
        let photo = try sandbox.write("photo.txt", "line one\r\nline two\n--not a boundary\n")
        let env = ["OUTBOX_DEMO_URL": base, "OUTBOX_DEMO_TOKEN": "token-abc"]

        let comment = "héllo \"quoted\"\nsecond line ✓"
        let commentVars = try String(
            decoding: JSONSerialization.data(withJSONObject: ["site_id": "s1", "note_id": "n7", "comment": comment]), as: UTF8.self)
        let capture = sandbox.path("capture.bin")
        try Data((0..<600_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 11) }).write(to: URL(fileURLWithPath: capture))
        let enqueues: [[String]] = [
            ["enqueue", "note.comment.add", "--vars", commentVars, "--id", "c-1"],
            ["enqueue", "capture.upload", "--vars", #"{"path": "\#(capture)", "name": "cap.bin"}"#, "--id", "cap-1"],
            ["enqueue", "webhook.deliver", "--vars", #"{"url": "\#(base)/hook?x=1&y=2", "event": "e1"}"#, "--id", "w-1"],
            ["enqueue", "form.post", "--vars", #"{"note": "ünïcode & spaces", "count": 3, "photo": "\#(photo)"}"#, "--id", "f-1"],
        ]
        for arguments in enqueues {
            let r = try await sandbox.outbox(arguments, environment: env)
            #expect(r.status == 0, "\(r)")
        }
        let run = try await sandbox.outbox(["run", "--drain"], environment: env)
        // The comment's follow-up (notify-c-1) is the fifth.
        #expect(run.status == 0 && run.stderr.contains("5 completed, 0 error"), "\(run)")

        // The JSON API write: its path, body, headers from the definition and the config, and
        // the Idempotency-Key the outcome names.
        let added = try Self.outcome(kept, "c-1")
        #expect(added["outcome"] as? String == "completed")
        #expect((added["response"] as? [String: Any])?["status"] as? Int == 200)
        let request = try Self.echoed(added)
        let headers = request["headers"] as? [String: String] ?? [:]
        #expect(request["method"] as? String == "POST")
        #expect(request["url"] as? String == base + "/sites/s1/notes/n7/comments")
        #expect(request["json"] as? [String: String] == ["comment": comment, "author": "field-app"])
        #expect(headers["Authorization"] == "Bearer token-abc")
        #expect(headers["X-Client"] == "outbox-demo")
        #expect(headers["Content-Type"]?.hasPrefix("application/json") == true, "\(headers)")
        let key = try #require((added["meta"] as? [String: Any])?["idempotency_key"] as? String)
        #expect(!key.isEmpty && headers["Idempotency-Key"] == key, "\(headers)")

        // Its follow-up, chained by the outcome.
        let notified = try Self.outcome(kept, "notify-c-1")
        #expect((notified["meta"] as? [String: Any])?["parent"] as? String == "c-1")
        let notice = try Self.echoed(notified)
        #expect(notice["url"] as? String == base + "/echo")
        #expect(notice["json"] as? [String: String] == ["event": "comment-added", "note": "n7"])

        // A webhook whose whole URL is a var, query included.
        let hook = try Self.echoed(try Self.outcome(kept, "w-1"))
        #expect(hook["args"] as? [String: String] == ["x": "1", "y": "2"])
        #expect(hook["json"] as? [String: String] == ["event": "e1", "note": ""])

        // The form: its fields, a number as its JSON text, and the file's bytes.
        let form = try Self.echoed(try Self.outcome(kept, "f-1"))
        #expect(form["form"] as? [String: String] == ["note": "ünïcode & spaces", "count": "3"], "\(form)")
        #expect(form["files"] as? [String: String] == ["photo": "line one\r\nline two\n--not a boundary\n"], "\(form)")
        #expect((form["headers"] as? [String: String])?["Content-Type"]?.hasPrefix("multipart/form-data; boundary=") == true)

        // The chunked upload: every part taken.
        let uploaded = try Self.outcome(kept, "cap-1")
        #expect(uploaded["outcome"] as? String == "completed")
        let parts = uploaded["parts"] as? [[String: Any]] ?? []
        #expect(parts.count >= 3 && parts.allSatisfy { $0["status"] as? Int == 200 }, "\(parts)")
        #expect(try await sandbox.list().isEmpty)
    }

    /// Redirects as httpbin makes them (`/redirect-to`): a 307 or 308 re-sends the POST with
    /// its body to the new place; a 302 of a POST is not followed (it would lose the body) and
    /// settles `error`; with `redirect_method_change` a 303 is followed as a GET without it.
    @Test func redirectsOfAPostAreFollowedAsTheDefinitionSays() async throws {
        guard let (sandbox, httpbin) = try await Self.start() else { return }
        defer { httpbin.stop() }
        let kept = try Self.keepingHook(sandbox, at: "hooks/keep.sh")
        for (key, change) in [("hop", false), ("hop.change", true)] {
            _ = try sandbox.write(
                "definitions/\(key).yaml",
                """
                key: \(key)
                request:
                  method: POST
                  url: "{{ vars.url }}"
                  data: { n: 1 }
                  follow_redirects: 3
                  redirect_method_change: \(change)
                on_success: hooks/keep.sh
                on_error: hooks/keep.sh

                """)
        }
        let landing = httpbin.url + "/anything/landed"
        let encoded = landing.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? landing
        func via(_ status: Int) -> String { httpbin.url + "/redirect-to?url=\(encoded)&status_code=\(status)" }
        let cases: [(id: String, key: String, status: Int)] = [
            ("r307", "hop", 307), ("r308", "hop", 308), ("r302", "hop", 302), ("r303", "hop.change", 303),
        ]
        for c in cases {
            let r = try await sandbox.outbox(["enqueue", c.key, "--id", c.id, "--vars", #"{"url": "\#(via(c.status))"}"#])
            #expect(r.status == 0, "\(r)")
        }
        let run = try await sandbox.outbox(["run", "--drain"])
        // Exit 1: an entry settled error (the 302), and every outcome reached its hook.
        #expect(run.status == 1 && run.stderr.contains("3 completed, 1 error"), "\(run)")
        for id in ["r307", "r308"] {
            let echoed = try Self.echoed(try Self.outcome(kept, id))
            #expect(echoed["method"] as? String == "POST" && echoed["url"] as? String == landing, "\(id): \(echoed)")
            #expect(echoed["json"] as? [String: Int] == ["n": 1], "\(id): \(echoed)")
        }
        let refused = try Self.outcome(kept, "r302")
        #expect((refused["error"] as? [String: Any])?["kind"] as? String == "http", "\(refused)")
        #expect((refused["response"] as? [String: Any])?["status"] as? Int == 302)
        let changed = try Self.echoed(try Self.outcome(kept, "r303"))
        #expect(changed["method"] as? String == "GET" && changed["url"] as? String == landing, "\(changed)")
        #expect(changed["data"] as? String == "" && changed["json"] is NSNull, "\(changed)")
    }

    /// httpbin's Basic auth: a wrong credential (401) parks the entry `awaiting-auth`, and
    /// `headers update` with the right one sends it again; neither credential is printed.
    @Test func aRefusedCredentialWaitsForHeadersUpdate() async throws {
        guard let (sandbox, httpbin) = try await Self.start() else { return }
        defer { httpbin.stop() }
        _ = try sandbox.write(
            "definitions/auth.yaml",
            """
            key: auth
            request:
              method: GET
              url: "{{ env.BASE | raw }}/basic-auth/ann/s3cret"
              headers:
                Authorization: "Basic {{ env.CRED }}"
            response: json

            """)
        let wrong = Data("ann:wrong-one".utf8).base64EncodedString(), right = Data("ann:s3cret".utf8).base64EncodedString()
        let enqueue = try await sandbox.outbox(
            ["enqueue", "auth", "--id", "a-1"], environment: ["BASE": httpbin.url, "CRED": wrong])
        #expect(enqueue.status == 0, "\(enqueue)")
        // Exit 2: an entry is left awaiting-auth.
        let refused = try await sandbox.outbox(["run", "--drain"])
        #expect(refused.status == 2, "\(refused)")
        #expect(try await sandbox.show("a-1")?["state"] as? String == "awaiting-auth")
        let shown = try await sandbox.outbox(["show", "a-1", "--json"])
        #expect(!shown.stdout.contains(wrong) && !refused.stderr.contains(wrong), "\(shown)")

        let update = try await sandbox.outbox(["headers", "update", "Authorization: Basic \(right)"])
        #expect(update.status == 0 && !update.stdout.contains(right) && !update.stderr.contains(right), "\(update)")
        let sent = try await sandbox.outbox(["run", "--drain", "--json"])
        #expect(sent.status == 0 && !sent.stdout.contains(right) && !sent.stderr.contains(right), "\(sent)")
        let summary = sent.jsonObject as? [String: Any] ?? [:]
        #expect(summary["completed"] as? Int == 1 && summary["attempts"] as? Int == 1, "\(summary)")
        #expect(try await sandbox.list().isEmpty)
    }
}
