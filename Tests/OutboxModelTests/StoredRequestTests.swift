import OutboxModel
import Testing

/// A stored request reads back exactly as written, and damage is an error, never a default.
struct StoredRequestTests {
    static let whole: JSON = .object([
        ("method", .string("PUT")), ("url", .string("https://h/x")), ("headers", .array([.array([.string("A"), .string("1")])])),
        ("body_kind", .string("file")),
        ("file", .object([("path", .string("/p")), ("size", .int64(5)), ("mtime_ns", .int64(7)), ("inode", .number("9"))])),
        ("ownership", .string("reference")), ("accept", .array([.object([("status", .int(409)), ("body_includes", .null)])])),
        ("retry", RetryRules().json), ("response", .string("json")), ("follow_redirects", .int(3)), ("wifi_only", .bool(true)),
        ("cancel_scope_on_error", .bool(false)),
    ])

    /// A cut URL or file value reads as the parser reads it, whether it takes the shortcut
    /// (a string with nothing escaped) or not; a damaged one is refused like the parser does.
    @Test(arguments: [
        #""https://h.example/a/b?c=d""#, #""/data/in/ünïcode file.bin""#, #""""#, #""a\/b""#, #""tab\tin""#,
        #""quote \" in""#, #""\u00e9""#, "null", "12", #"{"a": 1}"#,
    ])
    func aCutValueReadsAsTheParserReadsIt(_ text: String) throws {
        #expect(try StoredRequestText.value(text) == (try JSON.parse(text)))
    }

    @Test(arguments: ["\"raw\u{1}control\"", "\"unterminated", "\"", "\"x\"\"", ""])
    func aDamagedCutValueIsRefused(_ text: String) {
        #expect(throws: JSONParseError.self) { try StoredRequestText.value(text) }
    }

    @Test func aRequestRoundTrips() throws {
        let request = try StoredRequest(json: Self.whole)
        #expect(request.bodyKind == .file)
        #expect(request.file == FileIdentity(path: "/p", size: 5, mtimeNs: 7, inode: 9, mode: nil))
        #expect(request.ownership == .reference)
        #expect(request.accept == [AcceptRule(status: 409)])
        #expect(request.response == .json)
        #expect(request.followRedirects == 3)
        #expect(request.wifiOnly == true)
        #expect(try StoredRequest(json: JSON.parse(request.text)).text == request.text)
    }

    static func without(_ field: String) -> JSON {
        .object((whole.objectValue ?? []).filter { $0.0 != field })
    }

    static func with(_ field: String, _ value: JSON) -> JSON {
        var json = whole
        json.set(field, value)
        return json
    }

    @Test(
        arguments: [
            ("no method", without("method"), "method: missing"),
            ("no body kind", without("body_kind"), "body_kind: missing"),
            ("an unknown body kind", with("body_kind", .string("blob")), "body_kind: unknown body kind \"blob\""),
            ("headers that are not pairs", with("headers", .array([.string("A: 1")])), "headers: a header is not a [name, value] pair"),
            ("an incomplete file identity", with("file", .object([("path", .string("/p"))])), "file: the file identity is incomplete"),
            ("an unknown ownership", with("ownership", .string("borrow")), "ownership: unknown ownership \"borrow\""),
            ("an accept rule without status", with("accept", .array([.object([])])), "accept: a rule has no status"),
            ("an unknown response mode", with("response", .int(1)), "response: unknown response mode"),
            ("no retry rules", without("retry"), "retry: missing"),
            ("a follow_redirects that is not a number", with("follow_redirects", .string("3")), "follow_redirects: not an integer"),
            ("no cancel_scope_on_error", without("cancel_scope_on_error"), "cancel_scope_on_error: not a boolean"),
            ("not an object", .array([]), "request: not a JSON object"),
            (
                "secret vars that are not paths", with("secret_vars", .array([.array([.bool(true)])])),
                "secret_vars: not a list of paths into the vars"
            ),
        ] as [(String, JSON, String)])
    func damageIsAStorageError(_ label: String, json: JSON, problem: String) {
        #expect(throws: OutboxError(.storage, "the stored request is damaged: \(problem)"), "\(label)") {
            try StoredRequest(json: json)
        }
    }

    /// Vars that went into a secret header are found by value, nested too, and shown redacted;
    /// short strings are left (they would match ordinary text).
    @Test func secretVarsAreFoundAndMasked() throws {
        let vars = try JSON.parse(
            #"{"token": "abc123456", "n": 1, "deep": {"list": ["x", "pw-9876543"]}, "user": "alice", "pin": 20261204}"#)
        let secrets = HeaderRules.secretValues(
            [("Authorization", "Basic alice:pw-9876543"), ("X-Key", "abc123456-suffix"), ("X-Pin", "20261204")],
            names: ["authorization", "x-key", "x-pin"])
        let paths = SecretVars.paths(in: vars) { secrets }
        #expect(paths == [[.string("token")], [.string("deep"), .string("list"), .int(1)], [.string("pin")]])
        let masked = SecretVars.masking(vars, paths)
        #expect(
            masked.serialized() == #"{"token":"[redacted]","n":1,"deep":{"list":["x","[redacted]"]},"user":"alice","pin":"[redacted]"}"#)
        var request = try StoredRequest(json: Self.whole)
        request.secretVars = paths
        #expect(try StoredRequest(json: JSON.parse(request.text)).secretVars == paths, "kept in the stored request")
    }

    @Test func aBodyWhoseFileIsMissingIsDamage() throws {
        #expect(throws: OutboxError(.storage, "the stored entry is damaged: a parts body without its file")) {
            try StoredBody(kind: .parts, inline: nil, file: nil, form: [])
        }
        #expect(try StoredBody(kind: .text, inline: nil, file: "/big", form: []) == .file(path: "/big"))
        #expect(try StoredBody(kind: .data, inline: [1], file: nil, form: []) == .bytes([1]))
    }
}
