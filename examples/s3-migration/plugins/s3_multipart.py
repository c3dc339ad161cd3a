"""outbox request_command: turns one file into an S3 upload the runner can send.

stdin:  {"vars": {"path": ..., "bucket"?: ..., "key"?: ..., "prefix"?: ..., "relative_path"?: ...},
         "entry": {"id": ...}}
stdout: a request descriptor (docs/definitions.md, request_command): the fields of `request`, plus `expires_in`.

A file of at least PART_MIN bytes becomes a multipart upload: this plugin creates it and
presigns one PUT URL per part of `outbox chunk-plan`, so the runner never holds credentials
for the data path. A smaller file is one presigned PutObject. The file is sent by reference
(read in place, checked unchanged before each part), which suits a migration of a tree that
stays where it is.

What the on_success hook needs later (the upload id) is kept in STATE_DIR/<entry id>.json.
A same-id enqueue of the same file gets the same descriptor back from that file, so it
resumes the upload: parts already accepted are never sent again. After the hook completed
the upload the file stays, marked completed, while outbox still holds the entry (its
outcome not yet acknowledged: a runner killed after the hook's complete), so an enqueue
then changes nothing either; once outbox has let the entry go, an enqueue starts afresh.
"""

import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import s3sigv4  # noqa: E402
import state  # noqa: E402

PART_MIN = os.environ.get("S3_PART_MIN", "8MiB")
PART_MAX = os.environ.get("S3_PART_MAX", "20MiB")
# Presigned URLs live at most 7 days; the entry gives up a day before they stop working.
URL_SECONDS = 7 * 24 * 3600
EXPIRES_IN = "6d"


def fail(message):
    print(f"s3_multipart: {message}", file=sys.stderr)
    sys.exit(1)


def outbox(*arguments):
    """Runs the outbox binary (OUTBOX_BIN, else `outbox` on PATH) in the project root."""
    binary = os.environ.get("OUTBOX_BIN") or shutil.which("outbox")
    if not binary:
        fail("cannot find the outbox binary (put it on PATH or set OUTBOX_BIN)")
    return subprocess.run([binary, *arguments], capture_output=True, text=True)


def chunk_plan(size):
    """The parts outbox itself would cut (docs/definitions.md, parts), from `outbox chunk-plan`."""
    answer = outbox("chunk-plan", str(size), "--min", PART_MIN, "--max", PART_MAX, "--json")
    if answer.returncode != 0:
        fail(f"outbox chunk-plan failed: {answer.stderr.strip()}")
    return json.loads(answer.stdout)


def outbox_holds(entry_id):
    """Whether the queue still has this entry (`outbox show` exits 65, E_INVALID, once it is gone)."""
    answer = outbox("show", entry_id, "--json")
    if answer.returncode == 0:
        return True
    if answer.returncode == 65 and '"E_INVALID"' in answer.stdout:
        return False
    fail(f"outbox show {entry_id} failed: {answer.stderr.strip() or answer.stdout.strip()}")


def size_in_bytes(text):
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, factor in sorted(units.items(), key=lambda u: -len(u[0])):
        if text.endswith(unit):
            return int(text[: -len(unit)].strip()) * factor
    return int(text)


def main():
    request = json.load(sys.stdin)
    variables = request.get("vars") or {}
    entry_id = request["entry"]["id"]
    try:
        # Plugins run in the project root; a relative path means the enqueue's folder.
        path, bucket, key = state.target(variables)
    except ValueError as error:
        fail(str(error))

    try:
        info = os.stat(path)
    except OSError as error:
        fail(f"cannot read {path}: {error.strerror}")

    saved = state.load(entry_id)
    same_file = saved and saved["bucket"] == bucket and saved["key"] == key and saved["path"] == path \
        and saved["size"] == info.st_size and saved["mtime_ns"] == info.st_mtime_ns
    if same_file and saved.get("completed"):
        if outbox_holds(entry_id):
            # Completed, its outcome not yet acknowledged: the same descriptor, so outbox
            # keeps the entry as it is (a new upload would send every part again).
            print(json.dumps(saved["descriptor"]))
            return
        # outbox let the entry go: this enqueue asks for the file again.
        state.remove(entry_id)
        saved = None
    if same_file and saved and time.time() - saved["created"] < 5 * 24 * 3600:
        # Same file, same id: the same descriptor, so outbox sees the same body and resumes.
        print(json.dumps(saved["descriptor"]))
        return
    if saved and saved.get("upload_id") and not saved.get("completed"):
        # A different file or target under this id: the old upload is abandoned.
        try:
            s3sigv4.S3.from_environment().abort_multipart_upload(saved["bucket"], saved["key"], saved["upload_id"])
        except s3sigv4.S3Error:
            pass

    s3 = s3sigv4.S3.from_environment()
    descriptor = {"method": "PUT", "file": path, "ownership": "reference", "expires_in": EXPIRES_IN}
    upload_id = None
    if info.st_size < size_in_bytes(PART_MIN):
        descriptor["url"] = s3.presign("PUT", bucket, key, expires=URL_SECONDS)
    else:
        try:
            upload_id = s3.create_multipart_upload(bucket, key)
        except (s3sigv4.S3Error, OSError) as error:
            fail(f"cannot start the upload of s3://{bucket}/{key}: {error}")
        descriptor["parts"] = [
            {"url": s3.presign("PUT", bucket, key, {"partNumber": str(n + 1), "uploadId": upload_id}, expires=URL_SECONDS),
             "range": {"start": r["start"], "end": r["end"]}}
            for n, r in enumerate(chunk_plan(info.st_size))
        ]
    state.save(entry_id, {"bucket": bucket, "key": key, "path": path, "size": info.st_size, "mtime_ns": info.st_mtime_ns,
                          "upload_id": upload_id, "created": time.time(), "descriptor": descriptor})
    print(json.dumps(descriptor))


if __name__ == "__main__":
    main()
