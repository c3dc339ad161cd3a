/// What each code, kind and decision means, in the words of the generated reference. Each
/// switch is exhaustive, so a new case cannot ship undocumented.
extension ErrorCode {
    package var examples: String {
        switch self {
        case .usage:
            return "unknown command or option, a missing or extra argument, an option given twice, `--horizon` without `--drain`, "
                + "`--json` with `--events -`, `--delay` with `--not-before`, a bad duration for a `run` option; `outbox` with no command"
        case .invalid:
            return "vars that are not a JSON object or exceed `max_vars_bytes`, a bad id, an unknown key, a template or URL that does "
                + "not render or pass, a body that does not fit its method, parts that do not tile the file, a plugin that fails, "
                + "`show`/`explain` of an unknown id, `init` over existing files"
        case .fileMissing:
            return "a `request.file` or form file that does not exist, `--vars @FILE` or `--from FILE` that cannot be read, "
                + "a missing `--from-dir` folder, a `--config` file that does not exist"
        case .storage: return "the store cannot be created or written; libcurl cannot be loaded; `outbox audit` found a problem"
        case .running: return "another runner holds the store (its pid is named); a different body for an entry that is `running`"
        case .config:
            return "the config has errors, or none was found; the definition of the key has errors; `check` found errors; "
                + "an unknown key while some definition file cannot be read"
        }
    }
}

extension ErrorKind {
    /// The state the entry is in when its outcome has this kind.
    package var entryState: EntryState {
        switch self {
        case .http, .file, .expired: return .error
        case .truncated, .unknown: return .completed
        case .cancelled: return .cancelled
        }
    }

    package var summary: String {
        switch self {
        case .http: return "a 4xx that is not retried, a 3xx not followed, a redirect to another scheme, too many redirects, a refused part"
        case .file:
            return
                "a staged body went missing, or a referenced file changed: nothing of it was sent (a chunked upload may have sent earlier parts)"
        case .expired: return "the entry passed its expiry before it succeeded"
        case .cancelled: return "another entry of its scope settled `error` under `on_rejected: cancel-scope`"
        case .truncated: return "the response was over `max_response_bytes`, so the parser did not run; never sent again"
        case .unknown: return "the response did not parse, or the parser plugin failed; never sent again"
        }
    }
}

extension SameIdDecision {
    package var name: String {
        switch self {
        case .create: return "create"
        case .resume: return "resume"
        case .replace: return "replace"
        case .rejectRunning: return "`E_RUNNING` (exit 75)"
        case .newGeneration: return "new generation"
        case .redeliver: return "deliver the outcome again, send nothing"
        case .replaceAfterDelivery: return "replace once the old outcome is acknowledged"
        case .reopen: return "reopen"
        }
    }

    package var summary: String {
        switch self {
        case .create: return "a new entry"
        case .resume:
            return "keeps the bytes, accepted parts and attempts; takes the new vars, headers and expiry (and `--delay`/`--not-before`); "
                + "a running request carries on"
        case .replace:
            return "the new body, progress reset, `queued`; a file the old body had moved into the store goes back to its path"
        case .rejectRunning: return "the entry's request is in flight with another body: nothing changes"
        case .newGeneration:
            return "the entry starts over as generation n+1; the old generation's outcome is still delivered to its hook first"
        case .redeliver: return "the outcome not yet acknowledged is delivered; no request is sent"
        case .replaceAfterDelivery: return "the new body waits until the old outcome is acknowledged, then replaces it"
        case .reopen: return "as resume, and the entry is `queued` again with its attempts reset, due now"
        }
    }
}

/// The bits of `outbox run --drain`'s exit status, so cron and systemd see what failed.
package enum DrainFailure: Int32, Sendable, CaseIterable {
    case settledError = 1
    case awaitingAuth = 2
    case hookFailed = 4

    package var summary: String {
        switch self {
        case .settledError: return "an entry settled `error` during the run"
        case .awaitingAuth:
            return
                "an entry parked `awaiting-auth` during the run (also one an auth refresh sent again before it ended), or entries are left so at its end"
        case .hookFailed:
            return
                "a hook delivery failed during the run (also one delivered again before it ended), or an outcome's `then` follow-ups could not be built or applied"
        }
    }
}
