"""The runner: POST_COUNT small JSON POSTs to a local nginx (`return 204`), 16 at a time.

outbox: entries enqueued first (not timed), then `outbox run --drain` timed.
peer:   `curl --parallel --parallel-max 16` with a config file holding the same requests.
Environment: POST_COUNT (default 5000), ROUNDS (default 9).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as B  # noqa: E402

COUNT = int(os.environ.get("POST_COUNT", "5000"))
ROUNDS = int(os.environ.get("ROUNDS", "9"))
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


def main():
    if not B.ensure_tool("curl", "curl"):
        raise B.BenchFailure("curl is missing")
    rows = []
    with B.WorkDir("post") as work, B.Nginx(work.join("nginx")) as nginx:
        url = nginx.url("/x")
        lines = B.write_jsonl(work.join("posts.jsonl"), COUNT, lambda i: {"vars": {"n": i}})
        config = curl_config(work.join("curl.conf"), url, COUNT)
        # One untimed pass first: a fresh nginx (and, in a VM, memory nobody touched yet)
        # made whichever contender ran first the slowest.
        B.must(B.measure(["curl", "--parallel", "--parallel-max", str(CONCURRENCY), "-s", "-K", config],
                         stderr_path=work.join("curl.err")), "warm-up")
        outbox_t, peer_t, rss = [], [], []
        failure = None

        def outbox_round(round_):
            """Enqueues (untimed) and drains (timed); returns a failure or None."""
            project = B.Project(work.join(f"p{round_}"), f"concurrency: {CONCURRENCY}\nper_host: {CONCURRENCY}\n")
            project.write("definitions/post.yaml",
                          f'key: bench.post\nrequest:\n  method: POST\n  url: "{url}"\n  data: {{ n: "{{{{ vars.n }}}}" }}\n')
            B.must(project.run("enqueue", "bench.post", "--from", lines), "outbox enqueue --from")
            before = nginx.requests_logged()
            r = project.run("run", "--drain", "--json", stdout_name="summary.json")
            if r.rc != 0:
                return f"outbox run --drain exited {r.rc}: {r.stderr()[-300:]}"
            summary = json.loads(r.stdout() or "{}")
            codes = nginx.status_counts(before)
            if summary.get("completed") != COUNT or codes.get("204") != COUNT:
                return f"outbox completed {summary.get('completed')} (nginx saw {codes}), expected {COUNT}"
            outbox_t.append(r.wall)
            rss.append(r.rss_kib)
            return None

        def curl_round(round_):
            before = nginx.requests_logged()
            p = B.must(B.measure(["curl", "--parallel", "--parallel-max", str(CONCURRENCY), "-s", "-K", config],
                                 stderr_path=work.join("curl.err")), "curl --parallel")
            codes = nginx.status_counts(before)
            if codes.get("204") != COUNT:
                raise B.BenchFailure(f"curl: nginx saw {codes}, expected {COUNT} × 204")
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
            rows.append(B.Row("post", f"{COUNT:,} POSTs, 16 in flight", "s", None, "curl --parallel-max 16",
                              B.median(peer_t) if peer_t else None, note=failure[:200]))
        else:
            o, q = B.median(outbox_t), B.median(peer_t)
            rows.append(B.Row("post", f"{COUNT:,} POSTs, 16 in flight", "s", o, "curl --parallel-max 16", q,
                              target="ratio ≤ 1.3", target_ok=(o / q) <= 1.3, rss_kib=max(rss), rss_target_mib=50,
                              note=f"outbox {COUNT / o:,.0f} req/s, curl {COUNT / q:,.0f} req/s (medians of {ROUNDS})"))
    B.emit(rows)


if __name__ == "__main__":
    main()
