#ifndef OUTBOX_CSQLITE_SHIM_H
#define OUTBOX_CSQLITE_SHIM_H
#include <sqlite3.h>

/* SQLITE_TRANSIENT is a cast macro Swift cannot import: bind copies through these. */
static inline int csqlite_bind_text(sqlite3_stmt *s, int i, const char *v, int n) {
    return sqlite3_bind_text(s, i, v, n, SQLITE_TRANSIENT);
}
static inline int csqlite_bind_blob(sqlite3_stmt *s, int i, const void *v, int n) {
    return sqlite3_bind_blob(s, i, v, n, SQLITE_TRANSIENT);
}
/* sqlite3_db_config is variadic, which Swift cannot call. */
static inline int csqlite_no_checkpoint_on_close(sqlite3 *db, int on) {
    return sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, on, (int *)0);
}
/* sqlite3_config is variadic as well. Without memory statistics each of SQLite's allocations
   and frees skips a global mutex and two counters; outbox reads none of the statistics. It
   must precede every other SQLite call of the process. */
static inline int csqlite_skip_memory_statistics(void) {
    return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}
#endif
