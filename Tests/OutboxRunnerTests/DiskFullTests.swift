import Foundation
import Glibc
import OutboxModel
import TestSupport
import Testing

/// The store on a small tmpfs, filled while outbox enqueues, stages, settles and acknowledges;
/// and remounted read-only. Each command that can report it fails with E_STORAGE (74), the
/// store stays consistent (`audit`), and nothing committed before is lost. Mounting needs
/// root, as CI runs; without it these tests fail.
@Suite(.serialized) struct DiskFullTests {
    /// A tmpfs of `bytes` mounted at a new folder; unmounted when freed.
    final class SmallDisk {
        let path: String
        private let folder: String

        init(in folder: String, bytes: Int) throws {
            self.folder = folder
            path = folder + "/disk"
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            let r = try TestHTTPCurl.runExecutable("/bin/mount", ["-t", "tmpfs", "-o", "size=\(bytes)", "tmpfs", path])
            guard r.exitCode == 0 else { throw FixtureError("cannot mount a tmpfs at \(path) (these tests need root): \(r.stderr)") }
        }

        deinit {
            _ = try? TestHTTPCurl.runExecutable("/bin/umount", ["-l", path])
            try? FileManager.default.removeItem(atPath: folder)
        }

        /// Writes a filler file until the disk is full.
        func fill() {
            let fd = open(path + "/filler", O_WRONLY | O_CREAT | O_APPEND, 0o600)
            let block = [UInt8](repeating: 0x5A, count: 4096)
            while block.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) > 0 {}
            close(fd)
        }

        func free() {
            unlink(path + "/filler")
        }

        /// Bytes free on the disk.
        var available: Int {
            var fs = statvfs()
            guard statvfs(path, &fs) == 0 else { return -1 }
            return Int(fs.f_bavail) * Int(fs.f_frsize)
        }

        func remount(readOnly: Bool) throws {
            let r = try TestHTTPCurl.runExecutable("/bin/mount", ["-o", readOnly ? "remount,ro" : "remount,rw", path])
            guard r.exitCode == 0 else { throw FixtureError("cannot remount \(path): \(r.stderr)") }
        }
    }

    /// A project whose store is on a small disk of its own.
    static func project(
        bytes: Int, definitions: [String: String], hooks: [String: String] = [:], function: String = #function
    ) throws -> (
        Project, SmallDisk
    ) {
        let folder = NSTemporaryDirectory() + "outbox-disk-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let disk = try SmallDisk(in: folder, bytes: bytes)
        let p = try Project(config: fastConfig + "store: \(disk.path)/store\n", definitions: definitions, hooks: hooks, function: function)
        return (p, disk)
    }

    static func isDiskFull(_ text: String) -> Bool { text.contains("disk is full") || text.contains("No space left") }

    @Test func enqueueOnAFullDiskFailsAndKeepsWhatWasEnqueued() async throws {
        let (p, disk) = try Self.project(bytes: 1 << 20, definitions: ["t": definition("t")])
        _ = disk
        let tag = String(repeating: "x", count: 40_000)
        var enqueued: [String] = []
        var failure: Finished?
        for n in 0..<100 {
            let r = try await p.outbox([
                "enqueue", "t", "--id", "e\(n)", "--vars", #"{"url": "\#(p.url("/status/200"))", "tag": "\#(tag)"}"#,
            ])
            if r.exitCode != 0 {
                failure = r
                break
            }
            enqueued.append("e\(n)")
        }
        let full = try #require(failure, "a 1 MiB disk cannot hold 100 entries of 40 KB")
        #expect(full.exitCode == 74 && full.stderr.contains("E_STORAGE") && Self.isDiskFull(full.stderr), "\(full.stderr)")
        #expect(!enqueued.isEmpty)
        #expect(try await p.list().compactMap { $0["id"]?.stringValue }.sorted() == enqueued.sorted())
        #expect(try await p.outbox(["audit"]).exitCode == 0)
    }

    @Test func aFileLargerThanTheFreeSpaceIsNotStaged() async throws {
        let (p, disk) = try Self.project(bytes: 2 << 20, definitions: ["up": fileDefinition("up")])
        let source = p.base + "/big.bin"
        #expect(FileManager.default.createFile(atPath: source, contents: Data(repeating: 7, count: 3 << 20)))
        let vars = JSON.object([("url", .string(p.url("/put/big"))), ("path", .string(source))]).serialized()
        let r = try await p.outbox(["enqueue", "up", "--vars", vars])
        #expect(r.exitCode == 74 && r.stderr.contains("E_STORAGE"), "\(r.stderr)")
        #expect(try await p.list().isEmpty)
        let bodies = (try? FileManager.default.contentsOfDirectory(atPath: disk.path + "/store/bodies")) ?? []
        #expect(bodies.isEmpty, "no half-staged body: \(bodies)")
        #expect(FileManager.default.fileExists(atPath: source), "a copy leaves the source alone")
        #expect(try await p.outbox(["audit"]).exitCode == 0)
    }

    /// The settle of a large response cannot be written: the runner stops with E_STORAGE;
    /// once there is room, the next run sends the entry again and finishes everything.
    @Test func aSettleOnAFullDiskStopsTheRunnerAndLosesNothing() async throws {
        let (p, disk) = try Self.project(bytes: 4 << 20, definitions: ["t": definition("t")])
        defer { p.server.release("a", count: 10) }
        try await p.enqueue("t", path: "/hold/a/bytes/400000", id: "a")
        try await p.enqueue("t", path: "/status/200", id: "b")
        let runner = try p.start(["run"])
        #expect(await p.server.waitForHeld("a"), "\(runner.stderrSoFar)")
        // b is delivered and acknowledged (forgotten) before the disk fills.
        try await eventually("b is acknowledged") {
            let states = try await p.states()
            return !p.deliveries("b").isEmpty && states["b"] == nil
        }
        disk.fill()
        _ = p.server.release("a")
        let stopped = await runner.wait()
        #expect(stopped.exitCode == 74 && stopped.stderr.contains("E_STORAGE") && Self.isDiskFull(stopped.stderr), "\(stopped.stderr)")
        #expect(p.deliveries("a").isEmpty, "nothing was acknowledged that was not written")

        disk.free()
        _ = p.server.release("a", count: 10)
        let drained = try await p.outbox(["run", "--drain"])
        #expect(drained.exitCode == 0, "\(drained.stderr)")
        #expect(p.deliveries("a").map { $0.string("stdin.outcome") } == ["completed"])
        #expect(p.deliveries("b").count == 1)
        #expect(p.server.requests(path: "/hold/a").count == 2, "sent again: its first settle never committed")
        #expect(try await p.list().isEmpty)
        #expect(try await p.outbox(["audit"]).exitCode == 0)
    }

    /// A hook's enqueue lines cannot be applied on a full disk: the outcome stays owed and
    /// is delivered again once there is room; its follow-up exists once.
    @Test func anAcknowledgementOnAFullDiskIsDeliveredAgainLater() async throws {
        let tag = String(repeating: "y", count: 200_000)
        // The first delivery waits for hooks/go, so the test fills the disk while it runs.
        let hook = """
            #!/bin/sh
            cat > /dev/null
            echo "$OUTBOX_ID" >> hooks/ran.txt
            while [ ! -e hooks/go ]; do sleep 0.05; done
            if [ "$OUTBOX_KEY" = t ]; then
              printf '{"enqueue": {"key": "f", "id": "follow", "vars": {"url": "%s", "tag": "\(tag)"}}}\\n' "$FOLLOW_URL"
            fi

            """
        let (p, disk) = try Self.project(
            bytes: 3 << 20, definitions: ["t": definition("t"), "f": definition("f", hooks: false)], hooks: ["record.sh": hook])
        try await p.enqueue("t", path: "/status/200", id: "a")
        let env = ["FOLLOW_URL": p.url("/status/201")]
        let runner = try p.start(["run", "--drain"], environment: env)
        await eventually("the hook runs") { p.read("hooks/ran.txt") != nil }
        disk.fill()
        p.touch("hooks/go")
        let full = await runner.wait()
        #expect(full.exitCode != 0, "the acknowledgement cannot be written: \(full.stderr)")
        #expect(Self.isDiskFull(full.stderr), "\(full.stderr)")
        #expect(p.server.requests(path: "/status/201").isEmpty)

        disk.free()
        let audit = try await p.outbox(["audit"])
        #expect(audit.exitCode == 0, "\(audit.stdout) \(audit.stderr)")
        let again = try await p.outbox(["run", "--drain"], environment: env)
        #expect(again.exitCode == 0, "\(again.stderr)")
        let ran = (p.read("hooks/ran.txt") ?? "").split(separator: "\n")
        #expect(ran == ["a", "a"], "delivered again")
        #expect(p.server.requests(path: "/status/201").count == 1, "the follow-up was enqueued and sent once")
        #expect(try await p.list().isEmpty)
        #expect(try await p.outbox(["audit"]).exitCode == 0)
    }

    /// A read-only store still answers reading commands; writing ones fail with E_STORAGE.
    @Test func aReadOnlyStoreAnswersListAndShow() async throws {
        let (p, disk) = try Self.project(bytes: 1 << 20, definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200", id: "a")
        try disk.remount(readOnly: true)
        defer { try? disk.remount(readOnly: false) }
        let list = try await p.outbox(["list", "--json"])
        #expect(list.exitCode == 0, "\(list.stderr)")
        #expect(list.stdout.contains("\"a\""))
        let show = try await p.outbox(["show", "a", "--json"])
        #expect(show.exitCode == 0 && show.stdout.contains("\"queued\""), "\(show.stderr)")
        #expect(try await p.outbox(["stats", "--json"]).exitCode == 0)
        #expect(try await p.outbox(["audit"]).exitCode == 0)
        for args in [
            ["enqueue", "t", "--vars", #"{"url": "http://127.0.0.1:1/x", "tag": "t"}"#], ["run", "--drain"], ["cancel", "a"], ["pause"],
        ] {
            let r = try await p.outbox(args)
            #expect(r.exitCode == 74 && r.stderr.contains("E_STORAGE"), "\(args): \(r.stderr)")
        }
        #expect(p.server.requests.isEmpty, "nothing was sent from a store that cannot record it")
        #expect(try await p.states() == ["a": "queued"])
    }

    /// A store moved as a folder and then read-only (no writer has rewritten its rows'
    /// paths yet): `audit` finds the staged bodies by name, neither missing nor orphans.
    @Test func aMovedReadOnlyStorePassesAudit() async throws {
        let (p, disk) = try Self.project(bytes: 1 << 20, definitions: ["f": fileDefinition("f")])
        _ = try p.write("a.bin", "staged bytes")
        let vars = JSON.object([("url", .string(p.url("/put/m"))), ("path", .string("a.bin"))]).serialized()
        #expect(try await p.outbox(["enqueue", "f", "--id", "m", "--vars", vars]).exitCode == 0)
        try FileManager.default.moveItem(atPath: disk.path + "/store", toPath: disk.path + "/moved")
        try p.writeConfig(fastConfig + "store: \(disk.path)/moved\n")
        try disk.remount(readOnly: true)
        let audit = try await p.outbox(["audit"])
        try disk.remount(readOnly: false)
        #expect(audit.exitCode == 0, "\(audit.stdout)\(audit.stderr)")
        #expect(try await p.outbox(["run", "--drain"]).exitCode == 0)
        #expect(p.server.requests(path: "/put/m").map(\.bodySize) == [12])
    }

    /// `init` in a folder on a full disk: E_STORAGE, and no file it began is left cut short.
    @Test func initOnAFullDiskLeavesNoEmptyFiles() async throws {
        let (p, disk) = try Self.project(bytes: 1 << 20, definitions: [:])
        disk.fill()
        let folder = disk.path + "/project"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        let r = try await p.outbox(["init"], cwd: folder)
        #expect(r.exitCode == 74 && Self.isDiskFull(r.stderr), "\(r.stderr)")
        for file in ["config/outbox.yaml", "definitions/example-ping.yaml", "hooks/example-done.sh"] {
            #expect(!FileManager.default.fileExists(atPath: folder + "/" + file), "\(file) left behind")
        }
        disk.free()
        let again = try await p.outbox(["init"], cwd: folder)
        #expect(again.exitCode == 0, "\(again.stderr)")
        #expect(try await p.outbox(["check"], cwd: folder).exitCode == 0)
    }
}
