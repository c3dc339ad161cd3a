import OutboxProcess
import OutboxRunner
import Testing

/// A turn's hooks are started on several threads; each result stays at its spec's place.
struct HookSpawnTests {
    static func spec(_ command: ProcessCommand) -> ProcessSpec {
        ProcessSpec(command: command, environment: ["PATH": "/usr/bin:/bin"], workingDirectory: "/")
    }

    @Test func aTurnWithoutHooksStartsNothing() {
        #expect(Runner.startHooks([]).isEmpty)
    }

    @Test func oneHookStartsAndExits() throws {
        let results = Runner.startHooks([Self.spec(.shell("exit 7"))])
        let started = try #require(try results.first?.get())
        #expect(ProcessRunner.finish(started).exitStatus == 7)
    }

    /// Twelve hooks, each exiting with its own index, one of them a program that does not
    /// exist: the results come back in the specs' order, the failure where its spec was.
    @Test func resultsFollowTheSpecsOrder() throws {
        let missing = 5
        let specs = (0..<12).map { index in
            index == missing ? Self.spec(.argv(["no-such-program-\(index)"])) : Self.spec(.shell("exit \(index)"))
        }
        let results = Runner.startHooks(specs)
        #expect(results.count == specs.count)
        var pids = Set<Int32>()
        for (index, result) in results.enumerated() {
            switch result {
            case let .success(started):
                #expect(index != missing)
                pids.insert(started.pid)
                #expect(ProcessRunner.finish(started).exitStatus == Int32(index), "hook \(index)")
            case let .failure(error):
                #expect(index == missing)
                #expect(error.message.contains("no-such-program-\(missing)"), "\(error.message)")
            }
        }
        #expect(pids.count == specs.count - 1)
    }
}

/// A hook that is missing (or cannot be run) fails its delivery like one that exits non-zero:
/// the count rises and with it the backoff, rather than a retry every `base` for ever.
struct MissingHookTests {
    @Test(arguments: ["missing.sh", "not-executable.sh"])
    func aHookThatCannotStartCountsItsDeliveries(_ hook: String) async throws {
        let p = try Project(definitions: ["m": definition("m", top: "on_success: [\"hooks/\(hook)\"]", hooks: false)])
        try p.write("hooks/not-executable.sh", "#!/bin/sh\nexit 0\n", mode: 0o644)
        try await p.enqueue("m", path: "/status/200", id: "m1")
        let run = try await p.runUntil { runner in runner.stderrSoFar.contains("for m1 (delivery 2)") }
        #expect(run.stderr.contains("the hook could not start"), "\(run.stderr)")
        let show = try #require(try await p.show("m1"))
        #expect((show.int("outcomes.0.deliveries") ?? 0) >= 2, "\(show)")
    }
}
