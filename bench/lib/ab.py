"""Two outbox binaries on the same work in interleaved rounds (each round starts with a
different one), against the same nginx: the way an optimisation is kept or dropped.

AB_CASE: `post` (AB_COUNT small POSTs, default 5,000, timed `run --drain`), `large` (the
same at AB_COUNT queued entries, default 500,000, enqueued with `enqueue --from` 50,000
lines per call, untimed) or `small` (AB_COUNT files of 4 KiB, default 10,000, PUT to
WebDAV: `enqueue --from` + `run --drain` timed). AB_ROUNDS rounds (default 10). Prints
each round, the medians, the new binary's median over the old one's, and how many rounds
the new one won; CPU (user + sys) of the drains too.
"""

import os
import resource
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as B  # noqa: E402
import post as P  # noqa: E402

CASE = os.environ.get("AB_CASE", "post")
ROUNDS = int(os.environ.get("AB_ROUNDS", "10"))
DEFAULT_COUNT = {"post": 5000, "large": 500000, "small": 10000}
COUNT = int(os.environ.get("AB_COUNT", str(DEFAULT_COUNT.get(CASE, 5000))))


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: bench/ab.sh OLD_BINARY NEW_BINARY")
    binaries = {"old": os.path.abspath(sys.argv[1]), "new": os.path.abspath(sys.argv[2])}
    times = {"old": [], "new": []}
    cpu = {"old": [], "new": []}
    with B.WorkDir("ab") as work, B.WorkDir("ab-sink", base="/dev/shm") as sink, \
            B.Nginx(work.join("nginx"), dav_root=sink.path) as nginx:
        if CASE in ("post", "large"):
            url = nginx.url("/x")
            lines = B.write_jsonl(work.join("posts.jsonl"), COUNT, lambda i: {"vars": {"n": i}})
        elif CASE == "small":
            src = work.join("small")
            os.makedirs(src)
            for i in range(COUNT):
                with open(os.path.join(src, f"f{i:05d}.bin"), "wb") as fh:
                    fh.write(f"{i:09d}".encode() + os.urandom(4096 - 9))
            lines = B.write_jsonl(work.join("small.jsonl"), COUNT,
                                  lambda i: {"vars": {"path": os.path.join(src, f"f{i:05d}.bin"), "name": f"f{i:05d}.bin"}})
        else:
            raise SystemExit(f"AB_CASE must be post, large or small, not {CASE}")

        def one(name, round_):
            tag = f"{name}-{round_}"
            if CASE == "small":
                project = B.Project(work.join(tag), "concurrency: 16\nper_host: 16\n", binary=binaries[name])
                project.write("definitions/put.yaml", f"""key: bench.put
request:
  method: PUT
  url: "{nginx.url('/dav/' + tag + '/')}{{{{ vars.name }}}}"
  file: "{{{{ vars.path }}}}"
  ownership: reference
""")
                before = children_cpu()
                e = B.must(project.run("enqueue", "bench.put", "--from", lines), "enqueue --from")
                r, failure = P.drain(project, nginx, COUNT, status="201")
                if failure:
                    raise B.BenchFailure(f"{name}: {failure}")
                spent = children_cpu() - before
                got = len(os.listdir(os.path.join(sink.path, "dav", tag)))
                if got != COUNT:
                    raise B.BenchFailure(f"{name}: the sink holds {got} files, expected {COUNT}")
                B.clear_folder(os.path.join(sink.path, "dav", tag))
                wall = e.wall + r.wall
            else:
                project = P.project_for(work, tag, url)
                project.binary = binaries[name]
                if CASE == "large":
                    P.fill_large(work, project, COUNT)
                else:
                    B.must(project.run("enqueue", "bench.post", "--from", lines), "enqueue --from")
                os.sync()
                before = children_cpu()
                r, failure = P.drain(project, nginx, COUNT)
                if failure:
                    raise B.BenchFailure(f"{name}: {failure}")
                spent = children_cpu() - before
                wall = r.wall
            B.clear_folder(project.root)
            times[name].append(wall)
            cpu[name].append(spent)
            return f"{name} {wall:.3f} s (cpu {spent:.2f} s, {r.rss_kib / 1024:.1f} MiB)"

        for round_ in range(ROUNDS):
            os.sync()
            parts = [one(n, round_) for n in B.rotated(["old", "new"], round_)]
            B.log(f"ab {CASE} round {round_ + 1}: " + ", ".join(parts))
    o, n = statistics.median(times["old"]), statistics.median(times["new"])
    wins = sum(1 for a, b in zip(times["old"], times["new"]) if b < a)
    print(f"A/B {CASE}, {COUNT:,} requests, {ROUNDS} interleaved rounds: old median {o:.3f} s "
          f"({COUNT / o:,.0f}/s), new {n:.3f} s ({COUNT / n:,.0f}/s), new/old {n / o:.3f}; new faster in {wins} of "
          f"{ROUNDS}; CPU medians old {statistics.median(cpu['old']):.2f} s, new {statistics.median(cpu['new']):.2f} s")
    print(f"  old: {' '.join(f'{t:.3f}' for t in times['old'])}")
    print(f"  new: {' '.join(f'{t:.3f}' for t in times['new'])}")


if __name__ == "__main__":
    main()
