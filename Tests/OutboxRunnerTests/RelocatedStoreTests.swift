import Foundation
import OutboxModel
import TestSupport
import Testing

/// A project moved whole (its `.outbox/` with it), or reached through a symbolic link: its
/// staged bodies go with it and are sent; none is taken for an orphan and removed.
struct RelocatedStoreTests {
    static let bytes = Array("the only copy of these bytes".utf8)

    /// Enqueues a copy of a file, then deletes the file: the store holds the only copy.
    func enqueueOnlyCopy(_ p: Project, id: String, extra: [String] = [], cwd: String? = nil) async throws {
        let file = p.base + "/\(id).bin"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(Self.bytes)))
        let vars = JSON.object([("url", .string(p.url("/put/\(id)"))), ("path", .string(file))]).serialized()
        let r = try await p.outbox(["enqueue", "f", "--id", id, "--vars", vars] + extra, cwd: cwd)
        #expect(r.exitCode == 0, "\(r.description)")
        try FileManager.default.removeItem(atPath: file)
    }

    func expectSentOnce(_ p: Project, _ id: String, _ run: Finished, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(run.exitCode == 0, "\(run.description)", sourceLocation: sourceLocation)
        #expect(!run.stderr.contains("no entry owns"), "\(run.stderr)", sourceLocation: sourceLocation)
        let requests = p.server.requests(path: "/put/\(id)")
        #expect(requests.map(\.bodySize) == [Int64(Self.bytes.count)], sourceLocation: sourceLocation)
    }

    @Test func aProjectMovedWholeSendsItsStagedBodies() async throws {
        let p = try Project(definitions: ["f": fileDefinition("f")])
        try await enqueueOnlyCopy(p, id: "m1")
        let moved = p.base + "/moved"
        try FileManager.default.moveItem(atPath: p.root, toPath: moved)
        let audit = try await p.outbox(["audit"], cwd: moved)
        #expect(audit.exitCode == 0, "\(audit.description)")
        expectSentOnce(p, "m1", try await p.outbox(["run", "--drain"], cwd: moved))
    }

    @Test func aStoreReachedThroughALinkKeepsItsStagedBodies() async throws {
        let p = try Project(definitions: ["f": fileDefinition("f")])
        let link = p.base + "/link"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: p.root)
        // Enqueued through the link, sent from the real folder; then the other way round.
        try await enqueueOnlyCopy(p, id: "l1", extra: ["--config", link + "/config/outbox.yaml"], cwd: p.base)
        expectSentOnce(p, "l1", try await p.outbox(["run", "--drain"]))
        try await enqueueOnlyCopy(p, id: "l2")
        expectSentOnce(p, "l2", try await p.outbox(["run", "--drain", "--config", link + "/config/outbox.yaml"], cwd: p.base))
    }

    /// A form's file is staged too, and named inside the stored request: it follows as well.
    @Test func aMovedProjectSendsItsStagedFormFiles() async throws {
        let form = """
            key: f
            request:
              url: "{{ vars.url }}"
              form:
                - { name: doc, file: "{{ vars.path }}" }

            """
        let p = try Project(definitions: ["f": form])
        try await enqueueOnlyCopy(p, id: "form1")
        let moved = p.base + "/moved"
        try FileManager.default.moveItem(atPath: p.root, toPath: moved)
        let run = try await p.outbox(["run", "--drain"], cwd: moved)
        #expect(run.exitCode == 0, "\(run.description)")
        #expect(!run.stderr.contains("no entry owns"), "\(run.stderr)")
        let request = try #require(p.server.requests(path: "/put/form1").first)
        #expect(request.bodySize > Int64(Self.bytes.count), "the multipart body holds the file")
        let shown = try await p.outbox(["audit"], cwd: moved)
        #expect(shown.exitCode == 0, "\(shown.description)")
    }
}
