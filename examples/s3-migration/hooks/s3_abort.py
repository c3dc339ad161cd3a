"""outbox on_error hook: aborts the S3 multipart upload of an entry that failed.

Without it, the parts already uploaded would stay in the bucket (and be billed) until a
lifecycle rule cleans incomplete uploads. An upload that is already gone is fine.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import s3sigv4  # noqa: E402
import state  # noqa: E402


def main():
    outcome = json.load(sys.stdin)
    entry_id = outcome["id"]
    error = outcome.get("error") or {}
    saved = state.load(entry_id)
    if saved and saved.get("upload_id"):
        try:
            s3sigv4.S3.from_environment().abort_multipart_upload(saved["bucket"], saved["key"], saved["upload_id"])
        except s3sigv4.S3Error as failure:
            if failure.code != "NoSuchUpload":
                print(f"s3_abort: s3://{saved['bucket']}/{saved['key']}: {failure}", file=sys.stderr)
                return 1
    state.remove(entry_id)
    where = f"s3://{saved['bucket']}/{saved['key']}" if saved else entry_id
    print(f"s3_abort: {where} not uploaded ({error.get('kind')}: {error.get('message')})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
