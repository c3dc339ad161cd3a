import OutboxHTTP
import OutboxModel
import OutboxStore

/// Limits progress events to a few a second per entry (SPEC 9), whatever the part count.
struct ProgressGate {
    static let intervalMs: Int64 = 250
    private var last: [String: Int64] = [:]

    /// Whether an event for `id` may go out now; `force` (a final count) always may.
    mutating func allow(_ id: String, now: Int64, force: Bool) -> Bool {
        if !force, let previous = last[id], now - previous < Self.intervalMs { return false }
        if last.count > 4096 {
            // Long runs see many ids: forget the ones that have been quiet for a while.
            last = last.filter { now - $0.value < Self.intervalMs }
        }
        last[id] = now
        return true
    }
}

extension Runner {
    /// Sends an event to the sink and to the live display.
    func publish(_ event: JSON) {
        emit(event)
        progressDisplay?.observe(event)
    }

    /// A progress event: bytes sent (accepted plus in flight) and bytes accepted, throttled.
    func emitProgress(_ entry: Entry, sent: Int64, accepted: Int64, force: Bool) {
        guard eventsEnabled || progressDisplay != nil,
              progressGate.allow(entry.id, now: Identifiers.monotonicMs(), force: force) else { return }
        publish(.object([("type", .string("progress")), ("id", .string(entry.id)), ("bytes_sent", .int64(sent)),
                         ("bytes_accepted", .int64(accepted)), ("total_bytes", .int64(entry.totalBytes))]))
    }

    /// Bytes of the parts accepted so far.
    static func acceptedBytes(_ job: PartJob) -> Int64 {
        job.parts.reduce(Int64(0)) { $0 + ($1.accepted ? $1.range.count : 0) }
    }

    /// Accepted bytes plus what the parts in flight have sent.
    func entryBytesSent(_ entry: Entry, job: PartJob) -> Int64 {
        Self.acceptedBytes(job) + job.sentByPart.filter { job.inFlight.contains($0.key) }.values.reduce(0, +)
    }

    /// Marks a part accepted in memory and queues the durable change.
    func recordPartAccepted(_ job: inout PartJob, position: Int, result: HTTPResult) {
        let headers = Self.headersJSON(result.headers)
        job.parts[position].accepted = true
        job.parts[position].status = result.status
        job.parts[position].responseHeaders = headers
        job.parts[position].nextAttemptAt = nil
        changes.append(.partAccepted(entrySeq: job.entry.seq, index: job.parts[position].index, status: result.status ?? 0,
                                     headers: headers))
        changes.append(.progress(entryID: job.entry.id, bytesSent: Self.acceptedBytes(job)))
    }

    /// Stops a chunked entry's parts: none starts again, and those in flight are aborted.
    func stopParts(_ id: String) {
        guard var job = partJobs[id] else { return }
        job.failed = true
        partJobs[id] = job
        for flight in flights.values where flight.entryID == id {
            http?.cancel(flight.transferID)
        }
    }

    /// Drops a stopped job once nothing of it is in flight, freeing its entry's slot.
    func releaseStoppedParts(_ id: String) {
        guard let job = partJobs[id], job.failed, job.inFlight.isEmpty else { return }
        partJobs[id] = nil
        running[id] = nil
    }

    /// A part that returns after its entry settled: an acceptance is still recorded, so a
    /// reopened entry never sends that part again.
    func partReturnedAfterSettle(_ flight: Flight, result: HTTPResult) {
        guard let index = flight.partIndex, var job = partJobs[flight.entryID] else { return }
        job.inFlight.remove(index)
        job.sentByPart[index] = nil
        if result.failure == nil, let position = job.parts.firstIndex(where: { $0.index == index }), !job.parts[position].accepted {
            let klass = AttemptClassifier.classify(status: result.status, failure: nil, body: result.body,
                                                   accept: job.entry.request.accept, exempt: Set(job.entry.request.retry.exempt))
            if case .success = klass { recordPartAccepted(&job, position: position, result: result) }
        }
        partJobs[flight.entryID] = job.inFlight.isEmpty ? nil : job
    }
}
