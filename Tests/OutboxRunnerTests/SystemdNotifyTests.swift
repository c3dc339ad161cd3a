import Foundation
import Glibc
import OutboxModel
import OutboxRunner
import TestSupport
import Testing

/// Under systemd `outbox run` speaks the notify protocol: READY=1 once it holds the store,
/// WATCHDOG=1 while it runs when asked, STOPPING=1 when it stops. The test plays the
/// service manager's socket.
struct SystemdNotifyTests {
    /// A datagram socket bound to a path in the project, read without blocking.
    final class NotifySocket {
        let fd: Int32
        let path: String
        private(set) var messages: [String] = []

        init(path: String) throws {
            self.path = path
            fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { raw in
                for (i, b) in path.utf8.enumerated() { raw[i] = b }
            }
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            guard fd >= 0, bound == 0 else { throw FixtureError("cannot bind the notify socket at \(path)") }
        }

        deinit { close(fd) }

        /// Every datagram that has arrived so far.
        func drain() -> [String] {
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let n = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
                guard n > 0 else { break }
                messages.append(String(decoding: buffer[0..<n], as: UTF8.self))
            }
            return messages
        }
    }

    @Test func readyWatchdogAndStopping() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        defer { p.server.release("a") }
        // Unix socket paths are short: the temp folder's name may not fit, so /tmp it is.
        let notify = try NotifySocket(path: "/tmp/outbox-notify-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        defer { unlink(notify.path) }
        try await p.enqueue("t", path: "/hold/a", id: "a")
        let runner = try p.start(["run"], environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "200000"])
        #expect(await p.server.waitForHeld("a"), "\(runner.stderrSoFar)")
        await eventually("READY=1 and a watchdog ping") {
            let got = notify.drain()
            return got.first?.hasPrefix("READY=1") == true && got.contains("WATCHDOG=1")
        }
        #expect(!notify.drain().contains("STOPPING=1"))
        runner.signal(SIGTERM)
        await eventually("STOPPING=1") { notify.drain().contains("STOPPING=1") }
        p.server.release("a")
        #expect(await runner.wait(timeout: 60).exitCode == 0)
        #expect(notify.drain().filter { $0 == "STOPPING=1" }.count == 1)
        #expect(notify.drain().first?.contains("MAINPID=\(runner.pid)") == true)
    }

    /// As systemd's own library does: pings are asked of the process WATCHDOG_PID names, when set.
    @Test(arguments: [(nil, true), ("self", true), ("1", false), ("not-a-pid", false)])
    func theWatchdogIsOursOnlyWhenWatchdogPidNamesUs(_ pid: String?, _ pings: Bool) throws {
        var environment = ["NOTIFY_SOCKET": "@outbox-test-\(getpid())", "WATCHDOG_USEC": "200000"]
        environment["WATCHDOG_PID"] = pid == "self" ? String(getpid()) : pid
        let notifier = try #require(SystemdNotifier(environment: environment))
        #expect(notifier.watchdogEveryMs == (pings ? 100 : nil))
    }

    @Test func withoutNotifySocketNothingIsSentAndTheRunWorks() async throws {
        let p = try Project(definitions: ["t": definition("t")])
        try await p.enqueue("t", path: "/status/200", id: "a")
        let run = try await p.outbox(["run", "--drain"], environment: ["NOTIFY_SOCKET": "relative-is-ignored"])
        #expect(run.exitCode == 0, "\(run.description)")
    }
}

/// The example units in examples/systemd pass systemd's own check.
struct SystemdUnitTests {
    @Test func theExampleUnitsVerify() throws {
        let analyze = "/usr/bin/systemd-analyze"
        guard FileManager.default.isExecutableFile(atPath: analyze) else {
            Issue.record("systemd-analyze is missing (Debian's systemd package): the example units cannot be verified")
            return
        }
        let folder = TemporaryFolder(prefix: "units")
        // #filePath is Tests/OutboxRunnerTests/SystemdNotifyTests.swift.
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let examples = root.path + "/examples/systemd"
        var paths: [String] = []
        for name in ["outbox.service", "outbox-drain.service", "outbox-drain.timer"] {
            let text = try String(contentsOfFile: examples + "/" + name, encoding: .utf8)
                .replacingOccurrences(of: "/usr/local/bin/outbox", with: builtExecutable("outbox"))
            let path = folder.path + "/" + name
            try text.write(toFile: path, atomically: true, encoding: .utf8)
            paths.append(path)
        }
        let result = try runProcess(analyze, ["verify", "--man=no"] + paths)
        #expect(result.exitCode == 0, "\(result)")
        #expect(result.stderr.isEmpty, "\(result.stderr)")
    }
}
