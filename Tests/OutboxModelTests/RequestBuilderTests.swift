import Foundation
import Testing
@testable import OutboxModel

/// Renders a definition (YAML text) with vars; the outer throw is a broken test setup.
private func build(
    _ yaml: String, vars: String = "null", config: Config = Config(root: "/project"), environment: [String: String] = [:],
    cwd: String = "/work", commandHeaders: [(String, String)] = [], id: String = "entry-1"
) throws -> Result<PreparedRequest, OutboxError> {
    let (definition, diagnostics) = readDefinition(yaml)
    guard diagnostics.isEmpty, let definition, let request = definition.request else {
        throw TestFailure("the definition does not load: \(diagnostics.map(\.message))")
    }
    var inputs = RenderInputs(id: id, vars: try JSON.parse(vars), environment: environment, cwd: cwd)
    inputs.commandHeaders = commandHeaders
    do throws(OutboxError) {
        return .success(try RequestBuilder.prepare(request: request, definition: definition, config: config, inputs: inputs))
    } catch {
        return .failure(error)
    }
}

private func prepared(
    _ yaml: String, vars: String = "null", config: Config = Config(root: "/project"),
    environment: [String: String] = [:], cwd: String = "/work",
    commandHeaders: [(String, String)] = []
) throws -> PreparedRequest {
    try build(yaml, vars: vars, config: config, environment: environment, cwd: cwd, commandHeaders: commandHeaders).get()
}

private func failure(_ yaml: String, vars: String = "null", cwd: String = "/work") throws -> OutboxError {
    switch try build(yaml, vars: vars, cwd: cwd) {
    case .success: throw TestFailure("prepare succeeded")
    case let .failure(error): return error
    }
}

private func bodyText(_ p: PreparedRequest) -> String? {
    guard case let .bytes(bytes, _) = p.body else { return nil }
    return String(decoding: bytes, as: UTF8.self)
}

private func headerPairs(_ p: PreparedRequest) -> [String] { p.headers.map { "\($0.0): \($0.1)" } }

struct RequestBuilderTests {
    // MARK: data

    struct DataCase: Sendable, CustomTestStringConvertible {
        let name: String
        let data: String
        let vars: String
        let body: String
        var testDescription: String { name }
    }

    static let dataCases: [DataCase] = [
        DataCase(name: "number stays a number", data: "{ n: \"{{ vars.n }}\" }", vars: #"{"n": 5}"#, body: #"{"n":5}"#),
        DataCase(
            name: "object stays an object", data: "{ o: \"{{ vars.o }}\" }", vars: #"{"o": {"a": [1, true]}}"#,
            body: #"{"o":{"a":[1,true]}}"#),
        DataCase(name: "null stays null", data: "{ x: \"{{ vars.x }}\" }", vars: #"{"x": null}"#, body: #"{"x":null}"#),
        DataCase(name: "bool stays a bool", data: "[\"{{ vars.b }}\"]", vars: #"{"b": false}"#, body: "[false]"),
        DataCase(
            name: "big integer keeps its digits", data: "{ n: \"{{ vars.n }}\" }", vars: #"{"n": 12345678901234567890}"#,
            body: #"{"n":12345678901234567890}"#),
        DataCase(name: "inside text becomes text", data: "{ s: \"id-{{ vars.n }}\" }", vars: #"{"n": 5}"#, body: #"{"s":"id-5"}"#),
        DataCase(
            name: "array index path", data: "{ first: \"{{ vars.items.0.id }}\" }", vars: #"{"items": [{"id": "a"}]}"#,
            body: #"{"first":"a"}"#),
        DataCase(
            name: "whole data from one var", data: "\"{{ vars.payload }}\"", vars: #"{"payload": [1, {"k": "v"}]}"#,
            body: #"[1,{"k":"v"}]"#),
        DataCase(
            name: "braces in a var stay literal", data: "{ s: \"{{ vars.s }}\" }", vars: #"{"s": "{{ env.HOME }}"}"#,
            body: #"{"s":"{{ env.HOME }}"}"#),
        DataCase(
            name: "literal types kept", data: "{ a: 1, b: 2.5, c: true, d: null, e: \"007\" }", vars: "null",
            body: #"{"a":1,"b":2.5,"c":true,"d":null,"e":"007"}"#),
        DataCase(
            name: "json filter makes text", data: "{ s: \"{{ vars.o | json }}\" }", vars: #"{"o": {"a": 1}}"#,
            body: #"{"s":"{\"a\":1}"}"#),
    ]

    @Test(arguments: dataCases)
    func dataKeepsJSONTypes(_ c: DataCase) throws {
        let p = try prepared("key: k\nrequest:\n  url: https://x.example/\n  data: \(c.data)\n", vars: c.vars)
        #expect(bodyText(p) == c.body)
        #expect(p.body.kind == .data)
        #expect(HeaderRules.value(p.headers, "content-type") == "application/json")
    }

    // MARK: url

    struct URLCase: Sendable, CustomTestStringConvertible {
        let name: String
        let value: String
        let url: String
        var testDescription: String { name }
    }

    static let urlCases: [URLCase] = [
        URLCase(name: "dots beside a letter", value: "a..", url: "https://h.example/files/a../x"),
        URLCase(name: "three dots are a name", value: "...", url: "https://h.example/files/%2E%2E%2E/x"),
        URLCase(name: "%2F is encoded again", value: "%2F", url: "https://h.example/files/%252F/x"),
        URLCase(name: "slash and space", value: "a b/c", url: "https://h.example/files/a%20b%2Fc/x"),
        URLCase(name: "query characters", value: "a?b=c&d#e", url: "https://h.example/files/a%3Fb%3Dc%26d%23e/x"),
        URLCase(name: "unicode as UTF-8", value: "ünï", url: "https://h.example/files/%C3%BCn%C3%AF/x"),
        URLCase(name: "unreserved kept", value: "Az09-._~", url: "https://h.example/files/Az09-._~/x"),
    ]

    @Test(arguments: urlCases)
    func urlSubstitutionsArePercentEncoded(_ c: URLCase) throws {
        let vars = String(decoding: try JSONSerialization.data(withJSONObject: ["p": c.value]), as: UTF8.self)
        let p = try prepared("key: k\nrequest:\n  url: \"https://h.example/files/{{ vars.p }}/x\"\n", vars: vars)
        #expect(p.url == c.url)
    }

    /// A value that is `.` or `..` alone is sent encoded, as the contract says; one that makes
    /// such a segment with more (an encoded slash, a backslash) is refused.
    @Test(arguments: [(".", "%2E"), ("..", "%2E%2E")])
    func aValueOfOnlyDotsIsEncoded(_ value: String, _ encoded: String) throws {
        let vars = String(decoding: try JSONSerialization.data(withJSONObject: ["p": value]), as: UTF8.self)
        let p = try prepared("key: k\nrequest:\n  url: \"https://h.example/files/{{ vars.p }}/x\"\n", vars: vars)
        #expect(p.url == "https://h.example/files/\(encoded)/x")
    }

    @Test(arguments: ["../", "../../escaped", "a/..", "..\\x"])
    func aPathSegmentOfOnlyDotsIsRefused(_ value: String) throws {
        let vars = String(decoding: try JSONSerialization.data(withJSONObject: ["p": value]), as: UTF8.self)
        #expect(
            throws: OutboxError.invalid("request.url: {{ vars.p }} gives a \".\" or \"..\" path segment, which could climb the URL's path")
        ) {
            try prepared("key: k\nrequest:\n  url: \"https://h.example/files/{{ vars.p }}/x\"\n", vars: vars)
        }
    }

    /// A request head libcurl could never send (over its 1 MiB buffer), or one with thousands
    /// of headers, is refused at enqueue instead of failing every attempt until expiry.
    @Test func aRequestHeadLibcurlCannotSendIsRefused() throws {
        let big = String(repeating: "a", count: 600_000)
        let two = "key: k\nrequest:\n  url: https://h.example/x\n  headers:\n    X-A: \"{{ vars.b }}\"\n    X-B: \"{{ vars.b }}\"\n"
        #expect(throws: OutboxError.invalid("request: the URL and headers are 1200037 bytes, over the 1000000 of one request head")) {
            try prepared(two, vars: #"{"b": "\#(big)"}"#)
        }
        // Templated, as written-out ones are refused when the definition loads.
        let many = (0...HeaderRules.maxHeaders).map { "    X-H\($0): \"{{ vars.v }}\"\n" }.joined()
        #expect(throws: OutboxError.invalid("request.headers: 1001 headers, over the 1000 a request may carry")) {
            try prepared("key: k\nrequest:\n  url: https://h.example/x\n  headers:\n" + many, vars: #"{"v": "v"}"#)
        }
        #expect(try prepared(two, vars: #"{"b": "\#(String(repeating: "a", count: 400_000))"}"#).headers.count >= 2)
    }

    @Test func aWholeURLFromAVarIsUsedAsIs() throws {
        let signed = "https://s3.example/b/a%2Fb.bin?X-Amz-Signature=ab%2Fcd%3D"
        let p = try prepared("key: k\nrequest:\n  method: PUT\n  url: \"{{ vars.url }}\"\n", vars: #"{"url": "\#(signed)"}"#)
        #expect(p.url == signed)
        let raw = try prepared("key: k\nrequest:\n  url: \"https://h.example/{{ vars.p | raw }}\"\n", vars: #"{"p": "a/b"}"#)
        #expect(raw.url == "https://h.example/a/b")
    }

    struct BadURLCase: Sendable, CustomTestStringConvertible {
        let name: String
        let template: String
        let vars: String
        let message: String
        var testDescription: String { name }
    }

    static let badURLs: [BadURLCase] = [
        BadURLCase(
            name: "file scheme from a var", template: "{{ vars.url }}", vars: #"{"url": "file:///etc/passwd"}"#,
            message: "request.url: scheme \"file\" is not allowed (http or https only)"),
        BadURLCase(
            name: "gopher scheme from a var", template: "{{ vars.url }}", vars: #"{"url": "gopher://x"}"#,
            message: "request.url: scheme \"gopher\" is not allowed (http or https only)"),
        BadURLCase(
            name: "ftp scheme from a var", template: "{{ vars.url }}", vars: #"{"url": "ftp://x"}"#,
            message: "request.url: scheme \"ftp\" is not allowed (http or https only)"),
        BadURLCase(
            name: "a number as the URL", template: "{{ vars.url }}", vars: #"{"url": 5}"#,
            message: "request.url: {{ vars.url }} is a number; a URL must be a string"),
        BadURLCase(
            // After a raw value: where it lands is known once rendered (`check` refuses `https://{{ vars.host }}/`).
            name: "a var in the host", template: "https://{{ vars.sub | raw }}{{ vars.host }}/x",
            vars: #"{"sub": "a.", "host": "evil.example"}"#,
            message: "request.url: {{ vars.host }} is in the URL's scheme or host"),
    ]

    @Test(arguments: badURLs)
    func badURLsAreInvalid(_ c: BadURLCase) throws {
        let error = try failure("key: k\nrequest:\n  url: \"\(c.template)\"\n", vars: c.vars)
        #expect(error.code == .invalid)
        #expect(error.message.hasPrefix(c.message), "\(error.message)")
    }

    // MARK: headers

    @Test(arguments: ["a\r\nX-Evil: 1", "line\nbreak", "nul\u{0}byte", "cr\ronly"])
    func aHeaderWithCRLFFromVarsIsInvalid(_ note: String) throws {
        let vars = String(decoding: try JSONSerialization.data(withJSONObject: ["note": note]), as: UTF8.self)
        let error = try failure("key: k\nrequest:\n  url: https://x.example/\n  headers:\n    X-Note: \"{{ vars.note }}\"\n", vars: vars)
        #expect(error.code == .invalid)
        #expect(error.message == "request.headers.X-Note: header value contains CR, LF or NUL")
    }

    /// The framing headers are refused in any case, and only they: the check compares bytes.
    @Test(arguments: [
        ("Content-Length", true), ("TRANSFER-ENCODING", true), ("content-lengtH", true), ("transfer-encoding", true),
        ("Content-Lengths", false), ("Content-Lengt", false), ("Content-Type", false), ("", false),
        ("Transfer_Encoding", false), ("Content-Length\u{0}", false),
    ])
    func framingHeadersAreRefusedInAnyCase(_ name: String, _ framing: Bool) {
        #expect(HeaderRules.isFraming(name) == framing)
        #expect((HeaderRules.nameProblem(name)?.contains("outbox frames the body itself") ?? false) == framing)
    }

    @Test func headersMergeConfigThenCommandThenDefinition() throws {
        var config = Config(root: "/project")
        config.headers = [("X-A", "config-a"), ("X-B", "config-b"), ("X-C", "config-c")]
        let p = try prepared(
            """
            key: k
            request:
              method: DELETE
              url: https://x.example/
              idempotency_key: false
              headers:
                x-c: def-c
                X-D: def-d

            """, config: config, commandHeaders: [("x-b", "cmd-b"), ("X-C", "cmd-c")])
        #expect(headerPairs(p) == ["X-A: config-a", "x-b: cmd-b", "x-c: def-c", "X-D: def-d"])
        #expect(p.idempotencyKey == nil)
    }

    @Test func configHeadersAreRenderedWithTheEnvironment() throws {
        var config = Config(root: "/project")
        config.headers = [("Authorization", "Bearer {{ env.API_TOKEN }}")]
        let p = try prepared("key: k\nrequest:\n  url: https://x.example/\n", config: config, environment: ["API_TOKEN": "s3cret"])
        #expect(HeaderRules.value(p.headers, "authorization") == "Bearer s3cret")
        let missing = try build("key: k\nrequest:\n  url: https://x.example/\n", config: config)
        guard case let .failure(error) = missing else { Issue.record("rendered without the token"); return }
        #expect(error.code == .invalid)
        #expect(error.message.contains("env.API_TOKEN"))
    }

    struct ContentTypeCase: Sendable, CustomTestStringConvertible {
        let name: String
        let request: String
        let expected: [String]
        var testDescription: String { name }
    }

    static let contentTypes: [ContentTypeCase] = [
        ContentTypeCase(name: "data default", request: "  data: { a: 1 }", expected: ["Content-Type: application/json"]),
        ContentTypeCase(name: "text default", request: "  text: hello", expected: ["Content-Type: text/plain; charset=utf-8"]),
        ContentTypeCase(
            name: "content_type beats a Content-Type header",
            request: "  data: { a: 1 }\n  content_type: application/vnd.x+json\n  headers: { content-type: text/xml }",
            expected: ["Content-Type: application/vnd.x+json"]),
        ContentTypeCase(
            name: "a Content-Type header beats the default",
            request: "  data: { a: 1 }\n  headers: { content-type: application/merge-patch+json }",
            expected: ["content-type: application/merge-patch+json"]),
        ContentTypeCase(name: "content_type without a body", request: "  content_type: text/csv", expected: ["Content-Type: text/csv"]),
        ContentTypeCase(name: "no body, no header", request: "  method: DELETE", expected: []),
    ]

    @Test(arguments: contentTypes)
    func contentType(_ c: ContentTypeCase) throws {
        let p = try prepared("key: k\nrequest:\n  url: https://x.example/\n  idempotency_key: false\n\(c.request)\n")
        #expect(headerPairs(p) == c.expected)
    }

    @Test func anExplicitIdempotencyKeyHeaderBecomesTheKey() throws {
        let p = try prepared("key: k\nrequest:\n  url: https://x.example/\n  headers: { idempotency-key: order-42 }\n")
        #expect(p.idempotencyKey == "order-42")
        #expect(HeaderRules.value(p.headers, "Idempotency-Key") == nil)
        let get = try prepared("key: k\nrequest:\n  method: GET\n  url: https://x.example/\n  headers: { Idempotency-Key: g-1 }\n")
        #expect(get.idempotencyKey == "g-1")
    }

    @Test func getHasNoIdempotencyKeyByDefault() throws {
        let get = try prepared("key: k\nrequest:\n  method: get\n  url: https://x.example/\n")
        #expect(get.method == "GET")
        #expect(get.idempotencyKey == nil)
        let post = try prepared("key: k\nrequest:\n  url: https://x.example/\n")
        #expect(post.method == "POST")
        let key = try #require(post.idempotencyKey)
        #expect(key.count == 36)
        #expect(try prepared("key: k\nrequest:\n  url: https://x.example/\n").idempotencyKey != key)
        let forced = try prepared("key: k\nrequest:\n  method: GET\n  url: https://x.example/\n  idempotency_key: true\n")
        #expect(forced.idempotencyKey?.count == 36)
        let off = try prepared("key: k\nrequest:\n  method: PUT\n  url: https://x.example/\n  idempotency_key: false\n")
        #expect(off.idempotencyKey == nil)
    }

    // MARK: render errors

    @Test func anUnresolvedVarPathIsInvalidAndNamed() throws {
        let yaml = "key: k\nrequest:\n  url: \"https://x.example/sites/{{ vars.site_id }}\"\n"
        let error = try failure(yaml, vars: #"{"site": 1}"#)
        #expect(error.code == .invalid)
        #expect(error.message == "request.url: {{ vars.site_id }} does not resolve (vars has no \"site_id\")")
        let noVars = try failure(yaml)
        #expect(noVars.message == "request.url: {{ vars.site_id }} does not resolve (the entry has no vars)")
        let deep = try failure(
            "key: k\nrequest:\n  url: https://x.example/\n  data: { a: \"{{ vars.a.b.c }}\" }\n", vars: #"{"a": {"b": {}}}"#)
        #expect(deep.message == "request.data.a: {{ vars.a.b.c }} does not resolve (vars.a.b has no \"c\")")
    }

    @Test func aGetWithDataFromVarsIsInvalid() throws {
        let error = try failure(
            "key: k\nrequest:\n  method: \"{{ vars.m }}\"\n  url: https://x.example/\n  data: { a: 1 }\n",
            vars: #"{"m": "GET"}"#)
        #expect(error.code == .invalid)
        #expect(error.message == "a GET request cannot have a body (request.data)")
        let method = try failure("key: k\nrequest:\n  method: \"{{ vars.m }}\"\n  url: https://x.example/\n", vars: #"{"m": "TRACE"}"#)
        #expect(method.message.hasPrefix("request.method must be one of POST, PUT, PATCH, DELETE, GET, MKCOL, COPY, MOVE"))
    }

    @Test func aMissingFileIsFileMissingAndNamed() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let error = try failure(
            "key: k\nrequest:\n  method: PUT\n  url: https://x.example/\n  file: \"{{ vars.path }}\"\n",
            vars: #"{"path": "captures/none.bin"}"#, cwd: folder.path)
        #expect(error.code == .fileMissing)
        #expect(error.code.exitStatus == 66)
        #expect(error.message == "request.file: no such file \(folder.path)/captures/none.bin")
    }

    @Test func aFileBodyIsResolvedAgainstTheCurrentFolder() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let path = try folder.write("in/a.bin", "0123456789")
        let p = try prepared("key: k\nrequest:\n  method: PUT\n  url: https://x.example/\n  file: in/a.bin\n", cwd: folder.path)
        guard case let .file(identity, ownership) = p.body else { Issue.record("not a file body: \(p.body)"); return }
        #expect(identity.path == path)
        #expect(identity.size == 10)
        #expect(ownership == .copy)
        #expect(HeaderRules.value(p.headers, "content-type") == "application/octet-stream")
    }

    // MARK: parts

    static let planDefinition = """
        key: upload
        request:
          method: PUT
          file: "{{ vars.path }}"
          parts:
            plan: { min: 10, max: 20 }
            url: "https://up.example/{{ vars.upload }}/parts/{{ part.number }}?i={{ part.index }}"
            headers:
              Content-Range: "bytes {{ part.start }}-{{ part.last }}/{{ file.size }}"
              X-End: "{{ part.end }}"

        """

    struct PlanCase: Sendable, CustomTestStringConvertible {
        let size: Int
        let ranges: [(Int64, Int64)]
        var testDescription: String { "\(size) bytes" }
    }

    static let plans: [PlanCase] = [
        PlanCase(size: 45, ranges: [(0, 20), (20, 45)]),
        PlanCase(size: 50, ranges: [(0, 20), (20, 40), (40, 50)]),
        PlanCase(size: 20, ranges: [(0, 20)]),
        PlanCase(size: 7, ranges: [(0, 7)]),
        PlanCase(size: 29, ranges: [(0, 29)]),
        PlanCase(size: 30, ranges: [(0, 20), (20, 30)]),
    ]

    @Test(arguments: plans)
    func aPartsPlanRendersEachPart(_ c: PlanCase) throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let path = try folder.write("big.bin", String(repeating: "x", count: c.size))
        let p = try prepared(Self.planDefinition, vars: #"{"path": "big.bin", "upload": "u 1"}"#, cwd: folder.path)
        guard case let .parts(file, ownership, parts) = p.body else { Issue.record("not parts: \(p.body)"); return }
        #expect(file.path == path)
        #expect(ownership == .move)
        #expect(p.url == nil)
        #expect(parts.map { [$0.range.start, $0.range.end] } == c.ranges.map { [$0.0, $0.1] })
        for (i, part) in parts.enumerated() {
            #expect(part.url == "https://up.example/u%201/parts/\(i + 1)?i=\(i)")
            #expect(
                part.headers == [
                    HeaderPair("Content-Range", "bytes \(part.range.start)-\(part.range.end - 1)/\(c.size)"),
                    HeaderPair("X-End", "\(part.range.end)"),
                ])
        }
    }

    @Test func anEmptyFileIsOnePart() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        try folder.write("empty.bin", "")
        let p = try prepared(Self.planDefinition, vars: #"{"path": "empty.bin", "upload": "u"}"#, cwd: folder.path)
        guard case let .parts(_, _, parts) = p.body else { Issue.record("not parts"); return }
        #expect(parts.map(\.range) == [ByteRange(start: 0, end: 0)])
    }

    static let explicitDefinition = """
        key: upload
        request:
          method: PUT
          file: "{{ vars.path }}"
          ownership: copy
          parts: "{{ vars.parts }}"

        """

    struct TilingCase: Sendable, CustomTestStringConvertible {
        let name: String
        let ranges: [(Int, Int)]
        let problem: String?
        var testDescription: String { name }
    }

    static let tilings: [TilingCase] = [
        TilingCase(name: "exact tiling", ranges: [(0, 10), (10, 30)], problem: nil),
        TilingCase(name: "a gap", ranges: [(0, 10), (12, 30)], problem: "parts[1] starts at 12 but parts[0] ended at 10 (a gap)"),
        TilingCase(name: "an overlap", ranges: [(0, 10), (8, 30)], problem: "parts[1] starts at 8 but parts[0] ended at 10 (an overlap)"),
        TilingCase(
            name: "short of the end", ranges: [(0, 10), (10, 20)],
            problem: "the last part ends at 20 but the file has 30 bytes (10 not covered)"),
        TilingCase(name: "past the end", ranges: [(0, 31)], problem: "parts[0] ends at 31, past the end of the file (30 bytes)"),
        TilingCase(name: "not from 0", ranges: [(1, 30)], problem: "parts[0] starts at 1, not 0"),
    ]

    @Test(arguments: tilings)
    func explicitPartsMustTileTheFile(_ c: TilingCase) throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        try folder.write("f.bin", String(repeating: "y", count: 30))
        let list = c.ranges.enumerated().map { i, r in
            #"{"url": "https://up.example/p/\#(i)", "headers": {"X-Part": "\#(i)"}, "range": {"start": \#(r.0), "end": \#(r.1)}}"#
        }.joined(separator: ",")
        let result = try build(Self.explicitDefinition, vars: #"{"path": "f.bin", "parts": [\#(list)]}"#, cwd: folder.path)
        switch (result, c.problem) {
        case let (.success(p), nil):
            guard case let .parts(_, ownership, parts) = p.body else { Issue.record("not parts"); return }
            #expect(ownership == .copy)
            #expect(parts.map(\.url) == ["https://up.example/p/0", "https://up.example/p/1"])
            #expect(parts.map(\.headers) == [[HeaderPair("X-Part", "0")], [HeaderPair("X-Part", "1")]])
        case let (.failure(error), problem?):
            #expect(error.code == .invalid)
            #expect(error.message == "request.parts do not tile the file (30 bytes): \(problem)")
        default:
            Issue.record("unexpected \(result)")
        }
    }

    // MARK: body hash

    static let hashDefinition = "key: k\nrequest:\n  method: \"{{ vars.m }}\"\n  url: \"{{ vars.url }}\"\n  data: \"{{ vars.d }}\"\n"

    private func hash(_ vars: String, headers: [(String, String)] = []) throws -> String {
        try prepared(Self.hashDefinition, vars: vars, commandHeaders: headers).bodyHash
    }

    @Test func bodyHashIgnoresKeyOrderButNotURLOrMethod() throws {
        let base = try hash(#"{"m": "POST", "url": "https://x.example/a", "d": {"a": 1, "b": [1, 2]}}"#)
        #expect(base.count == 64)
        #expect(try hash(#"{"d": {"b": [1, 2], "a": 1}, "url": "https://x.example/a", "m": "POST"}"#) == base)
        #expect(try hash(#"{"m": "POST", "url": "https://x.example/a", "d": {"a": 1, "b": [1, 2]}}"#, headers: [("X-Other", "1")]) == base)
        #expect(try hash(#"{"m": "POST", "url": "https://x.example/b", "d": {"a": 1, "b": [1, 2]}}"#) != base)
        #expect(try hash(#"{"m": "PUT", "url": "https://x.example/a", "d": {"a": 1, "b": [1, 2]}}"#) != base)
        #expect(try hash(#"{"m": "POST", "url": "https://x.example/a", "d": {"a": 1, "b": [2, 1]}}"#) != base)
        #expect(try hash(#"{"m": "POST", "url": "https://x.example/a", "d": {"a": "1", "b": [1, 2]}}"#) != base)
    }

    @Test func bodyHashSeesFileIdentityAndText() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        try folder.write("a.bin", "aaaa")
        try folder.write("b.bin", "bbbb")
        let def = "key: k\nrequest:\n  method: PUT\n  url: https://x.example/\n  file: \"{{ vars.p }}\"\n"
        let a = try prepared(def, vars: #"{"p": "a.bin"}"#, cwd: folder.path).bodyHash
        #expect(try prepared(def, vars: #"{"p": "a.bin"}"#, cwd: folder.path).bodyHash == a)
        #expect(try prepared(def, vars: #"{"p": "b.bin"}"#, cwd: folder.path).bodyHash != a)
        let text = "key: k\nrequest:\n  url: https://x.example/\n  text: \"{{ vars.t }}\"\n"
        #expect(try prepared(text, vars: #"{"t": "x"}"#).bodyHash == prepared(text, vars: #"{"t": "x"}"#).bodyHash)
        #expect(try prepared(text, vars: #"{"t": "x"}"#).bodyHash != prepared(text, vars: #"{"t": "y"}"#).bodyHash)
    }

    /// A whole file's canonical body is written directly; it must be the general form's bytes,
    /// or a same-id enqueue across versions would see another body. Names and URLs that need
    /// escaping, sizes of several digits, every method that may carry a file.
    @Test(arguments: ["plain.bin", #"q"uote\back.bin"#, "é ü 漢.bin", "tab\tand\u{7F}del.bin", "\u{202E}rtl.bin"])
    func aFilesCanonicalBodyIsTheGeneralForm(_ name: String) throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        try folder.write(name, String(repeating: "z", count: 12_345))
        for method in ["PUT", "POST", "PATCH"] {
            let def =
                "key: k\nrequest:\n  method: \(method)\n  url: \"https://x.example/{{ vars.p | path }}?q=a%22b\"\n  file: \"{{ vars.p }}\"\n"
            let request = try prepared(def, vars: JSON.object([("p", .string(name))]).serialized(), cwd: folder.path)
            guard case .file = request.body else {
                Issue.record("not a file body: \(request.body)")
                return
            }
            #expect(request.canonicalBody == request.generalCanonicalBody, "\(String(decoding: request.canonicalBody, as: UTF8.self))")
        }
    }
}
