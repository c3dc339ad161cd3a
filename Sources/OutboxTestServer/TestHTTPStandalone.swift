import Glibc

extension TestHTTPServer {
    /// Runs the server as its own process until SIGTERM or SIGINT, then exits 0.
    ///
    /// `arguments` excludes the program name: `[--host H] [--port N] [--port-file PATH]
    /// [--verbose] [--no-hash]`. The port file gets the bound port (written atomically) once the
    /// server listens; stderr gets `listening on HOST:PORT`. Usage errors exit 64.
    package static func runStandalone(arguments: [String]) -> Never {
        var host = "127.0.0.1"
        var port = 0
        var portFile: String?
        var verbose = false
        var hashBodies = true
        var index = 0
        func value(_ option: String) -> String {
            index += 1
            guard index < arguments.count else { usage("\(option) needs a value") }
            return arguments[index]
        }
        while index < arguments.count {
            let argument = arguments[index]
            var option = argument
            var inline: String?
            if argument.hasPrefix("--"), let equals = argument.firstIndex(of: "=") {
                option = String(argument[..<equals])
                inline = String(argument[argument.index(after: equals)...])
            }
            switch option {
            case "--host": host = inline ?? value(option)
            case "--port":
                let text = inline ?? value(option)
                guard let parsed = Int(text), (0...65535).contains(parsed) else { usage("bad port: \(text)") }
                port = parsed
            case "--port-file": portFile = inline ?? value(option)
            case "--verbose", "-v": verbose = true
            case "--no-hash": hashBodies = false
            case "--help", "-h":
                writeStderr(usageText)
                exit(0)
            default: usage("unknown argument: \(argument)")
            }
            index += 1
        }

        // Blocked before any thread starts, so every thread inherits the mask and only
        // sigwait below receives the signals.
        var signals = sigset_t()
        sigemptyset(&signals)
        sigaddset(&signals, SIGTERM)
        sigaddset(&signals, SIGINT)
        pthread_sigmask(SIG_BLOCK, &signals, nil)
        signal(SIGPIPE, SIG_IGN)

        let server: TestHTTPServer
        do {
            server = try TestHTTPServer(host: host, port: port, hashBodies: hashBodies, logRequests: verbose)
        } catch {
            writeStderr("outbox-testserver: \(error)\n")
            exit(1)
        }
        if let portFile {
            guard writeAtomically(path: portFile, contents: "\(server.port)\n") else {
                writeStderr("outbox-testserver: cannot write \(portFile): \(errnoText())\n")
                exit(1)
            }
        }
        writeStderr("listening on \(host):\(server.port)\n")
        var received: Int32 = 0
        while sigwait(&signals, &received) != 0 {}
        server.stop()
        exit(0)
    }

    private static let usageText = """
        usage: outbox-testserver [--host H] [--port N] [--port-file PATH] [--verbose] [--no-hash]
          --host H          IPv4 address to listen on (default 127.0.0.1)
          --port N          port to listen on (default 0: any free port)
          --port-file PATH  write the bound port to PATH once listening
          --verbose         log one line per request to stderr
          --no-hash         do not hash request bodies (for throughput benchmarks)

        """

    private static func usage(_ message: String) -> Never {
        writeStderr("outbox-testserver: \(message)\n" + usageText)
        exit(64)
    }

    /// Temp file + rename, so a reader polling for the file never sees it half written.
    private static func writeAtomically(path: String, contents: String) -> Bool {
        let temp = "\(path).tmp.\(getpid())"
        let fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return false }
        let bytes = Array(contents.utf8)
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        guard written == bytes.count, rename(temp, path) == 0 else {
            unlink(temp)
            return false
        }
        return true
    }
}
