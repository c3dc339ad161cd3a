import CCurl

/// libcurl, loaded with dlopen on first use so only `outbox run` pays for it (linking it
/// would add about 7 ms to the start of every command).
enum CurlLibrary {
    /// nil once libcurl is loaded and curl_global_init has run; otherwise why not.
    /// A global `let` is initialised once, thread-safely, on first access.
    static let loadFailure: String? = {
        var buffer = [CChar](repeating: 0, count: 512)
        let rc = buffer.withUnsafeMutableBufferPointer { ccurl_load($0.baseAddress, $0.count) }
        if rc == 0 { return nil }
        return buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    }()

    /// Loads libcurl if needed; throws when it cannot be loaded.
    static func ensureLoaded() throws(HTTPClientError) {
        if let loadFailure { throw HTTPClientError(loadFailure) }
    }

    /// "libcurl/7.88.1", or "libcurl unavailable: <why>".
    static var version: String {
        if let loadFailure { return "libcurl unavailable: \(loadFailure)" }
        guard let raw = ccurl_version() else { return "libcurl" }
        let full = String(cString: raw)
        return String(full.split(separator: " ", maxSplits: 1).first ?? Substring(full))
    }
}
