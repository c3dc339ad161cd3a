import CCurl
import OutboxModel

/// Maps a libcurl result code to the failure kinds outbox reports.
enum CurlFailure {
    /// `afterRedirect`: the transfer had received a 3xx or followed a redirect, so an
    /// "unsupported protocol" means a redirect to another scheme (REDIR_PROTOCOLS_STR).
    static func kind(of code: CURLcode, afterRedirect: Bool) -> TransportFailure.Kind {
        switch code {
        case CURLE_OPERATION_TIMEDOUT:
            return .timeout
        case CURLE_TOO_MANY_REDIRECTS:
            return .redirect
        case CURLE_UNSUPPORTED_PROTOCOL:
            return afterRedirect ? .redirect : .network
        case CURLE_URL_MALFORMAT:
            // The request's own URL was checked at enqueue: after a 3xx, the Location is bad.
            return afterRedirect ? .redirect : .network
        case CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_ENGINE_NOTFOUND,
            CURLE_SSL_ENGINE_SETFAILED, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER, CURLE_USE_SSL_FAILED,
            CURLE_SSL_ENGINE_INITFAILED, CURLE_SSL_CACERT_BADFILE, CURLE_SSL_SHUTDOWN_FAILED,
            CURLE_SSL_CRL_BADFILE, CURLE_SSL_ISSUER_ERROR, CURLE_SSL_PINNEDPUBKEYNOTMATCH,
            CURLE_SSL_INVALIDCERTSTATUS, CURLE_SSL_CLIENTCERT:
            return .tls
        default:
            // Resolve, connect, send, receive, nothing/partial reply, read errors, aborts.
            return .network
        }
    }
}
