import Foundation
import OutboxModel
import TestSupport
import Testing

/// One redirect code and method, and whether the runner follows it.
struct RedirectFault: Sendable, CustomTestStringConvertible {
    var code: Int
    var method: String
    var methodChange = false
    /// Followed to `/landing`, and how it arrives there (nil: not followed, error kind http).
    var landsAs: String?
    var testDescription: String {
        "\(code) to a \(method)\(methodChange ? " with redirect_method_change" : "")"
            + (landsAs.map { ": followed as \($0)" } ?? ": not followed")
    }
}

extension FaultServerTests {
    static let redirectFaults: [RedirectFault] = [
        RedirectFault(code: 307, method: "POST", landsAs: "POST"), RedirectFault(code: 307, method: "PUT", landsAs: "PUT"),
        RedirectFault(code: 308, method: "POST", landsAs: "POST"), RedirectFault(code: 308, method: "PUT", landsAs: "PUT"),
        RedirectFault(code: 301, method: "POST"), RedirectFault(code: 302, method: "POST"), RedirectFault(code: 303, method: "POST"),
        RedirectFault(code: 301, method: "PUT"), RedirectFault(code: 302, method: "PUT"), RedirectFault(code: 303, method: "PUT"),
        RedirectFault(code: 301, method: "POST", methodChange: true, landsAs: "GET"),
        RedirectFault(code: 302, method: "POST", methodChange: true, landsAs: "GET"),
        RedirectFault(code: 303, method: "POST", methodChange: true, landsAs: "GET"),
        // libcurl would re-send the PUT as a PUT without its body: not followed even so.
        RedirectFault(code: 303, method: "PUT", methodChange: true), RedirectFault(code: 302, method: "PUT", methodChange: true),
        RedirectFault(code: 300, method: "POST"), RedirectFault(code: 304, method: "POST"),
        RedirectFault(code: 305, method: "POST"), RedirectFault(code: 399, method: "POST"),
        RedirectFault(code: 300, method: "GET"), RedirectFault(code: 399, method: "GET"),
    ]

    /// PUT and POST bodies are never dropped: 307/308 arrive with the same method and body
    /// (the hash the server recorded), a method change only when the definition allows it.
    @Test(arguments: redirectFaults)
    func aRedirectKeepsTheBodyOrIsNotFollowed(_ c: RedirectFault) async throws {
        var request = "method: \(c.method)\nfollow_redirects: 2"
        if c.methodChange { request += "\nredirect_method_change: true" }
        let text =
            c.method == "GET"
            ? "key: t\nrequest:\n  method: GET\n  url: \"{{ vars.url }}\"\n  follow_redirects: 2\non_success: hooks/record.sh\non_error: hooks/record.sh\n"
            : definition("t", request: request)
        let p = try Project(config: faultConfig, definitions: ["t": text])
        try await p.enqueue("t", path: "/redirect-to?url=%2Flanding&code=\(c.code)", id: "rd")
        let run = try await p.drain(["--json"], failures: c.landsAs == nil ? 1 : 0)

        let first = try #require(p.server.requests(path: "/redirect-to").first)
        let landing = p.server.requests(path: "/landing")
        // The summary counts every body byte put on the wire: a 307/308's re-send too.
        let summary = try JSON.parse(run.stdout)
        #expect(summary.int("bytes_sent") == Int64(first.bodySize + (landing.first?.bodySize ?? 0)), "\(run.stdout)")
        let hook = try #require(p.deliveries("rd").first)
        #expect(p.server.requests(path: "/redirect-to").count == 1, "never sent again")
        if let method = c.landsAs {
            #expect(hook.string("stdin.outcome") == "completed", "\(hook.serialized())")
            #expect(landing.map(\.method) == [method])
            if method == c.method {
                #expect(landing.first?.bodySHA256 == first.bodySHA256)
                #expect(landing.first?.bodySize == first.bodySize && first.bodySize > 0)
            } else {
                #expect(landing.first?.bodySize == 0)
            }
            #expect(try await p.list().isEmpty)
        } else {
            #expect(landing.isEmpty, "not followed")
            #expect(hook.string("stdin.outcome") == "error")
            #expect(hook.string("stdin.error.kind") == "http", "\(hook.serialized())")
            #expect(hook.int("stdin.error.status") == Int64(c.code))
            #expect(try await p.list().map { $0.string("state") } == ["error"])
        }
    }

    /// A redirect to another scheme is refused (an http error); https is allowed, and a port
    /// that speaks no TLS is a TLS failure, retried.
    @Test(arguments: [
        ("ftp", "ftp://127.0.0.1/x"), ("file", "file:///etc/passwd"), ("gopher", "gopher://127.0.0.1/1"),
        ("scheme-relative ftp", "ftp:x"),
    ])
    func aRedirectToAnotherSchemeIsAnHTTPError(_ name: String, _ target: String) async throws {
        let p = try Project(config: faultConfig, definitions: ["t": definition("t", request: "follow_redirects: 2")])
        let encoded = target.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        try await p.enqueue("t", path: "/redirect-to?code=307&url=\(encoded)", id: "sc")
        try await p.drain(failures: 1)
        let hook = try #require(p.deliveries("sc").first)
        #expect(hook.string("stdin.outcome") == "error")
        #expect(hook.string("stdin.error.kind") == "http", "\(hook.serialized())")
        let scheme = String(target.prefix { $0 != ":" })
        #expect(hook.string("stdin.error.message") == "redirect: HTTP 307 to a URL of scheme \(scheme); only http and https are followed")
        #expect(hook.string("stdin.response.body")?.contains("root:") != true)
        #expect(p.server.requests(path: "/redirect-to").count == 1)
        #expect(try await p.list().map { $0.string("state") } == ["error"])
    }

    /// A redirect loop whose reused connection died on the way (libcurl's re-send refused, the
    /// runner retried) is named for the redirects, not for the reset met before.
    @Test func aRedirectLoopPastAResetIsNamedForItsRedirects() async throws {
        let p = try Project(
            config: faultConfig, definitions: ["t": definition("t", request: "follow_redirects: 1")])
        let again = TestResponse(status: 307, headers: [("Location", "/loop")])
        p.server.script("/loop", [again, TestResponse(action: .resetBeforeResponse), again])
        try await p.enqueue("t", path: "/loop", id: "loop")
        try await p.drain(failures: 1)
        let hook = try #require(p.deliveries("loop").first)
        #expect(hook.string("stdin.error.kind") == "http", "\(hook.serialized())")
        #expect(hook.string("stdin.error.message") == "redirect: Maximum (1) redirects followed", "\(hook.serialized())")
        // 307, reset (a retry), 307, and the last 307 past the limit.
        #expect(p.server.requests(path: "/loop").count == 4)
    }

    /// A redirect that was followed to a malformed answer is a network failure like any
    /// other malformed answer, not a refused redirect.
    @Test func aFollowedRedirectToAMalformedAnswerIsRetried() async throws {
        let p = try Project(config: faultConfig, definitions: ["t": definition("t", request: "follow_redirects: 2")])
        try await p.enqueue("t", path: "/redirect-to?code=307&url=%2Ffirst%2Fg%2F1%2Fmalformed%2Fgarbage", id: "mg")
        // The retry must come in this run, however late the first attempt failed.
        let run = try await p.drain(["--events", "-", "--horizon", "1h"], failures: 0)
        let attempts = run.jsonLines.filter { $0.string("type") == "attempt" }
        #expect(attempts.map { $0.string("outcome") ?? "" } == ["retry", "success"], "\(run.stdout)")
        #expect(attempts.first?.string("error_kind") == "network")
        #expect(p.server.requests(path: "/first/g/").count == 2)
        #expect(p.deliveries("mg").first?.string("stdin.outcome") == "completed")
    }

    @Test func aRedirectToHTTPSOnAPlainPortIsATLSFailureAndRetried() async throws {
        let p = try Project(config: faultConfig, definitions: ["t": definition("t", request: "follow_redirects: 2")])
        let plain = "https://127.0.0.1:\(p.server.port)/plain"
        p.server.script("/to-https", [TestResponse(status: 307, headers: [("Location", plain)]), .json(200, "{}")])
        try await p.enqueue("t", path: "/to-https", id: "tls")
        let run = try await p.drain(["--events", "-", "--horizon", "1h"], failures: 0)
        let attempts = run.jsonLines.filter { $0.string("type") == "attempt" }
        #expect(attempts.map { $0.string("outcome") ?? "" } == ["retry", "success"])
        #expect(attempts.first?.string("error_kind") == "tls", "\(run.stdout)")
        #expect(p.deliveries("tls").first?.string("stdin.outcome") == "completed")
    }

    /// Authorization, Cookie and redact_headers headers never reach another host: such a
    /// redirect is not followed. "localhost" and 127.0.0.2 are other hosts than 127.0.0.1.
    @Test(arguments: [
        ("Authorization", "localhost"), ("Cookie", "localhost"), ("X-Api-Key", "localhost"),
        ("Authorization", "127.0.0.2"), ("Cookie", "127.0.0.2"), ("X-Plain", "127.0.0.2"),
    ])
    func credentialsNeverReachAnotherHost(_ header: String, _ host: String) async throws {
        let p = try Project(
            config: faultConfig + "redact_headers: [X-Api-Key]\n",
            definitions: ["t": definition("t", request: "follow_redirects: 2\nheaders:\n  \(header): secret-value")])
        let other = host == "localhost" ? p.server : try TestHTTPServer(host: "127.0.0.2")
        defer { if other !== p.server { other.stop() } }
        let target = "http://\(host):\(other.port)/landing"
        let encoded = target.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        try await p.enqueue("t", path: "/redirect-to?code=307&url=\(encoded)", id: "cr")
        let credential = header != "X-Plain"
        try await p.drain(failures: credential ? 1 : 0)

        let arrived = other.requests(path: "/landing")
        if credential {
            #expect(!arrived.contains { $0.headers.contains { $0.1.contains("secret-value") } }, "the secret reached \(host)")
        }
        let hook = try #require(p.deliveries("cr").first)
        if credential {
            #expect(arrived.isEmpty)
            #expect(hook.string("stdin.outcome") == "error")
            #expect(hook.string("stdin.error.kind") == "http")
            #expect(hook.string("stdin.error.message")?.contains("another origin") == true, "\(hook.serialized())")
        } else {
            #expect(arrived.count == 1)
            #expect(hook.string("stdin.outcome") == "completed")
        }
    }

    /// A URL's userinfo goes out as `Authorization: Basic`: a redirect to another host is not
    /// followed, with or without a password, as for an `Authorization` header. A var holding
    /// the URL shows it redacted, a short password or user too (found by its `user:password@`).
    @Test(arguments: ["usr:url-pass-5@", "usr@", "usr:ab@", "a:b@"])
    func aURLsUserinfoNeverFollowsARedirectToAnotherHost(_ userinfo: String) async throws {
        let p = try Project(config: faultConfig, definitions: ["t": definition("t", request: "follow_redirects: 2")])
        let target = "http://localhost:\(p.server.port)/landing"
        let encoded = target.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        let url = p.url("/redirect-to?code=307&url=\(encoded)").replacingOccurrences(of: "http://", with: "http://" + userinfo)
        let vars = JSON.object([("url", .string(url)), ("tag", .string("a"))]).serialized()
        #expect(try await p.outbox(["enqueue", "t", "--vars", vars, "--id", "ui"]).exitCode == 0)
        // A user alone is the credential (an API key given as the user name): never shown either.
        let show = try await p.outbox(["show", "ui", "--json"])
        #expect(!show.stdout.contains(userinfo), "\(show.stdout)")
        let run = try await p.drain(["--events", "-"], failures: 1)
        #expect(!run.stdout.contains(userinfo), "\(run.stdout)")
        #expect(p.server.requests(path: "/landing").isEmpty)
        let hook = try #require(p.deliveries("ui").first)
        #expect(hook.string("stdin.outcome") == "error")
        #expect(hook.string("stdin.error.message")?.contains("another origin") == true, "\(hook.serialized())")
    }

    /// A server that echoes the request answers with its credentials: the attempt event (the
    /// same record `show` lists) masks them; the hook gets the body as the server sent it.
    @Test func credentialsAServerEchoesAreMaskedInEvents() async throws {
        let p = try Project(
            config: faultConfig + "redact_headers: [X-Api-Key]\n",
            definitions: [
                "t": definition(
                    "t", request: "headers:\n  Authorization: Bearer echo-secret-1\n  X-Api-Key: key-secret-2\n  X-Seen: plain-text-3")
            ])
        try await p.enqueue("t", path: "/echo", id: "ec")
        let run = try await p.drain(["--events", "-"], failures: 0)
        let attempt = try #require(run.jsonLines.first { $0.string("type") == "attempt" }, "\(run.stdout)")
        let shown = attempt.string("body") ?? ""
        #expect(shown.contains("plain-text-3") && shown.contains("[redacted]"), "\(shown)")
        #expect(!shown.contains("echo-secret-1") && !shown.contains("key-secret-2"), "\(shown)")
        let delivered = try #require(p.deliveries("ec").first)
        #expect(delivered.serialized().contains("echo-secret-1"), "the hook's data is the server's answer")
    }

    /// A JSON echo escapes `"` and `\` in what it quotes: the escaped secret is masked too.
    @Test func aSecretEchoedWithJSONEscapesIsMasked() async throws {
        let p = try Project(
            config: faultConfig,
            definitions: ["t": definition("t", request: #"headers:\#n  Authorization: 'Bearer quo"te\sl/ash-9'"#)])
        try await p.enqueue("t", path: "/echo", id: "esc")
        let run = try await p.drain(["--events", "-"], failures: 0)
        let attempt = try #require(run.jsonLines.first { $0.string("type") == "attempt" }, "\(run.stdout)")
        let shown = attempt.string("body") ?? ""
        #expect(shown.contains("[redacted]"), "\(shown)")
        #expect(!shown.contains("te\\sl/ash-9") && !shown.contains("te\\\\sl/ash-9"), "\(shown)")
        #expect(
            HeaderRules.withEscapedForms([Array("a\"b/c\\d".utf8)]).map { String(decoding: $0, as: UTF8.self) }.sorted()
                == [#"a"b/c\d"#, #"a\"b/c\\d"#, #"a\"b\/c\\d"#])
    }

    /// A URL's password goes out as `Authorization: Basic`: an echo of that, or of the
    /// password itself, is masked as a secret header's would be.
    @Test func aURLPasswordAServerEchoesIsMaskedInEvents() async throws {
        let p = try Project(config: faultConfig, definitions: ["t": definition("t", request: "headers:\n  X-Seen: plain-text-3")])
        let url = p.url("/echo").replacingOccurrences(of: "http://", with: "http://usr:url%2Dpass-4@")
        let vars = JSON.object([("url", .string(url)), ("tag", .string("a"))]).serialized()
        #expect(try await p.outbox(["enqueue", "t", "--vars", vars, "--id", "up"]).exitCode == 0)
        let run = try await p.drain(["--events", "-"], failures: 0)
        let attempt = try #require(run.jsonLines.first { $0.string("type") == "attempt" }, "\(run.stdout)")
        let shown = attempt.string("body") ?? ""
        let basic = Data("usr:url-pass-4".utf8).base64EncodedString()
        #expect(shown.contains("plain-text-3") && shown.contains("[redacted]"), "\(shown)")
        #expect(!shown.contains(basic) && !shown.contains("url-pass-4"), "\(shown)")
        #expect(try #require(p.deliveries("up").first).serialized().contains(basic), "the hook's data is the server's answer")
    }

    /// A user without a password (an API key as the user name) goes out as `Authorization:
    /// Basic` too: an echo of it is masked, and the URL is shown without it.
    @Test func aURLUserAServerEchoesIsMaskedInEvents() async throws {
        let p = try Project(config: faultConfig, definitions: ["t": definition("t", request: "headers:\n  X-Seen: plain-text-3")])
        let url = p.url("/echo").replacingOccurrences(of: "http://", with: "http://sk_user_key-5@")
        let vars = JSON.object([("url", .string(url)), ("tag", .string("a"))]).serialized()
        #expect(try await p.outbox(["enqueue", "t", "--vars", vars, "--id", "uu"]).exitCode == 0)
        let run = try await p.drain(["--events", "-"], failures: 0)
        let attempt = try #require(run.jsonLines.first { $0.string("type") == "attempt" }, "\(run.stdout)")
        let shown = attempt.string("body") ?? ""
        let basic = Data("sk_user_key-5:".utf8).base64EncodedString()
        #expect(shown.contains("plain-text-3") && shown.contains("[redacted]"), "\(shown)")
        #expect(!shown.contains(basic) && !run.stdout.contains("sk_user_key-5"), "\(run.stdout)")
        #expect(try #require(p.deliveries("uu").first).serialized().contains(basic), "the hook's data is the server's answer")
    }

    /// A URL from `env` is a secret whole: a server that echoes its path shows `[redacted]` in events.
    @Test func aURLFromTheEnvironmentAServerEchoesIsMasked() async throws {
        let hook = "key: hk\nrequest:\n  url: \"{{ vars.base | raw }}/echo/{{ env.HOOK_TOKEN }}\"\non_success: hooks/record.sh\n"
        let p = try Project(config: faultConfig, definitions: ["hk": hook])
        let vars = JSON.object([("base", .string(p.url("")))]).serialized()
        let enqueued = try await p.outbox(["enqueue", "hk", "--vars", vars, "--id", "h1"], environment: ["HOOK_TOKEN": "hook-token-77"])
        #expect(enqueued.exitCode == 0, "\(enqueued)")
        let run = try await p.drain(["--events", "-"], failures: 0)
        let attempt = try #require(run.jsonLines.first { $0.string("type") == "attempt" }, "\(run.stdout)")
        #expect((attempt.string("body") ?? "").contains("[redacted]"), "\(run.stdout)")
        #expect(!run.stdout.contains("hook-token-77"), "\(run.stdout)")
        #expect(p.server.requests(path: "/echo/hook-token-77").count == 1, "sent whole")
    }

    /// A URL built from `env` (a bot token in the path, a webhook URL kept there) is sent
    /// whole and shown by its origin alone: render, show, its attempts and the run's events.
    @Test func aURLFromTheEnvironmentIsShownByItsOriginAlone() async throws {
        let bot = """
            key: bot
            request:
              url: "{{ vars.base | raw }}/bot{{ env.BOT_TOKEN }}/send?chat=1"
              data: { text: hi }
            on_success: hooks/record.sh

            """
        let p = try Project(config: faultConfig, definitions: ["bot": bot])
        let token = "7001:AAH-url-token-8"
        // In a URL the value is encoded as a path segment: the colon goes as %3A.
        let path = "/bot7001%3AAAH-url-token-8/send"
        let secret = "AAH-url-token-8"
        let vars = JSON.object([("base", .string(p.url("")))]).serialized()
        let render = try await p.outbox(["render", "bot", "--vars", vars, "--json"], environment: ["BOT_TOKEN": token])
        #expect(render.exitCode == 0, "\(render.description)")
        let origin = p.url("")
        #expect(render.json?.string("url") == origin + "/[redacted]", "\(render.stdout)")
        #expect(!render.stdout.contains(secret))
        let enqueued = try await p.outbox(["enqueue", "bot", "--vars", vars, "--id", "b1"], environment: ["BOT_TOKEN": token])
        #expect(enqueued.exitCode == 0, "\(enqueued.description)")
        p.server.script(path, [.status(503), .status(200)])
        let first = try await p.outbox(["run", "--drain", "--horizon", "0s", "--events", "-"])
        #expect(!first.stdout.contains(secret) && !first.stderr.contains(secret), "\(first.description)")
        let show = try await p.outbox(["show", "b1", "--json"])
        #expect(show.exitCode == 0 && !show.stdout.contains(secret), "\(show.stdout)")
        #expect(show.json?.string("request.url") == origin + "/[redacted]")
        #expect(show.json?.at("attempts_log")?.arrayValue?.first?.string("url") == origin + "/[redacted]", "\(show.stdout)")
        let last = try await p.drain(["--events", "-"], failures: 0)
        #expect(!last.stdout.contains(secret), "\(last.stdout)")
        #expect(p.server.requests(path: path).count == 2, "the request went to the URL env made")
        #expect(try #require(p.deliveries("b1").last).string("stdin.outcome") == "completed")
    }

    /// A response nested as deep as input may nest is wrapped deeper in its outcome: the
    /// store reads back what it wrote, and the queue goes on (it stopped every run with 74).
    @Test func aResponseNestedToTheInputLimitIsDelivered() async throws {
        let p = try Project(config: faultConfig, definitions: ["t": definition("t", top: "response: json")])
        let deep = String(repeating: "[", count: 512) + String(repeating: "]", count: 512)
        p.server.script("/deep", [.json(200, deep)])
        try await p.enqueue("t", path: "/deep", id: "deep")
        try await p.enqueue("t", path: "/status/200", id: "after")
        // Exit 0: the outcome was read back and its hook acknowledged it (the list is empty).
        try await p.drain(failures: 0)
        #expect(p.deliveries("after").first?.string("stdin.outcome") == "completed")
        #expect(try await p.list().isEmpty)
    }

    /// The excerpt is cut at 4 KiB after it is masked: a secret across the cut shows no prefix.
    @Test func aSecretAcrossTheExcerptsEndIsMaskedWhole() async throws {
        let p = try Project(
            config: faultConfig, definitions: ["t": definition("t", request: "headers:\n  Authorization: Bearer echo-secret-1")])
        p.server.script("/cut", [.status(200, body: String(repeating: "x", count: 4083) + "Bearer echo-secret-1 and more")])
        try await p.enqueue("t", path: "/cut", id: "cut")
        let run = try await p.drain(["--events", "-"], failures: 0)
        let attempt = try #require(run.jsonLines.first { $0.string("type") == "attempt" }, "\(run.stdout)")
        let shown = attempt.string("body") ?? ""
        #expect(shown.hasPrefix(String(repeating: "x", count: 4083)), "\(shown.suffix(40))")
        #expect(!shown.contains("echo-s"), "no piece of the secret: \(shown.suffix(40))")
    }

    /// Locations that a hand-made reading takes for a path on this host while libcurl goes to
    /// the host they name: the credential still stays home.
    @Test(arguments: ["http:/", "HTTP:/", "http:///", "http:\\\\"])
    func oddlyWrittenLocationsNeverCarryCredentialsToAnotherHost(_ prefix: String) async throws {
        let p = try Project(
            config: faultConfig + "redact_headers: [X-Api-Key]\n",
            definitions: ["t": definition("t", request: "follow_redirects: 2\nheaders:\n  X-Api-Key: secret-value")])
        let other = try TestHTTPServer(host: "127.0.0.2")
        defer { other.stop() }
        let target = "\(prefix)127.0.0.2:\(other.port)/landing"
        let encoded = target.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        try await p.enqueue("t", path: "/redirect-to?code=307&url=\(encoded)", id: "odd")
        try await p.drain(failures: 1)
        #expect(other.requests(path: "/landing").isEmpty, "the secret reached 127.0.0.2 through \(target)")
        let hook = try #require(p.deliveries("odd").first)
        #expect(hook.string("stdin.outcome") == "error", "\(hook.serialized())")
    }

    /// A header rendered from the environment is a credential whatever its name: a redirect
    /// to another host that would carry it is not followed.
    @Test func environmentHeadersNeverReachAnotherHost() async throws {
        let p = try Project(
            config: faultConfig,
            definitions: ["t": definition("t", request: "follow_redirects: 2\nheaders:\n  X-Env-Key: \"{{ env.SERVICE_KEY }}\"")])
        p.environment = ["SERVICE_KEY": "env-secret-value"]
        let target = "http://localhost:\(p.server.port)/landing"
        let encoded = target.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        try await p.enqueue("t", path: "/redirect-to?code=307&url=\(encoded)", id: "ev")
        try await p.drain(failures: 1)
        let sent = try #require(p.server.requests(path: "/redirect-to").first)
        #expect(sent.headers.contains { $0.0.lowercased() == "x-env-key" && $0.1 == "env-secret-value" })
        #expect(p.server.requests(path: "/landing").isEmpty)
        let hook = try #require(p.deliveries("ev").first)
        #expect(hook.string("stdin.error.message")?.contains("another origin") == true, "\(hook.serialized())")
    }
}
