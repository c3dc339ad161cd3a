/// The curl thread's standby jobs, oldest first. Taking one out (from the front, or by id)
/// moves no other job: a job is a large value, and `Array.remove(at:)` near the front moved
/// every later one, a tenth of the curl thread's work with hundreds waiting.
struct StandbyQueue {
    /// Jobs in arrival order; nil where one was taken out. Only slots from `head` on are live.
    private var slots: [CurlEngine.Job?] = []
    private var head = 0
    /// Where each waiting job is in `slots`.
    private var positions: [UInt64: Int] = [:]

    var isEmpty: Bool { positions.isEmpty }

    func contains(_ id: UInt64) -> Bool { positions[id] != nil }

    mutating func append(_ job: CurlEngine.Job) {
        positions[job.id] = slots.count
        slots.append(job)
    }

    /// The job with this id, taken out.
    mutating func remove(_ id: UInt64) -> CurlEngine.Job? {
        guard let index = positions[id] else { return nil }
        return take(at: index)
    }

    /// The oldest job that `fits`, taken out.
    mutating func removeFirst(where fits: (_ host: String) -> Bool) -> CurlEngine.Job? {
        var index = head
        while index < slots.count {
            if let host = slots[index]?.host, fits(host) { return take(at: index) }
            index += 1
        }
        return nil
    }

    /// Every waiting job, oldest first; the queue is left empty.
    mutating func removeAll() -> [CurlEngine.Job] {
        let jobs = slots[head...].compactMap { $0 }
        slots.removeAll()
        positions.removeAll()
        head = 0
        return jobs
    }

    private mutating func take(at index: Int) -> CurlEngine.Job {
        guard let job = slots[index] else { preconditionFailure("a standby slot is empty though its id maps to it") }
        slots[index] = nil
        positions[job.id] = nil
        while head < slots.count, slots[head] == nil { head += 1 }
        if head == slots.count {
            slots.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 64, head * 2 >= slots.count {
            // Mostly taken from the front: drop the empty half, so memory follows the jobs waiting.
            slots.removeFirst(head)
            for (id, position) in positions { positions[id] = position - head }
            head = 0
        }
        return job
    }
}
