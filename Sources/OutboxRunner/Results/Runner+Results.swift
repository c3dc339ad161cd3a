import OutboxHTTP
import OutboxModel
import OutboxStore

/// Results: what the curl thread and hook threads report, and what an attempt's result
/// means for its entry (success, retry, awaiting-auth, error).
extension Runner {
    func handle(_ event: RunnerEvent) throws(OutboxError) {
        switch event {
        case let .progress(token, sent):
            guard var flight = flights.byToken[token] else { return }
            flight.sent = sent
            flights.byToken[token] = flight
            if var job = flights.partJobs[flight.entryID], let index = flight.partIndex {
                job.sentByPart[index] = sent
                flights.partJobs[flight.entryID] = job
            }
            if let entry = flights.running[flight.entryID] {
                if let job = flights.partJobs[entry.id] {
                    emitProgress(entry, sent: job.bytesSent, accepted: job.acceptedBytes, force: false)
                } else {
                    let body = entry.bodyBytes(sent: sent)
                    emitProgress(entry, sent: body, accepted: 0, force: entry.totalBytes > 0 && body >= entry.totalBytes)
                }
            }
        case let .transferDone(token, result):
            if let next = result.startedInPlace { standbyStarted(next) }
            guard let flight = flights.byToken.removeValue(forKey: token) else { return }
            if flight.standby {
                // Aborted (or failed to start) before it ever started.
                flights.standby[flight.transferID] = nil
                flights.slots.hostStandby[flight.host, default: 1] -= 1
            } else {
                flights.slots.hostLoad[flight.host, default: 1] -= 1
            }
            try finished(flight, result: result)
            // The curl thread starts no more standby requests to a host that did not answer
            // until it hears whether the runner holds it.
            if result.connectionFailed {
                if hostHealth.held[flight.host] != nil { withdrawStandby(toHost: flight.host) } else { http?.trust(host: flight.host) }
            }
        case let .hookSlow(seq, pid):
            log(
                "outbox: the hook for \(delivery.hooksRunning[seq] ?? "?") (pid \(pid)) runs longer than \(Units.formatDuration(ms: config.hookWarnAfterMs)); waiting for it",
                level: .warn)
        case let .hookDone(seq, result):
            try hookFinished(seq: seq, result: result)
        case let .pluginDone(entryID, token, answer, abandoned):
            pluginFinished(entryID: entryID, token: token, answer: answer, abandoned: abandoned)
        case let .chainBuilt(seq, generation, built, abandoned):
            delivery.chainsBuilding.remove(seq)
            delivery.due = true
            // Killed by a stop at once: the next run builds it.
            if !abandoned { delivery.chainsBuilt[seq] = (generation, built) }
        case let .wifiChecked(answer, abandoned):
            try wifiChecked(answer, abandoned: abandoned)
        case let .authRefreshed(answer, abandoned):
            try authRefreshed(answer, abandoned: abandoned)
        case let .hookLinesBuilt(seq, result, abandoned):
            try hookLinesBuilt(seq: seq, result: result, abandoned: abandoned)
        }
    }

    func finished(_ flight: Flight, result: HTTPResult) throws(OutboxError) {
        // (A withdrawn entry's request may have started just before the abort reached the
        // curl thread; then it settles as usual, and the settle finds no row to change.)
        if let step = flight.s3Step {
            try s3StepFinished(flight, step: step, result: result)
            return
        }
        let withdrawal = flight.partIndex == nil ? flights.withdrawn.removeValue(forKey: flight.entryID) : nil
        guard var entry = flights.running[flight.entryID] else {
            // A part still in flight when its entry settled: keep an acceptance, nothing more.
            if flight.partIndex != nil { partReturnedAfterSettle(flight, result: result) }
            return
        }
        let now = Identifiers.nowMs()
        summary.bytesSent += result.bytesOnTheWire
        if withdrawal == false {
            // Cancelled by another process while in flight: the cancel was recorded first and
            // wins, whatever came back (it was reported when it was noticed).
            recordLateAttempt(entry, flight: flight, result: result, now: now)
            flights.running[entry.id] = nil
            return
        }
        if result.failure?.kind == .aborted {
            // Stopped by us (grace over, or withdrawn): not an attempt result; the entry goes
            // back to the queue when the run ends, or now if it was paused, or is dropped.
            // A request that went out counts and is reported as an attempt all the same.
            recordLateAttempt(entry, flight: flight, result: result, now: now)
            if let requeue = withdrawal {
                flights.running[entry.id] = nil
                if requeue {
                    changes.append(.requeue(entryID: entry.id))
                    // Withdrawn by a pause: shown as `list` shows it then.
                    let paused = control.isPaused(key: entry.key)
                    emitState(entry, state: paused ? .paused : .queued, reason: paused ? "paused" : entry.reason)
                }
                return
            }
            if let index = flight.partIndex {
                flights.partJobs[entry.id]?.inFlight.remove(index)
                releaseStoppedParts(entry.id)
            }
            return
        }
        try noteHostHealth(flight.host, entry: entry, result: result)
        if let failure = result.failure, failure.kind == .file, flight.partIndex == nil {
            // The referenced file went missing or changed before its request started (it
            // waited as a standby request), or the staged copy is damaged: settled like the
            // check at claim. Nothing was sent, so it was no attempt.
            flights.running[entry.id] = nil
            summary.attempts -= 1
            entry.attempts = flight.attempt - 1
            settleError(entry, kind: .file, message: failure.message, state: .error, reason: "file")
            return
        }
        if let failure = result.failure, failure.kind == .file, let index = flight.partIndex {
            // The body cannot be read for this part (a staged copy this user may not open, a
            // file that shrank): no part of it can be sent, now or later. The entry settles as a
            // whole entry does; its other parts stop.
            summary.attempts -= 1
            flights.partJobs[entry.id]?.inFlight.remove(index)
            flights.partJobs[entry.id]?.sentByPart[index] = nil
            if flights.partJobs[entry.id]?.failed == false {
                stopParts(entry.id, cancelInFlight: entry.request.s3 == nil)
                settleError(
                    entry, kind: .file, message: "\(failure.message) (part \(index + 1))", state: .error, reason: "file")
            }
            releaseStoppedParts(entry.id)
            return
        }
        if flight.s3ExistingHead, s3ExistingHeadFinished(entry, flight: flight, result: result, now: now) { return }
        let klass = Self.s3HeadTokenRefused(flight, result) ? .awaitingAuth : Self.classify(result, for: entry)
        countAttempt(entry, klass: klass, result: result)
        // A whole request that succeeds with nothing to deliver is forgotten in this very
        // transaction: its attempt log and progress would be deleted as they are written.
        // Not a referenced file that changed while it was read: that settles an error below.
        var forgottenAtOnce = false
        if case .success = klass, flight.partIndex == nil, !eventsEnabled, !outcomeNeeded(entry, outcome: .completed),
            !Self.keepsFileIdentity(entry) || payloadProblem(entry, bodyFileAtEnd: result.bodyFileAtEnd) == nil
        {
            forgottenAtOnce = true
        }
        if !forgottenAtOnce {
            // A 401/403 to headers older than the last update is sent again at once, not parked.
            let reported =
                klass == .awaitingAuth && flight.headerGeneration < control.headerGeneration
                ? AttemptOutcomeClass.retry(reason: "headers were updated since it was sent") : klass
            let event = OutcomePayloads.attemptEvent(
                entry, requestID: flight.requestID, attempt: flight.attempt, url: flight.url,
                method: flight.method, partIndex: flight.partIndex, result: result, outcome: reported,
                at: now, secrets: { self.secretValues(of: flight, result: result) })
            emit(event)
            changes.append(.attempt(entryID: entry.id, generation: entry.generation, at: now, payload: event, requestID: flight.requestID))
        }
        entry.lastRequestID = flight.requestID
        flights.running[entry.id] = entry

        if let index = flight.partIndex {
            try partFinished(entry, index: index, klass: klass, result: result, sentWith: flight.headerGeneration, now: now)
            return
        }
        flights.running[entry.id] = nil
        if forgottenAtOnce {
            settle(entry, payload: .object([]), outcome: .completed, state: .completed, reason: nil)
            return
        }
        // State events carry the row as it is after this attempt.
        entry.bytesSent = entry.bodyBytes(sent: result.bytesSent)
        changes.append(.progress(entryID: entry.id, bytesSent: entry.bytesSent))
        switch klass {
        case .success:
            // A referenced file rewritten while it was read may have sent a mix of old and
            // new bytes, and a moved one written to may hold more than was sent: checked
            // again after the last byte, it must still be the same file.
            if Self.keepsFileIdentity(entry), let problem = payloadProblem(entry, bodyFileAtEnd: result.bodyFileAtEnd) {
                let error = OutcomePayloads.error(.file, "\(problem), while it was being sent", status: result.status)
                settleWithError(entry, error: error, response: result, state: .error, reason: "file", requestID: flight.requestID)
                return
            }
            settleSuccess(entry, result: result, parts: nil, requestID: flight.requestID)
        case let .retry(reason):
            let next = Backoff.nextAttemptAt(
                now: now, failures: Int(entry.attempts), policy: entry.request.retry.backoff,
                retryAfterSeconds: result.retryAfterSeconds,
                retryAfterDate: result.retryAfterDate, expiresAt: entry.expiresAt,
                random: Double.random(in: 0..<1))
            changes.append(.reschedule(entryID: entry.id, nextAttemptAt: next, reason: reason))
            entry.nextAttemptAt = next
            emitState(entry, state: .queued, reason: reason)
            summary.retried += 1
        case .awaitingAuth:
            authRefused(entry, sentWith: flight.headerGeneration, now: now)
        case let .terminal(reason):
            // The reason names the failure: "HTTP 404", "redirect: too many redirects".
            let message = Self.s3Refusal(entry, body: result.body).map { "\(reason): \($0)" } ?? reason
            let error = OutcomePayloads.error(.http, message, status: result.status, body: result.body, bodyCut: result.bodyTruncated)
            settleWithError(entry, error: error, response: result, state: .error, reason: "http", requestID: flight.requestID)
        }
    }

    /// An attempt whose entry stopped or settled while it was in flight (aborted by us, or a
    /// part that finished after its entry settled): it is counted, logged and reported like
    /// any other, `outcome` `aborted` when we stopped it.
    func recordLateAttempt(_ entry: Entry, flight: Flight, result: HTTPResult, now: Int64) {
        // A standby request withdrawn before it started was never sent (the run counted it as
        // it was handed to the curl thread), nor was one stopped while it connected.
        guard !flight.standby, result.requestWentOut else {
            summary.attempts -= 1
            return
        }
        let klass = Self.classify(result, for: entry)
        var event = OutcomePayloads.attemptEvent(
            entry, requestID: flight.requestID, attempt: flight.attempt, url: flight.url,
            method: flight.method, partIndex: flight.partIndex, result: result, outcome: klass, at: now,
            secrets: { self.secretValues(of: flight, result: result) })
        let aborted = result.failure?.kind == .aborted
        if aborted { event.set("outcome", .string("aborted")) }
        countAttempt(entry, klass: klass, result: result, aborted: aborted)
        emit(event)
        changes.append(.attempt(entryID: entry.id, generation: entry.generation, at: now, payload: event, requestID: flight.requestID))
    }

    /// S3 answers a session token that expired or is not one with 400, not 403: it is a
    /// credential to renew like a refused key, not a request that can never succeed.
    static func s3CredentialsToRenew(_ result: HTTPResult) -> Bool {
        guard result.status == 400, let code = xmlElement("Code", in: result.body) else { return false }
        return ["ExpiredToken", "InvalidToken", "TokenRefreshRequired"].contains(code)
    }

    /// A HEAD has no body to say why: a 400 to a HEAD that carried a session token is taken
    /// for one that ran out, so a `skip_existing` queue waits for new credentials rather than
    /// fail every entry (an entry parked for another reason is sent again by `retry`).
    static func s3HeadTokenRefused(_ flight: Flight, _ result: HTTPResult) -> Bool {
        flight.method == "HEAD" && result.status == 400 && result.body.isEmpty
            && flight.sentHeaders.contains { $0.name.lowercased() == "x-amz-security-token" }
    }

    /// What an attempt's result means for its entry, by the entry's accept and retry rules.
    static func classify(_ result: HTTPResult, for entry: Entry) -> AttemptOutcomeClass {
        // A part of an S3 upload that is gone (aborted, or ended by a lifecycle rule) can never
        // land: a 404 retried by default would be sent until the entry expires.
        if entry.request.s3 != nil, result.status == 404, xmlElement("Code", in: result.body) == "NoSuchUpload" {
            return .terminal(reason: "the multipart upload is gone")
        }
        if entry.request.s3 != nil, s3CredentialsToRenew(result) { return .awaitingAuth }
        return AttemptClassifier.classify(
            status: result.status, failure: result.failure, body: result.body,
            accept: entry.request.accept, exempt: Set(entry.request.retry.exempt))
    }

    /// Adds an attempt to the store's counters, committed with the attempt's own changes;
    /// `aborted`: outbox stopped it (its event says `aborted`), whatever it would have led to.
    func countAttempt(_ entry: Entry, klass: AttemptOutcomeClass, result: HTTPResult, aborted: Bool = false) {
        let outcome: String
        var accepted = false
        switch klass {
        case _ where aborted: outcome = "aborted"
        case .success: (outcome, accepted) = ("success", true)
        case .retry: outcome = "retry"
        case .awaitingAuth: outcome = "auth"
        case .terminal: outcome = "error"
        }
        counters.addAttempt(
            key: entry.key, result: outcome, sentBytes: result.bytesOnTheWire, accepted: accepted,
            durationMicroseconds: result.durationMicroseconds)
    }

    /// A 401/403: parks the entry, unless it was sent with headers older than the latest
    /// `headers update` (`sentWith`), in which case it is sent again at once with the new ones.
    func authRefused(_ entry: Entry, sentWith headerGeneration: Int64, now: Int64) {
        if headerGeneration < control.headerGeneration {
            changes.append(.reschedule(entryID: entry.id, nextAttemptAt: now, reason: "auth"))
        } else {
            changes.append(.park(entryID: entry.id))
            emitState(entry, state: .awaitingAuth, reason: "auth")
            summary.parked += 1
            parkedInRun.append(entry.id)
        }
    }

    /// Standby requests to a held host go back to the queue, never sent: one request at a
    /// time probes it (the curl thread starts none of them on its own after a failed
    /// connection, see `CurlEngine.unansweredHosts`).
    func withdrawStandby(toHost host: String) {
        for (transferID, transfer) in flights.standby where transfer.host == host && flights.withdrawn[transfer.entryID] == nil {
            flights.withdrawn[transfer.entryID] = true
            http?.withdraw(transferID)
        }
    }

    /// Holds a host after consecutive connection failures, and releases it at its first
    /// answer. Entries waiting for a held host are looked at again whenever a request to it
    /// ends: released, or held until the next probe.
    func noteHostHealth(_ host: String, entry: Entry, result: HTTPResult) throws(OutboxError) {
        let wasHeld = hostHealth.held[host] != nil
        let change = hostHealth.record(
            host: host, answered: result.status != nil, connectionFailed: result.connectionFailed, now: Identifiers.nowMs(),
            backoff: entry.request.retry.backoff, random: Double.random(in: 0..<1))
        switch change {
        case let .held(host, failures):
            log(
                "outbox: holding \(host) after \(failures) connection failure\(failures == 1 ? "" : "s"): one request at a time until it answers",
                level: .warn)
        case let .released(host):
            log("outbox: \(host) answers again; its entries go on")
        case .probeFailed, nil:
            break
        }
        if change != nil { try store.setHeldHosts(hostHealth.held.keys.sorted()) }
        if wasHeld {
            try store.releaseHolds(now: Identifiers.nowMs(), reasons: [.host])
            readAhead.storeChanged()
        }
    }
}
