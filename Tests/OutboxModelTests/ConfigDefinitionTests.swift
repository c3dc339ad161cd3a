import Foundation
import Testing
@testable import OutboxModel

struct ConfigTests {
    /// A `request_command`'s answer may give `retry`: its backoff is held to the config's rules.
    @Test(arguments: [
        (#"{"backoff": {"base": "1h", "max": "1m", "jitter": 0}}"#, "retry.backoff.base 1h is longer than retry.backoff.max 1m"),
        (#"{"backoff": {"base": "0s", "max": "1m", "jitter": 0}}"#, "retry.backoff.base must be longer than 0"),
        (#"{"terminal_http": {"exempt": [99999, 200]}}"#, "retry.terminal_http.exempt items must be 4xx status codes, not 99999"),
        (#"{"terminal_http": {"exempt": "x"}}"#, "retry.terminal_http must give exempt, a list of 4xx status codes"),
        (#"{"bogus": 1}"#, "retry has no field \"bogus\""),
    ])
    func aPluginsBackoffIsCheckedLikeTheConfigs(_ answer: String, _ message: String) throws {
        let parsed = try JSON.parse(answer)
        do throws(OutboxError) {
            _ = try RequestBuilder.retryRules(parsed, base: RetryRules())
            Issue.record("accepted \(answer)")
        } catch {
            #expect(error.code == .invalid && error.message.hasPrefix(message), "\(error.message)")
        }
    }

    @Test func emptyFileGivesDefaults() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let config = try loadConfig("", in: folder).get()
        #expect(config.root == folder.path)
        #expect(config.file == folder.path + "/config/outbox.yaml")
        #expect(config.store == folder.path + "/.outbox")
        #expect(config.definitions == folder.path + "/definitions")
        #expect(config.lifetimeMs == 14 * 86_400_000)
        #expect(config.maxVarsBytes == 1 << 20)
        #expect(config.maxResponseBytes == 1 << 20)
        #expect(config.retry == RetryRules())
        #expect(config.retry.backoff.baseMs == 1000)
        #expect(config.retry.backoff.maxMs == 2 * 3_600_000)
        #expect(config.retry.backoff.jitter == 0.2)
        #expect(config.retry.exempt == [404])
        #expect(config.headers.isEmpty)
        #expect(config.headersCommand == nil)
        #expect(config.authRefreshCommand == nil)
        #expect(config.redactHeaders.isEmpty)
        #expect(config.eventsCommand == nil)
        #expect(config.account == nil)
        #expect(config.concurrency == 16)
        #expect(config.perHost == 4)
        #expect(config.partConcurrency == 3)
        #expect(config.hookConcurrency == 32)
        #expect(config.hookWarnAfterMs == 30_000)
        #expect(config.hookTimeoutMs == nil)
        #expect(config.wifiCheck == nil)
        #expect(config.connectTimeoutMs == 30_000)
        #expect(config.stallBelowBytes == 1024)
        #expect(config.stallForMs == 60_000)
        #expect(config.caFile == nil)
        #expect(config.redactedHeaderNames == ["authorization", "cookie", "proxy-authorization", "set-cookie"])
    }

    @Test func commentOnlyFileGivesDefaults() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let config = try loadConfig("# nothing set\n", in: folder).get()
        #expect(config.concurrency == 16)
        #expect(config.store == folder.path + "/.outbox")
    }

    @Test func everyFieldIsRead() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let text = """
            store: var/queue
            definitions: defs
            lifetime: 2d
            max_vars_bytes: 64KiB
            max_response_bytes: 2MiB
            retry:
              backoff: { base: 500ms, max: 10m, jitter: 0.5 }
              terminal_http: { exempt: [404, 410] }
            headers:
              Authorization: "Bearer {{ env.API_TOKEN }}"
              X-Client: outbox
            headers_command: [plugins/headers, --json]
            auth_refresh_command: plugins/refresh.sh
            redact_headers: [X-Secret, x-api-key]
            events: { command: "cat > /dev/null" }
            account: "{{ env.OUTBOX_ACCOUNT }}"
            concurrency: 8
            per_host: 2
            part_concurrency: 5
            hooks: { concurrency: 2, warn_after: 1m, timeout: 5m }
            network: { wifi_check: plugins/wifi }
            timeouts: { connect: 10s, stall: { below: 2KiB, for: 90s } }
            tls: { ca_file: certs/ca.pem, cert: certs/client.pem, key: certs/client-key.pem }
            hosts: { hold_after: 3 }

            """
        for pem in ["ca", "client"] {
            _ = try folder.write("certs/\(pem).pem", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
        }
        _ = try folder.write("certs/client-key.pem", "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n")
        let config = try loadConfig(text, in: folder).get()
        let root = folder.path
        #expect(config.root == root)
        #expect(config.store == root + "/var/queue")
        #expect(config.definitions == root + "/defs")
        #expect(config.lifetimeMs == 2 * 86_400_000)
        #expect(config.maxVarsBytes == 64 * 1024)
        #expect(config.maxResponseBytes == 2 << 20)
        #expect(config.retry.backoff.baseMs == 500)
        #expect(config.retry.backoff.maxMs == 600_000)
        #expect(config.retry.backoff.jitter == 0.5)
        #expect(config.retry.exempt == [404, 410])
        #expect(config.headers.map(\.0) == ["Authorization", "X-Client"])
        #expect(config.headers.map(\.1) == ["Bearer {{ env.API_TOKEN }}", "outbox"])
        #expect(config.headersCommand == .argv(["plugins/headers", "--json"]))
        #expect(config.authRefreshCommand == .shell("plugins/refresh.sh"))
        #expect(config.redactHeaders == ["X-Secret", "x-api-key"])
        #expect(config.redactedHeaderNames.contains("x-secret"))
        #expect(config.redactedHeaderNames.contains("x-api-key"))
        #expect(config.eventsCommand == .shell("cat > /dev/null"))
        #expect(config.account == "{{ env.OUTBOX_ACCOUNT }}")
        #expect(config.concurrency == 8)
        #expect(config.perHost == 2)
        #expect(config.partConcurrency == 5)
        #expect(config.hookConcurrency == 2)
        #expect(config.hookWarnAfterMs == 60_000)
        #expect(config.hookTimeoutMs == 300_000)
        #expect(config.wifiCheck == .shell("plugins/wifi"))
        #expect(config.connectTimeoutMs == 10_000)
        #expect(config.stallBelowBytes == 2048)
        #expect(config.stallForMs == 90_000)
        #expect(config.caFile == root + "/certs/ca.pem")
        #expect(config.clientCert == root + "/certs/client.pem")
        #expect(config.clientKey == root + "/certs/client-key.pem")
        #expect(config.hostHoldAfter == 3)
    }

    @Test func outboxVariablesOverrideTheFile() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let file = try folder.write("config/outbox.yaml", "store: q\nconcurrency: 8\nper_host: 2\npart_concurrency: 5\n")
        let environment = [
            "OUTBOX_STORE": "/var/lib/outbox", "OUTBOX_CONCURRENCY": "32", "OUTBOX_PER_HOST": "6", "OUTBOX_PART_CONCURRENCY": "1",
        ]
        let config = try Config.load(file: file, environment: environment)
        #expect(config.store == "/var/lib/outbox")
        #expect(config.concurrency == 32)
        #expect(config.perHost == 6)
        #expect(config.partConcurrency == 1)
        // A relative store is the project root's, as in the file.
        #expect(try Config.load(file: file, environment: ["OUTBOX_STORE": "var/q"]).store == folder.path + "/var/q")
        let plain = try Config.load(file: file)
        #expect((plain.store, plain.concurrency, plain.perHost) == (folder.path + "/q", 8, 2))
    }

    // A number where text goes keeps its digits as written: a zip code, a hex-looking token.
    @Test func numbersInTextFieldsKeepTheirDigits() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let file = try folder.write("config/outbox.yaml", "headers:\n  X-Zip: 01234\n  X-Hex: 0x10\n  X-Exp: 1e3\n")
        let config = try Config.load(file: file)
        #expect(config.headers.map(\.1) == ["01234", "0x10", "1e3"])
    }

    // A number of the wrong kind is named as written, not as "a number".
    @Test func aNumberOfTheWrongKindIsNamedAsWritten() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let file = try folder.write("config/outbox.yaml", "concurrency: 16.0\nretry:\n  backoff: { base: 1s, max: 2h, jitter: .nan }\n")
        let error = #expect(throws: OutboxError.self) { try Config.load(file: file) }
        #expect(
            error?.diagnostics.map(\.message) == [
                "concurrency must be a whole number, not 16.0", "retry.backoff.jitter must be a number, not .nan",
            ])
    }

    // A PostgreSQL URL is kept as written (from the file or OUTBOX_STORE), and file bodies
    // are then staged in the root's .outbox; a folder store stages in itself.
    @Test func aPostgresStoreURLIsKeptAsWritten() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let url = "postgres://u:p@db.example:5432/app?schema=proj"
        let file = try folder.write("config/outbox.yaml", "store: \"\(url)\"\n")
        let config = try Config.load(file: file)
        #expect(config.store == url)
        #expect(config.stagingFolder == folder.path + "/.outbox")
        let fromEnvironment = try Config.load(file: file, environment: ["OUTBOX_STORE": "postgresql://u@h/db"])
        #expect(fromEnvironment.store == "postgresql://u@h/db")
        let plain = try Config.load(file: file, environment: ["OUTBOX_STORE": "q"])
        #expect(plain.stagingFolder == folder.path + "/q")
        #expect(!config.stagingShared)
    }

    // `staging` names the folder of file bodies for a server store, and whether all hosts share it.
    @Test func stagingIsReadForAServerStore() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let file = try folder.write(
            "config/outbox.yaml", "store: postgres://u@h/db\nstaging:\n  path: shared/bodies\n  shared: true\n")
        let config = try Config.load(file: file)
        #expect(config.stagingFolder == folder.path + "/shared/bodies")
        #expect(config.stagingShared)
        // A folder store stages in itself, whatever `staging` says.
        let local = try Config.load(file: file, environment: ["OUTBOX_STORE": "q"])
        #expect(local.stagingFolder == folder.path + "/q")
        let bad = try folder.write("config/bad.yaml", "staging:\n  shared: maybe\n")
        let error = #expect(throws: OutboxError.self) { try Config.load(file: bad) }
        #expect(error?.code == .config)
    }

    // `lease` is a duration of at least a second, 30 s when left out; a shorter one names the field and its value.
    @Test func leaseIsADurationOfAtLeastASecond() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        #expect(try Config.load(file: try folder.write("config/outbox.yaml", "")).leaseMs == 30_000)
        #expect(try Config.load(file: try folder.write("config/outbox.yaml", "lease: 2m\n")).leaseMs == 120_000)
        let short = try folder.write("config/short.yaml", "lease: 500ms\n")
        let error = #expect(throws: OutboxError.self) { try Config.load(file: short) }
        #expect(error?.code == .config)
        #expect(error?.diagnostics.map(\.message) == ["lease must be at least 1s, not 500ms"])
    }

    @Test func rootMovesTheProjectAndRelativePaths() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let file = try folder.write("etc/outbox.yaml", "root: ../project\nstore: q\n")
        // The root must be a folder that exists.
        #expect(throws: OutboxError.self) { try Config.load(file: file) }
        try FileManager.default.createDirectory(atPath: folder.path + "/project", withIntermediateDirectories: true)
        let config = try Config.load(file: file)
        #expect(config.root == folder.path + "/project")
        #expect(config.store == folder.path + "/project/q")
        #expect(config.definitions == folder.path + "/project/definitions")
    }

    @Test func aConfigOutsideAConfigFolderRootsAtItsFolder() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let file = try folder.write("settings/outbox.yaml", "")
        let config = try Config.load(file: file)
        #expect(config.root == folder.path + "/settings")
    }

    @Test func builtinWifiCheckAndNullsKeepDefaults() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let text =
            "network: { wifi_check: builtin }\nheaders_command: null\naccount: null\nhooks: { timeout: null }\ntls: { ca_file: null }\n"
        let config = try loadConfig(text, in: folder).get()
        #expect(config.wifiCheck == nil)
        #expect(config.headersCommand == nil)
        #expect(config.account == nil)
        #expect(config.hookTimeoutMs == nil)
        #expect(config.caFile == nil)
    }

    struct UnitCase: Sendable, CustomTestStringConvertible {
        let yaml: String
        let lifetime: Int64
        let maxVars: Int64
        var testDescription: String { yaml }
    }

    static let units: [UnitCase] = [
        UnitCase(yaml: "lifetime: 500ms\nmax_vars_bytes: 1024", lifetime: 500, maxVars: 1024),
        UnitCase(yaml: "lifetime: 30s\nmax_vars_bytes: 1KiB", lifetime: 30_000, maxVars: 1024),
        UnitCase(yaml: "lifetime: 10m\nmax_vars_bytes: 8MiB", lifetime: 600_000, maxVars: 8 << 20),
        UnitCase(yaml: "lifetime: 2h\nmax_vars_bytes: 1GiB", lifetime: 7_200_000, maxVars: 1 << 30),
        UnitCase(yaml: "lifetime: 14d\nmax_vars_bytes: \"2048\"", lifetime: 1_209_600_000, maxVars: 2048),
        UnitCase(yaml: "lifetime: 1ms\nmax_vars_bytes: 0", lifetime: 1, maxVars: 0),
    ]

    @Test(arguments: units)
    func durationsAndSizes(_ c: UnitCase) throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let config = try loadConfig(c.yaml + "\n", in: folder).get()
        #expect(config.lifetimeMs == c.lifetime)
        #expect(config.maxVarsBytes == c.maxVars)
    }

    static let bad: [BadCase] = [
        BadCase(
            name: "unknown top-level field", yaml: "store: .outbox\nconcurency: 4\n", line: 2, column: 1,
            message: "unknown field \"concurency\" in the config"),
        BadCase(
            name: "unknown nested field", yaml: "hooks:\n  concurrency: 2\n  warn_afer: 10s\n", line: 3, column: 3,
            message: "unknown field \"warn_afer\" in hooks"),
        BadCase(
            name: "unknown field in retry.backoff", yaml: "retry:\n  backoff: { base: 1s, max: 2h, jitter: 0.2, factor: 2 }\n",
            line: 2, column: 46, message: "unknown field \"factor\" in retry.backoff"),
        BadCase(
            name: "string for a number", yaml: "concurrency: many\n", line: 1, column: 14,
            message: "concurrency must be a whole number, not a string"),
        BadCase(
            name: "number out of range", yaml: "per_host: 0\n", line: 1, column: 11,
            message: "per_host must be between 1 and 256, not 0"),
        BadCase(
            name: "hosts.hold_after out of range", yaml: "hosts: { hold_after: -1 }\n", line: 1, column: 22,
            message: "hosts.hold_after must be between 0 and 1000, not -1"),
        BadCase(
            // The config is the certificate file here: it holds the PEM marker a certificate needs.
            name: "a client certificate without its key", yaml: "# -----BEGIN CERTIFICATE-----\ntls: { cert: config/outbox.yaml }\n",
            line: 2, column: 6,
            message: "tls.cert and tls.key go together: give both or neither"),
        BadCase(
            name: "a CA file that is not there", yaml: "tls: { ca_file: nowhere.pem }\n", line: 1, column: 17,
            message: "tls.ca_file: cannot read "),
        BadCase(name: "a CA file that is a folder", yaml: "tls: { ca_file: config }\n", line: 1, column: 17, message: "tls.ca_file: "),
        BadCase(name: "an empty store path", yaml: "store: ''\n", line: 1, column: 8, message: "store is empty: give a path"),
        BadCase(
            name: "a store path with ~", yaml: "store: ~/queue\n", line: 1, column: 8,
            message: "store: \"~/queue\" starts with ~, which is not expanded here"),
        BadCase(name: "an empty definitions path", yaml: "definitions: ''\n", line: 1, column: 14, message: "definitions is empty"),
        BadCase(
            name: "unknown field in hosts", yaml: "hosts: { hold: 3 }\n", line: 1, column: 10,
            message: "unknown field \"hold\" in hosts"),
        BadCase(
            name: "list for a mapping", yaml: "retry: [1, 2]\n", line: 1, column: 8,
            message: "retry must be a mapping, not a list"),
        BadCase(
            name: "mapping for a string", yaml: "store: { path: x }\n", line: 1, column: 8,
            message: "store must be a string, not a mapping"),
        BadCase(
            name: "headers not a mapping", yaml: "headers: [a, b]\n", line: 1, column: 10,
            message: "headers must be a mapping of header names to values"),
        BadCase(
            name: "bad header name", yaml: "headers:\n  \"X Bad\": 1\n", line: 2, column: 3,
            message: "headers: header name \"X Bad\" has a character not allowed in header names"),
        BadCase(
            name: "duration without unit", yaml: "lifetime: 5\n", line: 1, column: 11,
            message: "lifetime: bad duration \"5\" (a unit is required: use 500ms, 30s, 10m, 2h or 14d)"),
        BadCase(
            name: "unknown duration unit", yaml: "hooks: { warn_after: 3 weeks }\n", line: 1, column: 22,
            message: "hooks.warn_after: bad duration \"3 weeks\""),
        BadCase(
            name: "lower-case size unit", yaml: "max_vars_bytes: 8mb\n", line: 1, column: 17,
            message: "max_vars_bytes: bad size \"8mb\""),
        BadCase(
            name: "jitter above 1", yaml: "retry:\n  backoff: { base: 1s, max: 2h, jitter: 3 }\n", line: 2, column: 41,
            message: "retry.backoff.jitter must be between 0.0 and 1.0, not 3.0"),
        BadCase(
            name: "incomplete backoff", yaml: "retry:\n  backoff: { base: 1s, jitter: 0 }\n", line: 2, column: 12,
            message: "retry.backoff must give base, max and jitter (missing max)"),
        BadCase(
            name: "exempt outside 4xx", yaml: "retry:\n  terminal_http: { exempt: [500] }\n", line: 2, column: 29,
            message: "retry.terminal_http.exempt items must be between 400 and 499, not 500"),
        BadCase(
            name: "empty command", yaml: "headers_command: \"  \"\n", line: 1, column: 18,
            message: "headers_command is an empty command"),
        BadCase(
            name: "bad header template", yaml: "headers:\n  Authorization: \"Bearer {{ env.TOKEN \"\n", line: 2, column: 18,
            message: "headers.Authorization: "),
        BadCase(name: "YAML syntax error", yaml: "store: [unclosed\n", line: 2, column: 1, message: ""),
    ]

    @Test(arguments: bad)
    func badFieldsAreDiagnosedAtTheirPosition(_ c: BadCase) throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        guard case let .failure(error) = try loadConfig(c.yaml, in: folder) else {
            Issue.record("the config loaded")
            return
        }
        #expect(error.code == .config)
        #expect(error.code.exitStatus == 78)
        let d = try #require(error.diagnostics.first)
        #expect(error.diagnostics.count == 1)
        #expect(d.path == folder.path + "/config/outbox.yaml")
        #expect(d.line == c.line)
        #expect(d.column == c.column)
        #expect(d.message.hasPrefix(c.message), "\(d.message)")
        #expect(error.message == "1 error")
    }

    @Test func everyErrorOfTheConfigIsReported() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let text = "bogus: 1\nconcurrency: x\nlifetime: forever\nhooks: { nope: 1 }\n"
        guard case let .failure(error) = try loadConfig(text, in: folder) else {
            Issue.record("the config loaded")
            return
        }
        #expect(error.message == "4 errors")
        #expect(error.diagnostics.map { "\($0.line):\($0.column)" } == ["1:1", "2:14", "3:11", "4:10"])
    }

    @Test func aMissingConfigFileIsFileMissing() {
        #expect(throws: OutboxError.self) { try Config.load(file: "/nonexistent/outbox-\(UUID().uuidString).yaml") }
        do {
            _ = try Config.load(file: "/nonexistent/x.yaml")
        } catch {
            #expect(error.code == .fileMissing)
            #expect(error.message.contains("/nonexistent/x.yaml"))
        }
    }

    @Test func locateWalksUpFromTheCurrentFolder() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let file = try folder.write("config/outbox.yaml", "")
        try FileManager.default.createDirectory(atPath: folder.path + "/a/b", withIntermediateDirectories: true)
        #expect(Config.locate(explicit: nil, cwd: folder.path + "/a/b") == file)
        #expect(Config.locate(explicit: "other.yaml", cwd: folder.path + "/a") == folder.path + "/a/other.yaml")
    }
}

struct DefinitionTests {
    static let valid = """
        key: note.comment.add
        request:
          method: POST
          url: https://api.example.com/sites/{{ vars.site_id }}/notes
          headers:
            X-Client: field-app
          data:
            comment: "{{ vars.comment }}"
        response: json
        accept:
          - status: 409
            body_includes: already exists
        retry:
          backoff: { base: 1s, max: 2h, jitter: 0.2 }
          terminal_http: { exempt: [404] }
        expires_in: 14d
        scope: "note-{{ vars.note_id }}"
        on_rejected: cancel-scope
        on_success: hooks/ok.sh
        on_error: [hooks/err.sh, --verbose]

        """

    @Test func aFullDefinitionIsRead() throws {
        let (d, diagnostics) = readDefinition(Self.valid)
        #expect(diagnostics.isEmpty)
        let def = try #require(d)
        #expect(def.key == "note.comment.add")
        #expect(def.file == "/defs/test.yaml")
        #expect(def.response == .json)
        #expect(def.accept == [AcceptRule(status: 409, bodyIncludes: "already exists")])
        #expect(def.retry?.exempt == [404])
        #expect(def.expiresInMs == Int64(1_209_600_000))
        #expect(def.scope == "note-{{ vars.note_id }}")
        #expect(def.cancelScopeOnError)
        #expect(def.onSuccess == .shell("hooks/ok.sh"))
        #expect(def.onError == .argv(["hooks/err.sh", "--verbose"]))
        #expect(def.request?["url"] == .string("https://api.example.com/sites/{{ vars.site_id }}/notes"))
        #expect(def.request?["data"] == .object([("comment", .string("{{ vars.comment }}"))]))
    }

    static let bad: [BadCase] = [
        BadCase(
            name: "unknown field in request",
            yaml: """
                key: k
                request:
                  url: https://x.example/
                  methd: PUT

                """, line: 4, column: 3, message: "unknown field \"methd\" in request"),
        BadCase(
            name: "unknown top-level field", yaml: "key: k\nrequest: { url: \"https://x.example/\" }\nretries: 3\n",
            line: 3, column: 1, message: "unknown field \"retries\" in a definition"),
        BadCase(
            name: "two body kinds",
            yaml: """
                key: k
                request:
                  url: https://x.example/
                  data: { a: 1 }
                  text: hello

                """, line: 5, column: 9, message: "request has more than one body kind (data, text): give at most one"),
        BadCase(
            name: "GET with data",
            yaml: """
                key: k
                request:
                  method: GET
                  url: https://x.example/
                  data: { a: 1 }

                """, line: 5, column: 9, message: "a GET request cannot have a body (request.data)"),
        BadCase(
            name: "file: URL", yaml: "key: k\nrequest:\n  url: file:///etc/passwd\n", line: 3, column: 8,
            message: "request.url: scheme \"file\" is not allowed (http or https only)"),
        BadCase(
            name: "gopher: URL", yaml: "key: k\nrequest:\n  url: gopher://x\n", line: 3, column: 8,
            message: "request.url: scheme \"gopher\" is not allowed (http or https only)"),
        BadCase(
            name: "ftp: URL", yaml: "key: k\nrequest:\n  url: \"ftp://x\"\n", line: 3, column: 8,
            message: "request.url: scheme \"ftp\" is not allowed (http or https only)"),
        BadCase(
            name: "unknown method", yaml: "key: k\nrequest:\n  url: https://x.example/\n  method: FETCH\n", line: 4, column: 11,
            message: "request.method must be one of POST, PUT, PATCH, DELETE, GET, MKCOL, COPY, MOVE, not \"FETCH\""),
        BadCase(
            name: "YAML 1.1 yes for a bool", yaml: "key: k\nrequest:\n  url: https://x.example/\n  wifi_only: yes\n",
            line: 4, column: 14, message: "request.wifi_only must be true or false, not a string (YAML 1.2: write true or false)"),
        BadCase(
            name: "bad duration", yaml: "key: k\nrequest: { url: \"https://x.example/\" }\nexpires_in: 2 weeks\n",
            line: 3, column: 13, message: "expires_in: bad duration \"2 weeks\""),
        BadCase(
            name: "wrong type for accept", yaml: "key: k\nrequest: { url: \"https://x.example/\" }\naccept: 409\n",
            line: 3, column: 9, message: "accept must be a list of {status, body_includes?}"),
        BadCase(
            name: "bad ownership", yaml: "key: k\nrequest:\n  url: https://x.example/\n  file: a.bin\n  ownership: steal\n",
            line: 5, column: 14, message: "request.ownership must be copy, move or reference, not \"steal\""),
        BadCase(
            name: "parts without file", yaml: "key: k\nrequest:\n  parts: { url: \"https://x.example/{{ part.number }}\" }\n",
            line: 3, column: 10, message: "request.parts needs request.file"),
        BadCase(
            name: "plan min over max",
            yaml: """
                key: k
                request:
                  file: a.bin
                  parts:
                    plan: { min: 30MiB, max: 20MiB }
                    url: "https://x.example/{{ part.number }}"

                """, line: 5, column: 11, message: "request.parts.plan: min is greater than max"),
        BadCase(
            name: "no key", yaml: "request: { url: \"https://x.example/\" }\n", line: 1, column: 1, message: "a definition needs a key"),
        BadCase(name: "no request", yaml: "key: k\n", line: 1, column: 1, message: "a definition needs request (or request_command)"),
        BadCase(
            name: "template syntax error", yaml: "key: k\nrequest:\n  url: \"https://x.example/{{ vars.a \"\n",
            line: 3, column: 8, message: "request.url: "),
        BadCase(
            name: "bad header template reported once",
            yaml: "key: k\nrequest:\n  url: https://x.example/\n  headers: { X-A: \"{{ vars.a\" }\n",
            line: 4, column: 19, message: "request.headers.X-A: "),
        BadCase(
            name: "bad template deep in data",
            yaml: "key: k\nrequest:\n  url: https://x.example/\n  data:\n    items:\n      - \"{{ vars.a | nope }}\"\n",
            line: 6, column: 9, message: "request.data.items[0]: "),
        BadCase(
            name: "response mapping without command", yaml: "key: k\nrequest: { url: \"https://x.example/\" }\nresponse: {}\n",
            line: 3, column: 11, message: "response needs a command"),
        BadCase(
            name: "unquoted template is a flow mapping", yaml: "key: k\nrequest:\n  url: https://x.example/\n  data: {{ vars.a }}\n",
            line: 4, column: 9, message: "a value starting with {{ is read as a YAML flow mapping, not a template; quote templates"),
    ]

    @Test(arguments: bad)
    func badDefinitionsAreDiagnosedAtTheirPosition(_ c: BadCase) throws {
        let (_, diagnostics) = readDefinition(c.yaml)
        let d = try #require(diagnostics.first)
        #expect(diagnostics.count == 1, "\(diagnostics)")
        #expect(d.path == "/defs/test.yaml")
        #expect("\(d.line):\(d.column)" == "\(c.line):\(c.column)", "\(d.message)")
        #expect(d.message.hasPrefix(c.message), "\(d.message)")
    }

    @Test func everyErrorOfAFileIsReported() throws {
        let yaml = """
            key: k
            request:
              method: FETCH
              url: gopher://x
              bogus: 1
            expires_in: soon
            on_rejected: shrug

            """
        let (_, diagnostics) = readDefinitionInSourceOrder(yaml)
        #expect(diagnostics.map { "\($0.line):\($0.column)" } == ["3:11", "4:8", "5:3", "6:13", "7:14"])
        #expect(diagnostics[0].message.hasPrefix("request.method must be one of"))
        #expect(diagnostics[1].message.hasPrefix("request.url: scheme \"gopher\""))
        #expect(diagnostics[2].message.hasPrefix("unknown field \"bogus\" in request"))
        #expect(diagnostics[3].message.hasPrefix("expires_in: bad duration"))
        #expect(diagnostics[4].message == "on_rejected must be continue or cancel-scope, not \"shrug\"")
    }

    @Test func templatedMethodAndURLAreLeftToEnqueue() throws {
        let yaml = "key: k\nrequest:\n  method: \"{{ vars.m }}\"\n  url: \"{{ vars.url }}\"\n  data: { a: 1 }\n"
        let (d, diagnostics) = readDefinition(yaml)
        #expect(diagnostics.isEmpty)
        #expect(d?.request?["method"] == .string("{{ vars.m }}"))
    }

    @Test func aTemplateInACommandIsSpottedAndLiteralBracesAreNot() {
        #expect(TemplateVocabulary.mentionsARoot("{{ vars.id }}"))
        #expect(TemplateVocabulary.mentionsARoot("x.sh --to={{outcome.data.url}}"))
        #expect(TemplateVocabulary.mentionsARoot("a {{ x }} then {{  env.HOME | raw }}"))
        #expect(!TemplateVocabulary.mentionsARoot("printf '{{}}'"))
        #expect(!TemplateVocabulary.mentionsARoot("gotmpl '{{ .Name }}'"))
        #expect(!TemplateVocabulary.mentionsARoot("{{ variables.x }} {{ vars }}"))
        #expect(!TemplateVocabulary.mentionsARoot("{{"))
    }

    @Test func renderedDiagnosticPointsAtTheColumn() {
        let source = "key: k\nrequest:\n  url: https://x.example/\n  methd: PUT\n"
        let d = Diagnostic(path: "definitions/k.yaml", line: 4, column: 3, message: "unknown field \"methd\" in request")
        #expect(
            d.rendered(source: source) == """
                definitions/k.yaml:4:3: error: unknown field "methd" in request
                  methd: PUT
                  ^
                """)
        let tabbed = Diagnostic(path: "a.yaml", line: 1, column: 3, message: "m")
        #expect(tabbed.rendered(source: "\tab: 1\r\nnext") == "a.yaml:1:3: error: m\n\tab: 1\n\t ^")
        #expect(Diagnostic(path: "a.yaml", line: 9, column: 1, message: "m").rendered(source: "one line") == "a.yaml:9:1: error: m")
        #expect(Diagnostic(path: "a.yaml", line: 1, column: 1, message: "m").rendered(source: nil) == "a.yaml:1:1: error: m")
    }
}

struct DefinitionSetTests {
    static let good = "key: good.one\nrequest:\n  url: https://x.example/\n"
    static let goodTwo = "key: good.two\nrequest:\n  url: https://y.example/\n"

    @Test func loadsEveryYAMLFile() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        try folder.write("definitions/a.yaml", Self.good)
        try folder.write("definitions/b.yml", Self.goodTwo)
        try folder.write("definitions/notes.txt", "not a definition")
        let set = DefinitionSet.load(folder: folder.path + "/definitions")
        #expect(set.definitions.keys.sorted() == ["good.one", "good.two"])
        #expect(set.diagnostics.isEmpty)
        #expect(set.brokenKeys.isEmpty)
        #expect(set.fileCount == 2)
        #expect(set.definitions["good.two"]?.file == folder.path + "/definitions/b.yml")
    }

    /// A file name that is not UTF-8 is said as such, not as a file that cannot be read.
    @Test func aDefinitionFileNameThatIsNotUTF8IsNamedAsSuch() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        try folder.write("definitions/a.yaml", Self.good)
        let bad = folder.path + "/definitions/caf\u{FFFD}.yaml"
        let raw = Array((folder.path + "/definitions/caf").utf8) + [0xE9] + Array(".yaml".utf8) + [0]
        let fd = raw.withUnsafeBufferPointer { $0.withMemoryRebound(to: CChar.self) { open($0.baseAddress!, O_CREAT | O_WRONLY, 0o644) } }
        #expect(fd >= 0)
        close(fd)
        let set = DefinitionSet.load(folder: folder.path + "/definitions")
        #expect(set.definitions.keys.sorted() == ["good.one"])
        let d = try #require(set.diagnostics.first, "\(bad)")
        #expect(d.path == folder.path + "/definitions/caf\\xE9.yaml")
        #expect(d.message == "the file name is not valid UTF-8, so its definition is not read; rename the file")
    }

    /// A URL or header written out (no template) that makes every request head too large is
    /// refused when the definition loads, not at every enqueue.
    @Test(arguments: ["url: \"http://x/BIG\"", "url: http://x/\n  headers:\n    X-Big: BIG"])
    func aWrittenOutHeadOverTheLimitIsADefinitionError(_ request: String) throws {
        let big = String(repeating: "a", count: HeaderRules.maxHeadBytes)
        let text = "key: big\nrequest:\n  " + request.replacingOccurrences(of: "BIG", with: big) + "\n"
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        try folder.write("definitions/big.yaml", text)
        let set = DefinitionSet.load(folder: folder.path + "/definitions")
        #expect(set.definitions.isEmpty)
        let d = try #require(set.diagnostics.first)
        #expect(d.message.hasPrefix("request: the URL and headers are "), "\(d.message)")
        #expect(d.line == (request.hasPrefix("url: \"") ? 3 : 5))
    }

    @Test func aMissingFolderIsAnEmptySet() {
        let set = DefinitionSet.load(folder: "/nonexistent/definitions-\(UUID().uuidString)")
        #expect(set.definitions.isEmpty)
        #expect(set.diagnostics.isEmpty)
    }

    @Test func aDuplicateKeyNamesBothFiles() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let first = try folder.write("definitions/a.yaml", Self.good)
        let second = try folder.write("definitions/b.yaml", Self.good)
        try folder.write("definitions/c.yaml", Self.goodTwo)
        let set = DefinitionSet.load(folder: folder.path + "/definitions")
        #expect(set.diagnostics.count == 1)
        let d = try #require(set.diagnostics.first)
        #expect(d.path == second)
        #expect(d.message.contains(first))
        #expect(d.message.contains(second))
        #expect(d.message.contains("good.one"))
        #expect(set.definitions["good.one"] == nil)
        #expect(set.brokenKeys["good.one"] == [d])
        #expect(set.definitions["good.two"] != nil)
    }

    @Test func aBrokenFileDisablesOnlyItsKey() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        try folder.write("definitions/a.yaml", Self.good)
        let broken = try folder.write("definitions/b.yaml", "key: broken.one\nrequest:\n  url: https://x.example/\n  retries: 3\n")
        let unreadable = try folder.write("definitions/c.yaml", "key: [unclosed\n")
        try folder.write("definitions/d.yaml", Self.goodTwo)
        let set = DefinitionSet.load(folder: folder.path + "/definitions")
        #expect(set.definitions.keys.sorted() == ["good.one", "good.two"])
        #expect(set.brokenKeys.keys.sorted() == ["broken.one"])
        let brokenDiagnostics = try #require(set.brokenKeys["broken.one"])
        #expect(brokenDiagnostics.map { "\($0.path):\($0.line):\($0.column)" } == ["\(broken):4:3"])
        #expect(set.diagnostics.map(\.path) == [broken, unreadable])
        #expect(set.sources[broken]?.hasPrefix("key: broken.one") == true)
    }
}

/// One bad YAML input and the diagnostic it must give, for the config and definition tables.
struct BadCase: Sendable, CustomTestStringConvertible {
    let name: String
    let yaml: String
    let line: Int
    let column: Int
    let message: String
    var testDescription: String { name }
}
