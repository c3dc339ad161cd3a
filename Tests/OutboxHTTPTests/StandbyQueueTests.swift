import Testing

@testable import OutboxHTTP

// The curl thread's queue of standby jobs against a plain array doing the same, through
// takes from the front, from the middle, by host and by id, across the queue's compactions.

@Suite struct StandbyQueueTests {
    static func job(_ id: UInt64, host: String) -> CurlEngine.Job {
        CurlEngine.Job(
            id: id, request: HTTPRequest(url: "http://\(host)/\(id)", method: "GET"), host: host, mode: .standby,
            progress: nil, completion: { _ in })
    }

    @Test func takesJobsOldestFirstByHostAndByIdAsAnArrayWould() {
        var queue = StandbyQueue()
        var model: [(id: UInt64, host: String)] = []
        var nextID: UInt64 = 0
        var random = SystemRandomNumberGenerator()
        func add(_ count: Int) {
            for _ in 0..<count {
                let host = ["a", "b", "c"][Int.random(in: 0..<3, using: &random)]
                queue.append(Self.job(nextID, host: host))
                model.append((nextID, host))
                nextID += 1
            }
        }
        add(300)
        for step in 0..<2_000 {
            if step % 7 == 0 { add(Int.random(in: 0..<20, using: &random)) }
            switch Int.random(in: 0..<4, using: &random) {
            case 0:
                // The oldest of a host, as a slot that ended hands over its place.
                let host = ["a", "b", "c"][Int.random(in: 0..<3, using: &random)]
                let got = queue.removeFirst(where: { $0 == host })
                let want = model.firstIndex { $0.host == host }.map { model.remove(at: $0) }
                #expect(got?.id == want?.id && got?.host == want?.host, "step \(step): host \(host)")
            case 1:
                // A promotion or withdrawal by id, of a waiting job or of one gone already.
                let id = UInt64.random(in: 0..<(nextID + 5), using: &random)
                let got = queue.remove(id)
                let want = model.firstIndex { $0.id == id }.map { model.remove(at: $0) }
                #expect(got?.id == want?.id, "step \(step): id \(id)")
                #expect(!queue.contains(id))
            default:
                // The front, the common case: many takes in a row trigger the compactions.
                let got = queue.removeFirst(where: { _ in true })
                let want = model.isEmpty ? nil : model.removeFirst()
                #expect(got?.id == want?.id, "step \(step): front")
            }
            #expect(queue.isEmpty == model.isEmpty)
            if let probe = model.randomElement(using: &random) { #expect(queue.contains(probe.id)) }
        }
        #expect(queue.removeAll().map(\.id) == model.map(\.id))
        #expect(queue.isEmpty)
        // Usable again after being emptied.
        queue.append(Self.job(nextID, host: "a"))
        #expect(queue.remove(nextID)?.host == "a")
    }
}
