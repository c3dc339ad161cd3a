/// What the test server received for one request.
package struct RecordedRequest: Sendable {
    /// The method as sent.
    package var method: String
    /// The request target as sent: raw, with the query, no percent-decoding.
    package var path: String
    /// Headers in arrival order, names spelled as sent.
    package var headers: [(String, String)]
    /// Body bytes received (after chunked decoding).
    package var bodySize: Int64
    /// SHA-256 of the body bytes received, lowercase hex.
    package var bodySHA256: String
    /// The body, when it was no larger than the server's `bodyCaptureLimit`.
    package var body: [UInt8]?
    /// Which accepted connection carried the request (1 for the first).
    package var connectionID: Int
    /// Whether the whole body arrived.
    package var completed: Bool
    /// Whether the request carried `Expect: 100-continue`.
    package var expectedContinue: Bool

    /// Creates a record (the server makes these; package for fixtures).
    package init(
        method: String, path: String, headers: [(String, String)], bodySize: Int64, bodySHA256: String,
        body: [UInt8]?, connectionID: Int, completed: Bool, expectedContinue: Bool = false
    ) {
        self.method = method
        self.path = path
        self.headers = headers
        self.bodySize = bodySize
        self.bodySHA256 = bodySHA256
        self.body = body
        self.connectionID = connectionID
        self.completed = completed
        self.expectedContinue = expectedContinue
    }

    /// The header's value, matched case-insensitively; repeated headers joined with ", ".
    package func header(_ name: String) -> String? {
        let wanted = asciiLowercased(name)
        let values = headers.filter { asciiLowercased($0.0) == wanted }.map(\.1)
        return values.isEmpty ? nil : values.joined(separator: ", ")
    }

    /// The body as UTF-8 text (lossy), when it was captured.
    package var bodyText: String? {
        body.map { String(decoding: $0, as: UTF8.self) }
    }
}

/// ASCII-only lowercasing: header names are ASCII, and this avoids Unicode tables.
func asciiLowercased(_ text: String) -> String {
    String(decoding: text.utf8.map { $0 >= 65 && $0 <= 90 ? $0 + 32 : $0 }, as: UTF8.self)
}
