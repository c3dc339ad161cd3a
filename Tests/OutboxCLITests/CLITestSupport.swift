import Foundation
import OutboxCLI
import OutboxModel
import TestSupport

struct CLITestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// What one in-process call printed and returned: the fixture's result, under the names
/// these tests use.
typealias CLIResult = CommandResult

extension CommandResult {
    var out: String { stdout }
    var err: String { stderr }
    /// stdout as one JSON document.
    func json() throws -> JSON { try requireJSON() }
}

/// Collects a call's output; the console's closures may run on any thread.
private final class Capture: @unchecked Sendable {
    private let lock = NSLock()
    private var out = ""
    private var err = ""
    func addOut(_ s: String) { lock.withLock { out += s } }
    func addErr(_ s: String) { lock.withLock { err += s } }
    var texts: (String, String) { lock.withLock { (out, err) } }
}

/// The fixture's in-process driver. It lives here, not in TestSupport, because it calls
/// `CLI.run`: TestSupport serves every test target and stays clear of the CLI module.
extension TestProject {
    /// Runs `outbox ARGS` through `CLI.run` in the project root (or `cwd`), with `stdin` as
    /// standard input and the fixture's scrubbed environment (no globals: cwd and
    /// environment are passed in).
    func run(_ arguments: [String], cwd: String? = nil, stdin: String = "", environment extra: [String: String] = [:]) -> CommandResult {
        let capture = Capture()
        let input = Array(stdin.utf8)
        let console = Console(out: { capture.addOut($0) }, err: { capture.addErr($0) }, stdin: { input })
        let status = CLI.run(arguments: arguments, environment: processEnvironment(extra), cwd: cwd ?? root, console: console)
        let (out, err) = capture.texts
        return CommandResult(exitCode: status, stdout: out, stderr: err)
    }

    func run(_ arguments: String...) -> CommandResult { run(arguments) }

    /// Runs `arguments` in-process again until `done` holds of the result (two minutes at most), for
    /// a command that needs the store's staging lock alone just after this test took it (an
    /// enqueue, an audit) or let it go. The lock's descriptor is close-on-exec, but a child
    /// another test forks meanwhile holds it from its fork until it closes its descriptors or
    /// execs, which a loaded machine can delay: the command then finds the lock taken (an
    /// audit says so and skips the staged files, a runner's clean-up skips them silently).
    func runOnceTheStagingLockIsFree(_ arguments: [String], until done: (CommandResult) -> Bool) -> CommandResult {
        retried({ run(arguments) }, until: done)
    }
}

/// An audit that found the staging lock taken says so.
let auditFoundTheStagingLockTaken = "is staging bodies now"

/// One test's project with the standard config and definitions, driven in-process.
final class CLIProject: TestProject, @unchecked Sendable {
    static let config = """
        headers:
          Authorization: 'Bearer {{ env.API_TOKEN | default("none") }}'
          X-Client: outbox-tests

        """

    static let definitions: [String: String] = [
        "note.yaml": """
        key: note
        request:
          url: "https://api.example.com/notes/{{ vars.n }}"
          headers:
            X-Note: '{{ vars.note | default("-") }}'
          data:
            n: "{{ vars.n }}"

        """,
        "plain.yaml": """
        key: plain
        request:
          url: https://api.example.com/plain
          data: { a: 1 }

        """,
        "dynamic.yaml": """
        key: dynamic
        request:
          method: '{{ vars.m | default("POST") }}'
          url: "{{ vars.url }}"
          data: { q: 1 }

        """,
        "upload.yaml": """
        key: upload
        request:
          method: PUT
          file: "{{ vars.path }}"
          ownership: copy
          parts: "{{ vars.parts }}"

        """,
        "copy.yaml": """
        key: file.copy
        request:
          method: PUT
          url: https://files.example.com/in
          file: "{{ vars.path }}"

        """,
    ]

    /// A project with `config/outbox.yaml` and the standard definitions (unless `empty`).
    init(empty: Bool = false, config: String = CLIProject.config, function: String = #function) throws {
        try super.init(config: empty ? nil : config, name: function)
        if !empty {
            for (name, text) in Self.definitions { try write("definitions/" + name, text) }
        } else {
            remove("definitions")
        }
    }

    /// Enqueues and returns the printed id; a failure is a broken test.
    @discardableResult
    func enqueue(_ key: String, vars: String, id: String? = nil) throws -> String {
        var args = ["enqueue", key, "--vars", vars]
        if let id { args += ["--id", id] }
        let r = run(args)
        guard r.status == 0 else { throw CLITestFailure("enqueue failed: \(r)") }
        return r.out.trimmingCharacters(in: .newlines)
    }

    /// `list --json` rows as parsed JSON.
    func rows() throws -> [JSON] {
        let r = run("list", "--json")
        guard r.status == 0, case let .array(rows) = try r.json() else { throw CLITestFailure("list failed: \(r)") }
        return rows
    }

    /// Everything a bad call must leave alone: the listed rows, and each file under the
    /// store (path and content, except the SQLite files whose bytes may move on a read).
    func snapshot() throws -> [String] {
        var lines = [run("list", "--json").out]
        let files = (FileManager.default.enumerator(atPath: storeFolder)?.allObjects as? [String]) ?? []
        for file in files.sorted() {
            let full = storeFolder + "/" + file
            var isDir: ObjCBool = false
            _ = FileManager.default.fileExists(atPath: full, isDirectory: &isDir)
            if isDir.boolValue || file.hasPrefix("outbox.db") {
                lines.append(file)
            } else {
                lines.append(file + " " + (FileManager.default.contents(atPath: full)?.base64EncodedString() ?? "?"))
            }
        }
        if FileManager.default.fileExists(atPath: storeFolder + "/outbox.db") {
            lines.append(try sqlite("SELECT * FROM entries; SELECT * FROM parts; SELECT * FROM outcomes;"))
        }
        return lines
    }
}

/// JSON text for a vars object of one string field (escapes done by Foundation).
func varsJSON(_ fields: [String: Any]) -> String {
    String(decoding: try! JSONSerialization.data(withJSONObject: fields, options: [.sortedKeys]), as: UTF8.self)
}
