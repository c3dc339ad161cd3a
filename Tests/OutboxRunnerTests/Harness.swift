import Foundation
import Glibc
import OutboxModel
import Synchronization
import TestSupport
import Testing

// Integration harness: a temp project on disk (config, definitions, hook scripts), the real
// `outbox` binary run with Foundation.Process, and an in-process TestHTTPServer on port 0.

let outboxBinary = builtExecutable("outbox")

/// Small backoffs so retries and redeliveries take milliseconds; hook redelivery uses them too.
let fastConfig = """
retry:
  backoff: { base: 50ms, max: 200ms, jitter: 0 }
  terminal_http: { exempt: [404] }

"""

/// Appends one JSON line per delivery: the OUTBOX_* environment and the stdin payload.
/// Exits 1 while `hooks/fail` exists.
let recordHook = #"""
#!/bin/sh
payload=$(cat)
line=$(printf '{"env":{"id":"%s","key":"%s","outcome":"%s","deliveries":"%s","pid":"%s"},"stdin":%s}' "$OUTBOX_ID" "$OUTBOX_KEY" "$OUTBOX_OUTCOME" "$OUTBOX_DELIVERIES" "$$" "$payload")
printf '%s\n' "$line" >> hooks/log.jsonl
if [ -e hooks/fail ]; then exit 1; fi
exit 0

"""#

/// A definition whose URL comes whole from `vars.url` and whose body carries `vars.tag`.
/// `request` lines go under `request:` (indented by the caller), `top` lines at the top level.
func definition(_ key: String, request: String = "", top: String = "", hooks: Bool = true) -> String {
    var text = """
    key: \(key)
    request:
      url: "{{ vars.url }}"
      data: { tag: "{{ vars.tag }}" }

    """
    if !request.isEmpty { text += request.split(separator: "\n").map { "  " + $0 }.joined(separator: "\n") + "\n" }
    if !top.isEmpty { text += top + "\n" }
    if hooks { text += "on_success: hooks/record.sh\non_error: hooks/record.sh\n" }
    return text
}

/// A definition that PUTs the file at `vars.path` to `vars.url`, recording both outcomes.
func fileDefinition(_ key: String, ownership: String = "copy") -> String {
    """
    key: \(key)
    request:
      method: PUT
      url: "{{ vars.url }}"
      file: "{{ vars.path }}"
      ownership: \(ownership)
    on_success: hooks/record.sh
    on_error: hooks/record.sh

    """
}

/// What a finished `outbox` process left: exit status and its output.
struct Finished: Sendable {
    var exitCode: Int32
    var stdout: String
    var stderr: String
    var timedOut: Bool

    /// stdout as JSON lines (events), skipping blank lines.
    var lines: [JSON] {
        stdout.split(separator: "\n").compactMap { try? JSON.parse(String($0)) }
    }

    /// The single JSON document on stdout.
    var json: JSON? { try? JSON.parse(stdout) }

    var description: String { "exit \(exitCode)\(timedOut ? " (timed out)" : "")\nstdout: \(stdout)\nstderr: \(stderr)" }
}

/// An `outbox` process started in the background (for signals and concurrent commands).
final class Running: @unchecked Sendable {
    let process: Process
    let stdoutPath: String
    let stderrPath: String

    init(process: Process, stdoutPath: String, stderrPath: String) {
        self.process = process
        self.stdoutPath = stdoutPath
        self.stderrPath = stderrPath
    }

    var pid: Int32 { process.processIdentifier }

    func signal(_ number: Int32) { kill(pid, number) }

    /// The output written so far.
    var stdoutSoFar: String { (try? String(contentsOfFile: stdoutPath, encoding: .utf8)) ?? "" }

    /// Waits for exit on a plain thread (never blocking the cooperative pool); SIGKILL after `timeout`.
    func wait(timeout: Double = 60) async -> Finished {
        let process = self.process
        let timedOut = await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            Thread {
                let deadline = Date().addingTimeInterval(timeout)
                var late = false
                while process.isRunning {
                    if Date() > deadline {
                        late = true
                        kill(process.processIdentifier, SIGKILL)
                        break
                    }
                    usleep(5000)
                }
                process.waitUntilExit()
                continuation.resume(returning: late)
            }.start()
        }
        return Finished(exitCode: process.terminationReason == .uncaughtSignal ? -process.terminationStatus : process.terminationStatus,
                        stdout: (try? String(contentsOfFile: stdoutPath, encoding: .utf8)) ?? "",
                        stderr: (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "",
                        timedOut: timedOut)
    }
}

/// A temp project folder with its own test server; removed when released.
final class Project: @unchecked Sendable {
    /// Holds `project/` (the project root) and `logs/` (process output, outside the project).
    let base: String
    let root: String
    let server: TestHTTPServer
    private let counter = Atomic<Int>(0)

    init(config: String = fastConfig, definitions: [String: String], hooks: [String: String] = [:]) throws {
        var template = Array((NSTemporaryDirectory() + "outbox-runner-XXXXXX").utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        guard made != nil else { throw TestHTTPServerError(description: "mkdtemp failed") }
        let raw = String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        base = URL(fileURLWithPath: raw).resolvingSymlinksInPath().path
        root = base + "/project"
        let fm = FileManager.default
        for folder in ["project/config", "project/definitions", "project/hooks", "logs"] {
            try fm.createDirectory(atPath: base + "/" + folder, withIntermediateDirectories: true)
        }
        try config.write(toFile: root + "/config/outbox.yaml", atomically: true, encoding: .utf8)
        for (name, text) in definitions {
            try text.write(toFile: root + "/definitions/\(name).yaml", atomically: true, encoding: .utf8)
        }
        server = try TestHTTPServer(port: 0)
        for (name, text) in ["record.sh": recordHook].merging(hooks, uniquingKeysWith: { $1 }) {
            try writeHook(name, text)
        }
    }

    deinit {
        server.stop()
        try? FileManager.default.removeItem(atPath: base)
    }

    func writeHook(_ name: String, _ text: String) throws {
        let path = root + "/hooks/" + name
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        chmod(path, 0o755)
    }

    func url(_ path: String) -> String { server.url(path) }

    /// The environment every outbox process (and so every hook) gets: nothing from the test process.
    var environment: [String: String] { ["PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": base, "LANG": "C.UTF-8"] }

    /// Starts `outbox ARGS` in the project root.
    func start(_ arguments: [String], stdin: String? = nil) throws -> Running {
        let n = counter.add(1, ordering: .relaxed).newValue
        let out = base + "/logs/\(n).out", err = base + "/logs/\(n).err"
        _ = FileManager.default.createFile(atPath: out, contents: nil)
        _ = FileManager.default.createFile(atPath: err, contents: nil)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: outboxBinary)
        process.arguments = arguments
        process.currentDirectoryURL = URL(fileURLWithPath: root)
        process.environment = environment
        process.standardOutput = FileHandle(forWritingAtPath: out)
        process.standardError = FileHandle(forWritingAtPath: err)
        if let stdin {
            let path = base + "/logs/\(n).in"
            try stdin.write(toFile: path, atomically: true, encoding: .utf8)
            process.standardInput = FileHandle(forReadingAtPath: path)
        } else {
            process.standardInput = FileHandle.nullDevice
        }
        try process.run()
        return Running(process: process, stdoutPath: out, stderrPath: err)
    }

    /// Runs `outbox ARGS` to completion (killed after `timeout` seconds).
    func outbox(_ arguments: [String], stdin: String? = nil, timeout: Double = 60) async throws -> Finished {
        try await start(arguments, stdin: stdin).wait(timeout: timeout)
    }

    /// `outbox run --drain` plus `extra`, expecting exit 0.
    @discardableResult
    func drain(_ extra: [String] = [], sourceLocation: SourceLocation = #_sourceLocation) async throws -> Finished {
        let result = try await outbox(["run", "--drain"] + extra)
        #expect(result.exitCode == 0 && !result.timedOut, "run: \(result.description)", sourceLocation: sourceLocation)
        return result
    }

    /// Runs `outbox run` until `condition` holds (or 30 s pass), then stops it with SIGTERM.
    /// For runs that never drain (a hook that keeps failing), without betting on timing.
    @discardableResult
    func runUntil(_ extra: [String] = [], sourceLocation: SourceLocation = #_sourceLocation,
                  _ condition: (Running) -> Bool) async throws -> Finished {
        let runner = try start(["run"] + extra)
        let reached = await eventually(30) { condition(runner) }
        runner.signal(SIGTERM)
        let result = await runner.wait()
        #expect(reached, "the condition was not reached while the runner ran: \(result.description)", sourceLocation: sourceLocation)
        #expect(result.exitCode == 0 && !result.timedOut, "run: \(result.description)", sourceLocation: sourceLocation)
        return result
    }

    /// Enqueues `key` with vars `{url, tag}` (+ `extra` arguments); returns the id printed.
    @discardableResult
    func enqueue(_ key: String, path: String, id: String? = nil, tag: String = "a", extra: [String] = [],
                 sourceLocation: SourceLocation = #_sourceLocation) async throws -> String {
        let vars = JSON.object([("url", .string(url(path))), ("tag", .string(tag))]).serialized()
        let result = try await outbox(["enqueue", key, "--vars", vars] + (id.map { ["--id", $0] } ?? []) + extra)
        #expect(result.exitCode == 0, "enqueue: \(result.description)", sourceLocation: sourceLocation)
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// `outbox list --json` rows.
    func list() async throws -> [JSON] {
        let result = try await outbox(["list", "--json"])
        return result.json?.arrayValue ?? []
    }

    /// `outbox show ID --json`, nil when the entry is gone.
    func show(_ id: String) async throws -> JSON? {
        let result = try await outbox(["show", id, "--json"])
        return result.exitCode == 0 ? result.json : nil
    }

    /// Lines the record hook appended, in order.
    var hookLog: [JSON] { jsonLines(root + "/hooks/log.jsonl") }

    /// Hook log lines for one id.
    func deliveries(_ id: String) -> [JSON] { hookLog.filter { $0["env"]?["id"]?.stringValue == id } }

    func exists(_ relative: String) -> Bool { FileManager.default.fileExists(atPath: root + "/" + relative) }

    func touch(_ relative: String) { _ = FileManager.default.createFile(atPath: root + "/" + relative, contents: Data()) }

    func remove(_ relative: String) { try? FileManager.default.removeItem(atPath: root + "/" + relative) }
}

func jsonLines(_ path: String) -> [JSON] {
    guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return [] }
    return text.split(separator: "\n").compactMap { try? JSON.parse(String($0)) }
}

/// Polls `condition` every 20 ms until it holds or `seconds` pass.
func eventually(_ seconds: Double = 20, _ condition: () -> Bool) async -> Bool {
    let end = Date().addingTimeInterval(seconds)
    while Date() < end {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return condition()
}

func nowMs() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

/// True when the process is gone or a zombie.
func isDead(_ pid: Int32) -> Bool {
    guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/stat") else { return true }
    let line = String(decoding: data, as: UTF8.self)
    guard let close = line.lastIndex(of: ")") else { return true }
    let state = line[line.index(after: close)...].split(separator: " ").first ?? ""
    return state == "Z" || state == "X"
}

extension JSON {
    /// A dotted path: `stdin.meta.deliveries`, `0.id`.
    func at(_ path: String) -> JSON? {
        var node: JSON? = self
        for piece in path.split(separator: ".") {
            if let index = Int(piece), let array = node?.arrayValue {
                node = index < array.count ? array[index] : nil
            } else {
                node = node?[String(piece)]
            }
        }
        return node
    }

    func string(_ path: String) -> String? { at(path)?.stringValue }
    /// An integer, also from a string of digits (the hook log records environment values as strings).
    func int(_ path: String) -> Int64? { at(path).flatMap { $0.int64Value ?? $0.stringValue.flatMap { Int64($0) } } }
    var keys: [String] { objectValue?.map(\.0) ?? [] }
}
