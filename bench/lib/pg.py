"""Several runners on one PostgreSQL store: PG_COUNT small JSON POSTs to a local nginx.

Contenders, each round in a new schema (enqueued first, not timed; the drain is timed from
the start of the first runner to the exit of the last):
  outbox on PostgreSQL with 1, 2 and 4 `outbox run --drain` processes (16 in flight each),
  outbox on its SQLite default (one runner, 16 in flight),
  `curl --parallel --parallel-max 16` with the same requests.
Then the store alone: claim + settle of PG_COUNT rows in batches of 16 by a plain SQL loop
(libpq through ctypes, no outbox) with 1 and 4 connections, beside outbox's drain rate.
The cluster keeps PostgreSQL's durable defaults (fsync, synchronous_commit on), as the
SQLite store keeps synchronous=FULL.
Environment: PG_COUNT (default 20000), ROUNDS (default 3), PG_RUNNERS (default "1 2 4").
"""

import ctypes
import ctypes.util
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as B  # noqa: E402
import post  # noqa: E402

COUNT = int(os.environ.get("PG_COUNT", "20000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
RUNNERS = [int(n) for n in os.environ.get("PG_RUNNERS", "1 2 4").split()]
CONCURRENCY = 16
BATCH = 16
PG_BIN = "/usr/lib/postgresql/15/bin"
USER = "outbox"
PASSWORD = "outbox-bench"


class Cluster:
    """A throwaway PostgreSQL 15 cluster on 127.0.0.1, as the postgres user when we are root."""

    def __init__(self):
        # Its own temp folder: the server's user must reach it, and the bench's folder is 0700.
        self.folder = tempfile.mkdtemp(prefix="outbox-bench-pgdata-")
        self.data = os.path.join(self.folder, "data")
        self.port = None
        self.as_root = os.getuid() == 0

    def _run(self, *argv):
        command = (["/usr/sbin/runuser", "-u", "postgres", "--"] if self.as_root else []) + list(argv)
        r = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise B.BenchFailure(f"{argv[0]} failed: {(r.stdout + r.stderr)[-600:]}")

    def start(self):
        if not os.path.exists(f"{PG_BIN}/initdb"):
            B.ensure_tool(f"{PG_BIN}/initdb", "postgresql-15")
        pwfile = os.path.join(self.folder, "pwfile")
        with open(pwfile, "w") as fh:
            fh.write(PASSWORD)
        if self.as_root:
            shutil.chown(self.folder, "postgres", "postgres")
            shutil.chown(pwfile, "postgres", "postgres")
        self._run(f"{PG_BIN}/initdb", "-D", self.data, "-U", USER, "--pwfile", pwfile, "--auth-local=trust",
                  "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8")
        for _ in range(5):
            self.port = B.free_port()
            try:
                self._run(f"{PG_BIN}/pg_ctl", "-D", self.data, "-l", os.path.join(self.folder, "server.log"), "-w",
                          "-t", "60", "start", "-o",
                          f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c max_connections=200")
                return self
            except B.BenchFailure:
                continue
        raise B.BenchFailure(f"PostgreSQL did not start; see {self.folder}/server.log")

    def url(self, schema):
        return f"postgres://{USER}:{PASSWORD}@127.0.0.1:{self.port}/postgres?schema={schema}"

    def conninfo(self):
        return f"host=127.0.0.1 port={self.port} user={USER} password={PASSWORD} dbname=postgres"

    def stop(self):
        if self.port:
            try:
                self._run(f"{PG_BIN}/pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")
            except B.BenchFailure as e:
                B.log(f"pg: {e}")
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# ---- a plain SQL loop through libpq (the store's floor on this server) ----

def libpq():
    lib = ctypes.CDLL(ctypes.util.find_library("pq") or "libpq.so.5")
    lib.PQconnectdb.restype = ctypes.c_void_p
    lib.PQconnectdb.argtypes = [ctypes.c_char_p]
    lib.PQstatus.argtypes = [ctypes.c_void_p]
    lib.PQerrorMessage.restype = ctypes.c_char_p
    lib.PQerrorMessage.argtypes = [ctypes.c_void_p]
    lib.PQexec.restype = ctypes.c_void_p
    lib.PQexec.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.PQresultStatus.argtypes = [ctypes.c_void_p]
    lib.PQntuples.argtypes = [ctypes.c_void_p]
    lib.PQgetvalue.restype = ctypes.c_char_p
    lib.PQgetvalue.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.PQclear.argtypes = [ctypes.c_void_p]
    lib.PQfinish.argtypes = [ctypes.c_void_p]
    return lib


class SQL:
    def __init__(self, conninfo):
        self.pq = libpq()
        self.conn = self.pq.PQconnectdb(conninfo.encode())
        if self.pq.PQstatus(self.conn) != 0:
            raise B.BenchFailure(f"libpq: {self.pq.PQerrorMessage(self.conn).decode().strip()}")

    def rows(self, statement):
        """Runs one statement; the first column of its rows."""
        result = self.pq.PQexec(self.conn, statement.encode())
        status = self.pq.PQresultStatus(result)
        if status not in (1, 2):  # PGRES_COMMAND_OK, PGRES_TUPLES_OK
            message = self.pq.PQerrorMessage(self.conn).decode().strip()
            self.pq.PQclear(result)
            raise B.BenchFailure(f"SQL failed: {message}: {statement[:120]}")
        out = [self.pq.PQgetvalue(result, i, 0).decode() for i in range(self.pq.PQntuples(result))]
        self.pq.PQclear(result)
        return out

    def close(self):
        self.pq.PQfinish(self.conn)


def sql_worker(conninfo, table, done):
    """Claims up to BATCH queued rows with a lease (one commit), then settles them (another
    commit), until none is left: what a runner does per turn, without HTTP."""
    db = SQL(conninfo)
    settled = 0
    while True:
        seqs = db.rows(
            f"UPDATE {table} SET state = 'running', lease_token = md5(random()::text), "
            "lease_until = (extract(epoch from clock_timestamp()) * 1000)::bigint + 30000 "
            f"WHERE seq IN (SELECT seq FROM {table} WHERE state = 'queued' ORDER BY seq LIMIT {BATCH} "
            "FOR UPDATE SKIP LOCKED) RETURNING seq")
        if not seqs:
            break
        db.rows(f"UPDATE {table} SET state = 'completed', lease_token = NULL, lease_until = NULL "
                f"WHERE seq IN ({','.join(seqs)}) AND state = 'running'")
        settled += len(seqs)
    db.close()
    done.put(settled)


def sql_loop(cluster, connections, round_):
    table = f"bench_loop_{round_}_{connections}"
    db = SQL(cluster.conninfo())
    db.rows(f"DROP TABLE IF EXISTS {table}")
    db.rows(f"CREATE TABLE {table} (seq BIGSERIAL PRIMARY KEY, state TEXT NOT NULL, body TEXT NOT NULL, "
            "lease_token TEXT, lease_until BIGINT)")
    db.rows(f"INSERT INTO {table} (state, body) SELECT 'queued', json_build_object('n', g)::text "
            f"FROM generate_series(1, {COUNT}) g")
    db.rows(f"CREATE INDEX ON {table} (seq) WHERE state = 'queued'")
    done = multiprocessing.Queue()
    start = time.perf_counter()
    workers = [multiprocessing.Process(target=sql_worker, args=(cluster.conninfo(), table, done))
               for _ in range(connections)]
    for w in workers:
        w.start()
    total = sum(done.get(timeout=600) for _ in workers)
    for w in workers:
        w.join()
    wall = time.perf_counter() - start
    left = db.rows(f"SELECT count(*) FROM {table} WHERE state <> 'completed'")[0]
    db.rows(f"DROP TABLE {table}")
    db.close()
    if total != COUNT or left != "0":
        raise B.BenchFailure(f"SQL loop settled {total} of {COUNT} ({left} left)")
    return wall


# ---- outbox ----

def definition(url):
    return f'key: bench.post\nrequest:\n  method: POST\n  url: "{url}"\n  data: {{ n: "{{{{ vars.n }}}}" }}\n'


def drain(project, runners, nginx, lines):
    """Enqueues (untimed), then starts `runners` drains at once; wall time until the last exits."""
    B.must(project.run("enqueue", "bench.post", "--from", lines, rss=False), "outbox enqueue --from")
    before = nginx.requests_logged()
    procs, rss_files = [], []
    start = time.perf_counter()
    for k in range(runners):
        rss_file = os.path.join(project.root, f".rss-{k}")
        rss_files.append(rss_file)
        out = open(os.path.join(project.root, f".summary-{k}.json"), "wb")
        err = open(os.path.join(project.root, f".err-{k}"), "wb")
        procs.append(subprocess.Popen([B.TIME, "-f", "%M", "-o", rss_file, project.binary, "run", "--drain", "--json"],
                                      cwd=project.root, stdout=out, stderr=err, stdin=subprocess.DEVNULL))
        out.close()
        err.close()
    codes = [p.wait(timeout=900) for p in procs]
    wall = time.perf_counter() - start
    completed = 0
    for k, rc in enumerate(codes):
        text = open(os.path.join(project.root, f".summary-{k}.json"), errors="replace").read()
        if rc not in (0, 1) or not text.strip():
            err = open(os.path.join(project.root, f".err-{k}"), errors="replace").read()
            return None, None, f"runner {k + 1} of {runners} exited {rc}: {err[-300:]}"
        completed += json.loads(text).get("completed", 0)
    seen = nginx.status_counts(before)
    if completed != COUNT or seen.get("204") != COUNT:
        return None, None, f"{runners} runners completed {completed}, nginx saw {seen}; expected {COUNT} once each"
    rss = []
    for f in rss_files:
        try:
            rss.append(int(open(f).read().split()[-1]))
        except (OSError, ValueError, IndexError):
            pass
    return wall, max(rss) if rss else None, None


def main():
    if not B.ensure_tool("curl", "curl"):
        raise B.BenchFailure("curl is missing")
    rows = []
    with B.WorkDir("pg") as work, B.Nginx(work.join("nginx")) as nginx, Cluster() as cluster:
        url = nginx.url("/x")
        lines = B.write_jsonl(work.join("posts.jsonl"), COUNT, lambda i: {"vars": {"n": i}})
        config = post.curl_config(work.join("curl.conf"), url, COUNT)
        curl = ["curl", "--parallel", "--parallel-max", str(CONCURRENCY), "-s", "-K", config]
        B.must(B.measure(curl, stderr_path=work.join("curl.err")), "warm-up")
        times = {name: [] for name in ["curl", "sqlite"] + [f"pg{n}" for n in RUNNERS]}
        rss = {name: [] for name in times}
        failures = {}

        def outbox_contender(name, runners, store):
            def run(round_):
                if name in failures:
                    return
                store_line = f'store: "{cluster.url(f"{name}_r{round_}")}"\n' if store == "pg" else ""
                project = B.Project(work.join(f"{name}-{round_}"),
                                    f"{store_line}concurrency: {CONCURRENCY}\nper_host: {CONCURRENCY}\n")
                project.write("definitions/post.yaml", definition(url))
                wall, peak, failure = drain(project, runners, nginx, lines)
                if failure:
                    failures[name] = failure
                    B.log(f"pg: {name}: {failure}")
                    return
                times[name].append(wall)
                if peak:
                    rss[name].append(peak)
            return run

        def curl_round(round_):
            before = nginx.requests_logged()
            p = B.must(B.measure(curl, stderr_path=work.join("curl.err")), "curl --parallel")
            if nginx.status_counts(before).get("204") != COUNT:
                raise B.BenchFailure("curl: nginx did not see every request once")
            times["curl"].append(p.wall)

        contenders = [curl_round, outbox_contender("sqlite", 1, "sqlite")]
        contenders += [outbox_contender(f"pg{n}", n, "pg") for n in RUNNERS]
        for round_ in range(ROUNDS):
            for contender in B.rotated(contenders, round_):
                contender(round_)
            B.log(f"pg round {round_ + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items() if v))
        peer = B.median(times["curl"])
        for name in ["sqlite"] + [f"pg{n}" for n in RUNNERS]:
            label = "SQLite, 1 runner" if name == "sqlite" else f"PostgreSQL, {name[2:]} runner(s)"
            if name in failures or not times[name]:
                rows.append(B.Row("pg", f"{COUNT:,} POSTs, {label}", "s", None, "curl --parallel-max 16", peer,
                                  note=failures.get(name, "no round finished")[:200]))
                continue
            o = B.median(times[name])
            rows.append(B.Row("pg", f"{COUNT:,} POSTs, {label}", "s", o, "curl --parallel-max 16", peer,
                              rss_kib=max(rss[name]) if rss[name] else None,
                              note=f"{COUNT / o:,.0f} req/s (curl {COUNT / peer:,.0f} req/s; medians of {ROUNDS})"))

        # The store alone: what the database allows for claim + settle in batches of 16.
        for connections in (1, 4):
            walls = [sql_loop(cluster, connections, r) for r in range(ROUNDS)]
            loop_rate = COUNT / B.median(walls)
            best = f"pg{connections}" if f"pg{connections}" in times and times[f"pg{connections}"] else None
            outbox_rate = COUNT / B.median(times[best]) if best else None
            rows.append(B.Row("pg", f"claim + settle, {connections} connection(s)", "/s", outbox_rate,
                              "plain SQL loop, batches of 16", loop_rate, higher_is_better=True,
                              note=f"outbox's drain with {connections} runner(s) (HTTP included) against the SQL loop "
                                   f"alone: {loop_rate:,.0f} entries/s"))
    B.emit(rows)


if __name__ == "__main__":
    main()
