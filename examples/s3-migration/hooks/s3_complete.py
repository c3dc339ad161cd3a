"""outbox on_success hook: completes the S3 multipart upload with the parts' ETags.

stdin: the outcome (docs/hooks-and-events.md), with `parts: [{index, status, headers: {etag}}]` for a
multipart upload. Exit 0 acknowledges it; any other exit makes outbox deliver it again
later, so this hook is idempotent: an upload it completed before (a runner killed before
the hook's exit 0 was recorded) is marked completed in its state, or recognised by the
object being there with the expected size.
"""

import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import s3sigv4  # noqa: E402
import state  # noqa: E402


def multipart_etag(etags):
    """S3's ETag of an object made of parts: MD5 of the parts' binary MD5s, then -<count>."""
    digest = hashlib.md5()
    for _, etag in etags:
        digest.update(bytes.fromhex(etag.strip('"')))
    return f'"{digest.hexdigest()}-{len(etags)}"'


def is_object_of(head, etags, size):
    """Whether an object's headers say it is the one these parts complete."""
    if int(head.get("content-length", -1)) != size:
        return False
    etag = head.get("etag", "")
    try:
        return etag == multipart_etag(etags)
    except ValueError:
        # ETags that are not MD5s (SSE-KMS): the part count and the size must do.
        return etag.strip('"').endswith(f"-{len(etags)}")


def main():
    outcome = json.load(sys.stdin)
    entry_id = outcome["id"]
    parts = outcome.get("parts")
    if not parts:
        # A small file went up as one PutObject: nothing to complete.
        state.remove(entry_id)
        return 0
    ordered = sorted(parts, key=lambda p: p["index"])
    etags = [(p["index"] + 1, (p.get("headers") or {}).get("etag")) for p in ordered]
    missing = [number for number, etag in etags if not etag]
    if missing:
        print(f"s3_complete: parts {missing} of entry {entry_id} came back without an ETag", file=sys.stderr)
        return 1
    s3 = s3sigv4.S3.from_environment()
    saved = state.load(entry_id)
    if saved and saved.get("completed"):
        print(f"s3_complete: s3://{saved['bucket']}/{saved['key']} was already complete", file=sys.stderr)
        return 0
    if not saved or not saved.get("upload_id"):
        # The state goes only after a complete that worked: an earlier delivery did it and
        # was stopped before it could exit 0. Check that the object is the one the parts make.
        _, bucket, key = state.target(outcome.get("vars") or {})
        head = s3.head_object(bucket, key)
        if head and is_object_of(head, etags, int(head.get("content-length", -1))):
            print(f"s3_complete: s3://{bucket}/{key} was already complete", file=sys.stderr)
            return 0
        print(f"s3_complete: no upload state for {entry_id} in {state.folder()}, and s3://{bucket}/{key} "
              f"is not the object of these parts", file=sys.stderr)
        return 1
    bucket, key, upload_id = saved["bucket"], saved["key"], saved["upload_id"]
    done = "complete"
    try:
        s3.complete_multipart_upload(bucket, key, upload_id, etags)
    except s3sigv4.S3Error as error:
        # Completed by an earlier delivery that was stopped before it could mark the state:
        # the upload is gone (NoSuchUpload, or InvalidPart on some servers) and the object
        # is the one its parts make.
        head = s3.head_object(bucket, key) if error.status in (400, 404) else None
        if not head or not is_object_of(head, etags, saved["size"]):
            print(f"s3_complete: s3://{bucket}/{key}: {error}", file=sys.stderr)
            return 1
        done = "was already complete"
    # Kept, marked: an enqueue of this id before outbox records this exit gets the same
    # descriptor back, not a second upload (the plugin drops the state once the entry is gone).
    saved["completed"] = True
    state.save(entry_id, saved)
    print(f"s3_complete: s3://{bucket}/{key} {done} ({len(etags)} parts, {saved['size']} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
