import Foundation
import OutboxModel
import TestSupport
import Testing

/// A file moved in by a rename is still the file a program may hold open (a log being
/// written): what it writes after enqueue lands in the store's copy. Sending the bytes
/// enqueue saw and then removing the staged file lost the rest; such an entry settles error
/// (kind file) and `cancel` puts the file back whole.
struct MovedFileWriterTests {
    static func stage(_ p: Project, id: String) async throws -> (source: String, writer: FileHandle) {
        let source = try p.write("data/\(id).log", String(repeating: "a", count: 1000))
        let writer = try #require(FileHandle(forWritingAtPath: source), "a writer holds the file open")
        writer.seekToEndOfFile()
        let vars = JSON.object([("url", .string(p.url("/put/\(id)"))), ("path", .string(source))]).serialized()
        #expect(try await p.outbox(["enqueue", "f", "--vars", vars, "--id", id]).exitCode == 0)
        #expect(!FileManager.default.fileExists(atPath: source), "moved in")
        return (source, writer)
    }

    static func expectPutBackWhole(_ p: Project, id: String, source: String) async throws {
        let hook = try #require(p.deliveries(id).first)
        #expect(hook.string("stdin.outcome") == "error")
        #expect(hook.string("stdin.error.kind") == "file")
        #expect(hook.string("stdin.error.message")?.contains("was written to after enqueue") == true, "\(hook.serialized())")
        #expect(try await p.outbox(["cancel", id]).exitCode == 0)
        let back = try Data(contentsOf: URL(fileURLWithPath: source))
        #expect(back.count == 1500 && back.suffix(500).allSatisfy { $0 == UInt8(ascii: "b") }, "\(back.count) bytes back")
    }

    @Test func bytesWrittenToAMovedFileBeforeItIsSentAreNeverLost() async throws {
        let p = try Project(definitions: ["f": fileDefinition("f", ownership: "move")])
        let (source, writer) = try await Self.stage(p, id: "log1")
        writer.write(Data(repeating: UInt8(ascii: "b"), count: 500))
        try writer.close()
        try await p.drain(failures: 1)
        #expect(p.server.requests(path: "/put/log1").isEmpty, "nothing of a file that changed is sent")
        try await Self.expectPutBackWhole(p, id: "log1", source: source)
    }

    @Test func bytesWrittenToAMovedFileWhileItIsSentAreNeverLost() async throws {
        let p = try Project(definitions: ["f": fileDefinition("f", ownership: "move")])
        p.server.script("/put/log2", [.hold("put")])
        let (source, writer) = try await Self.stage(p, id: "log2")
        let runner = try p.start(["run", "--drain"])
        #expect(await p.server.waitForHeld("put"), "the request is in flight")
        writer.write(Data(repeating: UInt8(ascii: "b"), count: 500))
        try writer.close()
        _ = p.server.release("put")
        let finished = await runner.wait()
        #expect(finished.exitCode == 1, "\(finished)")
        #expect(p.server.requests(path: "/put/log2").map(\.bodySize) == [1000], "sent as enqueued")
        try await Self.expectPutBackWhole(p, id: "log2", source: source)
    }

    /// A file copied in is the store's own: the program's later writes go to the original.
    @Test func aCopiedFileIsSentAsEnqueuedWhateverTheWriterDoesNext() async throws {
        let p = try Project(definitions: ["f": fileDefinition("f", ownership: "copy")])
        let source = try p.write("data/log3.log", String(repeating: "a", count: 1000))
        let writer = try #require(FileHandle(forWritingAtPath: source))
        writer.seekToEndOfFile()
        let vars = JSON.object([("url", .string(p.url("/put/log3"))), ("path", .string(source))]).serialized()
        #expect(try await p.outbox(["enqueue", "f", "--vars", vars, "--id", "log3"]).exitCode == 0)
        writer.write(Data(repeating: UInt8(ascii: "b"), count: 500))
        try writer.close()
        try await p.drain(failures: 0)
        #expect(p.server.requests(path: "/put/log3").map(\.bodySize) == [1000])
        #expect((try Data(contentsOf: URL(fileURLWithPath: source))).count == 1500)
    }
}
