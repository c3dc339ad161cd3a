import CSystem
import OutboxModel
import Foundation
import OutboxProcess
import Synchronization
import Testing
import TestSupport

struct ExitStatusTests {
    struct ExitCase: CustomTestStringConvertible, Sendable {
        let name: String
        let code: Int32
        var testDescription: String { name }
    }

    @Test(arguments: [
        ExitCase(name: "zero", code: 0),
        ExitCase(name: "one", code: 1),
        ExitCase(name: "thirty-seven", code: 37),
    ])
    func exitCodeIsReported(_ c: ExitCase) async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let result = try await runOffPool(shell("exit \(c.code)", in: folder))
        #expect(result.exitStatus == c.code)
        #expect(result.signal == nil)
        #expect(result.timedOut == false)
        #expect(result.succeeded == (c.code == 0))
        #expect(result.stdout == [])
        #expect(result.stderr == [])
    }

    @Test func signalDeathIsReportedAsSignal() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let result = try await runOffPool(shell("kill -9 $$", in: folder))
        #expect(result.signal == 9)
        #expect(result.exitStatus == nil)
        #expect(result.succeeded == false)
        #expect(result.timedOut == false)
    }

    @Test func stdoutAndStderrAreSeparate() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let result = try await runOffPool(shell("printf out; printf err >&2; exit 3", in: folder))
        #expect(text(result.stdout) == "out")
        #expect(text(result.stderr) == "err")
        #expect(result.exitStatus == 3)
    }
}

struct StdinTests {
    @Test func jsonOnStdinIsEchoedByCat() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let json = Array(#"{"outcome": "completed", "id": "a/b", "vars": {"x": [1, 2.5, "é"]}}"#.utf8)
        let result = try await runOffPool(shell("cat", in: folder, stdin: json))
        #expect(result.stdout == json)
        #expect(result.stdoutTruncated == false)
        #expect(result.exitStatus == 0)
    }

    struct IgnoringHook: CustomTestStringConvertible, Sendable {
        let name: String
        let line: String
        var testDescription: String { name }
    }

    /// EPIPE on stdin is "stdin done", not a failure: a hook need not read its input.
    @Test(arguments: [
        IgnoringHook(name: "exits at once", line: "exit 0"),
        IgnoringHook(name: "exits after the pipe filled", line: "sleep 0.3; exit 0"),
        IgnoringHook(name: "reads 10 bytes then exits", line: "head -c 10 >/dev/null; exit 0"),
    ])
    func hookIgnoringOneMebibyteOfStdinSucceeds(_ hook: IgnoringHook) async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let input = [UInt8](repeating: UInt8(ascii: "x"), count: 1 << 20)
        let masksAfter = Box<[String: UInt64]>([:])
        let result = try await runOffPool(shell(hook.line, in: folder, stdin: input)) {
            let masks = threadSignalMasks()
            masksAfter.update { $0 = masks }
        }
        #expect(result.exitStatus == 0)
        #expect(result.signal == nil)
        #expect(result.stdout == [])
        // run blocks SIGPIPE only while it writes, and leaves none pending behind.
        #expect(masksAfter.value["SigBlk"].map { $0 & bit(SIGPIPE) } == 0)
        #expect(masksAfter.value["SigPnd"].map { $0 & bit(SIGPIPE) } == 0)
    }

    @Test func oneMebibyteRoundTripsThroughCat() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let input = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 9) }
        let result = try await runOffPool(shell("cat", in: folder, stdin: input, cap: 2 << 20))
        #expect(result.stdout.count == input.count)
        #expect(result.stdout == input)
        #expect(result.stdoutTruncated == false)
        #expect(result.exitStatus == 0)
    }
}

struct OutputCapTests {
    @Test func oneMebibyteOnBothStreamsIsCappedWithoutDeadlock() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        // Both writers run at once; the exit status proves neither was killed by SIGPIPE.
        let line = """
            yes abcdefg | head -c 1048576 & bg=$!
            yes ABCDEFG | head -c 1048576 >&2; fg=$?
            wait $bg || exit 3
            exit $fg
            """
        let result = try await runOffPool(shell(line, in: folder))
        let expectedOut = Array(String(repeating: "abcdefg\n", count: 8192).utf8)
        let expectedErr = Array(String(repeating: "ABCDEFG\n", count: 8192).utf8)
        #expect(result.exitStatus == 0)
        #expect(result.stdout.count == 65536)
        #expect(result.stderr.count == 65536)
        #expect(result.stdout == expectedOut)
        #expect(result.stderr == expectedErr)
        #expect(result.stdoutTruncated == true)
        #expect(result.stderrTruncated == true)
    }

    struct CapCase: CustomTestStringConvertible, Sendable {
        let name: String
        let size: Int
        let cap: Int
        let keptCount: Int
        let truncated: Bool
        var testDescription: String { name }
    }

    @Test(arguments: [
        CapCase(name: "below the cap", size: 99, cap: 100, keptCount: 99, truncated: false),
        CapCase(name: "exactly the cap", size: 100, cap: 100, keptCount: 100, truncated: false),
        CapCase(name: "one over the cap", size: 101, cap: 100, keptCount: 100, truncated: true),
        CapCase(name: "zero cap", size: 5, cap: 0, keptCount: 0, truncated: true),
    ])
    func capBoundary(_ c: CapCase) async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let result = try await runOffPool(shell("head -c \(c.size) /dev/zero", in: folder, cap: c.cap))
        #expect(result.stdout == [UInt8](repeating: 0, count: c.keptCount))
        #expect(result.stdoutTruncated == c.truncated)
        #expect(result.stderrTruncated == false)
        #expect(result.exitStatus == 0)
    }

    /// Asked to, a run stops a child whose stdout passes the cap (a plugin's answer is then
    /// lost anyway); the timeout is only a net, and reaching it fails the test.
    @Test func aChildPastItsStdoutCapIsStoppedWhenAsked() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        var spec = shell("exec yes", in: folder, cap: 1 << 20)
        spec.stopWhenStdoutOverflows = true
        spec.timeoutMs = 300_000
        let result = try await runOffPool(spec)
        #expect(result.timedOut == false)
        #expect(result.stdoutTruncated)
        #expect(result.stdout.count == 1 << 20)
        #expect(result.signal == SIGTERM)
    }

    /// Completion is decided by the child's exit, not by pipe EOF: the run returns while
    /// the background child that holds stdout still runs (it runs until the test says so).
    @Test func backgroundChildHoldingStdoutDoesNotHangTheRun() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        var spec = shell("(while [ ! -e release ]; do sleep 0.05; done) & echo $!", in: folder)
        // Reached only if the run waits for the background child: it then fails, not hangs.
        spec.timeoutMs = 120_000
        let result = try await runOffPool(spec)
        let sleeper = try #require(Int32(text(result.stdout).trimmingCharacters(in: .whitespacesAndNewlines)))
        defer { kill(sleeper, SIGKILL) }
        #expect(result.timedOut == false, "the run waited for the background child")
        #expect(ObservedProcess(sleeper)?.hasEnded == false, "the run waited for the background child")
        #expect(result.exitStatus == 0)
        _ = FileManager.default.createFile(atPath: folder.path + "/release", contents: nil)
    }
}

struct ChildSetupTests {
    /// Only 0, 1 and 2 reach the child, even fds opened here without O_CLOEXEC (a leaked
    /// runner lock fd would keep the store held).
    @Test func noDescriptorLeaksIntoTheChild() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let leaky = open("/dev/null", O_RDONLY)
        #expect(leaky > 2)
        defer { close(leaky) }
        // `; true` keeps sh alive, so a separate ls lists the shell's own table.
        let viaShell = try await runOffPool(shell("ls /proc/$$/fd; true", in: folder))
        #expect(text(viaShell.stdout) == "0\n1\n2\n")
        // Run directly, ls's own table also shows fd 3: the directory it is reading.
        var direct = shell("", in: folder)
        direct.command = .argv(["/bin/ls", "/proc/self/fd"])
        let viaArgv = try await runOffPool(direct)
        #expect(text(viaArgv.stdout) == "0\n1\n2\n3\n")
    }

    /// The parent thread's blocked mask and ignored SIGPIPE do not reach the child (it would
    /// miss SIGTERM, or ignore EPIPE).
    @Test func childHasEmptyMaskAndDefaultSignals() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        var spec = shell("", in: folder)
        spec.command = .argv(["/bin/grep", "^Sig", "/proc/self/status"])
        let parentMasks = Box<[String: UInt64]>([:])
        let result = try await runOffPool(spec) {
            var set = sigset_t()
            sigemptyset(&set)
            for sig in [SIGTERM, SIGINT, SIGUSR1, SIGCHLD, SIGHUP] { sigaddset(&set, sig) }
            pthread_sigmask(SIG_BLOCK, &set, nil)
            let masks = threadSignalMasks()
            parentMasks.update { $0 = masks }
        }
        // The precondition holds, so the check below can fail.
        #expect((parentMasks.value["SigBlk"] ?? 0) & bit(SIGUSR1) != 0)
        #expect((parentMasks.value["SigIgn"] ?? 0) & bit(SIGPIPE) != 0)
        let child = signalMasks(text(result.stdout))
        #expect(child["SigBlk"] == 0)
        let mustBeDefault = [SIGPIPE, SIGTERM, SIGINT, SIGCHLD, SIGHUP, SIGQUIT].reduce(UInt64(0)) { $0 | bit($1) }
        #expect(child["SigIgn"].map { $0 & mustBeDefault } == 0)
        #expect(result.exitStatus == 0)
    }

    @Test func childLeadsItsOwnProcessGroup() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let result = try await runOffPool(shell("echo $$; cut -d' ' -f5 /proc/$$/stat", in: folder))
        let lines = text(result.stdout).split(separator: "\n").map { Int32($0) }
        #expect(lines == [result.pid, result.pid])
        #expect(result.pid != getpgrp())
    }

    @Test func workingDirectoryIsHonoured() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        try FileManager.default.createDirectory(atPath: folder.path + "/sub dir", withIntermediateDirectories: false)
        var spec = shell("pwd -P", in: folder)
        spec.workingDirectory = folder.path + "/sub dir"
        let result = try await runOffPool(spec)
        #expect(text(result.stdout) == folder.path + "/sub dir\n")
    }

    @Test func environmentIsExactlyTheOneGiven() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let parent = ProcessRunner.currentEnvironment()
        #expect(!parent.isEmpty)
        var spec = shell("", in: folder)
        spec.command = .argv(["/usr/bin/env"])
        spec.environment = ["OUTBOX_ID": "a b=c", "PATH": "/usr/bin:/bin"]
        let result = try await runOffPool(spec)
        #expect(text(result.stdout) == "OUTBOX_ID=a b=c\nPATH=/usr/bin:/bin\n")

        spec.environment = [:]
        let empty = try await runOffPool(spec)
        #expect(empty.stdout == [])
        #expect(empty.exitStatus == 0)
    }

    @Test func currentEnvironmentMatchesTheProcess() {
        #expect(ProcessRunner.currentEnvironment() == ProcessInfo.processInfo.environment)
    }

    @Test func environmentNameWithEqualsSignIsRejected() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        var spec = shell("true", in: folder)
        spec.environment = ["A=B": "c"]
        await #expect(throws: ProcessSpawnError.self) { try await runOffPool(spec) }
    }

    /// A run's hooks share one encoded base; the variables set for one hook replace the
    /// base's of the same name, and the child sees them all in name order.
    @Test func variablesSetOverASharedBaseReachTheChildInOrder() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let base = EncodedEnvironment(["PATH": "/usr/bin:/bin", "A": "1", "OUTBOX_ID": "old", "Z": "26"])
        var spec = shell("", in: folder)
        spec.command = .argv(["/usr/bin/env"])
        spec.environment = ProcessEnvironment(base: base, setting: ["OUTBOX_ID": "e1", "B": "2", "ZZ": "last"])
        let result = try await runOffPool(spec)
        #expect(text(result.stdout) == "A=1\nB=2\nOUTBOX_ID=e1\nPATH=/usr/bin:/bin\nZ=26\nZZ=last\n")
        #expect(spec.environment["OUTBOX_ID"] == "e1")
        #expect(spec.environment["A"] == "1")
        // The base is untouched for the next hook.
        spec.environment = ProcessEnvironment(base: base, setting: [:])
        let plain = try await runOffPool(spec)
        #expect(text(plain.stdout) == "A=1\nOUTBOX_ID=old\nPATH=/usr/bin:/bin\nZ=26\n")
    }

    @Test(
        arguments: [
            (["A=B": "c"], [:], "invalid environment variable name 'A=B'"),
            (["A": "c\0d"], [:], "environment variable A contains a NUL byte"),
            (["A": "c"], ["": "x"], "invalid environment variable name ''"),
            (["A": "c"], ["B": "x\0"], "environment variable B contains a NUL byte"),
        ] as [([String: String], [String: String], String)])
    func aBadVariableInTheBaseOrSetOverItIsNamed(
        _ base: [String: String], _ set: [String: String], _ message: String
    )
        async throws
    {
        let folder = TempFolder()
        defer { folder.cleanup() }
        var spec = shell("true", in: folder)
        spec.environment = ProcessEnvironment(base: EncodedEnvironment(base), setting: set)
        let error = await #expect(throws: ProcessSpawnError.self) { try await runOffPool(spec) }
        #expect(error?.message == "cannot start sh: \(message)")
    }
}

struct TimerTests {
    /// SIGTERM goes to the whole group, so the background grandchild dies too.
    @Test func timeoutKillsTheGroupIncludingAGrandchild() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        // The grandchild outlives any wait below unless the group is killed. Its pid goes to
        // stdout before `started` appears: once the start is let go the timer may fire at once.
        var spec = shell("sleep 600 & echo $!; echo $! > started.tmp && mv started.tmp started; wait", in: folder)
        spec.timeoutMs = 300
        // The timer runs from the spawn: holding the start until the grandchild exists makes
        // "a grandchild is there when the timeout fires" a fact on any machine.
        // Observed while it surely runs: once dead, its pid may be another process's.
        let observed = Box<ObservedProcess?>(nil)
        spec.onStart = { _, _ in
            waitForFile(folder.path + "/started")
            let text = (try? String(contentsOfFile: folder.path + "/started", encoding: .utf8)) ?? ""
            let process = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)).flatMap { ObservedProcess($0) }
            observed.update { $0 = process }
        }
        let started = Date()
        let result = try await runOffPool(spec)
        let elapsed = Date().timeIntervalSince(started)
        let grandchild = Int32(text(result.stdout).trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(result.timedOut == true)
        #expect(result.signal == SIGTERM)
        #expect(result.exitStatus == nil)
        #expect(result.succeeded == false)
        #expect(elapsed >= 0.3)
        #expect(grandchild != nil)
        let process = try #require(observed.value, "the grandchild ran when the run started")
        #expect(process.pid == grandchild)
        await eventually("the grandchild to die") { process.hasEnded }
    }

    @Test func timeoutEscalatesToSIGKILLWhenTermIsIgnored() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        var spec = shell("trap '' TERM; touch trapped; while :; do sleep 0.05; done", in: folder)
        spec.timeoutMs = 100
        // The timer runs from the spawn: a SIGTERM before the trap would kill the shell.
        spec.onStart = { _, _ in waitForFile(folder.path + "/trapped") }
        let started = Date()
        let result = try await runOffPool(spec)
        let elapsed = Date().timeIntervalSince(started)
        #expect(result.timedOut == true)
        #expect(result.signal == SIGKILL)
        #expect(result.exitStatus == nil)
        #expect(elapsed >= 2.0)

    }

    /// A group that obeys the timeout's SIGTERM is done with: the grace before SIGKILL (an
    /// hour here) ends as soon as nothing of the group is left, with the leader reaped. The
    /// limit catches the hour's wait, not slowness: at a load of 30 on two cores every suite of
    /// the run stalled for three minutes at once, and a two-minute limit failed this one.
    @Test(.timeLimit(.minutes(10))) func theGraceEndsWhenTheWholeGroupObeyedTheTerm() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        var spec = shell("sleep 600 & touch started; wait", in: folder)
        spec.timeoutMs = 100
        spec.killGraceMs = 3_600_000
        spec.onStart = { _, _ in waitForFile(folder.path + "/started") }
        let result = try await runOffPool(spec)
        #expect(result.timedOut == true)
        #expect(result.signal == SIGTERM, "\(result)")
    }

    /// A shell leader dies of the SIGTERM at once; the command it runs still gets the grace
    /// to clean up before the group is killed (its trap takes 0.3 s, then writes `cleaned`).
    @Test func theRestOfTheGroupGetsTheGraceAfterTheLeaderDies() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let inner = "trap 'sleep 0.3; echo done > cleaned; exit 1' TERM; touch trapped; sleep 600 & wait $!"
        var spec = shell("sh -c \"\(inner)\"; :", in: folder)
        spec.timeoutMs = 100
        // The timer runs from the spawn: a SIGTERM before the trap would end the inner shell.
        spec.onStart = { _, _ in waitForFile(folder.path + "/trapped") }
        let result = try await runOffPool(spec)
        #expect(result.timedOut == true)
        #expect(result.signal == SIGTERM, "the leader, a shell, died of it: \(result)")
        #expect(FileManager.default.fileExists(atPath: folder.path + "/cleaned"), "the inner command ran its trap")
    }

    @Test func noTimeoutWhenTheProcessIsFaster() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        var spec = shell("echo ok", in: folder)
        // Generous: even a loaded machine starts and ends `echo` well within it.
        spec.timeoutMs = 60_000
        let result = try await runOffPool(spec)
        #expect(result.timedOut == false)
        #expect(result.exitStatus == 0)
        #expect(text(result.stdout) == "ok\n")
    }

    @Test func warnAfterFiresOnceAndTheProcessCompletes() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let warned = Box<[Int32]>([])
        // The child runs until the warning has fired, however late its timer comes.
        var spec = shell("while [ ! -e warned ]; do sleep 0.01; done; echo done", in: folder)
        spec.warnAfterMs = 100
        spec.timeoutMs = 120_000
        spec.onWarn = { pid in
            warned.update { $0.append(pid) }
            _ = FileManager.default.createFile(atPath: folder.path + "/warned", contents: nil)
        }
        let result = try await runOffPool(spec)
        #expect(warned.value == [result.pid])
        #expect(result.exitStatus == 0)
        #expect(result.timedOut == false)
        #expect(text(result.stdout) == "done\n")
    }

    @Test func warnAfterDoesNotFireForAFastProcess() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let warned = Box<Int>(0)
        var spec = shell("true", in: folder)
        // Generous: even a loaded machine starts and ends `true` well within it.
        spec.warnAfterMs = 60_000
        spec.onWarn = { _ in warned.update { $0 += 1 } }
        let result = try await runOffPool(spec)
        #expect(warned.value == 0)
        #expect(result.exitStatus == 0)
    }

    @Test func onStartGetsPidAndStartTime() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let seen = Box<[String]>([])
        var spec = shell("sleep 0.1", in: folder)
        spec.onStart = { pid, startTime in
            let expected = procStatFields(pid)?[19] ?? "missing"
            seen.update { $0 = ["\(pid)", "\(startTime)", expected] }
        }
        let result = try await runOffPool(spec)
        #expect(seen.value.count == 3)
        #expect(seen.value.first == "\(result.pid)")
        #expect(seen.value.dropFirst().first == seen.value.last)
    }

    /// The spawn reads the child's start time from the boot clock when no tick passed while
    /// it ran; that value must be exactly the one /proc gives (a later runner compares them).
    /// Whatever the machine's speed, /proc's value lies between the clock read before and
    /// after the spawn, and a value the spawn took from the clock is /proc's.
    @Test func aStartTimeTakenFromTheClockIsTheOneProcGives() throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let argv: [UnsafeMutablePointer<CChar>?] = [strdup("true"), nil]
        let envp: [UnsafeMutablePointer<CChar>?] = [nil]
        defer { for p in argv { free(p) } }
        for spawn in 1...100 {
            var child = csystem_child()
            let before = csystem_boot_ticks()
            #expect(csystem_spawn("/bin/true", argv, envp, folder.path, &child) == 0)
            let after = csystem_boot_ticks()
            let proc = try #require(procStatFields(child.pid).flatMap { Int64($0[19]) })
            var code: Int32 = 0
            var signal: Int32 = 0
            _ = csystem_proc_wait(child.pid, 0, &code, &signal)
            for fd in [child.pidfd, child.stdin_fd, child.stdout_fd, child.stderr_fd] { csystem_proc_close(fd) }
            #expect(before >= 0 && before <= proc && proc <= after, "spawn \(spawn): \(before) \(proc) \(after)")
            #expect(child.start_time == 0 || Int64(child.start_time) == proc, "spawn \(spawn)")
        }
    }

    /// Input the pipe holds is written before the child starts and its stdin is closed then:
    /// nothing is left to feed. A larger input is left to the caller from where it stopped.
    @Test(arguments: [(100, true), (1 << 20, false)])
    func inputThePipeHoldsIsWrittenAtTheSpawn(size: Int, complete: Bool) throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let argv: [UnsafeMutablePointer<CChar>?] = [strdup("true"), nil]
        let envp: [UnsafeMutablePointer<CChar>?] = [nil]
        defer { for p in argv { free(p) } }
        let input = [UInt8](repeating: 0x78, count: size)
        var child = csystem_child()
        let rc = input.withUnsafeBytes { csystem_spawn_with_input("/bin/true", argv, envp, folder.path, $0.baseAddress, $0.count, &child) }
        #expect(rc == 0)
        var code: Int32 = 0
        var signal: Int32 = 0
        _ = csystem_proc_wait(child.pid, 0, &code, &signal)
        for fd in [child.pidfd, child.stdin_fd, child.stdout_fd, child.stderr_fd] { csystem_proc_close(fd) }
        #expect((child.stdin_fd < 0) == complete)
        #expect((child.stdin_written == size) == complete)
        #expect(child.stdin_written > 0)
    }
}

struct ArgvTests {
    @Test func argumentsWithSpacesReachTheProgramUnchanged() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        var spec = shell("", in: folder)
        spec.command = .argv(["/usr/bin/printf", "%s|", "a b", "c  d", "$HOME", "'q'", ""])
        let result = try await runOffPool(spec)
        #expect(text(result.stdout) == "a b|c  d|$HOME|'q'||")
        #expect(result.exitStatus == 0)
    }

    struct LookupCase: CustomTestStringConvertible, Sendable {
        let name: String
        let environment: [String: String]
        var testDescription: String { name }
    }

    @Test(arguments: [
        LookupCase(name: "PATH from the given environment", environment: ["PATH": "/nonexistent:/usr/bin"]),
        LookupCase(name: "default PATH when none is given", environment: [:]),
    ])
    func bareProgramNameIsFoundThroughPath(_ c: LookupCase) async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        var spec = shell("", in: folder)
        spec.environment = ProcessEnvironment(c.environment)
        spec.command = .argv(["printf", "%s", "found"])
        let result = try await runOffPool(spec)
        #expect(text(result.stdout) == "found")
    }

    struct MissingCase: CustomTestStringConvertible, Sendable {
        let name: String
        let command: ProcessCommand
        let folder: String?
        let message: String
        var testDescription: String { name }
    }

    /// argv problems throw; a shell reports a missing program itself as exit 127 (below).
    @Test(arguments: [
        MissingCase(
            name: "absolute path missing", command: .argv(["/nonexistent/hook", "x"]), folder: nil,
            message: "cannot start /nonexistent/hook: No such file or directory"),
        MissingCase(
            name: "bare name not in PATH", command: .argv(["no-such-hook-xyz"]), folder: nil,
            message: "cannot start no-such-hook-xyz: command not found in PATH"),
        MissingCase(
            name: "empty argv", command: .argv([]), folder: nil,
            message: "cannot start a command with an empty program name"),
        MissingCase(
            name: "missing working directory", command: .argv(["/bin/true"]), folder: "/nonexistent/dir",
            message: "cannot start /bin/true: working directory /nonexistent/dir is not a folder"),
    ])
    func startFailuresThrow(_ c: MissingCase) async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        var spec = shell("", in: folder)
        spec.command = c.command
        if let path = c.folder { spec.workingDirectory = path }
        let error = await #expect(throws: ProcessSpawnError.self) { try await runOffPool(spec) }
        #expect(error?.message == c.message)
    }

    /// A script that is there but cannot be started by the kernel (its `#!` interpreter is
    /// missing, or a CRLF line end makes it so) is not reported as missing.
    @Test(arguments: [
        ("#!/nonexistent/sh\necho hi\n", "names the interpreter /nonexistent/sh, which does not exist"),
        ("#!/bin/sh\r\necho hi\r\n", "has a CRLF line end on its #! line: the interpreter would be looked up with a CR in its name"),
        ("#!/etc/passwd\necho hi\n", "names the interpreter /etc/passwd, which is not an executable file"),
        (
            "#!python3\nprint(1)\n",
            "names the interpreter python3 by a relative path, which the kernel looks up in FOLDER, not in PATH, and finds no executable file there (write #!/usr/bin/env python3)"
        ),
    ])
    func aScriptThatCannotStartSaysWhy(text: String, why template: String) async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let script = folder.path + "/hook.sh"
        try writeFileClosedOnExec(script, Data(text.utf8), mode: 0o755)
        var spec = shell("", in: folder)
        spec.command = .argv([script])
        let why = template.replacing("FOLDER", with: folder.path)
        let error = await #expect(throws: ProcessSpawnError.self) { try await runOffPool(spec) }
        #expect(error?.message == "cannot start \(script): the file \(why)")
        #expect(ProcessRunner.execProblem(script, runDirectly: false, folder: folder.path) == why)
    }

    /// The kernel takes a relative `#!` interpreter from the folder the command runs in:
    /// one that is there runs, and is no problem.
    @Test func aRelativeInterpreterInTheWorkingFolderRuns() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        try writeFileClosedOnExec(folder.path + "/interp", Data("#!/bin/sh\necho \"via $1\"\n".utf8), mode: 0o755)
        let script = folder.path + "/hook.sh"
        try writeFileClosedOnExec(script, Data("#!interp\n".utf8), mode: 0o755)
        var spec = shell("", in: folder)
        spec.command = .argv([script])
        let result = try await runOffPool(spec)
        #expect(result.exitStatus == 0)
        #expect(String(decoding: result.stdout, as: UTF8.self) == "via \(script)\n")
        #expect(ProcessRunner.execProblem(script, runDirectly: true, folder: folder.path) == nil)
    }

    @Test func missingProgramInShellIsExit127() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let result = try await runOffPool(shell("no-such-hook-xyz", in: folder))
        #expect(result.exitStatus == 127)
    }

    @Test func nonExecutableFileThrows() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let script = folder.path + "/hook.sh"
        _ = FileManager.default.createFile(atPath: script, contents: Data("echo hi\n".utf8))
        var spec = shell("", in: folder)
        spec.command = .argv([script])
        let error = await #expect(throws: ProcessSpawnError.self) { try await runOffPool(spec) }
        #expect(error?.message == "cannot start \(script): Permission denied")
    }

    @Test func relativeProgramPathIsResolvedInTheWorkingDirectory() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let script = folder.path + "/hook.sh"
        try writeFileClosedOnExec(script, Data("#!/bin/sh\necho \"hook $1\"\n".utf8), mode: 0o755)
        var spec = shell("", in: folder)
        spec.command = .argv(["./hook.sh", "ran"])
        let result = try await runOffPool(spec)
        #expect(text(result.stdout) == "hook ran\n")
    }
}

struct StaleGroupTests {
    @Test func killsARunningGroupOnlyWithTheMatchingStartTime() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let started = Box<(Int32, UInt64)?>(nil)
        var spec = shell("exec sleep 600", in: folder)
        spec.onStart = { pid, time in started.update { $0 = (pid, time) } }
        let running = BackgroundRun(spec)
        // A failed expectation below must not leave the child sleeping for 10 minutes.
        defer { if let (pid, _) = started.value { kill(-pid, SIGKILL) } }
        await eventually("the child to start") { started.value != nil }
        let (pid, startTime) = try #require(started.value)
        #expect(ProcessRunner.killStaleGroup(pgid: pid, startTime: startTime + 1) == false)
        #expect(ObservedProcess(pid)?.hasEnded == false)
        #expect(ProcessRunner.killStaleGroup(pgid: pid, startTime: startTime) == true)
        let result = try await running.result()
        #expect(result.signal == SIGKILL)
        #expect(result.pid == pid)
    }

    /// The stale case proper: the leader's parent (an earlier runner's hook shell) is gone.
    @Test func killsAnOrphanedGroupLeader() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let result = try await runOffPool(shell("setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!", in: folder))
        let orphan = try #require(Int32(text(result.stdout).trimmingCharacters(in: .whitespacesAndNewlines)))
        defer { kill(orphan, SIGKILL) }
        // Wait until setsid made it a group leader.
        await eventually("setsid to make it a group leader") { procStatFields(orphan)?[2] == "\(orphan)" }
        let startTime = try #require(procStatFields(orphan).flatMap { UInt64($0[19]) })
        // By its start time: reaped by init, its pid may soon be another process's.
        let process = ObservedProcess(pid: orphan, startTime: startTime)
        #expect(ProcessRunner.killStaleGroup(pgid: orphan, startTime: startTime &- 1) == false)
        #expect(process.hasEnded == false)
        #expect(ProcessRunner.killStaleGroup(pgid: orphan, startTime: startTime) == true)
        await eventually("the orphan to die") { process.hasEnded }
    }

    @Test func goneOrInvalidGroupIsNotKilled() {
        #expect(ProcessRunner.killStaleGroup(pgid: 0, startTime: 0) == false)
        #expect(ProcessRunner.killStaleGroup(pgid: 1, startTime: 0) == false)
        #expect(ProcessRunner.killStaleGroup(pgid: getpid(), startTime: 0) == false)
        // pid_max is at most 2^22, so this pid never exists.
        #expect(ProcessRunner.killStaleGroup(pgid: 4_194_305, startTime: 0) == false)
    }
}

struct ConcurrencyTests {
    @Test func parallelRunsKeepTheirOwnOutput() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        try await withThrowingTaskGroup(of: (Int, ProcessResult).self) { group in
            for index in 0..<8 {
                let input = Array(String(repeating: "run \(index);", count: 20_000).utf8)
                group.addTask {
                    (index, try await runOffPool(shell("cat; echo end \(index) >&2", in: folder, stdin: input, cap: 1 << 20)))
                }
            }
            for try await (index, result) in group {
                #expect(result.stdout == Array(String(repeating: "run \(index);", count: 20_000).utf8))
                #expect(text(result.stderr) == "end \(index)\n")
                #expect(result.exitStatus == 0)
            }
        }
    }
}

struct SchedulingTests {
    /// The runner's control thread runs as SCHED_BATCH (policy 3); a hook or plugin it starts
    /// gets the normal policy (0), not the runner's.
    @Test func aChildOfABatchThreadRunsWithTheNormalPolicy() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let spawnerPolicy = Locked<Int32>(-1)
        let result = try await runOffPool(
            shell("cut -d' ' -f41 /proc/self/stat", in: folder),
            prepare: {
                var param = sched_param(sched_priority: 0)
                _ = sched_setscheduler(0, 3, &param)
                spawnerPolicy.withLock { $0 = sched_getscheduler(0) }
            })
        #expect(spawnerPolicy.withLock { $0 } == 3)
        #expect(text(result.stdout) == "0\n")
        #expect(result.exitStatus == 0)
    }
}

/// A heartbeat is the caller's work while it waits for a process it runs (the runner renews
/// its leases while a plugin runs).
struct HeartbeatTests {
    final class Count: @unchecked Sendable { var beats = 0 }

    // The child waits for a file that the third beat writes: the beats come while it runs.
    @Test func beatsWhileTheProcessRuns() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let release = folder.path + "/release"
        let (result, beats) = try await offload { () throws -> (ProcessResult, Int) in
            let count = Count()
            var spec = shell("while [ ! -e release ]; do sleep 0.01; done", in: folder)
            spec.heartbeat = Heartbeat(everyMs: 5) {
                count.beats += 1
                if count.beats == 3 { _ = FileManager.default.createFile(atPath: release, contents: nil) }
            }
            return (try ProcessRunner.run(spec), count.beats)
        }
        #expect(result.succeeded)
        #expect(beats >= 3)
    }

    // Made on this thread and run on another, it never beats: what it touches is this thread's.
    @Test func aHeartbeatMadeOnAnotherThreadDoesNotBeat() async throws {
        let folder = TempFolder()
        defer { folder.cleanup() }
        let count = Count()
        var spec = shell("sleep 0.3", in: folder)
        spec.heartbeat = Heartbeat(everyMs: 1) { count.beats += 1 }
        let result = try await runOffPool(spec)
        #expect(result.succeeded)
        #expect(count.beats == 0)
    }
}
