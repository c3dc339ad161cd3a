import CCurl
import Glibc
import OutboxModel

/// A request that could not be handed to libcurl (body file missing, bad header...).
struct TransferSetupError: Error {
    var kind: TransportFailure.Kind
    var message: String
}

/// One easy handle and everything its callbacks touch.
///
/// Confined to the curl thread. libcurl gets `self` as an unretained pointer; the engine
/// keeps the object alive in its table until after `curl_multi_remove_handle`, since its
/// callbacks may run until then.
final class Transfer {
    enum Source {
        case empty
        case bytes([UInt8])
        case file(fd: Int32, offset: Int64, length: Int64, path: String)
    }

    let id: UInt64
    let completion: @Sendable (HTTPResult) -> Void
    var easy: UnsafeMutableRawPointer?
    let url: String
    let progress: (@Sendable (Int64, Int64) -> Void)?
    let maxResponseBytes: Int
    let uploadLength: Int64?
    var source: Source = .empty
    /// A small file body's bytes, read whole as the transfer is set up so that they go with
    /// the headers in one write, as small in-memory bodies do; libcurl reads them in place
    /// until its handle is reset.
    var fileBytes: UnsafeMutableRawBufferPointer?
    var readPosition: Int64 = 0
    /// Body bytes of the requests answered by a redirect libcurl follows (each is sent anew),
    /// and the share of them counted at the response now being read (see `HTTPResult.bytesResent`).
    var redirectedBytes: Int64 = 0
    var redirectedAtCurrent: Int64 = 0
    /// Why the read callback stopped the body: a read error may pass (`network`), a file that
    /// shrank does not (`file`).
    var readFailure: TransportFailure?
    var headerList: UnsafeMutablePointer<curl_slist>?
    var mime: OpaquePointer?
    let errorBuffer: UnsafeMutablePointer<CChar>
    var responseHeaders = ResponseHeaders()
    var body: [UInt8] = []
    var truncated = false
    /// Body bytes past `maxResponseBytes`, read and dropped.
    var discarded = 0
    /// Set when the write callback stopped the transfer on purpose: the body outgrew what is
    /// read and dropped, or the response's framing is invalid (`malformedResponse`).
    var stoppedReading = false
    /// Why the response was discarded as malformed (two different Content-Length values).
    var malformedResponse: String?
    /// What the redirect guard needs: set when redirects are followed.
    var redirectGuard: RedirectGuard?
    /// The status of the response whose headers are arriving.
    var currentStatus = 0
    /// Why the transfer stopped at a redirect it must not follow.
    var stoppedAtRedirect: String?
    var lastProgressNs: UInt64 = 0
    var lastProgressSent: Int64 = -1
    /// The stall check, run by the engine (libcurl's low-speed check is not used).
    var stallWatch: StallWatch?
    /// libcurl's byte counters as last seen, and what they counted before they last went
    /// back to 0 (they restart with each request of a redirect).
    var countedBytes: Int64 = 0
    var countedBeforeRestart: Int64 = 0
    /// Where libcurl's debug callback leaves the signature of a signed request.
    var signature: UnsafeMutablePointer<ccurl_signature>?
    /// 1 while a request sent has no answer, 2 once libcurl's re-send of it was refused
    /// (`ccurl_one_request_per_answer`).
    let unanswered: UnsafeMutablePointer<Int32> = {
        let p = UnsafeMutablePointer<Int32>.allocate(capacity: 1)
        p.initialize(to: 0)
        return p
    }()

    /// Opens the body source and configures an easy handle, `spare` (reset by `close`) or a
    /// new one; throws what to report.
    init(
        id: UInt64, request: HTTPRequest, spare: UnsafeMutableRawPointer? = nil,
        progress: (@Sendable (Int64, Int64) -> Void)?, completion: @escaping @Sendable (HTTPResult) -> Void
    ) throws(TransferSetupError) {
        self.id = id
        self.completion = completion
        self.url = request.url
        self.progress = progress
        self.maxResponseBytes = max(0, request.maxResponseBytes)
        self.uploadLength = request.body.knownLength
        stallWatch = StallWatch(belowBytesPerSecond: request.stallBelowBytesPerSecond, forMs: request.stallForMs)
        errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE))
        errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE))
        easy = spare ?? ccurl_easy_init()
        guard easy != nil else { throw TransferSetupError(kind: .network, message: "curl_easy_init failed") }
        if let refusal = request.refusal { throw TransferSetupError(kind: refusal.kind, message: refusal.message) }
        // A signed request keeps the read callback: libcurl 7.88 would hash the bytes it is
        // given for the signature, where an s3 entry signs UNSIGNED-PAYLOAD.
        let readSmallWhole = request.awsSigV4 == nil && Self.sendsSmallBodyWithHeaders(asciiUppercased(request.method))
        try openSource(request.body, expected: request.expectedFile, readSmallWhole: readSmallWhole)
        try configure(request)
    }

    deinit {
        close()
        errorBuffer.deallocate()
        signature?.deallocate()
        unanswered.deallocate()
    }

    /// Frees the easy handle and what it referenced; call only once it left the multi. With
    /// `keepingHandle`, the handle is reset to libcurl's defaults and returned instead, for
    /// another transfer: a new handle and its freeing cost about 14,000 instructions, a
    /// tenth of a small request's work on the curl thread.
    @discardableResult
    func close(keepingHandle: Bool = false) -> UnsafeMutableRawPointer? {
        var kept: UnsafeMutableRawPointer?
        if let easy {
            // Reset drops every option, so the handle no longer points at what is freed below.
            if keepingHandle { ccurl_easy_reset(easy); kept = easy } else { ccurl_easy_cleanup(easy) }
        }
        easy = nil
        // The mime and header list are freed after the handle that used them.
        if let mime { ccurl_mime_free(mime) }
        mime = nil
        if let headerList { ccurl_slist_free_all(headerList) }
        headerList = nil
        fileBytes?.deallocate()
        fileBytes = nil
        if case .file(let fd, _, _, _) = source { Glibc.close(fd) }
        source = .empty
        return kept
    }

    // MARK: - Callbacks (curl thread)

    /// Up to this much past the cap is read and dropped, so a reusable connection stays
    /// reusable; beyond it the transfer stops, or an endless body would hold its slot forever.
    static let discardAllowance = 1 << 20

    /// Keeps what fits under the cap; false once the transfer should stop reading.
    func keep(_ chunk: UnsafeRawBufferPointer) -> Bool {
        let room = maxResponseBytes - body.count
        if chunk.count > room { truncated = true }
        if room > 0 { body.append(contentsOf: chunk.prefix(room)) }
        discarded += chunk.count - min(chunk.count, max(0, room))
        if discarded > Self.discardAllowance {
            stoppedReading = true
            return false
        }
        return true
    }

    func read(into buffer: UnsafeMutablePointer<CChar>, capacity: Int) -> Int {
        switch source {
        case .empty:
            return 0
        case .bytes(let bytes):
            let start = Int(readPosition)
            let n = min(capacity, bytes.count - start)
            guard n > 0 else { return 0 }
            bytes.withUnsafeBytes { raw in
                UnsafeMutableRawPointer(buffer).copyMemory(from: raw.baseAddress! + start, byteCount: n)
            }
            readPosition += Int64(n)
            return n
        case .file(let fd, let offset, let length, let path):
            let remaining = length - readPosition
            guard remaining > 0 else { return 0 }
            let want = Int(min(Int64(capacity), remaining))
            while true {
                let got = pread(fd, buffer, want, off_t(offset + readPosition))
                if got < 0 && errno == EINTR { continue }
                if got < 0 {
                    readFailure = TransportFailure(.network, "file: cannot read \(path): \(errnoText())")
                    return Int(CURL_READFUNC_ABORT)
                }
                if got == 0 {
                    // The bytes enqueued are gone (a pseudo-file whose size is not its length
                    // does this every time): sending again cannot bring them back.
                    readFailure = TransportFailure(.file, "file: \(path) shrank while it was being sent")
                    return Int(CURL_READFUNC_ABORT)
                }
                // Half the body is on its way: a crash test's moment for "mid-upload".
                if readPosition < length / 2 && readPosition + Int64(got) >= length / 2 { Fault.point("send.mid-body") }
                readPosition += Int64(got)
                return got
            }
        }
    }

    func seek(to offset: curl_off_t, origin: Int32) -> Int32 {
        let length: Int64
        switch source {
        case .empty: length = 0
        case .bytes(let bytes): length = Int64(bytes.count)
        case .file(_, _, let fileLength, _): length = fileLength
        }
        // curl only seeks from the start (SEEK_SET).
        guard origin == SEEK_SET, offset >= 0, Int64(offset) <= length else { return Int32(CURL_SEEKFUNC_FAIL) }
        readPosition = Int64(offset)
        return Int32(CURL_SEEKFUNC_OK)
    }

    func reportProgress(sent: Int64, total: Int64) {
        guard let progress, sent != lastProgressSent else { return }
        let fullTotal = total > 0 ? total : (uploadLength ?? 0)
        guard fullTotal > 0 else { return }  // nothing to upload, nothing to report
        let now = monotonicNanoseconds()
        let done = fullTotal > 0 && sent >= fullTotal
        // At most about 4 calls a second, plus the one that reports the last byte.
        guard done || now &- lastProgressNs >= 250_000_000 else { return }
        lastProgressNs = now
        lastProgressSent = sent
        progress(sent, fullTotal)
    }

    // MARK: - Stall check (curl thread)

    /// The stall message once the transfer has stalled (`StallWatch`), else nil. Time spent
    /// connecting does not count: the connect timeout covers it.
    func stallMessage(nowMs: Int64) -> String? {
        guard let easy, var watch = stallWatch else { return nil }
        defer { stallWatch = watch }
        var started: curl_off_t = 0
        _ = ccurl_getinfo_off_t(easy, CURLINFO_PRETRANSFER_TIME_T, &started)
        guard started > 0 else {
            watch.reset()
            return nil
        }
        var sent: curl_off_t = 0
        var received: curl_off_t = 0
        _ = ccurl_getinfo_off_t(easy, CURLINFO_SIZE_UPLOAD_T, &sent)
        _ = ccurl_getinfo_off_t(easy, CURLINFO_SIZE_DOWNLOAD_T, &received)
        let counted = Int64(sent) + Int64(received)
        if counted < countedBytes { countedBeforeRestart += countedBytes }
        countedBytes = counted
        return watch.observe(bytes: countedBeforeRestart + counted, nowMs: nowMs) ? watch.message : nil
    }

    // MARK: - Result

    /// Builds the result once curl is done (`code`) or the transfer was aborted (nil).
    func result(
        code: CURLcode?, abortMessage: String = "cancelled by the runner", abortKind: TransportFailure.Kind = .aborted
    ) -> HTTPResult {
        var result = HTTPResult(effectiveURL: url)
        guard let easy else { return result }
        var status = 0
        _ = ccurl_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &status)
        // An interim answer (100 Continue) is no final status.
        result.status = status >= 200 ? status : nil
        result.responseHeaders = responseHeaders
        result.body = body
        result.bodyTruncated = truncated
        var sent: curl_off_t = 0
        _ = ccurl_getinfo_off_t(easy, CURLINFO_SIZE_UPLOAD_T, &sent)
        result.bytesSent = Int64(sent)
        var headBytes = 0
        _ = ccurl_getinfo_long(easy, CURLINFO_REQUEST_SIZE, &headBytes)
        result.requestWentOut = headBytes > 0 || sent > 0
        // A last redirect that was not followed (too many) is the request `bytesSent` counts.
        result.bytesResent = redirectedBytes - redirectedAtCurrent
        if case .file(let fd, _, _, _) = source { result.bodyFileAtEnd = FileInfo.stat(fd: fd) }
        if let signature, signature.pointee.length > 0 {
            result.signature = withUnsafeBytes(of: signature.pointee.value) { raw in
                String(decoding: raw.prefix(signature.pointee.length), as: UTF8.self)
            }
        }
        var total: curl_off_t = 0
        _ = ccurl_getinfo_off_t(easy, CURLINFO_TOTAL_TIME_T, &total)
        result.durationMicroseconds = Int64(total)
        var effective: UnsafePointer<CChar>?
        if ccurl_getinfo_str(easy, CURLINFO_EFFECTIVE_URL, &effective) == CURLE_OK, let effective {
            result.effectiveURL = String(cString: effective)
        }
        if responseHeaders.hasRetryAfter, let value = responseHeaders.value("retry-after") {
            // Read here, not by curl, which takes "abc" or "-1" as 0: an invalid value is
            // ignored (the entry's own backoff applies), not a retry storm.
            let now = Identifiers.nowMs()
            result.retryAfterSeconds = Backoff.parseRetryAfter(value, now: now)
            result.retryAfterDate = Backoff.retryAfterDate(value, now: now)
        }
        guard let code else {
            result.failure = TransportFailure(abortKind, abortMessage)
            return result
        }
        if code == CURLE_ABORTED_BY_CALLBACK, unanswered.pointee == 2 {
            result.failure = TransportFailure(
                .network, "the connection closed before any answer (libcurl's unseen re-send refused: the retry is an attempt of its own)")
            return result
        }
        if let stoppedAtRedirect {
            // Our header callback ended the transfer at a redirect it must not follow.
            result.status = currentStatus
            result.failure = TransportFailure(.redirect, stoppedAtRedirect)
            return result
        }
        if let malformedResponse {
            // Framing that cannot be trusted: the response is discarded and retried, as if none
            // came (its status stays, as for any answer cut off or garbled after its status line).
            result.failure = TransportFailure(.network, malformedResponse)
            return result
        }
        if code == CURLE_OK, (100..<200).contains(status), responseHeaders.ended {
            // A final 1xx (a 101 to a request that asked for no upgrade, the bytes after it read
            // as its body): an answer, with no meaning we could act on; sent again, it would
            // only be answered the same way until the entry expired.
            result.status = status
        }
        if code == CURLE_OK, result.status != nil, !responseHeaders.ended {
            // libcurl takes a connection closed inside the headers for a complete response.
            result.status = nil
            result.failure = TransportFailure(.network, "the connection closed before the response's headers ended")
            return result
        }
        // Stopped by the write callback past the cap: the response is complete enough (status,
        // headers and the capped body), and `truncated` says the rest was dropped.
        if code == CURLE_OK, result.status == nil {
            result.failure = TransportFailure(.network, "no response")
            return result
        }
        if code == CURLE_OK || (stoppedReading && code == CURLE_WRITE_ERROR) { return result }
        if let readFailure {
            result.failure = readFailure
            return result
        }
        var redirects = 0
        _ = ccurl_getinfo_long(easy, CURLINFO_REDIRECT_COUNT, &redirects)
        // A malformed answer after a followed redirect fails the same way as a refused scheme:
        // only a Location naming another scheme makes it a redirect problem.
        let afterRedirect = (redirects > 0 || (300...399).contains(status)) && (code != CURLE_UNSUPPORTED_PROTOCOL || locationLeavesHTTP())
        var detail = String(cString: errorBuffer)
        // libcurl keeps the first message of a transfer: one of a dead reused connection it
        // recovered from by sending again would stand for the failure that ended it.
        if code != CURLE_RECV_ERROR, code != CURLE_SEND_ERROR,
            detail.hasPrefix("Recv failure") || detail.hasPrefix("Send failure") || detail.hasPrefix("Connection died")
        {
            detail = ""
        }
        if code == CURLE_TOO_MANY_REDIRECTS { detail = "Maximum (\(redirects)) redirects followed" }
        var message = detail.isEmpty ? String(cString: ccurl_easy_strerror(code)) : detail
        if code == CURLE_OUT_OF_MEMORY, status > 0 {
            // What libcurl 7.88 answers to a header line past its limit, once a response began.
            message = "a response header line is over libcurl's 100 KiB limit, or libcurl ran out of memory (\(message))"
        }
        if code == CURLE_READ_ERROR {
            // Only curl's own reads of form files get here; ours abort with readFailure.
            message = "file: a form file could not be read: \(message)"
        }
        let kind = CurlFailure.kind(of: code, afterRedirect: afterRedirect)
        // A redirect followed to a request that failed: the 3xx was not the final status, none came.
        if redirects > 0, kind != .redirect, (300...399).contains(status) { result.status = nil }
        result.failure = TransportFailure(kind, message)
        return result
    }
}

extension Transfer {
    /// Whether the last response's Location names a scheme other than http and https.
    func locationLeavesHTTP() -> Bool {
        guard let location = responseHeaders.value("location"), let colon = location.firstIndex(of: ":") else { return false }
        let scheme = location[..<colon]
        // RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ); anything else is a relative path.
        guard let first = scheme.first, first.isASCII, first.isLetter,
            scheme.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "+" || $0 == "-" || $0 == ".") })
        else { return false }
        return !["http", "https"].contains(scheme.lowercased())
    }
}

func errnoText() -> String {
    String(cString: strerror(errno))
}

func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

func asciiUppercased(_ s: String) -> String {
    var bytes = Array(s.utf8)
    for i in bytes.indices where bytes[i] >= 0x61 && bytes[i] <= 0x7A {
        bytes[i] -= 0x20
    }
    return String(decoding: bytes, as: UTF8.self)
}

/// Which redirects libcurl may follow for one request: never a method change that drops a
/// body unless allowed, never credentials to another origin (scheme, host or port).
struct RedirectGuard {
    let method: String
    let methodChange: Bool
    let carriesCredentials: Bool

    /// Why the response `status` with `location`, received for `currentURL`, must not be
    /// followed; nil when it may be.
    func refusal(status: Int, location: String, currentURL: String) -> String? {
        guard (300...399).contains(status), !location.isEmpty else { return nil }
        // libcurl follows any 3xx with a Location; 300, 304, 305 and unknown codes name no
        // one target to re-send a request to.
        guard [301, 302, 303, 307, 308].contains(status) else {
            return "HTTP \(status) is not a redirect outbox follows; not followed"
        }
        if [301, 302, 303].contains(status), !["GET", "HEAD"].contains(method) {
            // libcurl turns only a POST into a GET: another verb would be re-sent as itself, empty.
            if method != "POST" {
                return
                    "HTTP \(status) to a \(method) is not followed: a 301, 302 or 303 changes the method, which only a POST may do (as a GET, with redirect_method_change: true)"
            }
            if !methodChange {
                return
                    "HTTP \(status) would re-send POST as GET without its body; not followed (redirect_method_change: true allows it)"
            }
        }
        if let scheme = Self.scheme(of: location), scheme != "http", scheme != "https" {
            return "HTTP \(status) to a URL of scheme \(scheme); only http and https are followed"
        }
        // libcurl's own parser says where the redirect leads: a hand-made reading of
        // `http:/host` or `\\host` could name the current host where libcurl goes elsewhere.
        let target = Self.origin(location, relativeTo: currentURL)
        if let target, !target.hasPrefix("http://"), !target.hasPrefix("https://") {
            return "HTTP \(status) to a URL of another scheme (\(target)); only http and https are followed"
        }
        if carriesCredentials {
            guard let target, let current = Self.origin(currentURL, relativeTo: currentURL) else {
                return "HTTP \(status) to a Location libcurl cannot read; not followed"
            }
            if target != current {
                return
                    "HTTP \(status) to another origin (\(target)) would carry credential headers, which go only to the scheme, host and port they were written for; not followed"
            }
        }
        return nil
    }

    /// The scheme of an absolute URL, lowercased; nil for a relative reference.
    static func scheme(of url: String) -> String? {
        guard let colon = url.firstIndex(of: ":"), let first = url.first, first.isASCII, first.isLetter else { return nil }
        let name = url[..<colon]
        guard name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "+-.".contains($0)) }) else { return nil }
        return name.lowercased()
    }

    /// `scheme://host:port` (lowercased, the scheme's port filled in) of a Location
    /// resolved against `base` as libcurl resolves it; nil when libcurl cannot read it.
    static func origin(_ location: String, relativeTo base: String) -> String? {
        var out = [CChar](repeating: 0, count: 1024)
        guard ccurl_redirect_origin(base, location, &out, out.count) == 0 else { return nil }
        return String(decoding: out.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self).lowercased()
    }
}
