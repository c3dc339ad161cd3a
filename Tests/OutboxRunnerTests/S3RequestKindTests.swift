import Foundation
import Testing
import TestSupport

// The `s3` request kind end to end, through the built binary: signed by the runner with
// credentials it reads at send time, checked against botocore's signer and moto's S3 server.

/// Tests/Scripts/s3_check.py: moto buckets and objects through boto3, and botocore's SigV4 check.
let s3Check = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .appendingPathComponent("Scripts/s3_check.py").path

private let credentials = [
    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    "AWS_SESSION_TOKEN": "session-token-for-the-test",
]

/// `python3 s3_check.py ARGS` with the test tools' environment (the venv on PATH).
func s3CheckTool(_ arguments: [String], stdin: String? = nil) async throws -> TestHTTPProcessResult {
    try await offload {
        guard let stdin else { return try MotoServer.python([s3Check] + arguments) }
        let input = FileManager.default.temporaryDirectory.appendingPathComponent("s3-record-\(UUID().uuidString).json").path
        try stdin.write(toFile: input, atomically: true, encoding: .utf8)
        defer { unlink(input) }
        return try MotoServer.python([s3Check] + arguments + [input])
    }
}

/// Every byte of the files under `folder`, for looking for secrets.
private func allBytes(under folder: String) -> Data {
    var out = Data()
    let names = FileManager.default.enumerator(atPath: folder)?.compactMap { $0 as? String } ?? []
    for name in names { out.append((try? Data(contentsOf: URL(fileURLWithPath: folder + "/" + name))) ?? Data()) }
    return out
}

/// Base64 of the bytes a hex digest spells (S3's checksum headers).
func base64OfHex(_ hex: String) -> String {
    var bytes: [UInt8] = []
    var i = hex.startIndex
    while i < hex.endIndex, let j = hex.index(i, offsetBy: 2, limitedBy: hex.endIndex) {
        bytes.append(UInt8(hex[i..<j], radix: 16) ?? 0)
        i = j
    }
    return Data(bytes).base64EncodedString()
}

@Suite struct S3RequestKindTests {
    static func definition(endpoint: String, bucket: String) -> String {
        """
        key: s3.put
        request:
          s3:
            bucket: \(bucket)
            key: "in/{{ vars.relative_path | path }}"
            region: eu-west-3
            endpoint: "\(endpoint)"
            storage_class: STANDARD_IA
          file: "{{ vars.path }}"
        """
    }

    @Test func theSignatureIsTheOneBotocoreComputes() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("s3-put", Self.definition(endpoint: sandbox.server.baseURL, bucket: "sig-bucket"))
        try PartFiles.make(sandbox.path("data/dir/a b+c!(1).bin"), size: 1024, seed: 3)
        try PartFiles.make(sandbox.path("data/empty.bin"), size: 0)
        let enqueue = try await sandbox.outbox(["enqueue", "s3.put", "--from-dir", "data"])
        #expect(enqueue.status == 0, "\(enqueue.stderr)")
        let run = try await sandbox.outbox(["run", "--drain", "--events", "-", "-v"], environment: credentials)
        #expect(run.status == 0, "\(run.stderr)")

        let requests = sandbox.server.requests.sorted { $0.path < $1.path }
        #expect(requests.map(\.path) == ["/sig-bucket/in/dir/a%20b%2Bc%21%281%29.bin", "/sig-bucket/in/empty.bin"])
        #expect(requests.first?.bodySHA256 == (try PartFiles.sha(sandbox.path("data/dir/a b+c!(1).bin"), 0, 1024)))
        for request in requests {
            #expect(request.method == "PUT")
            #expect(request.header("x-amz-content-sha256") == "UNSIGNED-PAYLOAD")
            #expect(request.header("x-amz-security-token") == credentials["AWS_SESSION_TOKEN"])
            #expect(request.header("x-amz-storage-class") == "STANDARD_IA")
            #expect(request.header("x-amz-checksum-sha256") == base64OfHex(request.bodySHA256), "the checksum of what was sent")
            let authorization = try #require(request.header("authorization"))
            #expect(authorization.hasPrefix("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"))
            #expect(authorization.contains("/eu-west-3/s3/aws4_request, SignedHeaders="))
            for signed in ["host", "x-amz-content-sha256", "x-amz-date", "x-amz-security-token", "x-amz-storage-class"] {
                #expect(authorization.contains(signed), "\(signed) is signed")
            }

            var record: [String: Any] = [
                "method": request.method, "target": request.path, "headers": request.headers.map { [$0.0, $0.1] },
                "access_key": credentials["AWS_ACCESS_KEY_ID"]!, "secret_key": credentials["AWS_SECRET_ACCESS_KEY"]!,
                "token": credentials["AWS_SESSION_TOKEN"]!, "region": "eu-west-3",
            ]
            let verified = try await s3CheckTool(["verify"], stdin: try Self.json(record))
            #expect(verified.exitCode == 0, "\(request.path): \(verified.stdoutText)\(verified.stderr)")
            #expect(verified.stdoutText.hasPrefix("match: "), "\(verified.stdoutText)")

            // The check can fail: a signed header changed on the way, or another secret.
            record["headers"] = request.headers.map { $0.0.lowercased() == "x-amz-storage-class" ? [$0.0, "GLACIER"] : [$0.0, $0.1] }
            let tampered = try await s3CheckTool(["verify"], stdin: try Self.json(record))
            #expect(tampered.exitCode == 1 && tampered.stdoutText.hasPrefix("mismatch"), "\(tampered.stdoutText)")
        }

        // Credentials are never stored, printed or put in events.
        let output = Data((run.stdoutText + run.stderr).utf8)
        let show = try await sandbox.outbox(["show", "--json", (try await sandbox.list()).first?["id"] as? String ?? "none"])
        for secret in [credentials["AWS_SECRET_ACCESS_KEY"]!, credentials["AWS_SESSION_TOKEN"]!] {
            let bytes = Data(secret.utf8)
            #expect(output.range(of: bytes) == nil, "the run printed a secret")
            #expect(allBytes(under: sandbox.path(".outbox")).range(of: bytes) == nil, "the store holds a secret")
            #expect(!show.stdoutText.contains(secret))
        }
    }

    @Test func filesLandInMotoByteForByte() async throws {
        if let reason = try await offload({ MotoServer.ensureInstalled() }) {
            Issue.record("moto's S3 server is needed: \(reason)")
            return
        }
        let moto = try await MotoServer()
        #expect(try await s3CheckTool(["mb", moto.endpoint, "native"]).exitCode == 0)
        let sandbox = try OutboxSandbox()
        try sandbox.define("s3-put", Self.definition(endpoint: moto.endpoint, bucket: "native"))
        let files: [(relative: String, size: Int)] = [("empty.bin", 0), ("small.txt", 1024), ("nested/medium.bin", 12 << 20)]
        for (n, file) in files.enumerated() {
            let path = sandbox.path("data/" + file.relative)
            try await offload { try PartFiles.make(path, size: file.size, seed: UInt64(n + 5)) }
        }
        let enqueue = try await sandbox.outbox(["enqueue", "s3.put", "--from-dir", "data"])
        #expect(enqueue.status == 0, "\(enqueue.stderr)")
        let run = try await sandbox.outbox(
            ["run", "--drain"], environment: ["AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"])
        #expect(run.status == 0, "\(run.stderr)")
        #expect(try await sandbox.list().isEmpty)
        for file in files {
            let path = sandbox.path("data/" + file.relative)
            let local = try await offload { try PartFiles.sha(path, 0, Int64(file.size)) }
            let remote = try await s3CheckTool(["get", moto.endpoint, "native", "in/" + file.relative])
            #expect(remote.exitCode == 0, "\(remote.stderr)")
            #expect(remote.stdoutText.hasPrefix("\(local) \(file.size) application/octet-stream STANDARD_IA "), "in/\(file.relative)")
            let etag = remote.stdoutText.split(separator: " ").last ?? ""
            #expect(!etag.contains("-"), "one PutObject, not a multipart upload: \(remote.stdoutText)")
        }
    }

    /// moto checking every signature as S3 does (botocore's signer, which leaves out
    /// `User-Agent`): a PutObject and each request of a multipart upload are accepted.
    @Test func aServerThatChecksSignaturesAcceptsEveryRequest() async throws {
        if let reason = try await offload({ MotoServer.ensureInstalled() }) {
            Issue.record("moto's S3 server is needed: \(reason)")
            return
        }
        // Unchecked: the ready probe, then the user, its key and its policy.
        let moto = try await MotoServer(checkingSignatures: 4)
        let made = try await s3CheckTool(["user", moto.endpoint, "signed"])
        let key = made.stdoutText.split(separator: " ").map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }
        try #require(made.exitCode == 0 && key.count == 2, "\(made.stdoutText)\(made.stderr)")
        let sandbox = try OutboxSandbox()
        let extra = "    multipart_threshold: 5MiB\n    part_size: 5MiB"
        try sandbox.define(
            "s3-put",
            Self.definition(endpoint: moto.endpoint, bucket: "signed").replacingOccurrences(of: "  file:", with: extra + "\n  file:"))
        let files: [(relative: String, size: Int)] = [("small.txt", 1024), ("two-parts.bin", 11 << 20)]
        for (n, file) in files.enumerated() {
            let path = sandbox.path("data/" + file.relative)
            try await offload { try PartFiles.make(path, size: file.size, seed: UInt64(n + 70)) }
        }
        #expect(try await sandbox.outbox(["enqueue", "s3.put", "--from-dir", "data"]).status == 0)
        let run = try await sandbox.outbox(
            ["run", "--drain", "--events", "-"], environment: ["AWS_ACCESS_KEY_ID": key[0], "AWS_SECRET_ACCESS_KEY": key[1]])
        #expect(run.status == 0, "\(run.stdout)\(run.stderr)")
        #expect(try await sandbox.list().isEmpty)
        for file in files {
            let local = try await offload { try PartFiles.sha(sandbox.path("data/" + file.relative), 0, Int64(file.size)) }
            let remote = try await s3CheckTool(["get", moto.endpoint, "signed", "in/" + file.relative, key[0], key[1]])
            #expect(remote.stdoutText.hasPrefix("\(local) \(file.size) "), "in/\(file.relative): \(remote.stdoutText)\(remote.stderr)")
        }
        // The etag of the multipart object: its two parts.
        let multipart = try await s3CheckTool(["get", moto.endpoint, "signed", "in/two-parts.bin", key[0], key[1]])
        #expect(multipart.stdoutText.trimmingCharacters(in: .whitespacesAndNewlines).hasSuffix("-2\""), "\(multipart.stdoutText)")
        // And a key that does not sign as the user's is refused: the checks are on.
        let refused = try await s3CheckTool(["get", moto.endpoint, "signed", "in/small.txt", key[0], "not-the-secret"])
        #expect(refused.exitCode != 0 && refused.stderr.contains("SignatureDoesNotMatch"), "\(refused.stderr.suffix(300))")
    }

    @Test func theExampleDefinitionPutsATreeWithoutPython() async throws {
        if let reason = try await offload({ MotoServer.ensureInstalled() }) {
            Issue.record("moto's S3 server is needed: \(reason)")
            return
        }
        let moto = try await MotoServer()
        #expect(try await s3CheckTool(["mb", moto.endpoint, "example"]).exitCode == 0)
        let sandbox = try OutboxSandbox()
        for folder in ["config", "definitions"] {
            try? FileManager.default.removeItem(atPath: sandbox.path(folder))
            try copyClosedOnExec(S3MigrationExampleTests.example + "/" + folder, to: sandbox.path(folder))
        }
        let files: [(relative: String, size: Int)] = [("a.txt", 1024), ("2026/11/cam 1.mp4", 3 << 20), ("2026/empty", 0)]
        for (n, file) in files.enumerated() {
            try PartFiles.make(sandbox.path("data/" + file.relative), size: file.size, seed: UInt64(n + 40))
        }
        let env = [
            "AWS_ENDPOINT_URL": moto.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "S3_BUCKET": "example",
        ]
        let enqueue = try await sandbox.outbox(
            ["enqueue", "s3.put", "--from-dir", "data", "--vars", #"{"prefix": "captures/"}"#], environment: env)
        #expect(enqueue.status == 0, "\(enqueue.stderr)")
        let run = try await sandbox.outbox(["run", "--drain"], environment: env)
        #expect(run.status == 0, "\(run.stderr)")
        for file in files {
            let local = try PartFiles.sha(sandbox.path("data/" + file.relative), 0, Int64(file.size))
            let remote = try await s3CheckTool(["get", moto.endpoint, "example", "captures/" + file.relative])
            #expect(
                remote.stdoutText.hasPrefix("\(local) \(file.size) "), "captures/\(file.relative): \(remote.stdoutText)\(remote.stderr)")
        }
    }

    // S3's error bodies quote the key id and the signature of the request they refuse:
    // echoed back, both are masked in events, though libcurl, not outbox, computed the signature.
    @Test func anEchoedKeyIDAndSignatureAreMaskedInEvents() async throws {
        let sandbox = try OutboxSandbox()
        // Bucket "echo": the test server answers with the request's headers as JSON.
        try sandbox.define("s3-put", Self.definition(endpoint: sandbox.server.baseURL, bucket: "echo"))
        try PartFiles.make(sandbox.path("data/one.bin"), size: 100, seed: 5)
        #expect(try await sandbox.outbox(["enqueue", "s3.put", "--from-dir", "data"]).status == 0)
        let run = try await sandbox.outbox(["run", "--drain", "--events", "-"], environment: credentials)
        #expect(run.status == 0, "\(run.stderr)")
        let sent = try #require(sandbox.server.requests.first)
        let authorization = try #require(sent.header("authorization"))
        let signature = try #require(authorization.split(separator: "Signature=").last.map(String.init))
        #expect(signature.count == 64, "\(authorization)")
        let attempt = try #require(run.stdout.split(separator: "\n").first { $0.contains(#""type":"attempt""#) })
        #expect(attempt.contains("Credential=[redacted]/"), "\(attempt)")
        #expect(attempt.contains("Signature=[redacted]"), "\(attempt)")
        #expect(!run.stdout.contains(signature) && !run.stdout.contains("AKIDEXAMPLE"))
    }

    @Test func withoutCredentialsNothingIsSentAndTheEntryWaits() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("s3-put", Self.definition(endpoint: sandbox.server.baseURL, bucket: "cred-bucket"))
        try PartFiles.make(sandbox.path("data/a.bin"), size: 10)
        #expect(
            try await sandbox.outbox(["enqueue", "s3.put", "--id", "a", "--vars", #"{"path": "data/a.bin", "relative_path": "a.bin"}"#])
                .status == 0)

        // HOME is the test's own folder: no variables, no ~/.aws/credentials.
        let first = try await sandbox.outbox(["run", "--drain", "--json"])
        #expect(first.status == 2, "awaiting-auth at the end: \(first.stdoutText)\(first.stderr)")
        #expect(sandbox.server.requests.isEmpty, "nothing is sent unsigned")
        let shown = try #require(try await sandbox.show("a"))
        #expect(shown["state"] as? String == "awaiting-auth")
        let attempts = (shown["attempts_log"] as? [[String: Any]]) ?? []
        #expect(attempts.last?["outcome"] as? String == "awaiting-auth", "\(attempts)")
        #expect(attempts.last?["error_kind"] as? String == "credentials", "\(attempts)")
        #expect((attempts.last?["error_message"] as? String)?.contains("no AWS credentials") == true, "\(attempts)")
        // `explain` gives the way out an S3 entry has: no header update helps it.
        let explained = try await sandbox.outbox(["explain", "a"])
        #expect(explained.stdoutText.contains("outbox retry --key s3.put"), "\(explained.stdoutText)")
        #expect(!explained.stdoutText.contains("headers update"), "\(explained.stdoutText)")

        // A profile of the shared credentials file, then a retry: sent, signed with its key.
        try FileManager.default.createDirectory(atPath: sandbox.base + "/home/.aws", withIntermediateDirectories: true)
        try
            "[default]\naws_access_key_id = X\naws_secret_access_key = Y\n[work]\naws_access_key_id = FILEKEY\naws_secret_access_key = FILESECRET\n"
            .write(toFile: sandbox.base + "/home/.aws/credentials", atomically: true, encoding: .utf8)
        #expect(try await sandbox.outbox(["retry", "a"]).status == 0)
        let second = try await sandbox.outbox(["run", "--drain"], environment: ["AWS_PROFILE": "work"])
        #expect(second.status == 0, "\(second.stderr)")
        let sent = try #require(sandbox.server.requests.first)
        #expect(sent.header("authorization")?.hasPrefix("AWS4-HMAC-SHA256 Credential=FILEKEY/") == true)
        #expect(sent.header("x-amz-security-token") == nil)
    }

    static func json(_ object: [String: Any]) throws -> String {
        String(decoding: try JSONSerialization.data(withJSONObject: object), as: UTF8.self)
    }
}
