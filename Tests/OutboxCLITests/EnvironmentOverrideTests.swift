import Foundation
import OutboxModel
import TestSupport
import Testing

/// `OUTBOX_*` variables set the fields a service manager needs, above the config file.
struct EnvironmentOverrideTests {
    @Test func outboxStoreMovesTheQueue() throws {
        let p = try CLIProject()
        let moved = ["OUTBOX_STORE": "state/queue"]
        let id = p.run(["enqueue", "plain"], environment: moved).out.trimmingCharacters(in: .newlines)
        #expect(!id.isEmpty)
        #expect(FileManager.default.fileExists(atPath: p.root + "/state/queue/outbox.db"))
        #expect(!p.storeExists)
        let listed = try p.run(["list", "--json"], environment: moved).json().arrayValue ?? []
        #expect(listed.map { $0["id"]?.stringValue } == [id])
        // Without the variable, the config's store: nothing there.
        #expect(try p.rows().isEmpty)
    }

    @Test(arguments: [
        ("OUTBOX_CONCURRENCY", "many", "OUTBOX_CONCURRENCY (concurrency) must be a whole number from 1 to 1024, not \"many\""),
        ("OUTBOX_CONCURRENCY", "0", "OUTBOX_CONCURRENCY (concurrency) must be a whole number from 1 to 1024, not \"0\""),
        ("OUTBOX_PER_HOST", "257", "OUTBOX_PER_HOST (per_host) must be a whole number from 1 to 256, not \"257\""),
        ("OUTBOX_PART_CONCURRENCY", "-1", "OUTBOX_PART_CONCURRENCY (part_concurrency) must be a whole number from 1 to 64, not \"-1\""),
        ("OUTBOX_STORE", "", "OUTBOX_STORE is empty: it names the store folder"),
    ])
    func aBadOverrideIsAConfigErrorAndChangesNothing(variable: String, value: String, message: String) throws {
        let p = try CLIProject()
        #expect(p.run("enqueue", "plain").status == 0)
        let before = try p.snapshot()
        let r = p.run(["enqueue", "plain"], environment: [variable: value])
        #expect(r.status == 78)
        #expect(r.err == "outbox: E_CONFIG: \(message)\n")
        #expect(try p.snapshot() == before)
    }
}
