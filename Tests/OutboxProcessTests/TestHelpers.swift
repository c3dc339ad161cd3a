import OutboxModel
import Foundation
import OutboxProcess
import Synchronization
import Testing
import TestSupport

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

/// The fixture's temp folder (real path, no symlinks), removed by `cleanup()` or at the end.
typealias TempFolder = TemporaryFolder

extension TemporaryFolder {
    func cleanup() { remove() }
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

/// Blocks the calling thread (a runner's, in `onStart`) until `path` exists, up to 60 s.
func waitForFile(_ path: String) {
    for _ in 0..<6000 where !FileManager.default.fileExists(atPath: path) { usleep(10_000) }
}

/// A thread-safe box for values captured by @Sendable callbacks.
final class Box<Value: Sendable>: Sendable {
    private let storage: Locked<Value>

    init(_ value: Value) {
        storage = Locked(value)
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

/// A process run to its end on a thread started at once, while the test goes on: an
/// `async let` would start it only when a thread of the cooperative pool is free, which on
/// a busy 2-core machine can take longer than any deadline of the test.
final class BackgroundRun: Sendable {
    private let outcome = Box<Result<ProcessResult, ProcessSpawnError>?>(nil)

    init(_ spec: ProcessSpec) {
        ProcessRunner.ignoreSIGPIPE()
        let outcome = self.outcome
        let thread = Thread {
            let result: Result<ProcessResult, ProcessSpawnError>
            do throws(ProcessSpawnError) { result = .success(try ProcessRunner.run(spec)) } catch { result = .failure(error) }
            outcome.update { $0 = result }
        }
        thread.start()
    }

    /// The process's result, once it ended.
    func result() async throws -> ProcessResult {
        await eventually("the process to end") { outcome.value != nil }
        guard let result = outcome.value else { throw ProcessSpawnError(message: "the process did not end") }
        return try result.get()
    }
}
