import Foundation
import Testing
import TestSupport

// Batch migrations: `enqueue --from-dir DIR` and `enqueue --from FILE.jsonl`
// at scale, through the real `outbox` binary.

/// Builds folder trees for the tests.
enum DirTree {
    static func file(_ root: String, _ relative: String, _ text: String) throws {
        let path = root + "/" + relative
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        try text.write(toFile: path, atomically: false, encoding: .utf8)
    }

    static func rows(_ sandbox: OutboxSandbox) async throws -> [[String: Any]] {
        try await sandbox.list()
    }

    static func queued(_ sandbox: OutboxSandbox) async throws -> Int? {
        let stats = try await sandbox.outbox(["stats", "--json"]).jsonObject as? [String: Any]
        return (stats?["entries"] as? [String: Int])?["queued"]
    }
}

/// A whole-file PUT per file, to `/put/{{ vars.name }}` on `base`.
func migrateDefinition(_ base: String, ownership: String = "copy", extraHeaders: String = "") -> String {
    """
    key: migrate
    request:
      method: PUT
      url: "\(base)/put/{{ vars.name }}"
      file: "{{ vars.path }}"
      ownership: \(ownership)
      headers:
        X-Relative: "{{ vars.relative_path }}"
    \(extraHeaders)
    """
}

@Suite(.serialized) struct EnqueueDirectoryTests {
    @Test func oneEntryPerRegularFileWithItsVars() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("migrate", migrateDefinition("http://127.0.0.1:9"))
        let root = sandbox.path("tree")
        try DirTree.file(root, "b/two.txt", "22")
        try DirTree.file(root, "a/one.txt", "1")
        try DirTree.file(root, "a/.hidden/three.txt", "333")
        try DirTree.file(root, ".dotfile", "4444")
        try FileManager.default.createSymbolicLink(atPath: root + "/b/link.txt", withDestinationPath: "../a/one.txt")
        try FileManager.default.createSymbolicLink(atPath: root + "/linked-dir", withDestinationPath: root + "/a")
        #expect(mkfifo(root + "/pipe\u{1B}]0;x\u{07}\n", 0o600) == 0)

        let run = try await sandbox.outbox([
            "enqueue", "migrate", "--from-dir", "tree", "--vars", #"{"bucket": "archive", "name": "overridden"}"#, "--json",
        ])
        #expect(run.status == 0, "\(run.stderr)")
        let printed = try #require(run.jsonObject as? [[String: String]])
        // Byte order of relative paths; hidden files included; links and the FIFO skipped.
        #expect(printed.map { $0["path"] } == [".dotfile", "a/.hidden/three.txt", "a/one.txt", "b/two.txt"].map { root + "/" + $0 })
        #expect(printed.allSatisfy { ($0["id"]?.count ?? 0) == 36 })
        #expect(run.stderr.contains("skipped 2 symbolic link(s) and 1 special file(s)"))
        // A name is shown with its control characters escaped, on the one line.
        #expect(run.stderr.contains("pipe\\x1b]0;x\\x07\\x0a)"), "\(run.stderr)")

        let rows = try await DirTree.rows(sandbox)
        #expect(rows.map { $0["id"] as? String } == printed.map { $0["id"] })
        let vars = rows.compactMap { $0["vars"] as? [String: Any] }
        #expect(vars.map { $0["relative_path"] as? String } == [".dotfile", "a/.hidden/three.txt", "a/one.txt", "b/two.txt"])
        #expect(vars.map { $0["name"] as? String } == [".dotfile", "three.txt", "one.txt", "two.txt"])
        #expect(vars.map { $0["size"] as? Int } == [4, 3, 1, 2])
        #expect(vars.allSatisfy { $0["bucket"] as? String == "archive" })
        #expect(vars.map { $0["path"] as? String } == printed.map { $0["path"] })
    }

    @Test func idTemplateMakesARerunResumeInsteadOfDuplicating() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("migrate", migrateDefinition("http://127.0.0.1:9"))
        let root = sandbox.path("tree")
        for n in 1...5 { try DirTree.file(root, "d\(n % 2)/f\(n).txt", String(repeating: "x", count: n)) }
        let args = ["enqueue", "migrate", "--from-dir", root, "--id-template", "file-{{ vars.name }}"]
        let first = try await sandbox.outbox(args)
        #expect(first.status == 0, "\(first.stderr)")
        #expect(first.lines == ["file-f2.txt", "file-f4.txt", "file-f1.txt", "file-f3.txt", "file-f5.txt"])
        let second = try await sandbox.outbox(args)
        #expect(second.status == 0)
        #expect(second.lines == first.lines)
        #expect(try await DirTree.queued(sandbox) == 5)
    }

    @Test func idTemplateGivingOneIdTwiceIsRefused() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("migrate", migrateDefinition("http://127.0.0.1:9"))
        try DirTree.file(sandbox.path("tree"), "a/same.txt", "1")
        try DirTree.file(sandbox.path("tree"), "b/same.txt", "2")
        let run = try await sandbox.outbox(["enqueue", "migrate", "--from-dir", "tree", "--id-template", "{{ vars.name }}"])
        #expect(run.status == 65)
        #expect(run.stderr.contains(#"--id-template gives the id "same.txt" to a/same.txt too"#))
        #expect(try await DirTree.rows(sandbox).isEmpty)
    }

    /// One file that cannot be enqueued (a name that cannot go in a header) fails the whole
    /// folder: nothing is stored and, with ownership move, nothing leaves its place.
    @Test func oneBadFileFailsTheWholeFolder() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("migrate", migrateDefinition("http://127.0.0.1:9", ownership: "move", extraHeaders: ""))
        let root = sandbox.path("tree")
        for n in 1...20 { try DirTree.file(root, "ok\(n).txt", "fine") }
        try DirTree.file(root, "zz\nbad.txt", "bad name")
        let run = try await sandbox.outbox(["enqueue", "migrate", "--from-dir", "tree"])
        #expect(run.status == 65)
        #expect(run.stderr.contains(root + "/zz"))
        #expect(try await DirTree.rows(sandbox).isEmpty)
        #expect(try FileManager.default.contentsOfDirectory(atPath: root).count == 21)
        // Nothing staged: no store was made, or one with no staged body.
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: sandbox.path(".outbox/bodies"))) ?? []).isEmpty)
    }

    /// Files are rendered many at a time, half of them on a second thread: the entries keep
    /// the walk's order, and of two bad files the first is the one named.
    @Test func filesRenderedTogetherKeepTheirOrderAndTheFirstBadOneIsNamed() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("migrate", migrateDefinition("http://127.0.0.1:9"))
        let root = sandbox.path("tree")
        let names = (0..<300).map { String(format: "f%03d.txt", $0) }
        for name in names { try DirTree.file(root, name, "fine") }
        try DirTree.file(root, "f040\nbad.txt", "bad name")
        try DirTree.file(root, "f200\nbad.txt", "bad name")
        let bad = try await sandbox.outbox(["enqueue", "migrate", "--from-dir", "tree"])
        #expect(bad.status == 65)
        #expect(bad.stderr.contains(root + "/f040"), "\(bad.stderr)")
        #expect(!bad.stderr.contains("f200"), "\(bad.stderr)")
        #expect(try await DirTree.rows(sandbox).isEmpty)

        for name in ["f040\nbad.txt", "f200\nbad.txt"] { try FileManager.default.removeItem(atPath: root + "/" + name) }
        let good = try await sandbox.outbox(["enqueue", "migrate", "--from-dir", "tree"])
        #expect(good.status == 0, "\(good.stderr)")
        let rows = try await DirTree.rows(sandbox)
        #expect(rows.map { ($0["vars"] as? [String: Any])?["relative_path"] as? String } == names)
    }

    struct Refusal: CustomTestStringConvertible, Sendable {
        var name: String
        var arguments: [String]
        var status: Int32
        var message: String
        var testDescription: String { name }
    }

    @Test(arguments: [
        Refusal(name: "missing folder", arguments: ["--from-dir", "nowhere"], status: 66, message: "no such folder"),
        Refusal(name: "a file, not a folder", arguments: ["--from-dir", "config/outbox.yaml"], status: 65, message: "is not a folder"),
        Refusal(
            name: "with --id", arguments: ["--from-dir", "tree", "--id", "x"], status: 64,
            message: "--from-dir cannot be combined with --id"),
        Refusal(
            name: "with --from", arguments: ["--from-dir", "tree", "--from", "x.jsonl"], status: 64,
            message: "cannot be combined with --from"),
        Refusal(name: "id template alone", arguments: ["--id-template", "x"], status: 64, message: "--id-template goes with --from-dir"),
        Refusal(
            name: "vars not an object", arguments: ["--from-dir", "tree", "--vars", "[1]"], status: 65, message: "must be a JSON object"),
    ])
    func refusedInvocations(_ r: Refusal) async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("migrate", migrateDefinition("http://127.0.0.1:9"))
        try DirTree.file(sandbox.path("tree"), "a.txt", "a")
        let run = try await sandbox.outbox(["enqueue", "migrate"] + r.arguments)
        #expect(run.status == r.status)
        #expect(run.stderr.contains(r.message), "\(run.stderr)")
        #expect(try await DirTree.rows(sandbox).isEmpty)
    }

    /// A name that is not UTF-8 cannot be named in JSON: the batch is refused naming it
    /// (bad bytes as \\xHH), rather than sending a repaired name or leaving the file behind.
    @Test func aFileNameThatIsNotUTF8IsRefusedByName() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("migrate", migrateDefinition("http://127.0.0.1:9"))
        try DirTree.file(sandbox.path("tree"), "ok.txt", "a")
        try FileManager.default.createDirectory(atPath: sandbox.path("tree/sub"), withIntermediateDirectories: true)
        let name: [UInt8] = Array(sandbox.path("tree/sub/b").utf8) + [0xFF] + Array("d.txt".utf8) + [0]
        let fd = name.withUnsafeBufferPointer {
            open(UnsafeRawPointer($0.baseAddress!).assumingMemoryBound(to: CChar.self), O_CREAT | O_WRONLY, 0o644)
        }
        #expect(fd >= 0)
        close(fd)
        let run = try await sandbox.outbox(["enqueue", "migrate", "--from-dir", "tree"])
        #expect(run.status == 65)
        #expect(
            run.stderr
                == "outbox: E_INVALID: --from-dir: the name \(sandbox.path("tree/sub"))/b\\xFFd.txt is not valid UTF-8 (1 such name in that folder); rename it\n"
        )
        #expect(try await DirTree.rows(sandbox).isEmpty)
    }

    @Test func emptyFolderEnqueuesNothing() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("migrate", migrateDefinition("http://127.0.0.1:9"))
        try FileManager.default.createDirectory(atPath: sandbox.path("empty/sub"), withIntermediateDirectories: true)
        let run = try await sandbox.outbox(["enqueue", "migrate", "--from-dir", "empty", "--json"])
        #expect(run.status == 0)
        #expect(run.stdout == "[]\n")
        #expect(run.stderr.contains("no files under"))
    }

    /// A tree of referenced files is written a batch at a time while the next files render,
    /// in one transaction: a file of the second batch that cannot be sent (its name would
    /// break a header) refuses the whole tree, and the ids come in the walk's order.
    @Test func aTreeWrittenBatchByBatchIsStillAllOrNothing() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("migrate", migrateDefinition("http://127.0.0.1:9", ownership: "reference"))
        let root = sandbox.path("tree")
        for n in 0..<1_100 { try DirTree.file(root, String(format: "f%04d.bin", n), "\(n)") }
        try DirTree.file(root, "g\nbad.bin", "bad")
        let refused = try await sandbox.outbox(["enqueue", "migrate", "--from-dir", "tree"])
        #expect(refused.status == 65, "\(refused.stderr)")
        #expect(refused.stderr.hasPrefix("outbox: E_INVALID: \(root)/g\\x0abad.bin: request.headers.X-Relative: "), "\(refused.stderr)")
        #expect(try await DirTree.rows(sandbox).isEmpty)
        try FileManager.default.removeItem(atPath: root + "/g\nbad.bin")
        // Killed after its second batch is written (in the transaction): nothing is committed.
        let killed = try await sandbox.outbox(
            ["enqueue", "migrate", "--from-dir", "tree"], environment: ["OUTBOX_FAULT": "enqueue.batch-written:2"])
        #expect(killed.exitCode == -9, "\(killed)")
        #expect(try await DirTree.rows(sandbox).isEmpty)
        let enqueue = try await sandbox.outbox(["enqueue", "migrate", "--from-dir", "tree", "--json"])
        #expect(enqueue.status == 0, "\(enqueue.stderr)")
        let printed = try #require(enqueue.jsonObject as? [[String: String]])
        #expect(printed.map { $0["path"] } == (0..<1_100).map { root + String(format: "/f%04d.bin", $0) })
        let rows = try await DirTree.rows(sandbox)
        #expect(rows.map { $0["id"] as? String } == printed.map { $0["id"] })
    }

    /// A stop signal while the moved files of a tree wait for their commit puts them back
    /// before the process ends with the signal: nothing stored, every file at its path, no
    /// journal left for the next command to settle.
    @Test(arguments: [SIGTERM, SIGINT])
    func aStoppedMoveOfATreePutsTheFilesBackBeforeItEnds(_ signal: Int32) async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("migrate", migrateDefinition("http://127.0.0.1:9", ownership: "move"))
        let root = sandbox.path("tree")
        for n in 0..<1_100 { try DirTree.file(root, String(format: "f%04d.bin", n), "\(n)") }
        let go = sandbox.path("go")
        // Held after the first batch is written: its files are inside the store.
        let enqueue = try sandbox.start(
            ["enqueue", "migrate", "--from-dir", "tree"], environment: ["OUTBOX_FAULT_HOLD": "enqueue.batch-written:\(go)"])
        await eventually("the first batch to be written") { FileManager.default.fileExists(atPath: go + ".reached") }
        let left = (try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []
        #expect(left.count < 1_100, "some files were moved in: \(left.count) left")
        enqueue.signal(signal)
        await eventually("the signal to be delivered") { !enqueue.hasPending(signal) }
        _ = FileManager.default.createFile(atPath: go, contents: nil)
        let ended = await enqueue.wait()
        #expect(ended.exitCode == -signal, "\(ended)")
        // Back before the process ended, without another command.
        let back = Set(try FileManager.default.contentsOfDirectory(atPath: root))
        #expect(back.count == 1_100 && back == Set((0..<1_100).map { String(format: "f%04d.bin", $0) }), "\(back.count) back")
        #expect(try String(contentsOfFile: root + "/f0007.bin", encoding: .utf8) == "7")
        #expect((try? FileManager.default.contentsOfDirectory(atPath: sandbox.path(".outbox/moves"))) ?? [] == [])
        #expect((try? FileManager.default.contentsOfDirectory(atPath: sandbox.path(".outbox/bodies"))) ?? [] == [])
        #expect(try await DirTree.rows(sandbox).isEmpty)
    }

    /// The same while the enqueue waits for the store's write lock another enqueue holds: the
    /// wait ends at the signal, not when the lock is free.
    @Test func aStoppedMoveWaitingForTheStoreLockPutsTheFilesBack() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("migrate", migrateDefinition("http://127.0.0.1:9", ownership: "move"))
        for n in 0..<1_100 { try DirTree.file(sandbox.path("first"), String(format: "f%04d.bin", n), "\(n)") }
        for n in 0..<50 { try DirTree.file(sandbox.path("second"), String(format: "s%04d.bin", n), "\(n)") }
        let go = sandbox.path("go")
        // The first holds the write lock, in its transaction, until the test lets it go.
        let holder = try sandbox.start(
            ["enqueue", "migrate", "--from-dir", "first"], environment: ["OUTBOX_FAULT_HOLD": "enqueue.batch-written:\(go)"])
        await eventually("the first enqueue to hold the lock") { FileManager.default.fileExists(atPath: go + ".reached") }
        let waiting = try sandbox.start(["enqueue", "migrate", "--from-dir", "second"])
        await eventually("the second enqueue to move its files in") {
            ((try? FileManager.default.contentsOfDirectory(atPath: sandbox.path("second"))) ?? ["x"]).isEmpty
        }
        waiting.signal(SIGTERM)
        let ended = await waiting.wait()
        #expect(ended.exitCode == -SIGTERM, "\(ended)")
        #expect(holder.isRunning, "the lock was still held")
        #expect(try FileManager.default.contentsOfDirectory(atPath: sandbox.path("second")).count == 50)
        _ = FileManager.default.createFile(atPath: go, contents: nil)
        #expect(await holder.wait().exitCode == 0)
        #expect(try await DirTree.rows(sandbox).count == 1_100)
    }

    @Test func aMigratedTreeIsSentFileByFile() async throws {
        let server = try TestHTTPServer()
        let sandbox = try OutboxSandbox(config: "concurrency: 8\n")
        try sandbox.define("migrate", migrateDefinition(server.baseURL, ownership: "move"))
        let root = sandbox.path("tree")
        var expected: [String: Int] = [:]
        for n in 0..<300 {
            let size = (n * 997) % 20_000
            try DirTree.file(root, "dir\(n % 7)/sub\(n % 3)/file\(n).bin", String(repeating: "z", count: size))
            expected["/put/file\(n).bin"] = size
        }
        let enqueue = try await sandbox.outbox(["enqueue", "migrate", "--from-dir", "tree"])
        #expect(enqueue.status == 0, "\(enqueue.stderr)")
        #expect(enqueue.lines.count == 300)
        // Moved into the store in the one transaction: the tree has only folders left.
        let left = (FileManager.default.enumerator(atPath: root)?.allObjects as? [String] ?? []).filter { relative in
            var isFolder: ObjCBool = false
            return FileManager.default.fileExists(atPath: root + "/" + relative, isDirectory: &isFolder) && !isFolder.boolValue
        }
        #expect(left == [])
        let run = try await sandbox.outbox(["run", "--drain"])
        #expect(run.status == 0, "\(run.stderr)")
        let received = server.requests(path: "/put/")
        #expect(Dictionary(uniqueKeysWithValues: received.map { ($0.path, Int($0.bodySize)) }) == expected)
        #expect(received.allSatisfy { $0.header("X-Relative")?.hasSuffix(String($0.path.dropFirst(5))) == true })
        #expect(try await DirTree.rows(sandbox).isEmpty)
    }
}

@Suite struct EnqueueFromFileScaleTests {
    @Test func oneHundredThousandLinesInOneTransaction() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define(
            "note",
            """
            key: note
            request:
              url: "http://127.0.0.1:9/notes/{{ vars.n }}"
              data: { n: "{{ vars.n }}", text: "{{ vars.text }}" }
            """)
        // Built off the cooperative pool: in a debug build this string work takes seconds.
        let path = sandbox.path("lines.jsonl")
        try await offload {
            var text = ""
            text.reserveCapacity(6_000_000)
            for n in 0..<100_000 {
                text +=
                    n % 10_000 == 0
                    ? #"{"vars": {"n": \#(n), "text": "line \#(n)"}, "id": "line-\#(n)"}"#
                    : #"{"vars": {"n": \#(n), "text": "line \#(n)"}}"#
                text += "\n"
            }
            try text.write(toFile: path, atomically: false, encoding: .utf8)
        }
        let clock = Date()
        // Its speed is measured in bench/, not here: a loaded machine may take minutes (56 s
        // alone beside a load of 30 on 2 cores), so the net is far above the default 300 s.
        let run = try await sandbox.outbox(["enqueue", "note", "--from", "lines.jsonl"], timeout: 1800)
        let elapsed = Date().timeIntervalSince(clock)
        print("EnqueueFromFileScaleTests: 100,000 lines enqueued in \(String(format: "%.1f", elapsed)) s")
        #expect(run.status == 0, "\(run.stderr)")
        let (count, unique, first, middle) = try await offload { () -> (Int, Int, String?, String?) in
            let ids = run.lines
            return (ids.count, Set(ids).count, ids.first, ids.count > 50_000 ? ids[50_000] : nil)
        }
        #expect(count == 100_000)
        #expect(unique == 100_000)
        #expect(first == "line-0")
        #expect(middle == "line-50000")
        #expect(try await DirTree.queued(sandbox) == 100_000)
    }

    @Test func aBadLastLineStoresNothing() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define(
            "note",
            """
            key: note
            request:
              url: "http://127.0.0.1:9/notes/{{ vars.n }}"
            """)
        var text = ""
        for n in 0..<1_000 { text += #"{"vars": {"n": \#(n)}}"# + "\n" }
        text += #"{"vars": {"n": 1}, "colour": "red"}"# + "\n"
        try sandbox.write("lines.jsonl", text)
        let run = try await sandbox.outbox(["enqueue", "note", "--from", "lines.jsonl"])
        #expect(run.status == 65)
        #expect(run.stderr.contains("lines.jsonl:1001: unknown field \"colour\""))
        #expect(try await DirTree.queued(sandbox) == 0)
    }
}

/// `--from FILE` writes a file's lines in one transaction as it reads them: it reads the
/// lines the file held when it was opened, so a file still being appended to cannot keep
/// the store's write lock for as long as its writer goes on.
@Suite struct EnqueueFromGrowingFileTests {
    @Test func linesAppendedAfterTheOpenAreLeftForTheNextEnqueue() async throws {
        let p = try TestProject(definitions: [
            "note": """
            key: note
            request:
              url: "http://127.0.0.1:9/notes/{{ vars.n }}"
            """
        ])
        // Three batches: the run holds after writing the first, with the rest still to read.
        let lines = (0..<3_000).map { #"{"vars": {"n": \#($0)}}"# + "\n" }.joined()
        let path = try p.write("lines.jsonl", lines)
        let go = p.path("go")
        let enqueue = try p.start(
            ["enqueue", "note", "--from", "lines.jsonl"], environment: ["OUTBOX_FAULT_HOLD": "enqueue.batch-written:\(go)"])
        await eventually("the first batch was written") { FileManager.default.fileExists(atPath: go + ".reached") }
        let appended = try #require(FileHandle(forWritingAtPath: path))
        appended.seekToEndOfFile()
        appended.write(Data((3_000..<3_500).map { #"{"vars": {"n": \#($0)}}"# + "\n" }.joined().utf8))
        try appended.close()
        p.touch("go")
        let first = await enqueue.wait(timeout: 120)
        #expect(first.exitCode == 0, "\(first)")
        #expect(first.stdout.split(separator: "\n").count == 3_000)
        #expect(try p.sqlite("SELECT count(*) FROM entries").trimmingCharacters(in: .whitespacesAndNewlines) == "3000")
        // The next enqueue of the same file reads it whole, as it is now.
        let second = try await p.outbox(["enqueue", "note", "--from", "lines.jsonl"])
        #expect(second.exitCode == 0, "\(second)")
        #expect(try p.sqlite("SELECT count(*) FROM entries").trimmingCharacters(in: .whitespacesAndNewlines) == "6500")
    }
}
