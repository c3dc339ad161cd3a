import Foundation
import Glibc
import OutboxModel
import TestSupport
import Testing

/// An outcome that enqueues its own id again with the same body (a hook's enqueue line, or a
/// `then` follow-up of a definition without a hook): the entry is forgotten as the outcome is
/// acknowledged, in the transaction that writes the new one, which must get the bytes. It
/// got none: a file body left an entry every command stopped at with 74, a data body went
/// out empty.
struct FollowUpSameIdTests {
    /// The source of a copy may be deleted once enqueued, and a moved one has left: the line
    /// naming that path still means the bytes the entry holds.
    @Test(arguments: ["copy", "reference", "move"])
    func aHookThatEnqueuesItsOwnFileEntryAgainSendsTheFileAgain(_ ownership: String) async throws {
        // Asks for the same entry again at its first delivery, and only then.
        let again = """
            #!/bin/sh
            cat > /dev/null
            [ -e hooks/asked ] && exit 0
            touch hooks/asked
            printf '{"enqueue": {"key": "f", "id": "%s", "vars": {"url": "%s", "path": "%s"}}}\\n' "$OUTBOX_ID" "$URL" "$SRC"

            """
        let definition = fileDefinition("f", ownership: ownership).replacingOccurrences(
            of: "on_success: hooks/record.sh", with: "on_success: hooks/again.sh")
        let p = try Project(definitions: ["f": definition], hooks: ["again.sh": again])
        let bytes = String(repeating: "0123456789", count: 300)
        let source = try p.write("data/src.bin", bytes)
        p.environment["URL"] = p.url("/put/h1")
        p.environment["SRC"] = source
        let vars = JSON.object([("url", .string(p.url("/put/h1"))), ("path", .string(source))]).serialized()
        #expect(try await p.outbox(["enqueue", "f", "--vars", vars, "--id", "h1"]).exitCode == 0)
        if ownership == "copy" { try FileManager.default.removeItem(atPath: source) }
        let run = try await p.drain(failures: 0)
        #expect(p.server.requests(path: "/put/h1").map(\.bodySize) == [3000, 3000], "sent again, whole: \(run.stderr)")
        #expect(Set(p.server.requests(path: "/put/h1").map(\.bodySHA256)).count == 1, "the same bytes")
        #expect(try await p.outbox(["audit"]).exitCode == 0)
        #expect(try await p.list().isEmpty)
        // The next run and the commands that read every entry go on.
        #expect(try await p.outbox(["cancel", "--all"]).exitCode == 0)
        try await p.drain(failures: 0)
        #expect(FileManager.default.fileExists(atPath: source) == (ownership == "reference"))
        let staged = (try? FileManager.default.contentsOfDirectory(atPath: p.root + "/.outbox/bodies")) ?? []
        #expect(staged.isEmpty, "nothing left behind: \(staged)")
    }

    /// A `then` follow-up of its own id that sends the same file elsewhere (another URL, so
    /// another body): the bytes the entry holds pass to it. They were removed with the settled
    /// entry, and the follow-up failed "the staged payload is missing" (with `move`, the user's
    /// only copy).
    @Test(arguments: ["copy", "move"])
    func aThenFollowUpOfItsOwnIdSendingTheFileElsewhereKeepsItsBytes(_ ownership: String) async throws {
        let first = """
            key: first
            request:
              method: PUT
              url: "{{ vars.base | raw }}/put/first"
              file: "{{ vars.path }}"
              ownership: \(ownership)
            then:
              on_success:
                - key: second
                  id: "{{ entry.id }}"
                  vars: { base: "{{ vars.base }}", path: "{{ vars.path }}" }
            """
        let second = """
            key: second
            request:
              method: PUT
              url: "{{ vars.base | raw }}/put/second"
              file: "{{ vars.path }}"
              ownership: \(ownership)
            on_success: hooks/record.sh
            """
        let p = try Project(definitions: ["first": first, "second": second])
        let source = try p.write("data/src.bin", String(repeating: "0123456789", count: 300))
        let vars = JSON.object([("base", .string(p.url(""))), ("path", .string(source))]).serialized()
        #expect(try await p.outbox(["enqueue", "first", "--vars", vars, "--id", "e1"]).exitCode == 0)
        if ownership == "copy" { try FileManager.default.removeItem(atPath: source) }
        let run = try await p.drain(failures: 0)
        #expect(p.server.requests(path: "/put/first").map(\.bodySize) == [3000], "\(run.stderr)")
        #expect(p.server.requests(path: "/put/second").map(\.bodySize) == [3000], "\(run.stderr)")
        #expect(p.deliveries("e1").first?.string("stdin.outcome") == "completed")
        #expect(try await p.outbox(["audit"]).exitCode == 0)
        let staged = (try? FileManager.default.contentsOfDirectory(atPath: p.root + "/.outbox/bodies")) ?? []
        #expect(staged.isEmpty, "nothing left behind: \(staged)")
    }

    @Test func aThenFollowUpOfItsOwnIdKeepsItsDataBody() async throws {
        let again = """
            key: again
            request:
              url: "{{ vars.url }}"
              data: { n: "{{ vars.n }}", msg: "hello" }
            then:
              on_success:
                - key: again
                  id: "{{ entry.id }}"
                  vars: { url: "{{ vars.url }}", n: "{{ vars.n }}" }
            """
        let p = try Project(definitions: ["again": again])
        let vars = JSON.object([("url", .string(p.url("/post/again"))), ("n", .int(1))]).serialized()
        #expect(try await p.outbox(["enqueue", "again", "--vars", vars, "--id", "e1"]).exitCode == 0)
        // It asks for itself for ever: three sends are enough to see the bodies.
        try await p.runUntil(until: "three sends") { _ in p.server.requests(path: "/post/again").count >= 3 }
        let bodies = p.server.requests(path: "/post/again").map { String(decoding: $0.body ?? [], as: UTF8.self) }
        #expect(bodies.allSatisfy { $0 == #"{"n":1,"msg":"hello"}"# }, "\(bodies)")
        let shown = try #require(try await p.show("e1"))
        #expect(shown["total_bytes"] == .int(bodies.first?.utf8.count ?? 0))
        // Its own parent: the chain names it once, not fifty times.
        #expect(shown["chain"] == .array([.string("e1")]), "\(shown)")
    }

    /// With a hook, the outcome is delivered after the follow-up is applied: the follow-up
    /// naming its own id must not be taken for the same entry asked again (whose outcome is
    /// then delivered once more and nothing sent); it is sent again once that delivery ends.
    @Test func aThenFollowUpOfItsOwnIdWithAHookIsSentAgain() async throws {
        let poll = """
            key: poll
            request:
              url: "{{ vars.url }}"
              data: { n: 1 }
            on_success: hooks/record.sh
            then:
              on_success:
                - key: poll
                  id: "{{ entry.id }}"
                  vars: { url: "{{ vars.url }}" }
            """
        let p = try Project(definitions: ["poll": poll])
        let vars = JSON.object([("url", .string(p.url("/post/poll")))]).serialized()
        #expect(try await p.outbox(["enqueue", "poll", "--vars", vars, "--id", "p1"]).exitCode == 0)
        try await p.runUntil(until: "three sends") { _ in p.server.requests(path: "/post/poll").count >= 3 }
        // Each send's outcome went to the hook, each of its own generation, in order.
        let generations = p.deliveries("p1").compactMap { $0.int("stdin.meta.generation") }
        #expect(generations.count >= 2 && generations == Array(1...Int64(generations.count)), "\(p.hookLog)")
    }
}
