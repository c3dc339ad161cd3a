"""Uploads to S3 (moto's server on 127.0.0.1), outbox's `s3` request kind against the AWS CLI.

1. FILE_COUNT files of 1 MiB (default 1,000): `outbox enqueue --from-dir` + `run --drain`
   (one signed PutObject per file), vs `aws s3 cp --recursive` and `rclone copy` to an
   `:s3:` remote configured by flags (rclone bounded by RCLONE_TIMEOUT and shown, not judged).
2. One BIG_SIZE file (default 1 GiB): outbox's multipart upload vs `aws s3 cp`.

Every contender writes the same bytes with 10 requests in flight (the AWS CLI's default
`max_concurrent_requests`) and multipart parts of 8 MiB (its default chunk size); after each
one the bucket is listed (object count and bytes must match the source) and emptied.
outbox's time includes its enqueue, which computes every object's SHA-256 (the AWS CLI
computes a CRC32 as it sends). moto is a Python server: its CPU time per contender is
printed, as it is often the bottleneck.
Environment: FILE_COUNT (1000), BIG_SIZE (bytes, 1 GiB), ROUNDS (rounds of case 1, 3),
BIG_ROUNDS (rounds of case 2, 3), RCLONE_ROUNDS (rounds of case 1 with rclone, 1),
RCLONE_TIMEOUT (seconds, 300), S3_PYTHON (a python with moto[server] and boto3; default the
test venv `.build/venv`), S3_CASES (default "many,big"), BENCH_TMP (source files, /tmp).
"""

import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as B  # noqa: E402
from upload import make_file  # noqa: E402

MIB = 1 << 20
FILE_COUNT = int(os.environ.get("FILE_COUNT", "1000"))
BIG_SIZE = int(os.environ.get("BIG_SIZE", str(1024 * MIB)))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
BIG_ROUNDS = int(os.environ.get("BIG_ROUNDS", "3"))
RCLONE_ROUNDS = int(os.environ.get("RCLONE_ROUNDS", "1"))
RCLONE_TIMEOUT = int(os.environ.get("RCLONE_TIMEOUT", "300"))
IN_FLIGHT = 10
PART_MIB = 8
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

# Run by S3_PYTHON: lists and empties a bucket, or makes one.
BUCKET_TOOL = r"""
import sys, boto3
endpoint, action, bucket = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id="testing", aws_secret_access_key="testing")
if action == "mb":
    s3.create_bucket(Bucket=bucket)
    sys.exit(0)
objects, size, keys = 0, 0, []
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
    for o in page.get("Contents", []):
        objects += 1
        size += o["Size"]
        keys.append({"Key": o["Key"]})
print(objects, size)
if action == "empty":
    for i in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": keys[i:i + 1000], "Quiet": True})
"""


def s3_python():
    explicit = os.environ.get("S3_PYTHON")
    if explicit:
        return explicit
    venv = os.path.join(B.ROOT, ".build", "venv", "bin", "python")
    return venv if os.path.exists(venv) else "python3"


class Moto:
    """moto's S3 server on a free loopback port, and its CPU time so far."""

    def __init__(self, folder):
        self.folder = folder
        self.port = B.free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self):
        log = open(os.path.join(self.folder, "moto.log"), "wb")
        self.proc = subprocess.Popen([s3_python(), "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise B.BenchFailure(f"moto exited {self.proc.returncode}; see {self.folder}/moto.log")
            try:
                import urllib.request
                urllib.request.urlopen(self.endpoint + "/", timeout=1).read()
                return self
            except OSError:
                time.sleep(0.1)
        raise B.BenchFailure("moto did not answer within 60 s")

    def cpu_seconds(self):
        with open(f"/proc/{self.proc.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def bucket(self, action, bucket):
        r = subprocess.run([s3_python(), "-c", BUCKET_TOOL, self.endpoint, action, bucket],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise B.BenchFailure(f"bucket {action} {bucket}: {r.stderr[-400:]}")
        return tuple(int(x) for x in r.stdout.split()) if action != "mb" else None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def env():
    e = B.without_bench_settings(os.environ)
    e.update(CREDENTIALS)
    # The endpoint is plain http; rclone 1.60 fails on any AWS_CA_BUNDLE ("unsupported transport").
    e.pop("AWS_CA_BUNDLE", None)
    return e


class Contender:
    """One way of uploading a folder; `play` times it, checks the bucket and empties it."""

    def __init__(self, name, moto, bucket, expected):
        self.name = name
        self.moto = moto
        self.bucket = bucket
        self.expected = expected
        self.walls = []
        self.rss = []
        self.moto_cpu = []
        self.enqueue_walls = []
        self.failed = None
        moto.bucket("mb", bucket)

    def play(self, upload):
        if self.failed:
            return
        os.sync()
        cpu = self.moto.cpu_seconds()
        try:
            wall, rss = upload()
            got = self.moto.bucket("empty", self.bucket)
            if got != self.expected:
                raise B.BenchFailure(f"the bucket holds {got[0]} objects of {got[1]} bytes, expected {self.expected}")
        except B.BenchFailure as err:
            B.log(f"s3: {self.name}: failed: {err}")
            self.failed = str(err)[:160]
            self.moto.bucket("empty", self.bucket)
            return
        self.walls.append(wall)
        self.moto_cpu.append(self.moto.cpu_seconds() - cpu)
        if rss:
            self.rss.append(rss)
        B.log(f"s3: {self.name}: {wall:.2f} s (moto CPU {self.moto_cpu[-1]:.1f} s)")

    def median(self):
        return None if self.failed or not self.walls else B.median(self.walls)

    def note(self):
        if self.failed:
            return f"{self.name}: failed: {self.failed}"
        enqueue = f" (enqueue {B.median(self.enqueue_walls):.2f} s)" if self.enqueue_walls else ""
        return (f"{self.name}: rounds {', '.join(f'{w:.2f}' for w in self.walls)} s{enqueue}, "
                f"moto CPU {B.median(self.moto_cpu):.1f} s")


def outbox_project(work, name, moto, bucket):
    config = f"concurrency: {IN_FLIGHT}\nper_host: {IN_FLIGHT}\npart_concurrency: {IN_FLIGHT}\n"
    project = B.Project(work.join(name), config)
    project.write("definitions/s3.yaml", f"""key: bench.s3
request:
  s3:
    bucket: {bucket}
    key: "{{{{ vars.relative_path }}}}"
    region: us-east-1
    endpoint: "{moto.endpoint}"
    multipart_threshold: {PART_MIB}MiB
    part_size: {PART_MIB}MiB
  file: "{{{{ vars.path }}}}"
  ownership: reference
""")
    return project


def outbox_upload(project, source, contender):
    """`enqueue --from-dir` + `run --drain`: (wall seconds of both, peak RSS of the larger)."""
    def upload():
        e = B.must(project.run("enqueue", "bench.s3", "--from-dir", source), "outbox enqueue")
        contender.enqueue_walls.append(e.wall)
        r = project.run("run", "--drain", "--json", stdout_name="summary.json", timeout=3600)
        B.must(r, "outbox run --drain")
        summary = json.loads(r.stdout() or "{}")
        if summary.get("errors") or summary.get("remaining"):
            raise B.BenchFailure(f"outbox run: {summary}")
        return e.wall + r.wall, max(e.rss_kib or 0, r.rss_kib or 0)
    return upload


def command_upload(argv, what, timeout=3600):
    def upload():
        r = B.measure(argv, env=env(), stderr_path="/tmp/outbox-bench-s3-peer.err", timeout=timeout, rss=False)
        B.must(r, what)
        return r.wall, None
    return upload


def rounds(contenders, count):
    for round_ in range(count):
        for name, play in B.rotated(contenders, round_):
            play()


def many_files(work, moto):
    source = work.join("many")
    os.makedirs(source)
    for i in range(FILE_COUNT):
        make_file(os.path.join(source, f"f{i:05d}.bin"), MIB, i)
    expected = (FILE_COUNT, FILE_COUNT * MIB)
    ob = Contender("outbox", moto, "ob-many", expected)
    aws = Contender("aws s3 cp", moto, "aws-many", expected)
    project = outbox_project(work, "many-project", moto, "ob-many")
    aws_argv = ["aws", "--endpoint-url", moto.endpoint, "s3", "cp", "--recursive", "--only-show-errors", source,
                "s3://aws-many/"]
    contenders = [("outbox", lambda: ob.play(outbox_upload(project, source, ob))),
                  ("aws", lambda: aws.play(command_upload(aws_argv, "aws s3 cp")))]
    rclone = None
    if RCLONE_ROUNDS > 0 and B.ensure_tool("rclone", "rclone"):
        rclone = Contender("rclone copy", moto, "rc-many", expected)
        conf = work.join("rclone.conf")
        open(conf, "w").close()
        rclone_argv = ["rclone", "copy", "--config", conf, "--s3-provider", "Other", "--s3-endpoint", moto.endpoint,
                       "--s3-access-key-id", "testing", "--s3-secret-access-key", "testing", "--s3-region", "us-east-1",
                       "--s3-force-path-style", "--s3-no-check-bucket", "--transfers", str(IN_FLIGHT), source,
                       ":s3:rc-many"]
    for round_ in range(ROUNDS):
        order = B.rotated(contenders, round_)
        for _, play in order:
            play()
        if rclone and round_ < RCLONE_ROUNDS:
            rclone.play(command_upload(rclone_argv, "rclone copy", timeout=RCLONE_TIMEOUT))
    shutil.rmtree(source, ignore_errors=True)
    case = f"{FILE_COUNT:,} files × 1 MiB, {IN_FLIGHT} in flight"
    rss = max(ob.rss) if ob.rss else None
    ratio_ok = None if ob.median() is None or aws.median() is None else ob.median() / aws.median() <= 1.0
    rows = [B.Row("s3", case, "s", ob.median(), "aws s3 cp --recursive", aws.median(), target="≤ 1.0× aws",
                  target_ok=ratio_ok, rss_kib=rss, note=f"{ob.note()}; {aws.note()}")]
    if rclone:
        rows.append(B.Row("s3", case, "s", ob.median(), f"rclone copy --transfers {IN_FLIGHT}", rclone.median(),
                          rss_kib=rss, note=rclone.note()))
    return rows


def big_file(work, moto):
    folder = work.join("big")
    os.makedirs(folder)
    source = os.path.join(folder, "big.bin")
    make_file(source, BIG_SIZE, 7)
    expected = (1, BIG_SIZE)
    ob = Contender("outbox", moto, "ob-big", expected)
    aws = Contender("aws s3 cp", moto, "aws-big", expected)
    project = outbox_project(work, "big-project", moto, "ob-big")
    # The AWS CLI sends no checksum unless asked; outbox sends a SHA-256 with every part,
    # which the server then computes too: the second row has the CLI do the same.
    aws_sha = Contender("aws s3 cp --checksum-algorithm SHA256", moto, "aws-sha-big", expected)
    aws_argv = ["aws", "--endpoint-url", moto.endpoint, "s3", "cp", "--only-show-errors", source, "s3://aws-big/big.bin"]
    aws_sha_argv = ["aws", "--endpoint-url", moto.endpoint, "s3", "cp", "--only-show-errors", "--checksum-algorithm",
                    "SHA256", source, "s3://aws-sha-big/big.bin"]
    contenders = [("outbox", lambda: ob.play(outbox_upload(project, folder, ob))),
                  ("aws", lambda: aws.play(command_upload(aws_argv, "aws s3 cp"))),
                  ("aws-sha", lambda: aws_sha.play(command_upload(aws_sha_argv, "aws s3 cp --checksum-algorithm SHA256")))]
    # moto's first 1 GiB multipart upload costs it about twice the CPU of the next ones (its
    # memory grows): one untimed upload first, so that no contender's first round pays it.
    warm_up = Contender("warm-up, untimed (aws s3 cp)", moto, "warm-up-big", expected)
    warm_up.play(command_upload(aws_argv[:-1] + ["s3://warm-up-big/big.bin"], "aws s3 cp (warm-up)"))
    rounds(contenders, BIG_ROUNDS)
    shutil.rmtree(folder, ignore_errors=True)
    case = f"{BIG_SIZE / MIB:,.0f} MiB file, {PART_MIB} MiB parts × {IN_FLIGHT}"
    ratio_ok = None if ob.median() is None or aws.median() is None else ob.median() / aws.median() <= 1.0
    return [B.Row("s3", case, "s", ob.median(), "aws s3 cp (multipart)", aws.median(), target="≤ 1.0× aws",
                  target_ok=ratio_ok, rss_kib=max(ob.rss) if ob.rss else None, note=f"{ob.note()}; {aws.note()}"),
            B.Row("s3", case, "s", ob.median(), "aws s3 cp --checksum-algorithm SHA256", aws_sha.median(),
                  rss_kib=max(ob.rss) if ob.rss else None, note=aws_sha.note())]


def main():
    if shutil.which("aws") is None:
        B.log("s3: the aws CLI is missing; install it (pip install awscli) and run again")
        sys.exit(2)
    rows = []
    os.environ.update(CREDENTIALS)  # for outbox's runner, which reads them when it signs
    with B.WorkDir("s3") as work, Moto(work.path) as moto:
        B.log(f"s3: moto on {moto.endpoint} ({s3_python()})")
        for part in (many_files, big_file):
            if part.__name__.split("_")[0] not in os.environ.get("S3_CASES", "many,big").split(","):
                continue
            try:
                rows += part(work, moto)
            except B.BenchFailure as err:
                B.log(f"s3: {part.__name__}: {err}")
                rows.append(B.Row("s3", part.__name__, "s", None, "-", None, note=str(err)[:200]))
    B.emit(rows)


if __name__ == "__main__":
    main()
