import Foundation
import OutboxModel
import Testing
import TestSupport

/// A `then` chain is applied whole or not at all: a follow-up that cannot be built leaves
/// none enqueued, and the parent's outcome says why, for its hook and for `show`.
struct FollowUpFailureTests {
    @Test func aFollowUpThatCannotRenderIsRecordedOnTheParentsOutcome() async throws {
        let parent = definition(
            "order",
            top: """
                then:
                  on_success:
                    - key: receipt
                      vars: { url: "{{ vars.url }}", tag: "t" }
                    - key: receipt
                      id: "bad id with spaces {{ entry.id }}"
                      vars: { url: "{{ vars.url }}", tag: "t" }
                """)
        let p = try Project(definitions: ["order": parent, "receipt": definition("receipt")])
        try await p.enqueue("order", path: "/status/200", id: "o1")
        // A chain that stops is a failure of the drain (exit bit 4), its parent named.
        let run = try await p.drain(["--json"], failures: 4)
        #expect(run.json?.at("failed")?["follow_up_failures"] == .array([.string("o1")]), "\(run.stdout)")
        #expect(run.stderr.contains("the follow-ups of o1 were not enqueued"), "\(run.stderr)")
        // Neither follow-up was enqueued, not even the one that rendered.
        #expect(p.server.requests.map(\.path) == ["/status/200"])
        #expect(try await p.list().isEmpty)
        let hook = try #require(p.deliveries("o1").first)
        let errors = try #require(hook.at("stdin.follow_up_errors")?.arrayValue)
        #expect(errors.count == 1, "\(errors)")
        #expect(errors.first?["index"] == .int(1))
        #expect(errors.first?["key"] == .string("receipt"))
        #expect(errors.first?["message"]?.stringValue?.contains("bad id with spaces o1") == true)
        // The reference lists every field of them.
        let documented = Set(PayloadFields.hookInput.map(\.path))
        for field in errors.first?.objectValue?.map(\.0) ?? [] {
            #expect(documented.contains("follow_up_errors.\(field)"), "follow_up_errors.\(field)")
        }
    }
}

/// A follow-up whose plugin fails may be built later (a token service down for a while): the
/// chain is not voided but built when the outcome is delivered, and that delivery fails and
/// is tried again until it can be built. Never lost, never applied twice, never half.
struct FollowUpPluginFailureTests {
    static func project(parentHooks: Bool) throws -> Project {
        let parent = definition(
            "order",
            top: """
                then:
                  on_success:
                    - key: receipt
                      id: "r-{{ entry.id }}"
                      vars: { n: 1 }
                    - key: plain
                      id: "p-{{ entry.id }}"
                      vars: { url: "{{ vars.url }}", tag: "t" }
                """, hooks: parentHooks)
        // The plugin answers once the file `plugin-up` exists.
        let receipt = "key: receipt\nrequest_command: plugins/receipt.sh\non_success: hooks/record.sh\n"
        let p = try Project(definitions: ["order": parent, "receipt": receipt, "plain": definition("plain")])
        try p.write(
            "plugins/receipt.sh",
            "#!/bin/sh\ncat >/dev/null\n[ -f plugin-up ] || { echo 'token service down' >&2; exit 3; }\necho '{\"url\": \"\(p.url("/status/201"))\", \"data\": {}}'\n",
            mode: 0o755)
        return p
    }

    @Test(arguments: [true, false])
    func aFollowUpWhosePluginFailsIsBuiltWhenItAnswers(parentHooks: Bool) async throws {
        let p = try Self.project(parentHooks: parentHooks)
        try await p.enqueue("order", path: "/status/200", id: "o1")
        // A horizon of 0: the drain tries the delivery once and does not wait for the next try.
        let first = try await p.drain(["--horizon", "0s"], failures: 4)
        #expect(
            first.stderr.contains("the follow-ups of o1 wait for its delivery: request_command exited 3: token service down"),
            "\(first.stderr)")
        #expect(p.server.requests.map(\.path) == ["/status/200"], "neither follow-up was enqueued")
        #expect(p.deliveries("o1").isEmpty, "the hook waits for the chain")
        // `explain` says why, not that a hook is awaited.
        let explain = try await p.outbox(["explain", "o1"])
        #expect(explain.stdout.contains("its outcome is not delivered yet (0 hook runs): "), "\(explain.stdout)")
        #expect(explain.stdout.contains("token service down"), "\(explain.stdout)")
        let show = try #require(try await p.show("o1"))
        #expect(show.at("outcomes.0.acknowledged") == .bool(false))
        #expect(show.at("outcomes.0.deliveries") == .int(0), "no hook ran")
        #expect(show.at("outcomes.0.follow_up_errors.0.index") == .null)
        #expect(show.string("outcomes.0.follow_up_errors.0.message")?.contains("token service down") == true)
        #expect(try await p.list().map { $0.string("id") } == ["o1"])
        // The chain waited; no hook failed.
        #expect(first.stderr.contains("0 delivered (1 failed delivery)"), "\(first.stderr)")
        let samples = MetricsTests.samples(try await p.outbox(["stats", "--prometheus"]).stdout)
        #expect(samples[#"outbox_hook_failures_total{key="order"}"#] == nil, "\(samples)")

        try p.write("plugin-up", "")
        // The next try is due within the drain's horizon: it waits for it.
        try await p.drain(failures: 0)
        #expect(p.server.requests.map(\.path).sorted() == ["/status/200", "/status/200", "/status/201"], "o1, then each follow-up once")
        #expect(p.deliveries("r-o1").count == 1)
        #expect(p.deliveries("p-o1").count == 1, "and the other one of the chain")
        if parentHooks {
            let delivered = p.deliveries("o1")
            #expect(delivered.count == 1)
            #expect(delivered.first?.at("stdin.follow_up_errors") == nil, "the hook is told of no error")
        }
        #expect(try await p.list().isEmpty)
    }
}

/// What a `then` item renders is held to the types its fields take: an id or a delay of
/// another type is refused (it was dropped: a new id, no hold), and a key whose definition
/// has errors waits for its fix.
struct FollowUpFieldTests {
    @Test(arguments: [
        (#"id: "{{ vars.tag }}""#, "42", "then.id must give a string, not 42"),
        (#"delay: "{{ vars.tag }}""#, "3600", "then.delay: bad duration \"3600\" (a unit is required"),
        (#"delay: "{{ vars.tag }}""#, "true", "then.delay must give a duration such as \"5m\", not true"),
        (#"id: "{{ vars.tag }}""#, "true", "then.id must give a string, not true"),
    ])
    func aRenderedFieldOfAnotherTypeIsRefused(_ field: String, _ tag: String, _ message: String) async throws {
        let parent = definition(
            "order", top: "then:\n  on_success:\n    - key: receipt\n      \(field)\n      vars: { url: \"{{ vars.url }}\", tag: t }")
        let p = try Project(definitions: ["order": parent, "receipt": definition("receipt")])
        let vars = #"{"url": "\#(p.url("/status/200"))", "tag": \#(tag)}"#
        #expect(try await p.outbox(["enqueue", "order", "--id", "o1", "--vars", vars]).exitCode == 0)
        let run = try await p.drain()
        #expect(run.stderr.contains("the follow-ups of o1 were not enqueued"), "\(run.stderr)")
        let errors = try #require(p.deliveries("o1").first?.at("stdin.follow_up_errors")?.arrayValue)
        #expect(errors.first?["message"]?.stringValue?.hasPrefix(message) == true, "\(errors)")
        #expect(try await p.list().isEmpty, "no follow-up, sent at once or otherwise")
    }

    /// A bare 0 is a duration wherever one is written: `check` takes `delay: 0`, and so does
    /// the settle (it lost the chain at every settle).
    @Test func aThenDelayOfZeroEnqueuesTheFollowUpAtOnce() async throws {
        let parent = definition(
            "order",
            top:
                "then:\n  on_success:\n    - key: receipt\n      id: \"r-{{ entry.id }}\"\n      delay: 0\n      vars: { url: \"{{ vars.url }}\", tag: t }"
        )
        let p = try Project(definitions: ["order": parent, "receipt": definition("receipt")])
        #expect(try await p.outbox(["check"]).exitCode == 0)
        try await p.enqueue("order", path: "/status/200", id: "o1")
        let run = try await p.drain(failures: 0)
        #expect(p.deliveries("r-o1").map { $0.string("stdin.outcome") } == ["completed"], "\(run.stderr)")
        #expect(try await p.list().isEmpty)
    }

    /// A follow-up to a definition with errors waits for the fix, as an outcome of such a key
    /// does: the chain is built when the parent's outcome is delivered, never dropped.
    @Test(arguments: [true, false])
    func aFollowUpToADefinitionWithErrorsWaitsForItsFix(parentHooks: Bool) async throws {
        let parent = definition(
            "order",
            top: "then:\n  on_success:\n    - key: broken\n      id: \"b-{{ entry.id }}\"\n      vars: { url: \"{{ vars.url }}\", tag: t }",
            hooks: parentHooks)
        let p = try Project(definitions: ["order": parent, "broken": "key: broken\nrequest:\n  url: 5\n  method: [x]\n"])
        try await p.enqueue("order", path: "/status/200", id: "o1")
        // A horizon of 0: the drain tries the delivery once and does not wait for the next try.
        let first = try await p.drain(["--horizon", "0s", "--json"], failures: 4)
        #expect(
            first.stderr.contains("the follow-ups of o1 wait for its delivery: the definition of \"broken\" has errors ("),
            "\(first.stderr)")
        // Named with the chains not applied, not as a hook that failed (none ran).
        #expect(first.json?.at("failed")?["follow_up_failures"] == .array([.string("o1")]), "\(first.stdout)")
        #expect(first.json?.at("failed")?["hook_failures"] == .array([]), "\(first.stdout)")
        #expect(p.deliveries("o1").isEmpty, "the hook waits for the chain")
        // `explain` says why, not that a hook is awaited.
        let explain = try await p.outbox(["explain", "o1"])
        #expect(explain.stdout.contains("its outcome is not delivered yet (0 hook runs): "), "\(explain.stdout)")
        #expect(explain.stdout.contains("has errors"), "\(explain.stdout)")
        let show = try #require(try await p.show("o1"))
        #expect(show.at("outcomes.0.acknowledged") == .bool(false))
        #expect(show.string("outcomes.0.follow_up_errors.0.message")?.contains("broken.yaml:") == true, "\(show)")

        try p.define("broken", definition("broken"))
        try await p.drain(failures: 0)
        #expect(p.server.requests.map(\.path) == ["/status/200", "/status/200"], "o1, then its follow-up once")
        #expect(p.deliveries("b-o1").count == 1)
        if parentHooks {
            let delivered = p.deliveries("o1")
            #expect(delivered.count == 1)
            #expect(delivered.first?.at("stdin.follow_up_errors") == nil, "the hook is told of no error")
        }
        #expect(try await p.list().isEmpty)
    }

    /// A var a follow-up renders from `env` is a secret in that follow-up, and so is a header
    /// its own definition fills with it: `show` and `list --json` redact both.
    @Test func aFollowUpsVarsFromTheEnvironmentAreRedacted() async throws {
        let parent = definition(
            "login",
            top: """
                then:
                  on_success:
                    - key: call
                      id: "call-{{ entry.id }}"
                      delay: 1h
                      vars: { url: "{{ vars.url }}", tag: t, api_key: "{{ env.API_KEY }}", plain: "not-a-secret" }
                """)
        let call = definition("call", request: #"headers: { X-Api-Key: "{{ vars.api_key }}" }"#)
        let p = try Project(definitions: ["login": parent, "call": call])
        try await p.enqueue("login", path: "/status/200", id: "L1")
        let run = try await p.outbox(["run", "--drain"], environment: ["API_KEY": "topsecret-KEY-777"])
        #expect(run.exitCode == 0, "\(run.description)")
        for text in try await expectRedacted(p, id: "call-L1", secret: "topsecret-KEY-777", header: "x-api-key") {
            #expect(text.contains("not-a-secret"), "only that var is redacted: \(text)")
        }
    }
}

/// `show ID --json` and `list --json` name the entry and never print `secret`; `show` gives
/// `header` as redacted. Returns both texts.
@discardableResult
func expectRedacted(
    _ p: Project, id: String, secret: String, header: String, sourceLocation: SourceLocation = #_sourceLocation
) async throws -> [String] {
    let show = try await p.outbox(["show", id, "--json"])
    let list = try await p.outbox(["list", "--json"])
    for (name, text) in [("show", show.stdout), ("list", list.stdout)] {
        #expect(text.contains(id) && !text.contains(secret), "\(name): \(text)", sourceLocation: sourceLocation)
    }
    #expect(show.json?["request"]?["headers"]?[header] == .string("[redacted]"), "\(show.stdout)", sourceLocation: sourceLocation)
    return [show.stdout, list.stdout]
}

/// A secret var stays one down a chain: the follow-up of a follow-up that passes it on.
struct FollowUpSecretChainTests {
    @Test func aSecretVarPassedOnIsRedactedInTheNextGeneration() async throws {
        let a = definition(
            "a",
            top: """
                then:
                  on_success:
                    - { key: b, id: "b-{{ entry.id }}", vars: { url: "{{ vars.url }}", tag: t, tok: "{{ env.MYTOK }}" } }
                """)
        let b = definition(
            "b",
            top: """
                then:
                  on_success:
                    - { key: c, id: "c-{{ entry.id }}", delay: 1h, vars: { url: "{{ vars.url }}", tag: t, t2: "{{ vars.tok }}", all: "{{ vars }}" } }
                """)
        let c = definition("c", request: #"headers: { X-T2: "{{ vars.t2 }}" }"#)
        let p = try Project(definitions: ["a": a, "b": b, "c": c])
        try await p.enqueue("a", path: "/status/200", id: "a1")
        let run = try await p.outbox(["run", "--drain"], environment: ["MYTOK": "TOPSECRET77"])
        #expect(run.exitCode == 0, "\(run.description)")
        try await expectRedacted(p, id: "c-b-a1", secret: "TOPSECRET77", header: "x-t2")
    }
}

/// A follow-up may nest its vars as deep as the runner lets it (512 levels: the object and
/// 511 lists around a number here): `list --json` reads such a row back (it checked vars to
/// input's depth and called the row damaged).
struct FollowUpDeepVarsTests {
    @Test func aFollowUpAtTheDepthLimitIsListed() async throws {
        let wrap = definition(
            "wrap",
            top: """
                then:
                  on_success:
                    - { key: later, delay: 1h, vars: { url: "{{ vars.url }}", tag: t, deep: ["{{ vars.deep }}"] } }
                """)
        let p = try Project(definitions: ["wrap": wrap, "later": definition("later")])
        let deep = String(repeating: "[", count: 510) + "0" + String(repeating: "]", count: 510)
        let vars = #"{"url": "\#(p.url("/status/200"))", "tag": "t", "deep": \#(deep)}"#
        #expect(try await p.outbox(["enqueue", "wrap", "--vars", vars, "--id", "w0"]).exitCode == 0)
        try await p.drain()
        let list = try await p.outbox(["list", "--json"])
        #expect(list.exitCode == 0, "\(list.description.prefix(600))")
        #expect(list.stdout.hasPrefix("[{\"id\":"), "\(list.stdout.prefix(200))")
    }
}

/// A chain whose follow-up wraps the vars before it nests deeper each generation: once that
/// passes what input may nest, the follow-up is refused (the store could not read it back
/// some generations later, and every run would stop there).
struct FollowUpDepthTests {
    @Test func aFollowUpNestingPastTheInputLimitIsRefused() async throws {
        let chain = definition(
            "chain",
            top: """
                then:
                  on_success:
                    - key: chain
                      vars: { url: "{{ vars.url }}", tag: "t", deep: ["{{ vars.deep }}"] }
                """)
        let p = try Project(definitions: ["chain": chain])
        // The vars nest 511 levels (the object, then 510 lists): one follow-up fits, the next does not.
        let deep = String(repeating: "[", count: 510) + String(repeating: "]", count: 510)
        let vars = #"{"url": "\#(p.url("/status/200"))", "tag": "t", "deep": \#(deep)}"#
        let enqueued = try await p.outbox(["enqueue", "chain", "--vars", vars, "--id", "c0"])
        #expect(enqueued.exitCode == 0, "\(enqueued.description)")
        // The refused chain is the drain's failure (exit bit 4).
        let run = try await p.drain(failures: 4)
        #expect(p.server.requests.count == 2, "c0 and its one follow-up")
        // The hook log's lines nest too deep to parse here: they are read as text.
        let log = (p.read("hooks/log.jsonl") ?? "").split(separator: "\n")
        #expect(log.count == 2)
        // The follow-up's line: on a busy machine its hook may run before c0's, so not always the last.
        let refused = log.filter {
            $0.contains(#""follow_up_errors":[{"index":0,"key":"chain","message":"vars nest deeper than 512 levels""#)
        }
        #expect(refused.count == 1, "\(log.map { $0.prefix(200) })")
        #expect(run.stderr.contains("the follow-ups of"), "\(run.stderr)")
        #expect(try await p.list().isEmpty)
    }
}

/// Every outcome is delivered: enqueueing an id again never acknowledges the outcome its
/// older generation still owes (acknowledgements are per id and generation).
struct GenerationDeliveryTests {
    @Test func aScopeCancelledEntryEnqueuedAgainStillGetsItsOnError() async throws {
        let scoped = definition(
            "step",
            top: """
                scope: "job-{{ vars.job }}"
                on_rejected: cancel-scope
                """)
        let p = try Project(definitions: ["step": scoped])
        for (id, path) in [("s1", "/status/422"), ("s2", "/status/200")] {
            let vars = JSON.object([("url", .string(p.url(path))), ("tag", .string(id)), ("job", .string("j1"))]).serialized()
            #expect(try await p.outbox(["enqueue", "step", "--vars", vars, "--id", id]).exitCode == 0)
        }
        // The first run's hook fails: s2's scope-cancel outcome is still owed when s2 is enqueued again.
        _ = try p.write("hooks/fail", "")
        // A horizon of 0: the drain delivers once and does not wait for the redelivery.
        try await p.drain(["--horizon", "0s"])
        let failed = p.deliveries("s2").count
        #expect(failed >= 1)
        #expect(Set(p.deliveries("s2").map { $0.string("stdin.error.kind") }) == ["cancelled"])
        let again = JSON.object([("url", .string(p.url("/status/200?again"))), ("tag", .string("again")), ("job", .string("j2"))])
            .serialized()
        #expect(try await p.outbox(["enqueue", "step", "--vars", again, "--id", "s2"]).exitCode == 0)
        p.remove("hooks/fail")
        try await p.drain()
        let log = p.deliveries("s2").dropFirst(failed)
        // Delivered again (first generation, on_error), then the new generation's own outcome.
        #expect(log.map { $0.string("env.outcome") ?? "" } == ["error", "completed"], "\(log)")
        #expect(log.map { $0.at("stdin.meta.generation")?.int64Value ?? 0 } == [1, 2])
        #expect(p.server.requests(path: "/status/200").map(\.path) == ["/status/200?again"])
    }
}

/// A hook's stdout is read up to 1 MiB for its enqueue lines; past that the delivery fails
/// (and is made again) rather than losing the lines it could not read.
struct HookOutputCapTests {
    @Test func aHookThatPrintsPastTheCapFailsItsDelivery() async throws {
        // The first delivery prints 2 MiB before an enqueue line; the second prints the line alone.
        let hook = #"""
            #!/bin/sh
            cat > /dev/null
            printf '%s\n' "$OUTBOX_DELIVERIES" >> hooks/deliveries.log
            if [ "$OUTBOX_DELIVERIES" = 1 ]; then head -c 2097152 /dev/zero | tr '\0' 'x'; echo; fi
            printf '{"enqueue": {"key": "c", "id": "child", "vars": {"url": "%s", "tag": "c"}}}\n' "$CHILD_URL"
            exit 0

            """#
        let p = try Project(
            definitions: [
                "t": definition("t", top: "on_success: hooks/big.sh", hooks: false),
                "c": definition("c", hooks: false),
            ],
            hooks: ["big.sh": hook])
        p.environment["CHILD_URL"] = p.url("/status/200?child")
        try await p.enqueue("t", path: "/status/200", id: "parent")
        // The redelivery must come in this run, however late the first delivery failed.
        let run = try await p.drain(["--horizon", "1h"])
        #expect(run.stderr.contains("the hook printed more than 1 MiB on stdout"), "\(run.stderr)")
        let log = try String(contentsOfFile: p.root + "/hooks/deliveries.log", encoding: .utf8)
        // Delivered again after the failure; the child is enqueued once, by the delivery that was read whole.
        #expect(log == "1\n2\n", "\(log)")
        #expect(p.server.requests(path: "/status/200").map(\.path).filter { $0.hasSuffix("child") }.count == 1)
    }
}

/// A referenced file rewritten while it was being sent is checked again after the last
/// byte: the entry settles error, kind `file`, not `completed` with mixed bytes.
/// Without a hook the completed entry would be forgotten at once: the check still runs.
struct ReferenceRewrittenTests {
    @Test(arguments: [true, false])
    func aFileRewrittenDuringItsUploadSettlesErrorFile(hooks: Bool) async throws {
        var definition = fileDefinition("f", ownership: "reference")
        if !hooks { definition = definition.split(separator: "\n").filter { !$0.hasPrefix("on_") }.joined(separator: "\n") + "\n" }
        let p = try Project(definitions: ["f": definition])
        defer { p.server.release("up") }
        let path = p.base + "/ref.bin"
        try Data(String(repeating: "r", count: 10_000).utf8).write(to: URL(fileURLWithPath: path))
        let vars = JSON.object([("url", .string(p.url("/hold/up/status/200"))), ("path", .string(path))]).serialized()
        #expect(try await p.outbox(["enqueue", "f", "--vars", vars, "--id", "ref"]).exitCode == 0)
        let runner = try p.start(["run", "--drain"])
        // The server has read the whole body and holds its answer: then the file changes.
        #expect(await p.server.waitForHeld("up"))
        try Data(String(repeating: "R", count: 10_001).utf8).write(to: URL(fileURLWithPath: path))
        p.server.release("up")
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 1, "\(finished.description)")
        let row = try #require(try await p.show("ref"))
        #expect(row.string("state") == "error")
        #expect(row.string("reason") == "file")
        // `show` says why, with or without a hook to tell.
        #expect(row.at("outcomes.0.error.kind") == .string("file"), "\(row)")
        #expect(row.at("outcomes.0.error.message")?.stringValue?.contains("while it was being sent") == true, "\(row)")
        #expect(row.at("outcomes.0.error.body") == nil, "no response body: it may echo a credential")
        guard hooks else { return }
        let hook = try #require(p.deliveries("ref").first)
        #expect(hook.string("stdin.outcome") == "error")
        #expect(hook.string("stdin.error.kind") == "file")
        #expect(hook.string("stdin.error.message")?.contains("while it was being sent") == true)
    }

    /// The check after the last byte asks whether the bytes sent are the ones enqueued: the
    /// file read from is checked, not its path. A file renamed over the path, or the path
    /// removed, once every byte was read leaves what was sent whole: the entry completes.
    @Test(arguments: [(true, "rename"), (false, "rename"), (true, "unlink"), (false, "unlink")])
    func aFileReplacedAfterItsBytesWereReadStillCompletes(hooks: Bool, change: String) async throws {
        var definition = fileDefinition("f", ownership: "reference")
        if !hooks { definition = definition.split(separator: "\n").filter { !$0.hasPrefix("on_") }.joined(separator: "\n") + "\n" }
        let p = try Project(definitions: ["f": definition])
        defer { p.server.release("up") }
        let path = p.base + "/ref.bin"
        let original = Data(String(repeating: "r", count: 10_000).utf8)
        try original.write(to: URL(fileURLWithPath: path))
        let vars = JSON.object([("url", .string(p.url("/hold/up/status/200"))), ("path", .string(path))]).serialized()
        #expect(try await p.outbox(["enqueue", "f", "--vars", vars, "--id", "ref"]).exitCode == 0)
        let runner = try p.start(["run", "--drain"])
        #expect(await p.server.waitForHeld("up"))
        if change == "rename" {
            try Data(String(repeating: "R", count: 10_001).utf8).write(to: URL(fileURLWithPath: path), options: .atomic)
        } else {
            #expect(unlink(path) == 0)
        }
        p.server.release("up")
        let finished = await runner.wait(timeout: 60)
        #expect(finished.exitCode == 0, "\(finished.description)")
        let sent = try #require(p.server.requests(path: "/hold/up/status/200").first)
        #expect(sent.body == [UInt8](original))
        // Completed and acknowledged (or with nothing to deliver): forgotten.
        #expect(try await p.show("ref") == nil)
        if hooks { #expect(p.deliveries("ref").first?.string("stdin.outcome") == "completed") }
    }
}
