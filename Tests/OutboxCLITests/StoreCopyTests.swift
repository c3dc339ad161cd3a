import Foundation
import Glibc
import OutboxModel
import Testing
import TestSupport

/// `outbox store copy`: a stopped SQLite store into an empty PostgreSQL schema and back,
/// checked by what `list --json` and `show --json` print on each side.
struct StoreCopyTests {
    static func project(config: String = "") throws -> TestProject {
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
                "refused": """
                key: refused
                request:
                  url: "{{ env.SERVER | raw }}/status/422"
                  data:
                    n: 1
                on_error: hooks/fail.sh
                """,
                "upload": """
                key: upload
                request:
                  method: PUT
                  url: "{{ env.SERVER | raw }}/files/{{ vars.name }}"
                  file: "{{ vars.path }}"
                """,
            ])
        try p.writeHook("fail.sh", "#!/bin/sh\nexit 1\n")
        p.environment["SERVER"] = p.server.baseURL
        return p
    }

    /// Every row of `list --json` and the `show --json` of each, as one text.
    static func snapshot(_ p: TestProject, store: String? = nil) async throws -> String {
        let environment = store.map { ["OUTBOX_STORE": $0] } ?? [:]
        let list = try await p.outbox(["list", "--json"], environment: environment)
        #expect(list.exitCode == 0, "\(list)")
        var text = list.stdout
        for row in try JSON.parse(list.stdout).arrayValue ?? [] {
            guard let id = row["id"]?.stringValue else { continue }
            let show = try await p.outbox(["show", id, "--json"], environment: environment)
            #expect(show.exitCode == 0, "\(show)")
            text += show.stdout
        }
        return text
    }

    @Test func aStoreIsCopiedToPostgresAndBack() async throws {
        let p = try Self.project()
        let cluster = try PostgresCluster.shared()
        let url = cluster.url(schema: PostgresCluster.uniqueSchema("copy"))
        try p.write("doc.bin", String(repeating: "d", count: 70_000))
        for (args, id) in [
            (["note", "--vars", #"{"n": 1}"#], "sent"), (["note", "--vars", #"{"n": 2}"#, "--delay", "1h"], "later"),
            (["refused"], "bad"), (["upload", "--vars", #"{"name": "doc", "path": "doc.bin"}"#], "file"),
        ] {
            let r = try await p.outbox(["enqueue"] + args + ["--id", id])
            #expect(r.exitCode == 0, "\(r)")
        }
        #expect(try await p.outbox(["pause", "--key", "upload"]).exitCode == 0)
        // The refused entry settles error and its hook fails: its outcome stays owed.
        let drain = try await p.outbox(["run", "--drain"])
        #expect(drain.exitCode == 5, "\(drain)")
        let sqlite = try await Self.snapshot(p)
        #expect(sqlite.contains("\"later\"") && sqlite.contains("\"bad\"") && sqlite.contains("\"file\""))

        let copy = try await p.outbox(["store", "copy", "--to", url, "--json"])
        #expect(copy.exitCode == 0, "\(copy)")
        #expect(try JSON.parse(copy.stdout)["entries"] == .int64(3))
        #expect(try await Self.snapshot(p, store: url) == sqlite)
        #expect(try await p.outbox(["audit"], environment: ["OUTBOX_STORE": url]).exitCode == 0)

        // A schema that holds entries is not a target: refused, and left as it was.
        let again = try await p.outbox(["store", "copy", "--to", url])
        #expect(again.exitCode == 65, "\(again)")
        #expect(again.stderr.contains("is not empty (3 entries)"))
        #expect(again.stderr.contains("postgres://outbox:***@"))
        #expect(try await Self.snapshot(p, store: url) == sqlite)

        // Back into a new SQLite store in another folder: the staged file is copied along.
        let back = try await p.outbox(["store", "copy", "--to", "copied"], environment: ["OUTBOX_STORE": url])
        #expect(back.exitCode == 0, "\(back)")
        #expect(try await Self.snapshot(p, store: "copied") == sqlite)
        #expect((try FileManager.default.contentsOfDirectory(atPath: p.path("copied/bodies"))).count == 1)
        #expect(try await p.outbox(["audit"], environment: ["OUTBOX_STORE": "copied"]).exitCode == 0)

        // The copy runs: resumed, the paused upload is sent from the copied store.
        #expect(try await p.outbox(["resume", "--key", "upload"], environment: ["OUTBOX_STORE": "copied"]).exitCode == 0)
        let run = try await p.outbox(["run", "--drain"], environment: ["OUTBOX_STORE": "copied"])
        #expect(run.exitCode == 4, "\(run)")
        #expect(p.server.requests(path: "/files/doc").map(\.bodySize) == [70_000])
    }

    // A copy killed after it staged files but before it committed leaves them in the target;
    // the next copy into that folder replaces them.
    @Test func aCopyIntoTheLeftoversOfAKilledCopyReplacesThem() async throws {
        let p = try Self.project()
        let body = String(repeating: "b", count: 70_000)
        try p.write("doc.bin", body)
        #expect(try await p.outbox(["enqueue", "upload", "--vars", #"{"name": "doc", "path": "doc.bin"}"#, "--id", "f"]).exitCode == 0)
        let staged = try #require(try FileManager.default.contentsOfDirectory(atPath: p.path(".outbox/bodies")).first)
        // An empty store made by a run, as a killed copy leaves its target.
        #expect(try await p.outbox(["run", "--drain"], environment: ["OUTBOX_STORE": "copied"]).exitCode == 0)
        try p.write("copied/bodies/" + staged, "half a copy")
        let copy = try await p.outbox(["store", "copy", "--to", "copied"])
        #expect(copy.exitCode == 0, "\(copy)")
        #expect(p.read("copied/bodies/" + staged) == body)
        #expect(try FileManager.default.contentsOfDirectory(atPath: p.path("copied/bodies")) == [staged])
        #expect(try await p.outbox(["audit"], environment: ["OUTBOX_STORE": "copied"]).exitCode == 0)
    }

    // A copy that fails (the source changed while it was copied) leaves a target folder as it
    // found it: one it made goes with the parents it made, an empty one that was there stays,
    // empty, with its mode.
    @Test(arguments: ["made/deeper/copied", "existing"])
    func aFailedCopyLeavesTheTargetFolderAsItWas(_ target: String) async throws {
        let p = try Self.project()
        try p.write("doc.bin", String(repeating: "b", count: 70_000))
        #expect(try await p.outbox(["enqueue", "upload", "--vars", #"{"name": "doc", "path": "doc.bin"}"#, "--id", "f"]).exitCode == 0)
        if target == "existing" {
            try FileManager.default.createDirectory(atPath: p.path("existing"), withIntermediateDirectories: false)
            #expect(chmod(p.path("existing"), 0o750) == 0)
        }
        let go = p.path("go")
        let copy = try p.start(["store", "copy", "--to", target], environment: ["OUTBOX_FAULT_HOLD": "copy.before-commit:\(go)"])
        await eventually("the copy to reach its commit") { p.exists("go.reached") }
        #expect(p.exists(target + "/outbox.db"), "the target is made by then")
        #expect(try await p.outbox(["pause", "--key", "note"]).exitCode == 0)
        p.touch("go")
        let ended = await copy.wait(timeout: 120)
        #expect(ended.exitCode == 75, "\(ended)")
        #expect(ended.stderr.contains("the source changed while it was copied"), "\(ended.stderr)")
        if target == "existing" {
            #expect(try FileManager.default.contentsOfDirectory(atPath: p.path("existing")) == [])
            let mode = try FileManager.default.attributesOfItem(atPath: p.path("existing"))[.posixPermissions] as? Int
            #expect(mode == 0o750)
        } else {
            #expect(!p.exists("made"), "the folders the copy made are gone")
        }
        #expect(try await p.outbox(["list", "--json"]).stdout.contains("\"f\""))
    }

    // A staged body replaced by a link to a file outside the store is never read through it:
    // the copy is refused (74) naming the damage, and leaves nothing behind.
    @Test func aStagedBodyThatIsALinkIsNotCopied() async throws {
        let p = try Self.project()
        try p.write("doc.bin", String(repeating: "b", count: 70_000))
        #expect(try await p.outbox(["enqueue", "upload", "--vars", #"{"name": "doc", "path": "doc.bin"}"#, "--id", "f"]).exitCode == 0)
        let staged = try #require(try FileManager.default.contentsOfDirectory(atPath: p.path(".outbox/bodies")).first)
        try p.write("outside.txt", "outside")
        try FileManager.default.removeItem(atPath: p.path(".outbox/bodies/" + staged))
        try FileManager.default.createSymbolicLink(atPath: p.path(".outbox/bodies/" + staged), withDestinationPath: p.path("outside.txt"))
        let copy = try await p.outbox(["store", "copy", "--to", "copied"])
        #expect(copy.exitCode == 74, "\(copy)")
        #expect(copy.stderr.contains("is a symbolic link, not the file the store staged (see outbox audit)"), "\(copy.stderr)")
        #expect(!p.exists("copied"))
    }

    // While a runner holds the source, nothing is copied (exit 75).
    // A store that was used and emptied (settings and counters left, no entry) is not a
    // target either: the copy is refused whole, as one that holds entries is.
    @Test func aUsedStoreWithNoEntryLeftIsNotATarget() async throws {
        let p = try Self.project()
        try await p.outbox(["pause", "--key", "note"])
        let first = try await p.outbox(["store", "copy", "--to", "copy"])
        #expect(first.exitCode == 0, "\(first)")
        let again = try await p.outbox(["store", "copy", "--to", "copy"])
        #expect(again.exitCode == 65, "\(again)")
        #expect(again.stderr.contains("is not empty (it holds"), "\(again.stderr)")
    }

    @Test func aRunningStoreIsNotCopied() async throws {
        // The held request must outlive slow commands on a busy machine: no stall limit, and a long wait.
        let p = try Self.project(config: heldRequestConfig)
        let url = try PostgresCluster.shared().url(schema: PostgresCluster.uniqueSchema("copy"))
        try await p.outbox(["enqueue", "note", "--vars", #"{"n": 1}"#, "--id", "held"])
        p.server.script("/notes/1", [.hold("held")])
        let runner = try p.start(["run"])
        #expect(await p.server.waitForHeld("held", timeoutMs: 120_000))
        let copy = try await p.outbox(["store", "copy", "--to", url])
        #expect(copy.exitCode == 75, "\(copy)")
        // Refused before the target is made: a folder target is not created either.
        let folder = p.root + "/copy-target"
        let toFolder = try await p.outbox(["store", "copy", "--to", folder])
        #expect(toFolder.exitCode == 75, "\(toFolder)")
        #expect(!FileManager.default.fileExists(atPath: folder))
        _ = p.server.release("held")
        runner.signal(SIGTERM)
        #expect(await runner.wait().exitCode == 0)
        let empty = try await p.outbox(["list", "--json"], environment: ["OUTBOX_STORE": url])
        #expect(empty.stdout == "[]\n")
    }

    // A PostgreSQL schema with a runner on it is not copied either (exit 75), though runners share it.
    @Test func aRunningPostgresStoreIsNotCopied() async throws {
        // The held request must outlive a slow `store copy` on a busy machine: no stall limit.
        let p = try Self.project(config: heldRequestConfig)
        let url = try PostgresCluster.shared().url(schema: PostgresCluster.uniqueSchema("copy"))
        p.environment["OUTBOX_STORE"] = url
        try await p.outbox(["enqueue", "note", "--vars", #"{"n": 1}"#, "--id", "held"])
        p.server.script("/notes/1", [.hold("held")])
        let runner = try p.start(["run"])
        #expect(await p.server.waitForHeld("held", timeoutMs: 120_000))
        let copy = try await p.outbox(["store", "copy", "--to", "copied"])
        #expect(copy.exitCode == 75, "\(copy)")
        #expect(copy.stderr.contains("a runner holds the store"), "\(copy)")
        _ = p.server.release("held")
        runner.signal(SIGTERM)
        #expect(await runner.wait().exitCode == 0)
        #expect(p.server.requests(path: "/notes/1").count == 1)
    }
}
