import Foundation
import OutboxModel
import TestSupport
import Testing

/// A multipart form's counters: `bytes_sent` counts the body's fields, as `total_bytes`
/// does, not the boundaries and part headers around them.
@Suite struct FormBodyTests {
    @Test func aSentFormShowsNoMoreBytesSentThanItsTotal() async throws {
        let p = try Project(
            definitions: [
                "f": """
                key: f
                request:
                  url: "{{ vars.url }}"
                  form:
                    - { name: title, value: "{{ vars.tag }}" }
                    - { name: photo, file: "{{ vars.path }}" }

                """
            ])
        let photo = try p.write("photo.bin", String(repeating: "x", count: 3000))
        let vars = JSON.object([("url", .string(p.url("/status/422"))), ("tag", .string("hello")), ("path", .string(photo))])
        let enqueued = try await p.outbox(["enqueue", "f", "--id", "form-1", "--vars", vars.serialized()])
        #expect(enqueued.exitCode == 0, "\(enqueued.description)")
        try await p.drain(failures: 1)

        // The whole form went out, framing and all: the server saw more bytes than the fields hold.
        let received = try #require(p.server.requests(path: "/status/422").first)
        #expect(received.completed)
        #expect(received.bodySize > 3005)
        // The settled row counts the fields' bytes: "hello" and the file's 3,000.
        let row = try #require(try await p.list().first)
        #expect(row.string("state") == "error")
        #expect(row.int("total_bytes") == 3005)
        #expect(row.int("bytes_sent") == 3005)
    }
}
