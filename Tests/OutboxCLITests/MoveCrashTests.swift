import Foundation
import OutboxModel
import Testing
import TestSupport

/// A SIGKILL while user files move into the store (`enqueue --from` with `ownership: move`)
/// or back out (`cancel`) strands none of them: the next command finds the move journal and
/// every file ends at its source path or owned by a committed entry.
struct MoveCrashTests {
    static let count = 40

    static func project() throws -> (CLIProject, [String: String]) {
        let p = try CLIProject()
        _ = try p.write(
            "definitions/mv.yaml",
            """
            key: mv
            request: { method: PUT, url: "https://x.example/{{ vars.n }}", file: "{{ vars.path }}", ownership: move }
            """)
        var files: [String: String] = [:]
        var lines = ""
        for n in 1...count {
            let path = try p.write("data/f\(n).bin", "payload \(n)")
            files[path] = "payload \(n)"
            lines += #"{"vars": {"n": \#(n), "path": "data/f\#(n).bin"}, "id": "e\#(n)"}"# + "\n"
        }
        _ = try p.write("batch.jsonl", lines)
        return (p, files)
    }

    /// Every file is where it started, or the store owns it under a committed entry.
    static func expectNothingStranded(_ p: CLIProject, _ files: [String: String], sourceLocation: SourceLocation = #_sourceLocation) throws
    {
        let rows = try p.run("list", "--json").json().arrayValue ?? []
        let owned = Set(rows.compactMap { $0["id"]?.stringValue })
        for (path, text) in files {
            let n = Int(path.split(separator: "f").last?.split(separator: ".").first ?? "") ?? 0
            if owned.contains("e\(n)") { continue }
            #expect(p.read(String(path.dropFirst(p.root.count + 1))) == text, "\(path) is back", sourceLocation: sourceLocation)
        }
        let journals = (try? FileManager.default.contentsOfDirectory(atPath: p.storeFolder + "/moves")) ?? []
        #expect(journals.isEmpty, "no journal left: \(journals)", sourceLocation: sourceLocation)
        #expect(p.run("audit").status == 0, "audit clean", sourceLocation: sourceLocation)
    }

    /// Killed mid-batch, then the whole project moved: the journal names the old folder, and
    /// the next command (in the new place) still puts every file back, or, when its source
    /// folder moved with the project, keeps it in `.outbox/returned/`; none is removed.
    @Test(arguments: [false, true])
    func aKillDuringAMoveBatchThenAProjectMoveStrandsNoFile(_ sourcesInside: Bool) async throws {
        let p = try CLIProject()
        _ = try p.write(
            "definitions/mv.yaml",
            """
            key: mv
            request: { method: PUT, url: "https://x.example/{{ vars.n }}", file: "{{ vars.path }}", ownership: move }
            """)
        let sources = sourcesInside ? p.root + "/data" : p.base + "/src"
        try FileManager.default.createDirectory(atPath: sources, withIntermediateDirectories: true)
        var lines = ""
        for n in 1...Self.count {
            #expect(FileManager.default.createFile(atPath: "\(sources)/f\(n).bin", contents: Data("payload \(n)".utf8)))
            lines += #"{"vars": {"n": \#(n), "path": "\#(sources)/f\#(n).bin"}}"# + "\n"
        }
        _ = try p.write("batch.jsonl", lines)
        let killed = try await p.outbox(["enqueue", "mv", "--from", "batch.jsonl"], environment: ["OUTBOX_FAULT": "enqueue.moved:17"])
        #expect(killed.exitCode == -9, "\(killed)")
        let moved = p.base + "/moved"
        try FileManager.default.moveItem(atPath: p.root, toPath: moved)
        let list = p.run(["list", "--json"], cwd: moved)
        #expect(list.status == 0 && list.out == "[]\n", "\(list)")
        let returned = moved + "/.outbox/returned"
        let kept = (try? FileManager.default.contentsOfDirectory(atPath: returned)) ?? []
        let stillHere = (try? FileManager.default.contentsOfDirectory(atPath: sourcesInside ? moved + "/data" : sources)) ?? []
        // Every file, once: at its source (or where its folder moved), or kept.
        #expect(Set(kept + stillHere) == Set((1...Self.count).map { "f\($0).bin" }), "kept \(kept.sorted()) here \(stillHere.sorted())")
        #expect(kept.count + stillHere.count == Self.count)
        #expect(kept.count == (sourcesInside ? 17 : 0), "\(list.err)")
        for name in kept {
            let n = name.dropFirst().prefix { $0 != "." }
            #expect(FileManager.default.contents(atPath: returned + "/" + name) == Data("payload \(n)".utf8))
        }
        #expect(p.run(["audit"], cwd: moved).status == 0)
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: moved + "/.outbox/moves")) ?? []).isEmpty)
    }

    @Test(arguments: [1, 17, 40])
    func aKillDuringAMoveBatchStrandsNoFile(_ at: Int) async throws {
        let (p, files) = try Self.project()
        let killed = try await p.outbox(["enqueue", "mv", "--from", "batch.jsonl"], environment: ["OUTBOX_FAULT": "enqueue.moved:\(at)"])
        #expect(killed.exitCode == -9, "killed at move \(at): \(killed)")
        // Files were moved into the store and the batch never committed.
        #expect(files.keys.filter { !FileManager.default.fileExists(atPath: $0) }.count == at)
        try Self.expectNothingStranded(p, files)
        #expect(try p.run("list", "--json").json() == .array([]))
    }

    @Test func aKillAfterCancelCommitsStrandsNoFile() async throws {
        let (p, files) = try Self.project()
        // Each file gets back the mode it had, though the store keeps its files 0600.
        let modes = Dictionary(uniqueKeysWithValues: files.keys.enumerated().map { n, path in (path, n % 2 == 0 ? 0o644 : 0o604) })
        for (path, mode) in modes { try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: path) }
        let enqueued = try await p.outbox(["enqueue", "mv", "--from", "batch.jsonl"])
        #expect(enqueued.exitCode == 0, "\(enqueued)")
        #expect(files.keys.allSatisfy { !FileManager.default.fileExists(atPath: $0) }, "all moved in")
        let killed = try await p.outbox(["cancel", "--all"], environment: ["OUTBOX_FAULT": "cancel.committed"])
        #expect(killed.exitCode == -9, "\(killed)")
        // The entries are gone and no file is back yet: only the journal knows where they belong.
        #expect(files.keys.allSatisfy { !FileManager.default.fileExists(atPath: $0) })
        // What a copy back across filesystems leaves when it is killed: gone with its process.
        let first = p.path("data/f1.bin")
        let deadCopy = try p.write("data/f1.bin.outbox-return-2147483000", "part of a copy")
        let liveCopy = try p.write("data/f1.bin.outbox-return-\(getpid())", "a copy still being made")
        try Self.expectNothingStranded(p, files)
        #expect(files.keys.allSatisfy { FileManager.default.fileExists(atPath: $0) })
        for (path, mode) in modes {
            let now = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int
            #expect(now == mode, "\(path) is back with mode \(String(mode, radix: 8))")
        }
        #expect(!FileManager.default.fileExists(atPath: deadCopy), "the dead process's partial copy is removed")
        #expect(FileManager.default.fileExists(atPath: liveCopy), "a live process's copy is left alone")
        #expect(p.read("data/f1.bin") == files[first])
    }
}

extension MoveCrashTests {
    /// A cancel puts a file moved across filesystems back by a copy: killed once the copy is
    /// at the source path and the store's copy is not yet removed, the file has its mode and
    /// modification time already (it got them before it was renamed into place).
    @Test func aKillMidCopyBackAcrossFilesystemsLeavesTheModeAndTime() async throws {
        let p = try CLIProject()
        var here = stat(), shm = stat()
        guard stat(p.root, &here) == 0, stat("/dev/shm", &shm) == 0, here.st_dev != shm.st_dev else {
            Issue.record("no second filesystem at /dev/shm: the copy back across filesystems cannot be tested here")
            return
        }
        let store = "/dev/shm/outbox-test-\(UUID().uuidString.prefix(8))"
        defer { try? FileManager.default.removeItem(atPath: store) }
        _ = try p.write("config/outbox.yaml", "store: \(store)\n")
        _ = try p.write(
            "definitions/mv.yaml",
            """
            key: mv
            request: { method: PUT, url: "https://x.example/a", file: "{{ vars.path }}", ownership: move }
            """)
        let file = try p.write("data/a.bin", "the user's bytes")
        let mtime = Date(timeIntervalSince1970: 1_614_834_367)
        try FileManager.default.setAttributes([.posixPermissions: 0o640, .modificationDate: mtime], ofItemAtPath: file)
        #expect(try await p.outbox(["enqueue", "mv", "--id", "a", "--vars", #"{"path": "data/a.bin"}"#]).exitCode == 0)
        #expect(!FileManager.default.fileExists(atPath: file), "moved into the store")
        let killed = try await p.outbox(["cancel", "a"], environment: ["OUTBOX_FAULT": "return.copied"])
        #expect(killed.exitCode == -9, "\(killed)")
        for moment in ["killed", "after the next command"] {
            let attributes = try FileManager.default.attributesOfItem(atPath: file)
            #expect(attributes[.posixPermissions] as? Int == 0o640, "\(moment)")
            #expect(attributes[.modificationDate] as? Date == mtime, "\(moment)")
            #expect(p.read("data/a.bin") == "the user's bytes", "\(moment)")
            #expect(p.run("list", "--json").out == "[]\n")
        }
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: store + "/bodies")) ?? []).isEmpty, "the store's copy is gone")
        // The file at the source is the copy put back, not another file: nothing is kept twice.
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: store + "/returned")) ?? []).isEmpty, "no second copy kept")
    }
}

/// The move journal and the rows are the store's, but a hand (or a tool) may damage them:
/// outbox then keeps what may be a user's only copy and never touches a file outside the store.
struct DamagedJournalTests {
    static func movedIn(_ p: CLIProject) async throws -> (staged: String, bytes: String) {
        _ = try p.write(
            "definitions/mv.yaml",
            """
            key: mv
            request: { method: PUT, url: "https://x.example/a", file: "{{ vars.path }}", ownership: move }
            """)
        _ = try p.write("data/m.bin", "the only copy")
        #expect(try await p.outbox(["enqueue", "mv", "--id", "m", "--vars", #"{"path": "data/m.bin"}"#]).exitCode == 0)
        let staged = try #require(try FileManager.default.contentsOfDirectory(atPath: p.storeFolder + "/bodies").first)
        return (p.storeFolder + "/bodies/" + staged, "the only copy")
    }

    @Test func aJournalNamingAFileOutsideTheStoreLeavesItAlone() async throws {
        let p = try CLIProject()
        _ = try await Self.movedIn(p)
        let victim = try p.write("victim.txt", "precious")
        _ = try p.write(
            ".outbox/moves/99999-deadbeef.json",
            #"[{"staged": "\#(victim)", "source": "\#(p.root)/src.txt", "mode": 4095, "mtime_ns": 0, "size": 8, "inode": 1}]"#)
        let list = try await p.outbox(["list"])
        #expect(list.exitCode == 0, "\(list)")
        #expect(p.read("victim.txt") == "precious" && !FileManager.default.fileExists(atPath: p.root + "/src.txt"))
        #expect(list.stderr.contains("left \(victim) alone"), "\(list)")
    }

    @Test func anUnreadableJournalKeepsEveryStagedFile() async throws {
        let p = try CLIProject()
        let (staged, bytes) = try await Self.movedIn(p)
        // The row is lost and the journal cut short: nothing says the staged file is a moved one.
        _ = try p.sqlite("DELETE FROM entries")
        _ = try p.write(".outbox/moves/99998-cut.json", #"[{"staged": "#)
        let run = try await p.outbox(["run", "--drain"])
        #expect(run.exitCode == 0, "\(run)")
        #expect(run.stderr.contains("kept the move journal"), "\(run.stderr)")
        #expect(FileManager.default.contents(atPath: staged) == Data(bytes.utf8), "the staged file is kept")
        let audit = p.run("audit")
        #expect(audit.status == 74 && audit.out.contains("cannot be read: no staged file is removed"), "\(audit)")
    }

    /// Where the bodies were last seen is a setting: a damaged one (`/`) rewrote every row's path.
    @Test func aDamagedBodiesFolderSettingRewritesNoPath() async throws {
        let p = try CLIProject()
        let (staged, _) = try await Self.movedIn(p)
        _ = try p.sqlite("UPDATE settings SET value = '/' WHERE name = 'bodies_folder'")
        #expect(try await p.outbox(["list"]).exitCode == 0)
        #expect(try p.sqlite("SELECT body_file FROM entries") == staged + "\n")
    }

    /// Killed once the file was moved in, before the commit; then a new file is written at
    /// its path: the staged one is the original, kept, not removed as a copy.
    @Test func aNewFileAtTheSourcePathNeverCostsTheMovedOne() async throws {
        let p = try CLIProject()
        _ = try p.write(
            "definitions/mv.yaml",
            """
            key: mv
            request: { method: PUT, url: "https://x.example/a", file: "{{ vars.path }}", ownership: move }
            """)
        _ = try p.write("data/m.bin", "the original")
        let killed = try await p.outbox(
            ["enqueue", "mv", "--id", "m", "--vars", #"{"path": "data/m.bin"}"#], environment: ["OUTBOX_FAULT": "enqueue.moved"])
        #expect(killed.exitCode == -9, "\(killed)")
        _ = try p.write("data/m.bin", "a new file at the same path")
        let list = try await p.outbox(["list", "--json"])
        #expect(list.exitCode == 0 && list.stdout == "[]\n", "\(list)")
        #expect(p.read("data/m.bin") == "a new file at the same path")
        let kept = (try? FileManager.default.contentsOfDirectory(atPath: p.storeFolder + "/returned")) ?? []
        #expect(kept.count == 1 && p.read(".outbox/returned/" + (kept.first ?? "")) == "the original", "\(kept) \(list.stderr)")
    }

    /// `audit` reads the settings every command reads: a damaged one is a problem it names.
    @Test func auditNamesADamagedSetting() async throws {
        let p = try CLIProject()
        _ = try await Self.movedIn(p)
        _ = try p.sqlite("INSERT OR REPLACE INTO settings VALUES ('header_generation', '-1')")
        let audit = try await p.outbox(["audit"])
        #expect(audit.exitCode == 74 && audit.stdout.contains("the header generation \"-1\" is not a count"), "\(audit)")
    }

    @Test func aCancelledDamagedEntryKeepsItsStagedFileInReturned() async throws {
        let p = try CLIProject()
        let (staged, bytes) = try await Self.movedIn(p)
        _ = try p.sqlite("UPDATE entries SET body_file = '' WHERE id = 'm'")
        #expect(p.run("cancel", "m").status == 0)
        let run = try await p.outbox(["run", "--drain"])
        #expect(run.exitCode == 0, "\(run)")
        let kept = p.storeFolder + "/returned/" + (staged as NSString).lastPathComponent
        #expect(FileManager.default.contents(atPath: kept) == Data(bytes.utf8), "kept under returned/")
    }
}

/// A copy staged by an enqueue that was killed before its commit is an orphan: `audit`
/// reports it, `audit --fix` and the next runner remove it, never the files of an enqueue
/// still staging.
struct OrphanTests {
    /// A project whose `cp` definition copies data/big.bin in, and an enqueue of it killed
    /// once the copy was staged: one staged file no entry owns.
    static func projectWithAnOrphan() async throws -> CLIProject {
        let p = try CLIProject()
        _ = try p.write(
            "definitions/cp.yaml",
            """
            key: cp
            request: { method: PUT, url: "https://x.example/a", file: "{{ vars.path }}", ownership: copy }
            """)
        _ = try p.write("data/big.bin", String(repeating: "x", count: 100_000))
        let killed = try await p.outbox(
            ["enqueue", "cp", "--vars", #"{"path": "data/big.bin"}"#], environment: ["OUTBOX_FAULT": "enqueue.staged"])
        #expect(killed.exitCode == -9, "\(killed)")
        return p
    }

    /// A file's lines are written a batch at a time in one transaction: killed after its
    /// second batch is written (two large bodies of it staged to files while the transaction
    /// is open), the enqueue leaves no entry, and only orphan files that audit removes.
    @Test func anEnqueueKilledBetweenItsBatchesLeavesNoEntry() async throws {
        let p = try CLIProject()
        try p.write(
            "definitions/big.yaml",
            """
            key: big
            request: { method: PUT, url: "https://x.example/{{ vars.n }}", text: "{{ vars.t }}" }
            """)
        let large = String(repeating: "x", count: 70_000)
        let lines = (1...2_100).map { n in #"{"vars": {"n": \#(n), "t": "\#([1_030, 1_500].contains(n) ? large : "small")"}}"# }
        try p.write("lines.jsonl", lines.joined(separator: "\n") + "\n")
        try p.enqueue("plain", vars: "{}", id: "already")
        let rowsBefore = try p.sqlite("SELECT * FROM entries; SELECT * FROM outcomes;")
        let bodies = p.storeFolder + "/bodies"
        // Refused at a line of the third batch: the second batch's staged files go with the rollback.
        var refused = lines
        refused[2_089] = #"{"vars": {}}"#
        let path = try p.write("refused.jsonl", refused.joined(separator: "\n") + "\n")
        let r = p.run("enqueue", "big", "--from", "refused.jsonl")
        #expect(r.status == 65, "\(r)")
        #expect(r.err.hasPrefix("outbox: E_INVALID: \(path):2090: "), "\(r.err)")
        #expect(try p.sqlite("SELECT * FROM entries; SELECT * FROM outcomes;") == rowsBefore)
        #expect(try FileManager.default.contentsOfDirectory(atPath: bodies).isEmpty)
        let killed = try await p.outbox(
            ["enqueue", "big", "--from", "lines.jsonl"], environment: ["OUTBOX_FAULT": "enqueue.batch-written:2"])
        #expect(killed.exitCode == -9, "\(killed)")
        #expect(try p.sqlite("SELECT * FROM entries; SELECT * FROM outcomes;") == rowsBefore)
        #expect(try FileManager.default.contentsOfDirectory(atPath: bodies).count == 2, "the two large bodies are orphans")
        #expect(p.run("audit", "--fix").status == 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: bodies).isEmpty)
        let again = p.run("enqueue", "big", "--from", "lines.jsonl")
        #expect(again.status == 0, "\(again)")
        #expect(try p.rows().count == 2_101)
    }

    /// Lines whose entries copy files in are not written batch by batch: every copy is made
    /// before the transaction (so before the write lock, which other writers would wait for),
    /// and a kill after the write leaves every copy an orphan and no entry.
    @Test func copiesOfAFromFileAreMadeBeforeItsTransaction() async throws {
        let p = try CLIProject()
        var lines: [String] = []
        for n in 1...1_100 {
            try p.write("data/f\(n).bin", "file \(n)")
            lines.append(#"{"vars": {"path": "data/f\#(n).bin"}}"#)
        }
        try p.write("lines.jsonl", lines.joined(separator: "\n") + "\n")
        try p.enqueue("plain", vars: "{}", id: "already")
        let rowsBefore = try p.sqlite("SELECT * FROM entries; SELECT * FROM outcomes;")
        let killed = try await p.outbox(
            ["enqueue", "file.copy", "--from", "lines.jsonl"], environment: ["OUTBOX_FAULT": "enqueue.batch-written:1"])
        #expect(killed.exitCode == -9, "\(killed)")
        #expect(try p.sqlite("SELECT * FROM entries; SELECT * FROM outcomes;") == rowsBefore)
        #expect(try FileManager.default.contentsOfDirectory(atPath: p.storeFolder + "/bodies").count == 1_100)
        #expect(try String(contentsOfFile: p.root + "/data/f1100.bin", encoding: .utf8) == "file 1100")
    }

    @Test func anOrphanStagedByAKilledEnqueueIsCleaned() async throws {
        let p = try await Self.projectWithAnOrphan()
        let bodies = p.storeFolder + "/bodies"
        #expect(try FileManager.default.contentsOfDirectory(atPath: bodies).count == 1, "the staged copy is left")
        let audit = p.run("audit")
        #expect(audit.status == 74)
        #expect(audit.out.contains("orphan staged file"), "\(audit.out)")
        let fixed = p.run("audit", "--fix")
        #expect(fixed.status == 0, "\(fixed)")
        #expect(fixed.err.contains("removed \(bodies)/"), "\(fixed.err)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: bodies).isEmpty)
        // An entry's own body is never taken for an orphan.
        #expect(p.run("enqueue", "cp", "--vars", #"{"path": "data/big.bin"}"#).status == 0)
        #expect(p.run("audit", "--fix").status == 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: bodies).count == 1)
    }

    // An enqueue holds the staging lock shared from its first staged body to its commit:
    // while it does, a body not yet in the table is no orphan, and audit does not say so.
    @Test func auditLeavesTheFilesOfAnEnqueueStillStaging() async throws {
        let p = try await Self.projectWithAnOrphan()
        // This test stands for the enqueue still staging that file. Close-on-exec: an `outbox`
        // another test starts meanwhile would inherit the lock and hold it after the close.
        let fd = open(p.storeFolder + "/staging.lock", O_RDWR | O_CLOEXEC)
        #expect(fd >= 0 && flock(fd, LOCK_SH) == 0)
        let during = p.run("audit")
        #expect(during.status == 0, "\(during)")
        #expect(during.err.contains("is staging bodies now"), "\(during.err)")
        #expect(!during.out.contains("orphan"), "\(during.out)")
        close(fd)
        let after = p.runOnceTheStagingLockIsFree(["audit"]) { !$0.stderr.contains(auditFoundTheStagingLockTaken) }
        #expect(after.status == 74, "\(after)")
        #expect(after.out.contains("orphan staged file"), "\(after.out)")
    }

    // The clean-up reads body files from their column and form files from the stored
    // request: a stray file beside both kinds is the only one removed, by `audit --fix`
    // and by a runner's start alike.
    @Test(arguments: [["audit", "--fix"], ["run", "--drain", "--max-time", "30s"]])
    func onlyTheStrayFileGoesBesideBodiesAndFormFiles(_ command: [String]) async throws {
        let p = try CLIProject()
        _ = try p.write(
            "definitions/cp.yaml",
            """
            key: cp
            request: { method: PUT, url: "http://127.0.0.1:9/a", file: "{{ vars.path }}", ownership: copy }
            """)
        _ = try p.write(
            "definitions/fm.yaml",
            """
            key: fm
            request:
              method: POST
              url: "http://127.0.0.1:9/f"
              form:
                - { name: photo, file: "{{ vars.path }}" }
            """)
        _ = try p.write("data/a.bin", String(repeating: "a", count: 5_000))
        _ = try p.write("data/b.bin", String(repeating: "b", count: 5_000))
        #expect(p.run("enqueue", "cp", "--vars", #"{"path": "data/a.bin"}"#, "--delay", "1h").status == 0)
        #expect(p.run("enqueue", "fm", "--vars", #"{"path": "data/b.bin"}"#, "--delay", "1h").status == 0)
        let bodies = p.storeFolder + "/bodies"
        let owned = Set(try FileManager.default.contentsOfDirectory(atPath: bodies))
        #expect(owned.count == 2, "\(owned)")
        let stray = bodies + "/stray-left-by-a-killed-enqueue"
        #expect(FileManager.default.createFile(atPath: stray, contents: Data("x".utf8)))
        let result = p.runOnceTheStagingLockIsFree(command) { _ in !FileManager.default.fileExists(atPath: stray) }
        #expect(result.status == 0, "\(result)")
        #expect(result.err.contains("removed \(stray)"), "\(result.err)")
        #expect(Set(try FileManager.default.contentsOfDirectory(atPath: bodies)) == owned)
        #expect(p.run("audit").status == 0)
    }
}
