import Glibc
import OutboxProcess

/// One field of a JSON document outbox writes for others (a hook's stdin, an event line,
/// the run's summary): its dotted path, when it is there, and what it holds.
package struct PayloadField: Sendable {
    package let path: String
    package let when: String
    package let meaning: String

    init(_ path: String, _ when: String, _ meaning: String) {
        self.path = path
        self.when = when
        self.meaning = meaning
    }
}

/// The fields of the documents hooks, plugins and event readers get. The runner's tests
/// run real payloads and fail on a field missing here.
package enum PayloadFields {
    /// Objects whose own keys are data (vars, headers), not fields.
    package static let openObjects: Set<String> = ["vars", "data", "response.headers", "parts.headers"]

    package static let hookInput: [PayloadField] = [
        PayloadField("outcome", "always", "`completed` or `error`"),
        PayloadField("id", "always", "the entry's id"),
        PayloadField("key", "always", "the definition key"),
        PayloadField("vars", "always", "the entry's vars (`null` when none)"),
        PayloadField("meta", "always", "about the outcome and its delivery:"),
        PayloadField("meta.at", "always", "when the outcome was made (epoch ms)"),
        PayloadField("meta.attempts", "always", "attempts made in this generation"),
        PayloadField(
            "meta.request_id", "always", "the `X-Request-Id` of the last attempt (`\"\"` when there was none; `null` for a scope cancel)"),
        PayloadField("meta.idempotency_key", "always", "the entry's `Idempotency-Key`, or `null`"),
        PayloadField("meta.generation", "always", "the entry's generation (grows when a same-id enqueue starts a new one)"),
        PayloadField("meta.header_generation", "not for scope cancels", "how many `headers update` patches the entry has seen"),
        PayloadField("meta.parent", "not for scope cancels", "the id of the entry whose outcome enqueued this one, or `null`"),
        PayloadField("meta.deliveries", "always", "this delivery's number, as `OUTBOX_DELIVERIES`"),
        PayloadField(
            "response", "always", "the final response, `null` when none came back (an expiry, a changed file, a cancel, a chunked upload):"),
        PayloadField("response.status", "an HTTP response came back", "the final status"),
        PayloadField("response.headers", "an HTTP response came back", "the response headers, names lowercase, repeats joined with `, `"),
        PayloadField("response.body", "an HTTP response came back", "the body up to `max_response_bytes`: text, or base64"),
        PayloadField("response.body_encoding", "the body is not UTF-8", "`base64`"),
        PayloadField("response.body_truncated", "an HTTP response came back", "true when the body was over `max_response_bytes`"),
        PayloadField("data", "always", "the parsed response (`response: json` or a parser), else `null`"),
        PayloadField("parts", "always", "every part, in order, when a chunked upload completed; else `null`"),
        PayloadField("parts.index", "a chunked upload completed", "the part's 0-based index"),
        PayloadField("parts.status", "a chunked upload completed", "the status that accepted the part"),
        PayloadField("parts.headers", "a chunked upload completed", "the part's response headers, names lowercase (S3's `etag`)"),
        PayloadField("s3", "an `s3` request completed", "the object written (or found there):"),
        PayloadField("s3.bucket", "an `s3` request completed", "its bucket"),
        PayloadField("s3.key", "an `s3` request completed", "its key"),
        PayloadField("s3.etag", "an `s3` request completed", "the ETag S3 answered, or `null`"),
        PayloadField(
            "s3.checksum_sha256", "an `s3` request completed",
            "base64 SHA-256 of the object; of a multipart object, S3's `DIGEST-N` form over its parts"),
        PayloadField("s3.parts", "an `s3` request completed", "parts of a multipart upload, 0 for one PutObject"),
        PayloadField("s3.skipped", "an `s3` request completed", "true when `skip_existing` found the object already there"),
        PayloadField("error", "`error` outcomes", "what went wrong:"),
        PayloadField("error.kind", "`error` outcomes", "one of the error kinds below"),
        PayloadField("error.message", "`error` outcomes", "what happened, in words"),
        PayloadField(
            "error.status", "`error` outcomes",
            "the HTTP status of the answer that decided it (of the HEAD, for a multipart upload found gone), or `null`"),
        PayloadField("error.part_index", "a refused part", "the part's 0-based index"),
        PayloadField("error.body", "`error` outcomes", "the first 64 KiB of the response body, `null` without one"),
        PayloadField("error.body_encoding", "that body is not UTF-8", "`base64`"),
        PayloadField("reason", "scope cancels", "`scope`"),
        PayloadField(
            "follow_up_errors", "a `then` follow-up could not be built or applied",
            "none of the outcome's follow-ups was enqueued; one item per failure"),
        PayloadField(
            "follow_up_errors.index", "as above",
            "the follow-up's index in its list; `null` (in `show`, before delivery) when no definition of the key was loaded as the entry settled: its `then` lists are built at delivery"
        ),
        PayloadField("follow_up_errors.key", "as above", "its key as written; `null` as the index is"),
        PayloadField("follow_up_errors.message", "as above", "why it could not be built or applied"),
    ]

    package static let stateEvent: [PayloadField] = [
        PayloadField("type", "always", "`state`"),
        PayloadField("id", "always", "the entry"),
        PayloadField("key", "always", "its key"),
        PayloadField("vars", "always", "its vars"),
        PayloadField("state", "always", "the new state"),
        PayloadField("reason", "always", "why (`HTTP 503`, `auth`, `expired`, `other-account`, `user`, `paused`, ...), or `null`"),
        PayloadField("bytes_sent", "always", "body bytes sent (accepted, for parts; a form's fields, not its framing)"),
        PayloadField("total_bytes", "always", "the body's size"),
        PayloadField("attempts", "always", "attempts so far in this generation"),
        PayloadField("created_at", "always", "epoch ms"),
        PayloadField("updated_at", "always", "epoch ms"),
        PayloadField("next_attempt_at", "always", "epoch ms of the next attempt, or `null`"),
        PayloadField("generation", "always", "the entry's generation"),
        PayloadField("parent", "always", "the id of the entry that enqueued it, or `null`"),
    ]

    package static let progressEvent: [PayloadField] = [
        PayloadField("type", "always", "`progress`"),
        PayloadField("id", "always", "the entry"),
        PayloadField("bytes_sent", "always", "accepted parts plus what parts in flight have sent"),
        PayloadField("bytes_accepted", "always", "bytes of accepted parts (0 for a whole-body request)"),
        PayloadField("total_bytes", "always", "the body's size"),
    ]

    package static let attemptEvent: [PayloadField] = [
        PayloadField("type", "always", "`attempt`"),
        PayloadField("id", "always", "the entry"),
        PayloadField("key", "always", "its key"),
        PayloadField("request_id", "always", "the attempt's `X-Request-Id`"),
        PayloadField("attempt", "always", "the entry's attempt number"),
        PayloadField("url", "always", "the URL, any query string replaced by `?[redacted]`"),
        PayloadField("method", "always", "the method"),
        PayloadField("part_index", "always", "the part's index, or `null`"),
        PayloadField("outcome", "always", "`success`, `retry`, `awaiting-auth`, `error`, or `aborted` (sent, then stopped by outbox)"),
        PayloadField(
            "http_code", "always",
            "the final status, or `null` when no final status line (200 and up) came back (an answer discarded after one, cut off or malformed, keeps its code; `error_kind` says why it was discarded)"
        ),
        PayloadField("body", "always", "the first 4 KiB of the response body as kept (at most `max_response_bytes`)"),
        PayloadField("body_encoding", "the body is not UTF-8", "`base64`"),
        PayloadField(
            "error_kind", "always",
            "the transfer's failure (\(TransportFailure.Kind.allCases.map { "`\($0.rawValue)`" }.joined(separator: ", "))), else `null`"),
        PayloadField("error_message", "always", "libcurl's message, or `null`"),
        PayloadField("at", "always", "epoch ms"),
    ]

    package static let runSummary: [PayloadField] = [
        PayloadField("attempts", "always", "HTTP attempts made"),
        PayloadField("completed", "always", "entries settled `completed`"),
        PayloadField("errors", "always", "entries settled `error`"),
        PayloadField("retried", "always", "attempts that were retried"),
        PayloadField("skipped", "always", "entries completed without an upload: their S3 object was already there (`skip_existing`)"),
        PayloadField("awaiting_auth", "always", "entries parked for credentials"),
        PayloadField("cancelled", "always", "entries dropped for another account, or cancelled while running"),
        PayloadField("delivered", "always", "hook deliveries acknowledged"),
        PayloadField("delivery_failures", "always", "deliveries that failed: a hook that failed, or a then chain not built yet"),
        PayloadField("bytes_sent", "always", "request body bytes put on the wire (retries, and a body re-sent on a 307/308, included)"),
        PayloadField("elapsed_ms", "always", "the run's length"),
        PayloadField("remaining", "always", "entries left that are not completed or cancelled"),
        PayloadField("failed", "always", "the entries behind `failure_status`:"),
        PayloadField("failed.error", "always", "ids of entries that settled `error` in the run (at most 1000)"),
        PayloadField(
            "failed.awaiting_auth", "always", "ids of entries parked `awaiting-auth` in the run or left so at its end (at most 1000)"),
        PayloadField("failed.hook_failures", "always", "ids whose hook delivery failed in the run (at most 1000)"),
        PayloadField(
            "failed.follow_up_failures", "always",
            "ids whose outcome's `then` follow-ups could not be built or applied in the run, so none was enqueued: voided, or waiting for a delivery that can build them (at most 1000)"
        ),
        PayloadField("failure_status", "always", "the exit status of `run --drain`: the sum of the bits below"),
    ]
}

/// The variables a hook gets besides the runner's environment; the runner sets exactly these.
package enum HookEnvironment {
    package struct Values: Sendable {
        package var id: String
        package var key: String
        package var outcome: String
        package var deliveries: Int64
        package var generation: Int64
        /// `OUTBOX_HOOK_TOKEN`: the store and the outcome, see `token`.
        package var token: String

        package init(id: String, key: String, outcome: String, deliveries: Int64, generation: Int64, token: String) {
            (self.id, self.key, self.outcome, self.deliveries, self.generation) = (id, key, outcome, deliveries, generation)
            self.token = token
        }
    }

    package static let tokenName = "OUTBOX_HOOK_TOKEN"

    /// Names an outcome of one store: a runner finds by it a hook whose runner died before
    /// recording its process group (the store is named by a hash of its location: a URL may hold a password).
    package static func token(store: String, outcomeSeq: Int64) -> String {
        tokenPrefix(store: store) + String(outcomeSeq)
    }

    /// Set for every plugin: the store and the outbox process that started it (its pid, start
    /// time and session). A runner stops a plugin whose outbox process is gone (killed: a plugin
    /// dies with it, but what the plugin started in the background does not).
    package static let pluginOwnerName = "OUTBOX_PLUGIN_OWNER"

    /// `environment` with `OUTBOX_PLUGIN_OWNER` naming this process, for a plugin of `store`.
    package static func withPluginOwner(_ environment: [String: String], store: String) -> [String: String] {
        var environment = environment
        environment[pluginOwnerName] = tokenPrefix(store: store) + "\(getpid()):\(ProcessRunner.ownStartTime):\(getsid(0))"
        return environment
    }

    /// What every token of one store starts with.
    package static func tokenPrefix(store: String) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in store.utf8 { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        let hex = String(hash, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex + "-"
    }

    package static let variables: [(name: String, meaning: String, value: @Sendable (Values) -> String)] = [
        ("OUTBOX_ID", "the entry id", { $0.id }),
        ("OUTBOX_KEY", "the definition key", { $0.key }),
        ("OUTBOX_OUTCOME", "`completed` or `error`", { $0.outcome }),
        ("OUTBOX_DELIVERIES", "this delivery's number: 1 the first time, then 2, 3, ...", { String($0.deliveries) }),
        ("OUTBOX_GENERATION", "the entry's generation the outcome belongs to", { String($0.generation) }),
        (
            tokenName,
            "the store and the outcome (same for each delivery of it): a runner that finds a hook left running by one that died stops it before delivering again",
            { $0.token }
        ),
    ]
}
