#!/usr/bin/env python3
"""Test helper for outbox's s3 requests, run with the test venv's python.

  s3_check.py mb ENDPOINT BUCKET          create a bucket (moto)
  s3_check.py head ENDPOINT BUCKET KEY    print the object's SHA-256 checksum (as S3 keeps it) and ETag
  s3_check.py get ENDPOINT BUCKET KEY [KEY_ID SECRET]
                                          print the object's SHA-256, size, Content-Type, storage class, ETag
  s3_check.py user ENDPOINT BUCKET        on a moto that checks signatures: make a user allowed
                                          everything and the bucket, print the user's key id and secret
  s3_check.py verify RECORD.json          recompute a recorded request's SigV4 Authorization
                                          with botocore's signer; exit 1 when it differs
"""
import hashlib
import json
import sys
from urllib.parse import quote, unquote, urlsplit


def client(endpoint, key_id="testing", secret="testing", service="s3"):
    import boto3

    return boto3.client(
        service, endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=key_id, aws_secret_access_key=secret,
    )


def user(endpoint, bucket):
    iam = client(endpoint, service="iam")
    iam.create_user(UserName="outbox")
    key = iam.create_access_key(UserName="outbox")["AccessKey"]
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="outbox", PolicyName="all", PolicyDocument=json.dumps(policy))
    client(endpoint, key["AccessKeyId"], key["SecretAccessKey"]).create_bucket(Bucket=bucket)
    print(key["AccessKeyId"], key["SecretAccessKey"])


def verify(record):
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest, HTTPHeaders
    from botocore.credentials import Credentials

    headers = {}
    for name, value in record["headers"]:
        headers[name.lower()] = value
    received = headers["authorization"]
    fields = dict(part.strip().split("=", 1) for part in received[len("AWS4-HMAC-SHA256 "):].split(","))
    signed = fields["SignedHeaders"].split(";")
    target = urlsplit(record["target"])
    # S3 canonicalises the decoded key itself: a path sent in another encoding would not match.
    path = quote(unquote(target.path), safe="/~")
    url = "http://" + headers["host"] + path + ("?" + target.query if target.query else "")
    request = AWSRequest(method=record["method"], url=url, headers={n: headers[n] for n in signed if n in headers})
    request.context["timestamp"] = headers["x-amz-date"]

    class ReceivedHeaders(S3SigV4Auth):
        """Signs the headers the request names, with the values the server received."""

        def headers_to_sign(self, request):
            out = HTTPHeaders()
            for name in signed:
                if name not in headers:
                    raise SystemExit(f"signed header {name} was not received")
                out[name] = headers[name]
            return out

    credentials = Credentials(record["access_key"], record["secret_key"], record.get("token"))
    auth = ReceivedHeaders(credentials, "s3", record["region"])
    canonical = auth.canonical_request(request)
    signature = auth.signature(auth.string_to_sign(request, canonical), request)
    expected = ", ".join([
        "AWS4-HMAC-SHA256 Credential=" + auth.scope(request),
        "SignedHeaders=" + auth.signed_headers(auth.headers_to_sign(request)),
        "Signature=" + signature,
    ])
    if expected != received:
        print("mismatch\nexpected: " + expected + "\nreceived: " + received + "\ncanonical request:\n" + canonical)
        return 1
    print("match: " + fields["SignedHeaders"])
    return 0


def main(argv):
    if argv[1] == "mb":
        client(argv[2]).create_bucket(Bucket=argv[3])
        return 0
    if argv[1] == "user":
        user(argv[2], argv[3])
        return 0
    if argv[1] == "get":
        answer = client(argv[2], *argv[5:7]).get_object(Bucket=argv[3], Key=argv[4])
        body = answer["Body"].read()
        print(
            hashlib.sha256(body).hexdigest(), len(body), answer.get("ContentType", ""),
            answer.get("StorageClass", "STANDARD"), answer.get("ETag", ""),
        )
        return 0
    if argv[1] == "head":
        answer = client(argv[2]).head_object(Bucket=argv[3], Key=argv[4], ChecksumMode="ENABLED")
        print(answer.get("ChecksumSHA256", ""), answer.get("ETag", ""))
        return 0
    if argv[1] == "verify":
        with open(argv[2]) as record:
            return verify(json.load(record))
    print(__doc__)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv))
