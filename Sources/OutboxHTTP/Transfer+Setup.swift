import CCurl
import Glibc
import OutboxModel

/// Setting up a transfer: its body source, curl options, method, form and headers.
extension Transfer {
    /// What libcurl sends in the same write as the headers when it is given the body's bytes
    /// (its MAX_INITIAL_POST_SIZE): one system call, one segment to wake the server, not two.
    static let sentWithHeadersLimit = 64 * 1024

    /// GET and HEAD keep libcurl's own options for their verb (a body of theirs is streamed).
    static func sendsSmallBodyWithHeaders(_ method: String) -> Bool { method != "GET" && method != "HEAD" }

    func openSource(_ body: HTTPBody, expected: FileIdentity?, readSmallWhole: Bool) throws(TransferSetupError) {
        switch body {
        case .none:
            source = .empty
        case .bytes(let bytes):
            source = .bytes(bytes)
        case .file(let path, let offset, let length):
            guard offset >= 0, length >= 0 else {
                throw TransferSetupError(kind: .network, message: "file: invalid range \(offset)+\(length) of \(path)")
            }
            // Non-blocking: a FIFO swapped in for the file fails the check below instead of hanging the open.
            // A staged body is the store's own regular file: a link put in its place is not followed.
            let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (expected == nil ? O_NOFOLLOW : 0))
            guard fd >= 0 else {
                if expected != nil, errno == ENOENT { throw TransferSetupError(kind: .file, message: FileIdentity.missing(path)) }
                if expected == nil, errno == ELOOP {
                    throw TransferSetupError(kind: .file, message: "file: the staged body \(path) was replaced by a symbolic link")
                }
                // Out of fds or memory passes: tried again later. A staged body this user may not
                // read does not (the store made by another user): an error to see and fix.
                let passes = expected == nil && errno != EACCES && errno != EPERM
                throw TransferSetupError(kind: passes ? .network : .file, message: "file: cannot open \(path): \(errnoText())")
            }
            guard let info = FileInfo.stat(fd: fd), info.isRegular else {
                Glibc.close(fd)
                throw TransferSetupError(kind: .file, message: "file: \(path) is not a regular file")
            }
            if let expected, !expected.matches(size: info.size, mtimeNs: info.mtimeNs, inode: info.inode) {
                Glibc.close(fd)
                throw TransferSetupError(kind: .file, message: FileIdentity.changed(path))
            }
            guard info.size >= offset + length else {
                Glibc.close(fd)
                // The bytes enqueued are gone: sending again cannot bring them back.
                throw TransferSetupError(
                    kind: .file,
                    message: "file: \(path) has \(info.size) bytes, needs \(offset + length)")
            }
            source = .file(fd: fd, offset: offset, length: length, path: path)
            // The descriptor stays open: the file is checked again after the transfer.
            if readSmallWhole, length > 0, length <= Self.sentWithHeadersLimit {
                try readWhole(fd: fd, offset: offset, length: Int(length), path: path)
            }
        case .form(let fields):
            for field in fields {
                guard let path = field.filePath else { continue }
                guard FileInfo.stat(path)?.isRegular == true, access(path, R_OK) == 0 else {
                    throw TransferSetupError(kind: .network, message: "file: cannot read form file \(path)")
                }
            }
        }
    }

    /// Reads a small file body into `fileBytes`; fails as a read in the middle of a send would.
    private func readWhole(fd: Int32, offset: Int64, length: Int, path: String) throws(TransferSetupError) {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: length, alignment: 1)
        fileBytes = buffer
        var filled = 0
        while filled < length {
            let got = pread(fd, buffer.baseAddress! + filled, length - filled, off_t(offset) + off_t(filled))
            if got < 0 && errno == EINTR { continue }
            if got < 0 { throw TransferSetupError(kind: .network, message: "file: cannot read \(path): \(errnoText())") }
            if got == 0 { throw TransferSetupError(kind: .file, message: "file: \(path) shrank while it was being sent") }
            filled += got
        }
    }

    func check(_ code: CURLcode, _ what: String) throws(TransferSetupError) {
        guard code == CURLE_OK else {
            throw TransferSetupError(kind: .network, message: "\(what): \(String(cString: ccurl_easy_strerror(code)))")
        }
    }

    func configure(_ request: HTTPRequest) throws(TransferSetupError) {
        guard let easy else { return }
        let me = Unmanaged.passUnretained(self).toOpaque()

        try check(ccurl_setopt_ptr(easy, CURLOPT_ERRORBUFFER, errorBuffer), "ERRORBUFFER")
        try check(ccurl_setopt_ptr(easy, CURLOPT_PRIVATE, me), "PRIVATE")
        try check(ccurl_setopt_str(easy, CURLOPT_URL, request.url), "URL")
        // curl's signal-based DNS timeouts are unsafe with threads.
        try check(ccurl_setopt_long(easy, CURLOPT_NOSIGNAL, 1), "NOSIGNAL")
        try check(ccurl_setopt_str(easy, CURLOPT_PROTOCOLS_STR, "http,https"), "PROTOCOLS_STR")
        try check(ccurl_setopt_str(easy, CURLOPT_REDIR_PROTOCOLS_STR, "http,https"), "REDIR_PROTOCOLS_STR")
        try check(ccurl_setopt_long(easy, CURLOPT_SSL_VERIFYPEER, 1), "SSL_VERIFYPEER")
        try check(ccurl_setopt_long(easy, CURLOPT_SSL_VERIFYHOST, 2), "SSL_VERIFYHOST")
        if let caFile = request.caFile {
            try check(ccurl_setopt_str(easy, CURLOPT_CAINFO, caFile), "CAINFO")
        }
        if let cert = request.clientCert, let key = request.clientKey {
            try check(ccurl_setopt_str(easy, CURLOPT_SSLCERT, cert), "SSLCERT")
            try check(ccurl_setopt_str(easy, CURLOPT_SSLKEY, key), "SSLKEY")
            // An empty passphrase: given none, OpenSSL would ask for one on the terminal and read
            // the runner's stdin, blocking the curl thread and every transfer on it.
            try check(ccurl_setopt_str(easy, CURLOPT_KEYPASSWD, ""), "KEYPASSWD")
        }
        try check(ccurl_setopt_long(easy, CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_1_1)), "HTTP_VERSION")
        // File bodies use libcurl's 64 KiB upload buffer: measured against 256 KiB and 1 MiB
        // (bench/upload), it is as fast for one big file and faster for many small ones,
        // whose data then stays in cache between pread and send.
        try check(ccurl_setopt_long(easy, CURLOPT_TCP_KEEPALIVE, 1), "TCP_KEEPALIVE")
        // The rendered URL is final (templates already encoded dot segments): send it as is.
        try check(ccurl_setopt_long(easy, CURLOPT_PATH_AS_IS, 1), "PATH_AS_IS")
        try check(ccurl_setopt_long(easy, CURLOPT_CONNECTTIMEOUT_MS, max(1, request.connectTimeoutMs)), "CONNECTTIMEOUT_MS")
        if request.totalTimeoutMs > 0 { try check(ccurl_setopt_long(easy, CURLOPT_TIMEOUT_MS, request.totalTimeoutMs), "TIMEOUT_MS") }
        try check(ccurl_setopt_str(easy, CURLOPT_USERAGENT, request.userAgent), "USERAGENT")
        // Every encoding libcurl decodes is offered, and a compressed answer is decoded: less to
        // carry on a slow link, and a parser sees the JSON even from a server that compresses
        // unasked. The response cap counts decoded bytes, so a small bomb stops at it.
        try check(ccurl_setopt_str(easy, CURLOPT_ACCEPT_ENCODING, ""), "ACCEPT_ENCODING")
        if request.followRedirects > 0 {
            try check(ccurl_setopt_long(easy, CURLOPT_FOLLOWLOCATION, 1), "FOLLOWLOCATION")
            try check(ccurl_setopt_long(easy, CURLOPT_MAXREDIRS, request.followRedirects), "MAXREDIRS")
            redirectGuard = RedirectGuard(
                method: request.method.uppercased(), methodChange: request.redirectMethodChange,
                carriesCredentials: request.headers.contains { request.credentialHeaders.contains($0.name.lowercased()) }
                    || URLCheck.hasUserinfo(request.url))
        } else {
            try check(ccurl_setopt_long(easy, CURLOPT_FOLLOWLOCATION, 0), "FOLLOWLOCATION")
        }

        try check(
            ccurl_setopt_write_function(
                easy, CURLOPT_HEADERFUNCTION,
                { data, size, count, user in
                    let n = size * count
                    let transfer = Unmanaged<Transfer>.fromOpaque(user!).takeUnretainedValue()
                    let line = UnsafeRawBufferPointer(start: data, count: n)
                    // 0 ends the transfer: a redirect it must not follow stops here.
                    guard transfer.headerLineAllowed(line) else { return 0 }
                    transfer.unanswered.pointee = 0
                    transfer.responseHeaders.consume(line)
                    return n
                }), "HEADERFUNCTION")
        try check(ccurl_setopt_ptr(easy, CURLOPT_HEADERDATA, me), "HEADERDATA")
        // Every request that goes out is an attempt the runner sees: libcurl's own re-send of a
        // request whose reused connection closed unanswered is refused (an older libcurl
        // without the option re-sends as before).
        _ = ccurl_one_request_per_answer(easy, unanswered)
        try check(
            ccurl_setopt_write_function(
                easy, CURLOPT_WRITEFUNCTION,
                { data, size, count, user in
                    let n = size * count
                    let transfer = Unmanaged<Transfer>.fromOpaque(user!).takeUnretainedValue()
                    // A short count is CURLE_WRITE_ERROR: returned only on purpose (`stoppedReading`).
                    return transfer.keep(UnsafeRawBufferPointer(start: data, count: n)) ? n : 0
                }), "WRITEFUNCTION")
        try check(ccurl_setopt_ptr(easy, CURLOPT_WRITEDATA, me), "WRITEDATA")
        // Every non-form body goes through the read callback, with a seek callback so
        // curl can rewind for a 307/308.
        try check(
            ccurl_setopt_read_function(
                easy,
                { buffer, size, count, user in
                    let transfer = Unmanaged<Transfer>.fromOpaque(user!).takeUnretainedValue()
                    return transfer.read(into: buffer!, capacity: size * count)
                }), "READFUNCTION")
        try check(ccurl_setopt_ptr(easy, CURLOPT_READDATA, me), "READDATA")
        try check(
            ccurl_setopt_seek_function(
                easy,
                { user, offset, origin in
                    let transfer = Unmanaged<Transfer>.fromOpaque(user!).takeUnretainedValue()
                    return transfer.seek(to: offset, origin: origin)
                }), "SEEKFUNCTION")
        try check(ccurl_setopt_ptr(easy, CURLOPT_SEEKDATA, me), "SEEKDATA")
        if progress != nil {
            try check(
                ccurl_setopt_xferinfo_function(
                    easy,
                    { user, _, _, upTotal, upNow in
                        let transfer = Unmanaged<Transfer>.fromOpaque(user!).takeUnretainedValue()
                        transfer.reportProgress(sent: Int64(upNow), total: Int64(upTotal))
                        return 0
                    }), "XFERINFOFUNCTION")
            try check(ccurl_setopt_ptr(easy, CURLOPT_XFERINFODATA, me), "XFERINFODATA")
            try check(ccurl_setopt_long(easy, CURLOPT_NOPROGRESS, 0), "NOPROGRESS")
        }

        if let sign = request.awsSigV4 {
            let rc = ccurl_setopt_aws_sigv4(easy, sign.provider, sign.accessKeyID, sign.secretAccessKey)
            try check(rc, "AWS_SIGV4")
            let captured = UnsafeMutablePointer<ccurl_signature>.allocate(capacity: 1)
            captured.initialize(to: ccurl_signature())
            signature = captured
            try check(ccurl_capture_signature(easy, captured), "DEBUGFUNCTION")
            // libcurl 7.88 signs every header of the list, an empty `Expect:` too, which is
            // then not sent: the server could not check the signature. Its own unsigned
            // `Expect: 100-continue` goes instead, without waiting for the interim answer.
            try check(ccurl_setopt_long(easy, CURLOPT_EXPECT_100_TIMEOUT_MS, 1), "EXPECT_100_TIMEOUT_MS")
        }
        let method = asciiUppercased(request.method)
        try configureMethod(method, body: request.body, easy: easy)
        try configureHeaders(request, method: method, easy: easy)
    }

    /// How libcurl's options map methods and bodies: UPLOAD means PUT, POST=1 reads the body from
    /// the read callback, CUSTOMREQUEST renames the verb.
    func configureMethod(_ method: String, body: HTTPBody, easy: UnsafeMutableRawPointer) throws(TransferSetupError) {
        if case .form(let fields) = body {
            try buildForm(fields, easy: easy)
            if method != "POST" {
                try check(ccurl_setopt_str(easy, CURLOPT_CUSTOMREQUEST, method), "CUSTOMREQUEST")
            }
            return
        }
        // Small bodies go with the headers in one write, not through the read callback; a
        // re-send needs no rewind. In-memory bytes are copied by curl, a file's are read in place.
        if Self.sendsSmallBodyWithHeaders(method) {
            var small = false
            if let fileBytes {
                try check(ccurl_setopt_off_t(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(fileBytes.count)), "POSTFIELDSIZE_LARGE")
                try check(ccurl_setopt_ptr(easy, CURLOPT_POSTFIELDS, fileBytes.baseAddress), "POSTFIELDS")
                small = true
            } else if case .bytes(let bytes) = body, !bytes.isEmpty, bytes.count <= Self.sentWithHeadersLimit {
                // The size first: COPYPOSTFIELDS copies that many bytes.
                try check(ccurl_setopt_off_t(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(bytes.count)), "POSTFIELDSIZE_LARGE")
                let rc = bytes.withUnsafeBytes {
                    ccurl_setopt_ptr(easy, CURLOPT_COPYPOSTFIELDS, UnsafeMutableRawPointer(mutating: $0.baseAddress))
                }
                try check(rc, "COPYPOSTFIELDS")
                small = true
            }
            if small {
                if method != "POST" {
                    try check(ccurl_setopt_str(easy, CURLOPT_CUSTOMREQUEST, method), "CUSTOMREQUEST")
                }
                return
            }
        }
        let length = body.knownLength ?? 0
        let hasBody: Bool
        if case .none = body { hasBody = false } else { hasBody = true }
        switch method {
        case "GET" where !hasBody:
            try check(ccurl_setopt_long(easy, CURLOPT_HTTPGET, 1), "HTTPGET")
        case "HEAD" where !hasBody:
            try check(ccurl_setopt_long(easy, CURLOPT_NOBODY, 1), "NOBODY")
        case "DELETE" where !hasBody, "MKCOL" where !hasBody, "COPY" where !hasBody, "MOVE" where !hasBody:
            // The verb alone: no body, no Content-Length.
            try check(ccurl_setopt_str(easy, CURLOPT_CUSTOMREQUEST, method), "CUSTOMREQUEST")
        case "PUT":
            try check(ccurl_setopt_long(easy, CURLOPT_UPLOAD, 1), "UPLOAD")
            try check(ccurl_setopt_off_t(easy, CURLOPT_INFILESIZE_LARGE, curl_off_t(length)), "INFILESIZE_LARGE")
        default:
            // POST, PATCH, DELETE with a body, and any other verb: POST semantics, so a
            // Content-Length is always sent (0 for an empty PATCH).
            try check(ccurl_setopt_long(easy, CURLOPT_POST, 1), "POST")
            try check(ccurl_setopt_off_t(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(length)), "POSTFIELDSIZE_LARGE")
            if method != "POST" {
                try check(ccurl_setopt_str(easy, CURLOPT_CUSTOMREQUEST, method), "CUSTOMREQUEST")
            }
        }
    }

    func buildForm(_ fields: [FormField], easy: UnsafeMutableRawPointer) throws(TransferSetupError) {
        guard let form = ccurl_mime_init(easy) else {
            throw TransferSetupError(kind: .network, message: "curl_mime_init failed")
        }
        mime = form
        for field in fields {
            guard let part = ccurl_mime_addpart(form) else {
                throw TransferSetupError(kind: .network, message: "curl_mime_addpart failed")
            }
            try check(ccurl_mime_name(part, field.name), "form field \(field.name)")
            if let path = field.filePath {
                // curl opens and streams the file itself while sending.
                guard ccurl_mime_filedata(part, path) == CURLE_OK else {
                    throw TransferSetupError(kind: .network, message: "file: cannot read form file \(path)")
                }
                if let filename = field.filename {
                    try check(ccurl_mime_filename(part, filename), "form filename")
                }
            } else {
                let value = field.value ?? ""
                let code = value.withCString { ccurl_mime_data(part, $0, value.utf8.count) }
                try check(code, "form field \(field.name)")
            }
            if let type = field.contentType {
                try check(ccurl_mime_type(part, type), "form content type")
            }
        }
        try check(ccurl_setopt_mime(easy, form), "MIMEPOST")
    }

    func configureHeaders(_ request: HTTPRequest, method: String, easy: UnsafeMutableRawPointer) throws(TransferSetupError) {
        var list: UnsafeMutablePointer<curl_slist>?
        var sawExpect = false
        var sawContentType = false
        let isForm: Bool
        if case .form = request.body { isForm = true } else { isForm = false }
        // Each line is checked and built as bytes in one pass (no lowercased copies or
        // interpolated strings): this runs for every request.
        var line: [UInt8] = []
        line.reserveCapacity(256)
        for (name, value) in request.headers {
            line.removeAll(keepingCapacity: true)
            line.append(contentsOf: name.utf8)
            let nameEnd = line.count
            // "Name:" would make curl drop the header; "Name;" sends it empty.
            if value.isEmpty {
                line.append(UInt8(ascii: ";"))
            } else {
                line.append(UInt8(ascii: ":"))
                line.append(UInt8(ascii: " "))
                line.append(contentsOf: value.utf8)
            }
            // Read in place: a slice of `line` kept past here would make the append below copy it.
            let (valid, isContentType, isExpect) = line.withUnsafeBufferPointer { bytes in
                let nameBytes = UnsafeBufferPointer(rebasing: bytes[..<nameEnd])
                return (
                    nameEnd > 0 && nameBytes.allSatisfy(isTokenByte)
                        && !bytes[nameEnd...].contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0 }),
                    HeaderRules.spells(nameBytes, Self.contentTypeName), HeaderRules.spells(nameBytes, Self.expectName)
                )
            }
            guard valid else { throw TransferSetupError(kind: .network, message: "invalid header \(name.debugDescription)") }
            if isContentType {
                // curl writes the multipart Content-Type itself, with its boundary.
                if isForm { continue }
                sawContentType = true
            }
            if isExpect { sawExpect = true }
            line.append(0)
            list = line.withUnsafeBufferPointer { bytes in
                bytes.withMemoryRebound(to: CChar.self) { ccurl_slist_append(list, $0.baseAddress) }
            }
        }
        // No 100-continue round trip: curl would ask on every PUT, and some servers stall 1 s.
        // A signed request carries no empty header (see `configure`).
        let signed = request.awsSigV4 != nil
        if !sawExpect && !signed { list = ccurl_slist_append(list, "Expect:") }
        // POST=1 would otherwise add Content-Type: application/x-www-form-urlencoded.
        if !sawContentType && !isForm && !signed { list = ccurl_slist_append(list, "Content-Type:") }
        headerList = list
        try check(ccurl_setopt_slist(easy, CURLOPT_HTTPHEADER, list), "HTTPHEADER")
    }

    private static let contentTypeName = Array("content-type".utf8)
    private static let expectName = Array("expect".utf8)
}

/// A byte of an RFC 9110 token, so a header name cannot smuggle a colon or a line break.
private func isTokenByte(_ c: UInt8) -> Bool {
    switch c {
    case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"):
        return true
    case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"), UInt8(ascii: "'"),
        UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "^"), UInt8(ascii: "_"),
        UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
        return true
    default:
        return false
    }
}

extension Transfer {
    /// Follows the status of each response and, at the end of a redirect's headers, asks the
    /// guard whether libcurl may follow it. False stops the transfer.
    func headerLineAllowed(_ line: UnsafeRawBufferPointer) -> Bool {
        if let problem = responseHeaders.contentLengthProblem, line.allSatisfy({ $0 == 0x0D || $0 == 0x0A }) {
            // RFC 9112: a response whose length cannot be trusted must be discarded.
            malformedResponse = "malformed response: \(problem)"
            stoppedReading = true
            return false
        }
        guard let redirectGuard else { return true }
        if line.starts(with: Array("HTTP/".utf8)) {
            // "HTTP/1.1 303 See Other": the number after the first space.
            let parts = line.split(separator: 0x20, maxSplits: 2, omittingEmptySubsequences: true)
            currentStatus = parts.count > 1 ? Int(String(decoding: parts[1], as: UTF8.self)) ?? 0 : 0
            // Another response: the redirect before it was followed.
            redirectedAtCurrent = 0
            return true
        }
        // A blank line ends this response's headers.
        guard line.allSatisfy({ $0 == 0x0D || $0 == 0x0A }), let easy else { return true }
        var effective: UnsafePointer<CChar>?
        let current = ccurl_getinfo_str(easy, CURLINFO_EFFECTIVE_URL, &effective) == CURLE_OK ? effective.map { String(cString: $0) } : nil
        guard
            let refusal = redirectGuard.refusal(
                status: currentStatus, location: responseHeaders.value("location") ?? "",
                currentURL: current ?? url)
        else {
            // A redirect libcurl follows: the request it answers is done, and the next one
            // sends the body again (307/308) or none; its bytes count from zero again.
            if (300...399).contains(currentStatus), responseHeaders.value("location")?.isEmpty == false {
                var sent: curl_off_t = 0
                _ = ccurl_getinfo_off_t(easy, CURLINFO_SIZE_UPLOAD_T, &sent)
                redirectedAtCurrent = Int64(sent)
                redirectedBytes += Int64(sent)
            }
            return true
        }
        stoppedAtRedirect = refusal
        return false
    }
}
