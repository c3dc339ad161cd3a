import Foundation
import Glibc
import OutboxModel
import TestSupport
import Testing

// Integration harness: the fixture's temp project (config, definitions, hook scripts), the
// real `outbox` binary as a child process, and an in-process TestHTTPServer on port 0.

/// Small backoffs so retries and redeliveries take milliseconds; hook redelivery uses them too.
let fastConfig = fastConfigWith(stallFor: "30m")

/// The same with the stall timeout given: long by default, so a request a test holds on the
/// server is never given up however slow the machine (a sanitizer build) makes the test.
func fastConfigWith(stallFor: String, below: String = "1KiB") -> String {
    """
    retry:
      backoff: { base: 50ms, max: 200ms, jitter: 0 }
      terminal_http: { exempt: [404] }
    timeouts: { stall: { below: \(below), for: \(stallFor) } }

    """
}

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

/// What a finished `outbox` process left, and one started in the background (for signals
/// and concurrent commands): the fixture's own types.
typealias Finished = CommandResult
typealias Running = RunningProcess

/// A runner test's project: the fixture with `fastConfig`, the record hook, its own test
/// server, and the runner vocabulary (drain, enqueue by path, the hook log).
final class Project: TestProject, @unchecked Sendable {
    init(
        config: String = fastConfig, definitions: [String: String], hooks: [String: String] = [:],
        function: String = #function
    ) throws {
        try super.init(config: config, definitions: definitions, name: function)
        try startServer()
        for (name, text) in ["record.sh": recordHook].merging(hooks, uniquingKeysWith: { $1 }) {
            try writeHook(name, text)
        }
    }

    /// `outbox run --drain` plus `extra`, expecting it to finish: exit 0, or the failure bits
    /// (1 error, 2 awaiting-auth, 4 hook failed) that `failures` names exactly when given.
    @discardableResult
    func drain(_ extra: [String] = [], failures: Int32? = nil, sourceLocation: SourceLocation = #_sourceLocation) async throws -> Finished {
        let result = try await outbox(["run", "--drain"] + extra)
        let finished = failures.map { result.exitCode == $0 } ?? (0...7).contains(result.exitCode)
        #expect(finished && !result.timedOut, "run: \(result.description)", sourceLocation: sourceLocation)
        return result
    }

    /// Enqueues `key` with vars `{url, tag}` (+ `extra` arguments); returns the id printed.
    @discardableResult
    func enqueue(
        _ key: String, path: String, id: String? = nil, tag: String = "a", extra: [String] = [],
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws -> String {
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

    /// Every entry's state, by id.
    func states() async throws -> [String: String] {
        Dictionary(uniqueKeysWithValues: try await list().map { ($0.string("id") ?? "", $0.string("state") ?? "") })
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
}

func jsonLines(_ path: String) -> [JSON] {
    guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return [] }
    return text.split(separator: "\n").compactMap { try? JSON.parse(String($0)) }
}

/// A loopback port bound but not listening: connections to it are refused, and no other
/// socket can take it meanwhile (a client's ephemeral port, another test's server). Start
/// the server on the port first (both allow address reuse), then close the descriptor.
func refusingPort() throws -> (descriptor: Int32, port: Int) {
    let blocker = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    try #require(blocker >= 0)
    var one: Int32 = 1
    setsockopt(blocker, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            bind(blocker, $0, length) == 0 && getsockname(blocker, $0, &length) == 0
        }
    }
    try #require(bound)
    return (blocker, Int(UInt16(bigEndian: address.sin_port)))
}

func nowMs() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

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
