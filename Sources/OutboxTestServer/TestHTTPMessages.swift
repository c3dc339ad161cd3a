import Glibc
import Digest

/// A parsed request line and header block.
struct RequestHead {
    var method: String
    var target: String
    var version: String
    var headers: [(String, String)]

    func header(_ name: String) -> String? {
        let values = headers.filter { asciiLowercased($0.0) == name }.map(\.1)
        return values.isEmpty ? nil : values.joined(separator: ", ")
    }

    /// HTTP/1.1 keeps the connection unless told to close; 1.0 closes unless told to keep.
    var wantsKeepAlive: Bool {
        let tokens = (header("connection").map(asciiLowercased) ?? "")
            .split(separator: ",").map { $0.trimmingSpaces }
        if tokens.contains("close") { return false }
        return version == "HTTP/1.1" || tokens.contains("keep-alive")
    }
}

/// How the request body is delimited.
enum BodyFraming {
    case length(Int64)
    case chunked
}

/// What reading the request body came to.
enum BodyResult {
    case complete
    /// `resetWhileReadingRequest` reached its byte count.
    case stoppedAtLimit
    case clientGone
    case malformed
}

/// How a connection ends.
enum ConnectionEnding {
    case close
    case reset
}

/// What to do after one exchange.
enum ExchangeOutcome {
    case keepAlive
    case end(ConnectionEnding)
}

/// Streams the body into a hash, a size and (up to the cap) a copy.
struct BodySink {
    var hasher = SHA256.Hasher()
    var size: Int64 = 0
    var bytes: [UInt8]? = []
    let cap: Int
    let hash: Bool

    var sha256: String {
        guard hash else { return "" }
        var finished = hasher
        return finished.finalizeHex()
    }

    mutating func take(_ chunk: UnsafeRawBufferPointer) {
        if hash { hasher.update(chunk) }
        size += Int64(chunk.count)
        if let kept = bytes?.count {
            if kept + chunk.count > cap { bytes = nil } else { bytes?.append(contentsOf: chunk) }
        }
    }
}

extension StringProtocol {
    /// Without leading and trailing spaces and tabs (HTTP optional whitespace).
    var trimmingSpaces: String {
        let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" }
        guard let first = firstIndex(where: { !isSpace($0) }) else { return "" }
        let last = lastIndex(where: { !isSpace($0) })!
        return String(self[first...last])
    }
}

/// Standard reason phrases for the codes tests use; others get "Status".
func reasonPhrase(_ status: Int) -> String {
    switch status {
    case 100: return "Continue"
    case 200: return "OK"
    case 201: return "Created"
    case 202: return "Accepted"
    case 204: return "No Content"
    case 206: return "Partial Content"
    case 301: return "Moved Permanently"
    case 302: return "Found"
    case 303: return "See Other"
    case 304: return "Not Modified"
    case 307: return "Temporary Redirect"
    case 308: return "Permanent Redirect"
    case 400: return "Bad Request"
    case 401: return "Unauthorized"
    case 403: return "Forbidden"
    case 404: return "Not Found"
    case 405: return "Method Not Allowed"
    case 408: return "Request Timeout"
    case 409: return "Conflict"
    case 410: return "Gone"
    case 412: return "Precondition Failed"
    case 413: return "Content Too Large"
    case 422: return "Unprocessable Content"
    case 425: return "Too Early"
    case 429: return "Too Many Requests"
    case 431: return "Request Header Fields Too Large"
    case 500: return "Internal Server Error"
    case 501: return "Not Implemented"
    case 502: return "Bad Gateway"
    case 503: return "Service Unavailable"
    case 504: return "Gateway Timeout"
    default: return "Status"
    }
}
