"""Foundation benchmarks: one `enqueue` process, `enqueue --from` 10,000 lines, `list --json` of 100,000 rows.

Peers do the same durable work with SQLite directly (WAL, synchronous=FULL), measured in the same run.
Environment: ENQUEUE_RUNS (default 50), FROM_LINES (10000), LIST_ROWS (100000), ROUNDS (3).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as B  # noqa: E402

RUNS = int(os.environ.get("ENQUEUE_RUNS", "50"))
FROM_LINES = int(os.environ.get("FROM_LINES", "10000"))
LIST_ROWS = int(os.environ.get("LIST_ROWS", "100000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CHUNK = 10000

DEFINITION = """key: bench.post
request:
  method: POST
  url: "http://127.0.0.1:9/x"
  data: { n: "{{ vars.n }}" }
"""

# A table shaped like a queue row: id, key, vars, request, body, times.
PEER_SCHEMA = ("CREATE TABLE IF NOT EXISTS entries (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, "
               "key TEXT NOT NULL, vars TEXT NOT NULL, state TEXT NOT NULL, request TEXT NOT NULL, body BLOB, "
               "created_at INTEGER NOT NULL, expires_at INTEGER)")
PEER_INSERT_SQL = ("INSERT INTO entries (id, key, vars, state, request, body, created_at, expires_at) VALUES "
                   "(lower(hex(randomblob(16))), 'bench.post', '{\"n\":1}', 'queued', "
                   "'{\"method\":\"POST\",\"url\":\"http://127.0.0.1:9/x\",\"headers\":{\"content-type\":\"application/json\"}}', "
                   "CAST('{\"n\":1}' AS BLOB), CAST(strftime('%s','now') AS INTEGER) * 1000, NULL);")

PY_ONE = """
import sqlite3, sys, uuid, json, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("PRAGMA journal_mode=WAL"); c.execute("PRAGMA synchronous=FULL")
c.execute("BEGIN IMMEDIATE")
c.execute("INSERT INTO entries (id, key, vars, state, request, body, created_at) VALUES (?,?,?,?,?,?,?)",
          (str(uuid.uuid4()), "bench.post", json.dumps({"n": 1}), "queued",
           json.dumps({"method": "POST", "url": "http://127.0.0.1:9/x"}), b'{"n":1}', int(time.time() * 1000)))
c.execute("COMMIT"); c.close()
"""

# The --from peer: parse each JSON line, mint an id, render the body, insert all in one transaction.
PY_MANY = """
import sqlite3, sys, uuid, json, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("PRAGMA journal_mode=WAL"); c.execute("PRAGMA synchronous=FULL")
c.execute(sys.argv[3])
now = int(time.time() * 1000)
rows = []
with open(sys.argv[2]) as fh:
    for line in fh:
        v = json.loads(line)["vars"]
        body = json.dumps({"n": v["n"]}).encode()
        req = json.dumps({"method": "POST", "url": "http://127.0.0.1:9/x", "headers": {"content-type": "application/json"}})
        rows.append((str(uuid.uuid4()), "bench.post", json.dumps(v), "queued", req, body, now))
c.execute("BEGIN IMMEDIATE")
c.executemany("INSERT INTO entries (id, key, vars, state, request, body, created_at) VALUES (?,?,?,?,?,?,?)", rows)
c.execute("COMMIT"); c.close()
print(len(rows))
"""


def new_project(work, name):
    p = B.Project(work.join(name))
    p.write("definitions/post.yaml", DEFINITION)
    return p


def peer_db(work, name):
    path = work.join(name)
    B.must(B.measure(["sqlite3", path, "PRAGMA journal_mode=WAL; " + PEER_SCHEMA]), "sqlite3 schema")
    return path


def bench_single(work):
    """(a) One `outbox enqueue` process vs one sqlite3 / python process inserting one row."""
    project = new_project(work, "single")
    py = B.python_interpreter()
    db_cli = peer_db(work, "peer-cli.db")
    db_py = peer_db(work, "peer-py.db")
    vars_text = '{"n": 1}'
    cases = {
        "outbox": lambda: project.run("enqueue", "bench.post", "--vars", vars_text, rss=False),
        "sqlite3": lambda: B.measure(["sqlite3", db_cli, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; " + PEER_INSERT_SQL],
                                     rss=False),
        "python": lambda: B.measure([py, "-c", PY_ONE, db_py], rss=False),
    }
    for run in cases.values():  # warm the page cache and create the databases' WAL state
        for _ in range(3):
            B.must(run(), "warm-up")
    times = {k: [] for k in cases}
    # Interleaved, so drift in disk latency hits every contender alike.
    for _ in range(RUNS):
        for name, run in cases.items():
            r = B.must(run(), name)
            times[name].append(r.wall * 1000)
    # Peak RSS from separate runs under GNU time, so its fork and exec stay out of the timings.
    rss = [B.must(project.run("enqueue", "bench.post", "--vars", vars_text), "outbox").rss_kib for _ in range(3)]
    med = {k: B.median(v) for k, v in times.items()}
    B.log(f"enqueue single: medians {', '.join(f'{k} {v:.1f} ms' for k, v in med.items())}; "
          f"outbox min {min(times['outbox']):.1f} ms, max {max(times['outbox']):.1f} ms")
    target_ok = med["outbox"] <= 5
    return [
        B.Row("enqueue", f"one entry, median of {RUNS}", "ms", med["outbox"], "sqlite3 CLI, 1 row", med["sqlite3"],
              target="≤ 5 ms", target_ok=target_ok, rss_kib=max(rss)),
        B.Row("enqueue", f"one entry, median of {RUNS}", "ms", med["outbox"], "python3 sqlite3, 1 row", med["python"],
              target="≤ 5 ms", target_ok=target_ok, rss_kib=max(rss)),
    ]


def bench_from(work):
    """(b) `enqueue --from` FROM_LINES lines (one transaction) vs a Python script inserting as many rows."""
    lines = B.write_jsonl(work.join("from.jsonl"), FROM_LINES, lambda i: {"vars": {"n": i}})
    py = B.python_interpreter()
    outbox_t, peer_t, rss = [], [], []
    for round_ in range(ROUNDS):
        project = new_project(work, f"from-{round_}")
        B.must(project.run("check"), "outbox check")  # creates nothing; warms the binary's pages
        r = B.must(project.run("enqueue", "bench.post", "--from", lines, stdout_name="ids.txt"), "outbox enqueue --from")
        ids = r.stdout().split()
        if len(ids) != FROM_LINES:
            raise B.BenchFailure(f"enqueue --from printed {len(ids)} ids, expected {FROM_LINES}")
        outbox_t.append(r.wall)
        rss.append(r.rss_kib)
        db = work.join(f"peer-from-{round_}.db")
        p = B.must(B.measure([py, "-c", PY_MANY, db, lines, PEER_SCHEMA], stdout_path=db + ".out"), "python peer")
        peer_t.append(p.wall)
    o, q = B.median(outbox_t), B.median(peer_t)
    return [B.Row("enqueue", f"--from {FROM_LINES:,} lines", "s", o, "python3 sqlite3, 1 txn", q,
                  target="≤ 1 s", target_ok=o <= 1.0, rss_kib=max(rss))]


def bench_list(work):
    """(c) `list --json` over LIST_ROWS rows vs `sqlite3 -json` reading the same table."""
    project = new_project(work, "list")
    left = LIST_ROWS
    chunk_no = 0
    while left > 0:
        n = min(CHUNK, left)
        path = B.write_jsonl(work.join(f"list-{chunk_no}.jsonl"), n, lambda i, base=LIST_ROWS - left: {"vars": {"n": base + i}})
        B.must(project.run("enqueue", "bench.post", "--from", path), "outbox enqueue --from (setup)")
        left -= n
        chunk_no += 1
    db = os.path.join(project.root, ".outbox", "outbox.db")
    outbox_t, peer_t, rss = [], [], []
    for round_ in range(ROUNDS):
        out = f"list-{round_}.json"
        r = B.must(project.run("list", "--json", stdout_name=out), "outbox list --json")
        if round_ == 0:
            with open(os.path.join(project.root, out)) as fh:
                count = len(json.load(fh))
            if count != LIST_ROWS:
                raise B.BenchFailure(f"list --json returned {count} rows, expected {LIST_ROWS}")
        outbox_t.append(r.wall)
        rss.append(r.rss_kib)
        p = B.must(B.measure(["sqlite3", "-json", db, "select * from entries"], stdout_path=work.join(f"peer-list-{round_}.json")),
                   "sqlite3 -json")
        peer_t.append(p.wall)
    o, q = B.median(outbox_t), B.median(peer_t)
    return [B.Row("enqueue", f"list --json, {LIST_ROWS:,} rows", "s", o, "sqlite3 -json (same db)", q,
                  target="≤ 0.25 s", target_ok=o <= 0.25, rss_kib=max(rss))]


def main():
    if not B.ensure_tool("sqlite3", "sqlite3"):
        raise B.BenchFailure("sqlite3 is missing")
    rows = []
    with B.WorkDir("enqueue") as work:
        for part in (bench_single, bench_from, bench_list):
            try:
                rows += part(work)
            except B.BenchFailure as e:
                B.log(f"enqueue: {part.__name__}: {e}")
                rows.append(B.Row("enqueue", part.__name__, "s", None, "-", None, note=str(e)[:200]))
    B.emit(rows)


if __name__ == "__main__":
    main()
