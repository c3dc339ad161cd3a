import OutboxModel

/// The multipart upload of an s3 entry sent in parts: its id, kept until it completes.
extension SQLStore {
    package func s3UploadID(entrySeq: Int64) throws(OutboxError) -> String? {
        try db.queryOne("SELECT upload_id FROM s3_uploads WHERE entry_seq = ?", [.int(entrySeq)]) { $0.text(0) }
    }

    package func setS3UploadID(entrySeq: Int64, _ uploadID: String?) throws(OutboxError) {
        try writingOwnRows { () throws(OutboxError) in
            if let uploadID {
                _ = try db.run(
                    "INSERT INTO s3_uploads (entry_seq, upload_id) VALUES (?, ?) ON CONFLICT (entry_seq) DO UPDATE SET upload_id = excluded.upload_id",
                    [.int(entrySeq), .text(uploadID)])
            } else {
                _ = try db.run("DELETE FROM s3_uploads WHERE entry_seq = ?", [.int(entrySeq)])
            }
        }
    }

    package func erroredEntriesWithS3Uploads() throws(OutboxError) -> [Entry] {
        try db.query(
            "SELECT \(Self.entryColumns) FROM entries WHERE state = 'error' AND seq IN (SELECT entry_seq FROM s3_uploads) ORDER BY seq", [],
            entryFromRow)
    }

    package func forgetS3Upload(entrySeq: Int64, uploadID: String) throws(OutboxError) {
        try writing { () throws(OutboxError) in
            // A retry may have started another upload meanwhile: that one stays.
            guard try db.run("DELETE FROM s3_uploads WHERE entry_seq = ? AND upload_id = ?", [.int(entrySeq), .text(uploadID)]) > 0
            else { return }
            _ = try db.run(
                "UPDATE parts SET accepted = 0, status = NULL, response_headers = NULL, next_attempt_at = NULL WHERE entry_seq = ?",
                [.int(entrySeq)])
        }
    }
}
