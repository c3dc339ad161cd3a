import Glibc
import OutboxModel
import OutboxProcess

/// Where event lines go: stdout (`--events -`) and/or a long-lived `events.command` plugin.
public final class EventSink: @unchecked Sendable {
    let write: ((String) -> Void)?
    var pipe: Int32 = -1
    var child: pid_t = 0

    public init(console: (any EventConsole)?, command: CommandSpec?, config: Config, environment: [String: String]) {
        write = console.map { c in { c.out($0) } }
        if let command { start(command, config: config, environment: environment) }
    }

    private func start(_ command: CommandSpec, config: Config, environment: [String: String]) {
        var fds: [Int32] = [-1, -1]
        guard Glibc.pipe(&fds) == 0 else { return }
        _ = fcntl(fds[1], F_SETFD, FD_CLOEXEC)
        let argv: [String]
        switch command {
        case let .shell(s): argv = ["/bin/sh", "-c", s]
        case let .argv(a): argv = a
        }
        // The plugin reads event lines on stdin for the runner's lifetime; it runs detached.
        let stdinFD = fds[0]
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_adddup2(&actions, stdinFD, 0)
        posix_spawn_file_actions_addclose(&actions, stdinFD)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for s in [SIGPIPE, SIGTERM, SIGINT, SIGCHLD] { sigaddset(&defaults, s) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP))
        let cArgs = argv.map { strdup($0) } + [nil]
        let cEnv = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        var pid = pid_t()
        let rc = posix_spawnp(&pid, argv[0], &actions, &attributes, cArgs, cEnv)
        for p in cArgs { free(p) }
        for p in cEnv { free(p) }
        posix_spawn_file_actions_destroy(&actions)
        posix_spawnattr_destroy(&attributes)
        Glibc.close(stdinFD)
        if rc == 0 {
            child = pid
            pipe = fds[1]
        } else {
            Glibc.close(fds[1])
        }
    }

    public func send(_ event: JSON) {
        // Without a reader, serializing every event costs the runner real time.
        guard write != nil || pipe >= 0 else { return }
        let line = event.serialized()
        write?(line)
        if pipe >= 0 {
            let text = line + "\n"
            let ok = text.withCString { Glibc.write(pipe, $0, strlen($0)) } >= 0
            if !ok { Glibc.close(pipe); pipe = -1 }
        }
    }

    public func close() {
        if pipe >= 0 { Glibc.close(pipe); pipe = -1 }
        if child > 0 {
            var status: Int32 = 0
            waitpid(child, &status, 0)
            child = 0
        }
    }
}

/// Something that prints lines on stdout (the CLI's console).
public protocol EventConsole: AnyObject {
    func out(_ line: String)
}
