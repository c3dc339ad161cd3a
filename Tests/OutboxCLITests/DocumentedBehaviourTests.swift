import Foundation
import OutboxModel
import Testing
import TestSupport

/// What the docs say the commands do, taken at their word: help, `show`'s fields, what
/// `check` refuses, and the fields a definition may give as a template.
struct DocumentedBehaviourTests {
    @Test func helpOfAnUnknownCommandIsAUsageError() throws {
        let p = try CLIProject()
        let r = p.run("help", "nosuch")
        #expect(r.status == 64, "\(r)")
        #expect(r.err.contains("E_USAGE: unknown command \"nosuch\""))
        #expect(p.run("help", "headers").status == 0, "a group lists its commands")
        // A two-word command quoted as one word is the same command.
        let quoted = p.run("help", "store copy")
        #expect(quoted.status == 0, "\(quoted)")
        #expect(quoted.out == p.run("help", "store", "copy").out)
        #expect(p.run("help", "store nosuch").status == 64)
        #expect(p.run("help", "store copy", "--json").status == 0)
        // A word past the command is not ignored: it names no command.
        for words in [["store", "copy", "extra"], ["enqueue", "extra"]] {
            let extra = p.run(["help"] + words)
            #expect(extra.status == 64, "\(words): \(extra)")
            #expect(extra.err.contains("unknown command \"\(words.joined(separator: " "))\""), "\(extra)")
        }
    }

    @Test(arguments: [["pause"], ["resume"], ["headers", "update"], ["wifi-only"], ["list"]])
    func helpNamesJSON(_ command: [String]) throws {
        let p = try CLIProject()
        let r = p.run(command + ["--help"])
        #expect(r.status == 0)
        #expect(r.out.components(separatedBy: "--json").count == 2, "once: \(r.out)")
    }

    // Commands that change state print one JSON document with --json, and nothing on stderr.
    @Test func controlCommandsPrintJSON() throws {
        let p = try CLIProject()
        let cases: [([String], String)] = [
            (["pause", "--json"], #"{"queue_paused":true,"paused_keys":[]}"#),
            (["resume", "--json"], #"{"queue_paused":false,"paused_keys":[]}"#),
            (["pause", "--key", "note", "--key", "a.b", "--json"], #"{"queue_paused":false,"paused_keys":["a.b","note"]}"#),
            (["resume", "--key", "a.b", "--json"], #"{"queue_paused":false,"paused_keys":["note"]}"#),
            (["wifi-only", "on", "--json"], #"{"wifi_only":true}"#),
            (["headers", "update", "X-A: b", "X-C: d", "--json"], #"{"header_generation":1,"updated":["X-A","X-C"]}"#),
        ]
        for (command, json) in cases {
            let r = p.run(command)
            #expect(r.status == 0, "\(command): \(r)")
            #expect(r.out == json + "\n", "\(command)")
            #expect(r.err.isEmpty, "\(command): \(r.err)")
        }
    }

    @Test func completionHelpNamesList() throws {
        let r = try CLIProject().run("completion", "--help")
        #expect(r.out.contains("--list keys|ids"), "\(r.out)")
        // `--list` takes no shell name: the usage shows the two calls apart.
        #expect(
            r.out.contains("Usage: outbox completion bash|zsh|fish\n       outbox completion --list keys|ids\n"), "\(r.out)")
    }

    @Test func showHasPartsForAnEntrySentWhole() throws {
        let p = try CLIProject()
        let id = try p.enqueue("plain", vars: "{}")
        let show = try p.run("show", id, "--json").json()
        #expect(show.objectValue?.contains { $0.0 == "parts" } == true)
        #expect(show["parts"] == .null)
    }

    @Test func checkRefusesABadSchemaName() throws {
        let p = try CLIProject(config: "store: postgres://u:p@127.0.0.1:1/db?schema=Bad-Name\n")
        let r = p.run("check")
        #expect(r.status == 78, "\(r)")
        #expect(r.err.contains("schema"))
    }

    @Test func checkRefusesAStoreFolderOfSomeoneElsesFiles() throws {
        let p = try CLIProject(config: "store: other\n")
        try p.write("other/file.txt", "mine")
        let r = p.run("check")
        #expect(r.status == 78, "\(r)")
        #expect(r.err.contains("holds files outbox did not make (file.txt)"))
        #expect(try FileManager.default.contentsOfDirectory(atPath: p.path("other")) == ["file.txt"])
    }

    /// A parts header rendered from the environment is a secret like a request header:
    /// redacted by render and show, and a credential for redirects to another host.
    @Test func aPartsHeaderFromTheEnvironmentIsASecret() throws {
        let p = try CLIProject()
        try p.write(
            "definitions/pr.yaml",
            """
            key: pr
            request:
              method: PUT
              file: "{{ vars.path }}"
              parts:
                plan: { min: 1KiB, max: 2KiB }
                url: "https://files.example.com/p{{ part.number }}"
                headers:
                  X-Token: "{{ env.TOKEN }}"

            """)
        try p.write("data.bin", String(repeating: "d", count: 3000))
        p.environment["TOKEN"] = "PART-SECRET-9"
        let vars = #"{"path": "data.bin"}"#
        let render = p.run("render", "pr", "--vars", vars, "--json")
        #expect(render.status == 0, "\(render)")
        #expect(!render.out.contains("PART-SECRET-9"), "\(render.out)")
        let id = try p.enqueue("pr", vars: vars)
        for args in [["show", id, "--json"], ["show", id]] {
            let r = p.run(args)
            #expect(r.status == 0 && !r.out.contains("PART-SECRET-9"), "\(args): \(r.out)")
        }
        let stored = try p.sqlite("SELECT request FROM entries")
        #expect(stored.contains("\"secret_headers\":[\"authorization\",\"x-token\"]"), "\(stored)")
    }

    /// A source line that gives a credential is shown with its value hidden in the error print.
    @Test func anErrorOnACredentialLineHidesItsValue() throws {
        let p = try CLIProject(config: "headers:\n  Authorization: \"Bearer LINE-SECRET-5 {{ vars.a\"\n")
        let r = p.run("check")
        #expect(r.status == 78, "\(r)")
        #expect(r.err.contains("Authorization: [redacted]"), "\(r.err)")
        #expect(!r.err.contains("LINE-SECRET-5"))
    }

    @Test func ownershipMayBeATemplate() throws {
        let p = try CLIProject()
        try p.write(
            "definitions/own.yaml",
            """
            key: own
            request:
              method: PUT
              url: https://files.example.com/in
              file: "{{ vars.path }}"
              ownership: "{{ vars.own }}"

            """)
        try p.write("data.bin", "payload")
        #expect(p.run("check").status == 0)
        let id = try p.enqueue("own", vars: #"{"path": "data.bin", "own": "reference"}"#)
        let show = try p.run("show", id, "--json").json()
        #expect(show["request"]?["file"]?["ownership"] == .string("reference"))
        let bad = p.run("enqueue", "own", "--vars", #"{"path": "data.bin", "own": "steal"}"#)
        #expect(bad.status == 65, "\(bad)")
        #expect(bad.err.contains("request.ownership must be copy, move or reference"))
        #expect(try p.rows().count == 1)
    }
}
