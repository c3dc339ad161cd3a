import Foundation
import OutboxModel
import Testing
import TestSupport

/// `check` refuses what would fail at every delivery or settle; `retry`, `pause` and
/// `cancel` refuse a bad key before they change anything.
struct ControlCommandTests {
    // A command that finds outbox.db damaged leaves it and its write-ahead log as they were:
    // folded into the damaged file at close, the log (the last commits) would be gone.
    @Test(arguments: [["list"], ["enqueue", "note", "--vars", #"{"n": 2}"#], ["audit", "--json"]])
    func aDamagedDatabaseKeepsItsLog(_ command: [String]) throws {
        let p = try CLIProject()
        #expect(p.run("enqueue", "note", "--vars", #"{"n": 1}"#).status == 0)
        let db = p.path(".outbox/outbox.db")
        let log = try #require(FileManager.default.contents(atPath: db + "-wal"), "the enqueue left its log")
        let damaged = Data((0..<8192).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
        try damaged.write(to: URL(fileURLWithPath: db))
        #expect(p.run(command).status == 74)
        #expect(FileManager.default.contents(atPath: db) == damaged, "outbox.db as it was")
        #expect(FileManager.default.contents(atPath: db + "-wal") == log, "the log as it was")
    }

    // A reading command that fails in a project with no store yet leaves it without one.
    @Test(arguments: [["show", "nope"], ["explain", "nope"], ["stats", "--prometheus", "--output", "/nonexistent/metrics.prom"]])
    func aFailingReadMakesNoStore(_ command: [String]) throws {
        let p = try CLIProject()
        #expect(!p.storeExists)
        let r = p.run(command)
        #expect(r.status == (command[0] == "stats" ? 74 : 65), "\(r)")
        #expect(!p.storeExists, "a store was made")
        if command[0] != "stats" { #expect(r.err.contains(#"no entry has id "nope" (no store at \#(p.storeFolder) yet)"#), "\(r)") }
    }

    // A reading command in a project with no store yet answers as for an empty store, says
    // there is none (a mistyped store path must not look like a healthy empty queue), and
    // makes none.
    @Test(arguments: [
        ["list"], ["list", "--json"], ["stats"], ["stats", "--json"], ["stats", "--prometheus"], ["audit"], ["audit", "--json"],
        ["audit", "--fix"],
    ])
    func aReadWithNoStoreYetMakesNone(_ command: [String]) throws {
        let p = try CLIProject()
        #expect(!p.storeExists)
        // An empty folder at the store's path is no store yet either, and stays empty.
        let empty = try CLIProject()
        try FileManager.default.createDirectory(atPath: empty.storeFolder, withIntermediateDirectories: true)
        #expect(empty.run(command).status == 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: empty.storeFolder).isEmpty, "a store was made")
        let r = p.run(command)
        #expect(r.status == 0, "\(r)")
        #expect(!p.storeExists, "a store was made")
        if command.contains("--json") {
            let answer = try r.json()
            switch command[0] {
            case "list": #expect(answer.arrayValue?.isEmpty == true, "\(r)")
            case "audit": #expect(answer["ok"] == .bool(true) && answer["problems"]?.arrayValue?.isEmpty == true, "\(r)")
            default: #expect(answer["entries"]?["queued"] == .int(0), "\(r)")
            }
        }
        // On stderr beside a JSON answer; a text answer may say it on stdout.
        #expect((command.contains("--json") ? r.err : r.out + r.err).contains("no store at \(p.storeFolder) yet"), "\(r)")
        if command == ["stats", "--prometheus"] { #expect(r.out.contains("outbox_entries{state=\"queued\"} 0"), "\(r)") }
    }

    // A paused entry is not due "now": `list` says it waits for `resume`.
    @Test func aPausedEntryIsListedAsWaitingForResume() throws {
        let p = try CLIProject()
        #expect(p.run("enqueue", "note", "--id", "pz", "--vars", #"{"n": 1}"#).status == 0)
        #expect(p.run("pause", "--key", "note").status == 0)
        let row = p.run("list").out.split(separator: "\n").first { $0.hasPrefix("pz ") } ?? ""
        #expect(row.contains("paused") && row.contains("after resume") && !row.contains(" now "), "\(row)")
    }

    // Help and the completion scripts offer no global option the command refuses, and an id
    // given twice is reported once.
    @Test func helpOffersOnlyWhatTheCommandTakes() throws {
        let p = try CLIProject()
        #expect(!p.run("init", "--help").out.contains("--config"))
        #expect(!p.run("man", "--help").out.contains("--json"))
        #expect(p.run("list", "--help").out.contains("--config"))
        let bash = p.run("completion", "bash").out
        #expect(bash.contains(#""init") opts="--help --json" ;;"#), "\(bash)")
        #expect(bash.contains(#""man") opts="--config --help" ;;"#), "\(bash)")
        #expect(p.run("enqueue", "note", "--id", "x", "--vars", #"{"n": 1}"#).status == 0)
        let r = p.run("cancel", "x", "x", "--json")
        #expect(r.status == 0 && r.out.trimmingCharacters(in: .whitespacesAndNewlines) == #"{"cancelled":["x"]}"#, "\(r)")
    }

    // Two commands opening a new store at once: the store folder the other one made between
    // this one's look for it and its `mkdir` is the folder wanted, not "a path that is not a
    // folder" (a runner and an enqueue started together failed so, now and then).
    @Test func aStoreFolderAnotherCommandMadeMeanwhileIsUsed() async throws {
        let p = try CLIProject()
        let go = p.path("go")
        let enqueue = try p.start(
            ["enqueue", "note", "--vars", #"{"n": 1}"#], environment: ["OUTBOX_FAULT_HOLD": "store.make-folder:\(go)"])
        await eventually("the enqueue looked for the store folder") { FileManager.default.fileExists(atPath: go + ".reached") }
        #expect(mkdir(p.storeFolder, 0o700) == 0, "the store folder did not exist yet")
        p.touch("go")
        let r = await enqueue.wait(timeout: 120)
        #expect(r.exitCode == 0, "\(r)")
        #expect(try p.sqlite("SELECT count(*) FROM entries;").trimmingCharacters(in: .whitespacesAndNewlines) == "1")
    }

    // A header patch holds a credential: one typed without its colon, or with a space in its
    // name, is refused without echoing it, on stderr and in --json, and nothing is patched.
    @Test(arguments: [["Authorization Bearer HUSEC-1111"], ["X-Ok: v", "Authorization Bearer HUSEC-1111: x"]])
    func aMalformedHeaderPatchIsNotEchoed(_ patch: [String]) throws {
        let p = try CLIProject()
        #expect(p.run("enqueue", "note", "--vars", #"{"n": 1}"#).status == 0)
        let before = try p.sqlite("SELECT name, value FROM settings ORDER BY name;")
        for json in [false, true] {
            let r = p.run(["headers", "update"] + patch + (json ? ["--json"] : []))
            #expect(r.status == (patch.count == 1 ? 64 : 65), "\(r)")
            #expect(!(r.out + r.err).contains("HUSEC"), "\(r)")
            #expect((json ? r.out : r.err).contains("not shown: it may hold a credential"), "\(r)")
        }
        #expect(try p.sqlite("SELECT name, value FROM settings ORDER BY name;") == before, "nothing patched")
    }

    // A same-id enqueue with another body of an entry left running by a killed runner is
    // refused (75) in words that say so, not as if a runner were sending it now.
    @Test func aSameIdEnqueueOfAnEntryLeftRunningSaysItsRunnerStopped() throws {
        let p = try CLIProject()
        #expect(p.run("enqueue", "note", "--id", "rp", "--vars", #"{"n": 1}"#).status == 0)
        _ = try p.sqlite("UPDATE entries SET state = 'running' WHERE id = 'rp';")
        let r = p.run("enqueue", "note", "--id", "rp", "--vars", #"{"n": 2}"#)
        #expect(r.status == 75)
        #expect(
            r.err
                == "outbox: E_RUNNING: entry rp was being sent when its runner stopped (killed or crashed) and the new body differs; the next `outbox run` puts it back in the queue: enqueue it again then\n",
            "\(r.err)")
        #expect(try p.run("show", "rp", "--json").json()["vars"]?["n"] == .int(1), "the store did not change")
    }

    /// A follow-up's key that only a file which does not parse could define: the error names
    /// that file, whose own error is listed too.
    @Test func aThenKeyMissingBesideAnUnreadableFileNamesThatFile() throws {
        let p = try CLIProject()
        let parent = try p.write(
            "definitions/parent.yaml",
            """
            key: parent
            request: { url: "https://x.example/" }
            then:
              on_success:
                - key: child
            """)
        let child = try p.write("definitions/child.yaml", "key: child\nrequest: [unclosed\n")
        let r = p.run("check")
        #expect(r.status == 78)
        #expect(
            r.err.contains("\(parent):5:12: error: then: no definition has key \"child\" (\(child) cannot be read: see its error)\n"),
            "\(r.err)")
        #expect(r.err.contains("\(child):"), "\(r.err)")
        #expect(p.run("enqueue", "parent").status == 78)
        #expect(try p.run("list", "--json").json() == .array([]))
    }

    @Test func checkRefusesAThenKeyNoDefinitionHas() throws {
        let p = try CLIProject()
        let file = try p.write(
            "definitions/chain.yaml",
            """
            key: chain
            request: { url: "https://x.example/" }
            then:
              on_success:
                - key: plain
                - key: no.such.key
            """)
        let r = p.run("check")
        #expect(r.status == 78)
        #expect(r.err.hasPrefix("\(file):6:12: error: then: no definition has key \"no.such.key\"\n"), "\(r.err)")
        #expect(r.err.hasSuffix("outbox: E_CONFIG: 1 error\n"))
        // Only that key is disabled, and nothing reached the store.
        #expect(p.run("enqueue", "chain").status == 78)
        #expect(try p.run("list", "--json").json() == .array([]))
        #expect(p.run("enqueue", "plain").status == 0)
    }

    /// A file with another error still has its `then` keys checked: one pass names both.
    @Test func checkNamesAnUnknownThenKeyBesideAnotherErrorOfItsFile() throws {
        let p = try CLIProject()
        let file = try p.write(
            "definitions/chain.yaml",
            """
            key: chain
            request: { url: "https://x.example/", method: FETCH }
            then:
              on_success:
                - key: no.such.key
            """)
        let r = p.run("check")
        #expect(r.status == 78)
        #expect(r.err.contains("\(file):2:47: error: request.method must be one of"), "\(r.err)")
        #expect(r.err.contains("\(file):5:12: error: then: no definition has key \"no.such.key\"\n"), "\(r.err)")
        #expect(r.err.hasSuffix("outbox: E_CONFIG: 2 errors\n"), "\(r.err)")
        #expect(p.run("enqueue", "chain").status == 78)
        #expect(try p.run("list", "--json").json() == .array([]))
    }

    /// A file whose key is missing or not a string, or that defines its key a second time, still
    /// has its other parts read: an unknown `then` key in it is named in the same pass.
    @Test(arguments: [
        ("a missing key", "", "a definition needs a key", 2),
        ("a key that is not a string", "key: [chain]\n", "key must be", 2),
        ("a key defined twice", "key: chain\n", "key \"chain\" is defined twice", 2),
    ])
    func checkNamesAnUnknownThenKeyInAFileWithoutAUsableKey(
        label: String, keyLine: String, keyError: String, errors: Int
    ) throws {
        let p = try CLIProject()
        let body = """
            request: { url: "https://x.example/" }
            then:
              on_success:
                - key: no.such.key

            """
        // The first of a duplicate pair is read whole; its `then` key must be named all the same.
        let first = try p.write("definitions/a-chain.yaml", (label == "a key defined twice" ? "key: chain\n" : "key: other\n") + body)
        let file = try p.write("definitions/b-chain.yaml", keyLine + body)
        let line = keyLine.isEmpty ? 4 : 5
        let r = p.run("check")
        #expect(r.status == 78, "\(label): \(r)")
        #expect(r.err.contains(keyError), "\(label): \(r.err)")
        #expect(r.err.contains("\(file):\(line):12: error: then: no definition has key \"no.such.key\""), "\(label): \(r.err)")
        #expect(r.err.contains("\(first):5:12: error: then: no definition has key \"no.such.key\""), "\(label): \(r.err)")
        #expect(r.err.hasSuffix("outbox: E_CONFIG: \(errors + 1) errors\n"), "\(label): \(r.err)")
        #expect(try p.run("list", "--json").json() == .array([]))
    }

    @Test func aTemplatedThenKeyIsCheckedWhenItRenders() throws {
        let p = try CLIProject()
        _ = try p.write(
            "definitions/chain.yaml",
            """
            key: chain
            request: { url: "https://x.example/" }
            then:
              on_success:
                - key: "{{ vars.next }}"
            """)
        #expect(p.run("check").status == 0)
    }

    /// A definition disabled for a `then` key no file defines still has its hooks checked:
    /// every problem of the file is named in one go.
    @Test func checkNamesTheHookProblemsOfADefinitionWithAnUnknownThenKey() throws {
        let p = try CLIProject()
        _ = try p.write("hooks/noexec.sh", "#!/bin/sh\nexit 0\n", mode: 0o644)
        let file = try p.write(
            "definitions/chained.yaml",
            """
            key: chained
            request: { url: "https://x.example/" }
            on_success: hooks/missing.sh
            on_error: hooks/noexec.sh
            then:
              on_success:
                - key: no.such.key

            """)
        let r = p.run("check")
        #expect(r.status == 78, "\(r)")
        #expect(r.err.contains("\(file):7:12: error: then: no definition has key \"no.such.key\""), "\(r.err)")
        #expect(r.err.contains("\(file):3:13: error: on_success: hooks/missing.sh does not exist"), "\(r.err)")
        #expect(r.err.contains("\(file):4:11: error: on_error: hooks/noexec.sh is not an executable file"), "\(r.err)")
        #expect(r.err.hasSuffix("outbox: E_CONFIG: 3 errors\n"), "\(r.err)")
    }

    @Test(arguments: [
        ("on_success: hooks/missing.sh", "on_success: hooks/missing.sh does not exist"),
        ("on_success: [hooks/not-executable.sh]", "on_success: hooks/not-executable.sh is not an executable file"),
        ("on_error: \"hooks/missing.sh --flag\"", "on_error: hooks/missing.sh does not exist"),
        ("on_success: [no-such-program-anywhere]", "on_success: no-such-program-anywhere is not found in PATH"),
        ("on_success: hooks/crlf.sh", "on_success: hooks/crlf.sh has a CRLF line end on its #! line"),
        ("on_success: [hooks/no-shebang.sh]", "on_success: hooks/no-shebang.sh has no #! line and is not a program"),
        ("on_error: hooks/no-interpreter.sh", "on_error: hooks/no-interpreter.sh names the interpreter /bin/no-such-shell"),
        ("on_error: hooks/relative.sh", "on_error: hooks/relative.sh names the interpreter python3 by a relative path"),
        ("on_error: [sh, hooks/gone.sh]", "on_error: hooks/gone.sh, the script given to sh, does not exist"),
        ("on_error: [/bin/bash, hooks/gone.sh, -x]", "on_error: hooks/gone.sh, the script given to bash, does not exist"),
    ])
    func checkRefusesAHookWhoseProgramCannotRun(line: String, message: String) throws {
        let p = try CLIProject()
        _ = try p.write("hooks/not-executable.sh", "#!/bin/sh\nexit 0\n", mode: 0o644)
        _ = try p.write("hooks/crlf.sh", "#!/bin/sh\r\nexit 0\r\n", mode: 0o755)
        _ = try p.write("hooks/no-shebang.sh", "exit 0\n", mode: 0o755)
        _ = try p.write("hooks/no-interpreter.sh", "#!/bin/no-such-shell\nexit 0\n", mode: 0o755)
        _ = try p.write("hooks/relative.sh", "#!python3\nprint(1)\n", mode: 0o755)
        let file = try p.write("definitions/hooked.yaml", "key: hooked\nrequest: { url: \"https://x.example/\" }\n\(line)\n")
        let r = p.run("check")
        #expect(r.status == 78, "\(r)")
        #expect(r.err.contains("\(file):3:"), "\(r.err)")
        #expect(r.err.contains("error: \(message)"), "\(r.err)")
    }

    @Test func checkFindsHooksByPathAndInPath() throws {
        let p = try CLIProject()
        _ = try p.write("hooks/ok.sh", "#!/bin/sh\nexit 0\n", mode: 0o755)
        _ = try p.write(
            "definitions/hooked.yaml",
            """
            key: hooked
            request: { url: "https://x.example/" }
            on_success: hooks/ok.sh
            on_error: ["true"]
            """)
        #expect(p.run("check").status == 0)
        // An interpreter's script is found where hooks run; an option first names no file.
        for hook in ["[sh, hooks/ok.sh]", "[sh, -c, \"exit 0\"]", "[sh, -e, hooks/gone.sh]", "[dash, /bin/true]"] {
            _ = try p.write("definitions/hooked.yaml", "key: hooked\nrequest: { url: \"https://x.example/\" }\non_success: \(hook)\n")
            let r = p.run("check")
            #expect(r.status == 0, "\(hook): \(r)")
        }
    }

    @Test func checkRefusesAConfigPluginThatCannotRun() throws {
        let p = try CLIProject(config: "events: { command: plugins/events.sh }\n")
        let r = p.run("check")
        #expect(r.status == 78)
        #expect(r.err.contains("outbox.yaml:1:20: error: events.command: plugins/events.sh does not exist"), "\(r.err)")
    }

    @Test(arguments: [["pause", "--key", ""], ["resume", "--key", "a b"], ["cancel", "--key", ""], ["retry", "--key", "tab\there"]])
    func aBadKeyIsInvalidAndChangesNothing(_ arguments: [String]) throws {
        let p = try CLIProject()
        let id = try p.enqueue("plain", vars: "{}")
        let before = p.run("list", "--json").out
        let r = p.run(arguments)
        #expect(r.status == 65, "\(r)")
        #expect(r.err.contains("E_INVALID: --key"), "\(r.err)")
        #expect(r.err.contains("key must be a non-empty name without spaces"))
        #expect(p.run("list", "--json").out == before)
        #expect(!before.isEmpty && before.contains(id))
    }

    @Test func retryPutsABackingOffEntryBackDueNow() throws {
        let p = try CLIProject()
        let id = try p.enqueue("plain", vars: "{}")
        _ = try p.sqlite("UPDATE entries SET attempts = 3, next_attempt_at = 9999999999999, reason = 'HTTP 503' WHERE id = '\(id)'")
        let r = p.run("retry", id, "unknown-id", "--json")
        #expect(r.status == 0, "\(r)")
        #expect(try r.json() == .object([("retried", .array([.string(id)]))]))
        let row = try #require(try p.run("list", "--json").json().arrayValue?.first)
        #expect(row["attempts"] == .int(0))
        #expect(row["reason"] == .null)
        #expect((row["next_attempt_at"]?.int64Value ?? .max) <= Identifiers.nowMs())
    }

    @Test func retryLiftsADelay() throws {
        let p = try CLIProject()
        #expect(p.run("enqueue", "plain", "--vars", "{}", "--id", "later", "--delay", "1h").status == 0)
        #expect(p.run("retry", "later").status == 0)
        let show = try p.run("show", "later", "--json").json()
        #expect(show["not_before"] == .null)
        #expect((show["next_attempt_at"]?.int64Value ?? .max) <= Identifiers.nowMs())
        #expect(!p.run("explain", "later").out.contains("held until"))
    }

    /// `explain` tells a definition with errors from a missing one: the first is fixed by
    /// what `check` names, the second by writing it.
    @Test func explainTellsABrokenDefinitionFromAMissingOne() throws {
        let p = try CLIProject()
        #expect(p.run("enqueue", "plain", "--vars", "{}", "--id", "e").status == 0)
        let file = try p.write("definitions/plain.yaml", "key: plain\nrequest:\n  url: https://api.example.com/plain\nbogus: 1\n")
        let broken = p.run("explain", "e")
        #expect(
            broken.out.contains("- the definition of plain has errors (`outbox check` names them): its outcome will wait (unhandled-key)"),
            "\(broken)")
        try FileManager.default.removeItem(atPath: file)
        let missing = p.run("explain", "e")
        #expect(missing.out.contains("- no definition has its key plain: its outcome will wait (unhandled-key)"), "\(missing)")
    }

    @Test func aSameBodyEnqueueWithADelayShowsTheHoldAsTheNextAttempt() throws {
        let p = try CLIProject()
        #expect(p.run("enqueue", "plain", "--vars", "{}", "--id", "dq").status == 0)
        let before = Identifiers.nowMs()
        #expect(p.run("enqueue", "plain", "--vars", "{}", "--id", "dq", "--delay", "1h").status == 0)
        let show = try p.run("show", "dq", "--json").json()
        let notBefore = try #require(show["not_before"]?.int64Value)
        #expect(notBefore >= before + 3_600_000)
        #expect(show["next_attempt_at"] == .int64(notBefore))
    }

    @Test(arguments: [[String](), ["a", "--errors"], ["--key", "k", "--errors"]])
    func retryTakesExactlyOneSelection(_ arguments: [String]) throws {
        let p = try CLIProject()
        let r = p.run(["retry"] + arguments)
        #expect(r.status == 64, "\(r)")
        #expect(r.err.contains("retry takes ids, or --key K, or --errors"))
    }
}

/// A plugin's answer is data: what it prints is sent as it is, never rendered again.
struct PluginAnswerTests {
    /// A project whose key `cmd` has a request_command printing `answer`.
    static func project(answering answer: String) throws -> CLIProject {
        let p = try CLIProject()
        _ = try p.write("plugins/describe.sh", "#!/bin/sh\ncat > /dev/null\nprintf '%s' '\(answer)'\n", mode: 0o755)
        _ = try p.write("definitions/cmd.yaml", "key: cmd\nrequest_command: [plugins/describe.sh]\n")
        return p
    }

    @Test func aRequestCommandsAnswerIsNeverRenderedAgain() throws {
        let p = try Self.project(
            answering:
                #"{"method": "POST", "url": "https://x.example/a", "headers": {"X-T": "{{ env.SECRET }}"}, "text": "v={{ vars.n }}"}"#)
        p.environment["SECRET"] = "hunter2"
        let r = p.run("enqueue", "cmd", "--vars", #"{"n": 1}"#, "--id", "c1")
        #expect(r.status == 0, "\(r)")
        let stored = try p.sqlite("SELECT request, body FROM entries WHERE id = 'c1'")
        #expect(!stored.contains("hunter2"), "\(stored)")
        #expect(stored.contains(#"{{ env.SECRET }}"#))
        #expect(stored.contains("v={{ vars.n }}"))
    }

    @Test func aTagInAnAnswersURLIsRefusedNotRendered() throws {
        let p = try Self.project(answering: #"{"method": "POST", "url": "https://x.example/a?q={{ env.SECRET }}"}"#)
        p.environment["SECRET"] = "hunter2"
        let r = p.run("enqueue", "cmd", "--id", "c1")
        #expect(r.status == 65, "\(r)")
        #expect(r.err.contains("the URL contains \"{\""), "\(r.err)")
        #expect(!r.err.contains("hunter2"))
        if p.storeExists { #expect(try p.sqlite("SELECT COUNT(*) FROM entries") == "0\n") }
    }

    @Test func anAnswersHeaderGivenTwiceInAnyCaseIsRefused() throws {
        let p = try Self.project(
            answering: #"{"method": "POST", "url": "https://x.example/a", "headers": {"X-Tenant": "alpha", "x-tenant": "beta"}}"#)
        let r = p.run("enqueue", "cmd", "--id", "c1")
        #expect(r.status == 65, "\(r)")
        #expect(r.err.contains("request.headers: header x-tenant is given twice"), "\(r.err)")
        if p.storeExists { #expect(try p.sqlite("SELECT COUNT(*) FROM entries") == "0\n") }
    }

    @Test func partTagsInAPartsURLAreTheOneException() {
        let answer: JSON = .object([
            ("url", .string("https://h/{{ part.number }}")),
            (
                "parts",
                .object([
                    ("url", .string("https://h/{{ env.X }}/p/{{ part.number }}?s=1")),
                    ("headers", .object([("Range", .string("bytes={{ part.start }}-{{ part.last }}"))])),
                    ("plan", .object([("min", .string("1KiB")), ("max", .string("8MiB"))])),
                ])
            ),
            ("expires_in", .string("2h")),
        ])
        let (tree, literals) = PluginAnswer.literalized(answer)
        #expect(tree["url"] == .string("{{ literal.0 }}"))
        #expect(tree["parts"]?["url"] == .string("{{ literal.1 | raw }}{{ literal.2 | raw }}{{ part.number }}{{ literal.3 | raw }}"))
        #expect(tree["parts"]?["headers"]?["Range"] == .string("{{ literal.4 | raw }}{{ part.start }}{{ literal.5 | raw }}{{ part.last }}"))
        #expect(tree["expires_in"] == .string("2h"))
        #expect(tree["parts"]?["plan"] == .object([("min", .string("1KiB")), ("max", .string("8MiB"))]), "sizes are values")
        #expect(
            literals == .array(["https://h/{{ part.number }}", "https://h/{{", " env.X }}/p/", "?s=1", "bytes=", "-"].map { .string($0) }))
    }
}

/// Durations past 100 years are refused where they are read, so no time arithmetic can overflow.
struct HugeDurationTests {
    @Test(arguments: ["106751991167d", "9223372036854775807ms", "36601d"])
    func aHugeDelayIsInvalidAndChangesNothing(_ delay: String) throws {
        let p = try CLIProject()
        let r = p.run("enqueue", "plain", "--delay", delay)
        #expect(r.status == 65, "\(r)")
        #expect(r.err.contains("is over 100 years"), "\(r.err)")
        if p.storeExists { #expect(try p.run("list", "--json").json() == .array([])) }
    }

    @Test func aHugeLifetimeInTheConfigIsAConfigError() throws {
        let p = try CLIProject(config: "lifetime: 106751991167d\n")
        let r = p.run("enqueue", "plain")
        #expect(r.status == 78, "\(r)")
        #expect(r.err.contains("outbox.yaml:1:11: error: lifetime: duration \"106751991167d\" is over 100 years"), "\(r.err)")
        #expect(!p.storeExists)
    }
}

/// A definition file that cannot be read is an error naming it, never a file quietly skipped.
struct UnreadableDefinitionTests {
    @Test func aDanglingLinkOrAFolderNamedLikeADefinitionIsAConfigError() throws {
        let p = try CLIProject()
        let link = p.root + "/definitions/gone.yaml"
        #expect(symlink(p.root + "/nowhere.yaml", link) == 0)
        let folder = p.root + "/definitions/folder.yaml"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
        let r = p.run("check")
        #expect(r.status == 78, "\(r)")
        #expect(r.err.contains("\(link):1:1: error: cannot read this definition file: No such file or directory"), "\(r.err)")
        #expect(r.err.contains("\(folder):1:1: error: cannot read this definition file: it is not a regular file"), "\(r.err)")
        // No excerpt of a file that cannot be read: no empty line, no caret under nothing.
        #expect(!r.err.contains("\n^"), "\(r.err)")
        #expect(r.err.split(separator: "\n").count == 3, "\(r.err)")
        // The keys of the files that can be read still work; an unknown one says some files cannot be read.
        #expect(p.run("enqueue", "plain").status == 0)
        let unknown = p.run("enqueue", "gone")
        #expect(unknown.status == 78, "\(unknown)")
    }
}

/// Endless or huge input is refused at its cap, before it is read whole: no allocation
/// failure, no crash, and the store unchanged.
struct EndlessInputTests {
    @Test(arguments: [["--vars", "@/dev/zero"], ["--from", "/dev/zero"]])
    func devZeroIsInvalid(_ arguments: [String]) async throws {
        let p = try CLIProject(config: "max_vars_bytes: 1KiB\n")
        let r = try await p.outbox(["enqueue", "plain"] + arguments)
        #expect(r.exitCode == 65, "\(r)")
        #expect(
            r.stderr.contains(arguments[0] == "--from" ? "/dev/zero:1: the line is over 72 KiB" : "--vars: /dev/zero is over 68 KiB"),
            "\(r.stderr)")
        #expect(!p.storeExists)
    }

    @Test func anEndlessStdinIsInvalid() throws {
        let p = try CLIProject(config: "max_vars_bytes: 1KiB\n")
        let big = String(repeating: " ", count: 200_000) + "{}"
        let vars = p.run(["enqueue", "plain", "--vars", "-"], stdin: big)
        #expect(vars.status == 65, "\(vars)")
        #expect(vars.err.contains("--vars -: stdin is over 68 KiB"), "\(vars.err)")
        let from = p.run(["enqueue", "plain", "--from", "-"], stdin: "{}\n" + String(repeating: "x", count: 200_000))
        #expect(from.status == 65, "\(from)")
        #expect(from.err.contains("stdin:2: the line is over 72 KiB"), "\(from.err)")
        #expect(!p.storeExists)
    }

    @Test(arguments: [
        ("", [String](), nil as Int?),
        ("a\nb", ["a", "b"], nil),
        ("a\n\nb\n", ["a", "", "b"], nil),
        ("\n", [""], nil),
        ("abc\ndefgh\n", ["abc"], 2),
    ])
    func linesAreReadOneAtATimeWithACap(_ input: String, lines: [String], tooLongAt: Int?) throws {
        let bytes = Array(input.utf8)
        var offset = 0
        // Two bytes a read: lines cross chunk boundaries.
        var reader = LineReader(maxLineBytes: 4) { n in
            let end = min(bytes.count, offset + min(n, 2))
            defer { offset = end }
            return Array(bytes[offset..<end])
        }
        var read: [String] = []
        do {
            while let line = try reader.next() { read.append(String(decoding: line, as: UTF8.self)) }
            #expect(tooLongAt == nil)
        } catch {
            #expect(error == .tooLong(line: tooLongAt ?? -1))
        }
        #expect(read == lines)
    }

    /// With a limit, a file reads as far as it reached when it was opened, mid-line or not.
    @Test(arguments: [(Int64(0), [String]()), (Int64(3), ["ab"]), (Int64(4), ["ab", "c"]), (Int64(8), ["ab", "cd", "ef"])])
    func aFileReadsNoFurtherThanItsLimit(_ limit: Int64, lines: [String]) throws {
        let folder = TemporaryFolder(prefix: "line-limit")
        let path = folder.path + "/lines"
        try "ab\ncd\nef".write(toFile: path, atomically: false, encoding: .utf8)
        let fd = open(path, O_RDONLY)
        defer { close(fd) }
        var reader = LineReader(fd: fd, maxLineBytes: 16, limit: limit)
        var read: [String] = []
        while let line = try reader.next() { read.append(String(decoding: line, as: UTF8.self)) }
        #expect(read == lines)
    }
}

/// A `--from` file cut shorter than it was when opened (its writer truncated it while it was
/// read) is refused with nothing stored, not taken for the lines read so far.
struct FromFileCutTests {
    @Test func aFileCutWhileItIsReadIsRefused() throws {
        let folder = TemporaryFolder(prefix: "line-cut")
        let path = folder.path + "/lines"
        try String(repeating: "0123456789abcde\n", count: 10_000).write(toFile: path, atomically: false, encoding: .utf8)
        let fd = open(path, O_RDONLY)
        defer { close(fd) }
        var reader = LineReader(fd: fd, maxLineBytes: 64, limit: 160_000)
        #expect(try reader.next() != nil)
        #expect(truncate(path, 16_000) == 0)
        #expect(throws: LineReader.Failure.shrank(from: 160_000, to: 65_536)) { while try reader.next() != nil {} }
    }

    @Test func anEnqueueOfAFileCutWhileItIsReadStoresNothing() async throws {
        let p = try CLIProject()
        _ = try p.write("lines.jsonl", (0..<5_000).map { "{\"vars\": {\"n\": \($0)}}\n" }.joined())
        let go = p.path("go")
        let enqueue = try p.start(
            ["enqueue", "note", "--from", "lines.jsonl"], environment: ["OUTBOX_FAULT_HOLD": "enqueue.batch-written:\(go)"])
        await eventually("the first batch written") { FileManager.default.fileExists(atPath: go + ".reached") }
        #expect(truncate(p.path("lines.jsonl"), 20_000) == 0)
        p.touch("go")
        let ended = await enqueue.wait(timeout: 120)
        #expect(ended.exitCode == 65, "\(ended)")
        #expect(ended.stderr.contains("was cut from"), "\(ended.stderr)")
        #expect(try p.sqlite("SELECT COUNT(*) FROM entries") == "0\n")
    }
}

/// Every plugin has a time limit (`plugins.timeout`); one that runs past it fails, named.
struct PluginTimeoutTests {
    @Test func aRequestCommandThatNeverAnswersIsStopped() throws {
        let p = try CLIProject(config: "plugins: { timeout: 300ms }\n")
        _ = try p.write("plugins/hang.sh", "#!/bin/sh\nexec sleep 600\n", mode: 0o755)
        _ = try p.write("definitions/cmd.yaml", "key: cmd\nrequest_command: [plugins/hang.sh]\n")
        let r = p.run("enqueue", "cmd")
        #expect(r.status == 65, "\(r)")
        #expect(r.err.contains("request_command ran past plugins.timeout (300ms) and was stopped"), "\(r.err)")
        #expect(!p.storeExists)
    }
}

/// A plugin that is there but cannot start says why, not that it is missing.
struct PluginStartTests {
    /// Run by a shell, a script whose `#!` interpreter is missing makes the shell say "not
    /// found" (exit 127); the error names the interpreter instead. The store is not made.
    @Test(arguments: ["request_command: plugins/old.sh", "request_command: [plugins/old.sh]"])
    func aRequestCommandWhoseInterpreterIsMissingSaysSo(line: String) throws {
        let p = try CLIProject()
        _ = try p.write("plugins/old.sh", "#!/usr/bin/no-such-python\nprint('{}')\n", mode: 0o755)
        _ = try p.write("definitions/cmd.yaml", "key: cmd\n\(line)\n")
        let r = p.run("enqueue", "cmd")
        #expect(r.status == 65, "\(r)")
        #expect(r.err.hasPrefix("outbox: E_INVALID: request_command "), "\(r.err)")
        #expect(r.err.contains("names the interpreter /usr/bin/no-such-python, which does not exist"), "\(r.err)")
        #expect(!p.storeExists)
    }
}

/// Small hostile inputs from the outside, each refused or made harmless.
struct HostileInputTests {
    /// A hard link to the database is the database: it is not sent, and the store is as it was.
    @Test func aHardLinkToTheDatabaseIsNotABody() throws {
        let p = try CLIProject()
        _ = try p.enqueue("plain", vars: "{}")
        try FileManager.default.linkItem(atPath: p.storeFolder + "/outbox.db", toPath: p.root + "/hl.db")
        let r = p.run("enqueue", "file.copy", "--vars", #"{"path": "hl.db"}"#)
        #expect(r.status == 65, "\(r)")
        #expect(
            r.err.contains("hl.db is a hard link to the store's database or the config; outbox does not send its own files"), "\(r.err)")
        #expect(try p.run("list", "--json").json().arrayValue?.count == 1)
    }

    /// A file in the store's folder is refused whatever path leads to it: a link to the
    /// folder, named after a line from another folder (the real folder is not reused from
    /// the line before), or a link to the file itself (here the config); the batch is refused
    /// whole and the store is as it was.
    @Test(arguments: [("sdir/extra.txt", "is in the store's folder"), ("c.yaml", "is the project's config file")])
    func aFileOfTheStoreIsNotABodyThroughALink(_ path: String, _ said: String) throws {
        let p = try CLIProject()
        _ = try p.enqueue("plain", vars: "{}")
        try p.write("data/ok.txt", "ok")
        try p.write(".outbox/extra.txt", "kept")
        try FileManager.default.createSymbolicLink(atPath: p.root + "/sdir", withDestinationPath: p.storeFolder)
        try FileManager.default.createSymbolicLink(atPath: p.root + "/c.yaml", withDestinationPath: p.root + "/config/outbox.yaml")
        try p.write("lines.jsonl", #"{"vars": {"path": "data/ok.txt"}}"# + "\n" + #"{"vars": {"path": "\#(path)"}}"# + "\n")
        let r = p.run("enqueue", "file.copy", "--from", "lines.jsonl")
        #expect(r.status == 65, "\(r)")
        #expect(r.err.contains("lines.jsonl:2: request.file: \(p.root)/\(path) \(said)"), "\(r.err)")
        #expect(try p.run("list", "--json").json().arrayValue?.count == 1)
    }

    /// A store whose database path is longer than SQLite can open is named as such, not as
    /// "unable to open database file".
    @Test func aStorePathTooLongForSQLiteIsSaidSo() throws {
        let long = ["a", "b", "c"].map { String(repeating: $0, count: 200) }.joined(separator: "/")
        let p = try CLIProject(config: CLIProject.config + "store: \(long)\n")
        let r = p.run("enqueue", "plain")
        #expect(r.status == 74, "\(r)")
        #expect(r.err.contains("bytes, over the 504 SQLite can open; move the project, or give `store:` a shorter folder"), "\(r.err)")
    }

    /// An error is one line on stderr: a newline from an argument is shown as an escape (as in JSON).
    @Test(arguments: [
        (["show", "x\ny"], "outbox: E_INVALID: no entry has id \"x\\ny\"\n"),
        (["explain", "x\ry"], "outbox: E_INVALID: no entry has id \"x\\ry\"\n"),
        (
            ["list", "--key", "k\nx"],
            "outbox: E_INVALID: --key \"k\\nx\": key must be a non-empty name without spaces or control characters\n"
        ),
    ])
    func anErrorStaysOnOneLine(_ args: [String], _ said: String) throws {
        let p = try CLIProject()
        #expect(p.run("run", "--drain").status == 0, "a store, so no entry is just that")
        let r = p.run(args)
        #expect(r.status == 65)
        #expect(r.err == said)
    }

    @Test func anEmptyDatabaseIsDamageNotANewStore() throws {
        let p = try CLIProject()
        try FileManager.default.createDirectory(atPath: p.storeFolder, withIntermediateDirectories: true)
        #expect(FileManager.default.createFile(atPath: p.storeFolder + "/outbox.db", contents: Data()))
        for args in [["list"], ["enqueue", "plain"]] {
            let r = p.run(args)
            #expect(r.status == 74, "\(r)")
            #expect(r.err.contains("outbox.db is empty: it is damaged, not new"), "\(r.err)")
        }
        let size = (try FileManager.default.attributesOfItem(atPath: p.storeFolder + "/outbox.db")[.size] as? Int) ?? -1
        #expect(size == 0)
    }

    /// A database file shorter than a page, or a real SQLite file without tables, put where the
    /// store's was: damage, never a new store. Taken for new, the runner removed the staged
    /// bodies as orphans (with `move`, the only copies of the files).
    @Test(arguments: ["short", "blank"])
    func aDatabaseWithoutTheStoresTablesIsDamageNotANewStore(_ kind: String) throws {
        let p = try CLIProject()
        _ = try p.write("data.bin", "the only copy")
        _ = try p.write(
            "definitions/moved.yaml", "key: moved\nrequest:\n  url: http://127.0.0.1:9/x\n  file: data.bin\n  ownership: move\n")
        #expect(p.run("enqueue", "moved").status == 0)
        let staged = try FileManager.default.contentsOfDirectory(atPath: p.storeFolder + "/bodies")
        #expect(staged.count == 1)
        let db = p.storeFolder + "/outbox.db"
        for file in [db, db + "-wal", db + "-shm"] { unlink(file) }
        if kind == "short" {
            #expect(FileManager.default.createFile(atPath: db, contents: Data("x".utf8)))
        } else {
            _ = try p.sqlite("CREATE TABLE t (x); DROP TABLE t;")
        }
        let before = FileManager.default.contents(atPath: db)
        for args in [["list"], ["run", "--drain"], ["enqueue", "plain"]] {
            let r = p.run(args)
            #expect(r.status == 74, "\(r)")
            let said = kind == "short" ? "is 1 byte long, shorter than any database: it is damaged, not new" : "has no tables"
            #expect(r.err.contains(said), "\(r.err)")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: p.storeFolder + "/bodies") == staged, "the staged body is kept")
        if kind == "short" { #expect(FileManager.default.contents(atPath: db) == before, "left as it was") }
    }

    /// A same-id enqueue with another body that names the path of a file the entry copied or
    /// moved in, now gone, replaces the entry with the bytes the store holds (the only copy).
    @Test(arguments: ["copy", "move"])
    func aReplaceNamingAGoneFileReusesTheStagedBytes(_ ownership: String) throws {
        let p = try CLIProject()
        let data = try p.write("data.bin", "the only copy")
        _ = try p.write(
            "definitions/up.yaml",
            "key: up\nrequest:\n  method: PUT\n  url: \"http://127.0.0.1:9/{{ vars.round }}\"\n  file: data.bin\n  ownership: \(ownership)\n"
        )
        #expect(p.run("enqueue", "up", "--id", "f", "--delay", "1h", "--vars", #"{"round": "first"}"#).status == 0)
        if ownership == "copy" { unlink(data) }
        let r = p.run("enqueue", "up", "--id", "f", "--vars", #"{"round": "second"}"#)
        #expect(r.status == 0, "\(r)")
        let show = try p.run("show", "f", "--json").json()
        #expect(show["request"]?["url"] == .string("http://127.0.0.1:9/second"), "\(show)")
        let staged = try FileManager.default.contentsOfDirectory(atPath: p.storeFolder + "/bodies")
        #expect(staged.count == 1, "\(staged)")
        #expect(FileManager.default.contents(atPath: p.storeFolder + "/bodies/" + (staged.first ?? "")) == Data("the only copy".utf8))
    }

    /// A clock before 1970 (or past 9999): a command refuses it before it writes a time that
    /// every reader would then take for damage (an enqueue at -3,600,000 ms stopped every run).
    @Test(arguments: ["-3600000", "253402300800000"])
    func aClockOutsideWhatAStoreRecordsIsRefused(_ clock: String) async throws {
        let p = try CLIProject()
        #expect(p.run("enqueue", "note", "--id", "good", "--vars", #"{"n": 1}"#).status == 0)
        let before = try p.sqlite("SELECT id, created_at FROM entries;")
        for args in [["enqueue", "note", "--id", "bad", "--vars", #"{"n": 2}"#], ["run", "--drain"], ["list"]] {
            let r = try await p.start(args, environment: ["OUTBOX_TEST_CLOCK_MS": clock]).wait(timeout: 120)
            #expect(r.status == 74, "\(r)")
            #expect(r.err.contains("the system clock reads \(clock) ms from 1970, outside the years 1970 to 9999"), "\(r.err)")
        }
        #expect(try p.sqlite("SELECT id, created_at FROM entries;") == before, "nothing written")
        #expect(p.run("list").status == 0)
    }

    /// A file dated past 2262 (its nanoseconds past 2^63) is enqueued and sent as any other:
    /// its identity's time stopped the process (a trap on the overflow) before.
    @Test func aFileDatedPast2262IsEnqueued() async throws {
        let p = try CLIProject()
        let path = try p.write("future.bin", "from the future")
        var times = [timespec(tv_sec: 10_000_000_000, tv_nsec: 5), timespec(tv_sec: 10_000_000_000, tv_nsec: 5)]
        #expect(utimensat(AT_FDCWD, path, &times, 0) == 0, "the file system keeps such a time")
        for ownership in ["reference", "copy"] {
            _ = try p.write(
                "definitions/f.yaml", "key: f\nrequest:\n  url: http://127.0.0.1:9/x\n  file: future.bin\n  ownership: \(ownership)\n")
            let r = try await p.start(["enqueue", "f", "--id", ownership]).wait(timeout: 120)
            #expect(r.exitCode == 0, "\(r)")
        }
        #expect(p.run("audit").status == 0)
    }

    /// Out of file descriptors while reading a file body: the process's own limit, E_STORAGE
    /// (74), never "missing" (66), which a script may take as "the file is gone, skip it".
    @Test func aFileUnreadableForWantOfDescriptorsIsNotMissing() async throws {
        let p = try CLIProject()
        _ = try p.write("data.bin", String(repeating: "x", count: 70_000))
        _ = try p.write(
            "definitions/c.yaml", "key: c\nrequest:\n  url: http://127.0.0.1:9/x\n  file: data.bin\n  ownership: copy\n")
        #expect(p.run("enqueue", "plain").status == 0, "the store exists: the limit falls on the copy")
        var statuses: [Int32] = []
        var ranOut = false
        // The descriptors a command holds before it reads the body vary by build: every small limit.
        for limit in 4...14 {
            let r = try await offload { [p] in
                try runProcess(
                    "/bin/sh", ["-c", "ulimit -n \(limit) && exec \"$0\" enqueue c", p.executable], cwd: p.root,
                    environment: p.processEnvironment())
            }
            statuses.append(r.exitCode)
            #expect(r.exitCode != 66, "limit \(limit): \(r)")
            if r.exitCode == 74 && r.stderr.contains("Too many open files") { ranOut = true }
        }
        #expect(ranOut, "some limit ran out of descriptors: \(statuses)")
        #expect(statuses.last == 0, "\(statuses)")
    }

    @Test func aNewStoreIsCreatedWhole() throws {
        let p = try CLIProject()
        #expect(p.run("enqueue", "plain").status == 0)
        let names = try FileManager.default.contentsOfDirectory(atPath: p.storeFolder)
        #expect(!names.contains { $0.contains(".new-") }, "\(names)")
        #expect(try p.sqlite("SELECT COUNT(*) FROM migrations") != "0\n")
    }

    @Test func aPasswordInAURLIsNeverPrinted() throws {
        let p = try CLIProject()
        _ = try p.write("definitions/auth.yaml", "key: auth\nrequest: { url: \"https://user:hunter2@x.example/a?k=1\" }\n")
        let render = p.run("render", "auth", "--json")
        #expect(render.status == 0, "\(render)")
        #expect(!render.out.contains("hunter2"))
        #expect(render.out.contains("https://user:[redacted]@x.example/a?k=1"), "\(render.out)")
        let id = try p.enqueue("auth", vars: "{}")
        let show = p.run("show", id, "--json")
        #expect(!show.out.contains("hunter2"), "\(show.out)")
    }

    @Test(arguments: ["Content-Length", "transfer-encoding"])
    func aFramingHeaderInADefinitionIsRefused(_ name: String) throws {
        let p = try CLIProject()
        let file = try p.write(
            "definitions/framed.yaml",
            "key: framed\nrequest:\n  url: \"https://x.example/\"\n  headers: { \(name): \"5\" }\n  text: hello\n")
        let r = p.run("check")
        #expect(r.status == 78, "\(r)")
        #expect(r.err.contains("\(file):4:"), "\(r.err)")
        #expect(r.err.contains("header \(name) cannot be set: outbox frames the body itself"), "\(r.err)")
    }

    @Test(arguments: [
        ("plain", "plain"),
        ("\u{1B}[2J\u{1B}[31mred", "\\x1b[2J\\x1b[31mred"),
        ("bell\u{07} and del\u{7F}", "bell\\x07 and del\\x7f"),
        ("tab\tkept", "tab\tkept"),
        ("c1 \u{9B}31m", "c1 \\x9b31m"),
    ])
    func controlCharactersFromAHookAreEscapedInTheLog(_ raw: String, logged: String) {
        #expect(TerminalText.visible(raw) == logged)
    }

    @Test(arguments: [
        ("https://x.example/a", "https://x.example/a"),
        ("https://user:secret@x.example/a", "https://user:[redacted]@x.example/a"),
        // A user without a password is an API key given as the user name: libcurl sends it as Basic.
        ("https://sk_live_key@x.example/a", "https://[redacted]@x.example/a"),
        ("https://@x.example/a", "https://@x.example/a"),
        ("https://x.example/a?next=http://u:p@y/", "https://x.example/a?next=http://u:p@y/"),
        ("http://u:p:q@h:8080/", "http://u:[redacted]@h:8080/"),
        ("https://u:p@w@h/x", "https://u:[redacted]@h/x"),
        ("https://ü:pässwörd@h#f", "https://ü:[redacted]@h#f"),
        ("https://u:@h/", "https://u:[redacted]@h/"),
        ("https://h/a:b@c", "https://h/a:b@c"),
        ("u:p@h", "u:p@h"),
        ("https:/u:p@h", "https:/u:p@h"),
        ("", ""),
    ])
    func aPasswordInUserinfoIsRedacted(_ url: String, shown: String) {
        #expect(URLCheck.redactingPassword(url) == shown)
        #expect(URLCheck.shown(url, secret: false) == shown)
    }

    // What an echo of the request would show of a userinfo without a password, and a line of a
    // file that names one (an http URL's user; a postgres:// store's user is no credential).
    @Test func aUserWithoutAPasswordIsACredential() {
        #expect(URLCheck.credentialValues("http://sk%5Flive@h/") == ["sk%5Flive", "sk_live", "c2tfbGl2ZTo="])
        #expect(URLCheck.credentialValues("http://u:pw@h/") == ["pw", "pw", "dTpwdw=="])
        #expect(URLCheck.redactingPasswords(inText: #"  url: "HTTPS://sk_live@h/x""#) == #"  url: "HTTPS://[redacted]@h/x""#)
        #expect(URLCheck.redactingPasswords(inText: "store: postgres://outbox@db/q") == "store: postgres://outbox@db/q")
        #expect(URLCheck.redactingPasswords(inText: "store: postgres://outbox:pw@db/q") == "store: postgres://outbox:[redacted]@db/q")
    }

    @Test(arguments: [
        ("https://hooks.example/services/T0/B0/XyZ", "https://hooks.example/[redacted]"),
        ("https://u:p@api.example:8443/bot123:AAH/send?chat=1#f", "https://api.example:8443/[redacted]"),
        ("http://h?token=t", "http://h/[redacted]"),
        ("http://H.Example", "http://H.Example/[redacted]"),
        ("not a url", "[redacted]"),
        ("", "[redacted]"),
    ])
    func aURLFromTheEnvironmentIsShownByItsOriginAlone(_ url: String, shown: String) {
        #expect(URLCheck.shown(url, secret: true) == shown)
    }
}

/// `ownership: move` takes regular files only: a link is refused, and nothing outside the
/// store is moved or has its mode changed.
struct MoveOwnershipTests {
    @Test func aSymbolicLinkIsNotMoved() throws {
        let p = try CLIProject()
        _ = try p.write(
            "definitions/mv.yaml",
            """
            key: mv
            request: { method: PUT, url: "https://x.example/up", file: "{{ vars.path }}", ownership: move }
            """)
        let target = try p.write("outside/data.bin", "payload", mode: 0o644)
        let link = p.root + "/link.bin"
        #expect(symlink(target, link) == 0)
        let r = p.run("enqueue", "mv", "--vars", #"{"path": "link.bin"}"#)
        #expect(r.status == 65, "\(r)")
        #expect(r.err.contains("is a symbolic link; ownership: move takes a regular file"), "\(r.err)")
        let linkStill = (try? FileManager.default.destinationOfSymbolicLink(atPath: link)) == target
        #expect(linkStill)
        let mode = (try FileManager.default.attributesOfItem(atPath: target)[.posixPermissions] as? Int) ?? 0
        #expect(mode == 0o644)
        if p.storeExists { #expect(try p.run("list", "--json").json() == .array([])) }
    }
}

/// `pause --key a b` and `pause --key a --key b` alike (the contract writes `--key K…`); a key
/// without `--key` is refused, since `pause` alone pauses the whole queue.
struct PauseKeysTests {
    @Test func keysFollowKeyOrRepeatIt() throws {
        let p = try CLIProject()
        let spaced = p.run("pause", "--key", "a", "b", "c", "--json")
        #expect(spaced.status == 0, "\(spaced)")
        #expect(try spaced.json()["paused_keys"] == .array([.string("a"), .string("b"), .string("c")]))
        let repeated = p.run("resume", "--key", "a", "--key", "b", "--json")
        #expect(try repeated.json()["paused_keys"] == .array([.string("c")]))
        let stray = p.run("pause", "c2")
        #expect(stray.status == 64, "\(stray)")
        #expect(stray.err == "outbox: E_USAGE: \"c2\": give keys with --key (outbox pause --key K…)\n")
        #expect(
            try p.run("resume", "--key", "c", "--json").json() == .object([("queue_paused", .bool(false)), ("paused_keys", .array([]))]))
    }
}

/// The account's variable unset: `enqueue` refuses (the entry would run on any runner), the
/// previews that store nothing show no account, as a runner started here would have none.
struct UnsetAccountTests {
    @Test func enqueueRefusesItAndThePreviewsGoOn() throws {
        let p = try CLIProject(config: "account: \"{{ env.NO_ACCOUNT_VAR_T }}\"\n")
        let enqueue = p.run("enqueue", "plain")
        #expect(enqueue.status == 65, "\(enqueue)")
        #expect(enqueue.err.contains("account: {{ env.NO_ACCOUNT_VAR_T }} does not resolve"), "\(enqueue.err)")
        #expect(p.run("render", "plain", "--json").status == 0)
        #expect(p.run("simulate", "plain", "--status", "200").status == 0)
        #expect(p.run(["enqueue", "plain"], environment: ["NO_ACCOUNT_VAR_T": "alice"]).status == 0)
    }
}

/// `render` writes nothing and runs no plugin unless asked: plugins can have side effects.
struct RenderPluginTests {
    @Test func renderSkipsPluginsUnlessAsked() throws {
        let p = try CLIProject(config: "headers_command: [plugins/headers.sh]\n")
        _ = try p.write(
            "plugins/headers.sh", "#!/bin/sh\ncat > /dev/null\necho ran >> plugins/ran.log\nprintf '{\"X-From-Plugin\": \"yes\"}'\n",
            mode: 0o755)
        _ = try p.write(
            "plugins/describe.sh", "#!/bin/sh\ncat > /dev/null\necho ran >> plugins/ran.log\nprintf '{\"url\": \"https://x.example/c\"}'\n",
            mode: 0o755)
        _ = try p.write("definitions/cmd.yaml", "key: cmd\nrequest_command: [plugins/describe.sh]\n")

        let plain = p.run("render", "plain", "--json")
        #expect(plain.status == 0, "\(plain)")
        #expect(plain.err.contains("headers_command not run (--plugins runs it)"))
        #expect(try plain.json()["skipped"] == .array([.string("headers_command")]))
        #expect(try plain.json()["headers"]?["X-From-Plugin"] == nil)
        let cmd = p.run("render", "cmd", "--json")
        #expect(cmd.status == 0, "\(cmd)")
        #expect(
            try cmd.json()
                == .object([("key", .string("cmd")), ("skipped", .array([.string("request_command"), .string("headers_command")]))]))
        #expect(!p.exists("plugins/ran.log"), "no plugin ran")

        let asked = p.run("render", "cmd", "--plugins", "--json")
        #expect(asked.status == 0, "\(asked)")
        #expect(try asked.json()["url"] == .string("https://x.example/c"))
        // A header from headers_command is present, and redacted like every plugin credential.
        #expect(try asked.json()["headers"]?["X-From-Plugin"] == .string("[redacted]"))
        #expect(try asked.json()["skipped"] == .array([]))
        #expect(p.read("plugins/ran.log") == "ran\nran\n")
        #expect(!p.storeExists, "render writes nothing")
    }
}

/// Global options work before the command as after it.
struct GlobalOptionTests {
    @Test func configAndJSONBeforeTheCommand() throws {
        let p = try CLIProject()
        let id = try p.enqueue("plain", vars: "{}")
        let other = TemporaryFolder(prefix: "elsewhere")
        let config = p.root + "/config/outbox.yaml"
        for args in [
            ["--config", config, "list", "--json"], ["--config=\(config)", "--json", "list"], ["list", "--json", "--config", config],
        ] {
            let r = p.run(args, cwd: other.path)
            #expect(r.status == 0, "\(args): \(r)")
            #expect(try r.json().arrayValue?.first?["id"] == .string(id), "\(args)")
        }
        let usage = p.run(["--config"])
        #expect(usage.status == 64, "\(usage)")
    }
}

/// `outbox simulate`: accept rules, parser and hook on a made-up response; nothing sent or stored.
struct SimulateTests {
    static func project() throws -> CLIProject {
        let p = try CLIProject()
        _ = try p.write(
            "hooks/save.sh", "#!/bin/sh\ncat > hooks/in-$OUTBOX_OUTCOME.json\necho \"hook for $OUTBOX_ID\"\nexit 3\n", mode: 0o755)
        _ = try p.write(
            "definitions/sim.yaml",
            """
            key: sim
            request: { url: "https://x.example/notes/{{ vars.n }}", data: { n: "{{ vars.n }}" } }
            response: json
            accept: [{ status: 409, body_includes: "exists" }]
            on_success: hooks/save.sh
            on_error: hooks/save.sh
            then: { on_success: [{ key: plain }] }
            """)
        return p
    }

    @Test func aSuccessRunsTheParserAndOnSuccess() throws {
        let p = try Self.project()
        let r = p.run(
            "simulate", "sim", "--vars", #"{"n": 7}"#, "--status", "201", "--header", "Content-Type: application/json",
            "--body", #"{"id": 42}"#)
        #expect(r.status == 3, "the hook's exit status: \(r)")
        #expect(r.out == "hook for simulate-1\n")
        #expect(r.err.contains("then would enqueue: plain"), "\(r.err)")
        let input = try JSON.parse(try #require(p.read("hooks/in-completed.json")))
        #expect(input["data"] == .object([("id", .int(42))]))
        #expect(input["vars"] == .object([("n", .int(7))]))
        #expect(input["response"]?["headers"]?["content-type"] == .string("application/json"))
        #expect(input["meta"]?["deliveries"] == .int(1))
        #expect(!p.storeExists, "nothing stored")
    }

    /// A hook its shell cannot run (its `#!` interpreter is missing): simulate says why, as run does.
    @Test func aHookWhoseInterpreterIsMissingIsExplained() throws {
        let p = try CLIProject()
        _ = try p.write("hooks/old.sh", "#!/usr/bin/no-such-python\nprint('hi')\n", mode: 0o755)
        _ = try p.write("definitions/old.yaml", "key: old\nrequest: { url: \"https://x.example/\" }\non_success: hooks/old.sh\n")
        let r = p.run("simulate", "old", "--status", "200")
        #expect(r.status == 127, "\(r)")
        #expect(
            r.err.contains(
                "which exited 127 (on_success: hooks/old.sh names the interpreter /usr/bin/no-such-python, which does not exist)"),
            "\(r.err)")
    }

    /// simulate applies the runner's rules to what the outcome enqueues: an invalid enqueue
    /// line fails the delivery (exit 1, "delivered again"), a failing hook's lines count for
    /// nothing, a `then` item that cannot be built voids the chain, and an outcome with no hook
    /// shows `meta.deliveries` as a hook would get it.
    @Test func simulateJudgesWhatTheOutcomeEnqueuesAsTheRunnerWould() throws {
        let p = try CLIProject()
        let typo = #"{"enqueue": {"key": "plain", "idd": "typo"}}"#
        _ = try p.write("hooks/typo.sh", "#!/bin/sh\ncat > hooks/in-typo.json\necho '\(typo)'\nexit 0\n", mode: 0o755)
        _ = try p.write("hooks/fails.sh", "#!/bin/sh\ncat > /dev/null\necho '{\"enqueue\": {\"key\": \"plain\"}}'\nexit 3\n", mode: 0o755)
        _ = try p.write(
            "definitions/typo.yaml",
            """
            key: typo
            request: { url: "https://x.example/p", data: { a: 1 } }
            on_success: hooks/typo.sh
            then: { on_success: [{ key: plain, id: "next-{{ outcome.data.id }}" }] }
            """)
        let typoRun = p.run("simulate", "typo", "--status", "200", "--body", "{}", "--json")
        #expect(typoRun.status == 1, "\(typoRun)")
        let doc = try typoRun.json()
        #expect(doc["hook_exit"] == .int(0))
        #expect(doc["hook_problem"]?.stringValue?.contains(#"enqueue has an unknown field "idd""#) == true, "\(doc.serialized())")
        #expect(doc["follow_ups"] == .array([]))
        #expect(doc["follow_up_errors"]?.arrayValue?.first?.stringValue?.contains("outcome.data is null") == true, "\(doc.serialized())")
        // The hook's input names the void chain, as the runner's does.
        let input = try JSON.parse(try #require(p.read("hooks/in-typo.json")))
        let failure = input["follow_up_errors"]?.arrayValue?.first
        #expect(failure?["index"] == .int(0) && failure?["key"] == .string("plain"), "\(input.serialized())")
        #expect(failure?["message"]?.stringValue?.contains("outcome.data is null") == true, "\(input.serialized())")
        #expect(doc["outcome"]?["follow_up_errors"] == input["follow_up_errors"])
        _ = try p.write(
            "definitions/fails.yaml", "key: fails\nrequest: { url: \"https://x.example/p\", data: { a: 1 } }\non_success: hooks/fails.sh\n")
        let failing = p.run("simulate", "fails", "--status", "200")
        #expect(failing.status == 3 && !failing.err.contains("enqueue lines would enqueue"), "\(failing)")
        _ = try p.write("definitions/bare.yaml", "key: bare\nrequest: { url: \"https://x.example/p\", data: { a: 1 } }\n")
        let bare = try p.run("simulate", "bare", "--status", "200", "--json").json()
        #expect(bare["outcome"]?["meta"]?["deliveries"] == .int(1), "\(bare.serialized())")
        // Past 1 MiB of stdout the enqueue lines after the cut would be lost: the runner fails
        // that delivery, so simulate does too.
        _ = try p.write(
            "hooks/loud.sh",
            "#!/bin/sh\ncat > /dev/null\nhead -c 1100000 /dev/zero | tr '\\0' x\necho\necho '{\"enqueue\": {\"key\": \"plain\"}}'\n",
            mode: 0o755)
        _ = try p.write(
            "definitions/loud.yaml", "key: loud\nrequest: { url: \"https://x.example/p\", data: { a: 1 } }\non_success: hooks/loud.sh\n")
        let loud = p.run("simulate", "loud", "--status", "200", "--json")
        #expect(loud.status == 1, "\(loud.err)")
        let loudDoc = try loud.json()
        #expect(loudDoc["hook_exit"] == .int(0))
        #expect(loudDoc["hook_problem"]?.stringValue?.contains("printed more than 1 MiB on stdout") == true, "\(loud.err)")
        #expect(loudDoc["hook_enqueues"] == .array([]))
        // A follow-up whose plugin fails is named with what a runner does with it.
        _ = try p.write("plugins/down.sh", "#!/bin/sh\ncat > /dev/null\necho 'token service down' >&2\nexit 3\n", mode: 0o755)
        _ = try p.write("definitions/down.yaml", "key: down\nrequest_command: plugins/down.sh\n")
        _ = try p.write(
            "definitions/chained.yaml",
            "key: chained\nrequest: { url: \"https://x.example/p\", data: { a: 1 } }\nthen: { on_success: [{ key: down }] }\n")
        let held = p.run("simulate", "chained", "--status", "200", "--plugins", "--json")
        #expect(held.status == 1, "the runner's delivery would fail: \(held)")
        let chained = try held.json()
        #expect(
            chained["follow_up_errors"]?.arrayValue?.first?.stringValue
                == "then.on_success[0]: request_command exited 3: token service down (it may pass later: a runner builds the chain again when it delivers the outcome)",
            "\(chained.serialized())")
        #expect(chained["hook_exit"] == .null)
        #expect(chained["note"]?.stringValue?.hasPrefix("outcome completed; the runner would hold it and run no hook") == true)
        // So does one whose definition has errors: the runner holds the outcome until it is fixed.
        _ = try p.write("definitions/down.yaml", "key: down\nrequest: { url: 5 }\n")
        let broken = p.run("simulate", "chained", "--status", "200", "--json")
        #expect(broken.status == 1, "\(broken)")
        #expect(try broken.json()["note"]?.stringValue?.contains("the definition of \"down\" has errors") == true, "\(broken.out)")
    }

    @Test(arguments: [("422", "", "error"), ("409", #"{"e": "already exists"}"#, "completed"), ("409", #"{"e": "conflict"}"#, "error")])
    func theAcceptRulesDecideTheOutcome(_ status: String, body: String, outcome: String) throws {
        let p = try Self.project()
        let r = p.run("simulate", "sim", "--vars", #"{"n": 1}"#, "--status", status, "--body", body, "--json")
        #expect(r.status == 3, "\(r)")
        let doc = try r.json()
        #expect(doc["outcome"]?["outcome"] == .string(outcome))
        #expect(doc["hook_exit"] == .int(3))
        #expect(p.exists("hooks/in-\(outcome).json"))
        // The outcome shown is what the hook read.
        #expect(doc["outcome"] == (try JSON.parse(try #require(p.read("hooks/in-\(outcome).json")))))
    }

    /// A plugin's background children end with it: its answer is complete when it exits, and
    /// a child left running would outlive the run.
    @Test func aPluginsBackgroundChildIsStoppedWhenItExits() async throws {
        let p = try Self.project()
        try p.write(
            "definitions/bg.yaml",
            "key: bg\nrequest: { url: \"https://x.example/\" }\nresponse: { command: \"sleep 600 & \(ObservedProcess.recordLastBackground(to: "bg.pid")); cat > /dev/null; echo '{}'\" }\n"
        )
        let r = p.run("simulate", "bg", "--status", "200", "--body", "{}", "--json")
        #expect(r.status == 0, "\(r)")
        let child = try #require(ObservedProcess(recorded: (try? String(contentsOfFile: p.path("bg.pid"), encoding: .utf8)) ?? ""))
        // SIGKILLed as the plugin ended; on a busy machine it may take a moment to be gone.
        await eventually("the plugin's child \(child.pid) is gone", timeout: 60) { child.hasEnded }
    }

    /// A parser that prints without end is stopped once its output passes the cap, not left
    /// to run until plugins.timeout (5 min here: reaching it fails the test rather than hang it).
    @Test func aParserPrintingWithoutEndIsStoppedAtTheCap() throws {
        let p = try Self.project()
        try p.write("config/outbox.yaml", "plugins: { timeout: 5m }\n")
        try p.write(
            "definitions/loud.yaml", "key: loud\nrequest: { url: \"https://x.example/\" }\nresponse: { command: [\"/usr/bin/yes\"] }\n")
        let r = p.run("simulate", "loud", "--status", "200", "--body", "{}", "--json")
        #expect(r.status == 0, "\(r)")
        let error = try r.json()["outcome"]?["error"]
        // The parser is named by its command.
        #expect(
            error?["message"] == .string(#"the response parser ["/usr/bin/yes"] printed more than 16 MiB and was stopped"#),
            "\(r.out.prefix(600))")
    }

    @Test(arguments: [("503", "retry"), ("401", "awaiting-auth")])
    func aRetryOrAParkRunsNoHook(_ status: String, klass: String) throws {
        let p = try Self.project()
        let r = p.run("simulate", "sim", "--vars", #"{"n": 1}"#, "--status", status, "--json")
        #expect(r.status == 0, "\(r)")
        #expect(try r.json()["class"] == .string(klass))
        #expect(try r.json()["hook_exit"] == .null)
        #expect(!p.exists("hooks/in-error.json") && !p.exists("hooks/in-completed.json"))
    }

    @Test(arguments: [["--status", "700"], ["--status", "99"], ["--status", "abc"], [String]()])
    func aStatusOutside100To599IsAUsageError(_ arguments: [String]) throws {
        let p = try Self.project()
        let r = p.run(["simulate", "sim", "--vars", #"{"n": 1}"#] + arguments)
        #expect(r.status == 64, "\(r)")
        #expect(!p.storeExists)
        #expect(!p.exists("hooks/in-error.json") && !p.exists("hooks/in-completed.json"))
    }

    /// A header with a line break is refused whole, never cut where the break is.
    @Test(arguments: ["X-A: one\r\nX-B: two", "X-A: one\ntwo", "X-A\n: one", "X-A: one\u{0}"])
    func aHeaderWithALineBreakIsAUsageError(_ header: String) throws {
        let p = try Self.project()
        let r = p.run(["simulate", "sim", "--vars", #"{"n": 1}"#, "--status", "200", "--header", header])
        #expect(r.status == 64, "\(r)")
        #expect(r.err.contains("E_USAGE: --header 1 of 1: header value contains CR, LF or NUL"), "\(r.err)")
        #expect(!p.storeExists)
        #expect(!p.exists("hooks/in-error.json") && !p.exists("hooks/in-completed.json"))
    }
}

/// `stats`: paused entries count as paused; `--prometheus --output FILE` is written whole.
struct StatsTests {
    @Test func pausedEntriesAreCountedAsPaused() throws {
        let p = try CLIProject()
        _ = try p.enqueue("plain", vars: "{}")
        _ = try p.enqueue("note", vars: #"{"n": 1}"#)
        #expect(p.run("pause", "--key", "plain").status == 0)
        let doc = try p.run("stats", "--json").json()
        #expect(doc["entries"]?["paused"] == .int(1))
        #expect(doc["entries"]?["queued"] == .int(1))
        // Key by key as well, in JSON and in the Prometheus text.
        #expect(doc["keys"]?["plain"]?["paused"] == .int(1))
        #expect(doc["keys"]?["plain"]?["queued"] == .int(0))
        #expect(doc["keys"]?["note"]?["queued"] == .int(1))
        let text = p.run("stats", "--prometheus").out
        #expect(text.contains("\noutbox_key_entries{key=\"plain\",state=\"paused\"} 1\n"), "\(text)")
        #expect(text.contains("\noutbox_key_entries{key=\"note\",state=\"queued\"} 1\n"), "\(text)")
        #expect(p.run("pause").status == 0)
        #expect(try p.run("stats", "--json").json()["entries"]?["paused"] == .int(2))
    }

    /// A pause or resume killed after its key's entries were marked, before its commit,
    /// leaves the key as it was and every mark with it: the audit finds nothing, and the
    /// entries are held or sent as before.
    @Test func aPauseOrResumeKilledBeforeItsCommitChangesNothing() async throws {
        let p = try CLIProject()
        for n in 1...3 { _ = try p.enqueue("note", vars: #"{"n": \#(n)}"#) }
        let marks = "SELECT group_concat(paused, '') FROM entries;"
        let killed = try await p.outbox(["pause", "--key", "note"], environment: ["OUTBOX_FAULT": "store.pause:1"])
        #expect(killed.exitCode == -9, "\(killed)")
        #expect(try p.sqlite(marks).trimmingCharacters(in: .whitespacesAndNewlines) == "000")
        #expect(try p.run("stats", "--json").json()["entries"]?["queued"] == .int(3))
        #expect(p.run("audit").status == 0)
        #expect(p.run("pause", "--key", "note").status == 0)
        #expect(try p.sqlite(marks).trimmingCharacters(in: .whitespacesAndNewlines) == "111")
        let resumeKilled = try await p.outbox(["resume", "--key", "note"], environment: ["OUTBOX_FAULT": "store.pause:1"])
        #expect(resumeKilled.exitCode == -9, "\(resumeKilled)")
        #expect(try p.sqlite(marks).trimmingCharacters(in: .whitespacesAndNewlines) == "111")
        #expect(try p.run("stats", "--json").json()["entries"]?["paused"] == .int(3))
        #expect(p.run("audit").status == 0)
    }

    @Test func prometheusTextIsWrittenAtomicallyToAFile() throws {
        let p = try CLIProject()
        _ = try p.enqueue("plain", vars: "{}")
        let r = p.run("stats", "--prometheus", "--output", "metrics/outbox.prom")
        #expect(r.status == 74, "the folder must exist: \(r)")
        try FileManager.default.createDirectory(atPath: p.root + "/metrics", withIntermediateDirectories: false)
        let written = p.run("stats", "--prometheus", "--output", "metrics/outbox.prom")
        #expect(written.status == 0, "\(written)")
        #expect(written.out.isEmpty)
        let text = try #require(p.read("metrics/outbox.prom"))
        #expect(text.contains("outbox_entries{state=\"queued\"} 1\n"), "\(text)")
        #expect(text.hasSuffix("\n"))
        #expect(try FileManager.default.contentsOfDirectory(atPath: p.root + "/metrics") == ["outbox.prom"], "no temporary file left")
        #expect(p.run("stats", "--output", "x.prom").status == 64, "--output goes with --prometheus")
    }

    /// A link is written through, a file keeps its mode, and a device is never replaced.
    @Test func prometheusOutputRespectsWhatIsThere() throws {
        let p = try CLIProject()
        let fm = FileManager.default
        _ = try p.write("metrics/real.prom", "old\n", mode: 0o640)
        try fm.createSymbolicLink(atPath: p.root + "/metrics/link.prom", withDestinationPath: "real.prom")
        #expect(p.run("stats", "--prometheus", "--output", "metrics/link.prom").status == 0)
        #expect(try fm.destinationOfSymbolicLink(atPath: p.root + "/metrics/link.prom") == "real.prom")
        #expect(p.read("metrics/real.prom")?.contains("outbox_entries{state=\"queued\"} 0\n") == true)
        #expect((try fm.attributesOfItem(atPath: p.root + "/metrics/real.prom")[.posixPermissions] as? Int) == 0o640)
        // A link whose file is not there yet: the file is made where it points, the link stays.
        try fm.createSymbolicLink(atPath: p.root + "/metrics/new.prom", withDestinationPath: "made.prom")
        #expect(p.run("stats", "--prometheus", "--output", "metrics/new.prom").status == 0)
        #expect(try fm.destinationOfSymbolicLink(atPath: p.root + "/metrics/new.prom") == "made.prom")
        #expect(p.read("metrics/made.prom")?.contains("outbox_entries{state=\"queued\"} 0\n") == true)
        try fm.createSymbolicLink(atPath: p.root + "/metrics/away.prom", withDestinationPath: "nofolder/x.prom")
        let away = p.run("stats", "--prometheus", "--output", "metrics/away.prom")
        #expect(away.status == 74, "\(away)")
        #expect(try fm.destinationOfSymbolicLink(atPath: p.root + "/metrics/away.prom") == "nofolder/x.prom")
        #expect(mknod(p.root + "/metrics/null", S_IFCHR | 0o666, 259) == 0, "/dev/null's numbers, 1:3")
        let device = p.run("stats", "--prometheus", "--output", "metrics/null")
        #expect(device.status == 65)
        #expect(device.err == "outbox: E_INVALID: --output: \(p.root)/metrics/null exists and is not a regular file\n")
        #expect((try fm.attributesOfItem(atPath: p.root + "/metrics/null")[.type] as? FileAttributeType) == .typeCharacterSpecial)
    }

    @Test func theOldestQueuedAgeIsAlwaysThere() throws {
        let p = try CLIProject()
        #expect(p.run("stats", "--prometheus").out.contains("\noutbox_oldest_queued_age_seconds 0.000\n"))
        _ = try p.enqueue("plain", vars: "{}")
        _ = try p.enqueue("note", vars: #"{"n": 1}"#)
        // The first one was enqueued 90 s ago: its age, not the newer one's, is reported.
        _ = try p.sqlite("UPDATE entries SET created_at = created_at - 90000 WHERE key = 'plain';")
        let age = try #require(try p.run("stats", "--json").json()["oldest_queued_age_seconds"]?.doubleValue)
        #expect(age >= 90 && age < 3600, "\(age)")
        let line = p.run("stats", "--prometheus").out.split(separator: "\n").first { $0.hasPrefix("outbox_oldest_queued_age_seconds ") }
        let value = try #require(line.flatMap { Double($0.split(separator: " ")[1]) })
        #expect(value >= 90 && value < 3600)
    }
}

/// Text from outside that is not UTF-8 is refused, never silently repaired; the store
/// folder is never a link and never open to others.
struct HostileFileTests {
    static let bad: [UInt8] = Array("key: x\n".utf8) + [0xFF, 0xFE] + Array("\n".utf8)

    @Test func aDefinitionOrConfigThatIsNotUTF8IsAConfigError() throws {
        let p = try CLIProject()
        let file = p.root + "/definitions/bad.yaml"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(Self.bad)))
        let r = p.run("check")
        #expect(r.status == 78, "\(r)")
        #expect(r.err.contains("\(file):2:1: error: the file is not valid UTF-8 (at byte 8)"), "\(r.err)")
        #expect(FileManager.default.createFile(atPath: p.root + "/config/outbox.yaml", contents: Data(Self.bad)))
        let config = p.run("list")
        #expect(config.status == 78, "\(config)")
        #expect(config.err.contains("outbox.yaml:2:1: error: the file is not valid UTF-8"), "\(config.err)")
    }

    @Test func varsAndLinesThatAreNotUTF8AreInvalid() throws {
        let p = try CLIProject()
        #expect(
            FileManager.default.createFile(
                atPath: p.root + "/vars.json", contents: Data(Array(#"{"t": ""#.utf8) + [0xC3] + Array(#""}"#.utf8))))
        let vars = p.run("enqueue", "plain", "--vars", "@vars.json")
        #expect(vars.status == 65, "\(vars)")
        #expect(vars.err.contains("--vars is not valid UTF-8 (at byte 8)"), "\(vars.err)")
        #expect(
            FileManager.default.createFile(
                atPath: p.root + "/lines.jsonl", contents: Data(Array("{}\n{\"vars\": {\"t\": \"".utf8) + [0x80] + Array("\"}}\n".utf8))))
        let from = p.run("enqueue", "plain", "--from", "lines.jsonl")
        #expect(from.status == 65, "\(from)")
        #expect(from.err.contains("lines.jsonl:2: the line is not valid UTF-8 (at byte 17)"), "\(from.err)")
        #expect(!p.storeExists)
    }

    @Test func aStoreFolderThatIsALinkIsRefused() throws {
        let p = try CLIProject()
        let elsewhere = TemporaryFolder(prefix: "elsewhere")
        #expect(symlink(elsewhere.path, p.storeFolder) == 0)
        let r = p.run("enqueue", "plain")
        #expect(r.status == 74, "\(r)")
        #expect(r.err.contains("is a symbolic link"), "\(r.err)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: elsewhere.path).isEmpty, "nothing written through the link")
    }

    @Test func aStoreFolderOpenToOthersIsTightened() async throws {
        let p = try CLIProject()
        try FileManager.default.createDirectory(
            atPath: p.storeFolder, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o777])
        chmod(p.storeFolder, 0o777)
        let r = try await p.outbox(["enqueue", "plain"])
        #expect(r.exitCode == 0, "\(r)")
        #expect(r.stderr.contains("was open to others (mode 777); it is 0700 now"), "\(r.stderr)")
        let mode = (try FileManager.default.attributesOfItem(atPath: p.storeFolder)[.posixPermissions] as? Int) ?? 0
        #expect(mode == 0o700)
        // A folder its owner made read-only loses others' bits and stays read-only.
        chmod(p.storeFolder, 0o555)
        let listed = try await p.outbox(["list"])
        #expect(listed.stderr.contains("was open to others (mode 555); it is 0500 now"), "\(listed.stderr)")
        let after = (try FileManager.default.attributesOfItem(atPath: p.storeFolder)[.posixPermissions] as? Int) ?? 0
        #expect(after == 0o500)
        chmod(p.storeFolder, 0o700)
    }
}

/// `wifi-only` takes on or off; anything else is a usage error that changes nothing.
struct WifiOnlyTests {
    @Test(arguments: ["maybe", "ON", "1", ""])
    func anythingButOnOrOffIsAUsageError(_ value: String) throws {
        let p = try CLIProject()
        _ = try p.enqueue("plain", vars: "{}")
        let before = try p.sqlite("SELECT name, value FROM settings")
        let r = p.run("wifi-only", value)
        #expect(r.status == 64, "\(r)")
        #expect(r.err.contains("wifi-only takes on or off"))
        #expect(try p.sqlite("SELECT name, value FROM settings") == before)
    }
}

/// A `headers update` patch that would make a request too large for libcurl (1,000 headers or
/// 1,000,000 bytes of head) is refused when it meets the request, and nothing changes: sent,
/// each attempt would fail as "out of memory" until the entry expired.
struct HeadersUpdateLimitTests {
    static func manyHeaders(_ count: Int, prefix: String) -> String {
        (0..<count).map { "    \(prefix)-\($0): v\n" }.joined()
    }

    func settingsAndStore(_ p: CLIProject) throws -> [String] {
        try p.snapshot() + [try p.sqlite("SELECT * FROM settings ORDER BY 1;")]
    }

    @Test func aPatchThatWouldPushAnEntryOverTheHeaderCountIsRefused() throws {
        let p = try CLIProject()
        // 993 of its own and the config's 2.
        try p.define("wide", "key: wide\nrequest:\n  url: http://127.0.0.1:9/x\n  headers:\n" + Self.manyHeaders(993, prefix: "X-Old"))
        _ = try p.enqueue("wide", vars: "{}", id: "w1")
        let before = try settingsAndStore(p)
        let r = p.run(["headers", "update"] + (0..<6).map { "X-New-\($0): v" })
        #expect(r.status == 65, "\(r)")
        #expect(
            r.err
                == "outbox: E_INVALID: entry w1: with the headers update patch, request.headers: 1001 headers, over the 1000 a request may carry\n",
            "\(r.err)")
        #expect(try settingsAndStore(p) == before, "the store did not change")
        // Five more fit: the same entry takes them.
        #expect(p.run(["headers", "update"] + (0..<5).map { "X-New-\($0): v" }).status == 0)
    }

    @Test func aPatchOverTheHeadSizeAloneIsRefusedEvenWithNoEntry() throws {
        let p = try CLIProject()
        #expect(p.run("run", "--drain").status == 0, "an empty store")
        let before = try settingsAndStore(p)
        // Eight values of 125,000 bytes: each argument fits the kernel's limit, together they pass 1,000,000.
        let value = String(repeating: "a", count: 125_000)
        let r = p.run(["headers", "update"] + (0..<8).map { "X-Big-\($0): \(value)" })
        #expect(r.status == 65, "\(r)")
        #expect(
            r.err == "outbox: E_INVALID: headers update: the patch would hold 1000088 bytes, over the 1000000 of one request head\n",
            "\(r.err)")
        #expect(try settingsAndStore(p) == before, "the store did not change")
    }

    @Test func anEnqueueThatThePatchWouldPushOverIsRefused() throws {
        let p = try CLIProject()
        #expect(p.run(["headers", "update"] + (0..<600).map { "X-Patch-\($0): v" }).status == 0)
        // 600 from the patch, 399 of its own and the config's 2.
        try p.define("wide", "key: wide\nrequest:\n  url: http://127.0.0.1:9/x\n  headers:\n" + Self.manyHeaders(399, prefix: "X-Own"))
        _ = try p.enqueue("plain", vars: "{}")
        let before = try settingsAndStore(p)
        let r = p.run("enqueue", "wide", "--id", "w2")
        #expect(r.status == 65, "\(r)")
        #expect(
            r.err
                == "outbox: E_INVALID: entry w2: with the headers update patch, request.headers: 1001 headers, over the 1000 a request may carry\n",
            "\(r.err)")
        let after = try settingsAndStore(p)
        #expect(after == before, "the store did not change: \(after.difference(from: before))")
    }
}
