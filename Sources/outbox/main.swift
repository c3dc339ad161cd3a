import Glibc
import OutboxCLI
import OutboxModel

signal(SIGPIPE, SIG_IGN)
Fault.arm()
var environment: [String: String] = [:]
var pointer = environ
while let entry = pointer.pointee {
    let text = String(cString: entry)
    if let eq = text.firstIndex(of: "=") {
        environment[String(text[..<eq])] = String(text[text.index(after: eq)...])
    }
    pointer += 1
}
let status = CLI.run(
    arguments: Array(CommandLine.arguments.dropFirst()), environment: environment,
    cwd: currentDirectory(), console: Console.standard())
exit(status)
