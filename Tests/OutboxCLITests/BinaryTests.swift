import Foundation
import OutboxModel
import Testing
import TestSupport

private func outboxExecutable() -> String { builtExecutable("outbox") }

struct BinaryTests {
    @Test func theBinaryIsBuilt() {
        #expect(FileManager.default.isExecutableFile(atPath: outboxExecutable()), "\(outboxExecutable())")
    }

    @Test func enqueuePrintsTheIdAndExits0() async throws {
        let p = try CLIProject()
        let r = try await p.outbox(["enqueue", "note", "--vars", #"{"n": 1}"#, "--id", "bin-1"])
        #expect(r.status == 0, "\(r.err)")
        #expect(r.out == "bin-1\n")
        #expect(r.err.isEmpty)
        let list = try await p.outbox(["list", "--json"])
        #expect(list.status == 0)
        let rows = try JSON.parse(list.out)
        #expect(rows.arrayValue?.map { $0["id"] } == [.string("bin-1")])
        let uuid = try await p.outbox(["enqueue", "plain"])
        #expect(uuid.status == 0)
        #expect(uuid.out.utf8.count == 37)
    }

    /// A plugin runs in a process group of its own, which a terminal's Ctrl-C never reaches:
    /// an `enqueue` ended by a signal takes it along, and stores nothing. The plugin would run
    /// for an hour: a test held up by a busy machine still signals while it runs (with the
    /// default 30 s timeout, a full parallel suite once signalled after the timeout had ended it).
    @Test(arguments: [SIGTERM, SIGINT, SIGHUP])
    func anEnqueueEndedByASignalLeavesNoPluginRunning(_ signal: Int32) async throws {
        let p = try CLIProject()
        _ = try p.write("config/outbox.yaml", (p.read("config/outbox.yaml") ?? "") + "plugins: { timeout: 1h }\n")
        _ = try p.write("plugins/slow.sh", "#!/bin/sh\necho $$ > plugins/slow.pid\nexec sleep 3600\n", mode: 0o755)
        _ = try p.write("definitions/cmd.yaml", "key: cmd\nrequest_command: [plugins/slow.sh]\n")
        let enqueue = try p.start(["enqueue", "cmd", "--id", "c1"])
        await eventually("the plugin to start") { p.read("plugins/slow.pid")?.hasSuffix("\n") == true }
        let plugin = try #require(Int32((p.read("plugins/slow.pid") ?? "").trimmingCharacters(in: .whitespacesAndNewlines)))
        enqueue.signal(signal)
        let ended = await enqueue.wait()
        #expect(ended.exitCode == -signal, "ended by the signal, as without a plugin: \(ended)")
        // Gone, or a zombie its new parent has yet to reap.
        await eventually("the plugin to be stopped") {
            let stat = (try? String(contentsOfFile: "/proc/\(plugin)/stat", encoding: .utf8)) ?? ""
            return stat.isEmpty || stat.contains(") Z ")
        }
        if p.storeExists { #expect(try p.sqlite("SELECT COUNT(*) FROM entries") == "0\n") }
    }

    /// Exit 0 means stored, whenever a stop signal comes: until the transaction commits the
    /// signal ends the enqueue with nothing stored; from the commit on it is only recorded,
    /// and the enqueue finishes, prints the id and exits 0. Each process is held at one point
    /// until the kernel has handed it the signal.
    @Test(arguments: [SIGTERM, SIGINT, SIGHUP, SIGQUIT])
    func aStopSignalNeverLeavesAnEntryStoredBehindAFailedStatus(_ signal: Int32) async throws {
        let p = try CLIProject()
        func signalledWhileHeld(at point: String, id: String) async throws -> RunningProcess {
            let go = p.root + "/go-" + id
            let enqueue = try p.start(
                ["enqueue", "note", "--vars", #"{"n": 1}"#, "--id", id], environment: ["OUTBOX_FAULT_HOLD": "\(point):\(go)"])
            await eventually("the enqueue to reach \(point)") { FileManager.default.fileExists(atPath: go + ".reached") }
            enqueue.signal(signal)
            await eventually("the signal to be delivered") { !enqueue.hasPending(signal) }
            _ = FileManager.default.createFile(atPath: go, contents: nil)
            return enqueue
        }
        // In the transaction, before its commit: nothing is stored.
        let early = try await signalledWhileHeld(at: "enqueue.batch-written", id: "early")
        #expect(await early.wait().exitCode == -signal)
        // At the commit: stored, and the status says so.
        let late = try await signalledWhileHeld(at: "enqueue.committing", id: "late")
        let ended = await late.wait()
        #expect(ended.exitCode == 0, "\(ended)")
        #expect(ended.stdout == "late\n")
        #expect(try p.sqlite("SELECT id FROM entries") == "late\n")
    }

    /// A SIGHUP that reaches `run` while it still opens the store is a reload request, as once it
    /// runs: the drain goes on and ends 0 (it ended the process before).
    @Test func aReloadWhileRunStartsDoesNotEndIt() async throws {
        let p = try CLIProject()
        #expect(!p.storeExists, "the run makes the store, and is held there")
        let go = p.root + "/go"
        let run = try p.start(["run", "--drain", "--json"], environment: ["OUTBOX_FAULT_HOLD": "store.make-folder:\(go)"])
        await eventually("the run to open the store") { FileManager.default.fileExists(atPath: go + ".reached") }
        run.signal(SIGHUP)
        await eventually("the signal to be delivered") { !run.hasPending(SIGHUP) }
        p.touch("go")
        let ended = await run.wait(timeout: 120)
        #expect(ended.exitCode == 0, "\(ended)")
        #expect(ended.stdout.contains(#""completed":0"#), "\(ended.stdout)")
    }

    /// A stop signal while a body is copied into the store, or once it is, ends the enqueue
    /// with nothing stored and no copy left in the store (a large temporary file, or the
    /// copy, stayed there, and `audit` called it damage until the next run). The copy is
    /// given up between chunks as the signal is seen; held after it, the test makes sure.
    @Test(arguments: [SIGTERM, SIGINT])
    func aStopDuringACopyLeavesNothingInTheStore(_ signal: Int32) async throws {
        let p = try CLIProject()
        _ = try p.write("big.bin", String(repeating: "0123456789abcdef", count: 65_536))
        _ = try p.write(
            "definitions/c.yaml", "key: c\nrequest:\n  url: http://127.0.0.1:9/x\n  file: big.bin\n  ownership: copy\n")
        let go = p.root + "/go"
        let enqueue = try p.start(["enqueue", "c"], environment: ["OUTBOX_FAULT_HOLD": "enqueue.copied:\(go)"])
        await eventually("the enqueue to copy the file") { FileManager.default.fileExists(atPath: go + ".reached") }
        enqueue.signal(signal)
        await eventually("the signal to be delivered") { !enqueue.hasPending(signal) }
        p.touch("go")
        let ended = await enqueue.wait(timeout: 120)
        #expect(ended.exitCode == -signal, "\(ended)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: p.storeFolder + "/bodies") == [])
        #expect(try p.sqlite("SELECT COUNT(*) FROM entries") == "0\n")
        #expect(p.run("audit").status == 0)
        #expect(FileManager.default.fileExists(atPath: p.path("big.bin")), "the user's file is untouched")
    }

    /// Stored entries whose ids nobody reads: a stop signal then ends the wait for the reader.
    /// The status says the entries are stored and the ids lost (74), and nothing is undone.
    @Test func aStopEndsAnEnqueueWhoseIdsNobodyReads() async throws {
        let p = try CLIProject()
        // 3,000 ids of 37 bytes: more than a pipe holds (64 KiB).
        _ = try p.write("lines.jsonl", (0..<3_000).map { "{\"vars\": {\"n\": \($0)}}\n" }.joined())
        let fifo = p.root + "/out.fifo"
        #expect(mkfifo(fifo, 0o600) == 0)
        // Held open and never read.
        let held = open(fifo, O_RDWR | O_CLOEXEC)
        #expect(held >= 0)
        defer { close(held) }
        let enqueue = try RunningProcess(
            executable: "/bin/sh", arguments: ["-c", #"exec "$0" enqueue note --from lines.jsonl > out.fifo"#, p.executable],
            cwd: p.root, environment: p.processEnvironment())
        await eventually("the pipe to be full") {
            var end = pollfd(fd: held, events: Int16(POLLOUT), revents: 0)
            return poll(&end, 1, 0) == 0
        }
        // The ids are written after the commit only.
        #expect(try p.sqlite("SELECT COUNT(*) FROM entries") == "3000\n")
        enqueue.signal(SIGTERM)
        let ended = await enqueue.wait()
        #expect(!ended.timedOut)
        #expect(ended.exitCode == 74, "\(ended)")
        #expect(
            ended.stderr
                == "outbox: E_STORAGE: the command ran, but what it wrote to stdout was lost: its reader stopped reading, and the command was asked to stop\n"
        )
        #expect(try p.sqlite("SELECT COUNT(*) FROM entries") == "3000\n")
    }

    @Test func anErrorPrintsItsCodeOnStderrAndExits65() async throws {
        let p = try CLIProject()
        let r = try await p.outbox(["enqueue", "dynamic", "--vars", #"{"url": "gopher://x"}"#])
        #expect(r.status == 65)
        #expect(r.out.isEmpty)
        #expect(r.err == "outbox: E_INVALID: request.url: scheme \"gopher\" is not allowed (http or https only)\n")
        #expect(!p.storeExists)
    }

    /// Output that never reached stdout fails the call (74), so a script does not take a
    /// cut-off `list --json` for all of it; a reader that stopped early (`| head`) does not.
    @Test func outputLostOnTheWayToStdoutFailsTheCall() async throws {
        let p = try CLIProject()
        // 200 entries of 1 KiB vars: `list --json` is more than a pipe holds, so `head` stops it.
        _ = try p.write("definitions/pad.yaml", "key: pad\nrequest:\n  url: https://x.example/\n")
        let pad = String(repeating: "x", count: 1024)
        _ = try p.write("pad.jsonl", (0..<200).map { "{\"vars\": {\"n\": \($0), \"pad\": \"\(pad)\"}}\n" }.joined())
        #expect(try await p.outbox(["enqueue", "pad", "--from", "pad.jsonl"]).status == 0)
        func shell(_ line: String) throws -> CommandResult {
            try runProcess("/bin/sh", ["-c", line, p.executable], cwd: p.root, environment: p.processEnvironment())
        }
        let full = try shell(#"exec "$0" list --json > /dev/full"#)
        #expect(full.exitCode == 74)
        #expect(full.stderr == "outbox: E_STORAGE: the command ran, but what it wrote to stdout was lost: No space left on device\n")
        let closed = try shell(#"exec "$0" list >&-"#)
        #expect(closed.exitCode == 74)
        #expect(closed.stderr.hasSuffix("was lost: Bad file descriptor\n"), "\(closed.stderr)")
        let version = try shell(#"exec "$0" --version > /dev/full"#)
        #expect(version.exitCode == 74)
        // A call that failed keeps its own status; its JSON error document was lost as well.
        let failed = try shell(#"exec "$0" show no-such-id --json > /dev/full"#)
        #expect(failed.exitCode == 65)
        #expect(failed.stderr == "outbox: E_STORAGE: what the command wrote to stdout was lost too: No space left on device\n")
        // outbox's own status is written to a file: the pipeline's is head's.
        let piped = try shell(#"("$0" list --json 2> err.txt; echo $? > piped.txt) | head -c 10 > /dev/null"#)
        #expect(piped.exitCode == 0)
        #expect(try String(contentsOfFile: p.root + "/piped.txt", encoding: .utf8) == "0\n")
        #expect(try String(contentsOfFile: p.root + "/err.txt", encoding: .utf8) == "")
        let rows = try await p.outbox(["list", "--json"])
        #expect(try JSON.parse(rows.out).arrayValue?.count == 200, "nothing changed")
    }

    /// A runner whose events cannot be written says so at the first lost line, not only when
    /// the run ends, and its deliveries go on.
    @Test func eventsLostOnTheWayToStdoutAreReportedAtOnce() async throws {
        let server = try TestHTTPServer()
        let p = try CLIProject()
        _ = try p.write("definitions/ping.yaml", "key: ping\nrequest:\n  url: \(server.baseURL)/status/200\n")
        #expect(try await p.outbox(["enqueue", "ping", "--id", "p1"]).status == 0)
        let run = try runProcess(
            "/bin/sh", ["-c", #"exec "$0" run --drain --events - > /dev/full"#, p.executable], cwd: p.root,
            environment: p.processEnvironment())
        #expect(run.exitCode == 74)
        let lines = run.stderr.split(separator: "\n").map(String.init)
        let warning = lines.firstIndex { $0.contains("events to stdout are being lost (No space left on device)") }
        let summary = lines.firstIndex { $0.contains("1 completed") }
        #expect(warning != nil && summary != nil && warning! < summary!, "\(run.stderr)")
        #expect(lines.filter { $0.contains("are being lost") }.count == 1)
        #expect(lines.last == "outbox: E_STORAGE: the command ran, but what it wrote to stdout was lost: No space left on device")
        #expect(server.requests(path: "/status/200").count == 1)
    }

    @Test func withJSONTheErrorDocumentGoesToStdout() async throws {
        let p = try CLIProject()
        let r = try await p.outbox(["enqueue", "plain", "--id", "a b", "--json"])
        #expect(r.status == 65)
        #expect(r.err.isEmpty)
        let doc = try JSON.parse(r.out)
        #expect(
            doc
                == .object([
                    (
                        "error",
                        .object([
                            ("code", .string("E_INVALID")),
                            ("message", .string(#"id "a b" contains " " (allowed: A-Z a-z 0-9 . _ : @ -)"#)),
                        ])
                    )
                ]))
    }

    @Test func usageAndConfigErrorsUseTheirExitCodes() async throws {
        let p = try CLIProject()
        #expect(try await p.outbox(["frobnicate"]).status == 64)
        try p.write("definitions/broken.yaml", "key: broken\nrequest:\n  url: https://x.example/\n  bogus: 1\n")
        let broken = try await p.outbox(["enqueue", "broken"])
        #expect(broken.status == 78)
        #expect(broken.err.hasPrefix("\(p.root)/definitions/broken.yaml:4:3: error: unknown field \"bogus\" in request"))
        #expect(broken.err.hasSuffix("\n  bogus: 1\n  ^\noutbox: E_CONFIG: 1 error\n"))
        let version = try await p.outbox(["--version"], cwd: "/")
        #expect(version.status == 0)
        #expect(version.out == "outbox 0.1.0\n")
        // With --json, either side: the one JSON document --json promises.
        for args in [["--json", "--version"], ["--version", "--json"]] {
            let json = try await p.outbox(args, cwd: "/")
            #expect(json.status == 0 && json.out == "{\"version\":\"0.1.0\"}\n", "\(args): \(json.out)")
        }
    }

    /// A closed stdin is not empty input: `--from -` and `--vars -` cannot read it (66), and
    /// nothing is stored.
    @Test func aClosedStdinCannotBeRead() async throws {
        let p = try CLIProject()
        func shell(_ line: String) throws -> CommandResult {
            try runProcess("/bin/sh", ["-c", line, p.executable], cwd: p.root, environment: p.processEnvironment())
        }
        let from = try shell(#"exec "$0" enqueue note --from - <&-"#)
        #expect(from.exitCode == 66)
        #expect(from.stderr == "outbox: E_FILE_MISSING: --from: cannot read stdin: Bad file descriptor\n", "\(from.stderr)")
        let vars = try shell(#"exec "$0" enqueue note --vars - <&-"#)
        #expect(vars.exitCode == 66)
        #expect(vars.stderr == "outbox: E_FILE_MISSING: --vars -: cannot read stdin: Bad file descriptor\n", "\(vars.stderr)")
        #expect(try p.rows().isEmpty)
    }

    /// Arguments that are not UTF-8 are refused, naming the option, never repaired into
    /// other text or another file's name; the store is untouched.
    @Test func argumentsThatAreNotUTF8AreRefused() async throws {
        let p = try CLIProject()
        func shell(_ line: String) throws -> CommandResult {
            try runProcess("/bin/sh", ["-c", line, p.executable], cwd: p.root, environment: p.processEnvironment())
        }
        let vars = try shell(#"exec "$0" enqueue note --vars "$(printf '{"n": "a\377b"}')""#)
        #expect(vars.exitCode == 65)
        #expect(vars.stderr == "outbox: E_INVALID: --vars is not valid UTF-8 (at byte 9): outbox takes text and file names in UTF-8\n")
        let inline = try shell(#"exec "$0" enqueue note "--vars=$(printf '{"n": "a\377b"}')" --json"#)
        #expect(inline.exitCode == 65)
        #expect(inline.stdout.contains(#""message":"--vars is not valid UTF-8 (at byte 16)"#), "\(inline.stdout)")
        let header = try shell(#"exec "$0" headers update "$(printf 'X-A: a\377b')""#)
        #expect(header.exitCode == 65)
        #expect(header.stderr.hasPrefix("outbox: E_INVALID: argument 3 is not valid UTF-8 (at byte 7)"))
        #expect(!p.storeExists)
    }

    /// `--json` is global: every command takes it, before or after its name, and a usage
    /// error then comes as the JSON document too.
    @Test func jsonIsAcceptedByEveryCommand() async throws {
        let p = try CLIProject()
        let writing = [["pause"], ["resume"], ["wifi-only", "off"], ["headers", "update", "X-A: 1"], ["schema", "config"]]
        for command in writing {
            #expect(try await p.outbox(["--json"] + command).status == 0, "\(command)")
            #expect(try await p.outbox(command + ["--json"]).status == 0, "\(command)")
        }
        for words in [["--json", "frob"], ["frob", "--json"], ["headers", "--json"], ["--json"]] {
            let r = try await p.outbox(words)
            #expect(r.status == 64, "\(words)")
            #expect(r.err.isEmpty, "\(words): \(r.err)")
            #expect(try JSON.parse(r.out)["error"]?["code"] == .string("E_USAGE"), "\(words): \(r.out)")
        }
    }

    /// A flag, like an option, is given once.
    @Test func aFlagGivenTwiceIsAUsageError() async throws {
        let p = try CLIProject()
        let r = try await p.outbox(["run", "--drain", "--drain"])
        #expect(r.status == 64)
        #expect(r.err == "outbox: E_USAGE: --drain is given twice\n")
        #expect(try await p.outbox(["list", "--quiet"]).status == 64, "not an option of list")
        #expect(try await p.outbox(["--json", "list", "--json"]).status == 0, "a global flag before and after")
        for twice in [["list", "--json", "--json"], ["--json", "--json", "list"], ["show", "x", "--json", "--json"]] {
            let r = try await p.outbox(twice)
            #expect(r.status == 64, "\(twice): \(r)")
            #expect(try JSON.parse(r.out)["error"]?["message"] == .string("--json is given twice"), "\(twice): \(r.out)")
        }
    }

    /// A process whose folder was removed has no current folder: no command that finds the
    /// project or resolves a path runs (it used to take `/` for it, and `init` wrote there).
    @Test func aRemovedCurrentFolderIsRefusedNotTakenForTheRoot() async throws {
        let p = try CLIProject()
        let gone = p.root + "/gone"
        for args in [["init"], ["list"], ["enqueue", "plain"], ["--config", p.root + "/config/outbox.yaml", "list"], ["--version"]] {
            let script = "mkdir \"$1\" && cd \"$1\" && rmdir \"$1\" && shift && exec \"$@\""
            let r = try await offload {
                try runProcess(
                    "/bin/sh", ["-c", script, "sh", gone, outboxExecutable()] + args, cwd: p.root, environment: p.processEnvironment())
            }
            if args == ["--version"] {
                #expect(r.status == 0, "\(r)")
                continue
            }
            #expect(r.status == 66, "\(args): \(r)")
            #expect(
                r.err
                    == "outbox: E_FILE_MISSING: the current folder no longer exists (or cannot be read): cd to a folder that does, and run it again\n",
                "\(args): \(r.err)")
        }
        #expect(!Paths.exists("/config/outbox.yaml"), "init wrote nothing at the root")
        #expect(!Paths.exists(gone))
        #expect(!p.storeExists)
    }

    /// A group (`headers`, `store`) has help of its own; a call without a command or with an
    /// option before it says what is wrong in the usual one line.
    @Test func groupsAndMissingCommandsAreExplained() async throws {
        let p = try CLIProject()
        let help = try await p.outbox(["headers", "--help"])
        #expect(help.status == 0)
        #expect(help.out.contains("  headers update  "))
        #expect(!help.out.contains("  enqueue"))
        #expect(help.out.contains("Usage: outbox headers COMMAND [options]"), "\(help.out)")
        let bare = try await p.outbox(["store"])
        #expect(bare.status == 64)
        #expect(bare.err == "outbox: E_USAGE: store needs a command: outbox store copy\n")
        let unknown = try await p.outbox(["store", "paste"])
        #expect(unknown.status == 64)
        #expect(unknown.err == "outbox: E_USAGE: unknown command \"store paste\"; store needs a command: outbox store copy\n")
        let none = try await p.outbox([])
        #expect(none.status == 64)
        #expect(none.out.contains("Commands:"))
        #expect(none.err == "outbox: E_USAGE: no command given (see outbox --help)\n")
        let option = try await p.outbox(["--frob"])
        #expect(option.err == "outbox: E_USAGE: unknown option --frob before the command (see outbox --help)\n")
    }
}
