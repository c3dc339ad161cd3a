import Foundation
import OutboxModel
import TestSupport
import Testing

/// Every row of docs/bad-input.md against the built binary: the exit status, the code, the
/// culprit on the one error line, no crash, and a project and store exactly as they were.
/// One case at a time: hundreds at once, each starting several processes, would starve the
/// other suites' tests of the machine (and of their deadlines).
@Suite(.serialized) struct BadInputCatalogueTests {
    static let areas: Set = ["yaml", "definition", "config", "vars", "template", "headers", "url", "file", "units", "cli", "store", "s3"]

    @Test func theCatalogueIsOneTableOfAtLeast80CasesOverEveryArea() throws {
        let cases = BadInputCatalogue.cases
        #expect(cases.count >= 80, "\(cases.count) cases")
        #expect(Set(cases.map(\.id)).count == cases.count, "ids repeat")
        #expect(Set(cases.map(\.area)) == Self.areas)
        for c in cases {
            #expect(!c.command.isEmpty && !c.names.isEmpty, "\(c.id) needs a command and a text the message names")
            #expect(ErrorCode(rawValue: c.code)?.exitStatus == c.exit, "\(c.id): \(c.code) does not exit \(c.exit)")
        }
        #expect(BadInputCatalogue.fixtureFiles.count >= 8)
    }

    @Test(arguments: BadInputCatalogue.cases)
    func badInputFailsPreciselyAndChangesNothing(_ c: BadInputCase) async throws {
        let p = try await BadInputProject(c)
        // Each step waits on child processes: on threads of their own, not the test pool's.
        let (before, r, after) = try await offload { (try p.snapshot(), try p.outbox(c.command, in: p.cwd), try p.snapshot()) }
        await p.finish()

        #expect(r.exitCode >= 0 && r.exitCode < 128 && !r.timedOut, "crashed: \(r)")
        #expect(r.exitCode == c.exit, "exit: \(r)")
        // `--json` after `--` is an argument, not the option.
        if c.command.prefix(while: { $0 != "--" }).contains("--json") {
            #expect(r.stderr.isEmpty, "with --json stderr stays empty: \(r)")
            let doc = try JSON.parse(r.stdout)
            #expect(doc["error"]?["code"]?.stringValue == c.code, "\(r)")
            let message = doc["error"]?["message"]?.stringValue ?? ""
            for text in c.names { #expect(message.contains(text), "the message does not name \(text): \(r)") }
        } else {
            #expect(r.stdout.isEmpty, "stdout: \(r)")
            checkErrorLines(r.stderr, c)
        }
        if before != after {
            let gone = before.filter { !after.contains($0) }, new = after.filter { !before.contains($0) }
            Issue.record("the project changed:\n- \(gone.joined(separator: "\n- "))\n+ \(new.joined(separator: "\n+ "))")
        }
    }

    /// One `outbox: CODE: message` line, or compiler-style blocks then `outbox: E_CONFIG: N errors`.
    func checkErrorLines(_ stderr: String, _ c: BadInputCase) {
        var lines = stderr.components(separatedBy: "\n")
        guard lines.last == "" else {
            Issue.record("stderr does not end with a newline: \(stderr)")
            return
        }
        lines.removeLast()
        let last = lines.last ?? ""
        #expect(last.hasPrefix("outbox: \(c.code): "), "the last line is not the error: \(stderr)")
        var blocks = 0
        var i = 0
        while i < lines.count - 1 {
            guard lines[i].range(of: #"^.+:[0-9]+:[0-9]+: error: "#, options: .regularExpression) != nil else {
                Issue.record("line \(i + 1) of stderr is neither an error nor its source: \(stderr)")
                return
            }
            blocks += 1
            let caret = i + 2 < lines.count ? lines[i + 2] : ""
            i += caret.range(of: #"^[ \t]*\^$"#, options: .regularExpression) != nil ? 3 : 1
        }
        if blocks > 0 {
            #expect(c.code == "E_CONFIG" && last == "outbox: E_CONFIG: \(blocks) error\(blocks == 1 ? "" : "s")", "\(stderr)")
        }
        for text in c.names { #expect(stderr.contains(text), "stderr does not name \(text): \(stderr)") }
    }
}

/// A fresh project for one case: `outbox init`, the page's fixture definitions, the two
/// seed entries, then the case's setup actions.
final class BadInputProject: @unchecked Sendable {
    let project: TestProject
    let c: BadInputCase
    var environment: [String: String] = [:]
    var stdin = ""
    /// Set by `stdin-from`: the command reads that file or folder instead of `stdin`.
    var stdinPath: String?
    /// The command's folder, under the root.
    var cwd: String?
    var asNobody = false
    var runner: RunningProcess?

    var root: String { project.root }

    init(_ c: BadInputCase) async throws {
        self.c = c
        project = try TestProject(config: nil, name: "badinput-\(c.id)")
        try expectOK(try await project.outbox(["init"]), "init")
        for file in BadInputCatalogue.fixtureFiles { try project.write(file.path, file.text) }
        try Data(count: 100_000).write(to: URL(fileURLWithPath: project.path("seed.bin")))
        try expectOK(try await project.outbox(["enqueue", "note", "--id", "seed", "--vars", #"{"n": 1}"#]), "seed")
        try expectOK(
            try await project.outbox(["enqueue", "file.copy", "--id", "seed-file", "--vars", #"{"path": "seed.bin"}"#]), "seed-file")
        for action in c.setup { try await apply(action) }
        if asNobody {
            try expectOK(try runProcess("/bin/chown", ["-R", "nobody:nogroup", project.base]), "chown")
        }
    }

    func expectOK(_ r: CommandResult, _ what: String) throws {
        guard r.exitCode == 0 else { throw FixtureError("\(c.id): \(what) failed: \(r)") }
    }

    func apply(_ action: [String]) async throws {
        let args = Array(action.dropFirst())
        func arg(_ i: Int) throws -> String {
            guard i < args.count else { throw FixtureError("\(c.id): \(action.joined(separator: " ")) needs more words") }
            return args[i]
        }
        let fm = FileManager.default
        switch action.first ?? "" {
        case "write":
            let path = project.path(try arg(0))
            try fm.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            try BadInputCatalogue.unescape(try arg(1)).write(to: URL(fileURLWithPath: path))
        case "zeros":
            try Data(count: Int(try arg(1)) ?? 0).write(to: URL(fileURLWithPath: project.path(try arg(0))))
        case "random":
            try Data((0..<(Int(try arg(1)) ?? 0)).map { _ in UInt8.random(in: 0...255) }).write(
                to: URL(fileURLWithPath: project.path(try arg(0))))
        case "long-var":
            let letters = String(repeating: "a", count: Int(try arg(1)) ?? 0)
            try Data(#"{"v": "\#(letters)"}"#.utf8).write(to: URL(fileURLWithPath: project.path(try arg(0))))
        case "chmod":
            guard chmod(project.path(try arg(1)), mode_t(try arg(0), radix: 8) ?? 0) == 0 else { throw FixtureError("chmod \(args)") }
        case "mkdir": try fm.createDirectory(atPath: project.path(try arg(0)), withIntermediateDirectories: true)
        case "rm": try fm.removeItem(atPath: project.path(try arg(0)))
        case "fifo": guard mkfifo(project.path(try arg(0)), 0o644) == 0 else { throw FixtureError("mkfifo \(args)") }
        case "symlink": try fm.createSymbolicLink(atPath: project.path(try arg(1)), withDestinationPath: try arg(0))
        case "hardlink": try fm.linkItem(atPath: project.path(try arg(0)), toPath: project.path(try arg(1)))
        case "chown": try expectOK(try runProcess("/bin/chown", [try arg(0), project.path(try arg(1))]), "chown")
        case "sql": _ = try project.sqlite(try arg(0))
        case "env":
            let pair = try arg(0).split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
            environment[pair[0]] = pair.count > 1 ? pair[1] : ""
        case "stdin": stdin = String(decoding: BadInputCatalogue.unescape(try arg(0)), as: UTF8.self)
        case "stdin-from": stdinPath = project.path(try arg(0))
        case "cd": cwd = project.path(try arg(0))
        case "as-nobody":
            guard Self.runuser != nil else { throw FixtureError("runuser is missing: the permission cases cannot run") }
            asNobody = true
        case "hold-runner": try await holdRunner()
        default: throw FixtureError("\(c.id): unknown setup action \(action.joined(separator: " "))")
        }
    }

    /// A runner that holds the store while the test server holds its one request.
    func holdRunner() async throws {
        try expectOK(try await project.outbox(["cancel", "--all"]), "cancel")
        // The request stays held however long a loaded machine takes over the case: given up
        // as stalled (60 s by default) it would be queued again, and the store would change.
        try project.writeConfig((project.read("config/outbox.yaml") ?? "") + heldRequestConfig)
        environment["HOLD_URL"] = try project.startServer().baseURL
        try expectOK(
            try await project.outbox(["enqueue", "held", "--id", "held", "--vars", #"{"v": 1}"#], environment: environment), "held")
        runner = try project.start(["run"], environment: environment)
        guard await project.server.waitForHeld("h") else { throw FixtureError("the runner's request never reached the server") }
        // The request may go out before the claim's commit: the case starts once the store says running.
        let running = await eventually("the held entry shows running") {
            ((try? await project.outbox(["list", "--json"]))?.stdout ?? "").contains(#""state":"running""#)
        }
        guard running else { throw FixtureError("the held entry never showed running") }
    }

    /// Lets the held request go and stops the runner.
    func finish() async {
        guard let runner else { return }
        _ = project.server.release("h")
        runner.signal(SIGTERM)
        _ = await runner.wait(timeout: 60)
    }

    static let runuser: String? = ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"].first {
        FileManager.default.isExecutableFile(atPath: $0)
    }

    /// A copy of the built binary that `nobody` may run: the build folder may sit under a home
    /// folder only root can enter (a clone in /root).
    static let binaryForNobody: Result<String, FixtureError> = {
        let folder = "/tmp/outbox-nobody-\(getpid())"
        let copy = folder + "/outbox"
        do {
            try? FileManager.default.removeItem(atPath: folder)
            try FileManager.default.createDirectory(
                atPath: folder, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o755])
            try copyClosedOnExec(builtExecutable("outbox"), to: copy)
            try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: copy)
            atexit { try? FileManager.default.removeItem(atPath: "/tmp/outbox-nobody-\(getpid())") }
            return .success(copy)
        } catch {
            return .failure(FixtureError("cannot copy outbox to \(copy) for nobody: \(error)"))
        }
    }()

    /// Runs a program in the project with the case's environment and stdin, as `nobody` when asked.
    func runTool(_ executable: String, _ arguments: [String], in folder: String? = nil) throws -> CommandResult {
        let env = project.processEnvironment(environment)
        if asNobody, let runuser = Self.runuser {
            let pairs = env.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
            let program = executable == project.executable ? try Self.binaryForNobody.get() : executable
            let child = try RunningProcess(
                executable: runuser, arguments: ["-u", "nobody", "--", "/usr/bin/env", "-i"] + pairs + [program] + arguments,
                cwd: folder ?? root, environment: env, stdin: stdin, stdinPath: stdinPath)
            return child.waitBlocking(timeout: 120)
        }
        return try RunningProcess(
            executable: executable, arguments: arguments, cwd: folder ?? root, environment: env, stdin: stdin, stdinPath: stdinPath
        )
        .waitBlocking(timeout: 120)
    }

    func outbox(_ arguments: [String], in folder: String? = nil) throws -> CommandResult {
        try runTool(project.executable, arguments, in: folder)
    }

    /// Every file of the project (mode, size, content), then the listed rows and the
    /// database's dump: the files come first, so a change made by the reads below shows too.
    func snapshot() throws -> [String] {
        var lines: [String] = []
        walk(root, "", into: &lines)
        let list = try outbox(["list", "--json"])
        lines.append("list \(list.exitCode): \(list.stdout)\(list.stderr)")
        let db = project.path(".outbox/outbox.db")
        if let size = (try? FileManager.default.attributesOfItem(atPath: db))?[.size] as? Int, size > 0 {
            guard FileManager.default.isExecutableFile(atPath: "/usr/bin/sqlite3") else { throw FixtureError("sqlite3 is missing") }
            let dump = try runTool("/usr/bin/sqlite3", [db, ".dump"])
            lines.append(dump.exitCode == 0 ? dump.stdout : "no dump (\(dump.stderr)); bytes \(Self.digest(db))")
        }
        return lines
    }

    /// One line a file: path, type, mode, and for regular files size and a digest of the bytes.
    func walk(_ folder: String, _ prefix: String, into lines: inout [String]) {
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).sorted()
        // The runner's lock is taken before the store is read: a refused `run` may leave it.
        for name in names
        where !name.hasSuffix("outbox.db-wal") && !name.hasSuffix("outbox.db-shm") && prefix + name != ".outbox/runner.lock" {
            let full = folder + "/" + name, rel = prefix + name
            var st = stat()
            guard lstat(full, &st) == 0 else { continue }
            let mode = String(st.st_mode & 0o7777, radix: 8)
            switch st.st_mode & S_IFMT {
            case S_IFDIR:
                lines.append("\(rel)/ \(mode)")
                walk(full, rel + "/", into: &lines)
            case S_IFREG:
                // The database's bytes move on a read (checkpoints): its dump stands for it.
                lines.append(name == "outbox.db" ? "\(rel) \(mode)" : "\(rel) \(mode) \(st.st_size) \(Self.digest(full))")
            case S_IFLNK:
                lines.append("\(rel) -> \((try? FileManager.default.destinationOfSymbolicLink(atPath: full)) ?? "?")")
            default:
                lines.append("\(rel) special \(mode)")
            }
        }
    }

    /// FNV-1a over a file's bytes: enough to see that it changed.
    static func digest(_ path: String) -> String {
        guard let data = FileManager.default.contents(atPath: path) else { return "unreadable" }
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in data {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return String(hash, radix: 16)
    }
}

/// A staged body its runner may not read (given to another user by hand) is an error of the
/// entry, kind `file`, which `outbox retry` sends once it is readable: not a network failure
/// retried until the entry expires.
@Suite struct ForeignBodyTests {
    /// `ownership: move` of a file another user owns, in a folder the user may write: the store
    /// gets a copy of its own (0600, the user's), and the name goes; one it may not read is refused.
    @Test func aMovedFileAnotherUserOwnsIsCopiedInAsTheStoresOwn() async throws {
        let c = BadInputCase(id: "foreign-move", area: "file", setup: [["as-nobody"]], command: [], exit: 0, code: "", names: [])
        let p = try await BadInputProject(c)
        for (name, mode) in [("open.bin", "644"), ("locked.bin", "000")] {
            try p.project.write(name, "root's bytes")
            try p.expectOK(try runProcess("/bin/chown", ["root:root", p.project.path(name)]), "chown")
            try p.expectOK(try runProcess("/bin/chmod", [mode, p.project.path(name)]), "chmod")
        }
        let moved = try await offload {
            try p.outbox(["enqueue", "file.move", "--id", "m", "--vars", #"{"path": "open.bin", "name": "m"}"#])
        }
        #expect(moved.exitCode == 0, "\(moved)")
        #expect(!p.project.exists("open.bin"), "the name was taken away")
        let bodies = try FileManager.default.contentsOfDirectory(atPath: p.project.path(".outbox/bodies"))
        for name in bodies {
            let attributes = try FileManager.default.attributesOfItem(atPath: p.project.path(".outbox/bodies/" + name))
            #expect(attributes[.ownerAccountName] as? String == "nobody", "\(name): \(attributes)")
            #expect((attributes[.posixPermissions] as? Int) == 0o600, "\(name): \(attributes)")
        }
        let locked = try await offload {
            try p.outbox(["enqueue", "file.move", "--id", "l", "--vars", #"{"path": "locked.bin", "name": "l"}"#])
        }
        #expect(locked.exitCode == 66, "\(locked)")
        #expect(p.project.exists("locked.bin"), "left where it was")
    }

    @Test func aStagedBodyTheRunnerMayNotReadSettlesErrorKindFile() async throws {
        let c = BadInputCase(id: "foreign-body", area: "store", setup: [["as-nobody"]], command: [], exit: 0, code: "", names: [])
        let p = try await BadInputProject(c)
        try p.expectOK(try await offload { try p.outbox(["cancel", "seed"]) }, "cancel")
        // The fixture's one staged body, seed-file's (read without touching the store as root).
        let bodies = try FileManager.default.contentsOfDirectory(atPath: p.project.path(".outbox/bodies"))
        #expect(bodies.count == 1, "\(bodies)")
        let body = p.project.path(".outbox/bodies/" + (bodies.first ?? ""))
        try p.expectOK(try runProcess("/bin/chown", ["root:root", body]), "chown")
        let run = try await offload { try p.outbox(["run", "--drain"]) }
        #expect(run.exitCode == 1, "the entry settles error: \(run)")
        let list = try await offload { try p.outbox(["list", "--json"]) }
        #expect(list.stdout.contains(#""state":"error","reason":"file""#), "\(list)")
        let show = try await offload { try p.outbox(["show", "seed-file", "--json"]) }
        #expect(show.stdout.contains("cannot open \(body): Permission denied"), "\(show)")
        #expect(show.stdout.contains(#""attempts":0"#), "nothing was sent: \(show)")
    }

    /// The same for an entry sent in parts: it settles as a whole, not a part retried until it expires.
    @Test func aStagedBodyTheRunnerMayNotReadSettlesAChunkedEntryErrorKindFile() async throws {
        let c = BadInputCase(id: "foreign-parts", area: "store", setup: [["as-nobody"]], command: [], exit: 0, code: "", names: [])
        let p = try await BadInputProject(c)
        try p.expectOK(try await offload { try p.outbox(["cancel", "--all"]) }, "cancel")
        try p.project.write(
            "definitions/chunks.yaml",
            "key: chunks\nrequest:\n  method: PUT\n  file: \"{{ vars.path }}\"\n  ownership: copy\n"
                + "  parts:\n    plan: { min: 1KiB, max: 1KiB }\n    url: \"http://127.0.0.1:9/in/{{ part.number }}\"\n")
        try p.expectOK(try runProcess("/bin/chmod", ["644", p.project.path("definitions/chunks.yaml")]), "chmod")
        try p.expectOK(
            try await offload { try p.outbox(["enqueue", "chunks", "--id", "c", "--vars", #"{"path": "seed.bin"}"#]) }, "enqueue")
        let bodies = try FileManager.default.contentsOfDirectory(atPath: p.project.path(".outbox/bodies"))
        #expect(bodies.count == 1, "\(bodies)")
        try p.expectOK(try runProcess("/bin/chown", ["root:root", p.project.path(".outbox/bodies/" + (bodies.first ?? ""))]), "chown")
        let run = try await offload { try p.outbox(["run", "--drain", "--json"]) }
        #expect(run.exitCode == 1, "the entry settles error: \(run)")
        #expect(run.stdout.contains(#""attempts":0"#), "no part went out: \(run)")
        let list = try await offload { try p.outbox(["list", "--json"]) }
        #expect(list.stdout.contains(#""state":"error","reason":"file""#), "\(list)")
    }
}
