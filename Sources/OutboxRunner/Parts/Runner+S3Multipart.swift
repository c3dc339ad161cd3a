import OutboxHTTP
import OutboxModel
import OutboxStore

/// The steps of an s3 multipart upload around its parts: CreateMultipartUpload before the
/// first part (its id recorded before any part is sent), CompleteMultipartUpload with the
/// parts' ETags once all are accepted, a HEAD of the object when the upload is gone (a
/// Complete that succeeded before a crash), and AbortMultipartUpload when the entry settles error.
/// With `skip_existing`, a HEAD of the object (`exists`) comes before the create.
enum S3Step: Sendable, Equatable {
    case exists, create, complete, head, abort
}

extension Runner {
    /// For a multipart s3 entry: true when a step runs or has just been started, so no part
    /// may start now (there is no upload yet).
    func s3StepBeforeParts(_ entry: Entry, job: PartJob) -> Bool {
        guard let target = entry.request.s3 else { return false }
        if job.s3Step != nil { return true }
        guard job.s3UploadID == nil else { return false }
        startS3Step(target.skipExisting && !job.s3Checked ? .exists : .create, entry: entry, target: target)
        return true
    }

    /// Starts the step of an entry's upload; `.abort` is sent for an entry already settled.
    func startS3Step(_ step: S3Step, entry: Entry, target: S3Target, uploadID known: String? = nil) {
        let uploadID = known ?? flights.partJobs[entry.id]?.s3UploadID ?? ""
        let encodedID = URLCheck.encodeComponent(uploadID)
        let requestID = Identifiers.uuid(using: &requestIDs)
        var headers = baseHeaders(entry, requestID: requestID).filter { $0.name.lowercased() != "x-amz-storage-class" }
        var url = target.objectURL
        var method = "POST"
        var body = HTTPBody.none
        switch step {
        case .create:
            // The storage class and content type are the upload's, given when it starts, and
            // the parts' checksums are SHA-256.
            headers = baseHeaders(entry, requestID: requestID)
            headers.append((name: "x-amz-checksum-algorithm", value: "SHA256"))
            url += "?uploads="
        case .complete:
            url += "?uploadId=\(encodedID)"
            let parts = flights.partJobs[entry.id]?.parts ?? []
            body = .bytes(Array(Self.completeXML(parts).utf8))
            headers.removeAll { $0.name.lowercased() == "content-type" }
            headers.append((name: "Content-Type", value: "application/xml"))
        case .head:
            method = "HEAD"
        case .exists:
            method = "HEAD"
            headers.append((name: S3Existing.checksumModeHeader.0, value: S3Existing.checksumModeHeader.1))
        case .abort:
            method = "DELETE"
            url += "?uploadId=\(encodedID)"
        }
        if step != .create && step != .complete { headers.removeAll { $0.name.lowercased() == "content-type" } }
        var request = HTTPRequest(
            url: url, method: method, headers: headers, body: body, followRedirects: 0,
            connectTimeoutMs: Int(config.connectTimeoutMs), stallBelowBytesPerSecond: Int(config.stallBelowBytes),
            stallForMs: Int(config.stallForMs), caFile: config.caFile, maxResponseBytes: Int(config.maxResponseBytes),
            userAgent: Self.userAgent)
        (request.clientCert, request.clientKey) = (config.clientCert, config.clientKey)
        request.totalTimeoutMs = Int(config.attemptTimeoutMs ?? 0)
        signS3(&request, target: target)
        let token = flights.nextToken
        flights.nextToken += 1
        let host = URLCheck.hostKey(url)
        // Create, Complete and the HEAD after a lost upload count as the parts do (one number
        // a request, the hook's `meta.attempts` their total); the existence check counts only
        // when it skips the upload (`skipUpload`), the abort never.
        let attempt = (flights.running[entry.id]?.attempts ?? entry.attempts) + 1
        if step == .create || step == .complete || step == .head { flights.running[entry.id]?.attempts = attempt }
        var flight = Flight(
            entryID: entry.id, partIndex: nil, requestID: requestID, host: host, url: url, method: method, attempt: attempt)
        flight.s3Step = step
        if step == .abort { flight.abortedUpload = (entry.seq, uploadID) }
        (flight.sentHeaders, flight.secretHeaders) = (request.headers, entry.request.secretHeaders)
        flight.headerGeneration = entry.headerGeneration
        flight.signingKeyID = request.awsSigV4?.accessKeyID
        flights.slots.hostLoad[host, default: 0] += 1
        if step != .abort { flights.partJobs[entry.id]?.s3Step = step }
        let mailbox = self.mailbox
        flight.transferID = http!.start(
            request, host: host, slot: false, standby: false, progress: nil,
            completion: { result in mailbox.post(.transferDone(token: token, result: result)) })
        flights.byToken[token] = flight
        // The abort is cleanup after the entry settled: no attempt, in the summary either.
        if step != .abort { summary.attempts += 1 }
    }

    static func completeXML(_ parts: [StoredPart]) -> String {
        var xml = "<CompleteMultipartUpload>"
        for part in parts.sorted(by: { $0.index < $1.index }) {
            let etag = part.responseHeaders?["etag"]?.stringValue ?? ""
            xml += "<Part><PartNumber>\(part.index + 1)</PartNumber><ETag>\(xmlEscaped(etag))</ETag>"
            if let sum = part.headers.first(where: { $0.0.lowercased() == S3Checksum.header })?.1 {
                xml += "<ChecksumSHA256>\(xmlEscaped(sum))</ChecksumSHA256>"
            }
            xml += "</Part>"
        }
        return xml + "</CompleteMultipartUpload>"
    }

    static func xmlEscaped(_ s: String) -> String {
        var out = ""
        for c in s {
            switch c {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            default: out.append(c)
            }
        }
        return out
    }

    /// The text of the first `<name>` element of an S3 answer.
    static func xmlElement(_ name: String, in body: [UInt8]) -> String? {
        let text = String(decoding: body, as: UTF8.self)
        guard let open = text.firstRange(of: "<\(name)>"), let close = text[open.upperBound...].firstRange(of: "</\(name)>") else {
            return nil
        }
        return String(text[open.upperBound..<close.lowerBound])
    }

    func s3StepFinished(_ flight: Flight, step: S3Step, result: HTTPResult) throws(OutboxError) {
        summary.bytesSent += result.bytesSent
        if step == .abort {
            if result.status.map({ (200...299).contains($0) || $0 == 404 }) != true {
                let why = result.failure?.message ?? "HTTP \(result.status ?? 0)"
                log(
                    "outbox: the multipart upload of \(flight.entryID) was not aborted (\(why)); a bucket lifecycle rule removes it",
                    level: .warn)
            } else if let aborted = flight.abortedUpload {
                // Gone for good: `retry --errors` starts the entry over with a new upload.
                try store.forgetS3Upload(entrySeq: aborted.entrySeq, uploadID: aborted.uploadID)
                log(
                    "outbox: aborted the multipart upload of \(flight.entryID) (HTTP \(result.status ?? 0))",
                    fields: [("id", .string(flight.entryID))])
            }
            return
        }
        guard var entry = flights.running[flight.entryID], var job = flights.partJobs[flight.entryID] else { return }
        job.s3Step = nil
        flights.partJobs[entry.id] = job
        if job.failed {
            releaseStoppedParts(entry.id)
            return
        }
        try noteHostHealth(flight.host, entry: entry, result: result)
        let now = Identifiers.nowMs()
        if step == .exists {
            switch s3Existing(entry, result: result, parts: job.parts) {
            case .skip:
                skipUpload(entry, flight: flight, result: result, now: now, parts: job.parts)
                return
            case let .upload(reason):
                log("outbox: \(entry.id): uploading: \(reason)", level: .debug, fields: [("id", .string(entry.id))])
                // Part of the create's attempt, as for a whole file.
                summary.attempts -= 1
                flights.partJobs[entry.id]?.s3Checked = true
                startS3Step(.create, entry: entry, target: entry.request.s3!)
                return
            case .failed:
                break
            }
        }
        var klass =
            Self.s3CredentialsToRenew(result) || Self.s3HeadTokenRefused(flight, result)
            ? .awaitingAuth
            : AttemptClassifier.classify(
                status: result.status, failure: result.failure, body: result.body, accept: [], exempt: Set(entry.request.retry.exempt))
        let body = String(decoding: result.body, as: UTF8.self)
        // S3 may answer 200 and put an error in the body: to be retried. A result names the
        // object's ETag (its root is CompleteMultipartUploadResult; ...Response on some S3-compatible servers).
        if step == .complete, case .success = klass, body.contains("<Error>") || Self.xmlElement("ETag", in: result.body) == nil {
            let code = Self.xmlElement("Code", in: result.body).map { AttemptClassifier.cut($0, bytes: 100) }
            klass = .retry(reason: "CompleteMultipartUpload answered 200 with \(code ?? "no result")")
        }
        // The HEAD after a lost upload that finds no object settles the entry `error` (below):
        // its attempt says so, whatever a 404 of a part would be.
        if step == .head, result.status == 404 { klass = .terminal(reason: "the multipart upload is gone and there is no object") }
        // Create, Complete and the HEAD after a lost upload are attempts like the parts: in
        // the events and the entry's attempt log.
        let event = OutcomePayloads.attemptEvent(
            entry, requestID: flight.requestID, attempt: flight.attempt, url: flight.url, method: flight.method,
            partIndex: nil, result: result, outcome: klass, at: now, secrets: { self.secretValues(of: flight, result: result) })
        countAttempt(entry, klass: klass, result: result)
        emit(event)
        changes.append(.attempt(entryID: entry.id, generation: entry.generation, at: now, payload: event, requestID: flight.requestID))
        if step == .complete, result.status == 404, body.contains("NoSuchUpload") {
            // Completed before a crash (or aborted elsewhere): the object says which.
            startS3Step(.head, entry: entry, target: entry.request.s3!)
            return
        }
        entry.lastRequestID = flight.requestID
        switch (step, klass) {
        case (.create, .success):
            flights.s3StepFailures[entry.id] = nil
            guard let uploadID = Self.xmlElement("UploadId", in: result.body), !uploadID.isEmpty else {
                failStep(entry, "CreateMultipartUpload answered without an UploadId", result: result, requestID: flight.requestID)
                return
            }
            // Committed now, before any part of the upload can be sent.
            try store.setS3UploadID(entrySeq: entry.seq, uploadID)
            flights.partJobs[entry.id]?.s3UploadID = uploadID
        case (.complete, .success):
            flights.s3StepFailures[entry.id] = nil
            flights.partJobs[entry.id] = nil
            settleParts(entry, job: job, result: result)
        case (.head, .success):
            let etag = result.header("etag") ?? ""
            let size = result.header("content-length").flatMap { Int64($0) }
            if etag.hasSuffix("-\(job.parts.count)\"") && size == entry.totalBytes {
                flights.partJobs[entry.id] = nil
                settleParts(entry, job: job, result: result)
            } else {
                // The status is the HEAD's (200): the message says what Complete was answered and what the HEAD found.
                let found = "ETag \(etag.isEmpty ? "none" : etag), \(size.map { "\($0) bytes" } ?? "no size")"
                failStep(
                    entry,
                    "CompleteMultipartUpload: the multipart upload is gone (NoSuchUpload) and the object is not its result "
                        + "(a HEAD found \(found); the upload has \(job.parts.count) parts, \(entry.totalBytes) bytes)",
                    result: result, requestID: flight.requestID)
            }
        case (.head, _) where result.status == 404:
            failStep(
                entry, "the multipart upload is gone (NoSuchUpload) and there is no object", result: result, requestID: flight.requestID)
        case let (_, .retry(reason)):
            flights.partJobs[entry.id] = nil
            flights.running[entry.id] = nil
            let failures = flights.s3StepFailures[entry.id, default: 0] + 1
            flights.s3StepFailures[entry.id] = failures
            let next = Backoff.nextAttemptAt(
                now: now, failures: failures, policy: entry.request.retry.backoff,
                retryAfterSeconds: result.retryAfterSeconds,
                retryAfterDate: result.retryAfterDate, expiresAt: entry.expiresAt, random: Double.random(in: 0..<1))
            changes.append(.reschedule(entryID: entry.id, nextAttemptAt: next, reason: reason))
            emitState(entry, state: .queued, reason: reason)
            summary.retried += 1
        case (_, .awaitingAuth):
            flights.partJobs[entry.id] = nil
            flights.running[entry.id] = nil
            authRefused(entry, sentWith: flight.headerGeneration, now: now)
        case (_, .terminal), (.abort, _), (_, .success):
            let name = step == .create ? "CreateMultipartUpload" : step == .complete ? "CompleteMultipartUpload" : "HEAD of the object"
            let refusal = Self.s3Refusal(entry, body: result.body).map { " (\($0))" } ?? ""
            failStep(entry, "\(name): \(Self.reason(klass))\(refusal)", result: result, requestID: flight.requestID)
        }
    }

    private static func reason(_ klass: AttemptOutcomeClass) -> String {
        if case let .terminal(reason) = klass { return reason }
        return klass.name
    }

    private func failStep(_ entry: Entry, _ message: String, result: HTTPResult, requestID: String) {
        flights.s3StepFailures[entry.id] = nil
        flights.partJobs[entry.id] = nil
        flights.running[entry.id] = nil
        let error = OutcomePayloads.error(
            .http, message, status: result.status, body: result.body, bodyCut: result.bodyTruncated)
        settleWithError(entry, error: error, response: result, state: .error, reason: "http", requestID: requestID)
    }

    /// The `s3` object of a success outcome: the object's ETag and SHA-256 checksum, as S3
    /// answered them, else as outbox sent them (for parts, S3's checksum of their checksums).
    static func s3Outcome(_ entry: Entry, result: HTTPResult?, parts: [StoredPart]?, skipped: Bool = false) -> JSON {
        let etag = result?.header("etag") ?? result.flatMap { xmlElement("ETag", in: $0.body) }.map(xmlUnescaped)
        var checksum = result?.header(S3Checksum.header) ?? result.flatMap { xmlElement("ChecksumSHA256", in: $0.body) }
        if let parts {
            let sums = parts.sorted { $0.index < $1.index }.compactMap { p in p.headers.first { $0.0.lowercased() == S3Checksum.header }?.1
            }
            // A server answering the bare composite (moto) is reported in S3's `BASE64-N` form.
            if sums.count == parts.count, let composite = S3Checksum.composite(sums),
                checksum == nil || "\(checksum!)-\(parts.count)" == composite
            {
                checksum = composite
            }
        }
        if checksum == nil { checksum = HeaderRules.value(entry.request.headers, S3Checksum.header) }
        return .object([
            ("bucket", .string(entry.request.s3?.bucket ?? "")), ("key", .string(entry.request.s3?.key ?? "")),
            ("etag", .optionalString(etag)), ("checksum_sha256", .optionalString(checksum)),
            ("parts", parts.map { .int($0.count) } ?? .int(0)), ("skipped", .bool(skipped)),
        ])
    }

    static func xmlUnescaped(_ s: String) -> String {
        s.replacing("&quot;", with: "\"").replacing("&lt;", with: "<").replacing("&gt;", with: ">").replacing("&amp;", with: "&")
    }

    /// An s3 entry settling error aborts its multipart upload, so its parts do not linger:
    /// at once, or when its parts in flight have returned.
    func abortS3Upload(_ entry: Entry) {
        guard let target = entry.request.s3, entry.isChunked,
            let uploadID = flights.partJobs[entry.id]?.s3UploadID ?? (try? store.s3UploadID(entrySeq: entry.seq)) ?? nil
        else { return }
        if let job = flights.partJobs[entry.id], !job.inFlight.isEmpty {
            flights.partJobs[entry.id]?.s3UploadID = uploadID
            flights.partJobs[entry.id]?.abortWhenIdle = true
            return
        }
        startS3Step(.abort, entry: entry, target: target, uploadID: uploadID)
    }
}
