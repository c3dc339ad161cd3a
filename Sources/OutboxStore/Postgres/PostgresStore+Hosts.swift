import OutboxModel

extension PostgresStore {
    /// The host that staged the entry's file body, when runners here may not send it: the
    /// staging folder is not shared and another host enqueued it.
    package func bodyHostElsewhere(entryID: String) throws(OutboxError) -> String? {
        guard !sharedStaging else { return nil }
        return try db.queryOne(
            "SELECT body_host FROM entries WHERE id = ? AND body_host IS NOT NULL AND body_host <> ?", [.text(entryID), .text(host)]
        ) { $0.text(0) }
    }
}
