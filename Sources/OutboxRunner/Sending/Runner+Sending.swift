import OutboxHTTP
import OutboxModel

/// Sending: turning an entry (or one part of it) into an HTTP request on the curl thread.
extension Runner {
    /// `part`: the index of the part a request sends, whose key is the entry's with the
    /// part's number: one key names one payload, as servers that honour it expect.
    func baseHeaders(_ entry: Entry, requestID: String, part: Int? = nil) -> [(name: String, value: String)] {
        // A stored header of either name (a store written before they were refused) would go
        // out beside outbox's own, and a server reading the first would see it on every attempt.
        var headers: [(name: String, value: String)] = []
        headers.reserveCapacity(entry.request.headers.count + 3)
        for (name, value) in entry.request.headers where !HeaderRules.isAttemptOwn(name) { headers.append((name, value)) }
        headers.append((name: "X-Request-Id", value: requestID))
        if let key = entry.idempotencyKey {
            headers.append((name: "Idempotency-Key", value: part.map { "\(key)-part-\($0 + 1)" } ?? key))
        }
        if !headers.contains(where: { $0.name.lowercased() == "user-agent" }) {
            headers.append((name: "User-Agent", value: "outbox/\(outboxVersion)"))
        }
        return headers
    }

    /// The body of an attempt: the part's byte range, or the entry's whole body.
    static func httpBody(_ entry: Entry, part: StoredPart?) -> HTTPBody {
        if let part {
            return .file(path: entry.bodyFile ?? "", offset: part.range.start, length: part.range.end - part.range.start)
        }
        switch entry.body {
        case .none: return .none
        case let .bytes(bytes): return .bytes(bytes)
        case let .form(fields):
            return .form(
                fields.map {
                    FormField(name: $0.name, value: $0.value, filePath: $0.stagedFile, filename: $0.filename, contentType: $0.contentType)
                })
        case let .file(path), let .parts(path): return .file(path: path, offset: 0, length: entry.totalBytes)
        }
    }

    /// Every request's User-Agent, made once.
    static let userAgent = "outbox/\(outboxVersion)"

    /// `probed`: the HEAD of a `skip_existing` object found it missing, so this is the upload
    /// of the same attempt.
    func startTransfer(_ entry: Entry, part: StoredPart?, host: String, standby isStandby: Bool = false, probed: Bool = false) {
        let headFirst = part == nil && !probed && entry.request.s3?.skipExisting == true
        let requestID = Identifiers.uuid(using: &requestIDs)
        var headers = baseHeaders(entry, requestID: requestID, part: part?.index)
        var url = entry.request.url ?? ""
        if let part {
            url = part.url
            if entry.request.s3 != nil, let uploadID = flights.partJobs[entry.id]?.s3UploadID {
                // The upload id is known only once the upload started; parts carry no storage class.
                url += "&uploadId=\(URLCheck.encodeComponent(uploadID))"
                headers.removeAll { $0.name.lowercased() == "x-amz-storage-class" }
            }
            for (name, value) in part.headers {
                headers.removeAll { $0.name.lowercased() == name.lowercased() }
                headers.append((name: name, value: value))
            }
        }
        var request = HTTPRequest(
            url: url, method: entry.request.method, headers: headers, body: Self.httpBody(entry, part: part),
            followRedirects: entry.request.followRedirects, connectTimeoutMs: Int(config.connectTimeoutMs),
            stallBelowBytesPerSecond: Int(config.stallBelowBytes), stallForMs: Int(config.stallForMs), caFile: config.caFile,
            maxResponseBytes: Int(config.maxResponseBytes), userAgent: Self.userAgent)
        (request.clientCert, request.clientKey) = (config.clientCert, config.clientKey)
        request.totalTimeoutMs = Int(config.attemptTimeoutMs ?? 0)
        request.redirectMethodChange = entry.request.redirectMethodChange
        if entry.request.followRedirects > 0 {
            // Only a redirect to another origin looks at them: the set is built for those alone.
            request.credentialHeaders.formUnion(config.redactedHeaderNames)
            request.credentialHeaders.formUnion(entry.request.secretHeaders)
        }
        // A referenced file is checked again when the curl thread opens it: a standby request
        // may start well after its claim checked the file.
        if part == nil { request.expectedFile = Self.expectedFile(entry) }
        if headFirst { s3ExistingHead(&request) }
        if let target = entry.request.s3 { signS3(&request, target: target) }
        let token = flights.nextToken
        flights.nextToken += 1
        let attempt = (flights.running[entry.id]?.attempts ?? entry.attempts) + (probed ? 0 : 1)
        flights.running[entry.id]?.attempts = attempt
        var flight = Flight(
            entryID: entry.id, partIndex: part?.index, requestID: requestID, host: host, url: url,
            method: request.method, attempt: attempt, standby: isStandby)
        if isStandby { flight.standbySince = Identifiers.monotonicMs() }
        (flight.sentHeaders, flight.secretHeaders) = (request.headers, entry.request.secretHeaders)
        flight.secretURL = entry.request.secretURL
        flight.headerGeneration = entry.headerGeneration
        flight.signingKeyID = request.awsSigV4?.accessKeyID
        flight.s3ExistingHead = headFirst
        if part != nil { flights.slots.hostLoad[host, default: 0] += 1 }
        let mailbox = self.mailbox
        // Progress only feeds events and the display: with neither, curl is not asked for it
        // (two mailbox posts per small request otherwise).
        var progress: (@Sendable (Int64, Int64) -> Void)?
        if eventsEnabled || progressDisplay != nil {
            progress = { sent, _ in mailbox.post(.progress(token: token, sent: sent)) }
        }
        // A whole entry's transfer holds its slot; parts are counted by their entry. An entry
        // whose settle may wait for a plugin keeps the slot past its request's end.
        flight.transferID = http!.start(
            request, host: host, slot: part == nil, standby: isStandby, keepsSlot: part == nil && settleMayWaitForPlugin(entry),
            progress: progress,
            completion: { result in mailbox.post(.transferDone(token: token, result: result)) })
        flights.byToken[token] = flight
        if isStandby { flights.standby[flight.transferID] = StandbyTransfer(token: token, entryID: flight.entryID, host: host) }
        summary.attempts += 1
    }

    /// The values of the secret headers `flight` carried as sent: the config's and the
    /// entry's secret names, and the session token an S3 signature adds; for a signed
    /// request also its key id and the signature libcurl computed (S3 errors quote both), and
    /// the credentials of the URL's userinfo, and the path and query of a URL from `env`.
    func secretValues(of flight: Flight, result: HTTPResult) -> [[UInt8]] {
        let values = HeaderRules.secretValues(
            flight.sentHeaders.map { ($0.name, $0.value) },
            names: config.redactedHeaderNames.union(flight.secretHeaders).union(["x-amz-security-token"]))
        // A URL's password is a credential too, and libcurl sends it as `Authorization: Basic`.
        let fromURL = URLCheck.credentialValues(flight.url) + (flight.secretURL ? URLCheck.secretPathTexts(flight.url) : [])
        let signing = ([flight.signingKeyID, result.signature].compactMap { $0 } + fromURL)
            .map { Array($0.utf8) }.filter { $0.count >= 6 }
        return HeaderRules.withEscapedForms(values + signing)
    }
}
