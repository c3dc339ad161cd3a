import Foundation
import OutboxModel
import TestSupport
import Testing

/// A shell the completion tests need; missing, the test fails (the setup installs them).
func requiredTool(_ path: String, package: String) -> String? {
    if FileManager.default.isExecutableFile(atPath: path) { return path }
    Issue.record("\(path) is missing (Debian's \(package) package; .ci/setup installs it with OUTBOX_SETUP_TESTS=1)")
    return nil
}

/// The completion scripts complete commands, options, and the keys and ids of the project in
/// the current folder, by calling back into the binary.
struct CompletionTests {
    /// A project with two keys and three entries, and each shell's script written beside it.
    static func project(function: String = #function) throws -> CLIProject {
        let p = try CLIProject(function: function)
        try p.enqueue("note", vars: #"{"n": 1}"#, id: "first-1")
        try p.enqueue("note", vars: #"{"n": 2}"#, id: "second-2")
        try p.enqueue("plain", vars: "{}", id: "plain-3")
        try p.enqueue("plain", vars: "{}", id: "job:7")
        for shell in ["bash", "zsh", "fish"] {
            let r = p.run(["completion", shell])
            guard r.status == 0 else { throw CLITestFailure("completion \(shell): \(r)") }
            try r.stdout.write(toFile: p.base + "/outbox." + shell, atomically: true, encoding: .utf8)
        }
        return p
    }

    /// The environment of a shell: the built binary first on PATH, as `outbox`.
    static func shellEnvironment(_ p: TestProject) -> [String: String] {
        let bin = (builtExecutable("outbox") as NSString).deletingLastPathComponent
        return p.processEnvironment(["PATH": bin + ":/usr/local/bin:/usr/bin:/bin"])
    }

    /// What bash's completion function offers for `words`, the last being completed.
    static func bashComplete(_ p: TestProject, _ words: [String], cwd: String? = nil) throws -> CommandResult {
        let quoted = words.map { "'" + $0 + "'" }.joined(separator: " ")
        let script = """
            source "$1" || exit 9
            COMP_WORDS=(\(quoted)); COMP_CWORD=\(words.count - 1)
            _outbox
            [ "${#COMPREPLY[@]}" -eq 0 ] || printf '%s\\n' "${COMPREPLY[@]}"
            """
        return try runProcess(
            "/bin/bash", ["-c", script, "bash", p.base + "/outbox.bash"], cwd: cwd ?? p.root, environment: shellEnvironment(p))
    }

    static let keys = ["dynamic", "file.copy", "note", "plain", "upload"]
    static let ids = ["first-1", "job:7", "plain-3", "second-2"]

    @Test(arguments: ["bash", "zsh", "fish"])
    func everyCommandAndItsOptionsAreOffered(_ shell: String) throws {
        let p = try CLIProject()
        let r = p.run("completion", shell)
        #expect(r.status == 0, "\(r)")
        for word in ["enqueue", "simulate", "retry", "--from", "--log-format"] {
            #expect(r.out.contains(shell == "fish" && word.hasPrefix("--") ? "-l \(word.dropFirst(2))" : word), "\(shell): \(word)")
        }
        if shell == "bash" {
            let script = try p.write("completion.bash", r.out)
            #expect(try runProcess("/bin/bash", ["-n", script]).exitCode == 0, "the bash script parses")
        }
    }

    @Test func anUnknownShellIsAUsageError() throws {
        let p = try CLIProject()
        let r = p.run("completion", "tcsh")
        #expect(r.status == 64)
        #expect(r.err.contains("completion takes bash, zsh or fish"))
    }

    @Test func bashCompletesKeysIdsOptionsAndCommands() throws {
        let p = try Self.project()
        let commands = Set(try Self.bashComplete(p, ["outbox", ""]).lines)
        #expect(commands.isSuperset(of: ["init", "enqueue", "show", "man", "headers", "completion"]), "\(commands)")
        let cases: [(words: [String], expected: [String])] = [
            (["outbox", "show", ""], Self.ids),
            (["outbox", "explain", "s"], ["second-2"]),
            // Bash splits job:7 at the colon, and readline replaces only the part after it.
            (["outbox", "show", "jo"], ["job:7"]),
            (["outbox", "show", "job", ":", ""], ["7"]),
            (["outbox", "cancel", "job", ":", "7"], ["7"]),
            (["outbox", "list", "--id", "job", ":", ""], ["7"]),
            (["outbox", "cancel", "first-1", ""], Self.ids),
            (["outbox", "retry", ""], Self.ids),
            (["outbox", "list", "--id", ""], Self.ids),
            (["outbox", "list", "--id", "=", ""], Self.ids),
            (["outbox", "enqueue", "note", "--id", "p"], ["plain-3"]),
            (["outbox", "enqueue", ""], Self.keys),
            (["outbox", "simulate", "p"], ["plain"]),
            (["outbox", "render", ""], Self.keys),
            (["outbox", "list", "--key", ""], Self.keys),
            (["outbox", "pause", "--key", "n"], ["note"]),
            (["outbox", "resume", "--key", "=", ""], Self.keys),
            (["outbox", "--config", "config/outbox.yaml", "enqueue", ""], Self.keys),
            (["outbox", "--json", "show", "f"], ["first-1"]),
            (["outbox", "run", "--progress", ""], ["always", "auto", "never"]),
            (["outbox", "list", "--state", "aw"], ["awaiting-auth"]),
            (["outbox", "wifi-only", ""], ["off", "on"]),
            (["outbox", "completion", ""], ["bash", "fish", "zsh"]),
            (["outbox", "headers", ""], ["update"]),
            (["outbox", "show", "--"], ["--config", "--help", "--json"]),
            (["outbox", "run", "--concurrency", ""], []),
            (["outbox", "init", ""], []),
        ]
        for (words, expected) in cases {
            let r = try Self.bashComplete(p, words)
            #expect(r.exitCode == 0 && r.stderr.isEmpty, "\(words): \(r)")
            #expect(r.lines.sorted() == expected, "\(words): \(r)")
        }
        // The way back into the binary is documented, so offered.
        #expect(try Self.bashComplete(p, ["outbox", "completion", "--"]).stdout.contains("--list"))
    }

    @Test func bashOffersNothingAndPrintsNothingOutsideAProject() throws {
        let p = try Self.project()
        for words in [["outbox", "show", ""], ["outbox", "enqueue", ""]] {
            let r = try Self.bashComplete(p, words, cwd: p.base + "/home")
            #expect(r.exitCode == 0, "\(r)")
            #expect(r.stdout.isEmpty && r.stderr.isEmpty, "\(words): \(r)")
        }
    }

    @Test func zshAndFishScriptsParse() throws {
        let p = try Self.project()
        if let zsh = requiredTool("/usr/bin/zsh", package: "zsh") {
            let parsed = try runProcess(zsh, ["-n", p.base + "/outbox.zsh"], environment: Self.shellEnvironment(p))
            #expect(parsed.exitCode == 0 && parsed.stderr.isEmpty, "zsh -n: \(parsed)")
            // Sourced after compinit, as `source <(outbox completion zsh)` in .zshrc does.
            let sourced = try runProcess(
                zsh,
                [
                    "-f", "-c", "autoload -Uz compinit && compinit -u -D && source \"$1\" && print -r -- $_comps[outbox]", "zsh",
                    p.base + "/outbox.zsh",
                ], cwd: p.root, environment: Self.shellEnvironment(p))
            #expect(sourced.exitCode == 0 && sourced.stderr.isEmpty, "zsh source: \(sourced)")
            #expect(sourced.lines == ["_outbox"], "\(sourced)")
        }
        if let fish = requiredTool("/usr/bin/fish", package: "fish") {
            let parsed = try runProcess(fish, ["--no-execute", p.base + "/outbox.fish"], environment: Self.shellEnvironment(p))
            #expect(parsed.exitCode == 0 && parsed.stderr.isEmpty, "fish --no-execute: \(parsed)")
            // fish can also complete a command line on request: the script's answers, for real.
            func complete(_ line: String) throws -> [String] {
                let r = try runProcess(
                    fish, ["--no-config", "-c", "source $argv[1]; complete -C $argv[2]", p.base + "/outbox.fish", line], cwd: p.root,
                    environment: Self.shellEnvironment(p))
                #expect(r.exitCode == 0 && r.stderr.isEmpty, "fish \(line): \(r)")
                return r.lines.map { String($0.split(separator: "\t", maxSplits: 1).first ?? "") }.sorted()
            }
            #expect(try complete("outbox show ") == Self.ids)
            #expect(try complete("outbox enqueue ") == Self.keys)
            #expect(try complete("outbox list --key ") == Self.keys)
            #expect(try complete("outbox run --log-format ") == ["json", "text"])
            #expect(try complete("outbox headers ") == ["update"])
            #expect(try complete("outbox ma") == ["man"])
        }
    }

    @Test func listPrintsKeysAndRecentIds() throws {
        let p = try Self.project()
        let keys = p.run(["completion", "--list", "keys"])
        #expect(keys.status == 0 && keys.lines == Self.keys, "\(keys)")
        let logFiles = [".outbox/outbox.db-wal", ".outbox/outbox.db-shm"]
        // The last command left its log for the next one; sqlite3, closing last, folds it back and removes it.
        _ = try p.sqlite("PRAGMA wal_checkpoint(TRUNCATE)")
        #expect(!logFiles.contains(where: p.exists), "no process has the store open")
        let ids = p.run(["completion", "--list", "ids"])
        // Newest first.
        #expect(ids.status == 0 && ids.lines == ["job:7", "plain-3", "second-2", "first-1"], "\(ids)")
        // Read as a file: no -wal or -shm made (they would belong to whoever pressed tab).
        #expect(!logFiles.contains(where: p.exists))
        #expect(p.run(["completion", "--list", "files"]).status == ErrorCode.usage.exitStatus)
        #expect(p.run(["completion", "--help"]).stdout.contains("--list keys|ids"))
    }

    @Test func listReadsAStoreWhosePathNeedsEscaping() throws {
        // The store is opened through a file: URI, where ?, # and % mean something.
        let p = try CLIProject(config: CLIProject.config + "store: \"odd ?#%20 folder/.outbox\"\n")
        try p.enqueue("plain", vars: "{}", id: "odd-1")
        #expect(p.exists("odd ?#%20 folder/.outbox/outbox.db"))
        let ids = p.run(["completion", "--list", "ids"])
        #expect(ids.status == 0 && ids.lines == ["odd-1"], "\(ids)")
    }

    @Test func listReadsAStoreARunnerHasOpen() async throws {
        let p = try CLIProject()
        try p.enqueue("plain", vars: "{}", id: "later-1")
        #expect(p.run(["enqueue", "plain", "--vars", "{}", "--id", "later-2", "--delay", "1h"]).status == 0)
        #expect(p.run(["cancel", "later-1"]).status == 0)
        let runner = try p.start(["run"])
        await eventually("the runner holds the store") { p.exists(".outbox/outbox.db-wal") }
        let ids = try await p.outbox(["completion", "--list", "ids"])
        #expect(ids.exitCode == 0 && ids.stderr.isEmpty, "\(ids)")
        #expect(ids.lines.contains("later-2"), "\(ids)")
        runner.signal(SIGTERM)
        let stopped = await runner.wait()
        #expect(stopped.exitCode == 0, "\(stopped)")
    }

    @Test func listPrintsNothingWithoutAProjectOrAStore() async throws {
        let p = try TestProject(config: nil)
        for what in ["keys", "ids"] {
            let r = try await p.outbox(["completion", "--list", what])
            #expect(r.exitCode == 0 && r.stdout.isEmpty && r.stderr.isEmpty, "\(what): \(r)")
        }
        // A project whose store was never made: nothing, and still no store.
        try p.writeConfig("")
        try p.define("k", "key: k\nrequest:\n  url: https://example.com/k\n")
        let ids = try await p.outbox(["completion", "--list", "ids"])
        #expect(ids.exitCode == 0 && ids.stdout.isEmpty && ids.stderr.isEmpty, "\(ids)")
        #expect(!p.storeExists)
        // A broken config: nothing either, rather than an error in the prompt.
        try p.writeConfig("concurrency: [\n")
        let broken = try await p.outbox(["completion", "--list", "keys"])
        #expect(broken.exitCode == 0 && broken.stdout.isEmpty && broken.stderr.isEmpty, "\(broken)")
    }
}
