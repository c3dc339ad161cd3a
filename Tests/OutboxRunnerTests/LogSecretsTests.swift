import Foundation
import OutboxModel
import TestSupport
import Testing

/// No log line, event or summary of a run prints a secret: a token in the config's headers
/// (a header named in `redact_headers`) and a bearer token a definition takes from the
/// environment, through retries, auth failures, errors and redirects, at every log level and
/// in both log formats; `show` and `list` print neither.
struct LogSecretsTests {
    static let configToken = "tok-config-5d1f9a"
    static let envToken = "tok-env-77c2e0"

    @Test(arguments: [["-v"], ["-v", "--log-format", "json"], ["--events", "-"], ["--json"]])
    func aRunPrintsNoSecret(_ flags: [String]) async throws {
        let config = fastConfig + "headers: { X-Api-Key: \"\(Self.configToken)\" }\nredact_headers: [X-Api-Key]\n"
        let request = "headers: { Authorization: \"Bearer {{ env.API_TOKEN }}\" }\nfollow_redirects: 2"
        let p = try Project(config: config, definitions: ["t": definition("t", request: request)])
        p.environment["API_TOKEN"] = Self.envToken
        try await p.enqueue("t", path: "/seq/s/500,200", id: "retried")
        try await p.enqueue("t", path: "/status/401", id: "refused")
        try await p.enqueue("t", path: "/status/400", id: "failed")
        try await p.enqueue("t", path: "/redirect-to?url=http%3A%2F%2Flocalhost%3A1%2Fx", id: "redirected")
        let run = try await p.outbox(["run", "--drain"] + flags)
        #expect(run.exitCode == 3, "an error and a parked entry: \(run.stderr)")
        // The server saw both secrets: they were sent, just never printed.
        let sent = try #require(p.server.requests(path: "/status/400").first)
        #expect(sent.header("x-api-key") == Self.configToken)
        #expect(sent.header("authorization") == "Bearer \(Self.envToken)")
        for (what, text) in [("stderr", run.stderr), ("stdout", run.stdout)] {
            #expect(!text.contains(Self.configToken) && !text.contains(Self.envToken), "\(what) shows a secret:\n\(text)")
        }
        for args in [["show", "failed", "--json"], ["show", "refused"], ["list", "--json"], ["explain", "refused", "--json"]] {
            let out = try await p.outbox(args).stdout
            #expect(!out.contains(Self.configToken) && !out.contains(Self.envToken), "\(args) shows a secret:\n\(out)")
        }
    }
}
