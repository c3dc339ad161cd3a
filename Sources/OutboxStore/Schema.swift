/// Named, append-only schema migrations. A migration is never edited once released: a
/// change to the schema is a new entry at the end.
enum Schema {
    static let migrations: [(name: String, sql: String)] = [
        (
            "001-entries",
            """
            CREATE TABLE entries (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                id TEXT NOT NULL UNIQUE,
                internal TEXT NOT NULL,
                key TEXT NOT NULL,
                vars TEXT NOT NULL,
                state TEXT NOT NULL,
                reason TEXT,
                generation INTEGER NOT NULL DEFAULT 1,
                request TEXT NOT NULL,
                body BLOB,
                body_file TEXT,
                body_hash TEXT NOT NULL,
                total_bytes INTEGER NOT NULL DEFAULT 0,
                bytes_sent INTEGER NOT NULL DEFAULT 0,
                attempts INTEGER NOT NULL DEFAULT 0,
                idempotency_key TEXT,
                account TEXT,
                scope TEXT,
                parent TEXT,
                header_generation INTEGER NOT NULL DEFAULT 0,
                created_at INTEGER NOT NULL,
                updated_at INTEGER NOT NULL,
                expires_at INTEGER,
                not_before INTEGER,
                next_attempt_at INTEGER,
                lease_owner TEXT,
                lease_until INTEGER,
                last_request_id TEXT,
                waits_for_delivery INTEGER NOT NULL DEFAULT 0
            );
            CREATE INDEX entries_due ON entries (state, next_attempt_at);
            CREATE INDEX entries_key ON entries (key);
            CREATE INDEX entries_scope ON entries (scope, seq) WHERE scope IS NOT NULL;
            CREATE TABLE parts (
                entry_seq INTEGER NOT NULL REFERENCES entries (seq) ON DELETE CASCADE,
                idx INTEGER NOT NULL,
                start INTEGER NOT NULL,
                end INTEGER NOT NULL,
                url TEXT NOT NULL,
                headers TEXT NOT NULL,
                accepted INTEGER NOT NULL DEFAULT 0,
                status INTEGER,
                response_headers TEXT,
                attempts INTEGER NOT NULL DEFAULT 0,
                next_attempt_at INTEGER,
                PRIMARY KEY (entry_seq, idx)
            ) WITHOUT ROWID;
            CREATE TABLE outcomes (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                entry_id TEXT NOT NULL,
                key TEXT NOT NULL,
                generation INTEGER NOT NULL,
                outcome TEXT NOT NULL,
                payload TEXT NOT NULL,
                deliveries INTEGER NOT NULL DEFAULT 0,
                acknowledged INTEGER NOT NULL DEFAULT 0,
                next_delivery_at INTEGER,
                reason TEXT,
                hook_pgid INTEGER,
                hook_start INTEGER,
                created_at INTEGER NOT NULL
            );
            CREATE INDEX outcomes_pending ON outcomes (acknowledged, entry_id, seq);
            CREATE TABLE attempts (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                entry_id TEXT NOT NULL,
                generation INTEGER NOT NULL,
                at INTEGER NOT NULL,
                payload TEXT NOT NULL
            );
            CREATE INDEX attempts_entry ON attempts (entry_id, seq);
            CREATE TABLE settings (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
            CREATE TABLE paused_keys (key TEXT PRIMARY KEY) WITHOUT ROWID;
            """
        ),
        // The runner's "next due, in enqueue order, LIMIT n" reads: without these, each claim
        // and each hook start sorted every queued entry or pending outcome (O(n) per start).
        (
            "002-queue-order",
            """
            CREATE INDEX entries_queue ON entries (state, seq);
            CREATE INDEX outcomes_due ON outcomes (acknowledged, seq);
            """
        ),
        // Claims read queued entries in seq order, and nothing else needs an index on state:
        // a partial index holds only queued rows, so marking an entry running removes one
        // index entry (it used to move two, in two indexes) and forgetting a running entry
        // touches none of it.
        (
            "003-queued-partial-index",
            """
            CREATE INDEX entries_queued ON entries (seq) WHERE state = 'queued';
            DROP INDEX entries_queue;
            DROP INDEX entries_due;
            """
        ),
        // Deleting an entry cascaded to `parts` through a foreign key, which made every
        // DELETE of an entry run a sub-program and an ephemeral table, parts or not: `parts`
        // is rebuilt without it and the store deletes an entry's parts itself. Forgetting an
        // entry deleted its outcomes by scanning all of them: they are indexed by entry now
        // (this index also serves "the oldest pending outcome of this entry").
        (
            "004-parts-without-cascade",
            """
            CREATE TABLE parts_new (
                entry_seq INTEGER NOT NULL,
                idx INTEGER NOT NULL,
                start INTEGER NOT NULL,
                end INTEGER NOT NULL,
                url TEXT NOT NULL,
                headers TEXT NOT NULL,
                accepted INTEGER NOT NULL DEFAULT 0,
                status INTEGER,
                response_headers TEXT,
                attempts INTEGER NOT NULL DEFAULT 0,
                next_attempt_at INTEGER,
                PRIMARY KEY (entry_seq, idx)
            ) WITHOUT ROWID;
            INSERT INTO parts_new SELECT p.* FROM parts p JOIN entries e ON e.seq = p.entry_seq;
            DROP TABLE parts;
            ALTER TABLE parts_new RENAME TO parts;
            CREATE INDEX outcomes_entry ON outcomes (entry_id, acknowledged, seq);
            DROP INDEX outcomes_pending;
            """
        ),
        // Cumulative counters (attempts, bytes, hook deliveries, the duration histogram),
        // one row per series, added to in the transactions whose changes they count.
        (
            "005-counters",
            """
            CREATE TABLE counters (
                name TEXT NOT NULL,
                labels TEXT NOT NULL,
                value INTEGER NOT NULL,
                PRIMARY KEY (name, labels)
            ) WITHOUT ROWID;
            """
        ),
        // The multipart upload of an s3 entry, recorded before its first part is sent. Parts
        // deleted (a cancel, a replaced body) forget it: a new body starts a new upload.
        (
            "006-s3-uploads",
            """
            CREATE TABLE s3_uploads (
                entry_seq INTEGER PRIMARY KEY REFERENCES entries (seq) ON DELETE CASCADE,
                upload_id TEXT NOT NULL
            );
            CREATE TRIGGER s3_uploads_parts_deleted AFTER DELETE ON parts WHEN old.idx = 0
            BEGIN DELETE FROM s3_uploads WHERE entry_seq = old.entry_seq; END;
            """
        ),
        // The foreign key of 006 brought back what 004 took out: every DELETE of an entry ran
        // its cascade as a sub-program, an upload or not. The store deletes an entry's upload
        // with its parts instead (the trigger, and `deleteParts`).
        (
            "007-s3-uploads-without-cascade",
            """
            DROP TRIGGER s3_uploads_parts_deleted;
            CREATE TABLE s3_uploads_new (
                entry_seq INTEGER PRIMARY KEY,
                upload_id TEXT NOT NULL
            );
            INSERT INTO s3_uploads_new SELECT u.entry_seq, u.upload_id FROM s3_uploads u JOIN entries e ON e.seq = u.entry_seq;
            DROP TABLE s3_uploads;
            ALTER TABLE s3_uploads_new RENAME TO s3_uploads;
            CREATE TRIGGER s3_uploads_parts_deleted AFTER DELETE ON parts WHEN old.idx = 0
            BEGIN DELETE FROM s3_uploads WHERE entry_seq = old.entry_seq; END;
            """
        ),
        // What a runner reads as it starts and ends (entries left running, entries held for
        // Wi-Fi, an account or a host, what remains, what awaits auth) read the whole table:
        // 0.3 s at 200,000 queued entries, in every run, however few it sends. And a runner
        // whose queue waited (retries, holds, delays) read it all again every 10 ms to see if
        // a wait had ended. Partial indexes hold only those rows. Only `entries_running` is
        // written as a drain goes (a claim adds one entry to a one-page index, the settle
        // takes it out); the others hold rows that wait or failed, none of a fresh entry.
        (
            "008-runner-start-indexes",
            """
            CREATE INDEX entries_running ON entries (seq) WHERE state = 'running';
            CREATE INDEX entries_held ON entries (reason, seq) WHERE state = 'queued' AND reason IS NOT NULL;
            CREATE INDEX entries_stuck ON entries (state, seq) WHERE state IN ('awaiting-auth', 'error');
            CREATE INDEX entries_waiting ON entries (next_attempt_at) WHERE state = 'queued' AND next_attempt_at IS NOT NULL;
            CREATE INDEX entries_delayed ON entries (not_before) WHERE state = 'queued' AND not_before IS NOT NULL;
            """
        ),
        // A read of due entries walks the queued ones in order and checks each one's retry time
        // and delay: with the two times in the index, SQLite checks them there and reads only
        // the rows of entries that may be due. A queue of 180,000 waiting entries is walked in
        // 24 ms instead of 138 ms; a fresh entry's two times are NULLs (two bytes).
        (
            "009-queued-index-with-times",
            """
            DROP INDEX entries_queued;
            CREATE INDEX entries_queued ON entries (seq, next_attempt_at, not_before) WHERE state = 'queued';
            """
        ),
        // A paused key's backlog sat in the queued entries' index in seq order among the rest:
        // every read of due entries walked it and left it out row by row, so a drain beside
        // 100,000 paused entries took 14 times as long. Rows now carry their key's pause, first
        // in the index: the read seeks past the paused ones. A row is marked as it is written
        // (the enqueue reads the paused keys in its transaction) and when its key is paused or
        // resumed (the triggers; a copied store gets its marks the same way).
        (
            "010-paused-entries-apart",
            """
            ALTER TABLE entries ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
            UPDATE entries SET paused = 1 WHERE key IN (SELECT key FROM paused_keys);
            DROP INDEX entries_queued;
            CREATE INDEX entries_queued ON entries (paused, seq, next_attempt_at, not_before) WHERE state = 'queued';
            CREATE TRIGGER paused_keys_added AFTER INSERT ON paused_keys
            BEGIN UPDATE entries SET paused = 1 WHERE key = new.key; END;
            CREATE TRIGGER paused_keys_removed AFTER DELETE ON paused_keys
            BEGIN UPDATE entries SET paused = 0 WHERE key = old.key; END;
            """
        ),
    ]
}
