/// What the test server received for one request.
public struct RecordedRequest: Sendable {
    /// The method as sent.
    public var method: String
    /// The request target as sent: raw, with the query, no percent-decoding.
    public var path: String
    /// Headers in arrival order, names spelled as sent.
    public var headers: [(String, String)]
    /// Body bytes received (after chunked decoding).
    public var bodySize: Int64
    /// SHA-256 of the body bytes received, lowercase hex.
    public var bodySHA256: String
    /// The body, when it was no larger than the server's `bodyCaptureLimit`.
    public var body: [UInt8]?
    /// Which accepted connection carried the request (1 for the first).
    public var connectionID: Int
    /// Whether the whole body arrived.
    public var completed: Bool
    /// Whether the request carried `Expect: 100-continue`.
    public var expectedContinue: Bool

    /// Creates a record (the server makes these; public for fixtures).
    public init(
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
    public func header(_ name: String) -> String? {
        let wanted = asciiLowercased(name)
        let values = headers.filter { asciiLowercased($0.0) == wanted }.map(\.1)
        return values.isEmpty ? nil : values.joined(separator: ", ")
    }

    /// The body as UTF-8 text (lossy), when it was captured.
    public var bodyText: String? {
        body.map { String(decoding: $0, as: UTF8.self) }
    }
}

/// ASCII-only lowercasing: header names are ASCII, and this avoids Unicode tables.
func asciiLowercased(_ text: String) -> String {
    String(decoding: text.utf8.map { $0 >= 65 && $0 <= 90 ? $0 + 32 : $0 }, as: UTF8.self)
}
