import OutboxModel

/// The queue's storage, as callers see it: no SQLite type appears here, so a PostgreSQL
/// store (SPEC 12) can stand behind the same interface.
public protocol Store: AnyObject {
    func enqueue(_ batch: [NewEntry], now: Int64) throws(OutboxError) -> [EnqueueResult]
    func entry(id: String) throws(OutboxError) -> Entry?
    func list(_ filter: ListFilter) throws(OutboxError) -> [Entry]
    func parts(entrySeq: Int64) throws(OutboxError) -> [StoredPart]
    func attempts(entryID: String) throws(OutboxError) -> [JSON]
    func outcomes(entryID: String) throws(OutboxError) -> [OutcomeRecord]
    func unacknowledgedOutcomes() throws(OutboxError) -> [OutcomeRecord]
    func setting(_ name: String) throws(OutboxError) -> String?
    func setSetting(_ name: String, _ value: String?) throws(OutboxError)
    func pausedKeys() throws(OutboxError) -> Set<String>
    func setPaused(keys: [String], paused: Bool) throws(OutboxError)
    /// Changes when another process commits; the runner polls it to notice new work (T-sql6).
    func dataVersion() throws(OutboxError) -> Int64
}
