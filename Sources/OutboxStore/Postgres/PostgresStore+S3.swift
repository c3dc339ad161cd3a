import OutboxModel

/// The multipart uploads of s3 entries, as in the SQLite store.
extension PostgresStore {
    package func s3UploadID(entrySeq: Int64) throws(OutboxError) -> String? {
        try db.queryOne("SELECT upload_id FROM s3_uploads WHERE entry_seq = ?", [.int(entrySeq)]) { $0.text(0) }
    }

    package func setS3UploadID(entrySeq: Int64, _ uploadID: String?) throws(OutboxError) {
        // The entry is this runner's claim: its row, not the schema, is the unit of change.
        try db.quietTransaction { () throws(OutboxError) in
            if let uploadID {
                _ = try db.run(
                    "INSERT INTO s3_uploads (entry_seq, upload_id) VALUES (?, ?) ON CONFLICT (entry_seq) DO UPDATE SET upload_id = excluded.upload_id",
                    [.int(entrySeq), .text(uploadID)])
            } else {
                _ = try db.run("DELETE FROM s3_uploads WHERE entry_seq = ?", [.int(entrySeq)])
            }
        }
    }
}
