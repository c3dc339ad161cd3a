import OutboxHTTP
import OutboxModel
import OutboxStore

/// `skip_existing`: a HEAD of the object before its upload. An object of the same size and
/// SHA-256 checksum completes the entry without sending it; a 404 (or another object) is
/// uploaded; any other answer is the attempt's result, classified as any other.
extension Runner {
    /// The HEAD that decides whether an object is uploaded: the object's URL, signed, asking
    /// S3 for the object's checksum; none of the upload's own headers.
    func s3ExistingHead(_ request: inout HTTPRequest) {
        let uploadOnly: Set<String> = [
            "content-type", S3Checksum.header, S3Checksum.algorithmHeader, "x-amz-storage-class",
        ]
        request.method = "HEAD"
        request.body = .none
        request.headers.removeAll { uploadOnly.contains($0.name.lowercased()) }
        request.headers.append((name: S3Existing.checksumModeHeader.0, value: S3Existing.checksumModeHeader.1))
        request.expectedFile = nil
    }

    /// What a HEAD of an s3 entry's object found, for the entry and, with parts, its plan.
    func s3Existing(_ entry: Entry, result: HTTPResult, parts: [StoredPart]?) -> S3Existing {
        var headers: [String: String] = [:]
        for (name, value) in result.headers { headers[name] = value }
        let checksum: String?
        if let parts {
            checksum = S3Checksum.composite(
                parts.sorted { $0.index < $1.index }.compactMap { p in
                    p.headers.first { $0.0.lowercased() == S3Checksum.header }?.1
                })
        } else {
            checksum = HeaderRules.value(entry.request.headers, S3Checksum.header)
        }
        return S3Existing.decide(
            status: result.status, headers: headers, size: entry.totalBytes, checksum: checksum, parts: parts?.count ?? 0)
    }

    /// The HEAD of a whole-file entry returned. True when it decided the attempt (skipped, or
    /// the upload started); false when it failed, to be classified as the attempt's result.
    func s3ExistingHeadFinished(_ entry: Entry, flight: Flight, result: HTTPResult, now: Int64) -> Bool {
        switch s3Existing(entry, result: result, parts: nil) {
        case .failed:
            return false
        case let .upload(reason):
            log("outbox: \(entry.id): uploading: \(reason)", level: .debug, fields: [("id", .string(entry.id))])
            // A HEAD that finds no such object is part of the upload's attempt (its event and
            // count), not one of its own.
            summary.attempts -= 1
            // The upload waits for a slot like a claimed request: the HEAD's slot may have
            // been handed to another request as it ended.
            flights.slots.hostStandby[flight.host, default: 0] += 1
            startTransfer(entry, part: nil, host: flight.host, standby: true, probed: true)
            return true
        case .skip:
            skipUpload(entry, flight: flight, result: result, now: now, parts: nil)
            return true
        }
    }

    /// Completes an entry whose object is already there: the HEAD is its attempt, counted as
    /// `skipped`, and its outcome says so.
    func skipUpload(_ entry: Entry, flight: Flight, result: HTTPResult, now: Int64, parts: [StoredPart]?) {
        var entry = entry
        counters.add(.attempts, [("key", entry.key), ("result", "skipped")], by: 1)
        counters.observeDuration(microseconds: result.durationMicroseconds)
        let event = OutcomePayloads.attemptEvent(
            entry, requestID: flight.requestID, attempt: flight.attempt, url: flight.url, method: flight.method,
            partIndex: nil, result: result, outcome: .success, at: now, secrets: { self.secretValues(of: flight, result: result) })
        emit(event)
        changes.append(.attempt(entryID: entry.id, generation: entry.generation, at: now, payload: event, requestID: flight.requestID))
        if flight.s3Step != nil { flights.running[entry.id]?.attempts = flight.attempt }
        entry.lastRequestID = flight.requestID
        flights.partJobs[entry.id] = nil
        log("outbox: \(entry.id): the object is already there; not uploaded", level: .debug, fields: [("id", .string(entry.id))])
        settleSuccess(
            entry, result: result, parts: nil, requestID: flight.requestID, s3Parts: parts, skipped: true)
    }
}
