"""Shared helpers for the outbox benchmarks: processes, peak RSS, nginx, results.

Stdlib only. Every server listens on 127.0.0.1; every loop has a fixed bound.
Peak RSS is GNU time's "Maximum resident set size" (`/usr/bin/time -f %M`).
"""

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCH_DIR)
NGINX = "/usr/sbin/nginx"
DAV_EXT_MODULE = "/usr/lib/nginx/modules/ngx_http_dav_ext_module.so"


def log(message):
    print(message, file=sys.stderr, flush=True)


def outbox_binary():
    """The release build of this checkout (built if missing), or $OUTBOX."""
    explicit = os.environ.get("OUTBOX")
    if explicit:
        return os.path.abspath(explicit)
    path = os.path.join(ROOT, ".build", "release", "outbox")
    if not os.path.exists(path):
        log("bench: building outbox (swift build -c release)...")
        subprocess.run(["swift", "build", "-c", "release", "--product", "outbox"], cwd=ROOT, check=True)
    return path


def python_interpreter():
    """The real interpreter, not a pyenv shim (a shim adds ~30 ms to every start)."""
    return os.path.realpath(sys.executable)


def without_bench_settings(env):
    """`env` without this bench's RCLONE_TIMEOUT and RCLONE_ROUNDS: rclone reads every
    RCLONE_<FLAG> variable as its own flag, and `RCLONE_TIMEOUT=60` failed it at once."""
    return {k: v for k, v in env.items() if k not in ("RCLONE_TIMEOUT", "RCLONE_ROUNDS")}


def ensure_tool(path, apt_package):
    """Installs a Debian package when a tool the benchmark needs is missing."""
    if os.path.exists(path) or shutil.which(path):
        return True
    log(f"bench: {path} is missing; installing {apt_package} with apt-get")
    rc = subprocess.run(["apt-get", "install", "-y", apt_package], stdout=subprocess.DEVNULL).returncode
    if rc != 0:
        subprocess.run(["apt-get", "update"], stdout=subprocess.DEVNULL)
        rc = subprocess.run(["apt-get", "install", "-y", apt_package], stdout=subprocess.DEVNULL).returncode
    return rc == 0 and (os.path.exists(path) or shutil.which(path) is not None)


class Measured:
    """One finished process: wall seconds, peak RSS in KiB, CPU seconds (user + system, its
    threads and children), exit status."""

    def __init__(self, wall, rss_kib, rc, stdout_path, stderr_path, cpu=None):
        self.wall = wall
        self.rss_kib = rss_kib
        self.cpu = cpu
        self.rc = rc
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path

    def stdout(self):
        if not self.stdout_path:
            return ""
        with open(self.stdout_path, errors="replace") as f:
            return f.read()

    def stderr(self):
        if not self.stderr_path:
            return ""
        with open(self.stderr_path, errors="replace") as f:
            return f.read()


TIME = "/usr/bin/time"


def measure(argv, cwd=None, env=None, stdout_path=None, stderr_path=None, stdin_path=None, timeout=600, rss=True):
    """Runs argv to completion: wall time from spawn to reap, and with `rss` its peak RSS and
    CPU seconds.

    Both come from GNU time (`%M`, "Maximum resident set size", and `%U` + `%S`): our own
    wait4 would report this Python process's size, since a vfork child's high-water mark
    carries over exec.
    """
    rss_file = None
    if rss and (os.path.exists(TIME) or ensure_tool(TIME, "time")):
        fd, rss_file = tempfile.mkstemp(prefix="outbox-bench-rss-")
        os.close(fd)
        argv = [TIME, "-f", "%M %U %S", "-o", rss_file, *argv]
    out = open(stdout_path, "wb") if stdout_path else subprocess.DEVNULL
    err = open(stderr_path, "wb") if stderr_path else subprocess.DEVNULL
    inp = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err, stdin=inp)
        # A blocking wait keeps this process off the CPU while the measured one runs.
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        _, status = os.waitpid(proc.pid, 0)
        timer.cancel()
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        for f in (out, err, inp):
            if hasattr(f, "close"):
                f.close()
    rss_kib = cpu = None
    if rss_file:
        try:
            with open(rss_file) as fh:
                # "Command exited with non-zero status N" may come first; the figures are last.
                figures = fh.read().split()[-3:]
            rss_kib, cpu = int(figures[0]), float(figures[1]) + float(figures[2])
        except (OSError, ValueError, IndexError):
            rss_kib = cpu = None
        os.unlink(rss_file)
    return Measured(wall, rss_kib, proc.returncode, stdout_path, stderr_path, cpu)


def must(result, what):
    """Stops the benchmark with the process's stderr when it failed."""
    if result.rc != 0:
        raise BenchFailure(f"{what} exited {result.rc}: {result.stderr()[-800:].strip()}")
    return result


class BenchFailure(Exception):
    pass


def median(values):
    return statistics.median(values)


def rotated(contenders, round_):
    """The contenders of one round, starting with a different one each round: on a VM whose
    speed drifts within seconds, none always runs first or right after the same other one."""
    k = round_ % len(contenders)
    return contenders[k:] + contenders[:k]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkDir:
    """A temp folder for one benchmark, removed at the end unless BENCH_KEEP=1."""

    def __init__(self, name, base=None):
        base = base or os.environ.get("BENCH_TMP") or tempfile.gettempdir()
        os.makedirs(base, exist_ok=True)
        self.path = tempfile.mkdtemp(prefix=f"outbox-bench-{name}-", dir=base)

    def join(self, *parts):
        return os.path.join(self.path, *parts)

    def cleanup(self):
        if os.environ.get("BENCH_KEEP") == "1":
            log(f"bench: kept {self.path}")
            return
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()


def nginx_workers():
    """`worker_processes` of the bench's nginx: Debian's packaged default `auto` (one per
    core), or NGINX_WORKERS (say 1, the setting of the results before 2026-11-30)."""
    return os.environ.get("NGINX_WORKERS", "auto")


def nginx_reuseport():
    """Whether the bench's nginx listens with `reuseport` (NGINX_REUSEPORT, default on): one
    listening socket per worker, so the kernel spreads new connections over the workers.
    Without it, the worker waiting in epoll is woken first for every connection, and all
    of one client's connections opened at once usually land on that worker (see
    bench/README, "Why the sink listens with reuseport")."""
    return os.environ.get("NGINX_REUSEPORT", "on") != "off"


def nginx_line():
    """How the bench's nginx is set up, for the summary line."""
    return f"nginx worker_processes {nginx_workers()}, reuseport {'on' if nginx_reuseport() else 'off'}"


class Nginx:
    """A private nginx on 127.0.0.1: `/x` answers 204; with `dav_root`, `/dav/` is WebDAV."""

    def __init__(self, folder, dav_root=None):
        self.folder = folder
        self.dav_root = dav_root
        self.workers = nginx_workers()
        self.reuseport = nginx_reuseport()
        self.proc = None
        self.port = None
        self.token = f"outbox-bench-{os.getpid()}-{time.monotonic_ns()}"

    def _config(self):
        f = self.folder
        lines = []
        if self.dav_root and os.path.exists(DAV_EXT_MODULE):
            lines.append(f"load_module {DAV_EXT_MODULE};")
        lines += [
            f"worker_processes {self.workers};",
            "daemon off;",
            f"pid {f}/nginx.pid;",
            f"error_log {f}/error.log warn;",
            "events { worker_connections 4096; }",
            "http {",
            f"  access_log {f}/access.log;",
            # Bytes each request brought (request line, headers, and the body as far as it
            # got: a request cut off by a killed client is logged too), and the worker that
            # served it.
            "  log_format bench_bytes '$request_method $uri $status $request_length $pid';",
            f"  access_log {f}/bytes.log bench_bytes;",
            "  keepalive_requests 100000;",
            f"  client_body_temp_path {self.dav_root or f}/.nginx-body;",
            f"  proxy_temp_path {f}/tmp; fastcgi_temp_path {f}/tmp; uwsgi_temp_path {f}/tmp; scgi_temp_path {f}/tmp;",
            "  server {",
            f"    listen 127.0.0.1:{self.port}{' reuseport' if self.reuseport else ''};",
            "    client_max_body_size 0;",
            f"    location = /__bench {{ return 200 \"{self.token}\"; }}",
            "    location /x { return 204; }",
        ]
        if self.dav_root:
            ext = " dav_ext_methods PROPFIND OPTIONS;" if os.path.exists(DAV_EXT_MODULE) else ""
            lines.append(f"    location /dav/ {{ root {self.dav_root}; dav_methods PUT DELETE MKCOL;{ext}"
                         " create_full_put_path on; dav_access user:rw group:rw all:rw; }")
        lines += ["  }", "}"]
        return "\n".join(lines) + "\n"

    def start(self):
        if not os.path.exists(NGINX):
            ensure_tool(NGINX, "nginx-light")
        os.makedirs(self.folder, exist_ok=True)
        os.makedirs(os.path.join(self.folder, "tmp"), exist_ok=True)
        if self.dav_root:
            os.makedirs(os.path.join(self.dav_root, ".nginx-body"), exist_ok=True)
            os.makedirs(os.path.join(self.dav_root, "dav"), exist_ok=True)
            # Workers run as `nobody` when the master is root: let them write the sink.
            for d in (self.dav_root, os.path.join(self.dav_root, ".nginx-body"), os.path.join(self.dav_root, "dav")):
                os.chmod(d, 0o777)
        # A port picked free can be taken before nginx binds it: try a few.
        for _ in range(5):
            self.port = free_port()
            conf = os.path.join(self.folder, "nginx.conf")
            with open(conf, "w") as fh:
                fh.write(self._config())
            errlog = open(os.path.join(self.folder, "stderr.log"), "wb")
            self.proc = subprocess.Popen([NGINX, "-c", conf, "-p", self.folder], stdout=errlog, stderr=errlog)
            errlog.close()
            if self._wait_ready():
                return self
            self.stop()
        raise BenchFailure(f"nginx did not start; see {self.folder}/stderr.log")

    def _wait_ready(self):
        for _ in range(100):
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url("/__bench"), timeout=1) as r:
                    if r.read().decode() == self.token:
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def requests_logged(self):
        """Requests in the access log (the readiness probe included)."""
        try:
            with open(os.path.join(self.folder, "access.log"), "rb") as fh:
                return sum(1 for _ in fh)
        except OSError:
            return 0

    def puts(self, prefix):
        """(uri, status, bytes received, worker pid) of every PUT to a path under `prefix`, in
        log order."""
        found = []
        with open(os.path.join(self.folder, "bytes.log"), "rb") as fh:
            for line in fh:
                fields = line.decode(errors="replace").split()
                if len(fields) == 5 and fields[0] == "PUT" and fields[1].startswith(prefix):
                    found.append((fields[1], fields[2], int(fields[3]), fields[4]))
        return found

    def status_counts(self, since_line=0):
        counts = {}
        with open(os.path.join(self.folder, "access.log"), "rb") as fh:
            for i, line in enumerate(fh):
                if i < since_line:
                    continue
                parts = line.split(b'"')
                if len(parts) >= 3:
                    code = parts[2].split()[0].decode()
                    counts[code] = counts.get(code, 0) + 1
        return counts

    def cpu_seconds(self):
        """CPU seconds (user + system) the workers have used so far: the difference around a
        run is the server's share of the machine during it."""
        if not self.proc:
            return 0.0
        ticks = 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as fh:
                    # After the command's name: state, parent, ... then utime and stime.
                    fields = fh.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == self.proc.pid:
                ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class Project:
    """A scratch outbox project: config/outbox.yaml, definitions/, hooks/."""

    def __init__(self, folder, config_text="", binary=None):
        self.root = folder
        self.binary = binary or outbox_binary()
        for d in ("config", "definitions", "hooks"):
            os.makedirs(os.path.join(folder, d), exist_ok=True)
        self.write("config/outbox.yaml", config_text or "# defaults\n")

    def write(self, relative, text, mode=None):
        path = os.path.join(self.root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)
        if mode is not None:
            os.chmod(path, mode)
        return path

    def argv(self, *args):
        return [self.binary, *args]

    def run(self, *args, stdout_name=None, stdin_path=None, timeout=600, rss=True):
        """Runs `outbox ARGS` in the project root and measures it."""
        tag = f"{time.monotonic_ns()}"
        out = os.path.join(self.root, stdout_name or f".out-{tag}")
        err = os.path.join(self.root, f".err-{tag}")
        return measure(self.argv(*args), cwd=self.root, stdout_path=out, stderr_path=err, stdin_path=stdin_path,
                       timeout=timeout, rss=rss)


class CPUShares:
    """CPU seconds of each contender's rounds, and the server's during them."""

    def __init__(self):
        self.own = {}
        self.server = {}

    def add(self, name, measured, server_seconds):
        self.own.setdefault(name, []).append(sum(m.cpu or 0.0 for m in measured))
        self.server.setdefault(name, []).append(server_seconds)

    def note(self):
        """CPU medians of every contender and of nginx during its rounds, for a row's note;
        and the two together, round by round: client and server share this machine's cores,
        so where both keep the cores busy the times' ratio follows this one."""
        own = ", ".join(f"{n} {median(v):.2f} s" for n, v in self.own.items())
        server = ", ".join(f"{median(v):.2f} s during {n}'s" for n, v in self.server.items())
        both = {n: median([o + s for o, s in zip(self.own[n], self.server[n])]) for n in self.own}
        names = list(both)
        ratio = f" ({both[names[0]] / both[names[1]]:.2f}x)" if len(names) >= 2 and both[names[1]] > 0 else ""
        together = ", ".join(f"{n} {v:.2f} s" for n, v in both.items())
        return f"CPU medians (user + system): {own}; nginx {server}; client and nginx together: {together}{ratio}"


def write_jsonl(path, count, make):
    with open(path, "w") as fh:
        for i in range(count):
            fh.write(json.dumps(make(i), separators=(",", ":")) + "\n")
    return path


# ---- results ----

class Row:
    """One comparison: outbox's figure, the peer's figure from the same run, and the verdict."""

    def __init__(self, bench, case, unit, outbox, peer_name, peer, higher_is_better=False,
                 target=None, target_ok=None, rss_kib=None, rss_target_mib=None, note="", peer_text=None):
        self.bench = bench
        self.case = case
        self.unit = unit
        self.outbox = outbox
        self.peer_name = peer_name
        self.peer = peer
        self.higher_is_better = higher_is_better
        self.target = target
        self.target_ok = target_ok
        self.rss_kib = rss_kib
        self.rss_target_mib = rss_target_mib
        self.note = note
        # Shown instead of "failed" when the peer has no figure (say "timeout").
        self.peer_text = peer_text

    def ratio(self):
        """outbox's cost over the peer's for the same work: > 1 means outbox is slower."""
        if self.outbox is None or self.peer in (None, 0) or self.outbox == 0:
            return None
        return self.peer / self.outbox if self.higher_is_better else self.outbox / self.peer

    def verdict(self):
        checks = []
        if self.target_ok is not None:
            checks.append(self.target_ok)
        if self.rss_target_mib is not None and self.rss_kib is not None:
            checks.append(self.rss_kib / 1024 <= self.rss_target_mib)
        if self.outbox is None:
            return "FAILED"
        if not checks:
            return "-"
        return "ok" if all(checks) else "MISS"

    def as_dict(self):
        return {
            "bench": self.bench, "case": self.case, "unit": self.unit, "outbox": self.outbox,
            "peer_name": self.peer_name, "peer": self.peer, "ratio": self.ratio(),
            "higher_is_better": self.higher_is_better, "target": self.target, "target_ok": self.target_ok,
            "rss_kib": self.rss_kib, "rss_target_mib": self.rss_target_mib, "verdict": self.verdict(),
            "note": self.note, "peer_text": self.peer_text,
        }


def fmt_value(v, unit):
    if v is None:
        return "failed"
    if unit == "ms":
        return f"{v:.1f} ms"
    if unit == "s":
        return f"{v:.2f} s" if v < 100 else f"{v:.0f} s"
    if unit == "/s":
        return f"{v:,.0f}/s"
    if unit == "MiB/s":
        return f"{v:,.0f} MiB/s"
    if unit == "MiB":
        return f"{v:,.1f} MiB"
    return f"{v:.3g} {unit}"


def table(rows):
    """A plain-text table of result dicts."""
    header = ["bench", "case", "outbox", "peer", "peer value", "ratio", "outbox peak RSS", "target", "verdict"]
    body = []
    for r in rows:
        ratio = r["ratio"]
        rss = "-" if r["rss_kib"] is None else f"{r['rss_kib'] / 1024:.1f} MiB"
        if r["rss_target_mib"] is not None and r["rss_kib"] is not None:
            rss += f" (≤ {r['rss_target_mib']} MiB)"
        body.append([
            r["bench"], r["case"], fmt_value(r["outbox"], r["unit"]), r["peer_name"],
            r.get("peer_text") or fmt_value(r["peer"], r["unit"]), "-" if ratio is None else f"{ratio:.2f}x",
            rss, r["target"] or "-", r["verdict"],
        ])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    for b in body:
        lines.append("  ".join(str(x).ljust(w) for x, w in zip(b, widths)))
    return "\n".join(lines)


def emit(rows):
    """Prints the rows as a table and appends them to $BENCH_RESULTS for bench/run.sh."""
    dicts = [r.as_dict() for r in rows]
    print(table(dicts))
    print("ratio = outbox time / peer time for the same work (> 1: outbox is slower).")
    notes = [f"  {r['bench']}/{r['case']}: {r['note']}" for r in dicts if r["note"]]
    if notes:
        print("notes:")
        print("\n".join(notes))
    sys.stdout.flush()
    path = os.environ.get("BENCH_RESULTS")
    if path:
        with open(path, "a") as fh:
            for d in dicts:
                fh.write(json.dumps(d) + "\n")


def machine_line():
    cpus = os.cpu_count()
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpus} cores, {model}".strip(", ")


def clear_folder(path):
    shutil.rmtree(path, ignore_errors=True)
