import Foundation
import OutboxCLI
import OutboxModel
import Testing
import TestSupport

/// A lowercase UUID of `version`: default entry ids are time-ordered (7), idempotency keys random (4).
private func isUUID(_ s: String?, version: Character) -> Bool {
    guard let s, s.wholeMatch(of: #/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[89ab][0-9a-f]{3}-[0-9a-f]{12}/#) != nil else { return false }
    return s[s.index(s.startIndex, offsetBy: 14)] == version
}

private func isEntryUUID(_ s: String?) -> Bool { isUUID(s, version: "7") }

struct CLIBasicsTests {
    static let commandPaths: [[String]] = [
        ["init"], ["check"], ["render"], ["enqueue"], ["run"], ["list"], ["show"], ["cancel"], ["pause"], ["resume"],
        ["headers", "update"], ["wifi-only"], ["chunk-plan"], ["stats"], ["explain"], ["audit"], ["completion"],
        ["man"],
    ]

    @Test(arguments: commandPaths)
    func helpOnEveryCommand(_ path: [String]) throws {
        let p = try CLIProject(empty: true)
        let r = p.run(path + ["--help"])
        #expect(r.status == 0)
        #expect(r.out.hasPrefix("outbox \(path.joined(separator: " ")) — "), "\(r.out)")
        #expect(r.out.contains("Usage: outbox \(path.joined(separator: " "))"))
        #expect(r.err.isEmpty)
        #expect(!p.storeExists)
        let viaHelp = p.run(["help"] + path)
        #expect(viaHelp.status == 0)
        #expect(viaHelp.out == r.out)
    }

    @Test func overviewAndVersion() throws {
        let p = try CLIProject(empty: true)
        let help = p.run("--help")
        #expect(help.status == 0)
        for path in Self.commandPaths { #expect(help.out.contains("  " + path.joined(separator: " ") + " ")) }
        let bare = p.run([])
        #expect(bare.status == 64)
        #expect(bare.out == help.out)
        let version = p.run("--version")
        #expect(version.status == 0)
        #expect(version.out == "outbox 0.1.0\n")
    }

    struct UsageCase: Sendable, CustomTestStringConvertible {
        let args: [String]
        let message: String
        var testDescription: String { args.joined(separator: " ") }
    }

    static let usageErrors: [UsageCase] = [
        UsageCase(args: ["frobnicate"], message: "outbox: E_USAGE: unknown command \"frobnicate\" (see outbox --help)\n"),
        UsageCase(
            args: ["enqueue", "note", "--bogus"],
            message: "outbox: E_USAGE: unknown option --bogus for `outbox enqueue` (see outbox enqueue --help)\n"),
        UsageCase(args: ["list", "-x"], message: "outbox: E_USAGE: unknown option -x for `outbox list` (see outbox list --help)\n"),
        UsageCase(args: ["enqueue"], message: "outbox: E_USAGE: `outbox enqueue` needs KEY (see outbox enqueue --help)\n"),
        UsageCase(args: ["show", "a", "b"], message: "outbox: E_USAGE: unexpected argument \"b\" for `outbox show`\n"),
        UsageCase(args: ["enqueue", "note", "--vars"], message: "outbox: E_USAGE: --vars needs a value (J|@FILE|-)\n"),
        UsageCase(args: ["enqueue", "note", "--id", "a", "--id", "b"], message: "outbox: E_USAGE: --id is given twice\n"),
        UsageCase(args: ["list", "--json=yes"], message: "outbox: E_USAGE: --json takes no value\n"),
        UsageCase(
            args: ["list", "--state", "sleeping"],
            message:
                "outbox: E_USAGE: --state must be one of queued, running, paused, awaiting-auth, completed, error, cancelled, not \"sleeping\"\n"
        ),
        UsageCase(
            args: ["chunk-plan", "lots"],
            message: "outbox: E_USAGE: SIZE: bad size \"lots\" (use bytes, or KiB, MiB, GiB, TiB, e.g. 8MiB)\n"),
        UsageCase(
            args: ["enqueue", "plain", "--delay", "1m", "--not-before", "5"],
            message: "outbox: E_USAGE: give --delay or --not-before, not both\n"),
        UsageCase(args: ["cancel"], message: "outbox: E_USAGE: cancel takes ids, or --key K, or --all (exactly one of them)\n"),
    ]

    @Test(arguments: usageErrors)
    func usageErrorsExit64(_ c: UsageCase) throws {
        let p = try CLIProject()
        let r = p.run(c.args)
        #expect(r.status == 64)
        #expect(r.err == c.message)
        #expect(r.out.isEmpty)
        #expect(!p.storeExists)
    }

    @Test func initThenCheckPasses() throws {
        let p = try CLIProject(empty: true)
        let created = p.run("init")
        #expect(created.status == 0, "\(created)")
        #expect(created.err.contains("created config/outbox.yaml"))
        #expect(created.err.contains("it posts to http://127.0.0.1:8080/ping"), "the next step names the server it needs")
        #expect(FileManager.default.isExecutableFile(atPath: p.root + "/hooks/example-done.sh"))
        let check = p.run("check")
        #expect(check.status == 0, "\(check)")
        #expect(check.out == "ok: \(p.root)/config/outbox.yaml and 1 definition in \(p.root)/definitions\n")
        let json = p.run("check", "--json")
        #expect(json.out == #"{"ok":true,"definitions":["example.ping"]}"# + "\n")
        let again = p.run("init")
        #expect(again.status == 65)
        #expect(again.err.contains("\(p.root)/config/outbox.yaml exists already"))
        let enqueue = p.run("enqueue", "example.ping", "--vars", #"{"message": "hi"}"#)
        #expect(enqueue.status == 0, "\(enqueue)")
    }

    @Test func initWithJSONSaysWhatItMadeOnStdout() throws {
        let p = try CLIProject(empty: true)
        let made = p.run("init", "--json")
        #expect(made.status == 0, "\(made)")
        #expect(made.out == #"{"created":["config/outbox.yaml","definitions/example-ping.yaml","hooks/example-done.sh"]}"# + "\n")
        #expect(made.err.isEmpty)
        let again = p.run("init", "--json")
        #expect(again.status == 65)
        #expect(again.out.hasPrefix(#"{"error":{"code":"E_INVALID","message":"\#(p.root)/config/outbox.yaml exists already"#))
    }

    @Test func checkPrintsEveryErrorLikeACompiler() throws {
        let p = try CLIProject()
        let a = try p.write(
            "definitions/a-broken.yaml", "key: broken.a\nrequest:\n  url: https://x.example/\n  methd: PUT\nexpires_in: 3 weeks\n")
        let b = try p.write("definitions/b-broken.yaml", "key: broken.b\nrequest:\n  url: gopher://x\n")
        let r = p.run("check")
        #expect(r.status == 78)
        #expect(r.out.isEmpty)
        #expect(
            r.err == """
                \(a):4:3: error: unknown field "methd" in request (known fields: method, url, headers, data, text, form, file, parts, content_type, ownership, follow_redirects, redirect_method_change, wifi_only, idempotency_key, s3)
                  methd: PUT
                  ^
                \(a):5:13: error: expires_in: bad duration "3 weeks" (use 500ms, 30s, 10m, 2h or 14d)
                expires_in: 3 weeks
                            ^
                \(b):3:8: error: request.url: scheme "gopher" is not allowed (http or https only)
                  url: gopher://x
                       ^
                outbox: E_CONFIG: 3 errors

                """)
        let json = p.run("check", "--json")
        #expect(json.status == 78)
        let doc = try json.json()
        #expect(doc["error"]?["code"] == .string("E_CONFIG"))
        #expect(doc["error"]?["message"] == .string("3 errors"))
        #expect(doc["error"]?["diagnostics"]?.arrayValue?.map { $0["line"]?.int64Value } == [4, 5, 3])
        #expect(json.err.isEmpty, "with --json only the document: \(json.err)")
        // The other keys still work.
        #expect(p.run("enqueue", "plain").status == 0)
    }

    @Test func aBrokenConfigIsReportedLikeACompiler() throws {
        let p = try CLIProject(config: "concurrency: many\nbogus: 1\n")
        let r = p.run("check")
        #expect(r.status == 78)
        let file = p.root + "/config/outbox.yaml"
        #expect(
            r.err.hasPrefix(
                "\(file):1:14: error: concurrency must be a whole number, not a string\nconcurrency: many\n             ^\n\(file):2:1: error: unknown field \"bogus\" in the config"
            ))
        #expect(r.err.hasSuffix("outbox: E_CONFIG: 2 errors\n"))
        #expect(p.run("enqueue", "plain").status == 78)
        #expect(!p.storeExists)
    }

    @Test func noProjectIsAConfigError() throws {
        let p = try CLIProject(empty: true)
        let r = p.run("list")
        #expect(r.status == 78)
        #expect(r.err.contains("no config/outbox.yaml in \(p.root)"))
        let explicit = p.run("list", "--config", "missing.yaml")
        #expect(explicit.status == 66)
        #expect(explicit.err.contains("\(p.root)/missing.yaml"))
        // chunk-plan, completion and --version need no project.
        #expect(p.run("chunk-plan", "1MiB").status == 0)
        #expect(p.run("completion", "bash").status == 0)
    }

    @Test func theConfigIsFoundFromASubfolderAndWithOUTBOX_CONFIG() throws {
        let p = try CLIProject()
        try FileManager.default.createDirectory(atPath: p.root + "/a/b", withIntermediateDirectories: true)
        let r = p.run(["enqueue", "plain", "--id", "sub"], cwd: p.root + "/a/b")
        #expect(r.status == 0, "\(r)")
        #expect(FileManager.default.fileExists(atPath: p.storeFolder))
        let elsewhere = try CLIProject(empty: true)
        let viaEnv = elsewhere.run(["list", "--json"], environment: ["OUTBOX_CONFIG": p.root + "/config/outbox.yaml"])
        #expect(viaEnv.status == 0)
        #expect(try viaEnv.json().arrayValue?.map { $0["id"] } == [.string("sub")])
    }
}

struct CLIEnqueueTests {
    @Test func enqueuePrintsTheId() throws {
        let p = try CLIProject()
        let r = p.run("enqueue", "note", "--vars", #"{"n": 7}"#)
        #expect(r.status == 0, "\(r)")
        #expect(r.err.isEmpty)
        let id = r.out.trimmingCharacters(in: .newlines)
        #expect(r.out == id + "\n")
        #expect(isEntryUUID(id), "\(id)")
        let given = p.run("enqueue", "note", "--vars", #"{"n": 8}"#, "--id", "note-8")
        #expect(given.out == "note-8\n")
        let json = p.run("enqueue", "note", "--vars", #"{"n": 9}"#, "--id", "note-9", "--json")
        #expect(json.status == 0)
        #expect(json.out == #"{"id":"note-9"}"# + "\n")
        #expect(try p.rows().map { $0["id"]?.stringValue } == [id, "note-8", "note-9"])
    }

    @Test func varsFromAFileAndFromStdin() throws {
        let p = try CLIProject()
        try p.write("vars.json", #"{"n": "from-file"}"#)
        #expect(p.run("enqueue", "note", "--vars", "@vars.json", "--id", "f").status == 0)
        #expect(p.run(["enqueue", "note", "--vars", "-", "--id", "s"], stdin: #"{"n": "from-stdin"}"#).status == 0)
        let rows = try p.rows()
        #expect(rows.map { $0["vars"]?["n"] } == [.string("from-file"), .string("from-stdin")])
        let missing = p.run("enqueue", "note", "--vars", "@nope.json")
        #expect(missing.status == 66)
        #expect(missing.err == "outbox: E_FILE_MISSING: --vars: cannot read \(p.root)/nope.json: No such file or directory\n")
    }

    @Test func listJSONRowsHaveExactlyTheContractFields() throws {
        let p = try CLIProject()
        let before = Int64(Date().timeIntervalSince1970 * 1000)
        try p.enqueue("note", vars: #"{"n": 1}"#, id: "one")
        let after = Int64(Date().timeIntervalSince1970 * 1000)
        let rows = try p.rows()
        #expect(rows.count == 1)
        let row = try #require(rows.first?.objectValue)
        #expect(
            Set(row.map(\.0)) == [
                "id", "key", "vars", "state", "bytes_sent", "total_bytes", "attempts", "updated_at", "next_attempt_at",
                "reason", "created_at", "generation", "parent",
            ])
        let r = rows[0]
        #expect(r["id"] == .string("one"))
        #expect(r["key"] == .string("note"))
        #expect(r["vars"] == .object([("n", .number("1"))]))
        #expect(r["state"] == .string("queued"))
        #expect(r["bytes_sent"] == .number("0"))
        #expect(r["total_bytes"] == .number("7"))
        #expect(r["attempts"] == .number("0"))
        #expect(r["next_attempt_at"] == .null)
        #expect(r["reason"] == .null)
        #expect(r["generation"] == .number("1"))
        #expect(r["parent"] == .null)
        let created = try #require(r["created_at"]?.int64Value)
        #expect(r["updated_at"]?.int64Value == created)
        #expect((before...after).contains(created), "created_at \(created) is not the enqueue's time")
    }

    /// NEXT of a queued entry: `now` for a new one (it showed `-`), `in ...` for one held by
    /// `--delay` (its retry time alone was read).
    @Test func listSaysWhenAQueuedEntryIsDue() throws {
        let p = try CLIProject()
        #expect(p.run("enqueue", "note", "--id", "fresh", "--vars", #"{"n": 1}"#).status == 0)
        #expect(p.run("enqueue", "note", "--id", "later", "--delay", "1h", "--vars", #"{"n": 2}"#).status == 0)
        let rows = p.run("list").out.split(separator: "\n").map(String.init)
        let fresh = try #require(rows.first { $0.hasPrefix("fresh ") })
        let later = try #require(rows.first { $0.hasPrefix("later ") })
        #expect(fresh.contains(" now "), "\(fresh)")
        #expect(later.contains(" in 59m") || later.contains(" in 1h"), "\(later)")
    }

    @Test func listFilters() throws {
        let p = try CLIProject()
        try p.enqueue("note", vars: #"{"n": 1}"#, id: "n1")
        try p.enqueue("plain", vars: "{}", id: "p1")
        try p.enqueue("note", vars: #"{"n": 2}"#, id: "n2")
        func ids(_ args: [String]) throws -> [String?] {
            let r = p.run(["list", "--json"] + args)
            #expect(r.status == 0, "\(r)")
            return try r.json().arrayValue?.map { $0["id"]?.stringValue } ?? []
        }
        #expect(try ids([]) == ["n1", "p1", "n2"])
        #expect(try ids(["--key", "note"]) == ["n1", "n2"])
        #expect(try ids(["--id", "p1"]) == ["p1"])
        #expect(try ids(["--state", "queued"]) == ["n1", "p1", "n2"])
        #expect(try ids(["--state", "error"]) == [])
        #expect(try ids(["--key", "note", "--id", "p1"]) == [])
        #expect(p.run("pause", "--key", "plain").status == 0)
        #expect(try ids(["--state", "paused"]) == ["p1"])
        #expect(try ids(["--state", "queued"]) == ["n1", "n2"])
        let table = p.run("list", "--key", "note")
        #expect(table.out.hasPrefix("ID"))
        #expect(table.out.split(separator: "\n").count == 3)
        let none = p.run("list", "--key", "nothing")
        #expect(none.out.isEmpty)
        #expect(none.err == "no entries\n")
    }

    @Test func showJSON() throws {
        let p = try CLIProject()
        p.environment = ["API_TOKEN": "tok-123-secret"]
        try p.enqueue("note", vars: #"{"n": 5, "note": "hi"}"#, id: "s1")
        let r = p.run("show", "s1", "--json")
        #expect(r.status == 0, "\(r)")
        #expect(!r.out.contains("tok-123-secret"))
        let doc = try r.json()
        #expect(doc["id"] == .string("s1"))
        #expect(doc["state"] == .string("queued"))
        #expect(doc["request"]?["method"] == .string("POST"))
        #expect(doc["request"]?["url"] == .string("https://api.example.com/notes/5"))
        #expect(doc["request"]?["body_kind"] == .string("data"))
        #expect(
            doc["request"]?["headers"]
                == .object([
                    ("authorization", .string("[redacted]")), ("x-client", .string("outbox-tests")), ("x-note", .string("hi")),
                    ("content-type", .string("application/json")),
                ]))
        #expect(isUUID(doc["idempotency_key"]?.stringValue, version: "4"))
        #expect(doc["outcomes"] == .array([]))
        #expect(doc["expires_at"]?.int64Value == doc["created_at"]?.int64Value.map { $0 + 14 * 86_400_000 })
        let missing = p.run("show", "nope")
        #expect(missing.status == 65)
        #expect(missing.err == "outbox: E_INVALID: no entry has id \"nope\"\n")
        let missingJSON = p.run("show", "nope", "--json")
        #expect(missingJSON.out == #"{"error":{"code":"E_INVALID","message":"no entry has id \"nope\""}}"# + "\n")
        #expect(missingJSON.err.isEmpty)
    }

    /// Each environment variable is split at its first `=` byte: a value that starts with a
    /// combining mark (which a split by Character would glue to the `=`) or holds more `=`
    /// reaches a template whole.
    @Test func anEnvironmentValueIsSplitAtItsFirstEqualsSign() throws {
        let p = try CLIProject()
        try p.write(
            "definitions/env.yaml",
            """
            key: env.echo
            request: { url: "https://api.example.com/e", data: { v: "{{ env.OUTBOX_TEST_VALUE }}" } }
            """)
        let r = p.run(["render", "env.echo", "--json"], environment: ["OUTBOX_TEST_VALUE": "\u{301}a=b==c \u{E9}"])
        #expect(r.status == 0, "\(r)")
        #expect(try r.json()["body"]?["v"] == .string("\u{301}a=b==c \u{E9}"))
    }

    /// A whole-value template works in the parts plan's sizes and in `expires_in` too: it
    /// renders at enqueue and is checked as the literal would be (E_INVALID if it does not fit).
    @Test func planSizesAndExpiryTakeAWholeValueTemplate() throws {
        let p = try CLIProject()
        try p.write("big.bin", String(repeating: "x", count: 3 << 20))
        try p.write(
            "definitions/cut.yaml",
            """
            key: cut
            request:
              method: PUT
              file: big.bin
              ownership: reference
              parts:
                plan: { min: "{{ vars.min }}", max: "{{ vars.max }}", max_parts: "{{ vars.most }}" }
                url: "https://u.example.com/{{ part.number }}"
            expires_in: "{{ vars.ttl }}"
            """)
        #expect(p.run("check").status == 0)
        func render(_ vars: String) -> (status: Int32, doc: JSON?, err: String) {
            let r = p.run(["render", "cut", "--vars", vars, "--json"])
            return (r.status, try? r.json(), r.err)
        }
        let oneMiB = render(#"{"min": "1MiB", "max": "1MiB", "most": 10, "ttl": "1h"}"#)
        #expect(oneMiB.status == 0, "\(oneMiB.err)")
        #expect(oneMiB.doc?["body"]?["parts"]?.arrayValue?.count == 3)
        #expect(oneMiB.doc?["expires_in_ms"] == .number("3600000"))
        // max_parts from a number var; a null ttl keeps the config's lifetime (14 days).
        let two = render(#"{"min": "1MiB", "max": "1MiB", "most": 2, "ttl": null}"#)
        #expect(two.doc?["body"]?["parts"]?.arrayValue?.count == 2, "\(two.err)")
        #expect(two.doc?["expires_in_ms"] == .number("1209600000"))
        // A number counts as its digits, as one written in the file does (`expires_in: 0`);
        // a lifetime of 0 is refused, as its entry would expire unsent.
        let zero = render(#"{"min": "1MiB", "max": "1MiB", "most": 2, "ttl": 0}"#)
        #expect(zero.status == 65)
        #expect(zero.doc?["error"]?["message"]?.stringValue?.contains("before it could be sent") == true, "\(String(describing: zero.doc))")
        for (vars, message) in [
            (#"{"min": "lots", "max": "1MiB", "most": 2, "ttl": "1h"}"#, "request.parts.plan.min: bad size \"lots\""),
            (
                #"{"min": "2MiB", "max": "1MiB", "most": 2, "ttl": "1h"}"#,
                "request.parts.plan: plan min (2 MiB) is greater than max (1 MiB)"
            ),
            (#"{"min": -1, "max": "1MiB", "most": 2, "ttl": "1h"}"#, "request.parts.plan.min must be above 0, not -1"),
            (#"{"min": null, "max": "1MiB", "most": 2, "ttl": "1h"}"#, "request.parts.plan.min must be a size such as \"8MiB\", not null"),
            (
                #"{"min": "1MiB", "max": "1MiB", "most": "x", "ttl": "1h"}"#,
                "request.parts.plan.max_parts must be a whole number from 1 to 1000000, not \"x\""
            ),
            (
                #"{"min": "1MiB", "max": "1MiB", "most": 0, "ttl": "1h"}"#,
                "request.parts.plan.max_parts must be a whole number from 1 to 1000000, not 0"
            ),
            (#"{"min": "1MiB", "max": "1MiB", "most": 2, "ttl": "soon"}"#, "expires_in: bad duration \"soon\""),
            (#"{"min": "1MiB", "max": "1MiB", "most": 2, "ttl": 5}"#, "expires_in: bad duration \"5\" (a unit is required"),
            (#"{"min": "1MiB", "max": "1MiB", "most": 2, "ttl": true}"#, "expires_in must give a duration such as \"14d\", not true"),
        ] {
            let refused = p.run(["render", "cut", "--vars", vars])
            #expect(refused.status == 65, "\(vars)")
            #expect(refused.err.contains(message), "\(refused.err)")
        }
        #expect(!p.storeExists)
        // Written as null, expires_in is the config's lifetime, as when it is left out.
        try p.write("definitions/plain.yaml", "key: plain.null\nrequest: { url: \"https://x.example/\" }\nexpires_in: null\n")
        #expect(p.run("check").status == 0)
    }

    @Test func renderWritesNothingAndRedactsSecrets() throws {
        let p = try CLIProject()
        let r = p.run(["render", "note", "--vars", #"{"n": 3}"#, "--json"], environment: ["API_TOKEN": "tok-123-secret"])
        #expect(r.status == 0, "\(r)")
        #expect(!r.out.contains("tok-123-secret"))
        #expect(!r.err.contains("tok-123-secret"))
        let doc = try r.json()
        #expect(doc["key"] == .string("note"))
        #expect(doc["method"] == .string("POST"))
        #expect(doc["url"] == .string("https://api.example.com/notes/3"))
        #expect(doc["headers"]?["Authorization"] == .string("[redacted]"))
        #expect(doc["headers"]?["X-Client"] == .string("outbox-tests"))
        #expect(doc["body"] == .object([("n", .number("3"))]))
        #expect(!p.storeExists)
        // With a store present, render leaves it as it was.
        try p.enqueue("plain", vars: "{}", id: "x")
        let before = try p.snapshot()
        #expect(p.run(["render", "note", "--vars", #"{"n": 4}"#]).status == 0)
        #expect(try p.snapshot() == before)
        // render checks like enqueue does.
        let bad = p.run(["render", "note", "--vars", "{}"])
        #expect(bad.status == 65)
        #expect(bad.err.contains("{{ vars.n }} does not resolve"))
    }

    /// `render` shows the request enqueue would store: `headers update` patches included, their
    /// values redacted (a patch carries credentials), on entries enqueued before and after it.
    @Test func renderShowsHeaderPatches() throws {
        let p = try CLIProject()
        try p.enqueue("plain", vars: "{}", id: "x")
        #expect(p.run("headers", "update", "X-Patched: patch-secret-1").status == 0)
        let rendered = p.run(["render", "note", "--vars", #"{"n": 5}"#, "--json"], environment: ["API_TOKEN": "t"])
        let doc = try rendered.json()
        #expect(doc["headers"]?["X-Patched"] == .string("[redacted]"), "\(doc.serialized())")
        #expect(p.run(["enqueue", "note", "--vars", #"{"n": 5}"#, "--id", "n5"], environment: ["API_TOKEN": "t"]).status == 0)
        for id in ["x", "n5"] {
            let shown = p.run("show", id, "--json")
            #expect(try shown.json()["request"]?["headers"]?["x-patched"] == .string("[redacted]"), "\(shown.out)")
            #expect(!shown.out.contains("patch-secret-1"))
        }
        #expect(!rendered.out.contains("patch-secret-1"))
    }

    @Test func renderRedactsConfiguredHeaders() throws {
        let p = try CLIProject(config: "headers:\n  X-Api-Key: '{{ env.KEY }}'\nredact_headers: [x-api-key]\n")
        let r = p.run(["render", "plain", "--json"], environment: ["KEY": "k-secret"])
        #expect(r.status == 0, "\(r)")
        #expect(!r.out.contains("k-secret"))
        #expect(try r.json()["headers"]?["X-Api-Key"] == .string("[redacted]"))
    }

    /// Headers rendered from the environment or given by headers_command are secrets whatever
    /// their names: show and render print them redacted; the other headers stay readable.
    @Test func environmentAndCommandHeadersAreRedacted() throws {
        let p = try CLIProject(
            config: "headers:\n  X-Service: '{{ env.SERVICE_KEY }}'\n  X-Static: visible\n"
                + "headers_command: [/bin/echo, '{\"X-Session\": \"s-secret-77\"}']\n")
        p.environment = ["SERVICE_KEY": "k-secret-42"]
        try p.enqueue("plain", vars: "{}", id: "e1")
        for args in [["show", "e1", "--json"], ["show", "e1"], ["render", "plain", "--json"]] {
            let r = p.run(args)
            #expect(r.status == 0, "\(args): \(r)")
            #expect(!r.out.contains("k-secret-42") && !r.out.contains("s-secret-77"), "\(args): \(r.out)")
        }
        let headers = try p.run("show", "e1", "--json").json()["request"]?["headers"]
        #expect(headers?["x-service"] == .string("[redacted]"))
        #expect(headers?["x-session"] == .string("[redacted]"))
        #expect(headers?["x-static"] == .string("visible"))
    }

    struct PlanCase: Sendable, CustomTestStringConvertible {
        let args: [String]
        let count: Int
        let first: [Int64]
        let last: [Int64]
        var testDescription: String { args.joined(separator: " ") }
    }

    @Test func chunkPlan100MiB() throws {
        let p = try CLIProject(empty: true)
        let r = p.run("chunk-plan", "100MiB", "--json")
        #expect(r.status == 0)
        let mib: Int64 = 1 << 20
        let expected = (0..<5).map { #"{"start":\#(Int64($0) * 20 * mib),"end":\#(Int64($0 + 1) * 20 * mib)}"# }.joined(separator: ",")
        #expect(r.out == "[\(expected)]\n")
        let three = p.run("chunk-plan", "100MiB", "--max-parts", "3", "--json")
        #expect(three.out == #"[{"start":0,"end":35651584},{"start":35651584,"end":71303168},{"start":71303168,"end":104857600}]"# + "\n")
        let small = p.run("chunk-plan", "45", "--min", "10", "--max", "20", "--json")
        #expect(small.out == #"[{"start":0,"end":20},{"start":20,"end":45}]"# + "\n")
        let zero = p.run("chunk-plan", "0", "--json")
        #expect(zero.out == #"[{"start":0,"end":0}]"# + "\n")
        let text = p.run("chunk-plan", "30MiB")
        #expect(text.out == "part 1: bytes 0-20971520 (20 MiB)\npart 2: bytes 20971520-31457280 (10 MiB)\n")
        #expect(text.err == "2 parts for 30 MiB\n")
        let bad = p.run("chunk-plan", "1GiB", "--min", "30MiB", "--max", "20MiB")
        #expect(bad.status == 65)
        #expect(bad.err.contains("is greater than max"))
    }

    @Test func chunkPlanOf5TiB() throws {
        let p = try CLIProject(empty: true)
        let r = p.run("chunk-plan", "5TiB", "--json")
        #expect(r.status == 0)
        let plan = try #require(try r.json().arrayValue)
        #expect(plan.count == 9_987)
        let chunk: Int64 = 525 << 20
        #expect(plan.first == .object([("start", .number("0")), ("end", .number("\(chunk)"))]))
        let size: Int64 = 5 << 40
        #expect(plan.last == .object([("start", .number(String(9_986 * chunk))), ("end", .number(String(size)))]))
        for (i, range) in plan.enumerated().dropLast() {
            #expect(range["end"]?.int64Value == Int64(i + 1) * chunk)
        }
    }

    @Test func fromFileEnqueuesEveryLineInOrder() throws {
        let p = try CLIProject()
        try p.write(
            "batch.jsonl",
            """
            {"vars": {"n": 1}, "id": "b1"}

            {"vars": {"n": 2}, "id": "b2", "delay": "10m"}\r
             \t \r
            {"vars": {"n": 3}}

            """)
        let r = p.run("enqueue", "note", "--from", "batch.jsonl")
        #expect(r.status == 0, "\(r)")
        let ids = r.out.split(separator: "\n").map(String.init)
        #expect(ids.count == 3)
        #expect(Array(ids.prefix(2)) == ["b1", "b2"])
        #expect(isEntryUUID(ids[2]))
        let rows = try p.rows()
        #expect(rows.map { $0["id"]?.stringValue } == ids.map { $0 })
        #expect(rows.map { $0["vars"]?["n"] } == [.number("1"), .number("2"), .number("3")])
        let show = try p.run("show", "b2", "--json").json()
        #expect(show["not_before"]?.int64Value == show["created_at"]?.int64Value.map { $0 + 600_000 })
        // Again with --json: b1 and b2 resume, the line without an id is a new entry.
        let json = p.run("enqueue", "note", "--from", "batch.jsonl", "--json")
        #expect(json.status == 0)
        #expect(json.out.hasPrefix(#"[{"id":"b1"},{"id":"b2"},{"id":""#))
        let docs = try json.json().arrayValue ?? []
        #expect(docs.count == 3)
        #expect(isEntryUUID(docs.last?["id"]?.stringValue))
        #expect(try p.rows().count == 4)
    }

    /// `--from -` reads the lines from stdin; a bad line is named as `stdin:N` and nothing
    /// is enqueued.
    @Test func fromStdinEnqueuesEveryLine() throws {
        let p = try CLIProject()
        let r = p.run(
            ["enqueue", "note", "--from", "-"], stdin: #"{"vars": {"n": 1}, "id": "s1"}"# + "\n" + #"{"vars": {"n": 2}, "id": "s2"}"# + "\n"
        )
        #expect(r.status == 0, "\(r)")
        #expect(r.out == "s1\ns2\n")
        #expect(try p.rows().map { $0["vars"]?["n"] } == [.number("1"), .number("2")])
        let before = try p.snapshot()
        let bad = p.run(["enqueue", "note", "--from", "-"], stdin: #"{"vars": {"n": 3}}"# + "\n" + #"{"vars": {"n": 4}"# + "\n")
        #expect(bad.status == 65)
        #expect(bad.err.hasPrefix("outbox: E_INVALID: stdin:2: not valid JSON"), "\(bad.err)")
        #expect(try p.snapshot() == before)
    }

    /// A byte order mark before the first line (some editors write one) is not content.
    @Test func aByteOrderMarkBeforeTheFirstLineIsSkipped() throws {
        let p = try CLIProject()
        let r = p.run(["enqueue", "note", "--from", "-"], stdin: "\u{FEFF}" + #"{"vars": {"n": 1}, "id": "b1"}"# + "\n")
        #expect(r.status == 0, "\(r)")
        #expect(r.out == "b1\n")
    }

    /// The same for `--vars` from a file or stdin: the mark is skipped, the JSON read.
    @Test func aByteOrderMarkBeforeVarsIsSkipped() throws {
        let p = try CLIProject()
        _ = try p.write("v.json", "\u{FEFF}" + #"{"n": 7}"#)
        #expect(p.run(["enqueue", "note", "--vars", "@v.json", "--id", "v1"]).status == 0)
        let r = p.run(["enqueue", "note", "--vars", "-", "--id", "v2"], stdin: "\u{FEFF}" + #"{"n": 8}"#)
        #expect(r.status == 0, "\(r)")
        let shown = p.run("show", "v1", "--json")
        #expect(shown.out.contains(#""n":7"#), "\(shown.out)")
    }

    struct BadLineCase: Sendable, CustomTestStringConvertible {
        let name: String
        let lines: [String]
        let message: String
        var testDescription: String { name }
    }

    static let badLines: [BadLineCase] = [
        BadLineCase(
            name: "unknown key on line 2", lines: [#"{"vars": {"n": 1}}"#, #"{"vars": {"n": 2}, "when": "now"}"#],
            message: ":2: unknown field \"when\" (allowed: vars, id, delay, not_before)"),
        BadLineCase(
            name: "duplicate id on line 3",
            lines: [#"{"vars": {"n": 1}, "id": "d"}"#, #"{"vars": {"n": 2}}"#, #"{"vars": {"n": 3}, "id": "d"}"#],
            message: ":3: the id \"d\" was already used on line 1"),
        BadLineCase(
            name: "invalid JSON on line 2", lines: [#"{"vars": {"n": 1}}"#, #"{"vars": {"n": 2}"#],
            message: ":2: not valid JSON"),
        BadLineCase(
            name: "delay and not_before on line 1", lines: [#"{"vars": {"n": 1}, "delay": "1m", "not_before": 5}"#],
            message: ":1: give delay or not_before, not both"),
        BadLineCase(
            name: "bad delay on line 2", lines: [#"{"vars": {"n": 1}}"#, #"{"vars": {"n": 2}, "delay": "soon"}"#],
            message: ":2: delay: bad duration \"soon\""),
        BadLineCase(name: "not an object on line 1", lines: ["[1]"], message: ":1: each line must be a JSON object"),
        BadLineCase(
            name: "unresolved var on line 2", lines: [#"{"vars": {"n": 1}}"#, #"{"vars": {}}"#],
            message: ":2: request.url: {{ vars.n }} does not resolve (vars has no \"n\")"),
        BadLineCase(
            name: "bad id on line 2", lines: [#"{"vars": {"n": 1}}"#, #"{"vars": {"n": 2}, "id": "a b"}"#],
            message: ":2: id \"a b\" contains \" \""),
    ]

    @Test(arguments: badLines)
    func aBadLineEnqueuesNothing(_ c: BadLineCase) throws {
        let p = try CLIProject()
        let path = try p.write("batch.jsonl", c.lines.joined(separator: "\n") + "\n")
        let r = p.run("enqueue", "note", "--from", "batch.jsonl")
        #expect(r.status == 65)
        #expect(r.out.isEmpty)
        #expect(r.err.hasPrefix("outbox: E_INVALID: \(path)\(c.message)"), "\(r.err)")
        #expect(!p.storeExists)
        // Also when the store already has entries: nothing is added.
        try p.enqueue("plain", vars: "{}", id: "already")
        let before = try p.snapshot()
        #expect(p.run("enqueue", "note", "--from", "batch.jsonl").status == 65)
        #expect(try p.snapshot() == before)
    }

    /// Lines are rendered many at a time, half of them on a second thread: the entries keep
    /// the file's order, and the error given is still the first bad line's, whichever half
    /// or batch it is in and whether it is found before the render (bad JSON, an id used
    /// twice) or by it (a var that does not resolve).
    @Test(
        arguments: [
            ([300: .unresolved, 900: .unresolved], 300),
            ([700: .unresolved, 1000: .duplicateID], 700),
            ([1500: .unresolved, 1900: .badJSON], 1500),
            ([1100: .badJSON, 1600: .unresolved], 1100),
            ([2090: .unresolved], 2090),
        ] as [([Int: BadLine], Int)])
    func linesRenderedTogetherKeepTheirOrderAndTheFirstErrorWins(_ bad: [Int: BadLine], _ first: Int) throws {
        let p = try CLIProject()
        func lines(_ bad: [Int: BadLine]) -> String {
            (1...2_100).map { n in
                switch bad[n] {
                case .unresolved: #"{"vars": {}, "id": "l\#(n)"}"#
                case .badJSON: #"{"vars": "#
                case .duplicateID: #"{"vars": {"n": \#(n)}, "id": "l1"}"#
                case nil: #"{"vars": {"n": \#(n)}, "id": "l\#(n)"}"#
                }
            }.joined(separator: "\n") + "\n"
        }
        let path = try p.write("bad.jsonl", lines(bad))
        try p.enqueue("plain", vars: "{}", id: "already")
        let before = try p.snapshot()
        let r = p.run("enqueue", "note", "--from", "bad.jsonl")
        #expect(r.status == 65, "\(r)")
        #expect(r.err.hasPrefix("outbox: E_INVALID: \(path):\(first): "), "\(r.err)")
        #expect(try p.snapshot() == before)

        try p.write("good.jsonl", lines([:]))
        let good = p.run("enqueue", "note", "--from", "good.jsonl")
        #expect(good.status == 0, "\(good)")
        let rows = try p.rows().dropFirst()
        #expect(rows.map { $0["id"]?.stringValue } == (1...2_100).map { "l\($0)" })
        #expect(rows.map { $0["vars"]?["n"] } == (1...2_100).map { .number(String($0)) })
    }

    enum BadLine: Sendable { case unresolved, badJSON, duplicateID }

    /// Lines piped in are all read before the write (a pipe may pause for long, and the
    /// write lock would be held meanwhile): the same entries, and the same first error.
    @Test func pipedLinesGiveTheSameEntriesAndErrorsAsAFile() throws {
        let p = try CLIProject()
        let good = (1...1_500).map { #"{"vars": {"n": \#($0)}, "id": "p\#($0)"}"# }
        var bad = good
        bad[1_199] = #"{"vars": {}, "id": "p1200"}"#
        bad[1_399] = #"{"vars": "#
        try p.enqueue("plain", vars: "{}", id: "already")
        let before = try p.snapshot()
        let refused = p.run(["enqueue", "note", "--from", "-"], stdin: bad.joined(separator: "\n") + "\n")
        #expect(refused.status == 65, "\(refused)")
        #expect(refused.err.hasPrefix("outbox: E_INVALID: stdin:1200: request.url: "), "\(refused.err)")
        #expect(try p.snapshot() == before)
        let piped = p.run(["enqueue", "note", "--from", "-"], stdin: good.joined(separator: "\n") + "\n")
        #expect(piped.status == 0, "\(piped)")
        #expect(piped.out == (1...1_500).map { "p\($0)\n" }.joined())
        #expect(try p.rows().dropFirst().map { $0["id"]?.stringValue } == (1...1_500).map { "p\($0)" })
    }

    @Test func aMissingFromFileIsFileMissing() throws {
        let p = try CLIProject()
        let r = p.run("enqueue", "note", "--from", "none.jsonl")
        #expect(r.status == 66)
        #expect(r.err == "outbox: E_FILE_MISSING: --from: cannot read \(p.root)/none.jsonl: No such file or directory\n")
        let mixed = p.run("enqueue", "note", "--from", "none.jsonl", "--vars", "{}")
        #expect(mixed.status == 64)
    }

    @Test func sameIdResumesAndReplacesAQueuedEntry() throws {
        let p = try CLIProject()
        try p.enqueue("note", vars: #"{"n": 1, "note": "first"}"#, id: "same")
        let first = try p.run("show", "same", "--json").json()
        // Same body (data and url), new header var: resume.
        try p.enqueue("note", vars: #"{"n": 1, "note": "second"}"#, id: "same")
        let resumed = try p.run("show", "same", "--json").json()
        #expect(try p.rows().count == 1)
        #expect(resumed["generation"] == .number("1"))
        #expect(resumed["vars"]?["note"] == .string("second"))
        #expect(resumed["request"]?["headers"]?["x-note"] == .string("second"))
        #expect(resumed["request"]?["url"] == .string("https://api.example.com/notes/1"))
        #expect(resumed["idempotency_key"] == first["idempotency_key"])
        #expect(resumed["created_at"] == first["created_at"])
        // A different body: replace, reopened as queued.
        try p.enqueue("note", vars: #"{"n": 2}"#, id: "same")
        let replaced = try p.run("show", "same", "--json").json()
        #expect(try p.rows().count == 1)
        #expect(replaced["state"] == .string("queued"))
        #expect(replaced["request"]?["url"] == .string("https://api.example.com/notes/2"))
        #expect(replaced["total_bytes"] == .number("7"))
        #expect(replaced["created_at"] == first["created_at"])
    }

    @Test func cancelForgetsEntries() throws {
        let p = try CLIProject()
        try p.enqueue("note", vars: #"{"n": 1}"#, id: "c1")
        try p.enqueue("plain", vars: "{}", id: "c2")
        let r = p.run("cancel", "c1", "nope", "--json")
        #expect(r.status == 0)
        #expect(r.out == #"{"cancelled":["c1"]}"# + "\n")
        #expect(try p.rows().map { $0["id"]?.stringValue } == ["c2"])
        #expect(p.run("cancel", "--all").status == 0)
        #expect(try p.rows().isEmpty)
    }
}

/// Bad input fails with the exact code, names the culprit, and leaves the store as it was.
struct CLIBadInputTests {
    struct Case: Sendable, CustomTestStringConvertible {
        let name: String
        let args: [String]
        let status: Int32
        /// Text the error output must contain (it names the culprit).
        let culprit: String
        var files: [String: String] = [:]
        var config: String = CLIProject.config
        var testDescription: String { name }
    }

    static let brokenSchema = "key: broken\nrequest:\n  url: https://x.example/\n  bogus: 1\n"

    static let cases: [Case] = [
        Case(
            name: "malformed YAML definition", args: ["enqueue", "broken", "--vars", "{}"], status: 78,
            culprit: "/definitions/broken.yaml:3:1: error: did not find expected ',' or ']'",
            files: ["definitions/broken.yaml": "key: broken\nrequest: [unclosed\n"]),
        Case(
            name: "tab-indented YAML definition", args: ["enqueue", "broken"], status: 78, culprit: "/definitions/broken.yaml:",
            files: ["definitions/broken.yaml": "key: broken\nrequest:\n\turl: https://x.example/\n"]),
        Case(
            name: "wrong type in a definition", args: ["enqueue", "broken"], status: 78,
            culprit: "/definitions/broken.yaml:3:9: error: accept must be a list of {status, body_includes?}",
            files: ["definitions/broken.yaml": "key: broken\nrequest: { url: \"https://x.example/\" }\naccept: 409\n"]),
        Case(
            name: "wrong type for a request field", args: ["enqueue", "broken"], status: 78,
            culprit: "/definitions/broken.yaml:3:12: error: request.headers must be a mapping of header names to values",
            files: ["definitions/broken.yaml": "key: broken\nrequest:\n  headers: [a]\n  url: https://x.example/\n"]),
        Case(
            name: "unknown field in a definition", args: ["enqueue", "broken"], status: 78,
            culprit: "/definitions/broken.yaml:4:3: error: unknown field \"bogus\" in request",
            files: ["definitions/broken.yaml": brokenSchema]),
        Case(
            name: "literal GET with data", args: ["enqueue", "broken"], status: 78,
            culprit: "/definitions/broken.yaml:5:9: error: a GET request cannot have a body (request.data)",
            files: ["definitions/broken.yaml": "key: broken\nrequest:\n  method: GET\n  url: https://x.example/\n  data: { a: 1 }\n"]),
        Case(
            name: "literal file: URL", args: ["enqueue", "broken"], status: 78,
            culprit: "/definitions/broken.yaml:3:8: error: request.url: scheme \"file\" is not allowed",
            files: ["definitions/broken.yaml": "key: broken\nrequest:\n  url: file:///etc/passwd\n"]),
        Case(name: "unknown key", args: ["enqueue", "nothing.here"], status: 65, culprit: "no definition has key \"nothing.here\""),
        Case(
            name: "missing vars path", args: ["enqueue", "note", "--vars", #"{"m": 1}"#], status: 65,
            culprit: "E_INVALID: request.url: {{ vars.n }} does not resolve (vars has no \"n\")"),
        Case(
            name: "absent vars read by a template", args: ["enqueue", "note"], status: 65,
            culprit: "E_INVALID: request.url: {{ vars.n }} does not resolve (the entry has no vars)"),
        Case(
            name: "file:///etc/passwd from vars", args: ["enqueue", "dynamic", "--vars", #"{"url": "file:///etc/passwd"}"#],
            status: 65, culprit: "E_INVALID: request.url: scheme \"file\" is not allowed (http or https only)"),
        Case(
            name: "gopher://x from vars", args: ["enqueue", "dynamic", "--vars", #"{"url": "gopher://x"}"#],
            status: 65, culprit: "E_INVALID: request.url: scheme \"gopher\" is not allowed (http or https only)"),
        Case(
            name: "ftp://x from vars", args: ["enqueue", "dynamic", "--vars", #"{"url": "ftp://x"}"#],
            status: 65, culprit: "E_INVALID: request.url: scheme \"ftp\" is not allowed (http or https only)"),
        Case(
            name: "header with CRLF from vars", args: ["enqueue", "note", "--vars", #"{"n": 1, "note": "a\r\nX-Evil: 1"}"#],
            status: 65, culprit: "E_INVALID: request.headers.X-Note: header value contains CR, LF or NUL"),
        Case(
            name: "GET with data, method from vars",
            args: ["enqueue", "dynamic", "--vars", #"{"m": "GET", "url": "https://x.example/"}"#],
            status: 65, culprit: "E_INVALID: a GET request cannot have a body (request.data)"),
        Case(
            name: "parts with a gap",
            args: [
                "enqueue", "upload", "--vars",
                #"{"path": "f.bin", "parts": [{"url": "https://u.example/1", "range": {"start": 0, "end": 10}}, {"url": "https://u.example/2", "range": {"start": 12, "end": 30}}]}"#,
            ],
            status: 65,
            culprit: "E_INVALID: request.parts do not tile the file (30 bytes): parts[1] starts at 12 but parts[0] ended at 10 (a gap)",
            files: ["f.bin": String(repeating: "f", count: 30)]),
        Case(
            name: "parts with an overlap",
            args: [
                "enqueue", "upload", "--vars",
                #"{"path": "f.bin", "parts": [{"url": "https://u.example/1", "range": {"start": 0, "end": 10}}, {"url": "https://u.example/2", "range": {"start": 9, "end": 30}}]}"#,
            ],
            status: 65,
            culprit: "E_INVALID: request.parts do not tile the file (30 bytes): parts[1] starts at 9 but parts[0] ended at 10 (an overlap)",
            files: ["f.bin": String(repeating: "f", count: 30)]),
        Case(
            name: "vars over max_vars_bytes", args: ["enqueue", "plain", "--vars", #"{"p":"\#(String(repeating: "v", count: 1017))"}"#],
            status: 65, culprit: "E_INVALID: vars are 1025 bytes of JSON, over max_vars_bytes (1024)", config: "max_vars_bytes: 1KiB\n"),
        Case(
            name: "vars over the default 1 MiB",
            args: ["enqueue", "plain", "--vars", #"{"p":"\#(String(repeating: "v", count: 1_048_569))"}"#],
            status: 65, culprit: "E_INVALID: vars are 1048577 bytes of JSON, over max_vars_bytes (1048576)"),
        Case(
            name: "invalid vars JSON", args: ["enqueue", "plain", "--vars", #"{"a": }"#], status: 65,
            culprit: "E_INVALID: --vars is not valid JSON"),
        Case(
            name: "vars a list", args: ["enqueue", "plain", "--vars", "[1, 2]"], status: 65,
            culprit: "E_INVALID: vars must be a JSON object, not list"),
        Case(
            name: "vars a string", args: ["enqueue", "plain", "--vars", #""text""#], status: 65,
            culprit: "E_INVALID: vars must be a JSON object, not string"),
        Case(
            name: "vars a number", args: ["enqueue", "plain", "--vars", "5"], status: 65,
            culprit: "E_INVALID: vars must be a JSON object, not number"),
        Case(
            name: "id with a space", args: ["enqueue", "plain", "--id", "a b"], status: 65,
            culprit: "E_INVALID: id \"a b\" contains \" \""),
        Case(
            name: "id with a slash", args: ["enqueue", "plain", "--id", "../etc"], status: 65,
            culprit: "E_INVALID: id \"../etc\" contains \"/\""),
        Case(
            name: "id of 129 characters", args: ["enqueue", "plain", "--id", String(repeating: "i", count: 129)], status: 65,
            culprit: "is 129 characters long (at most 128)"),
        Case(
            name: "id with a leading dash", args: ["enqueue", "plain", "--id=-x"], status: 65,
            culprit: "E_INVALID: id \"-x\" must not start with \"-\""),
        Case(
            name: "id with a leading dot", args: ["enqueue", "plain", "--id", ".hidden"], status: 65,
            culprit: "E_INVALID: id \".hidden\" must not start with \".\""),
        Case(name: "empty id", args: ["enqueue", "plain", "--id", ""], status: 65, culprit: "E_INVALID: id must not be empty"),
        Case(
            name: "a missing file", args: ["enqueue", "file.copy", "--vars", #"{"path": "gone.bin"}"#], status: 66,
            culprit: "E_FILE_MISSING: request.file: no such file "),
        Case(
            name: "a bad --delay", args: ["enqueue", "plain", "--delay", "soon"], status: 65,
            culprit: "E_INVALID: --delay: bad duration \"soon\""),
        Case(
            name: "a bad --not-before", args: ["enqueue", "plain", "--not-before", "tomorrow"], status: 65,
            culprit: "E_INVALID: --not-before: \"tomorrow\" is not a time"),
    ]

    @Test(arguments: cases)
    func badInputChangesNothing(_ c: Case) throws {
        let p = try CLIProject(config: c.config)
        for (path, text) in c.files { try p.write(path, text) }
        try p.enqueue("plain", vars: "{}", id: "existing")
        let before = try p.snapshot()
        let r = p.run(c.args)
        #expect(r.status == c.status, "\(r)")
        #expect(r.err.contains(c.culprit), "\(r.err)")
        #expect(r.out.isEmpty)
        #expect(try p.snapshot() == before)
        // --json puts the error document on stdout instead.
        let json = p.run(c.args + ["--json"])
        #expect(json.status == c.status)
        let doc = try json.json()
        #expect(doc["error"]?["code"]?.stringValue.flatMap { ErrorCode(rawValue: $0) }?.exitStatus == c.status)
        #expect(try p.snapshot() == before)
    }

    @Test func varsOfExactlyMaxVarsBytesAreAccepted() throws {
        let p = try CLIProject(config: "max_vars_bytes: 1KiB\n")
        // Measured on the compact JSON that is stored: the spaces here do not count.
        let vars = #"{ "p" : "\#(String(repeating: "v", count: 1016))" }"#
        let r = p.run("enqueue", "plain", "--vars", vars, "--id", "fits")
        #expect(r.status == 0, "\(r)")
        #expect(try p.rows().first?["vars"]?.serialized().utf8.count == 1024)
        let atDefault = try CLIProject()
        let big = #"{"p":"\#(String(repeating: "v", count: 1_048_568))"}"#
        #expect(atDefault.run("enqueue", "plain", "--vars", big).status == 0)
    }

    @Test func aBrokenDefinitionDisablesOnlyItsKey() throws {
        let p = try CLIProject()
        try p.write("definitions/broken.yaml", Self.brokenSchema)
        let broken = p.run("enqueue", "broken")
        #expect(broken.status == 78)
        #expect(broken.err.hasSuffix("outbox: E_CONFIG: 1 error\n"))
        #expect(p.run("enqueue", "plain", "--id", "ok").out == "ok\n")
    }

    @Test func textFromHostileFilesReachesTheTerminalAsEscapes() throws {
        let p = try CLIProject()
        // YAML's own escapes: raw control characters in a file are refused before this.
        try p.write("definitions/esc.yaml", "key: esc\nrequest:\n  url: http://x.example/\n  \"a\\e]0;owned\\ab\": 1\n")
        let check = p.run("check")
        #expect(check.status == 78)
        #expect(!check.err.contains("\u{1B}") && !check.err.contains("\u{07}"), "\(check.err)")
        #expect(check.err.contains("unknown field \"a\\x1b]0;owned\\x07b\""), "\(check.err)")
        try FileManager.default.removeItem(atPath: p.path("definitions/esc.yaml"))

        let unknown = p.run("enqueue", "k\u{1B}[2J", "--vars", "{}")
        #expect(unknown.status == 65)
        #expect(!unknown.err.contains("\u{1B}") && unknown.err.contains("k\\u001b[2J"), "\(unknown.err)")
        #expect(try p.rows().isEmpty)
    }

    /// A process that died while it created the database left `outbox.db.new-PID` and its
    /// log behind: the next creation removes them.
    @Test func theTemporariesOfADeadCreatorAreRemoved() throws {
        let p = try CLIProject()
        let deadPID = try CLIAuditTests.pidOfNoProcess()
        try FileManager.default.createDirectory(atPath: p.storeFolder, withIntermediateDirectories: true)
        let left = ["", "-wal", "-shm"].map { p.storeFolder + "/outbox.db.new-\(deadPID)" + $0 }
        for file in left { try p.write(String(file.dropFirst(p.root.count + 1)), "left by a dead process") }
        try p.enqueue("plain", vars: "{}", id: "a")
        for file in left { #expect(!FileManager.default.fileExists(atPath: file), "\(file) is still there") }
        #expect(p.run("audit").status == 0)
    }

    @Test func anUnwritableStoreIsAStorageError() throws {
        // Tests may run as root, which ignores permission bits: a store path under a regular
        // file fails with ENOTDIR.
        let p = try CLIProject(config: "store: somefile/store\n")
        try p.write("somefile", "a regular file")
        let r = p.run("enqueue", "plain")
        #expect(r.status == 74)
        #expect(r.err.hasPrefix("outbox: E_STORAGE: "))
        #expect(r.err.contains("\(p.root)/somefile"))
        #expect(p.run("list").status == 74)
        // No entry is not the answer where the store cannot be read.
        #expect(p.run("show", "x").status == 74)
        #expect(p.run("explain", "x").status == 74)
        let json = p.run("enqueue", "plain", "--json")
        #expect(try json.json()["error"]?["code"] == .string("E_STORAGE"))
    }
}

struct CLIAuditTests {
    /// A process id no process can have: the kernel hands out ids below pid_max. (The id of a
    /// process that has exited may be handed to another while a busy machine runs the test.)
    static func pidOfNoProcess() throws -> Int32 {
        let text = try String(contentsOfFile: "/proc/sys/kernel/pid_max", encoding: .utf8)
        return try #require(Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)))
    }

    /// A temporary copy left by a killed enqueue is named by `audit` and removed by `--fix`;
    /// one of a live process (a copy in progress) is not.
    @Test func auditNamesTemporaryFilesOfDeadProcesses() throws {
        let p = try CLIProject()
        try p.enqueue("plain", vars: "{}", id: "a")
        let deadPID = try Self.pidOfNoProcess()
        let dead = p.storeFolder + "/bodies/x.body.tmp-\(deadPID)-7"
        let live = p.storeFolder + "/bodies/y.body.tmp-\(getpid())-7"
        for file in [dead, live] {
            #expect(FileManager.default.createFile(atPath: file, contents: Data("part".utf8), attributes: [.posixPermissions: 0o600]))
        }
        let audit = p.runOnceTheStagingLockIsFree(["audit"]) { !$0.stderr.contains(auditFoundTheStagingLockTaken) }
        #expect(audit.status == 74)
        #expect(audit.out.contains("temporary file \(dead) left by process \(deadPID)"), "\(audit)")
        #expect(!audit.out.contains(live), "\(audit)")
        let fix = p.runOnceTheStagingLockIsFree(["audit", "--fix"]) { _ in !FileManager.default.fileExists(atPath: dead) }
        #expect(fix.status == 0, "\(fix)")
        #expect(!FileManager.default.fileExists(atPath: dead))
    }

    /// A forgotten entry's bytes do not stay in the store's files: its row (here a header
    /// holding a token) is zeroed as it is deleted, not left in the page's free space.
    @Test func aCancelledEntrysTokenDoesNotStayInTheStoreFiles() throws {
        let p = try CLIProject()
        let token = "tok-5f0c1e-never-kept"
        p.environment = ["API_TOKEN": token]
        try p.enqueue("note", vars: #"{"n": 5, "note": "hi"}"#, id: "s1")
        try p.enqueue("plain", vars: "{}", id: "p1")
        func storeHoldsToken() throws -> Bool {
            try ["outbox.db", "outbox.db-wal"].contains { name in
                let path = p.storeFolder + "/" + name
                guard FileManager.default.fileExists(atPath: path) else { return false }
                return try Data(contentsOf: URL(fileURLWithPath: path)).range(of: Data(token.utf8)) != nil
            }
        }
        #expect(try storeHoldsToken(), "the stored request holds the token as sent")
        #expect(p.run("cancel", "s1", "p1").status == 0)
        // A runner folds the log back into the database as it ends.
        let run = p.run("run", "--drain")
        #expect(run.status == 0, "\(run)")
        #expect(try !storeHoldsToken())
    }

    /// A store file or folder others may read (a hand's chmod, a copy made with another
    /// umask) is named by `audit`; `--fix` makes files 0600 and folders 0700 again.
    @Test func auditNamesAndFixesLooseModes() throws {
        let p = try CLIProject()
        try p.write("in/a.bin", "body")
        try p.enqueue("file.copy", vars: #"{"path": "in/a.bin"}"#, id: "c")
        let staged = try p.sqlite("SELECT body_file FROM entries WHERE id = 'c';").trimmingCharacters(in: .newlines)
        #expect(p.run("audit").status == 0, "a store as outbox made it")
        #expect(chmod(staged, 0o644) == 0 && chmod(p.storeFolder + "/bodies", 0o755) == 0)
        let audit = p.run("audit")
        #expect(audit.status == 74)
        #expect(audit.out.contains("\(staged) has mode 644: others may read it (audit --fix makes it 600)"), "\(audit)")
        #expect(audit.out.contains("\(p.storeFolder)/bodies has mode 755"), "\(audit)")
        let fix = p.run("audit", "--fix")
        #expect(fix.status == 0, "\(fix)")
        #expect(fix.err.contains("\(staged) was mode 644; it is 600 now"), "\(fix)")
        #expect(fileMode(staged) == 0o600 && fileMode(p.storeFolder + "/bodies") == 0o700)
    }

    /// A staged body cut short, or replaced by a link, is damage `audit` names.
    @Test(arguments: ["truncated", "link"])
    func auditNamesADamagedStagedBody(_ damage: String) throws {
        let p = try CLIProject()
        try p.write("in/a.bin", String(repeating: "a", count: 100))
        try p.write("in/b.bin", String(repeating: "b", count: 100))
        try p.enqueue("file.copy", vars: #"{"path": "in/a.bin"}"#, id: "c")
        let staged = try p.sqlite("SELECT body_file FROM entries WHERE id = 'c';").trimmingCharacters(in: .newlines)
        if damage == "truncated" {
            #expect(truncate(staged, 10) == 0)
        } else {
            try FileManager.default.removeItem(atPath: staged)
            #expect(symlink(p.path("in/b.bin"), staged) == 0)
        }
        let audit = p.run("audit")
        #expect(audit.status == 74)
        let problem = damage == "truncated" ? "has 10 bytes, not the 100 enqueued" : "is a symbolic link, not the file the store staged"
        #expect(audit.out.contains("c: staged body \(staged) \(problem)") || audit.err.contains(problem), "\(audit)")
    }

    /// `audit` passes on a sound store, then names each broken invariant and exits 74:
    /// a staged body gone from disk, and a part whose entry is gone.
    @Test func auditNamesEachBrokenInvariantAndExits74() throws {
        let p = try CLIProject()
        try p.write("in/a.bin", String(repeating: "a", count: 100))
        try p.enqueue("file.copy", vars: #"{"path": "in/a.bin"}"#, id: "c")
        try p.enqueue("note", vars: #"{"n": 1}"#, id: "n")
        let sound = p.run("audit")
        #expect(sound.status == 0)
        #expect(sound.out == "ok: the store's invariants hold\n")

        let staged = try p.sqlite("SELECT body_file FROM entries WHERE id = 'c';").trimmingCharacters(in: .newlines)
        #expect(staged.hasPrefix(p.storeFolder + "/"), "\(staged)")
        try FileManager.default.removeItem(atPath: staged)
        _ = try p.sqlite("INSERT INTO parts (entry_seq, idx, start, end, url, headers) VALUES (999, 0, 0, 1, 'https://x.example/', '[]');")
        let broken = p.run("audit", "--json")
        #expect(broken.status == 74)
        let json = try broken.json()
        #expect(json["ok"] == .bool(false))
        #expect(json["problems"] == .array([.string("c: staged body \(staged) is missing"), .string("1 part belongs to no entry")]))
        // The error every failed command gives, beside the report.
        #expect(json["error"]?["code"] == .string("E_STORAGE"))
        #expect(json["error"]?["message"] == .string("the store breaks 2 of its invariants (problems)"))
        let text = p.run("audit")
        #expect(text.status == 74)
        #expect(text.out == "c: staged body \(staged) is missing\n1 part belongs to no entry\n")
        #expect(text.err.hasSuffix("outbox: E_STORAGE: the store breaks 2 of its invariants (listed above)\n"), "\(text.err)")
        #expect(try p.sqlite("SELECT id FROM entries ORDER BY seq;") == "c\nn\n")
    }

    /// `explain` of a running entry tells a live runner from one that was killed, reading the
    /// kernel's lock table (it never takes the runner lock itself).
    @Test func explainTellsALiveRunnerFromAKilledOne() async throws {
        let p = try CLIProject()
        try p.write("definitions/held.yaml", "key: held\nrequest:\n  url: \(p.url("/hold/x/status/200"))\n")
        try p.enqueue("held", vars: "{}", id: "h")
        let runner = try p.start(["run"])
        #expect(await p.server.waitForHeld("x"), "the runner: \(runner.stderrSoFar)")
        // A runner on SQLite commits a turn's claims at the turn's end, after its transfers
        // started: the request can be held here before the store says the entry runs.
        await eventually("the store says h is running") { (try? p.rows().first?["state"]) == .string("running") }
        #expect(
            p.run("explain", "h").out == "- it is running now: sending, or ready to start the moment a request ends (a standby request)\n")
        runner.signal(SIGKILL)
        _ = await runner.wait(timeout: 60)
        let after = p.run("explain", "h")
        #expect(after.out.hasPrefix("- it was running when its runner stopped (killed or crashed)"), "\(after.out)")
        #expect(try String(contentsOfFile: p.storeFolder + "/runner.lock", encoding: .utf8).contains("since 20"))
        _ = p.server.release("x")
    }

    /// `explain --json` gives the state `list` and `show` give: a queued entry of a paused
    /// key is `paused`.
    /// An entry whose staged body is gone is not "held by nothing": explain says the next run
    /// settles it error (file), as `audit` names the file.
    @Test func explainSaysAnEntryWhoseStagedBodyIsGoneWillSettleError() throws {
        let p = try CLIProject()
        try p.write("in/a.bin", "body")
        try p.enqueue("file.copy", vars: #"{"path": "in/a.bin"}"#, id: "c")
        let staged = try p.sqlite("SELECT body_file FROM entries WHERE id = 'c';").trimmingCharacters(in: .newlines)
        try FileManager.default.removeItem(atPath: staged)
        let explained = p.run("explain", "c")
        #expect(explained.status == 0, "\(explained)")
        #expect(
            explained.out.contains(
                "its staged body \(staged) is missing (`outbox audit` lists it): when its turn comes, it settles error (file), sending nothing"
            ),
            "\(explained)")
        #expect(!explained.out.contains("nothing holds it"), "\(explained)")
    }

    @Test func explainShowsAPausedEntryAsPaused() throws {
        let p = try CLIProject()
        try p.write("definitions/k.yaml", "key: k\nrequest:\n  url: http://127.0.0.1:9/x\n")
        try p.enqueue("k", vars: "{}", id: "w")
        #expect(p.run("pause", "--key", "k").status == 0)
        let explained = try p.run("explain", "w", "--json").json()
        #expect(explained["state"] == .string("paused"))
        #expect(try p.run("list", "--json").json().arrayValue?.first?["state"] == .string("paused"))
    }

    /// A referenced file is the user's: its going away is that entry's error (kind file) at
    /// its next attempt, not damage to the store.
    @Test func aReferencedFileThatWentAwayIsNotStoreDamage() throws {
        let p = try CLIProject()
        try p.write(
            "definitions/ref.yaml",
            "key: file.ref\nrequest:\n  method: PUT\n  url: https://files.example.com/in\n  file: \"{{ vars.path }}\"\n  ownership: reference\n"
        )
        try p.write("in/r.bin", String(repeating: "r", count: 100))
        try p.enqueue("file.ref", vars: #"{"path": "in/r.bin"}"#, id: "r")
        try FileManager.default.removeItem(atPath: p.root + "/in/r.bin")
        let audit = p.run("audit")
        #expect(audit.status == 0, "\(audit.out)")
        #expect(audit.out == "ok: the store's invariants hold\n")
    }
}

/// A copied file must be the file as the entry recorded it: one that changes after it was
/// read (here: headers_command of the next line appends to it) is refused, not stored longer
/// than the entry says, and the batch leaves nothing behind.
struct CopiedFileChangeTests {
    @Test func aFileThatChangesBeforeItIsCopiedIsRefused() throws {
        let grow = "#!/bin/sh\ninput=$(cat)\ncase \"$input\" in *'\"n\":2'*) printf more >> data/a.bin ;; esac\necho '{}'\n"
        let p = try CLIProject(config: CLIProject.config + "headers_command: hooks/grow.sh\n")
        try p.write("hooks/grow.sh", grow, mode: 0o755)
        try p.write("data/a.bin", String(repeating: "a", count: 5000))
        try p.write("data/b.bin", "b")
        try p.write(
            "lines.jsonl", #"{"vars": {"path": "data/a.bin", "n": 1}}"# + "\n" + #"{"vars": {"path": "data/b.bin", "n": 2}}"# + "\n")
        let r = p.run(["enqueue", "file.copy", "--from", "lines.jsonl"], environment: ["API_TOKEN": "t"])
        #expect(r.status == 65, "\(r)")
        #expect(
            r.err.contains("data/a.bin changed while it was copied into the store (it had 5000 bytes when enqueue read it)"), "\(r.err)")
        #expect(try p.rows().isEmpty)
        let staged = (try? FileManager.default.contentsOfDirectory(atPath: p.root + "/.outbox/bodies")) ?? []
        #expect(staged.isEmpty, "\(staged)")
    }
}

/// A URL's password is shown redacted, so a var it came from is too (and a number fed to a
/// secret header like a string).
struct SecretVarsTests {
    @Test func aVarThatWentIntoTheURLsPasswordOrAsANumberIntoAHeaderIsRedacted() throws {
        let p = try CLIProject()
        _ = try p.write(
            "definitions/pw.yaml",
            """
            key: pw
            request:
              url: "https://u:{{ vars.pw | raw }}@api.example.com/x"
              headers: { X-Pin: "{{ vars.pin }}" }
              data: { a: 1 }
            """)
        try p.writeConfig(CLIProject.config + "redact_headers: [X-Pin]\n")
        #expect(
            p.run(["enqueue", "pw", "--id", "p1", "--vars", #"{"pw": "urlpassw0rd", "pin": 98765432, "note": "plain text"}"#]).status == 0)
        for args in [["show", "p1", "--json"], ["show", "p1"], ["list", "--json"]] {
            let r = p.run(args)
            #expect(r.status == 0 && !r.out.contains("urlpassw0rd") && !r.out.contains("98765432"), "\(args): \(r.out)")
            #expect(r.out.contains("plain text"), "\(args)")
        }
    }
}
