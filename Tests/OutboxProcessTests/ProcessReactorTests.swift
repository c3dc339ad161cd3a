import Foundation
import OutboxProcess
import Testing
import TestSupport

/// Many children on the reactor's one thread: each gets its own stdin, output, exit status
/// and timers, whatever the others do.
struct ProcessReactorTests {
    /// Starts `spec` and hands it to `reactor`; the result arrives in `results[index]`.
    @discardableResult
    func start(
        _ spec: ProcessSpec, on reactor: ProcessReactor, index: Int, into results: Box<[Int: ProcessResult]>
    ) throws
        -> ObservedProcess
    {
        let started = try ProcessRunner.start(spec)
        reactor.add(started) { result in results.update { $0[index] = result } }
        return ObservedProcess(pid: started.pid, startTime: started.startTime)
    }

    @Test func childrenRunAtOnceEachWithItsOwnInputOutputAndStatus() async throws {
        ProcessRunner.ignoreSIGPIPE()
        let folder = TempFolder()
        defer { folder.cleanup() }
        let reactor = try ProcessReactor()
        defer { reactor.stop() }
        let results = Box<[Int: ProcessResult]>([:])
        // Larger than a pipe's buffer, so stdin is written over several polls while the others run.
        let big = Array(repeating: UInt8(ascii: "x"), count: 300_000)
        var children: [Int: ObservedProcess] = [:]
        for index in 0..<12 {
            let input = index == 0 ? big : Array("child \(index)\n".utf8)
            let spec = shell("cat; printf 'err %s' \(index) >&2; exit \(index)", in: folder, stdin: input, cap: 1 << 20)
            children[index] = try start(spec, on: reactor, index: index, into: results)
        }
        await eventually("all twelve children end") { results.value.count == 12 }
        for (index, result) in results.value {
            #expect(result.exitStatus == Int32(index), "child \(index): \(result)")
            #expect(result.stdout == (index == 0 ? big : Array("child \(index)\n".utf8)), "child \(index)'s own stdout")
            #expect(text(result.stderr) == "err \(index)")
            #expect(!result.timedOut)
            #expect(children[index]?.pid == result.pid)
            #expect(children[index]?.hasEnded == true, "child \(index) was reaped")
        }
    }

    @Test func aTimeoutStopsOnlyItsOwnChild() async throws {
        ProcessRunner.ignoreSIGPIPE()
        let folder = TempFolder()
        defer { folder.cleanup() }
        let reactor = try ProcessReactor()
        defer { reactor.stop() }
        let results = Box<[Int: ProcessResult]>([:])
        var stuck = shell("exec sleep 600", in: folder)
        stuck.timeoutMs = 100
        try start(stuck, on: reactor, index: 0, into: results)
        // Held until the first child was stopped: its timeout must not touch this one.
        try start(shell("while [ ! -e go ]; do sleep 0.01; done; echo done", in: folder), on: reactor, index: 1, into: results)
        await eventually("the stuck child is stopped") { results.value[0] != nil }
        #expect(results.value[1] == nil, "the other child still runs")
        _ = FileManager.default.createFile(atPath: folder.path + "/go", contents: nil)
        await eventually("the other child ends") { results.value[1] != nil }
        let first = try #require(results.value[0])
        let second = try #require(results.value[1])
        #expect(first.timedOut && first.signal == SIGTERM, "\(first)")
        #expect(!second.timedOut && second.exitStatus == 0 && text(second.stdout) == "done\n", "\(second)")
    }

    @Test func aChildAddedAfterTheOthersEndedIsStillRun() async throws {
        ProcessRunner.ignoreSIGPIPE()
        let folder = TempFolder()
        defer { folder.cleanup() }
        let reactor = try ProcessReactor()
        let results = Box<[Int: ProcessResult]>([:])
        try start(shell("exit 3", in: folder), on: reactor, index: 0, into: results)
        await eventually("the first child ends") { results.value[0] != nil }
        try start(shell("echo again", in: folder), on: reactor, index: 1, into: results)
        // Stopped with a child still running: the child is run to its end all the same.
        reactor.stop()
        await eventually("the second child ends") { results.value[1] != nil }
        #expect(results.value[0]?.exitStatus == 3)
        #expect(text(results.value[1]?.stdout ?? []) == "again\n")
    }
}
