import Glibc
import Digest

/// Serves one accepted socket on its own thread: reads requests, records them, answers.
final class TestHTTPConnection {
    let fd: Int32
    let id: Int
    let core: ServerCore
    let buffer: UnsafeMutableRawBufferPointer
    var start = 0
    var end = 0

    static let bufferSize = 256 * 1024
    static let maxHeadSize = 64 * 1024
    static let maxLineSize = 16 * 1024

    init(fd: Int32, id: Int, core: ServerCore) {
        self.fd = fd
        self.id = id
        self.core = core
        self.buffer = .allocate(byteCount: Self.bufferSize, alignment: 16)
    }

    deinit { buffer.deallocate() }

    func run() -> ConnectionEnding {
        while true {
            switch readHead() {
            case .eof:
                return .close
            case .tls:
                // Reset at once, as a plain server's refusal would: the client sees a failed handshake.
                core.log("TLS handshake on the plain port -> reset")
                return .reset
            case .bad(let status, let message):
                _ = sendResponseHead(
                    status: status, headers: [("Content-Type", "text/plain")], bodyLength: Int64(message.utf8.count), keepAlive: false)
                _ = sendAll(Array(message.utf8))
                return .close
            case .head(let head):
                switch exchange(head) {
                case .keepAlive: continue
                case .end(let ending): return ending
                }
            }
        }
    }

    // MARK: - One request/response

    private func exchange(_ head: RequestHead) -> ExchangeOutcome {
        let framing: BodyFraming
        if let coding = head.header("transfer-encoding").map(asciiLowercased) {
            guard coding.split(separator: ",").last.map({ $0.trimmingSpaces }) == "chunked" else {
                return badRequest("unsupported transfer-encoding")
            }
            framing = .chunked
        } else if let lengthText = head.header("content-length") {
            guard let length = Int64(lengthText.trimmingSpaces), length >= 0 else {
                return badRequest("bad content-length")
            }
            framing = .length(length)
        } else {
            framing = .length(0)
        }

        let expectsContinue = head.header("expect").map(asciiLowercased)?.trimmingSpaces == "100-continue"
        let pathOnly = String(head.target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)[0])
        let isControl = pathOnly == "/_stats" || pathOnly == "/_reset" || pathOnly.hasPrefix("/_control/")
        let (scripted, cap) = core.state.withLock { state -> (TestResponse?, Int) in
            if expectsContinue && !isControl { state.expectContinueCount += 1 }
            // Control paths stay reachable even under a catch-all script such as "/".
            return (isControl ? nil : state.scriptedResponse(for: head.target), state.bodyCaptureLimit)
        }
        var stopAfter: Int64?
        if let scripted, case .resetWhileReadingRequest(let afterBytes) = scripted.action {
            stopAfter = Int64(max(0, afterBytes))
        } else if scripted == nil && !isControl {
            // The one built-in route decided before the body is read: it cuts the body short.
            stopAfter = BuiltinRoutes.resetMidRequestBytes(pathOnly)
        }

        if expectsContinue {
            guard sendAll(Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)) else { return .end(.close) }
        }
        var sink = BodySink(cap: cap, hash: core.hashBodies)
        let result = readBody(framing, into: &sink, stopAfter: stopAfter)
        var record = RecordedRequest(
            method: head.method, path: head.target, headers: head.headers, bodySize: sink.size,
            bodySHA256: sink.sha256, body: sink.bytes, connectionID: id,
            completed: result == .complete, expectedContinue: expectsContinue
        )
        if result != .complete { record.body = nil }
        if !isControl {
            core.state.withLock { $0.records.append(record) }
        }

        switch result {
        case .complete: break
        case .stoppedAtLimit:
            core.log("\(head.method) \(head.target) -> reset after \(sink.size) body bytes")
            return .end(.reset)
        case .clientGone:
            core.log("\(head.method) \(head.target) -> client gone after \(sink.size) body bytes")
            return .end(.close)
        case .malformed:
            return badRequest("malformed chunked body")
        }
        if stopAfter != nil {
            core.log("\(head.method) \(head.target) -> reset after the whole body")
            return .end(.reset)
        }

        let response = scripted ?? BuiltinRoutes.response(for: record, core: core)
        core.log("\(head.method) \(head.target) \(sink.size)B -> \(describe(response))")
        return respond(response, to: head)
    }

    private func badRequest(_ message: String) -> ExchangeOutcome {
        let body = Array((message + "\n").utf8)
        _ = sendResponseHead(status: 400, headers: [("Content-Type", "text/plain")], bodyLength: Int64(body.count), keepAlive: false)
        _ = sendAll(body)
        return .end(.close)
    }

    private func respond(_ response: TestResponse, to head: RequestHead) -> ExchangeOutcome {
        if let name = response.hold, !waitAtHold(name) { return .end(.close) }
        if core.sleepOrStop(ms: response.delayMs) { return .end(.close) }
        switch response.action {
        case .resetBeforeResponse, .resetWhileReadingRequest:
            return .end(.reset)
        case .closeWithoutResponse:
            shutdown(fd, Int32(SHUT_WR))
            return .end(.close)
        case .stallForever:
            stall()
            return .end(.close)
        case .raw(let bytes):
            _ = sendAll(bytes)
            return .end(.close)
        case .respond, .resetMidBody, .slowBody, .stallAfterHeaders, .endless:
            break
        }

        let status = response.status
        let statusForbidsBody = (100..<200).contains(status) || status == 204 || status == 304
        let bodyLength = statusForbidsBody ? 0 : (response.bodySize ?? Int64(response.body.count))
        let closeAsked = response.headers.contains {
            asciiLowercased($0.0) == "connection" && asciiLowercased($0.1).contains("close")
        }
        let keepAlive = head.wantsKeepAlive && !response.closeConnection && !closeAsked
        var headers = response.headers
        if case .endless = response.action { headers.append(("Transfer-Encoding", "chunked")) }
        guard
            sendResponseHead(
                status: status, headers: headers, bodyLength: statusForbidsBody ? nil : bodyLength,
                keepAlive: keepAlive
            )
        else { return .end(.close) }
        switch response.action {
        case .stallAfterHeaders:
            stall()
            return .end(.close)
        case .endless(let bytesPerChunk):
            sendEndless(bytesPerChunk: bytesPerChunk)
            return .end(.close)
        default:
            break
        }
        let ending: ExchangeOutcome = keepAlive ? .keepAlive : .end(.close)
        if head.method == "HEAD" || bodyLength == 0 {
            if response.action == .resetMidBody { return .end(.reset) }
            return ending
        }

        switch response.action {
        case .resetMidBody:
            _ = sendBody(response, from: 0, count: bodyLength / 2)
            waitUntilSent()
            return .end(.reset)
        case .slowBody(let bytesPerChunk, let intervalMs):
            let piece = Int64(max(1, bytesPerChunk))
            var offset: Int64 = 0
            while offset < bodyLength {
                if core.sleepOrStop(ms: intervalMs) { return .end(.close) }
                let n = min(piece, bodyLength - offset)
                guard sendBody(response, from: offset, count: n) else { return .end(.close) }
                offset += n
            }
            return ending
        default:
            guard sendBody(response, from: 0, count: bodyLength) else { return .end(.close) }
            return ending
        }
    }

    private func describe(_ response: TestResponse) -> String {
        describeAction(response) + (response.hold.map { " after hold \($0)" } ?? "")
    }

    private func describeAction(_ response: TestResponse) -> String {
        switch response.action {
        case .respond: return "\(response.status)"
        case .resetBeforeResponse: return "reset"
        case .resetMidBody: return "\(response.status) reset mid-body"
        case .closeWithoutResponse: return "close"
        case .slowBody: return "\(response.status) slow body"
        case .resetWhileReadingRequest: return "reset"
        case .stallForever: return "stall"
        case .stallAfterHeaders: return "\(response.status) headers, then stall"
        case .endless: return "\(response.status) endless body"
        case .raw(let bytes): return "\(bytes.count) raw bytes"
        }
    }

    /// Waits at the hold `name` until the test releases this request; false when the server
    /// stops or the client goes away first (the request then no longer counts as held).
    private func waitAtHold(_ name: String) -> Bool {
        guard let ticket = core.state.withLock({ $0.arrive(at: name) }) else { return true }
        while true {
            if core.state.withLock({ $0.takeRelease(ticket, at: name) }) { return true }
            // POLLRDHUP (not POLLIN): the peer's FIN or RST ends the wait, bytes do not.
            var fds = [
                pollfd(fd: core.wakeRead, events: Int16(POLLIN), revents: 0),
                pollfd(fd: fd, events: pollReadHangUp, revents: 0),
            ]
            let ready = poll(&fds, 2, 5)
            if ready < 0 && errno != EINTR || fds[0].revents != 0 || fds[1].revents != 0 {
                core.state.withLock { $0.leave(ticket, at: name) }
                if fds[1].revents != 0 { core.log("held request at \(name): client gone") }
                return false
            }
        }
    }

    /// Holds the connection until the client closes it or the server stops.
    private func stall() {
        var scratch = [UInt8](repeating: 0, count: 4096)
        while true {
            var fds = [
                pollfd(fd: fd, events: Int16(POLLIN), revents: 0),
                pollfd(fd: core.wakeRead, events: Int16(POLLIN), revents: 0),
            ]
            let ready = poll(&fds, 2, -1)
            if ready < 0 {
                if errno == EINTR { continue }
                return
            }
            if fds[1].revents != 0 { return }
            if fds[0].revents != 0 {
                let n = scratch.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                if n <= 0 { return }
            }
        }
    }

    /// Chunks of the generated pattern until a send fails: the client hung up, or `stop()`
    /// shut the socket down.
    private func sendEndless(bytesPerChunk: Int) {
        let size = min(max(1, bytesPerChunk), PatternBlock.length)
        let chunkHead = Array((String(size, radix: 16) + "\r\n").utf8)
        let chunkEnd = Array("\r\n".utf8)
        var offset: Int64 = 0
        while true {
            guard sendAll(chunkHead),
                PatternBlock.shared.withBytes(from: offset, count: size, { sendAll($0) }),
                sendAll(chunkEnd)
            else { return }
            offset += Int64(size)
        }
    }

    /// Before an RST, lets the kernel deliver what was sent: linger 0 discards unsent data,
    /// and the client should see half a body, not none.
    private func waitUntilSent() {
        let deadline = monotonicMs() + 2000
        while monotonicMs() < deadline {
            var queued: Int32 = 0
            // SIOCOUTQ (= TIOCOUTQ): bytes not yet acknowledged by the peer.
            guard ioctl(fd, UInt(0x5411), &queued) == 0, queued > 0 else { return }
            if core.sleepOrStop(ms: 2) { return }
        }
    }

    // MARK: - Sending

    private func sendResponseHead(status: Int, headers: [(String, String)], bodyLength: Int64?, keepAlive: Bool) -> Bool {
        var text = "HTTP/1.1 \(status) \(reasonPhrase(status))\r\n"
        var hasLength = false
        for (name, value) in headers {
            let lower = asciiLowercased(name)
            if lower == "content-length" || lower == "transfer-encoding" { hasLength = true }
            text += "\(name): \(value)\r\n"
        }
        if !hasLength, let bodyLength { text += "Content-Length: \(bodyLength)\r\n" }
        if !keepAlive { text += "Connection: close\r\n" }
        text += "\r\n"
        return sendAll(Array(text.utf8))
    }

    private func sendBody(_ response: TestResponse, from offset: Int64, count: Int64) -> Bool {
        guard response.bodySize != nil else {
            let lower = Int(offset), upper = Int(offset + count)
            return response.body.withUnsafeBytes { sendAll(UnsafeRawBufferPointer(rebasing: $0[lower..<upper])) }
        }
        var position = offset
        let stop = offset + count
        while position < stop {
            let n = Int(min(Int64(PatternBlock.length), stop - position))
            guard PatternBlock.shared.withBytes(from: position, count: n, { sendAll($0) }) else { return false }
            position += Int64(n)
        }
        return true
    }

    private func sendAll(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { sendAll($0) }
    }

    /// MSG_NOSIGNAL: a client that went away must give EPIPE, not kill the process.
    private func sendAll(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard let base = bytes.baseAddress else { return true }
        var offset = 0
        while offset < bytes.count {
            let n = send(fd, base + offset, bytes.count - offset, Int32(MSG_NOSIGNAL))
            if n < 0 {
                if errno == EINTR { continue }
                return false
            }
            offset += n
        }
        return true
    }

}

/// POLLRDHUP (Linux): the peer closed its side. Glibc's module does not export it.
let pollReadHangUp: Int16 = 0x2000
