/// A part of a chunked upload as persisted, with its acceptance.
package struct StoredPart: Sendable {
    package var index: Int
    package var range: ByteRange
    package var url: String
    package var headers: [(String, String)]
    package var accepted: Bool
    package var status: Int?
    package var responseHeaders: JSON?
    package var attempts: Int
    package var nextAttemptAt: Int64?

    package init(
        index: Int, range: ByteRange, url: String, headers: [(String, String)], accepted: Bool, status: Int?,
        responseHeaders: JSON?, attempts: Int, nextAttemptAt: Int64?
    ) {
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
