import Foundation
import OutboxModel
import Testing
import TestSupport

private func outboxExecutable() -> String { builtExecutable("outbox") }

private struct ProcessOutput {
    var status: Int32
    var out: String
    var err: String
}

/// Runs the binary in `cwd` with exactly `environment`, draining both pipes at once.
private func runOutbox(_ arguments: [String], cwd: String, environment: [String: String] = [:]) throws -> ProcessOutput {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: outboxExecutable())
    process.arguments = arguments
    process.currentDirectoryURL = URL(fileURLWithPath: cwd)
    process.environment = environment.merging(["PATH": "/usr/bin:/bin"]) { a, _ in a }
    let out = Pipe(), err = Pipe()
    process.standardOutput = out
    process.standardError = err
    process.standardInput = FileHandle.nullDevice
    try process.run()
    let errData = ErrBox()
    let reader = Thread { errData.set(err.fileHandleForReading.readDataToEndOfFile()) }
    reader.start()
    let outData = out.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    while !errData.done { usleep(1_000) }
    return ProcessOutput(status: process.terminationStatus, out: String(decoding: outData, as: UTF8.self),
                         err: String(decoding: errData.get(), as: UTF8.self))
}

private final class ErrBox: @unchecked Sendable {
    private let lock = NSLock()
    private var data = Data()
    private var finished = false
    func set(_ d: Data) { lock.withLock { data = d; finished = true } }
    func get() -> Data { lock.withLock { data } }
    var done: Bool { lock.withLock { finished } }
}

struct BinaryTests {
    @Test func theBinaryIsBuilt() {
        #expect(FileManager.default.isExecutableFile(atPath: outboxExecutable()), "\(outboxExecutable())")
    }

    @Test func enqueuePrintsTheIdAndExits0() throws {
        let p = try CLIProject()
        let r = try runOutbox(["enqueue", "note", "--vars", #"{"n": 1}"#, "--id", "bin-1"], cwd: p.root)
        #expect(r.status == 0, "\(r.err)")
        #expect(r.out == "bin-1\n")
        #expect(r.err.isEmpty)
        let list = try runOutbox(["list", "--json"], cwd: p.root)
        #expect(list.status == 0)
        let rows = try JSON.parse(list.out)
        #expect(rows.arrayValue?.map { $0["id"] } == [.string("bin-1")])
        let uuid = try runOutbox(["enqueue", "plain"], cwd: p.root)
        #expect(uuid.status == 0)
        #expect(uuid.out.utf8.count == 37)
    }

    @Test func anErrorPrintsItsCodeOnStderrAndExits65() throws {
        let p = try CLIProject()
        let r = try runOutbox(["enqueue", "dynamic", "--vars", #"{"url": "gopher://x"}"#], cwd: p.root)
        #expect(r.status == 65)
        #expect(r.out.isEmpty)
        #expect(r.err == "outbox: E_INVALID: request.url: scheme \"gopher\" is not allowed (http or https only)\n")
        #expect(!p.storeExists)
    }

    @Test func withJSONTheErrorDocumentGoesToStdout() throws {
        let p = try CLIProject()
        let r = try runOutbox(["enqueue", "plain", "--id", "a b", "--json"], cwd: p.root)
        #expect(r.status == 65)
        #expect(r.err.isEmpty)
        let doc = try JSON.parse(r.out)
        #expect(doc == .object([("error", .object([
            ("code", .string("E_INVALID")),
            ("message", .string(#"id "a b" contains " " (allowed: A-Z a-z 0-9 . _ : @ -)"#)),
        ]))]))
    }

    @Test func usageAndConfigErrorsUseTheirExitCodes() throws {
        let p = try CLIProject()
        #expect(try runOutbox(["frobnicate"], cwd: p.root).status == 64)
        try p.write("definitions/broken.yaml", "key: broken\nrequest:\n  url: https://x.example/\n  bogus: 1\n")
        let broken = try runOutbox(["enqueue", "broken"], cwd: p.root)
        #expect(broken.status == 78)
        #expect(broken.err.hasPrefix("\(p.root)/definitions/broken.yaml:4:3: error: unknown field \"bogus\" in request"))
        #expect(broken.err.hasSuffix("\n  bogus: 1\n  ^\noutbox: E_CONFIG: 1 error\n"))
        let version = try runOutbox(["--version"], cwd: "/")
        #expect(version.status == 0)
        #expect(version.out == "outbox 0.1.0\n")
    }
}
