"""Uploads to a local WebDAV sink (nginx `dav_methods PUT` writing to tmpfs).

1. One UPLOAD_SIZE file (default 2 GiB) as 20 MiB parts, 3 in flight (chunked upload),
   vs `curl -T file URL` of the same file in one request.
2. FILE_COUNT files of 1 MiB (default 1,000) as whole-file PUTs (`file:`, ownership
   reference): `enqueue --from` + `run --drain`, vs `curl --parallel --parallel-max 16 -T`
   and `rclone copy --transfers 16` to a `:webdav:` remote.
3. A SIGKILL mid-upload, then a second run: the bytes the server received twice, for
   outbox (case 1's parts), `curl -T` and `rclone copy`, each killed once the server holds
   KILL_AT of the file.
4. SMALL_COUNT files of SMALL_SIZE (default 10,000 × 4 KiB): case 2's contenders, where the
   cost per entry dominates (not run by default: UPLOAD_CASES=small).

outbox's figure includes its enqueue. When outbox fails (say chunked uploads are not
there yet), its row says "failed" and the peers are still measured.
Environment: UPLOAD_SIZE (bytes, default 2 GiB), FILE_COUNT (1000), ROUNDS (rounds of case
1, default 9; figures are medians), MANY_ROUNDS (rounds of case 2, default 15: one takes
about a second per contender, and its medians need more of them on a noisy machine),
RCLONE_ROUNDS (how many of those rounds include rclone, default 2: it takes 20 times
longer and is shown, not judged), SMALL_COUNT, SMALL_SIZE, SMALL_ROUNDS (case 4, default
10,000 files of 4 KiB, 9 rounds), RCLONE_TIMEOUT (case 4's bound on rclone, default 120 s), KILL_AT (case 3, default 0.4), SINK (a tmpfs folder,
default /dev/shm), BENCH_TMP (where source files go, default /tmp), OUTBOX_MAX_TIME (bound
on each `run --drain`, default 20m), UPLOAD_CASES (default "many,big,resume"; name some of
them to run only those).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as B  # noqa: E402

MIB = 1 << 20
UPLOAD_SIZE = int(os.environ.get("UPLOAD_SIZE", str(2048 * MIB)))
FILE_COUNT = int(os.environ.get("FILE_COUNT", "1000"))
SINK_BASE = os.environ.get("SINK", "/dev/shm")
PART = 20 * MIB
IN_FLIGHT = 3  # part_concurrency of the chunked uploads
MAX_TIME = os.environ.get("OUTBOX_MAX_TIME", "20m")
ROUNDS = int(os.environ.get("ROUNDS", "9"))
MANY_ROUNDS = int(os.environ.get("MANY_ROUNDS", "15"))
RCLONE_ROUNDS = int(os.environ.get("RCLONE_ROUNDS", "2"))
KILL_AT = float(os.environ.get("KILL_AT", "0.4"))
SMALL_COUNT = int(os.environ.get("SMALL_COUNT", "10000"))
SMALL_SIZE = int(os.environ.get("SMALL_SIZE", "4096"))
SMALL_ROUNDS = int(os.environ.get("SMALL_ROUNDS", "9"))
RCLONE_TIMEOUT = int(os.environ.get("RCLONE_TIMEOUT", "120"))


def make_file(path, size, seed):
    """Random-looking bytes, cheaply: one random MiB, stamped per block so no two blocks match."""
    block = bytearray(os.urandom(MIB))
    with open(path, "wb") as fh:
        written = 0
        n = 0
        while written < size:
            block[:16] = f"{seed:07d}:{n:08d}".encode()
            chunk = block[:min(MIB, size - written)]
            fh.write(chunk)
            written += len(chunk)
            n += 1


def sink_bytes(folder):
    total, files = 0, 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            total += os.path.getsize(os.path.join(dirpath, name))
            files += 1
    return total, files


def clear(folder):
    shutil.rmtree(folder, ignore_errors=True)


def curl_into_sink(argv, folder, expected, what, stderr_path):
    """Runs a curl upload into `folder` of the sink, checks the bytes that arrived, clears it."""
    p = B.must(B.measure(argv, stderr_path=stderr_path), what)
    got, files = sink_bytes(folder)
    if got != expected:
        raise B.BenchFailure(f"{what}: sink holds {got} bytes in {files} files, expected {expected}")
    clear(folder)
    return p


def warm_up(argv, folder, expected, stderr_path):
    """One untimed upload before the rounds. In a VM, memory the guest has not used yet is
    slow on first touch (the host backs it then): the sink's tmpfs pages and socket buffers
    of the first round cost about twice as much, whichever contender runs first."""
    curl_into_sink(argv, folder, expected, "warm-up upload", stderr_path)
    os.sync()


def mib_per_s(size, seconds):
    return size / MIB / seconds


def outbox_drain(project, what):
    """Runs `run --drain` bounded by --max-time; returns (measured, summary) or raises."""
    r = project.run("run", "--drain", "--json", "--max-time", MAX_TIME, stdout_name="summary.json", timeout=3600)
    try:
        summary = json.loads(r.stdout() or "{}")
    except ValueError:
        summary = {}
    if r.rc != 0:
        raise B.BenchFailure(f"{what}: run --drain exited {r.rc}: {r.stderr()[-300:].strip()}")
    return r, summary


class OutboxRounds:
    """outbox's side of the rounds: after a failure it sits out the remaining rounds (the
    peers are still measured), and its sink folder is cleared after every round."""

    def __init__(self, dav):
        self.sink = os.path.join(dav, "dav", "ob")
        self.failed = None

    def play(self, attempt, round_):
        if self.failed is not None:
            return
        try:
            attempt(round_)
        except B.BenchFailure as err:
            B.log(f"upload: outbox: failed: {err}")
            self.failed = f"outbox: failed: {str(err)[:160]}"
        clear(self.sink)


def play_round(contenders, round_):
    """One round: every contender once, starting with a different one each round, each after
    a sync so that none is left writing back what another wrote."""
    for contender in B.rotated(contenders, round_):
        os.sync()
        contender(round_)


def parts_definition(folder_url):
    """The chunked upload of cases 1 and 3: PART-sized parts of `vars.path`, each PUT to
    `folder_url` + `vars.name`.partN."""
    return f"""key: bench.upload
request:
  method: PUT
  file: "{{{{ vars.path }}}}"
  ownership: reference
  parts:
    plan: {{ min: {PART // MIB}MiB, max: {PART // MIB}MiB }}
    url: "{folder_url}{{{{ vars.name }}}}.part{{{{ part.number }}}}"
"""


def big_file(work, nginx, dav):
    """Case 1: one big file, chunked, vs one curl -T."""
    size = UPLOAD_SIZE
    source = work.join("big.bin")
    B.log(f"upload: writing a {size / MIB:.0f} MiB source file")
    make_file(source, size, 1)
    # The source is written back to disk now, not during the first timed round.
    os.sync()
    case = f"{size / MIB:,.0f} MiB file, {PART // MIB} MiB parts × {IN_FLIGHT}"
    rows = []

    definition = parts_definition(nginx.url("/dav/ob/"))
    outbox_s, peer_s, peer_ne_s, rss, workers, note = [], [], [], [], [], ""
    warm_up(["curl", "-s", "-S", "-o", "/dev/null", "-T", source, nginx.url("/dav/cu/big.bin")],
            os.path.join(dav, "dav", "cu"), size, work.join("curl-big.err"))
    outbox = OutboxRounds(dav)

    def outbox_round(round_):
        nonlocal note
        project = B.Project(work.join(f"big-{round_}"), f"concurrency: 16\nper_host: 16\npart_concurrency: {IN_FLIGHT}\n")
        project.write("definitions/upload.yaml", definition)
        e = B.must(project.run("enqueue", "bench.upload", "--vars", json.dumps({"path": source, "name": "big"})),
                   "outbox enqueue")
        logged = len(nginx.puts("/dav/ob/"))
        r, summary = outbox_drain(project, "chunked upload")
        # How many of nginx's workers took this round's parts (they decide how much of the
        # server's work runs in parallel).
        workers.append(len({pid for _, _, _, pid in nginx.puts("/dav/ob/")[logged:]}))
        got, files = sink_bytes(outbox.sink)
        if summary.get("completed") != 1 or got != size:
            raise B.BenchFailure(f"chunked upload: summary {summary}; sink holds {got} bytes in {files} files, "
                                 f"expected {size}")
        outbox_s.append(e.wall + r.wall)
        rss.append(r.rss_kib)
        note = f"{files} parts; enqueue {e.wall * 1000:.0f} ms"

    def curl_round(extra, times):
        # curl as is (it waits for `100 Continue`), and with outbox's request shape
        def run(round_):
            p = curl_into_sink(["curl", "-s", "-S", "-o", "/dev/null", *extra, "-T", source, nginx.url("/dav/cu/big.bin")],
                               os.path.join(dav, "dav", "cu"), size, "curl -T", work.join("curl-big.err"))
            times.append(p.wall)
        return run

    for round_ in range(ROUNDS):
        play_round([lambda n: outbox.play(outbox_round, n), curl_round([], peer_s), curl_round(["-H", "Expect:"], peer_ne_s)],
                   round_)
        B.log(f"upload big round {round_ + 1}: outbox {outbox_s[-1] if outbox_s and not outbox.failed else float('nan'):.2f} s "
              f"({workers[-1] if workers and not outbox.failed else '?'} nginx workers), "
              f"curl -T {peer_s[-1]:.2f} s (no Expect {peer_ne_s[-1]:.2f} s)")
    outbox_value = None if outbox.failed else mib_per_s(size, B.median(outbox_s))
    peer_value = mib_per_s(size, B.median(peer_s))
    rows.append(B.Row("upload", case, "MiB/s", outbox_value, "curl -T (one request)", peer_value,
                      higher_is_better=True, target="≥ 0.9× curl",
                      target_ok=None if outbox_value is None else outbox_value >= 0.9 * peer_value,
                      rss_kib=max(rss) if rss else None, rss_target_mib=64,
                      note=outbox.failed or f"{note}; medians of {ROUNDS}; parts over more than one nginx "
                                            f"worker in {sum(1 for w in workers if w > 1)} of {len(workers)} rounds"))
    rows.append(B.Row("upload", case, "MiB/s", outbox_value, "same, with -H 'Expect:' (outbox's requests)",
                      mib_per_s(size, B.median(peer_ne_s)), higher_is_better=True, rss_kib=max(rss) if rss else None))
    os.unlink(source)
    return rows


def many_files(work, nginx, dav):
    """Case 2: FILE_COUNT files of 1 MiB, whole-file PUTs, vs curl --parallel and rclone copy."""
    return whole_files(work, nginx, dav, "many", FILE_COUNT, MIB, f"{FILE_COUNT:,} files × 1 MiB, 16 in flight",
                       MANY_ROUNDS, target=1.3)


def small_files(work, nginx, dav):
    """Case 4: SMALL_COUNT files of SMALL_SIZE (4 KiB), the runner's cost per entry: the same
    contenders as case 2, rclone bounded by RCLONE_TIMEOUT."""
    size_text = f"{SMALL_SIZE // 1024} KiB" if SMALL_SIZE % 1024 == 0 else f"{SMALL_SIZE} B"
    return whole_files(work, nginx, dav, "small", SMALL_COUNT, SMALL_SIZE,
                       f"{SMALL_COUNT:,} files × {size_text}, 16 in flight", SMALL_ROUNDS, target=1.1,
                       rclone_timeout=RCLONE_TIMEOUT)


def write_small(path, size, seed):
    """One file of `size` random bytes, stamped so that no two files match."""
    data = bytearray(os.urandom(size))
    stamp = f"{seed:09d}".encode()[:size]
    data[:len(stamp)] = stamp
    with open(path, "wb") as fh:
        fh.write(data)


def whole_files(work, nginx, dav, tag, count, size, case, rounds, target, rclone_timeout=None):
    """`count` files of `size` as whole-file PUTs: outbox's enqueue --from + drain against
    curl --parallel (as is, and without Expect), and rclone copy in the first rounds."""
    src = work.join(tag)
    os.makedirs(src)
    names = [f"f{i:05d}.bin" for i in range(count)]
    for i, name in enumerate(names):
        if size >= MIB:
            make_file(os.path.join(src, name), size, i)
        else:
            write_small(os.path.join(src, name), size, i)
    os.sync()
    total = count * size
    rows = []

    definition = f"""key: bench.put
request:
  method: PUT
  url: "{nginx.url('/dav/ob/')}{{{{ vars.name }}}}"
  file: "{{{{ vars.path }}}}"
  ownership: reference
"""
    lines = B.write_jsonl(work.join(f"{tag}.jsonl"), count,
                          lambda i: {"vars": {"path": os.path.join(src, names[i]), "name": names[i]}})
    # curl sends `Expect: 100-continue` with every PUT and waits for the 100; outbox never
    # does (a round trip per request, and a 1 s stall on servers that ignore it). The second
    # config sends outbox's request shape, to show what that choice costs the server.
    config = work.join(f"curl-{tag}.conf")
    config_no_expect = work.join(f"curl-{tag}-no-expect.conf")
    for path, extra in ((config, ""), (config_no_expect, 'header = "Expect:"\n')):
        with open(path, "w") as fh:
            for i, name in enumerate(names):
                fh.write(f'upload-file = "{os.path.join(src, name)}"\nurl = "{nginx.url("/dav/cu/" + name)}"\n'
                         f'output = "/dev/null"\n{extra}')
                if i + 1 < len(names):
                    fh.write("next\n")
    have_rclone = B.ensure_tool("rclone", "rclone")
    rclone_conf = work.join("rclone.conf")
    open(rclone_conf, "w").close()
    rclone_env = dict(B.without_bench_settings(os.environ), RCLONE_CONFIG=rclone_conf)
    outbox_s, curl_s, curl_ne_s, rclone_s, rss, rclone_failed, detail = [], [], [], [], [], False, ""
    warm_up(["curl", "--parallel", "--parallel-max", "16", "-s", "-S", "-K", config], os.path.join(dav, "dav", "cu"), total,
            work.join(f"curl-{tag}.err"))
    outbox = OutboxRounds(dav)
    cpu = B.CPUShares()

    def outbox_round(round_):
        # enqueue --from + drain, in a fresh project
        nonlocal detail
        project = B.Project(work.join(f"{tag}-{round_}"), "concurrency: 16\nper_host: 16\n")
        project.write("definitions/put.yaml", definition)
        server_before = nginx.cpu_seconds()
        e = B.must(project.run("enqueue", "bench.put", "--from", lines), "outbox enqueue --from")
        r, summary = outbox_drain(project, "whole-file PUTs")
        cpu.add("outbox", [e, r], nginx.cpu_seconds() - server_before)
        got, files = sink_bytes(outbox.sink)
        if summary.get("completed") != count or got != total:
            raise B.BenchFailure(f"summary {summary}; sink holds {got} bytes in {files} files, expected {total}")
        outbox_s.append(e.wall + r.wall)
        rss.append(max(e.rss_kib or 0, r.rss_kib or 0))
        detail = f"last round: enqueue --from {e.wall:.2f} s + drain {r.wall:.2f} s"

    def curl_round(conf, times, name):
        # curl --parallel, as is and with outbox's request shape (no Expect)
        def run(round_):
            server_before = nginx.cpu_seconds()
            p = curl_into_sink(["curl", "--parallel", "--parallel-max", "16", "-s", "-S", "-K", conf],
                               os.path.join(dav, "dav", "cu"), total, "curl --parallel -T", work.join(f"curl-{tag}.err"))
            cpu.add(name, [p], nginx.cpu_seconds() - server_before)
            times.append(p.wall)
        return run

    rclone_note = "rclone not run"
    for round_ in range(rounds):
        play_round([lambda n: outbox.play(outbox_round, n), curl_round(config, curl_s, "curl"),
                    curl_round(config_no_expect, curl_ne_s, "curl without Expect")],
                   round_)
        # rclone copy to a :webdav: remote; last, as it takes 20 times longer
        if have_rclone and not rclone_failed and round_ < RCLONE_ROUNDS:
            os.sync()
            bound = ["timeout", str(rclone_timeout)] if rclone_timeout else []
            q = B.measure([*bound, "rclone", "copy", "--transfers", "16", "--webdav-url", nginx.url("/dav/rc/"), src,
                           ":webdav:"], env=rclone_env, stderr_path=work.join("rclone.err"))
            got, files = sink_bytes(os.path.join(dav, "dav", "rc"))
            clear(os.path.join(dav, "dav", "rc"))
            if rclone_timeout and q.rc == 124:
                B.log(f"upload: rclone hit the {rclone_timeout} s limit ({files} of {count} files arrived)")
                rclone_failed = "timeout"
                rclone_note = f"rclone moved {files:,} of the {count:,} files in its {rclone_timeout} s"
            elif q.rc != 0 or got != total:
                B.log(f"upload: rclone failed (exit {q.rc}, {got} bytes in sink): {q.stderr()[-300:]}")
                rclone_failed = True
                rclone_note = f"rclone failed (exit {q.rc})"
            else:
                rclone_s.append(q.wall)
                rclone_note = f"rclone {len(rclone_s)} round(s), median {B.median(rclone_s):.1f} s"
        B.log(f"upload {tag} round {round_ + 1}: outbox {outbox_s[-1] if outbox_s and not outbox.failed else float('nan'):.2f} s, "
              f"curl {curl_s[-1]:.2f} s (no Expect {curl_ne_s[-1]:.2f} s), rclone {rclone_s[-1] if round_ < len(rclone_s) and not rclone_failed else float('nan'):.2f} s")
    outbox_value = None if outbox.failed else mib_per_s(total, B.median(outbox_s))
    note = outbox.failed or (f"medians of {rounds}: outbox {count / B.median(outbox_s):,.0f} files/s "
                             f"({min(outbox_s):.2f}–{max(outbox_s):.2f} s), curl {count / B.median(curl_s):,.0f} files/s "
                             f"({min(curl_s):.2f}–{max(curl_s):.2f} s); {rclone_note}; {detail}; {cpu.note()}")
    curl_value = mib_per_s(total, B.median(curl_s))
    rows.append(B.Row("upload", case, "MiB/s", outbox_value, "curl --parallel-max 16 -T", curl_value,
                      higher_is_better=True, target=f"ratio ≤ {target}",
                      target_ok=None if outbox_value is None else curl_value / outbox_value <= target,
                      rss_kib=max(rss) if rss else None, note=note))
    rows.append(B.Row("upload", case, "MiB/s", outbox_value, "same, with -H 'Expect:' (outbox's requests)",
                      mib_per_s(total, B.median(curl_ne_s)), higher_is_better=True, rss_kib=max(rss) if rss else None))
    if have_rclone:
        rclone_value = None if rclone_failed or not rclone_s else mib_per_s(total, B.median(rclone_s))
        limit = f" (timeout {rclone_timeout} s)" if rclone_timeout else ""
        rows.append(B.Row("upload", case, "MiB/s", outbox_value, f"rclone copy --transfers 16{limit}", rclone_value,
                          higher_is_better=True, rss_kib=max(rss) if rss else None,
                          peer_text="timeout" if rclone_failed == "timeout" else None if rclone_s or rclone_failed else "not run"))
    shutil.rmtree(src, ignore_errors=True)
    return rows


def server_bytes(dav, folder):
    """Body bytes the sink holds for `folder`: finished files there, plus nginx's temp files
    of requests still arriving (nginx renames a PUT's temp file into place when it ends)."""
    done, _ = sink_bytes(os.path.join(dav, "dav", folder))
    arriving, _ = sink_bytes(os.path.join(dav, ".nginx-body"))
    return done + arriving


def kill_midway(argv, cwd, dav, folder, at_bytes, what):
    """Starts argv, SIGKILLs it once the server has `at_bytes` of its upload, and waits."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    reached = False
    while proc.poll() is None and not reached and time.monotonic() < deadline:
        reached = server_bytes(dav, folder) >= at_bytes
        if not reached:
            time.sleep(0.005)
    if proc.poll() is not None:
        raise B.BenchFailure(f"{what} ended (exit {proc.returncode}) before the server had {at_bytes} bytes")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if not reached:
        raise B.BenchFailure(f"{what} did not get {at_bytes} bytes to the server in 300 s")


def resent(nginx, prefix, size):
    """(MiB the server received beyond one copy of the file, paths PUT more than once)."""
    puts = nginx.puts(prefix)
    received = sum(n for _, _, n, _ in puts)
    counts = {}
    for uri, _, _, _ in puts:
        counts[uri] = counts.get(uri, 0) + 1
    # Request lines and headers count too: a few hundred bytes per request.
    return max(0, received - size) / MIB, sorted(u for u, c in counts.items() if c > 1)


def resume_after_kill(work, nginx, dav):
    """Case 3: SIGKILL mid-upload, then run again: what the server received twice. outbox
    (20 MiB parts, 3 in flight, each accepted part recorded) against curl -T and rclone copy,
    which start the file over."""
    size = UPLOAD_SIZE
    at = int(size * KILL_AT)
    folder = work.join("resume-src")
    os.makedirs(folder)
    source = os.path.join(folder, "big.bin")
    B.log(f"upload resume: writing a {size / MIB:.0f} MiB source file")
    make_file(source, size, 3)
    os.sync()
    case = f"SIGKILL at {KILL_AT:.0%} of {size / MIB:,.0f} MiB, run again"
    rows = []

    # outbox: killed once the server holds KILL_AT of the file, then `run --drain`.
    project = B.Project(work.join("resume"), f"part_concurrency: {IN_FLIGHT}\n")
    project.write("definitions/upload.yaml", parts_definition(nginx.url("/dav/rs-ob/")))
    B.must(project.run("enqueue", "bench.upload", "--vars", json.dumps({"path": source, "name": "big"})),
           "outbox enqueue")
    outbox_mib, twice, note = None, [], ""
    try:
        kill_midway(project.argv("run", "--drain", "--progress", "never"), project.root, dav, "rs-ob", at, "outbox run")
        r, summary = outbox_drain(project, "resumed chunked upload")
        got, files = sink_bytes(os.path.join(dav, "dav", "rs-ob"))
        if summary.get("completed") != 1 or got != size:
            raise B.BenchFailure(f"resume: summary {summary}; sink holds {got} bytes in {files} files, expected {size}")
        outbox_mib, twice = resent(nginx, "/dav/rs-ob/", size)
        note = (f"outbox sent {len(twice)} of {files} parts twice (target: at most the {IN_FLIGHT} in flight); "
                f"curl and rclone start the file over")
    except B.BenchFailure as err:
        B.log(f"upload resume: outbox: failed: {err}")
        note = f"outbox: failed: {str(err)[:160]}"
    clear(os.path.join(dav, "dav", "rs-ob"))

    def peer(name, argv, prefix, folder_name):
        kill_midway(argv, work.path, dav, folder_name, at, name)
        B.must(B.measure(argv, cwd=work.path, stderr_path=work.join(f"resume-{folder_name}.err")), f"{name}, run again")
        got, _ = sink_bytes(os.path.join(dav, "dav", folder_name))
        if got != size:
            raise B.BenchFailure(f"{name}: sink holds {got} bytes after the second run, expected {size}")
        clear(os.path.join(dav, "dav", folder_name))
        return resent(nginx, prefix, size)[0]

    curl = ["curl", "-s", "-S", "-o", "/dev/null", "-T", source, nginx.url("/dav/rs-cu/big.bin")]
    curl_mib = peer("curl -T", curl, "/dav/rs-cu/", "rs-cu")
    limit = IN_FLIGHT * PART / MIB
    target_ok = None if outbox_mib is None else len(twice) <= IN_FLIGHT and outbox_mib <= limit
    rows.append(B.Row("upload", case, "MiB", outbox_mib, "curl -T, killed and run again (MiB re-sent)", curl_mib,
                      target=f"≤ {IN_FLIGHT} parts ({limit:.0f} MiB) re-sent", target_ok=target_ok, note=note))
    if B.ensure_tool("rclone", "rclone"):
        conf = work.join("rclone-resume.conf")
        open(conf, "w").close()
        rclone = ["rclone", "copy", "--config", conf, "--webdav-url", nginx.url("/dav/rs-rc/"), folder, ":webdav:"]
        try:
            rclone_mib = peer("rclone copy", rclone, "/dav/rs-rc/", "rs-rc")
        except B.BenchFailure as err:
            B.log(f"upload resume: rclone: {err}")
            rclone_mib = None
        rows.append(B.Row("upload", case, "MiB", outbox_mib, "rclone copy, killed and run again (MiB re-sent)", rclone_mib))
    outbox_text = "failed" if outbox_mib is None else f"{outbox_mib:.1f} MiB"
    B.log(f"upload resume: re-sent: outbox {outbox_text} (parts sent twice: {', '.join(twice) or 'none'}), "
          f"curl {curl_mib:.1f} MiB")
    shutil.rmtree(folder, ignore_errors=True)
    return rows


def main():
    if not B.ensure_tool("curl", "curl"):
        raise B.BenchFailure("curl is missing")
    B.ensure_tool(B.DAV_EXT_MODULE, "libnginx-mod-http-dav-ext")  # PROPFIND, which rclone needs
    rows = []
    with B.WorkDir("upload") as work, B.WorkDir("upload-sink", base=SINK_BASE) as sink:
        with B.Nginx(work.join("nginx"), dav_root=sink.path) as nginx:
            cases = os.environ.get("UPLOAD_CASES", "many,big,resume").split(",")
            for part in [p for p in (many_files, small_files, big_file, resume_after_kill)
                         if p.__name__.split("_")[0] in cases]:
                try:
                    rows += part(work, nginx, sink.path)
                except B.BenchFailure as err:
                    B.log(f"upload: {part.__name__}: {err}")
                    rows.append(B.Row("upload", part.__name__, "MiB/s", None, "-", None, note=str(err)[:200]))
    B.emit(rows)


if __name__ == "__main__":
    main()
