import Foundation
import OutboxModel
import Testing
import TestSupport

/// A `then` chain is applied whole or not at all: a follow-up that cannot be built leaves
/// none enqueued, and the parent's outcome says why, for its hook and for `show`.
struct FollowUpFailureTests {
    @Test func aFollowUpThatCannotRenderIsRecordedOnTheParentsOutcome() async throws {
        let parent = definition("order", top: """
        then:
          on_success:
            - key: receipt
              vars: { url: "{{ vars.url }}", tag: "t" }
            - key: receipt
              id: "bad id with spaces {{ entry.id }}"
              vars: { url: "{{ vars.url }}", tag: "t" }
        """)
        let p = try Project(definitions: ["order": parent, "receipt": definition("receipt")])
        try await p.enqueue("order", path: "/status/200", id: "o1")
        let run = try await p.drain()
        #expect(run.exitCode == 0, "\(run.description)")
        #expect(run.stderr.contains("the follow-ups of o1 were not enqueued"), "\(run.stderr)")
        // Neither follow-up was enqueued, not even the one that rendered.
        #expect(p.server.requests.map(\.path) == ["/status/200"])
        #expect(try await p.list().isEmpty)
        let hook = try #require(p.deliveries("o1").first)
        let errors = try #require(hook.at("stdin.follow_up_errors")?.arrayValue)
        #expect(errors.count == 1, "\(errors)")
        #expect(errors.first?["index"] == .int(1))
        #expect(errors.first?["key"] == .string("receipt"))
        #expect(errors.first?["message"]?.stringValue?.contains("bad id with spaces o1") == true)
    }
}
