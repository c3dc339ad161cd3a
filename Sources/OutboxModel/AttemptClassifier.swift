/// What one attempt's result means for the entry (docs/states-and-exit-codes.md).
package enum AttemptOutcomeClass: Sendable, Equatable {
    /// 2xx, or an accept rule matched: settle completed.
    case success
    /// Network failure, 5xx, 408, 429, or an exempt 4xx: back off and try again until expiry.
    case retry(reason: String)
    /// 401 or 403: park until `outbox headers update`.
    case awaitingAuth
    /// Any other 4xx, a redirect problem, or a status outbox cannot interpret: settle error, kind `http`.
    case terminal(reason: String)

    /// The name attempt events and the attempt log use.
    package var name: String {
        switch self {
        case .success: return "success"
        case .retry: return "retry"
        case .awaitingAuth: return "awaiting-auth"
        case .terminal: return "error"
        }
    }
}

/// A non-2xx response to treat as success: the status, and optionally text the body must contain.
package struct AcceptRule: Sendable, Equatable {
    package var status: Int
    package var bodyIncludes: String?

    package init(status: Int, bodyIncludes: String? = nil) {
        self.status = status
        self.bodyIncludes = bodyIncludes
    }
}

/// Why a transfer did not produce a complete HTTP response.
package struct TransportFailure: Error, Sendable, Equatable {
    package enum Kind: String, Sendable, CaseIterable {
        /// Connect, resolve, send or receive failed; a body file could not be read mid-way.
        case network
        /// Connect timeout or a stalled transfer.
        case timeout
        /// TLS handshake or certificate verification failed.
        case tls
        /// 3xx not followed, a redirect to another scheme, or too many redirects.
        case redirect
        /// The body file is missing or not the one expected when the transfer starts: nothing was sent.
        case file
        /// Stopped by outbox itself (shutdown, cancel, pause): not a result of the attempt.
        case aborted
        /// No credentials to sign the request with (an `s3` request): nothing was sent.
        case credentials
    }

    package var kind: Kind
    package var message: String

    package init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    package static func network(_ m: String) -> TransportFailure { TransportFailure(.network, m) }
    package static func timeout(_ m: String) -> TransportFailure { TransportFailure(.timeout, m) }
    package static func tls(_ m: String) -> TransportFailure { TransportFailure(.tls, m) }
    package static func redirect(_ m: String) -> TransportFailure { TransportFailure(.redirect, m) }
}

/// Decides what an HTTP result means; the runner acts on the answer.
///
/// | result                                          | class          |
/// |-------------------------------------------------|----------------|
/// | transport failure network / timeout / tls       | retry          |
/// | transport failure redirect                      | terminal       |
/// | no status and no failure                        | retry          |
/// | an accept rule matches (status, body_includes)  | success        |
/// | 2xx                                             | success        |
/// | 3xx (a redirect not followed)                   | terminal       |
/// | 401, 403                                        | awaitingAuth   |
/// | 408, 429, 500–599                               | retry          |
/// | other 4xx in `exempt`                           | retry          |
/// | other 4xx                                       | terminal       |
/// | 1xx, < 100, ≥ 600                               | terminal       |
///
/// A transport failure decides even when a status line arrived: a transfer cut off
/// mid-way is not a complete response, and the Idempotency-Key makes a re-send safe.
/// 401/403 park even when listed in `exempt` (exempt only widens "other 4xx").
/// 1xx as a final status and codes outside 100–599 have no meaning we could act on,
/// and retrying them would loop until expiry; they settle (an accept rule can still
/// claim them). Per RFC 9110 an unknown code is treated as its class (e.g. 599 as 5xx).
package enum AttemptClassifier {
    /// The longest failure message kept in a reason, in bytes.
    package static let maxReasonBytes = 1000

    /// `text` cut to at most `bytes` bytes of UTF-8, on a character boundary, "…" marking a cut.
    package static func cut(_ text: String, bytes: Int) -> String {
        guard text.utf8.count > bytes else { return text }
        var kept = ""
        for character in text {
            guard kept.utf8.count + character.utf8.count <= bytes - 3 else { break }
            kept.append(character)
        }
        return kept + "…"
    }

    /// Classifies one attempt: `status` nil means no HTTP response (see `failure`); `body` is matched by `bodyIncludes`.
    package static func classify(
        status: Int?, failure: TransportFailure?, body: [UInt8], accept: [AcceptRule], exempt: Set<Int>
    ) -> AttemptOutcomeClass {
        if let failure {
            // Cut: it becomes the entry's reason, which the stores index (a path or a server's
            // text in it may be as long as they like).
            let m = Self.cut(failure.message, bytes: maxReasonBytes)
            switch failure.kind {
            // A file that failed mid-way is retried like a broken connection.
            case .network, .file: return .retry(reason: "network: \(m)")
            case .timeout: return .retry(reason: "timeout: \(m)")
            case .tls: return .retry(reason: "tls: \(m)")
            case .redirect: return .terminal(reason: "redirect: \(m)")
            case .aborted: return .retry(reason: "aborted: \(m)")
            // Like a refused signature: parked until credentials are given and it is retried.
            case .credentials: return .awaitingAuth
            }
        }
        guard let status else { return .retry(reason: "network: no response") }

        for rule in accept where rule.status == status {
            guard let needle = rule.bodyIncludes else { return .success }
            if contains(body, Array(needle.utf8)) { return .success }
        }

        switch status {
        case 200...299:
            return .success
        case 300...399:
            return .terminal(reason: "HTTP \(status): redirect not followed")
        case 401, 403:
            return .awaitingAuth
        case 408, 429, 500...599:
            return .retry(reason: "HTTP \(status)")
        case 400...499:
            return exempt.contains(status)
                ? .retry(reason: "HTTP \(status) (exempt)")
                : .terminal(reason: "HTTP \(status)")
        default:
            return .terminal(reason: "HTTP \(status): unexpected status")
        }
    }

    /// Whether `needle` occurs in `haystack` as a byte substring (an empty needle always does).
    static func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        if needle.isEmpty { return true }
        if needle.count > haystack.count { return false }
        let first = needle[0]
        var i = 0
        let lastStart = haystack.count - needle.count
        while i <= lastStart {
            if haystack[i] == first {
                var j = 1
                while j < needle.count && haystack[i + j] == needle[j] { j += 1 }
                if j == needle.count { return true }
            }
            i += 1
        }
        return false
    }
}
