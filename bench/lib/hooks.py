"""The runner: HOOK_COUNT outcomes delivered to a hook that only exits 0.

Setup (not timed): HOOK_COUNT entries are sent to nginx while their definition file is
absent, so their outcomes are journaled and held as `unhandled-key` (docs/hooks-and-events.md).
Timed: the definition comes back and `outbox run --drain` delivers every outcome; no
HTTP happens in that run, so deliveries per second is the hook path alone.
peer: a Python loop spawning the same command HOOK_COUNT times, one after another.
Environment: HOOK_COUNT (default 5000), ROUNDS (default 5; figures are medians, the two
contenders taking turns to go first: single runs on the 2-core VM spread from 1.2 s to
2.2 s for the same 1,000 deliveries), HOOK_CONCURRENCY (sets `hooks.concurrency`; default:
the config's default).
Targets: the argv hook ≥ 2,000 deliveries/s; the sh hook at least as fast as the Python
loop spawning the same script in the same run.
"""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as B  # noqa: E402

COUNT = int(os.environ.get("HOOK_COUNT", "5000"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
HOOK_CONCURRENCY = os.environ.get("HOOK_CONCURRENCY")
DEFAULT_HOOK_CONCURRENCY = 4  # the config default (hooks.concurrency, docs/config.md)
ARGV_TARGET = 2000

VARIANTS = [
    # (case, on_success YAML, the same command for the peer)
    ("sh script hooks/ok.sh", "hooks/ok.sh", ["/bin/sh", "-c", "hooks/ok.sh"]),
    ('argv ["/bin/true"]', '["/bin/true"]', ["/bin/true"]),
]


def peer_spawns(argv, cwd):
    """Spawns argv COUNT times from Python, sequentially; returns (seconds, failures)."""
    failures = 0
    start = time.perf_counter()
    for _ in range(COUNT):
        if subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL).returncode != 0:
            failures += 1
    return time.perf_counter() - start, failures


def deliveries(work, nginx, name, command):
    """One timed `run --drain` delivering COUNT held outcomes to `command`; returns its measure."""
    hooks = f"hooks: {{ concurrency: {HOOK_CONCURRENCY} }}\n" if HOOK_CONCURRENCY else ""
    project = B.Project(work.join(name), "concurrency: 16\nper_host: 16\n" + hooks)
    project.write("hooks/ok.sh", "#!/bin/sh\nexit 0\n", mode=0o755)
    definition = (f'key: bench.hook\nrequest:\n  method: POST\n  url: "{nginx.url("/x")}"\n'
                  f'  data: {{ n: "{{{{ vars.n }}}}" }}\non_success: {command}\n')
    path = project.write("definitions/hook.yaml", definition)
    lines = B.write_jsonl(work.join(f"{name}.jsonl"), COUNT, lambda i: {"vars": {"n": i}})
    B.must(project.run("enqueue", "bench.hook", "--from", lines), "outbox enqueue --from")
    os.rename(path, path + ".off")
    setup = B.must(project.run("run", "--drain", "--json", stdout_name="setup.json"), "outbox run --drain (setup)")
    summary = json.loads(setup.stdout())
    if summary.get("completed") != COUNT or summary.get("delivered") != 0:
        raise B.BenchFailure(f"setup run: {summary}, expected {COUNT} completed and 0 delivered")
    os.rename(path + ".off", path)
    os.sync()
    r = B.must(project.run("run", "--drain", "--json", stdout_name="deliver.json"), "outbox run --drain (deliveries)")
    summary = json.loads(r.stdout())
    if summary.get("delivered") != COUNT or summary.get("attempts") != 0:
        raise B.BenchFailure(f"delivery run: {summary}, expected {COUNT} delivered and no attempts")
    return r


def one_variant(work, nginx, index, case, command, peer_argv):
    outbox_s, peer_s, rss = [], [], []
    # The peer spawns the same script, from a folder of its own.
    peer_project = B.Project(work.join(f"peer{index}"))
    peer_project.write("hooks/ok.sh", "#!/bin/sh\nexit 0\n", mode=0o755)

    def outbox(round_):
        r = deliveries(work, nginx, f"p{index}-{round_}", command)
        outbox_s.append(r.wall)
        rss.append(r.rss_kib or 0)

    def peer(round_):
        seconds, failures = peer_spawns(peer_argv, peer_project.root)
        if failures:
            raise B.BenchFailure(f"peer: {failures} spawns failed")
        peer_s.append(seconds)

    for round_ in range(ROUNDS):
        for contender in B.rotated([outbox, peer], round_):
            contender(round_)
        B.log(f"hooks {case} round {round_ + 1}: outbox {outbox_s[-1]:.2f} s for {COUNT} deliveries, "
              f"python {peer_s[-1]:.2f} s for {COUNT} spawns")
    o, q = B.median(outbox_s), B.median(peer_s)
    hook_concurrency = HOOK_CONCURRENCY or DEFAULT_HOOK_CONCURRENCY
    if command.startswith("["):
        target, target_ok = f"≥ {ARGV_TARGET:,}/s", COUNT / o >= ARGV_TARGET
    else:
        target, target_ok = "≥ python loop", o <= q
    return B.Row("hooks", f"{COUNT:,} deliveries, {case}", "/s", COUNT / o, "python subprocess loop", COUNT / q,
                 higher_is_better=True, target=target, target_ok=target_ok, rss_kib=max(rss),
                 note=f"medians of {ROUNDS}; outbox runs up to {hook_concurrency} hooks at once (hooks.concurrency); "
                      "the peer spawns one at a time")


def main():
    rows = []
    with B.WorkDir("hooks") as work, B.Nginx(work.join("nginx")) as nginx:
        for index, (case, command, peer_argv) in enumerate(VARIANTS):
            try:
                rows.append(one_variant(work, nginx, index, case, command, peer_argv))
            except B.BenchFailure as e:
                B.log(f"hooks {case}: {e}")
                rows.append(B.Row("hooks", f"{COUNT:,} deliveries, {case}", "/s", None, "python subprocess loop", None,
                                  higher_is_better=True, note=str(e)[:200]))
    B.emit(rows)


if __name__ == "__main__":
    main()
