"""Checks lib/s3sigv4.py against botocore's own signer, for fixed times and awkward keys.

Exits 0 when every signature matches, 1 otherwise; 2 when botocore is missing (it comes
with moto, which the end-to-end test needs anyway).
"""

import datetime
import os
import sys
import urllib.parse
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import s3sigv4  # noqa: E402

try:
    import botocore.auth
    import botocore.awsrequest
    import botocore.credentials
except ImportError:
    print("check_sigv4: botocore is not installed", file=sys.stderr)
    sys.exit(2)

NOW = datetime.datetime(2026, 11, 29, 8, 30, 15, tzinfo=datetime.timezone.utc)
CASES = [
    ("PUT", "migration", "plain.bin", {"partNumber": "3", "uploadId": "abc/def+ghi=="}),
    ("PUT", "migration", "folder with spaces/ünïcode & more+plus.txt", {"partNumber": "1", "uploadId": "x"}),
    ("GET", "migration", "a/b/c~tilde(1).bin", {}),
    ("POST", "migration", "dir/file.bin", {"uploads": ""}),
]


def botocore_presign(method, url, region, credentials, expires):
    request = botocore.awsrequest.AWSRequest(method=method, url=url)
    with mock.patch("botocore.auth.get_current_datetime", return_value=NOW.replace(tzinfo=None)):
        botocore.auth.S3SigV4QueryAuth(credentials, "s3", region, expires=expires).add_auth(request)
    return request.url


def botocore_headers(method, url, region, credentials, body):
    request = botocore.awsrequest.AWSRequest(method=method, url=url, data=body)
    request.context["payload_signing_enabled"] = True
    with mock.patch("botocore.auth.get_current_datetime", return_value=NOW.replace(tzinfo=None)):
        botocore.auth.S3SigV4Auth(credentials, "s3", region).add_auth(request)
    return request.headers["Authorization"]


def signature(url):
    return urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["X-Amz-Signature"][0]


def main():
    failures = 0
    for endpoint in ("http://127.0.0.1:4566", None):
        for token in (None, "session/token+value"):
            ours = s3sigv4.S3("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "eu-west-3", endpoint, token)
            credentials = botocore.credentials.Credentials(ours.access_key, ours.secret_key, token)
            for method, bucket, key, params in CASES:
                presigned = ours.presign(method, bucket, key, params, expires=3600, now=NOW)
                unsigned = presigned.split("&X-Amz-Signature=")[0]
                base = unsigned.split("?")[0]
                theirs = botocore_presign(method, base + ("?" + ours._canonical_query(params) if params else ""),
                                          ours.region, credentials, 3600)
                if signature(presigned) != signature(theirs):
                    failures += 1
                    print(f"presign mismatch: {method} {key} endpoint={endpoint} token={token}\n ours:   {presigned}\n theirs: {theirs}")
                body = b"<CompleteMultipartUpload></CompleteMultipartUpload>" if method == "POST" else b""
                url, headers = ours.signed_headers(method, bucket, key, params, body, now=NOW)
                theirs_auth = botocore_headers(method, url, ours.region, credentials, body)
                if headers["Authorization"] != theirs_auth:
                    failures += 1
                    print(f"header mismatch: {method} {key} endpoint={endpoint}\n ours:   {headers['Authorization']}\n theirs: {theirs_auth}")
    print(f"check_sigv4: {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
