import Digest
/// One scripted answer of the test server: a status, headers and a body, plus how to
/// misbehave (delay, reset, slow body, stall) when delivering it.
package struct TestResponse: Sendable {
    /// How the server delivers (or fails to deliver) the response.
    package enum Action: Sendable, Equatable {
        /// Send the response normally.
        case respond
        /// Read the request, then reset the connection (RST) without answering.
        case resetBeforeResponse
        /// Send the headers and half the body, then reset the connection.
        case resetMidBody
        /// Read the request, then close the connection cleanly without answering.
        case closeWithoutResponse
        /// Send the headers, then the body in pieces, waiting `intervalMs` before each piece.
        case slowBody(bytesPerChunk: Int, intervalMs: Int)
        /// Reset the connection once `afterBytes` body bytes arrived (or after the whole
        /// body, if it is shorter); the request is recorded with `completed == false`
        /// unless the body was complete.
        case resetWhileReadingRequest(afterBytes: Int)
        /// Read the request, then hold the connection open without answering until the
        /// client closes it or the server stops.
        case stallForever
    }

    /// The HTTP status code.
    package var status: Int
    /// Response headers in order; `Content-Length` is added unless present here.
    package var headers: [(String, String)]
    /// The body, used when `bodySize` is nil.
    package var body: [UInt8]
    /// Milliseconds to wait after the request body was read, before answering.
    package var delayMs: Int
    /// How to deliver the response.
    package var action: Action
    /// When set, a generated body of this many bytes (`TestResponse.patternByte`), streamed.
    package var bodySize: Int64?
    /// Close the connection after this response (sends `Connection: close`).
    package var closeConnection: Bool
    /// When set, the request waits at the hold of this name, after its body was read and
    /// before `delayMs` and the answer, until the test releases it (`TestHTTPServer.release`).
    package var hold: String?

    /// Creates a response with every field spelled out.
    package init(
        status: Int = 200,
        headers: [(String, String)] = [],
        body: [UInt8] = [],
        delayMs: Int = 0,
        action: Action = .respond,
        bodySize: Int64? = nil,
        closeConnection: Bool = false,
        hold: String? = nil
    ) {
        self.status = status
        self.headers = headers
        self.body = body
        self.delayMs = delayMs
        self.action = action
        self.bodySize = bodySize
        self.closeConnection = closeConnection
        self.hold = hold
    }

    /// A 200 with an empty JSON object, sent once the hold `name` is released.
    package static func hold(_ name: String) -> TestResponse {
        TestResponse.json(200, "{}").held(name)
    }

    /// This response, sent once the hold `name` is released.
    package func held(_ name: String) -> TestResponse {
        var copy = self
        copy.hold = name
        return copy
    }

    /// A plain response with a text body.
    package static func status(_ code: Int, body: String = "", headers: [(String, String)] = []) -> TestResponse {
        TestResponse(status: code, headers: headers, body: Array(body.utf8))
    }

    /// A response with a JSON body and `Content-Type: application/json`.
    package static func json(_ code: Int, _ json: String, headers: [(String, String)] = []) -> TestResponse {
        TestResponse(status: code, headers: [("Content-Type", "application/json")] + headers, body: Array(json.utf8))
    }

    /// A response sent after waiting `ms` milliseconds.
    package static func delay(_ ms: Int, _ code: Int = 200, body: String = "") -> TestResponse {
        TestResponse(status: code, body: Array(body.utf8), delayMs: ms)
    }

    /// A generated body of `count` bytes (deterministic pattern), streamed.
    package static func bytes(_ count: Int64, status: Int = 200) -> TestResponse {
        TestResponse(status: status, headers: [("Content-Type", "application/octet-stream")], bodySize: count)
    }

    /// The connection is reset after the request was read; no response.
    package static var reset: TestResponse { TestResponse(action: .resetBeforeResponse) }

    /// The connection is closed cleanly after the request was read; no response.
    package static var closeWithoutResponse: TestResponse { TestResponse(action: .closeWithoutResponse) }

    /// Headers and half of a generated `bodySize`-byte body, then a reset.
    package static func resetMidBody(bodySize: Int64 = 1 << 16) -> TestResponse {
        TestResponse(action: .resetMidBody, bodySize: bodySize)
    }

    /// A generated body of `bodySize` bytes sent `bytesPerChunk` at a time, `intervalMs` apart.
    package static func slowBody(bodySize: Int64, bytesPerChunk: Int, intervalMs: Int, status: Int = 200) -> TestResponse {
        TestResponse(status: status, action: .slowBody(bytesPerChunk: bytesPerChunk, intervalMs: intervalMs), bodySize: bodySize)
    }

    /// The connection is reset after `afterBytes` request body bytes arrived.
    package static func resetWhileReadingRequest(afterBytes: Int) -> TestResponse {
        TestResponse(action: .resetWhileReadingRequest(afterBytes: afterBytes))
    }

    /// The request is read and never answered.
    package static var stall: TestResponse { TestResponse(action: .stallForever) }

    /// Byte `offset` of every generated body: `offset % 251` (a prime, so the pattern
    /// never lines up with power-of-two buffer sizes and misplaced bytes show).
    package static func patternByte(at offset: Int64) -> UInt8 {
        UInt8(truncatingIfNeeded: offset % 251)
    }

    /// The first `count` bytes of the generated body pattern (for small expected values).
    package static func patternBytes(count: Int) -> [UInt8] {
        (0..<count).map { UInt8(truncatingIfNeeded: $0 % 251) }
    }

    /// SHA-256 (lowercase hex) of a generated body of `count` bytes.
    package static func patternSHA256(count: Int64) -> String {
        var hasher = SHA256.Hasher()
        let block = PatternBlock.shared
        var offset: Int64 = 0
        while offset < count {
            let n = Int(min(Int64(PatternBlock.length), count - offset))
            block.withBytes(from: offset, count: n) { hasher.update($0) }
            offset += Int64(n)
        }
        return hasher.finalizeHex()
    }
}

/// A precomputed run of the body pattern, a whole number of periods long, so any window of
/// the generated body is one slice of it.
final class PatternBlock: Sendable {
    static let shared = PatternBlock()
    static let period = 251
    /// Bytes handed out per call; 256 periods ≈ 62.75 KiB.
    static let length = 251 * 256
    private let bytes: [UInt8]

    private init() {
        bytes = (0..<(Self.length + Self.period)).map { UInt8(truncatingIfNeeded: $0 % Self.period) }
    }

    /// Calls `body` with the `count` (≤ `length`) pattern bytes starting at body `offset`.
    func withBytes<R>(from offset: Int64, count: Int, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        precondition(count <= Self.length)
        let start = Int(offset % Int64(Self.period))
        return bytes.withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[start..<(start + count)])) }
    }
}
