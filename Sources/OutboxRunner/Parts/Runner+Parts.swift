import OutboxHTTP
import OutboxModel
import OutboxStore

/// Parts: a chunked entry's parts in flight, their acceptance, and the entry's settle once
/// every part is accepted. Accepted parts are durable the moment they are classified, so a
/// crash never sends an accepted part again.
extension Runner {
    /// Starts the next parts of chunked entries, as the scheduler decides.
    func pumpParts(now: Int64) throws(OutboxError) {
        for (id, job) in flights.partJobs {
            guard let entry = flights.running[id], !job.failed else {
                // A stopped entry's job lives until its parts in flight have returned.
                if job.inFlight.isEmpty {
                    dropIdleJob(job)
                    if job.failed { flights.running[id] = nil }
                }
                continue
            }
            if s3StepBeforeParts(entry, job: job) { continue }
            let decision = scheduler.nextParts(
                of: entry, parts: job.parts, inFlight: job.inFlight, hostLoad: flights.slots.hostLoad,
                now: now, stop: partStop(entry, now: now), heldHosts: hostHealth.held, payloadProblem: { payloadProblem(entry) })
            switch decision {
            case .complete where entry.request.s3 != nil:
                startS3Step(.complete, entry: entry, target: entry.request.s3!)
            case .complete:
                flights.partJobs[id] = nil
                settleParts(entry, job: job)
            case .expire:
                stopParts(id, cancelInFlight: entry.request.s3 == nil)
                settleError(
                    entry, kind: .expired, message: "the entry expired before all its parts were accepted",
                    state: .error, reason: "expired")
            case let .fileProblem(problem):
                stopParts(id, cancelInFlight: entry.request.s3 == nil)
                settleError(entry, kind: .file, message: problem, state: .error, reason: "file")
            case .stop(.paused):
                // Accepted parts are kept; the rest is sent after `outbox resume`.
                flights.partJobs[id] = nil
                flights.running[id] = nil
                changes.append(.requeue(entryID: id))
                emitState(entry, state: .paused, reason: nil)
            case let .stop(.held(reason, until)):
                flights.partJobs[id] = nil
                flights.running[id] = nil
                changes.append(.reschedule(entryID: id, nextAttemptAt: until, reason: reason.rawValue))
                emitState(entry, state: .queued, reason: reason.rawValue)
            case let .send(indexes, giveBackUntil):
                for index in indexes {
                    guard let part = job.parts.first(where: { $0.index == index }) else { continue }
                    flights.partJobs[id]?.inFlight.insert(index)
                    startTransfer(entry, part: part, host: URLCheck.hostKey(part.url))
                }
                if let next = giveBackUntil {
                    // Every slot waits for a retry: give the entry's slot back until the earliest is due.
                    flights.partJobs[id] = nil
                    flights.running[id] = nil
                    changes.append(.reschedule(entryID: id, nextAttemptAt: next, reason: "part retry"))
                    emitState(entry, state: .queued, reason: "part retry")
                }
            }
        }
    }

    /// Why no more parts of this entry may start now: a pause seen since its claim, or Wi-Fi
    /// gone for a wifi-only entry (checked between parts, at most once per interval).
    func partStop(_ entry: Entry, now: Int64) -> PartStop? {
        if control.isPaused(key: entry.key) { return .paused }
        if entry.request.wifiOnly ?? control.wifiOnly, !isOnWifi(now: now) {
            return .held(.wifi, until: max(now + 1, wifiGate.nextCheck(now: now)))
        }
        return nil
    }

    func partFinished(
        _ entry: Entry, index: Int, klass: AttemptOutcomeClass, result: HTTPResult, sentWith headerGeneration: Int64, now: Int64
    ) throws(OutboxError) {
        guard var job = flights.partJobs[entry.id] else { return }
        job.inFlight.remove(index)
        job.sentByPart[index] = nil
        guard let position = job.parts.firstIndex(where: { $0.index == index }) else {
            flights.partJobs[entry.id] = job
            return
        }
        if case .success = klass {
            // A referenced file rewritten while this part was read: the part may hold mixed
            // bytes, so it is not accepted and the entry stops.
            if Self.keepsFileIdentity(entry), !job.failed, let problem = payloadProblem(entry, bodyFileAtEnd: result.bodyFileAtEnd) {
                flights.partJobs[entry.id] = job
                stopParts(entry.id, cancelInFlight: entry.request.s3 == nil)
                settleError(
                    entry, kind: .file, message: "\(problem), while part \(index + 1) was being sent", state: .error, reason: "file")
                releaseStoppedParts(entry.id)
                return
            }
            // Durable the moment it is classified: flushed in this turn's transaction.
            recordPartAccepted(&job, position: position, result: result)
        }
        flights.partJobs[entry.id] = job
        if job.failed {
            // The entry already stopped (parked, rescheduled): keep the acceptance, start nothing.
            releaseStoppedParts(entry.id)
            return
        }
        let part = job.parts[position]
        switch klass {
        case .success:
            let accepted = job.acceptedBytes
            emitProgress(entry, sent: job.bytesSent, accepted: accepted, force: accepted == entry.totalBytes)
        case .retry:
            job.parts[position].attempts += 1
            let next = Backoff.nextAttemptAt(
                now: now, failures: job.parts[position].attempts, policy: entry.request.retry.backoff,
                retryAfterSeconds: result.retryAfterSeconds,
                retryAfterDate: result.retryAfterDate, expiresAt: entry.expiresAt,
                random: Double.random(in: 0..<1))
            job.parts[position].nextAttemptAt = next
            changes.append(.partRetry(entrySeq: entry.seq, index: index, nextAttemptAt: next, status: result.status))
            flights.partJobs[entry.id] = job
            summary.retried += 1
        case .awaitingAuth:
            stopParts(entry.id)
            authRefused(entry, sentWith: headerGeneration, now: now)
            releaseStoppedParts(entry.id)
        case .terminal:
            // An s3 upload's parts in flight finish, so the abort that follows comes after them.
            stopParts(entry.id, cancelInFlight: entry.request.s3 == nil)
            let status = result.status.map(String.init) ?? "none"
            let what =
                "part \(index + 1) of \(job.parts.count) (index \(index), bytes \(part.range.start)-\(max(part.range.start, part.range.end - 1)))"
            let refusal = Self.s3Refusal(entry, body: result.body).map { ": \($0)" } ?? ""
            let message = result.failure.map { "\(what) failed: \($0.message)" } ?? "\(what) was refused with status \(status)\(refusal)"
            let error = OutcomePayloads.error(
                .http, message, status: result.status, partIndex: index, body: result.body, bodyCut: result.bodyTruncated)
            changes.append(.partRefused(entrySeq: entry.seq, index: index, status: result.status))
            settleWithError(
                entry, error: error, response: result, state: .error, reason: "http",
                requestID: flights.running[entry.id]?.lastRequestID ?? "")
            releaseStoppedParts(entry.id)
        }
    }

    func settleParts(_ claimed: Entry, job: PartJob, result: HTTPResult? = nil) {
        var entry = flights.running[claimed.id] ?? claimed
        entry.bytesSent = entry.totalBytes
        changes.append(.progress(entryID: entry.id, bytesSent: entry.totalBytes))
        flights.running[entry.id] = nil
        settleSuccess(
            entry, result: result, parts: OutcomePayloads.parts(job.parts), requestID: entry.lastRequestID ?? "",
            s3Parts: entry.request.s3 != nil ? job.parts : nil)
    }

    /// Marks a part accepted in memory and queues the durable change.
    func recordPartAccepted(_ job: inout PartJob, position: Int, result: HTTPResult) {
        let headers = OutcomePayloads.headers(result.headers)
        job.parts[position].accepted = true
        job.parts[position].status = result.status
        job.parts[position].responseHeaders = headers
        job.parts[position].nextAttemptAt = nil
        changes.append(
            .partAccepted(
                entrySeq: job.entry.seq, index: job.parts[position].index, status: result.status ?? 0,
                headers: headers))
        changes.append(.progress(entryID: job.entry.id, bytesSent: job.acceptedBytes))
    }

    /// Stops a chunked entry's parts: none starts again, and those in flight are aborted
    /// (or, with `cancelInFlight` false, left to finish). An s3 upload about to be aborted
    /// lets them finish: S3 may still store a part whose bytes all arrived before the abort.
    func stopParts(_ id: String, cancelInFlight: Bool = true) {
        guard flights.partJobs[id] != nil else { return }
        flights.partJobs[id]?.failed = true
        guard cancelInFlight else { return }
        for flight in flights.byToken.values where flight.entryID == id {
            http?.cancel(flight.transferID)
        }
    }

    /// Drops a stopped job once nothing of it is in flight, freeing its entry's slot.
    func releaseStoppedParts(_ id: String) {
        guard let job = flights.partJobs[id], job.failed, job.inFlight.isEmpty else { return }
        dropIdleJob(job)
        flights.running[id] = nil
    }

    /// Forgets a job with no part in flight; an upload whose abort waited for them is aborted now.
    func dropIdleJob(_ job: PartJob) {
        flights.partJobs[job.entry.id] = nil
        if job.abortWhenIdle, let target = job.entry.request.s3, let uploadID = job.s3UploadID {
            startS3Step(.abort, entry: job.entry, target: target, uploadID: uploadID)
        }
    }

    /// A part that returns after its entry settled: an acceptance is still recorded, so a
    /// reopened entry never sends that part again.
    func partReturnedAfterSettle(_ flight: Flight, result: HTTPResult) {
        guard let index = flight.partIndex, var job = flights.partJobs[flight.entryID] else { return }
        recordLateAttempt(job.entry, flight: flight, result: result, now: Identifiers.nowMs())
        job.inFlight.remove(index)
        job.sentByPart[index] = nil
        if result.failure == nil, let position = job.parts.firstIndex(where: { $0.index == index }), !job.parts[position].accepted {
            if case .success = Self.classify(result, for: job.entry) { recordPartAccepted(&job, position: position, result: result) }
        }
        if job.inFlight.isEmpty { dropIdleJob(job) } else { flights.partJobs[flight.entryID] = job }
    }
}
