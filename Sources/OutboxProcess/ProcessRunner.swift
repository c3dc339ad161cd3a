import CSystem
import Glibc

/// Runs hook and plugin processes: vfork + exec in their own process group, one poll loop
/// over stdin, stdout, stderr and a pidfd.
package enum ProcessRunner {
    /// Grace period between SIGTERM and SIGKILL when a timeout fires.
    static let killGraceMs: Int64 = 2000
    /// How long pipes are drained after the child exited; a background grandchild may
    /// hold them open forever.
    static let drainMs: Int64 = 100
    /// PATH used to find an argv program when the spec's environment has none.
    package static let defaultPath = "/usr/local/bin:/usr/bin:/bin"

    /// Runs to completion, blocking the calling thread (call it from a dedicated thread,
    /// never the Swift cooperative pool).
    package static func run(_ spec: ProcessSpec) throws(ProcessSpawnError) -> ProcessResult {
        // A signal that ends the process meanwhile kills the plugin's group first (it is out of a
        // terminal's Ctrl-C), then ends the process when the wait is over.
        csystem_plugin_wait_begin()
        defer { csystem_plugin_wait_end() }
        // This thread waits for it to its end: a SIGKILL of outbox meanwhile takes it along.
        let started = try start(spec, diesWithThisThread: true)
        spec.onStart?(started.pid, started.startTime)
        return finish(started)
    }

    /// A process spawned by `start`, run to completion by `finish`.
    package struct Started: @unchecked Sendable {
        let child: csystem_child
        let spec: ProcessSpec
        let spawnedAt: Int64
        /// Its pid, which is also its process group.
        package var pid: Int32 { child.pid }
        /// Its start time (clock ticks since boot); 0 when it has exited already.
        package let startTime: UInt64
    }

    /// Spawns without waiting, so the caller can record the process group before doing
    /// anything else; `finish` (on a thread of its own) feeds and reaps it.
    package static func start(_ spec: ProcessSpec, diesWithThisThread: Bool = false) throws(ProcessSpawnError) -> Started {
        let child = try spawn(spec, diesWithThisThread: diesWithThisThread)
        // /proc is read only when a clock tick passed during the spawn.
        let start = child.start_time != 0 ? child.start_time : startTime(of: child.pid) ?? 0
        return Started(child: child, spec: spec, spawnedAt: csystem_proc_now_ms(), startTime: start)
    }

    /// Writes stdin, reads stdout and stderr, enforces the timeouts and reaps the process.
    /// Blocks the calling thread.
    package static func finish(_ started: Started) -> ProcessResult {
        // Even if main forgot ignoreSIGPIPE, a hook that stops reading must not kill us.
        let sigpipeWasBlocked = csystem_proc_block_sigpipe()
        defer { csystem_proc_restore_sigpipe(sigpipeWasBlocked) }
        var session = ChildSession(child: started.child, spec: started.spec, spawnedAt: started.spawnedAt)
        return session.runToCompletion()
    }

    /// The one way outbox starts a process: in its own process group, with only fds 0-2,
    /// default signal dispositions and the normal scheduling policy, its output on two pipes.
    /// With `feedsStdin` the caller writes its stdin for as long as it runs (`spec.stdin` unused).
    /// `diesWithThisThread`: the child gets SIGKILL when the calling thread ends (it waits for it).
    static func spawn(
        _ spec: ProcessSpec, feedsStdin: Bool = false, diesWithThisThread: Bool = false
    ) throws(ProcessSpawnError) -> csystem_child {
        let (path, arguments) = try resolve(spec)
        try checkStrings(arguments: arguments, environment: spec.environment)
        let argv = CStringArray(arguments)
        var child = csystem_child()
        var rc: Int32 = 0
        for attempt in 0..<5 {
            rc = argv.withPointers { argvPointer in
                spec.environment.withPointers { envpPointer in
                    if feedsStdin { return csystem_spawn(path, argvPointer, envpPointer, spec.workingDirectory, &child) }
                    return spec.stdin.withUnsafeBytes { input in
                        diesWithThisThread
                            ? csystem_spawn_dying_with_parent(
                                path, argvPointer, envpPointer, spec.workingDirectory, input.baseAddress, input.count, &child)
                            : csystem_spawn_with_input(
                                path, argvPointer, envpPointer, spec.workingDirectory, input.baseAddress, input.count, &child)
                    }
                }
            }
            // A script written just now can still be open for writing in another thread's
            // freshly spawned child (until its exec), giving ETXTBSY for a moment.
            guard rc == -ETXTBSY, attempt < 4 else { break }
            usleep(UInt32(10_000 << attempt))
        }
        guard rc == 0 else {
            // Looked at only now: the child's chdir fails the spawn when the folder is missing.
            guard csystem_proc_is_directory(spec.workingDirectory) == 1 else {
                throw ProcessSpawnError(
                    message: "cannot start \(arguments[0]): working directory \(spec.workingDirectory) is not a folder")
            }
            // ENOENT (or EACCES) for an executable file that is there: its #! interpreter is what is wrong.
            let file = path.hasPrefix("/") ? path : spec.workingDirectory + "/" + path
            let interpreterError = -rc == ENOENT || -rc == ENOEXEC || (-rc == EACCES && csystem_proc_is_executable(file) == 1)
            if interpreterError, let why = execProblem(file, runDirectly: true, folder: spec.workingDirectory) {
                throw ProcessSpawnError(message: "cannot start \(path): the file \(why)")
            }
            throw ProcessSpawnError(
                message: "cannot start \(path): \(errorText(-rc))", transient: [EMFILE, ENFILE, ENOMEM, EAGAIN].contains(-rc))
        }
        return child
    }

    /// Why the kernel would refuse to start an executable file: a `#!` line whose interpreter
    /// is missing (a CRLF line end makes it `sh\r`), or, run directly rather than by a shell
    /// (which runs such a file itself), a file that is neither a program nor a script.
    /// `folder`: where the command runs (a relative interpreter is looked up there).
    package static func execProblem(_ path: String, runDirectly: Bool, folder: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var head = [UInt8](repeating: 0, count: 256)
        let n = read(fd, &head, head.count)
        guard n > 0 else { return nil }
        let bytes = head[0..<n]
        guard bytes.starts(with: Array("#!".utf8)) else {
            if runDirectly, !bytes.starts(with: [0x7F, 0x45, 0x4C, 0x46]) {
                return "has no #! line and is not a program: run without a shell it cannot start (add #!/bin/sh)"
            }
            return nil
        }
        let line = bytes.dropFirst(2).prefix { $0 != 0x0A }
        if line.contains(0x0D) { return "has a CRLF line end on its #! line: the interpreter would be looked up with a CR in its name" }
        let words = String(decoding: line, as: UTF8.self).split(whereSeparator: { $0 == " " || $0 == "\t" })
        guard let interpreter = words.first.map(String.init) else { return nil }
        // The kernel looks a relative interpreter up in the folder the command runs in, never in PATH.
        let resolved = interpreter.hasPrefix("/") ? interpreter : folder + "/" + interpreter
        if csystem_proc_is_executable(resolved) == 1 { return nil }
        guard interpreter.hasPrefix("/") else {
            let name = interpreter.split(separator: "/").last.map(String.init) ?? interpreter
            return "names the interpreter \(interpreter) by a relative path, which the kernel looks up in \(folder), "
                + "not in PATH, and finds no executable file there (write #!/usr/bin/env \(name))"
        }
        let exists = access(interpreter, F_OK) == 0
        return "names the interpreter \(interpreter), which \(exists ? "is not an executable file" : "does not exist")"
    }

    /// Kills a process group left over from an earlier runner, if its leader still has this
    /// start time. Returns true when the group was signalled.
    ///
    /// A group whose leader has already exited is left alone: its number cannot be told apart
    /// from an unrelated group once the leader's pid may have been reused.
    package static func killStaleGroup(pgid: Int32, startTime: UInt64) -> Bool {
        guard pgid > 1, pgid != getpgrp(), pgid != getpid() else { return false }
        // The pidfd pins the pid, so the number cannot be reused between the check and the kill.
        let pidfd = csystem_proc_pidfd_open(pgid)
        guard pidfd >= 0 else { return false }
        defer { csystem_proc_close(pidfd) }
        var start: UInt64 = 0
        var group: Int32 = 0
        guard csystem_proc_stat(pgid, &start, &group) == 0, start == startTime else { return false }
        _ = csystem_proc_killpg(pgid, SIGKILL)
        // The leader may have moved to another group; it is still the recorded hook.
        _ = csystem_proc_pidfd_signal(pidfd, SIGKILL)
        // Wait briefly until the leader is dead, so redelivery cannot overlap it.
        _ = csystem_proc_poll_readable(pidfd, 2000)
        return true
    }

    /// The current process environment as a dictionary (from `environ`).
    package static func currentEnvironment() -> [String: String] {
        var result: [String: String] = [:]
        guard let environ = csystem_proc_environ() else { return result }
        var index = 0
        while let entry = environ[index] {
            index += 1
            let text = String(cString: entry)
            guard let equals = text.firstIndex(of: "=") else { continue }
            let key = String(text[..<equals])
            // getenv returns the first of duplicate names, so keep the first too.
            if result[key] == nil {
                result[key] = String(text[text.index(after: equals)...])
            }
        }
        return result
    }

    /// Ignores SIGPIPE in this process so writes to a closed pipe return EPIPE; call once
    /// from main (children get SIGPIPE back at its default). `run` also blocks SIGPIPE on
    /// its own thread while it writes, as a second line of defence.
    package static func ignoreSIGPIPE() {
        csystem_proc_ignore_sigpipe()
    }

    /// The start time (clock ticks since boot) of a live process, nil when it is gone.
    /// This process's start time (clock ticks since boot): with the pid, names it for good.
    package static let ownStartTime: UInt64 = startTime(of: getpid()) ?? 0

    package static func startTime(of pid: Int32) -> UInt64? {
        var start: UInt64 = 0
        var group: Int32 = 0
        return csystem_proc_stat(pid, &start, &group) == 0 ? start : nil
    }

    /// The program path and argv for a command.
    static func resolve(_ spec: ProcessSpec) throws(ProcessSpawnError) -> (String, [String]) {
        switch spec.command {
        case .shell(let line):
            return ("/bin/sh", ["sh", "-c", line])
        case .argv(let arguments):
            guard let program = arguments.first, !program.isEmpty else {
                throw ProcessSpawnError(message: "cannot start a command with an empty program name")
            }
            if program.contains("/") {
                return (program, arguments)
            }
            // Searched with the child's PATH, not ours: the environment is the child's.
            let searchPath = spec.environment["PATH"] ?? defaultPath
            for entry in searchPath.split(separator: ":", omittingEmptySubsequences: false) {
                var folder = String(entry)
                if folder.isEmpty { folder = "." }
                if !folder.hasPrefix("/") { folder = spec.workingDirectory + "/" + folder }
                let candidate = folder + "/" + program
                if csystem_proc_is_executable(candidate) == 1 {
                    return (candidate, arguments)
                }
            }
            throw ProcessSpawnError(message: "cannot start \(program): command not found in PATH")
        }
    }

    /// C strings end at NUL, and `=` in a name would split differently in the child.
    static func checkStrings(arguments: [String], environment: ProcessEnvironment) throws(ProcessSpawnError) {
        if arguments.contains(where: { $0.utf8.contains(0) }) {
            throw ProcessSpawnError(message: "cannot start \(arguments[0]): an argument contains a NUL byte")
        }
        if let problem = environment.problem {
            throw ProcessSpawnError(message: "cannot start \(arguments[0]): \(problem)")
        }
    }

    static func errorText(_ code: Int32) -> String {
        guard let text = strerror(code) else { return "error \(code)" }
        return String(cString: text)
    }
}

/// A NULL-terminated array of strdup'ed C strings, freed on deinit.
/// Never changed after init, so it can be shared between threads.
final class CStringArray: @unchecked Sendable {
    private let pointers: [UnsafeMutablePointer<CChar>?]

    init(_ strings: [String]) {
        // Allocated and freed by Swift, one allocator for both (no strdup/free pairing).
        pointers =
            strings.map { string in
                let bytes = string.utf8CString
                let pointer = UnsafeMutablePointer<CChar>.allocate(capacity: bytes.count)
                bytes.withUnsafeBufferPointer { pointer.initialize(from: $0.baseAddress!, count: bytes.count) }
                return pointer
            } + [nil]
    }

    deinit {
        for pointer in pointers { pointer?.deallocate() }
    }

    func withPointers<R>(_ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) -> R) -> R {
        pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
    }
}
