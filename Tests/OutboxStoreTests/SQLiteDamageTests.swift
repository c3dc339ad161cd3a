import Foundation
import OutboxModel
import Testing
@testable import OutboxStore

/// A damaged row fails loudly (E_STORAGE naming the entry and what is damaged) wherever it
/// is read, never with a default in its place: a default could send another request.
/// SQLite only: the rows are damaged from outside, with the sqlite3 tool.
struct SQLiteDamageTests {
    /// A store with a good entry and one to damage; `damage` runs SQL on the `row-7` row.
    private func store(damage sql: String, key: String = "note", vars: String = #"{"n": 1}"#) throws -> StoreFixture {
        let f = try StoreFixture()
        try f.enqueue("good", "note", #"{"n": 0}"#)
        try f.enqueue("row-7", key, vars)
        _ = try f.sqlite("UPDATE entries SET \(sql) WHERE id = 'row-7';")
        return f
    }

    /// Every read of the damaged row fails with E_STORAGE whose message contains `words`.
    private func expectDamage(
        _ f: StoreFixture, _ words: [String], queued: Bool = true,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        var reads: [(String, () throws -> Void)] = [
            ("entry(id:)", { _ = try f.store.entry(id: "row-7") }),
            ("list", { _ = try f.store.list(ListFilter()) }),
        ]
        // A runner reads queued rows only.
        if queued { reads.append(("dueEntries", { _ = try f.store.dueEntries(now: 4_000_000_000_000, limit: 10, excluding: []) })) }
        for (name, read) in reads {
            let error = #expect(throws: OutboxError.self, "\(name)", sourceLocation: sourceLocation) { try read() }
            #expect(error?.code == .storage, "\(name)", sourceLocation: sourceLocation)
            for word in words {
                #expect(
                    error?.message.contains(word) == true, "\(name): \(error?.message ?? "no error") lacks \(word)",
                    sourceLocation: sourceLocation)
            }
        }
        // The damage stays in its row: the other entry reads back.
        #expect(try f.store.entry(id: "good")?.id == "good", sourceLocation: sourceLocation)
        // `cancel` by its id removes it all the same, and the store reads whole again.
        #expect(try f.store.cancel(ids: ["row-7"], key: nil, now: 4_000_000_000_000) == ["row-7"], sourceLocation: sourceLocation)
        #expect(try f.store.list(ListFilter()).map(\.id) == ["good"], sourceLocation: sourceLocation)
    }

    // `cancel --key` and `cancel --all` remove a row that does not read back with the rest:
    // damage in one row must not keep the whole queue from being cleared.
    @Test(arguments: ["note", nil] as [String?])
    func cancelByKeyOrAllRemovesADamagedRow(key: String?) throws {
        let f = try store(damage: "request = '{\"method\": '")
        _ = try f.enqueue("other", "text", #"{"t": "x"}"#)
        let cancelled = try f.store.cancel(ids: nil, key: key, now: 4_000_000_000_000)
        #expect(Set(cancelled) == (key == nil ? ["good", "row-7", "other"] : ["good", "row-7"]))
        #expect(try f.store.list(ListFilter()).map(\.id) == (key == nil ? [] : ["other"]))
        #expect(try f.sqlite("SELECT count(*) FROM entries;") == (key == nil ? "0" : "1"))
    }

    // A request column that is not JSON at all.
    @Test func aRequestThatIsNotJSON() throws {
        let f = try store(damage: "request = '{\"method\": '")
        try expectDamage(f, ["stored request", "row-7"])
    }

    // A request missing a field is damage, not a default method.
    @Test func aRequestMissingAField() throws {
        let f = try store(damage: "request = json_remove(request, '$.method')")
        try expectDamage(f, ["stored request", "method", "missing", "row-7"])
    }

    // A request field of the wrong type.
    @Test func aRequestFieldOfTheWrongType() throws {
        let f = try store(damage: "request = json_set(request, '$.follow_redirects', 'many')")
        try expectDamage(f, ["stored request", "follow_redirects", "row-7"])
    }

    // An unknown body kind.
    @Test func anUnknownBodyKind() throws {
        let f = try store(damage: "request = json_set(request, '$.body_kind', 'teleport')")
        try expectDamage(f, ["body_kind", "teleport", "row-7"])
    }

    // An unknown state, in every read, and in the counts.
    @Test func anUnknownState() throws {
        let f = try store(damage: "state = 'frozen'")
        let error = #expect(throws: OutboxError.self) { _ = try f.store.counts() }
        #expect(error?.code == .storage)
        #expect(error?.message.contains("frozen") == true)
        try expectDamage(f, ["row-7", "unknown state", "frozen"], queued: false)
    }

    // Vars that are not JSON.
    @Test func varsThatAreNotJSON() throws {
        let f = try store(damage: "vars = '{not json'")
        try expectDamage(f, ["vars", "row-7"])
    }

    // A file body whose file column is gone.
    @Test func aFileBodyWithoutItsFile() throws {
        let f = try StoreFixture()
        try f.enqueue("good", "note", #"{"n": 0}"#)
        try f.userFile("in/a.bin", "bytes")
        try f.enqueue("row-7", "file.copy", #"{"path": "in/a.bin"}"#)
        _ = try f.sqlite("UPDATE entries SET body_file = NULL WHERE id = 'row-7';")
        try expectDamage(f, ["file body without its file", "row-7"])
    }
}
