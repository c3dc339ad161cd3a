import Foundation
import OutboxModel
import TestSupport
import Testing

@testable import OutboxCLI

/// `outbox man` prints outbox(1) from the command table, and groff renders it without a warning.
struct ManualPageTests {
    /// The page rendered by groff as a terminal shows it (hyphens as ASCII, for searching).
    static func render(_ page: String) throws -> CommandResult? {
        guard let groff = requiredTool("/usr/bin/groff", package: "groff-base") else { return nil }
        // -P-cbu: plain text, without the escapes or overstrikes of bold and underline.
        let r = try runProcess(groff, ["-man", "-Tutf8", "-ww", "-rLL=100n", "-P-cbu"], stdin: page)
        return CommandResult(
            exitCode: r.exitCode, stdout: r.stdout.replacing("\u{2212}", with: "-").replacing("\u{2010}", with: "-"),
            stderr: r.stderr)
    }

    @Test func rendersWithoutWarningsAndCoversTheCommandTable() throws {
        let p = try TestProject(config: nil)
        let man = p.run(["man"])
        #expect(man.status == 0 && man.stderr.isEmpty, "\(man)")
        guard let r = try Self.render(man.stdout) else { return }
        #expect(r.exitCode == 0, "\(r)")
        #expect(r.stderr.isEmpty, "groff warned:\n\(r.stderr)")
        let text = r.stdout
        for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "GLOBAL OPTIONS", "EXIT STATUS", "ENVIRONMENT", "FILES", "SEE ALSO"]
        {
            #expect(text.contains("\n" + section + "\n"), "section \(section) is missing")
        }
        for command in CLI.commands {
            #expect(text.contains("outbox " + command.name), "command \(command.name)")
            for option in command.options where !option.hidden {
                #expect(text.contains("--" + option.name), "\(command.name) --\(option.name)")
            }
        }
        for code in ErrorCode.allCases { #expect(text.contains("\(code.exitStatus)") && text.contains(code.rawValue), "\(code)") }
        for variable in ["OUTBOX_CONFIG"] + Config.environmentOverrides.map(\.variable) {
            #expect(text.contains(variable), "\(variable)")
        }
        #expect(text.contains("outbox \(outboxVersion)"))
    }

    @Test func theBinaryPageWorksWithManDashL() throws {
        let p = try TestProject(config: nil)
        let page = try p.write("outbox.1", p.run(["man"]).stdout)
        guard let man = requiredTool("/usr/bin/man", package: "man-db") else { return }
        let r = try runProcess(man, ["-l", page], environment: p.processEnvironment(["MANPAGER": "cat", "MANWIDTH": "80"]))
        #expect(r.exitCode == 0 && r.stderr.isEmpty, "\(r)")
        #expect(r.stdout.contains("OUTBOX(1)") && r.stdout.contains("chunk-plan"), "\(r)")
    }

    @Test(arguments: [
        (".starts a request", "\\&.starts a request"), ("'quoted", "\\&'quoted"), ("a\\b", "a\\eb"), ("--key", "\\-\\-key"),
        ("ID…", "ID\\[u2026]"), ("a — b", "a \\[u2014] b"), ("mid.dot 'ok'", "mid.dot 'ok'"),
    ])
    func escapesRoffSpecials(_ text: String, _ roff: String) {
        #expect(ManualPage.escape(text) == roff)
    }
}
