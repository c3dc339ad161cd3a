"""The runner: POST_COUNT small JSON POSTs to a local nginx (`return 204`), 16 at a time.

outbox: entries enqueued first (not timed), then `outbox run --drain` timed.
peer:   `curl --parallel --parallel-max 16` with a config file holding the same requests.
Environment: POST_COUNT (default 5000), ROUNDS (default 9), POST_CASES ("small", the
default; "large" adds the cost per request at LARGE_COUNT (500,000) queued entries beside
POST_COUNT, in LARGE_ROUNDS (3) rounds; "waiting" adds the cost of a queue whose
WAITING_COUNT (200,000) entries all wait an hour, beside a queue of one such entry;
"paused" adds the drain of POST_COUNT entries beside a paused key's PAUSED_COUNT (100,000)
entries, against the same drain with none, in PAUSED_ROUNDS (3) rounds; "ahead" the same
beside AHEAD_COUNT (100,000) entries delayed an hour and enqueued before them;
"small,large,waiting,paused,ahead" runs all five).
"""

import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as B  # noqa: E402

COUNT = int(os.environ.get("POST_COUNT", "5000"))
ROUNDS = int(os.environ.get("ROUNDS", "9"))
LARGE_COUNT = int(os.environ.get("LARGE_COUNT", "500000"))
LARGE_ROUNDS = int(os.environ.get("LARGE_ROUNDS", "3"))
WAITING_COUNT = int(os.environ.get("WAITING_COUNT", "200000"))
WAITING_ROUNDS = int(os.environ.get("WAITING_ROUNDS", "3"))
PAUSED_COUNT = int(os.environ.get("PAUSED_COUNT", "100000"))
PAUSED_ROUNDS = int(os.environ.get("PAUSED_ROUNDS", "3"))
AHEAD_COUNT = int(os.environ.get("AHEAD_COUNT", "100000"))
# Lines per `enqueue --from` call when filling the large queue: one transaction each.
ENQUEUE_CHUNK = 50000
CONCURRENCY = 16


def curl_config(path, url, count):
    """One request per block; `next` keeps each block's data from joining the others."""
    with open(path, "w") as fh:
        for i in range(count):
            body = json.dumps({"n": i}, separators=(",", ":")).replace("\\", "\\\\").replace('"', '\\"')
            fh.write(f'url = "{url}"\nrequest = "POST"\nheader = "Content-Type: application/json"\n'
                     f'data-binary = "{body}"\noutput = "/dev/null"\n')
            if i + 1 < count:
                fh.write("next\n")
    return path


def project_for(work, name, url):
    project = B.Project(work.join(name), f"concurrency: {CONCURRENCY}\nper_host: {CONCURRENCY}\n")
    project.write("definitions/post.yaml",
                  f'key: bench.post\nrequest:\n  method: POST\n  url: "{url}"\n  data: {{ n: "{{{{ vars.n }}}}" }}\n')
    return project


def curl_argv(config):
    return ["curl", "--parallel", "--parallel-max", str(CONCURRENCY), "-s", "-K", config]


def drain(project, nginx, count, status="204"):
    """`run --drain` (timed) of `count` enqueued entries, each answered `status`; returns
    (measured, None) or (None, failure)."""
    before = nginx.requests_logged()
    r = project.run("run", "--drain", "--json", stdout_name="summary.json")
    if r.rc != 0:
        return None, f"outbox run --drain exited {r.rc}: {r.stderr()[-300:]}"
    summary = json.loads(r.stdout() or "{}")
    codes = nginx.status_counts(before)
    if summary.get("completed") != count or codes.get(status) != count:
        return None, f"outbox completed {summary.get('completed')} (nginx saw {codes}), expected {count}"
    return r, None


def curl_once(work, nginx, config, count):
    before = nginx.requests_logged()
    p = B.must(B.measure(curl_argv(config), stderr_path=work.join("curl.err")), "curl --parallel")
    codes = nginx.status_counts(before)
    if codes.get("204") != count:
        raise B.BenchFailure(f"curl: nginx saw {codes}, expected {count} × 204")
    return p


def small_case(work, nginx, url, lines, config):
    """POST_COUNT POSTs: outbox's drain against curl --parallel, ROUNDS interleaved rounds."""
    outbox_t, peer_t, rss = [], [], []
    cpu = B.CPUShares()
    failure = None

    def outbox_round(round_):
        """Enqueues (untimed) and drains (timed); returns a failure or None."""
        project = project_for(work, f"p{round_}", url)
        B.must(project.run("enqueue", "bench.post", "--from", lines), "outbox enqueue --from")
        server_before = nginx.cpu_seconds()
        r, failed = drain(project, nginx, COUNT)
        if failed:
            return failed
        cpu.add("outbox", [r], nginx.cpu_seconds() - server_before)
        outbox_t.append(r.wall)
        rss.append(r.rss_kib)
        shutil.rmtree(project.root, ignore_errors=True)
        return None

    def curl_round(round_):
        server_before = nginx.cpu_seconds()
        p = curl_once(work, nginx, config, COUNT)
        cpu.add("curl", [p], nginx.cpu_seconds() - server_before)
        peer_t.append(p.wall)
        return None

    for round_ in range(ROUNDS):
        # The order alternates, so neither contender always runs right after the other.
        for contender in B.rotated([outbox_round, curl_round], round_):
            failure = contender(round_)
            if failure:
                break
        if failure:
            break
        B.log(f"post round {round_ + 1}: outbox {outbox_t[-1]:.2f} s ({rss[-1] / 1024:.1f} MiB), curl {peer_t[-1]:.2f} s")
    if failure:
        B.log(f"post: {failure}")
        return [B.Row("post", f"{COUNT:,} POSTs, 16 in flight", "s", None, "curl --parallel-max 16",
                      B.median(peer_t) if peer_t else None, note=failure[:200])]
    o, q = B.median(outbox_t), B.median(peer_t)
    return [B.Row("post", f"{COUNT:,} POSTs, 16 in flight", "s", o, "curl --parallel-max 16", q,
                  target="ratio ≤ 1.1", target_ok=(o / q) <= 1.1, rss_kib=max(rss), rss_target_mib=50,
                  note=f"outbox {COUNT / o:,.0f} req/s, curl {COUNT / q:,.0f} req/s (medians of {ROUNDS}; "
                       f"outbox {min(outbox_t):.2f}–{max(outbox_t):.2f} s, curl {min(peer_t):.2f}–{max(peer_t):.2f} s); "
                       f"{cpu.note()}")]


def fill_large(work, project, count):
    """Enqueues `count` entries with `enqueue --from`, ENQUEUE_CHUNK lines per call; returns
    the seconds it took."""
    total = 0.0
    for first in range(0, count, ENQUEUE_CHUNK):
        n = min(ENQUEUE_CHUNK, count - first)
        chunk = B.write_jsonl(work.join("large-chunk.jsonl"), n, lambda i: {"vars": {"n": first + i}})
        e = B.must(project.run("enqueue", "bench.post", "--from", chunk, rss=False), "outbox enqueue --from (large)")
        total += e.wall
    return total


def waiting_case(work, url):
    """A runner whose queued entries all wait (a delay of an hour: nothing is due): the CPU
    of `run --max-time 3s` and the time of `run --drain` (it finds nothing due within its
    horizon and ends) with WAITING_COUNT such entries, against the same with one. Flat is
    the goal: a waiting queue costs its runner nothing per entry."""
    figures = {}
    for count in (1, WAITING_COUNT):
        project = project_for(work, f"w{count}", url)
        for first in range(0, count, ENQUEUE_CHUNK):
            n = min(ENQUEUE_CHUNK, count - first)
            chunk = B.write_jsonl(work.join("waiting-chunk.jsonl"), n,
                                  lambda i: {"vars": {"n": first + i}, "delay": "1h"})
            B.must(project.run("enqueue", "bench.post", "--from", chunk, rss=False), "outbox enqueue --from (waiting)")
        runs, drains = [], []
        for _ in range(WAITING_ROUNDS):
            runs.append(B.must(project.run("run", "--max-time", "3s", "--quiet"), "outbox run --max-time 3s"))
            drains.append(B.must(project.run("run", "--drain", "--quiet"), "outbox run --drain"))
        figures[count] = (B.median([r.cpu for r in runs]), B.median([d.wall for d in drains]),
                          max(r.rss_kib for r in runs + drains))
        B.log(f"post waiting, {count:,} entries: run --max-time 3s CPU {figures[count][0]:.2f} s, "
              f"run --drain {figures[count][1]:.2f} s, {figures[count][2] / 1024:.1f} MiB")
        shutil.rmtree(project.root, ignore_errors=True)
    many, one = figures[WAITING_COUNT], figures[1]
    case = f"{WAITING_COUNT:,} entries waiting 1 h"
    return [
        B.Row("post", case, "s", many[0], "the same, 1 entry waiting", one[0], rss_kib=many[2],
              note=f"CPU (user + system) of `run --max-time 3s`, medians of {WAITING_ROUNDS}"),
        B.Row("post", case, "s", many[1], "the same, 1 entry waiting", one[1], rss_kib=many[2],
              note=f"time of `run --drain` (nothing due: it ends), medians of {WAITING_ROUNDS}"),
    ]


def paused_case(work, nginx, url, lines, ahead=False):
    """POST_COUNT entries drained beside a paused key's PAUSED_COUNT entries, against the same
    drain with no paused entry: flat is the goal (a paused backlog is not walked per read).
    `ahead`: beside AHEAD_COUNT entries of the same key delayed an hour, enqueued first (a
    queue after an outage: entries backing off ahead of due ones)."""
    figures = {}
    many_count = AHEAD_COUNT if ahead else PAUSED_COUNT
    for count in (0, many_count):
        project = project_for(work, f"p{count}", url)
        project.write("definitions/held.yaml",
                      f'key: bench.held\nrequest:\n  method: POST\n  url: "{url}"\n  data: {{ n: "{{{{ vars.n }}}}" }}\n')
        for first in range(0, count, ENQUEUE_CHUNK):
            n = min(ENQUEUE_CHUNK, count - first)
            extra = {"delay": "1h"} if ahead else {}
            chunk = B.write_jsonl(work.join("paused-chunk.jsonl"), n, lambda i: {"vars": {"n": first + i}, **extra})
            B.must(project.run("enqueue", "bench.post" if ahead else "bench.held", "--from", chunk, rss=False),
                   "outbox enqueue --from (waiting)")
        if not ahead:
            B.must(project.run("pause", "--key", "bench.held", rss=False), "outbox pause --key bench.held")
        drains = []
        for _ in range(PAUSED_ROUNDS):
            B.must(project.run("enqueue", "bench.post", "--from", lines, rss=False), "outbox enqueue --from")
            measured, failure = drain(project, nginx, COUNT)
            if failure:
                raise B.BenchFailure(failure)
            drains.append(measured)
        figures[count] = (B.median([d.wall for d in drains]), max(d.rss_kib for d in drains))
        what = "waiting ahead" if ahead else "paused"
        B.log(f"post {what}, {count:,} entries: drain of {COUNT:,} {figures[count][0]:.3f} s, "
              f"{figures[count][1] / 1024:.1f} MiB")
        shutil.rmtree(project.root, ignore_errors=True)
    many, none = figures[many_count], figures[0]
    case = (f"{COUNT:,} POSTs behind {AHEAD_COUNT:,} entries waiting 1 h" if ahead
            else f"{COUNT:,} POSTs beside {PAUSED_COUNT:,} paused entries")
    return [B.Row("post", case, "s", many[0], "the same, none waiting" if ahead else "the same, none paused", none[0],
                  rss_kib=many[1], note=f"time of `run --drain`, medians of {PAUSED_ROUNDS}")]


def large_case(work, nginx, url, lines, config):
    """The cost per request at LARGE_COUNT queued entries beside POST_COUNT: requests/s and
    peak RSS of both drains, rounds interleaved with each other and with curl's POST_COUNT."""
    small_t, small_rss, large_t, large_rss, enqueue_t, curl_t = [], [], [], [], [], []
    failure = None

    def small_round(round_):
        project = project_for(work, f"ls{round_}", url)
        B.must(project.run("enqueue", "bench.post", "--from", lines), "outbox enqueue --from")
        r, failed = drain(project, nginx, COUNT)
        if failed:
            return failed
        small_t.append(r.wall)
        small_rss.append(r.rss_kib)
        shutil.rmtree(project.root, ignore_errors=True)
        return None

    def large_round(round_):
        project = project_for(work, f"ll{round_}", url)
        enqueue_t.append(fill_large(work, project, LARGE_COUNT))
        r, failed = drain(project, nginx, LARGE_COUNT)
        if failed:
            return failed
        large_t.append(r.wall)
        large_rss.append(r.rss_kib)
        shutil.rmtree(project.root, ignore_errors=True)
        return None

    def curl_round(round_):
        curl_t.append(curl_once(work, nginx, config, COUNT).wall)
        return None

    for round_ in range(LARGE_ROUNDS):
        for contender in B.rotated([large_round, small_round, curl_round], round_):
            os.sync()
            failure = contender(round_)
            if failure:
                break
        if failure:
            break
        B.log(f"post large round {round_ + 1}: outbox {LARGE_COUNT:,} in {large_t[-1]:.2f} s "
              f"({LARGE_COUNT / large_t[-1]:,.0f}/s, {large_rss[-1] / 1024:.1f} MiB; enqueue {enqueue_t[-1]:.1f} s), "
              f"{COUNT:,} in {small_t[-1]:.2f} s ({COUNT / small_t[-1]:,.0f}/s, {small_rss[-1] / 1024:.1f} MiB), "
              f"curl {COUNT:,} in {curl_t[-1]:.2f} s ({COUNT / curl_t[-1]:,.0f}/s)")
    case = f"{LARGE_COUNT:,} POSTs queued, 16 in flight"
    if failure:
        B.log(f"post large: {failure}")
        return [B.Row("post", case, "/s", None, f"outbox, {COUNT:,} queued", None, higher_is_better=True,
                      note=failure[:200])]
    large_rate = LARGE_COUNT / B.median(large_t)
    small_rate = COUNT / B.median(small_t)
    curl_rate = COUNT / B.median(curl_t)
    return [
        B.Row("post", case, "/s", large_rate, f"outbox, {COUNT:,} queued (RSS {max(small_rss) / 1024:.1f} MiB)",
              small_rate, higher_is_better=True, rss_kib=max(large_rss),
              note=f"requests/s, medians of {LARGE_ROUNDS}; enqueue --from of {LARGE_COUNT:,} in "
                   f"{ENQUEUE_CHUNK:,}-line calls: {B.median(enqueue_t):.1f} s (median)"),
        B.Row("post", case, "/s", large_rate, f"curl --parallel-max 16, {COUNT:,} requests (reference)", curl_rate,
              higher_is_better=True, rss_kib=max(large_rss)),
    ]


def main():
    if not B.ensure_tool("curl", "curl"):
        raise B.BenchFailure("curl is missing")
    cases = os.environ.get("POST_CASES", "small").split(",")
    rows = []
    with B.WorkDir("post") as work, B.Nginx(work.join("nginx")) as nginx:
        url = nginx.url("/x")
        lines = B.write_jsonl(work.join("posts.jsonl"), COUNT, lambda i: {"vars": {"n": i}})
        config = curl_config(work.join("curl.conf"), url, COUNT)
        # One untimed pass first: a fresh nginx (and, in a VM, memory nobody touched yet)
        # made whichever contender ran first the slowest.
        B.must(B.measure(curl_argv(config), stderr_path=work.join("curl.err")), "warm-up")
        if "small" in cases:
            rows += small_case(work, nginx, url, lines, config)
        if "large" in cases:
            rows += large_case(work, nginx, url, lines, config)
        if "waiting" in cases:
            rows += waiting_case(work, url)
        if "paused" in cases:
            rows += paused_case(work, nginx, url, lines)
        if "ahead" in cases:
            rows += paused_case(work, nginx, url, lines, ahead=True)
    B.emit(rows)


if __name__ == "__main__":
    main()
