import Foundation
import Testing
@testable import OutboxModel

/// The `s3` request kind at enqueue (rendering, URLs, checks) and the credentials the runner reads.
@Suite struct S3RequestTests {
    /// A definition putting `file` (written in the test's folder) with `s3` fields given as YAML flow text.
    static func render(
        _ s3: String, extra: String = "", vars: String = #"{"rel": "a/b c.bin"}"#
    ) throws -> Result<PreparedRequest, OutboxError> {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        try folder.write("f.bin", "12345")
        let yaml = "key: s3.put\nrequest:\n  s3: \(s3)\n  file: f.bin\n\(extra)"
        let (definition, diagnostics) = readDefinition(yaml)
        guard diagnostics.isEmpty, let definition, let request = definition.request else {
            throw TestFailure("the definition does not load: \(diagnostics.map(\.message))")
        }
        let inputs = RenderInputs(id: "e1", vars: try JSON.parse(vars), environment: ["BUCKET": "my-bucket"], cwd: folder.path)
        do throws(OutboxError) {
            return .success(
                try RequestBuilder.prepare(request: request, definition: definition, config: Config(root: "/p"), inputs: inputs))
        } catch {
            return .failure(error)
        }
    }

    struct URLCase: Sendable, CustomTestStringConvertible {
        var name: String
        var s3: String
        var url: String
        var testDescription: String { name }
    }

    @Test(arguments: [
        URLCase(
            name: "AWS, virtual host", s3: #"{bucket: "{{ env.BUCKET }}", key: "x/{{ vars.rel }}", region: eu-west-3}"#,
            url: "https://my-bucket.s3.eu-west-3.amazonaws.com/x/a/b%20c.bin"),
        URLCase(
            name: "AWS, path style", s3: #"{bucket: my-bucket, key: "{{ vars.rel }}", region: us-east-1, path_style: true}"#,
            url: "https://s3.us-east-1.amazonaws.com/my-bucket/a/b%20c.bin"),
        URLCase(
            name: "an empty endpoint is the default", s3: #"{bucket: b12, key: k, region: eu-west-3, endpoint: ""}"#,
            url: "https://b12.s3.eu-west-3.amazonaws.com/k"),
        URLCase(
            name: "an IP endpoint is path style",
            s3: #"{bucket: b12, key: "k+1!(2)", region: us-east-1, endpoint: "http://127.0.0.1:9000/"}"#,
            url: "http://127.0.0.1:9000/b12/k%2B1%21%282%29"),
        URLCase(
            name: "localhost is path style", s3: #"{bucket: b12, key: "é", region: us-east-1, endpoint: "http://localhost:9000"}"#,
            url: "http://localhost:9000/b12/%C3%A9"),
        URLCase(
            name: "a named endpoint takes bucket subdomains",
            s3: #"{bucket: b12, key: k, region: auto, endpoint: "https://minio.example.com"}"#,
            url: "https://b12.minio.example.com/k"),
        URLCase(
            name: "path_style from a template",
            s3: #"{bucket: b12, key: k, region: auto, endpoint: "https://s.example.com", path_style: "{{ vars.ps }}"}"#,
            url: "https://s.example.com/b12/k"),
    ])
    func objectURL(_ c: URLCase) throws {
        let p = try Self.render(c.s3, vars: #"{"rel": "a/b c.bin", "ps": true}"#).get()
        #expect(p.url == c.url)
        #expect(p.method == "PUT")
        #expect(p.s3 != nil)
        if case .file = p.body {} else { Issue.record("an s3 request sends its file whole") }
    }

    @Test func storageClassAndContentTypeBecomeHeaders() throws {
        let p = try Self.render(#"{bucket: b12, key: k, region: us-east-1, storage_class: STANDARD_IA, content_type: video/mp4}"#).get()
        #expect(HeaderRules.value(p.headers, "x-amz-storage-class") == "STANDARD_IA")
        #expect(HeaderRules.value(p.headers, "Content-Type") == "video/mp4")
        let plain = try Self.render(#"{bucket: b12, key: k, region: us-east-1}"#).get()
        #expect(HeaderRules.value(plain.headers, "Content-Type") == "application/octet-stream")
        #expect(HeaderRules.value(plain.headers, "x-amz-storage-class") == nil)
    }

    @Test func theStoredRequestKeepsTheTargetAndNoCredentials() throws {
        let p = try Self.render(#"{bucket: b12, key: "a/b", region: eu-west-3, storage_class: GLACIER}"#).get()
        let stored = StoredRequest(prepared: p, form: [])
        let back = try StoredRequest(json: try JSON.parse(stored.text))
        #expect(back.s3 == p.s3)
        #expect(back.s3?.signingProvider == "aws:amz:eu-west-3:s3")
        #expect(!stored.text.lowercased().contains("secret"))
        // The region signs the request: another region is another body for the same-id rule.
        let other = try Self.render(#"{bucket: b12, key: "a/b", region: eu-west-1, endpoint: "https://s3.eu-west-3.amazonaws.com"}"#).get()
        #expect(other.url == p.url)
        #expect(other.bodyHash != p.bodyHash)
        // So does `skip_existing`: the same object asked to be skipped is another request.
        var skipping = p
        skipping.s3?.skipExisting = true
        #expect(skipping.bodyHash != p.bodyHash)
    }

    struct BadCase: Sendable, CustomTestStringConvertible {
        var name: String
        var s3: String
        var vars: String = #"{"rel": "a"}"#
        var message: String
        var testDescription: String { name }
    }

    @Test(arguments: [
        BadCase(
            name: "bucket with capitals", s3: #"{bucket: "{{ vars.b }}", key: k, region: us-east-1}"#, vars: #"{"b": "MyBucket"}"#,
            message: "request.s3.bucket must be 3 to 63"),
        BadCase(
            name: "a dot segment in the key", s3: #"{bucket: b12, key: "x/{{ vars.rel }}", region: us-east-1}"#,
            vars: #"{"rel": "../etc"}"#, message: "must not have . or .. segments"),
        BadCase(
            name: "an empty key", s3: #"{bucket: b12, key: "{{ vars.rel }}", region: us-east-1}"#, vars: #"{"rel": ""}"#,
            message: "request.s3.key must be 1 to 1024 bytes"),
        BadCase(
            name: "a region with a space", s3: #"{bucket: b12, key: k, region: "{{ vars.rel }}"}"#, vars: #"{"rel": "eu west"}"#,
            message: "request.s3.region must be"),
        BadCase(
            name: "an endpoint with a path", s3: #"{bucket: b12, key: k, region: us-east-1, endpoint: "http://h.example/x"}"#,
            message: "without a path"),
        BadCase(
            name: "an endpoint that is not http", s3: #"{bucket: b12, key: k, region: us-east-1, endpoint: "ftp://h.example"}"#,
            message: "request.s3.endpoint"),
        BadCase(
            name: "virtual host on an IP", s3: #"{bucket: b12, key: k, region: us-east-1, endpoint: "http://10.0.0.1", path_style: false}"#,
            message: "cannot be false"),
        BadCase(name: "a dotted bucket over https", s3: #"{bucket: a.b.c, key: k, region: us-east-1}"#, message: "give path_style: true"),
        BadCase(
            name: "path_style not a boolean", s3: #"{bucket: b12, key: k, region: us-east-1, path_style: "{{ vars.rel }}"}"#,
            message: "request.s3.path_style must be true or false"),
        BadCase(
            name: "a bad storage class", s3: #"{bucket: b12, key: k, region: us-east-1, storage_class: "{{ vars.rel }}"}"#,
            vars: #"{"rel": "cold storage"}"#, message: "request.s3.storage_class must be"),
    ])
    func invalidValuesAreRefused(_ c: BadCase) throws {
        switch try Self.render(c.s3, vars: c.vars) {
        case .success(let p): Issue.record("rendered \(p.url ?? "")")
        case .failure(let error):
            #expect(error.code == .invalid)
            #expect(error.message.contains(c.message), "\(error.message)")
        }
    }

    @Test(arguments: [
        ("  method: POST", "request.method cannot be given with request.s3"),
        ("  url: https://x.example", "request.url cannot be given with request.s3"),
        ("  content_type: text/plain\n", ""),
    ])
    func theLoaderRefusesFieldsAnS3RequestCannotHave(_ line: String, _ message: String) {
        let yaml = "key: k\nrequest:\n  s3: {bucket: b12, key: k, region: us-east-1}\n  file: f\n\(line)\n"
        let (_, diagnostics) = readDefinition(yaml)
        if message.isEmpty {
            #expect(diagnostics.isEmpty, "\(diagnostics.map(\.message))")
        } else {
            #expect(diagnostics.contains { $0.message.contains(message) }, "\(diagnostics.map(\.message))")
        }
    }

    @Test func theLoaderNamesMissingFieldsAndABadLiteral() {
        let (_, missing) = readDefinition("key: k\nrequest:\n  s3: {bucket: b12}\n")
        let messages = missing.map(\.message)
        #expect(messages.contains("request.s3 needs key"))
        #expect(messages.contains("request.s3 needs region"))
        #expect(messages.contains { $0.contains("request.s3 needs request.file") })
        let (_, bad) = readDefinition("key: k\nrequest:\n  s3: {bucket: B, key: k, region: us-east-1, colour: red}\n  file: f\n")
        #expect(bad.contains { $0.message.contains("request.s3.bucket must be") && $0.line == 3 })
        #expect(bad.contains { $0.message.contains("unknown field \"colour\"") })
    }

    @Test func aFileOverFiveTiBIsRefused() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let path = try folder.write("big.bin", "")
        // Sparse: no disk is used.
        #expect(truncate(path, off_t(5 << 40) + 1) == 0)
        let yaml = "key: k\nrequest:\n  s3: {bucket: b12, key: k, region: us-east-1}\n  file: big.bin\n"
        let d = try #require(readDefinition(yaml).0)
        let inputs = RenderInputs(id: "e1", vars: .null, environment: [:], cwd: folder.path)
        do throws(OutboxError) {
            _ = try RequestBuilder.prepare(request: d.request!, definition: d, config: Config(root: "/p"), inputs: inputs)
            Issue.record("a file over 5 TiB was accepted")
        } catch {
            #expect(error.code == .invalid)
            #expect(error.message.contains("has 5497558138881 bytes; an S3 object holds at most 5 TiB"), "\(error.message)")
        }
    }

    struct PlanCase: Sendable, CustomTestStringConvertible {
        var name: String
        var size: Int64
        var s3Extra: String
        var parts: [Int64]  // part sizes; empty: one PutObject
        var testDescription: String { name }
    }

    @Test(arguments: [
        PlanCase(name: "at the default threshold: one PutObject", size: 64 << 20, s3Extra: "", parts: []),
        PlanCase(
            name: "one byte over: 16 MiB parts, the byte joins the last", size: (64 << 20) + 1, s3Extra: "",
            parts: [16 << 20, 16 << 20, 16 << 20, (16 << 20) + 1]),
        PlanCase(
            name: "a small threshold and part size", size: 12 << 20, s3Extra: ", multipart_threshold: 5MiB, part_size: 5MiB",
            parts: [5 << 20, 7 << 20]),
    ])
    func multipartPlans(_ c: PlanCase) throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let path = try folder.write("f.bin", "")
        #expect(truncate(path, off_t(c.size)) == 0)
        let yaml = "key: k\nrequest:\n  s3: {bucket: b12, key: a/k, region: us-east-1\(c.s3Extra)}\n  file: f.bin\n"
        let (definition, diagnostics) = readDefinition(yaml)
        let d = try #require(definition, "\(diagnostics.map(\.message))")
        let p = try RequestBuilder.prepare(
            request: d.request!, definition: d, config: Config(root: "/p"),
            inputs: RenderInputs(id: "e", vars: .null, environment: [:], cwd: folder.path))
        switch p.body {
        case .file(_, let ownership):
            #expect(c.parts.isEmpty)
            #expect(ownership == .copy)
        case .parts(_, let ownership, let parts):
            #expect(ownership == .copy, "an s3 upload copies its file by default, as a whole-file one does")
            #expect(parts.map(\.range.count) == c.parts)
            #expect(parts.map(\.url) == parts.indices.map { "https://b12.s3.us-east-1.amazonaws.com/a/k?partNumber=\($0 + 1)" })
        default:
            Issue.record("unexpected body \(p.body.kind)")
        }
    }

    @Test func theChecksumIsTheFilesAndMoveIsRefused() throws {
        let p = try Self.render("{bucket: b12, key: k, region: us-east-1}").get()
        // SHA-256 of "12345", the file `render` writes, in base64.
        #expect(HeaderRules.value(p.headers, "x-amz-checksum-sha256") == "WZRHGrsBESr8wYFZ9sx0tPURuZgG2lmzyvWpwXPKz8U=")
        // Written in the definition, the loader refuses it; rendered from a template, the enqueue does.
        let (_, diagnostics) = readDefinition(
            "key: s3.put\nrequest:\n  s3: {bucket: b12, key: k, region: us-east-1}\n  file: f.bin\n  ownership: move\n")
        #expect(
            diagnostics.map(\.message) == [
                "request.ownership: an s3 request cannot move its file into the store (it is checksummed at enqueue); give copy or reference"
            ])
        #expect(diagnostics.first.map { [$0.line, $0.column] } == [5, 14])
        switch try Self.render(
            "{bucket: b12, key: k, region: us-east-1}", extra: "  ownership: \"{{ vars.o }}\"\n", vars: #"{"o": "move"}"#)
        {
        case .success: Issue.record("an s3 request moved its file")
        case .failure(let error): #expect(error.message.contains("cannot move its file"), "\(error.message)")
        }
    }

    @Test func atMostTenThousandPartsTheirSizeGrows() throws {
        // Planned only: the files of `multipartPlans` are read whole for their checksums.
        let ranges = try RequestBuilder.s3Ranges(size: 100 << 30, partSize: 5 << 20)
        #expect(ranges.map(\.count) == Array(repeating: 11 << 20, count: 9308) + [12 << 20])
    }

    /// Written as they are, refused as the definition loads; given by a template, as it renders.
    @Test func aPartSizeOutsideS3sLimitsIsRefused() throws {
        for extra in [", part_size: 1MiB", ", multipart_threshold: 6GiB", ", part_size: lots"] {
            let error = #expect(throws: TestFailure.self) { try Self.render("{bucket: b12, key: k, region: us-east-1\(extra)}") }
            #expect(error?.description.contains("must be a size from 5MiB to 5GiB") == true, "\(String(describing: error))")
        }
        for size in ["1MiB", "6GiB", "lots"] {
            let rendered = try Self.render(
                #"{bucket: b12, key: k, region: us-east-1, part_size: "{{ vars.p }}"}"#, vars: #"{"p": "\#(size)"}"#)
            guard case let .failure(error) = rendered else {
                Issue.record("rendered with part_size \(size)")
                continue
            }
            #expect(error.message.contains("request.s3.part_size"), "\(error.message)")
        }
    }

    // MARK: Credentials

    @Test func environmentCredentialsWin() throws {
        let env = ["AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "SECRET", "AWS_SESSION_TOKEN": "TOKEN", "HOME": "/nonexistent"]
        #expect(
            try S3Credentials.resolve(environment: env).get()
                == S3Credentials(accessKeyID: "AKID", secretAccessKey: "SECRET", sessionToken: "TOKEN"))
        guard case .failure(let half) = S3Credentials.resolve(environment: ["AWS_ACCESS_KEY_ID": "AKID"]) else {
            Issue.record("half a pair is no credentials")
            return
        }
        #expect(half.message == "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not")
    }

    @Test func theSharedFileProfileIsRead() throws {
        let folder = try ModelTempFolder()
        defer { folder.remove() }
        let file = try folder.write(
            ".aws/credentials",
            """
            # comment
            [default]
            aws_access_key_id = DEFAULTID
            aws_secret_access_key = DEFAULTSECRET

            [profile work]
            aws_access_key_id=WORKID
            aws_secret_access_key = WORKSECRET
            aws_session_token = WORKTOKEN
            [broken]
            aws_access_key_id = ONLYID
            """)
        #expect(try S3Credentials.resolve(environment: ["HOME": folder.path]).get().accessKeyID == "DEFAULTID")
        let work = try S3Credentials.resolve(environment: ["AWS_SHARED_CREDENTIALS_FILE": file, "AWS_PROFILE": "work"]).get()
        #expect(work == S3Credentials(accessKeyID: "WORKID", secretAccessKey: "WORKSECRET", sessionToken: "WORKTOKEN"))
        let problems: [([String: String], String)] = [
            (["HOME": folder.path, "AWS_PROFILE": "nope"], "has no profile [nope]"),
            (
                ["HOME": folder.path, "AWS_PROFILE": "broken"],
                "profile [broken] of \(file) needs aws_access_key_id and aws_secret_access_key"
            ),
            (["HOME": folder.path + "/none"], "cannot be read"),
            // Not repaired into another key: refused.
            (["AWS_SHARED_CREDENTIALS_FILE": folder.path + "/latin1"], "latin1 is not valid UTF-8 (at byte 42)"),
        ]
        let latin1 = Data("[default]\naws_access_key_id = AKIDBADBYTE".utf8) + Data([0xFF]) + Data("\naws_secret_access_key = S\n".utf8)
        try latin1.write(to: URL(fileURLWithPath: folder.path + "/latin1"))
        for (env, message) in problems {
            guard case .failure(let missing) = S3Credentials.resolve(environment: env) else {
                Issue.record("credentials found with \(env)")
                continue
            }
            #expect(missing.message.contains(message), "\(missing.message)")
            #expect(!missing.message.contains("SECRET") && !missing.message.contains("ONLYID"))
        }
    }
}
