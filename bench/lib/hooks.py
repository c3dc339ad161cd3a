"""The runner: HOOK_COUNT outcomes delivered to a hook that only exits 0.

Setup (not timed): HOOK_COUNT entries are sent to nginx while their definition file is
absent, so their outcomes are journaled and held as `unhandled-key` (docs/hooks-and-events.md).
Timed: the definition comes back and `outbox run --drain` delivers every outcome; no
HTTP happens in that run, so deliveries per second is the hook path alone.
peer: a Python loop spawning the same command HOOK_COUNT times, one after another; and, as
the machine's ceiling, a C loop (built with the system's cc) that posix_spawns the command
HOOK_COUNT times with `hooks.concurrency` children at once and only waits for them.
Environment: HOOK_COUNT (default 5000), ROUNDS (default 5; figures are medians, the two
contenders taking turns to go first: single runs on the 2-core VM spread from 1.2 s to
2.2 s for the same 1,000 deliveries), HOOK_CONCURRENCY (sets `hooks.concurrency`; default:
the config's default).
Targets: the argv hook ≥ 2,000 deliveries/s; the sh hook at least as fast as the Python
loop spawning the same script in the same run.
"""

import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as B  # noqa: E402

COUNT = int(os.environ.get("HOOK_COUNT", "5000"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
HOOK_CONCURRENCY = os.environ.get("HOOK_CONCURRENCY")
DEFAULT_HOOK_CONCURRENCY = 32  # the config default (hooks.concurrency, docs/config.md)
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


# Spawns argv[3:] argv[1] times, argv[2] at once, and prints the seconds it took.
SPAWN_LOOP_C = r"""
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
extern char **environ;
int main(int argc, char **argv) {
    int count = atoi(argv[1]), at_once = atoi(argv[2]), running = 0, started = 0, done = 0, failed = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    while (done < count) {
        while (running < at_once && started < count) {
            pid_t pid;
            if (posix_spawn(&pid, argv[3], NULL, NULL, argv + 3, environ) != 0) return 2;
            running++, started++;
        }
        int status;
        if (wait(&status) < 0) return 2;
        running--, done++;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.6f\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
    return failed ? 1 : 0;
}
"""


def build_spawn_loop(work):
    """The C ceiling's binary, or None when no C compiler is installed."""
    cc = shutil.which("cc") or shutil.which("clang") or shutil.which("gcc")
    if not cc:
        return None
    source = work.join("spawn_loop.c")
    with open(source, "w") as fh:
        fh.write(SPAWN_LOOP_C)
    binary = work.join("spawn_loop")
    if subprocess.run([cc, "-O2", "-o", binary, source], stdout=subprocess.DEVNULL).returncode != 0:
        return None
    return binary


def c_spawns(binary, argv, cwd, at_once):
    """The C loop's seconds for COUNT spawns of argv, `at_once` at a time."""
    argv = argv if os.path.isabs(argv[0]) else [shutil.which(argv[0]) or argv[0]] + argv[1:]
    r = subprocess.run([binary, str(COUNT), str(at_once)] + argv, cwd=cwd, stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise B.BenchFailure(f"the C spawn loop failed (exit {r.returncode})")
    return float(r.stdout.strip())


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


def one_variant(work, nginx, index, case, command, peer_argv, spawn_loop):
    outbox_s, peer_s, ceiling_s, rss = [], [], [], []
    hook_concurrency = int(HOOK_CONCURRENCY or DEFAULT_HOOK_CONCURRENCY)
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

    def ceiling(round_):
        ceiling_s.append(c_spawns(spawn_loop, peer_argv, peer_project.root, hook_concurrency))

    contenders = [outbox, peer] + ([ceiling] if spawn_loop else [])
    for round_ in range(ROUNDS):
        for contender in B.rotated(contenders, round_):
            contender(round_)
        B.log(f"hooks {case} round {round_ + 1}: outbox {outbox_s[-1]:.2f} s for {COUNT} deliveries, "
              f"python {peer_s[-1]:.2f} s for {COUNT} spawns"
              + (f", C {ceiling_s[-1]:.2f} s ({hook_concurrency} at once)" if ceiling_s else ""))
    o, q = B.median(outbox_s), B.median(peer_s)
    if command.startswith("["):
        target, target_ok = f"≥ {ARGV_TARGET:,}/s", COUNT / o >= ARGV_TARGET
    else:
        target, target_ok = "≥ python loop", o <= q
    rows = [B.Row("hooks", f"{COUNT:,} deliveries, {case}", "/s", COUNT / o, "python subprocess loop", COUNT / q,
                  higher_is_better=True, target=target, target_ok=target_ok, rss_kib=max(rss),
                  note=f"medians of {ROUNDS}; outbox runs up to {hook_concurrency} hooks at once (hooks.concurrency); "
                       "the peer spawns one at a time")]
    if ceiling_s:
        rows.append(B.Row("hooks", f"{COUNT:,} deliveries, {case}", "/s", COUNT / o,
                          f"C posix_spawn loop, {hook_concurrency} at once (ceiling)", COUNT / B.median(ceiling_s),
                          higher_is_better=True, rss_kib=max(rss),
                          note="spawns and waits only: no payload, no journal, no fsync"))
    return rows


def main():
    rows = []
    with B.WorkDir("hooks") as work, B.Nginx(work.join("nginx")) as nginx:
        spawn_loop = build_spawn_loop(work)
        if not spawn_loop:
            B.log("hooks: no C compiler (cc): the C ceiling is left out")
        for index, (case, command, peer_argv) in enumerate(VARIANTS):
            try:
                rows += one_variant(work, nginx, index, case, command, peer_argv, spawn_loop)
            except B.BenchFailure as e:
                B.log(f"hooks {case}: {e}")
                rows.append(B.Row("hooks", f"{COUNT:,} deliveries, {case}", "/s", None, "python subprocess loop", None,
                                  higher_is_better=True, note=str(e)[:200]))
    B.emit(rows)


if __name__ == "__main__":
    main()
