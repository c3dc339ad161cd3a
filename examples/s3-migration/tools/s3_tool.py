"""Small S3 helper for the example and its test.

  python3 tools/s3_tool.py mb BUCKET            create a bucket
  python3 tools/s3_tool.py sha256 BUCKET KEY    print "SHA256 SIZE ETAG" of an object, streamed
"""

import hashlib
import os
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import s3sigv4  # noqa: E402


def main(argv):
    s3 = s3sigv4.S3.from_environment()
    if len(argv) == 2 and argv[0] == "mb":
        s3.create_bucket(argv[1])
        return 0
    if len(argv) == 3 and argv[0] == "sha256":
        digest = hashlib.sha256()
        size = 0
        with urllib.request.urlopen(s3.presign("GET", argv[1], argv[2], expires=600), timeout=300) as response:
            etag = response.headers.get("ETag", "")
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        print(digest.hexdigest(), size, etag)
        return 0
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
