import CSystem
import Glibc
import OutboxCLI
import OutboxModel

/// The whole program, in a function: top-level variables would be main-actor globals, and
/// this binary leaves out the concurrency runtime they need.
func main() -> Int32 {
    signal(SIGPIPE, SIG_IGN)
    // A plugin in its own process group does not outlive a command ended by a signal.
    csystem_stop_guard_install()
    // A closed stdin, stdout or stderr is held by /dev/null read-only, so no file opened later
    // takes its number (output meant for the terminal would land in it); writes there still fail.
    // A closed stdin stays one for `--from -` and `--vars -` (E_FILE_MISSING), not empty input.
    var stdinClosed = false
    for fd: Int32 in 0...2 where fcntl(fd, F_GETFD) < 0 && errno == EBADF {
        if fd == 0 { stdinClosed = true }
        _ = open("/dev/null", O_RDONLY)
    }
    Fault.arm()
    var environment: [String: String] = [:]
    var pointer = environ
    while let entry = pointer.pointee {
        // Split at the first `=` byte (a search by Character would cut every name into graphemes).
        if let eq = strchr(entry, Int32(UInt8(ascii: "="))) {
            let name = UnsafeRawBufferPointer(start: entry, count: entry.distance(to: eq))
            environment[String(decoding: name, as: UTF8.self)] = String(cString: eq + 1)
        }
        pointer += 1
    }
    // The bytes as given: `CommandLine.arguments` would quietly repair what is not UTF-8.
    let arguments = (1..<Int(CommandLine.argc)).map { n in
        CommandLine.unsafeArgv[n].map {
            Array(UnsafeBufferPointer(start: UnsafeRawPointer($0).assumingMemoryBound(to: UInt8.self), count: strlen($0)))
        } ?? []
    }
    let status = CLI.run(
        rawArguments: arguments, environment: environment, cwd: currentDirectory(), console: Console.standard(stdinClosed: stdinClosed))
    return status
}

exit(main())
