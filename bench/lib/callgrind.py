"""Instructions per request, outbox against curl, counted by callgrind (the same every run,
unlike wall time on a shared VM).

Cases: `post` (CG_POSTS small JSON POSTs, default 5,000, to nginx's `return 204`) and
`small` (CG_FILES files of 4 KiB, default 2,000, PUT to nginx's WebDAV sink), 16 in
flight. outbox: `run --drain` of entries enqueued first (the `small` case also counts the
`enqueue --from`, which curl has no share of); curl: `curl --parallel --parallel-max 16 -K
FILE` of the same requests. Both run under `valgrind --tool=callgrind`, all threads in one
count; user-space instructions only (callgrind does not see the kernel).

valgrind cannot read the DWARF of a Swift release build, so the binary is copied without
its debug sections (`objcopy --strip-debug`); function names come from the symbol table.
Environment: OUTBOX, CG_CASES ("post,small"), CG_POSTS, CG_FILES, CG_TOP (functions
listed, default 25), CG_KEEP=1 keeps the callgrind.out files (in bench/out), CG_CURL=0
leaves curl out of the post case (say for outbox alone at 50,000 entries).
"""

import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as B  # noqa: E402
import post as P  # noqa: E402

POSTS = int(os.environ.get("CG_POSTS", "5000"))
FILES = int(os.environ.get("CG_FILES", "2000"))
TOP = int(os.environ.get("CG_TOP", "25"))
SMALL_SIZE = 4096


def stripped_binary(work):
    """The outbox binary without its DWARF, which valgrind 3.19 cannot read."""
    path = work.join("outbox-nodebug")
    subprocess.run(["objcopy", "--strip-debug", B.outbox_binary(), path], check=True)
    return path


def callgrind(argv, out, cwd=None, env=None):
    """Runs argv under callgrind; returns (total user instructions, top functions by self cost)."""
    full = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no", *argv]
    p = subprocess.run(full, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise B.BenchFailure(f"{argv[0]} under callgrind exited {p.returncode}: {p.stderr[-600:]}")
    a = subprocess.run(["callgrind_annotate", "--inclusive=no", f"--threshold=100", out],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True).stdout
    total = None
    top = []
    for line in a.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+\(?[\d.%)]*\s*PROGRAM TOTALS", line)
        if m:
            total = int(m.group(1).replace(",", ""))
            continue
        m = re.match(r"^\s*([\d,]+)\s+(?:\([\s\d.]+%\)\s+)?(\S.*?)\s*$", line)
        if m and total is not None and len(top) < TOP and ":" in m.group(2):
            top.append((int(m.group(1).replace(",", "")), m.group(2)))
    if total is None:
        raise B.BenchFailure(f"no PROGRAM TOTALS in callgrind_annotate's output for {argv[0]}")
    return total, top


def report(case, count, contenders):
    print(f"== callgrind: {case}, {count:,} requests")
    for name, total, _ in contenders:
        print(f"{name:<44} {total / 1e6:>10,.1f} M instructions  {total / count:>10,.0f} per request")
    if len(contenders) >= 2:
        print(f"ratio (outbox / curl, per request): {contenders[0][1] / contenders[-1][1]:.2f}")
    for name, total, top in contenders:
        print(f"-- {name}: top {len(top)} functions by own instructions (share of its total)")
        for ir, fn in top:
            short = fn.split(":", 1)[1] if fn.startswith("???:") else fn
            print(f"   {ir / count:>8,.0f}/req {100 * ir / total:5.1f}%  {short[:150]}")
    print()


def post_case(work, nginx, binary):
    url = nginx.url("/x")
    lines = B.write_jsonl(work.join("posts.jsonl"), POSTS, lambda i: {"vars": {"n": i}})
    config = P.curl_config(work.join("curl.conf"), url, POSTS)
    project = P.project_for(work, "cg-post", url)
    project.binary = binary
    B.must(project.run("enqueue", "bench.post", "--from", lines), "outbox enqueue --from")
    before = nginx.requests_logged()
    o = callgrind([binary, "run", "--drain"], work.join("callgrind.out.outbox-post"), cwd=project.root)
    if nginx.status_counts(before).get("204") != POSTS:
        raise B.BenchFailure("outbox under callgrind did not send every POST")
    if os.environ.get("CG_CURL", "1") == "0":
        report("post", POSTS, [("outbox run --drain", *o)])
        return
    before = nginx.requests_logged()
    c = callgrind(P.curl_argv(config), work.join("callgrind.out.curl-post"))
    if nginx.status_counts(before).get("204") != POSTS:
        raise B.BenchFailure("curl under callgrind did not send every POST")
    report("post", POSTS, [("outbox run --drain", *o), ("curl --parallel --parallel-max 16", *c)])


def small_case(work, nginx, binary, dav):
    src = work.join("small")
    os.makedirs(src)
    names = [f"f{i:05d}.bin" for i in range(FILES)]
    for i, name in enumerate(names):
        with open(os.path.join(src, name), "wb") as fh:
            fh.write(f"{i:09d}".encode() + os.urandom(SMALL_SIZE - 9))
    lines = B.write_jsonl(work.join("small.jsonl"), FILES,
                          lambda i: {"vars": {"path": os.path.join(src, names[i]), "name": names[i]}})
    config = work.join("curl-small.conf")
    with open(config, "w") as fh:
        for i, name in enumerate(names):
            fh.write(f'upload-file = "{os.path.join(src, name)}"\nurl = "{nginx.url("/dav/cu/" + name)}"\n'
                     f'output = "/dev/null"\n')
            if i + 1 < len(names):
                fh.write("next\n")
    project = B.Project(work.join("cg-small"), "concurrency: 16\nper_host: 16\n", binary=binary)
    project.write("definitions/put.yaml", f"""key: bench.put
request:
  method: PUT
  url: "{nginx.url('/dav/ob/')}{{{{ vars.name }}}}"
  file: "{{{{ vars.path }}}}"
  ownership: reference
""")
    e = callgrind([binary, "enqueue", "bench.put", "--from", lines], work.join("callgrind.out.outbox-enqueue"),
                  cwd=project.root)
    o = callgrind([binary, "run", "--drain"], work.join("callgrind.out.outbox-small"), cwd=project.root)
    got = len(os.listdir(os.path.join(dav, "dav", "ob")))
    c = callgrind(["curl", "--parallel", "--parallel-max", "16", "-s", "-S", "-K", config],
                  work.join("callgrind.out.curl-small"))
    got_curl = len(os.listdir(os.path.join(dav, "dav", "cu")))
    if got != FILES or got_curl != FILES:
        raise B.BenchFailure(f"the sink holds {got} files from outbox and {got_curl} from curl, expected {FILES} each")
    report(f"small files ({SMALL_SIZE // 1024} KiB PUTs)", FILES,
           [("outbox enqueue --from + run --drain", e[0] + o[0], o[1]), ("  of which enqueue --from", *e),
            ("curl --parallel --parallel-max 16 -T", *c)])


def main():
    if not shutil.which("valgrind"):
        raise B.BenchFailure("valgrind is missing (apt-get install valgrind)")
    cases = os.environ.get("CG_CASES", "post,small").split(",")
    with B.WorkDir("callgrind") as work, B.WorkDir("callgrind-sink", base="/dev/shm") as sink:
        binary = stripped_binary(work)
        try:
            with B.Nginx(work.join("nginx"), dav_root=sink.path) as nginx:
                if "post" in cases:
                    post_case(work, nginx, binary)
                if "small" in cases:
                    small_case(work, nginx, binary, sink.path)
        finally:
            keep_profiles(work)


def keep_profiles(work):
    """With CG_KEEP=1, copies the callgrind.out files to bench/out (for callgrind_annotate)."""
    if os.environ.get("CG_KEEP") == "1":
        keep = os.path.join(B.BENCH_DIR, "out")
        os.makedirs(keep, exist_ok=True)
        for f in os.listdir(work.path):
            if f.startswith("callgrind.out."):
                shutil.copy(work.join(f), keep)
        B.log(f"callgrind: profiles copied to {keep}")


if __name__ == "__main__":
    main()
