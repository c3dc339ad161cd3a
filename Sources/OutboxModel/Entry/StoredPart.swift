/// A part of a chunked upload as persisted, with its acceptance.
public struct StoredPart: Sendable {
    public var index: Int
    public var range: ByteRange
    public var url: String
    public var headers: [(String, String)]
    public var accepted: Bool
    public var status: Int?
    public var responseHeaders: JSON?
    public var attempts: Int
    public var nextAttemptAt: Int64?

    public init(index: Int, range: ByteRange, url: String, headers: [(String, String)], accepted: Bool, status: Int?,
                responseHeaders: JSON?, attempts: Int, nextAttemptAt: Int64?) {
        self.index = index
        self.range = range
        self.url = url
        self.headers = headers
        self.accepted = accepted
        self.status = status
        self.responseHeaders = responseHeaders
        self.attempts = attempts
        self.nextAttemptAt = nextAttemptAt
    }
}
