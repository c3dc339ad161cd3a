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
