import Foundation
import OutboxProcess
import Synchronization

/// Runs a spec on a fresh thread, as callers must (run blocks); `prepare` and `after` run on
/// that thread before and after it (e.g. to block signals or inspect the thread's masks).
func runOffPool(
    _ spec: ProcessSpec, prepare: (@Sendable () -> Void)? = nil, after: (@Sendable () -> Void)? = nil
) async throws -> ProcessResult {
    ProcessRunner.ignoreSIGPIPE()
    return try await withCheckedThrowingContinuation { continuation in
        let thread = Thread {
            prepare?()
            do {
                let result = try ProcessRunner.run(spec)
                after?()
                continuation.resume(returning: result)
            } catch {
                continuation.resume(throwing: error)
            }
        }
        thread.start()
    }
}

/// A fresh temp folder (real path, no symlinks) removed by `cleanup()`.
struct TempFolder {
    let path: String

    init() {
        var template = Array((NSTemporaryDirectory() + "outbox-proc-XXXXXX").utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        precondition(made != nil, "mkdtemp failed")
        let raw = String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        path = URL(fileURLWithPath: raw).resolvingSymlinksInPath().path
    }

    func cleanup() {
        try? FileManager.default.removeItem(atPath: path)
    }
}

/// A shell spec in a given folder with a minimal environment.
func shell(_ line: String, in folder: TempFolder, stdin: [UInt8] = [], cap: Int = 65536) -> ProcessSpec {
    ProcessSpec(
        command: .shell(line), stdin: stdin, environment: ["PATH": "/usr/bin:/bin"],
        workingDirectory: folder.path, outputCap: cap)
}

func text(_ bytes: [UInt8]) -> String {
    String(decoding: bytes, as: UTF8.self)
}

/// Fields of /proc/PID/stat after the command name: index 0 is field 3 (state).
func procStatFields(_ pid: Int32) -> [String]? {
    guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/stat") else { return nil }
    let line = String(decoding: data, as: UTF8.self)
    guard let close = line.lastIndex(of: ")") else { return nil }
    return line[line.index(after: close)...].split(separator: " ").map(String.init)
}

/// True when the process no longer runs (gone, or a zombie nobody reaped yet).
func isDead(_ pid: Int32) -> Bool {
    guard let fields = procStatFields(pid) else { return true }
    return fields[0] == "Z" || fields[0] == "X"
}

/// Waits up to `seconds` for a condition, polling every 20 ms.
func eventually(seconds: Double, _ condition: () -> Bool) async -> Bool {
    let end = Date().addingTimeInterval(seconds)
    while Date() < end {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return condition()
}

/// A thread-safe box for values captured by @Sendable callbacks.
final class Box<Value: Sendable>: Sendable {
    private let storage: Mutex<Value>

    init(_ value: Value) {
        storage = Mutex(value)
    }

    var value: Value { storage.withLock { $0 } }

    func update(_ body: @Sendable (inout Value) -> Void) {
        storage.withLock { body(&$0) }
    }
}

/// The `Sig*:` lines of a /proc status file as hex masks.
func signalMasks(_ output: String) -> [String: UInt64] {
    var masks: [String: UInt64] = [:]
    for line in output.split(separator: "\n") {
        let parts = line.split(separator: ":", maxSplits: 1)
        guard parts.count == 2 else { continue }
        let value = parts[1].trimmingCharacters(in: .whitespaces)
        masks[String(parts[0])] = UInt64(value, radix: 16)
    }
    return masks
}

/// The signal masks of the calling thread.
func threadSignalMasks() -> [String: UInt64] {
    signalMasks((try? String(contentsOfFile: "/proc/thread-self/status", encoding: .utf8)) ?? "")
}

/// Bit for signal `number` in a /proc signal mask.
func bit(_ number: Int32) -> UInt64 {
    1 << UInt64(number - 1)
}
