import OutboxModel
import Testing

struct AttemptClassifierTests {
    struct Case: Sendable, CustomTestStringConvertible {
        let name: String
        let status: Int?
        var failure: TransportFailure? = nil
        var body: String = ""
        var accept: [AcceptRule] = []
        var exempt: Set<Int> = [404]
        let expected: AttemptOutcomeClass
        var testDescription: String { name }
    }

    static let cases: [Case] = [
        // Success
        Case(name: "200", status: 200, expected: .success),
        Case(name: "201", status: 201, expected: .success),
        Case(name: "204", status: 204, expected: .success),
        Case(name: "299", status: 299, expected: .success),
        // Accept rules come first
        Case(name: "accept 409 by status", status: 409, accept: [AcceptRule(status: 409)], expected: .success),
        Case(
            name: "accept 409 with matching body", status: 409, body: #"{"error":"note already exists"}"#,
            accept: [AcceptRule(status: 409, bodyIncludes: "already exists")], expected: .success),
        Case(
            name: "accept 409 with other body is terminal", status: 409, body: #"{"error":"conflict"}"#,
            accept: [AcceptRule(status: 409, bodyIncludes: "already exists")], expected: .terminal(reason: "HTTP 409")),
        Case(
            name: "accept rule for another status does not apply", status: 409,
            accept: [AcceptRule(status: 410)], expected: .terminal(reason: "HTTP 409")),
        Case(
            name: "second accept rule for the same status matches", status: 409, body: "duplicate key",
            accept: [
                AcceptRule(status: 409, bodyIncludes: "already exists"),
                AcceptRule(status: 409, bodyIncludes: "duplicate"),
            ], expected: .success),
        Case(
            name: "accept beats awaiting-auth", status: 403, body: "already deleted",
            accept: [AcceptRule(status: 403, bodyIncludes: "already deleted")], expected: .success),
        Case(name: "accept beats retry", status: 503, accept: [AcceptRule(status: 503)], expected: .success),
        Case(name: "accept beats a redirect status", status: 303, accept: [AcceptRule(status: 303)], expected: .success),
        Case(
            name: "empty body_includes matches any body", status: 409, accept: [AcceptRule(status: 409, bodyIncludes: "")],
            expected: .success),
        Case(
            name: "body match is on UTF-8 bytes", status: 409, body: "déjà là",
            accept: [AcceptRule(status: 409, bodyIncludes: "à l")], expected: .success),
        Case(
            name: "body match is case-sensitive", status: 409, body: "Already Exists",
            accept: [AcceptRule(status: 409, bodyIncludes: "already exists")], expected: .terminal(reason: "HTTP 409")),
        Case(
            name: "needle longer than body", status: 409, body: "al",
            accept: [AcceptRule(status: 409, bodyIncludes: "already")], expected: .terminal(reason: "HTTP 409")),
        Case(
            name: "needle at the very end", status: 409, body: "xx already",
            accept: [AcceptRule(status: 409, bodyIncludes: "already")], expected: .success),
        // Transport failures
        Case(
            name: "network failure", status: nil, failure: .network("connection refused"),
            expected: .retry(reason: "network: connection refused")),
        Case(
            name: "timeout", status: nil, failure: .timeout("stalled below 1 KiB/s for 60s"),
            expected: .retry(reason: "timeout: stalled below 1 KiB/s for 60s")),
        Case(name: "tls", status: nil, failure: .tls("certificate expired"), expected: .retry(reason: "tls: certificate expired")),
        Case(
            name: "redirect failure", status: nil, failure: .redirect("too many redirects"),
            expected: .terminal(reason: "redirect: too many redirects")),
        Case(
            name: "redirect failure with its 3xx status", status: 302, failure: .redirect("redirect to ftp:// refused"),
            expected: .terminal(reason: "redirect: redirect to ftp:// refused")),
        Case(
            name: "failure mid-body beats a 2xx status", status: 200, failure: .network("connection reset"),
            accept: [AcceptRule(status: 200)], expected: .retry(reason: "network: connection reset")),
        Case(name: "no status and no failure", status: nil, expected: .retry(reason: "network: no response")),
        // 3xx
        Case(name: "301 not followed", status: 301, expected: .terminal(reason: "HTTP 301: redirect not followed")),
        Case(name: "304", status: 304, expected: .terminal(reason: "HTTP 304: redirect not followed")),
        // Auth
        Case(name: "401", status: 401, expected: .awaitingAuth),
        Case(name: "403", status: 403, expected: .awaitingAuth),
        Case(name: "401 even when exempt", status: 401, exempt: [401, 404], expected: .awaitingAuth),
        // Retryable statuses
        Case(name: "408", status: 408, expected: .retry(reason: "HTTP 408")),
        Case(name: "429", status: 429, expected: .retry(reason: "HTTP 429")),
        Case(name: "500", status: 500, expected: .retry(reason: "HTTP 500")),
        Case(name: "503", status: 503, expected: .retry(reason: "HTTP 503")),
        Case(name: "599 is still 5xx", status: 599, expected: .retry(reason: "HTTP 599")),
        // Exempt and other 4xx
        Case(name: "404 exempt by default", status: 404, expected: .retry(reason: "HTTP 404 (exempt)")),
        Case(name: "404 not exempt", status: 404, exempt: [], expected: .terminal(reason: "HTTP 404")),
        Case(name: "410 exempt when listed", status: 410, exempt: [410], expected: .retry(reason: "HTTP 410 (exempt)")),
        Case(name: "400", status: 400, expected: .terminal(reason: "HTTP 400")),
        Case(name: "422", status: 422, expected: .terminal(reason: "HTTP 422")),
        Case(name: "499", status: 499, expected: .terminal(reason: "HTTP 499")),
        Case(name: "exempt 5xx changes nothing", status: 500, exempt: [500], expected: .retry(reason: "HTTP 500")),
        // Odd statuses
        Case(name: "101 as a final status", status: 101, expected: .terminal(reason: "HTTP 101: unexpected status")),
        Case(name: "600", status: 600, expected: .terminal(reason: "HTTP 600: unexpected status")),
        Case(name: "0", status: 0, expected: .terminal(reason: "HTTP 0: unexpected status")),
        Case(name: "600 with an accept rule", status: 600, accept: [AcceptRule(status: 600)], expected: .success),
    ]

    @Test(arguments: cases)
    func classifies(_ c: Case) {
        let result = AttemptClassifier.classify(
            status: c.status, failure: c.failure, body: Array(c.body.utf8), accept: c.accept, exempt: c.exempt)
        #expect(result == c.expected)
    }
}

/// A failure's message becomes the entry's reason, which the stores index: a long one (a
/// path, a server's text) is cut on a character boundary, never mid-character.
struct ReasonLengthTests {
    @Test(arguments: [("a", 5_000), ("é", 3_000), ("日本", 2_000), ("🚀", 1_500)])
    func aLongFailureMessageIsCutInTheReason(_ piece: String, _ count: Int) throws {
        let message = String(repeating: piece, count: count)
        let klass = AttemptClassifier.classify(
            status: nil, failure: TransportFailure(.network, message), body: [], accept: [], exempt: [])
        guard case let .retry(reason) = klass else {
            Issue.record("expected a retry, got \(klass)")
            return
        }
        #expect(reason.utf8.count <= AttemptClassifier.maxReasonBytes + "network: ".utf8.count)
        #expect(reason.hasPrefix("network: " + piece) && reason.hasSuffix("…"))
        #expect(String(reason.dropFirst("network: ".count).dropLast()).allSatisfy { String($0) == piece || piece.contains($0) })
    }

    @Test func aShortFailureMessageIsKeptWhole() {
        let klass = AttemptClassifier.classify(
            status: nil, failure: TransportFailure(.timeout, "stalled"), body: [], accept: [], exempt: [])
        #expect(klass == .retry(reason: "timeout: stalled"))
    }
}
