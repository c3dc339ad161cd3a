import OutboxModel

/// The body of one HTTP request.
package enum HTTPBody: Sendable, Equatable {
    /// No body.
    case none
    /// An in-memory body (small: JSON, text).
    case bytes([UInt8])
    /// A byte range of a file, streamed from disk and never loaded whole.
    case file(path: String, offset: Int64, length: Int64)
    /// A multipart/form-data body; file parts are streamed from their paths.
    case form([FormField])

    /// The number of body bytes when known up front (nil for a form: curl computes it).
    var knownLength: Int64? {
        switch self {
        case .none: return 0
        case .bytes(let bytes): return Int64(bytes.count)
        case .file(_, _, let length): return length
        case .form: return nil
        }
    }
}

/// One part of a multipart/form-data body: a value, or a file streamed from `filePath`.
package struct FormField: Sendable, Equatable {
    package var name: String
    package var value: String?
    package var filePath: String?
    /// The filename sent for a file part; nil sends the last component of `filePath`.
    package var filename: String?
    package var contentType: String?

    /// Creates a form field; give either `value` or `filePath`.
    package init(name: String, value: String? = nil, filePath: String? = nil, filename: String? = nil, contentType: String? = nil) {
        self.name = name
        self.value = value
        self.filePath = filePath
        self.filename = filename
        self.contentType = contentType
    }
}

/// One HTTP attempt, fully rendered: what goes on the wire.
package struct HTTPRequest: Sendable {
    package var url: String
    /// GET, POST, PUT, PATCH, DELETE, HEAD, or another token sent as a custom method.
    package var method: String
    /// Sent as given, in order. For a `.form` body a Content-Type given here is dropped
    /// (curl writes it with the boundary).
    package var headers: [(name: String, value: String)]
    package var body: HTTPBody
    /// 0: a 3xx is returned as the response; >0: follow at most this many (http/https only).
    /// curl turns a POST into a GET on 301/302/303, but a PATCH or DELETE keeps its verb.
    package var followRedirects: Int
    package var connectTimeoutMs: Int
    /// The longest the whole transfer may take (libcurl's `CURLOPT_TIMEOUT_MS`); 0: no limit.
    package var totalTimeoutMs = 0
    /// The transfer fails with `.timeout` when it moves less than this a second, on average,
    /// over `stallForMs` once connected (`StallWatch`); 0 in either turns the check off.
    package var stallBelowBytesPerSecond: Int
    package var stallForMs: Int
    /// A CA bundle to trust instead of the system's; verification is always on.
    package var caFile: String?
    /// A client certificate (PEM) and its key, sent when the server asks for one.
    package var clientCert: String?
    package var clientKey: String?
    /// Response body bytes kept; the rest is read and discarded (`bodyTruncated`).
    package var maxResponseBytes: Int
    package var userAgent: String
    /// For a `.file` body: what the file must still be when the transfer starts (a file
    /// referenced at enqueue, `ownership: reference`). Checked on the curl thread as the
    /// file is opened, so a request that waited (a standby request) is checked at the moment
    /// it is sent; a missing or different file fails the transfer with `.file`, and nothing
    /// is sent.
    package var expectedFile: FileIdentity?
    /// With `followRedirects`: a 301, 302 or 303 to a request other than GET or HEAD is
    /// followed (as a GET, without the body: libcurl's browser rule) only when true;
    /// otherwise the transfer stops there with a `.redirect` failure.
    package var redirectMethodChange = false
    /// Header names (lowercase) never sent to another origin: a redirect to another origin of a
    /// request carrying one is not followed (the transfer stops with a `.redirect` failure).
    package var credentialHeaders = Self.alwaysCredentials
    /// Made once: a set built for each request cost it an allocation and three hashes.
    private static let alwaysCredentials: Set<String> = ["authorization", "cookie", "proxy-authorization"]
    /// Signs the request with AWS Signature V4 (libcurl computes `Authorization` from the
    /// method, path, query and every header given here, at the moment it sends).
    package var awsSigV4: AWSSigV4?
    /// Why the request cannot be sent (no credentials to sign it): the transfer fails with
    /// this, and nothing is sent.
    package var refusal: TransportFailure?

    /// Creates a request; defaults fit one outbox attempt.
    package init(
        url: String, method: String, headers: [(name: String, value: String)] = [], body: HTTPBody = .none,
        followRedirects: Int = 0, connectTimeoutMs: Int = 30_000, stallBelowBytesPerSecond: Int = 1024,
        stallForMs: Int = 60_000, caFile: String? = nil, maxResponseBytes: Int = 1 << 20,
        userAgent: String = "outbox"
    ) {
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.followRedirects = followRedirects
        self.connectTimeoutMs = connectTimeoutMs
        self.stallBelowBytesPerSecond = stallBelowBytesPerSecond
        self.stallForMs = stallForMs
        self.caFile = caFile
        self.maxResponseBytes = maxResponseBytes
        self.userAgent = userAgent
    }
}

/// The outcome of one transfer: a response, a failure, or both (a failure after headers).
package struct HTTPResult: Sendable {
    /// Status of the final response; nil when no HTTP response was received.
    package var status: Int?
    /// Headers of the final response only; names lowercased, repeats joined with ", ".
    /// Parsed from the received lines on each read.
    package var headers: [(name: String, value: String)] {
        get { responseHeaders.fields }
        set { responseHeaders = ResponseHeaders(fields: newValue) }
    }
    var responseHeaders: ResponseHeaders
    package var body: [UInt8]
    package var bodyTruncated: Bool
    package var failure: TransportFailure?
    /// Seconds from a `Retry-After` header (either form); nil when absent.
    package var retryAfterSeconds: Int64?
    /// The time (epoch ms) a `Retry-After` HTTP-date names, so the next attempt is set from
    /// it rather than from the seconds counted when the header arrived.
    package var retryAfterDate: Int64?
    /// Request body bytes uploaded by the last request of the attempt (the body's progress).
    package var bytesSent: Int64
    /// Body bytes of the requests before the last one, those a followed redirect answered
    /// (the body is sent again after a 307/308): on the wire too, and not in `bytesSent`.
    package var bytesResent: Int64 = 0
    /// Whether any of the request reached the connection (its head, or body bytes): a
    /// transfer stopped while it connected or shook hands never did, and is no attempt.
    package var requestWentOut = true
    /// Every body byte this attempt put on the wire.
    package var bytesOnTheWire: Int64 { bytesSent + bytesResent }
    /// The AWS Signature V4 libcurl computed for a signed request (a secret to mask).
    package var signature: String?
    /// How long the transfer took, from its start to its end (curl's total time).
    package var durationMicroseconds: Int64 = 0
    package var effectiveURL: String
    /// The standby transfer that started in this one's slot as it ended (see `HTTPClient`).
    package var startedInPlace: UInt64?
    /// The body file read from, as it was when the transfer ended (`fstat` of the open
    /// file): whether it changed while it was read, without looking its path up again.
    package var bodyFileAtEnd: FileInfo?

    /// Creates a result (tests and the runner build them too).
    package init(
        status: Int? = nil, headers: [(name: String, value: String)] = [], body: [UInt8] = [],
        bodyTruncated: Bool = false, failure: TransportFailure? = nil,
        retryAfterSeconds: Int64? = nil, bytesSent: Int64 = 0, effectiveURL: String = ""
    ) {
        self.status = status
        self.responseHeaders = ResponseHeaders(fields: headers)
        self.body = body
        self.bodyTruncated = bodyTruncated
        self.failure = failure
        self.retryAfterSeconds = retryAfterSeconds
        self.bytesSent = bytesSent
        self.effectiveURL = effectiveURL
    }

    /// The value of a response header, by lowercase name.
    package func header(_ name: String) -> String? {
        let lower = asciiLowercased(name)
        return headers.first(where: { $0.name == lower })?.value
    }
}

/// libcurl could not be loaded or initialised.
package struct HTTPClientError: Error, Sendable, Equatable, CustomStringConvertible {
    package var message: String
    /// Creates the error with a message naming what failed.
    package init(_ message: String) { self.message = message }
    package var description: String { message }
}

/// ASCII-only lowercasing: header names are ASCII tokens, and this avoids Unicode tables.
func asciiLowercased(_ s: String) -> String {
    var bytes = Array(s.utf8)
    for i in bytes.indices where bytes[i] >= 0x41 && bytes[i] <= 0x5A {
        bytes[i] += 0x20
    }
    return String(decoding: bytes, as: UTF8.self)
}

/// What libcurl needs to sign a request with AWS Signature V4; lives only for one attempt.
package struct AWSSigV4: Sendable {
    /// "aws:amz:REGION:SERVICE".
    package var provider: String
    package var accessKeyID: String
    package var secretAccessKey: String

    package init(provider: String, accessKeyID: String, secretAccessKey: String) {
        self.provider = provider
        self.accessKeyID = accessKeyID
        self.secretAccessKey = secretAccessKey
    }
}

extension HTTPResult {
    /// No HTTP answer at all: the connection was refused, reset, timed out or never resolved.
    package var connectionFailed: Bool { status == nil && [.network, .timeout].contains(failure?.kind) }
}
