import Foundation
import OutboxModel
import OutboxTestServer
import Testing
import TestSupport

/// File bodies on a PostgreSQL store shared by hosts: runners under other host names (each in
/// a UTS namespace of its own, so `gethostname` really differs) send a staged body only when
/// the staging folder is declared shared; a chunked upload whose runner dies goes on from
/// another host without sending accepted parts again.
@Suite(.serialized)
struct PostgresStagingTests {
    static let partSize = 64 * 1024

    /// A project on a schema of its own whose `upload` definition PUTs a file in 64 KiB parts,
    /// one part at a time, staged under `shared-staging`.
    static func project(shared: Bool) throws -> TestProject {
        let cluster = try PostgresCluster.shared()
        let p = try TestProject(
            // No stall limit: a held part stays held until its runner is killed, however slowly
            // the test gets to see it (a sanitizer run), instead of being given up after 60 s.
            config: """
                lease: 2s
                part_concurrency: 1
                staging: { path: shared-staging, shared: \(shared) }
                timeouts: { stall: { for: 1h } }

                """,
            definitions: [
                "upload": """
                key: upload
                request:
                  method: PUT
                  file: "{{ vars.path }}"
                  ownership: copy
                  parts:
                    plan: { min: 64KiB, max: 64KiB }
                    url: "{{ env.SERVER | raw }}/put/big/part-{{ part.number }}"
                """
            ])
        p.environment["OUTBOX_STORE"] = cluster.url(schema: PostgresCluster.uniqueSchema("staging"))
        p.environment["SERVER"] = p.server.baseURL
        try Data((0..<(5 * partSize)).map { UInt8(truncatingIfNeeded: $0 &* 7) }).write(to: URL(fileURLWithPath: p.path("big.bin")))
        return p
    }

    /// `outbox ARGS` started on the host `host`: a new UTS namespace whose host name is set
    /// before outbox starts (as root, or as this user mapped to root in a user namespace).
    static func start(_ p: TestProject, host: String, _ arguments: [String]) throws -> RunningProcess {
        let namespaces = getuid() == 0 ? ["--uts"] : ["--user", "--map-root-user", "--uts"]
        return try RunningProcess(
            executable: "/usr/bin/unshare",
            arguments: namespaces + ["/bin/sh", "-c", #"hostname "$0" && shift && exec "$@""#, host, "sh", p.executable] + arguments,
            cwd: p.root, environment: p.processEnvironment())
    }

    static func requests(_ p: TestProject, part: Int) -> Int { p.server.requests(path: "/put/big/part-\(part)").count }

    @Test func aChunkedUploadGoesOnFromAnotherHostWithoutSendingAcceptedPartsAgain() async throws {
        let p = try Self.project(shared: true)
        p.server.script("/put/big/part-3", [.hold("dies"), .json(200, "{}")])
        let enqueued = try await Self.start(p, host: "host-a", ["enqueue", "upload", "--id", "big", "--vars", #"{"path": "big.bin"}"#])
            .wait()
        #expect(enqueued.exitCode == 0, "\(enqueued)")
        let first = try Self.start(p, host: "host-a", ["run"])
        #expect(await p.server.waitForHeld("dies"))
        #expect(Self.requests(p, part: 1) == 1 && Self.requests(p, part: 2) == 1)
        first.signal(SIGKILL)
        _ = await first.wait()

        // The other host takes the entry once the dead runner's lease is over, and sends from part 3.
        let second = try Self.start(p, host: "host-b", ["run"])
        try await eventually("the other host finishes the upload") {
            let list = try await p.outbox(["list", "--json"])
            let empty = try JSON.parse(list.stdout).arrayValue?.isEmpty == true
            return Self.requests(p, part: 5) == 1 && list.exitCode == 0 && empty
        }
        second.signal(SIGTERM)
        let stopped = await second.wait()
        #expect(stopped.exitCode == 0, "\(stopped)")
        #expect((1...5).map { Self.requests(p, part: $0) } == [1, 1, 2, 1, 1])
        let sent = (1...5).flatMap { part in p.server.requests(path: "/put/big/part-\(part)").last?.body ?? [] }
        #expect(sent == Array(try Data(contentsOf: URL(fileURLWithPath: p.path("big.bin")))), "the parts make the file")
        #expect(stopped.stderr.contains("back in the queue"), "\(stopped.stderr)")
        _ = p.server.release("dies")
    }

    @Test func withoutASharedFolderOnlyTheEnqueuingHostSendsTheBody() async throws {
        let p = try Self.project(shared: false)
        let enqueued = try await Self.start(p, host: "host-a", ["enqueue", "upload", "--id", "big", "--vars", #"{"path": "big.bin"}"#])
            .wait()
        #expect(enqueued.exitCode == 0, "\(enqueued)")
        let explained = try await Self.start(p, host: "host-b", ["explain", "big"]).wait()
        #expect(explained.stdout.contains("its file body is staged on host host-a"), "\(explained)")

        // A drain on the other host leaves it queued and sends nothing.
        let elsewhere = try await Self.start(p, host: "host-b", ["run", "--drain"]).wait()
        #expect(!elsewhere.timedOut, "\(elsewhere)")
        #expect(p.server.requests(path: "/put/big/").isEmpty)
        let listed = try await p.outbox(["list", "--json"])
        #expect(try JSON.parse(listed.stdout).arrayValue?.first?["state"] == .string("queued"), "\(listed)")
        let here = try await Self.start(p, host: "host-a", ["run", "--drain"]).wait()
        #expect(here.exitCode == 0, "\(here)")
        #expect((1...5).map { Self.requests(p, part: $0) } == [1, 1, 1, 1, 1])
    }
}
