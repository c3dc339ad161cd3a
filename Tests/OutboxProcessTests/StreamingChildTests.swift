import Foundation
import Glibc
import OutboxProcess
import Testing
import TestSupport

/// The events plugin's process: fed lines, never able to stall its feeder, ended within its grace.
struct StreamingChildTests {
    static func spec(_ shell: String, in folder: TemporaryFolder) -> ProcessSpec {
        ProcessSpec(command: .shell(shell), environment: ["PATH": "/usr/bin:/bin"], workingDirectory: folder.path)
    }

    @Test func aReaderGetsEveryLineInOrder() throws {
        ProcessRunner.ignoreSIGPIPE()
        let folder = TemporaryFolder()
        let out = folder.path + "/lines"
        let child = try StreamingChild.start(Self.spec("cat > '\(out)'", in: folder))
        for n in 1...1000 { child.send(line: #"{"n":\#(n)}"#) }
        // A grace far past any start-up: close returns as soon as the child has exited, and
        // one killed before it wrote everything (the default 2 s) would lose lines.
        child.close(graceMs: 60_000)
        let lines = try String(contentsOfFile: out, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 1000)
        #expect(lines.first == #"{"n":1}"#)
        #expect(lines.last == #"{"n":1000}"#)
        #expect(child.dropped == 0)
    }

    @Test func aChildThatNeverReadsLosesLinesAndIsKilledAtClose() throws {
        ProcessRunner.ignoreSIGPIPE()
        let folder = TemporaryFolder()
        let child = try StreamingChild.start(Self.spec("sleep 3600", in: folder), bufferCap: 4096)
        let process = try #require(ObservedProcess(child.pid), "the child runs")
        // Far more than a pipe (64 KiB) and the buffer hold: sending must not block.
        let line = String(repeating: "x", count: 1000)
        for _ in 0..<500 { child.send(line: line) }
        #expect(child.dropped > 0)
        child.close(graceMs: 200)
        // Reaped: no zombie left, and the pid, if it names a process, names another one.
        #expect(process.hasEnded)
    }

    /// A background process the child started is in its group: it goes at close, even when
    /// the child itself exited at once.
    @Test func whatTheChildLeftInItsGroupIsStoppedAtClose() async throws {
        ProcessRunner.ignoreSIGPIPE()
        let folder = TemporaryFolder()
        let child = try StreamingChild.start(Self.spec("(exec sleep 300) & echo $! > bg; cat > /dev/null", in: folder))
        child.send(line: "{}")
        await eventually("the background pid is written") {
            (try? String(contentsOfFile: folder.path + "/bg", encoding: .utf8))?.hasSuffix("\n") == true
        }
        let background = try #require(
            Int32((try String(contentsOfFile: folder.path + "/bg", encoding: .utf8)).trimmingCharacters(in: .whitespacesAndNewlines)))
        let process = try #require(ObservedProcess(background), "the background process \(background) runs")
        child.close()
        // Gone, or a zombie nobody reaps (this machine's init does not): not running.
        await eventually("the background process is stopped") { process.hasEnded }
        #expect(process.hasEnded, "still running: \(background)")
    }

    @Test func aChildThatExitsEarlyEndsTheFeedQuietly() throws {
        ProcessRunner.ignoreSIGPIPE()
        let folder = TemporaryFolder()
        let child = try StreamingChild.start(Self.spec("exit 0", in: folder))
        // Lines sent after it exited are dropped once the pipe reports it gone.
        for _ in 0..<100_000 where child.dropped == 0 { child.send(line: "after") }
        child.close()
        #expect(child.dropped > 0)
    }

    /// What the child prints comes back a line at a time: a line of exactly the cap whole, a
    /// longer one cut there with its rest dropped (also when it ends the output), each stream's
    /// lines in order, and a last line without its newline when the output ends. How the two
    /// streams interleave depends on when each was looked at (a busy machine showed both orders).
    @Test func itsOutputComesBackInLinesCutAtTheCap() throws {
        ProcessRunner.ignoreSIGPIPE()
        let folder = TemporaryFolder()
        let script = "printf 'one\\n%s\\n%s\\ntwo' abcd abcdefgh; printf 'err\\nxyzxyzxyz' >&2; cat > /dev/null"
        let child = try StreamingChild.start(Self.spec(script, in: folder), lineCap: 4)
        // Closed at once: the child must still start, print and see its end of input within
        // the grace, or it is killed before it printed; close returns once it has exited.
        child.close(graceMs: 60_000)
        let lines = child.takeOutput()
        let stdout = ["one", "abcd", "abcd [...]", "two"], stderr = ["err", "xyzx [...]"]
        #expect(lines.filter(stdout.contains) == stdout, "\(lines)")
        #expect(lines.filter(stderr.contains) == stderr, "\(lines)")
        #expect(lines.count == 6, "\(lines)")
        #expect(child.takeOutput() == [])
    }

    @Test func aCommandThatCannotStartIsAnError() {
        let folder = TemporaryFolder()
        #expect(throws: ProcessSpawnError.self) {
            try StreamingChild.start(
                ProcessSpec(
                    command: .argv(["no-such-program-here"]), environment: ["PATH": "/nonexistent"],
                    workingDirectory: folder.path))
        }
    }
}
