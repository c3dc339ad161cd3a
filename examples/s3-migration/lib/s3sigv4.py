"""Just enough of Amazon S3 for the migration example, on the Python standard library.

AWS Signature Version 4 (header-signed requests and presigned URLs), and the multipart
upload calls the example needs: create, complete, abort, plus head/put-bucket/get for
checking. Configuration comes from the usual AWS environment variables:

  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (optional)
  AWS_REGION or AWS_DEFAULT_REGION (default us-east-1)
  AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL: an S3-compatible server (path-style URLs);
  without one, AWS S3 itself with virtual-hosted URLs.
"""

import datetime
import hashlib
import hmac
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from xml.sax.saxutils import escape

UNSIGNED = "UNSIGNED-PAYLOAD"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_PRESIGN_SECONDS = 7 * 24 * 3600


class S3Error(Exception):
    """An S3 call answered with an error status or an <Error> document."""

    def __init__(self, status, code, message):
        super().__init__(f"S3 {status} {code}: {message}")
        self.status = status
        self.code = code


def _quote(text, safe="-_.~"):
    # RFC 3986 unreserved characters stay; everything else is %XX of its UTF-8 bytes.
    return urllib.parse.quote(text, safe=safe)


def _hmac(key, text):
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


class S3:
    """An S3 endpoint with credentials; every request it makes is signed."""

    def __init__(self, access_key, secret_key, region="us-east-1", endpoint=None, session_token=None):
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        self.session_token = session_token

    @classmethod
    def from_environment(cls, env=None):
        env = os.environ if env is None else env
        access_key = env.get("AWS_ACCESS_KEY_ID")
        secret_key = env.get("AWS_SECRET_ACCESS_KEY")
        if not access_key or not secret_key:
            raise SystemExit("s3: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        return cls(access_key, secret_key,
                   region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
                   endpoint=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
                   session_token=env.get("AWS_SESSION_TOKEN"))

    # Addressing

    def location(self, bucket, key=""):
        """(scheme://host[:port], host header, canonical path) of an object or bucket."""
        if self.endpoint:
            parsed = urllib.parse.urlsplit(self.endpoint)
            path = "/" + bucket + ("/" + key if key else "")
            return f"{parsed.scheme}://{parsed.netloc}", parsed.netloc, _quote(path, safe="-_.~/")
        host = f"{bucket}.s3.{self.region}.amazonaws.com"
        return f"https://{host}", host, _quote("/" + key, safe="-_.~/")

    # Signing

    def _scope(self, now):
        return f"{now:%Y%m%d}/{self.region}/s3/aws4_request"

    def _signature(self, now, canonical_request):
        string_to_sign = "\n".join([
            "AWS4-HMAC-SHA256", f"{now:%Y%m%dT%H%M%SZ}", self._scope(now),
            hashlib.sha256(canonical_request.encode("utf-8")).hexdigest(),
        ])
        key = _hmac(("AWS4" + self.secret_key).encode("utf-8"), f"{now:%Y%m%d}")
        for part in (self.region, "s3", "aws4_request"):
            key = _hmac(key, part)
        return hmac.new(key, string_to_sign.encode("utf-8"), hashlib.sha256).hexdigest()

    @staticmethod
    def _canonical_query(params):
        pairs = sorted((_quote(str(k)), _quote(str(v))) for k, v in params.items())
        return "&".join(f"{k}={v}" for k, v in pairs)

    def presign(self, method, bucket, key, params=None, expires=3600, now=None):
        """A URL that lets anyone holding it make this one request until it expires."""
        now = now or datetime.datetime.now(datetime.timezone.utc)
        expires = max(1, min(int(expires), MAX_PRESIGN_SECONDS))
        base, host, path = self.location(bucket, key)
        query = dict(params or {})
        query.update({
            "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
            "X-Amz-Credential": f"{self.access_key}/{self._scope(now)}",
            "X-Amz-Date": f"{now:%Y%m%dT%H%M%SZ}",
            "X-Amz-Expires": str(expires),
            "X-Amz-SignedHeaders": "host",
        })
        if self.session_token:
            query["X-Amz-Security-Token"] = self.session_token
        canonical_query = self._canonical_query(query)
        canonical = "\n".join([method, path, canonical_query, f"host:{host}", "", "host", UNSIGNED])
        return f"{base}{path}?{canonical_query}&X-Amz-Signature={self._signature(now, canonical)}"

    def signed_headers(self, method, bucket, key, params=None, body=b"", now=None):
        """(url, headers) for a request signed in its Authorization header."""
        now = now or datetime.datetime.now(datetime.timezone.utc)
        base, host, path = self.location(bucket, key)
        query = self._canonical_query(params or {})
        headers = {
            "host": host,
            "x-amz-content-sha256": hashlib.sha256(body).hexdigest(),
            "x-amz-date": f"{now:%Y%m%dT%H%M%SZ}",
        }
        if self.session_token:
            headers["x-amz-security-token"] = self.session_token
        names = sorted(headers)
        canonical = "\n".join([method, path, query] + [f"{n}:{headers[n]}" for n in names]
                              + ["", ";".join(names), headers["x-amz-content-sha256"]])
        headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={self.access_key}/{self._scope(now)}, "
                                    f"SignedHeaders={';'.join(names)}, Signature={self._signature(now, canonical)}")
        del headers["host"]
        return f"{base}{path}" + (f"?{query}" if query else ""), headers

    # Calls

    def request(self, method, bucket, key="", params=None, body=b"", timeout=120):
        """Sends a signed request: (status, headers, body). Raises S3Error on an error answer."""
        url, headers = self.signed_headers(method, bucket, key, params, body)
        if body:
            # urllib would call a body form data, and some servers would then parse it as such.
            headers["Content-Type"] = "application/xml"
        request = urllib.request.Request(url, data=body if method in ("PUT", "POST") else None,
                                         headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, answer_headers, answer = response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            answer = error.read()
            raise S3Error(error.code, _tag(answer, "Code") or "HTTPError", _tag(answer, "Message") or error.reason)
        # CompleteMultipartUpload can answer 200 and put its error in the body.
        if b"<Error>" in answer[:512]:
            raise S3Error(status, _tag(answer, "Code") or "Error", _tag(answer, "Message") or "")
        return status, {k.lower(): v for k, v in answer_headers.items()}, answer

    def create_multipart_upload(self, bucket, key):
        _, _, body = self.request("POST", bucket, key, {"uploads": ""})
        upload_id = _tag(body, "UploadId")
        if not upload_id:
            raise S3Error(200, "NoUploadId", "CreateMultipartUpload gave no UploadId")
        return upload_id

    def complete_multipart_upload(self, bucket, key, upload_id, parts):
        """parts: [(part number, etag)] in order."""
        xml = "<CompleteMultipartUpload>" + "".join(
            f"<Part><PartNumber>{number}</PartNumber><ETag>{escape(etag)}</ETag></Part>" for number, etag in parts
        ) + "</CompleteMultipartUpload>"
        _, _, body = self.request("POST", bucket, key, {"uploadId": upload_id}, xml.encode("utf-8"))
        return _tag(body, "ETag")

    def abort_multipart_upload(self, bucket, key, upload_id):
        self.request("DELETE", bucket, key, {"uploadId": upload_id})

    def head_object(self, bucket, key):
        """The object's headers, or None when it does not exist."""
        try:
            _, headers, _ = self.request("HEAD", bucket, key)
            return headers
        except S3Error as error:
            if error.status == 404:
                return None
            raise

    def create_bucket(self, bucket):
        body = b""
        if self.region != "us-east-1":
            body = (f"<CreateBucketConfiguration><LocationConstraint>{self.region}</LocationConstraint>"
                    f"</CreateBucketConfiguration>").encode("utf-8")
        self.request("PUT", bucket, "", None, body)


def _tag(xml_bytes, name):
    match = re.search(rb"<" + name.encode() + rb">(.*?)</" + name.encode() + rb">", xml_bytes or b"", re.S)
    if not match:
        return None
    text = match.group(1).decode("utf-8", "replace")
    return text.replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
