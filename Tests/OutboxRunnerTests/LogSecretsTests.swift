import Foundation
import OutboxModel
import TestSupport
import Testing

/// No log line, event or summary of a run prints a secret: a token in the config's headers
/// (a header named in `redact_headers`) and a bearer token a definition takes from the
/// environment, through retries, auth failures, errors and redirects, at every log level and
/// in both log formats; `show` and `list` print neither. A token that came in the vars and
/// went into a secret header is redacted in the vars too (the hook gets it whole).
struct LogSecretsTests {
    static let configToken = "tok-config-5d1f9a"
    static let envToken = "tok-env-77c2e0"
    static let varsToken = "tok-vars-3e8b41"

    @Test(arguments: [["-v"], ["-v", "--log-format", "json"], ["--events", "-"], ["--json"]])
    func aRunPrintsNoSecret(_ flags: [String]) async throws {
        let config = fastConfig + "headers: { X-Api-Key: \"\(Self.configToken)\" }\nredact_headers: [X-Api-Key]\n"
        let request = "headers: { Authorization: \"Bearer {{ env.API_TOKEN }}\" }\nfollow_redirects: 2"
        let p = try Project(
            config: config,
            definitions: [
                "t": definition("t", request: request),
                "v": definition("v", request: "headers: { Authorization: \"Bearer {{ vars.tag }}\" }"),
            ])
        p.environment["API_TOKEN"] = Self.envToken
        try await p.enqueue("v", path: "/status/410", id: "by-vars", tag: Self.varsToken)
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
        #expect(p.server.requests(path: "/status/410").first?.header("authorization") == "Bearer \(Self.varsToken)")
        let secrets = [Self.configToken, Self.envToken, Self.varsToken]
        for (what, text) in [("stderr", run.stderr), ("stdout", run.stdout)] {
            #expect(!secrets.contains { text.contains($0) }, "\(what) shows a secret:\n\(text)")
        }
        for args in [
            ["show", "failed", "--json"], ["show", "refused"], ["list", "--json"], ["explain", "refused", "--json"],
            ["show", "by-vars", "--json"], ["show", "by-vars"],
        ] {
            let out = try await p.outbox(args).stdout
            #expect(!secrets.contains { out.contains($0) }, "\(args) shows a secret:\n\(out)")
        }
        let row = try #require(try await p.list().first { $0.string("id") == "by-vars" })
        #expect(row["vars"]?["tag"] == .string("[redacted]") && row["vars"]?["url"]?.stringValue != nil, "\(row)")
        #expect(p.deliveries("by-vars").first?.string("stdin.vars.tag") == Self.varsToken, "the hook's data is whole")
    }
}
