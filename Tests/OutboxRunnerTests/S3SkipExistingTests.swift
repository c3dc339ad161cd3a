import Foundation
import Testing
import TestSupport

// `--skip-existing` and `skip_existing`: a HEAD of each object before its upload, against
// moto's server (whose request log shows what was sent) and the in-repo test server (for
// HEADs that fail).

@Suite struct S3SkipExistingTests {
    /// Lines of moto's request log (werkzeug's, one per request) for `method` on `bucket`.
    static func logged(_ moto: MotoServer, _ method: String, bucket: String) -> Int {
        let text = (try? String(contentsOfFile: moto.log, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").filter { $0.contains("\"\(method) /\(bucket)/") }.count
    }

    static func outcome(_ sandbox: OutboxSandbox, _ id: String) -> [String: Any]? {
        PartFiles.readJSON(sandbox.path("outcome-\(id).json"))
    }

    static func counter(_ sandbox: OutboxSandbox, result: String) async throws -> Int? {
        let stats = try await sandbox.outbox(["stats", "--json"])
        let document = try JSONSerialization.jsonObject(with: Data(stats.stdoutText.utf8)) as? [String: Any]
        let counters = document?["counters"] as? [[String: Any]] ?? []
        let series = counters.first {
            $0["name"] as? String == "outbox_attempts_total" && ($0["labels"] as? [String: String])?["result"] == result
        }
        return (series?["value"] as? NSNumber)?.intValue
    }

    static func summary(_ run: CommandResult) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(run.stdoutText.utf8)) as? [String: Any], "\(run.stdoutText)")
    }

    @Test func aFolderUploadedOnceIsSkippedTheSecondTimeAndAChangedFileIsUploaded() async throws {
        if let reason = try await offload({ MotoServer.ensureInstalled() }) {
            Issue.record("moto's S3 server is needed: \(reason)")
            return
        }
        let moto = try await MotoServer()
        #expect(try await s3CheckTool(["mb", moto.endpoint, "again"]).exitCode == 0)
        let sandbox = try OutboxSandbox()
        try sandbox.define(
            "s3-put",
            S3MultipartTests.definition(endpoint: moto.endpoint, bucket: "again", extra: #"on_success: "cat > outcome-$OUTBOX_ID.json""#))
        // Two single PutObjects and a multipart upload of two parts (5 and 7 MiB).
        let files: [(relative: String, size: Int)] = [("a.bin", 4096), ("d/b.txt", 1000), ("d/m.bin", 12 << 20)]
        for (n, file) in files.enumerated() {
            let path = sandbox.path("data/" + file.relative)
            try await offload { try PartFiles.make(path, size: file.size, seed: UInt64(n + 60)) }
        }
        let env = S3MultipartTests.testingCredentials
        #expect(
            try await sandbox.outbox(["enqueue", "s3.put", "--from-dir", "data", "--id-template", "first-{{ vars.name }}"]).status == 0)
        let first = try await sandbox.outbox(["run", "--drain", "--json"], environment: env)
        #expect(first.status == 0, "\(first.stderr)")
        #expect(try Self.summary(first)["skipped"] as? Int == 0)
        #expect(await eventually("moto logged the uploads") { Self.logged(moto, "POST", bucket: "again") == 2 })
        let puts = Self.logged(moto, "PUT", bucket: "again")
        #expect(puts == 4, "two objects and two parts")
        for name in ["a.bin", "b.txt", "m.bin"] {
            #expect(Self.outcome(sandbox, "first-\(name)")?["s3"].flatMap { ($0 as? [String: Any])?["skipped"] as? Bool } == false)
        }

        // Again with --skip-existing: one HEAD each, no PUT, no POST, every entry completed as skipped.
        #expect(
            try await sandbox.outbox([
                "enqueue", "s3.put", "--from-dir", "data", "--skip-existing", "--id-template", "second-{{ vars.name }}",
            ]).status == 0)
        let second = try await sandbox.outbox(["run", "--drain", "--json"], environment: env)
        #expect(second.status == 0, "\(second.stderr)")
        let summary = try Self.summary(second)
        #expect(summary["completed"] as? Int == 3 && summary["skipped"] as? Int == 3, "\(summary)")
        #expect(summary["bytes_sent"] as? Int == 0, "no body left outbox: \(summary)")
        #expect(await eventually("moto logged three HEADs") { Self.logged(moto, "HEAD", bucket: "again") == 3 })
        #expect(Self.logged(moto, "PUT", bucket: "again") == puts, "no PUT the second time")
        #expect(Self.logged(moto, "POST", bucket: "again") == 2, "no multipart upload the second time")
        #expect(try await sandbox.list().isEmpty)
        for name in ["a.bin", "b.txt", "m.bin"] {
            let s3 = try #require(Self.outcome(sandbox, "second-\(name)")?["s3"] as? [String: Any], "\(name)")
            #expect(s3["skipped"] as? Bool == true, "\(name): \(s3)")
            let firstS3 = Self.outcome(sandbox, "first-\(name)")?["s3"] as? [String: Any]
            #expect(s3["checksum_sha256"] as? String == firstS3?["checksum_sha256"] as? String, "\(name)")
            let meta = Self.outcome(sandbox, "second-\(name)")?["meta"] as? [String: Any]
            #expect(meta?["attempts"] as? Int == 1, "\(name): the HEAD was the one attempt")
        }
        #expect(try await Self.counter(sandbox, result: "skipped") == 3)

        // The same name with other bytes of the same size: its checksum differs, so it is uploaded.
        let changed = sandbox.path("data/a.bin")
        try await offload { try PartFiles.make(changed, size: 4096, seed: 99) }
        #expect(
            try await sandbox.outbox([
                "enqueue", "s3.put", "--from-dir", "data", "--skip-existing", "--id-template", "third-{{ vars.name }}",
            ]).status == 0)
        let third = try await sandbox.outbox(["run", "--drain", "--json"], environment: env)
        #expect(third.status == 0, "\(third.stderr)")
        #expect(try Self.summary(third)["skipped"] as? Int == 2)
        #expect(try Self.summary(third)["bytes_sent"] as? Int == 4096)
        #expect(await eventually("moto logged the new PUT") { Self.logged(moto, "PUT", bucket: "again") == puts + 1 })
        #expect(Self.logged(moto, "POST", bucket: "again") == 2)
        #expect((Self.outcome(sandbox, "third-a.bin")?["s3"] as? [String: Any])?["skipped"] as? Bool == false)
        let local = try await offload { try PartFiles.sha(changed, 0, 4096) }
        let remote = try await s3CheckTool(["get", moto.endpoint, "again", "a.bin"])
        #expect(remote.stdoutText.hasPrefix("\(local) 4096 "), "\(remote.stdoutText)\(remote.stderr)")
        #expect(try await Self.counter(sandbox, result: "skipped") == 5)
    }

    static func definition(endpoint: String) -> String {
        """
        key: s3.put
        request:
          s3:
            bucket: heads
            key: "{{ vars.name }}"
            region: us-east-1
            endpoint: "\(endpoint)"
            skip_existing: '{{ vars.skip | default("true") }}'
          file: "{{ vars.path }}"
        retry:
          backoff: { base: 100ms, max: 1s, jitter: 0 }
        """
    }

    @Test func aFailedHeadIsAnAttemptLikeAnyOtherAndA404Uploads() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("s3-put", Self.definition(endpoint: sandbox.server.baseURL))
        try PartFiles.make(sandbox.path("k.bin"), size: 2048, seed: 4)
        let server = sandbox.server
        // HEAD: 503 (retried), HEAD: 404 (not there), then the PUT.
        server.script("/heads/k.bin", [.status(503), .status(404), .status(200, headers: [("ETag", "\"e\"")])])
        #expect(
            try await sandbox.outbox(["enqueue", "s3.put", "--id", "k", "--vars", #"{"path": "k.bin", "name": "k.bin"}"#]).status == 0)
        let run = try await sandbox.outbox(["run", "--drain", "--events", "-"], environment: S3MultipartTests.testingCredentials)
        #expect(run.status == 0, "\(run.stderr)")
        let requests = server.requests(path: "/heads/")
        #expect(requests.map(\.method) == ["HEAD", "HEAD", "PUT"])
        for head in requests where head.method == "HEAD" {
            #expect(head.header("x-amz-checksum-mode") == "ENABLED")
            #expect(head.header("x-amz-checksum-sha256") == nil && head.header("content-type") == nil)
            #expect(head.bodySize == 0)
            #expect(head.header("authorization")?.hasPrefix("AWS4-HMAC-SHA256 Credential=testing/") == true)
        }
        let put = try #require(requests.last)
        #expect(put.header("x-amz-checksum-sha256") == base64OfHex(put.bodySHA256))
        // The entry is forgotten once completed: its attempts are read from the events.
        let attempts = run.stdoutText.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }.filter { $0["type"] as? String == "attempt" }
        #expect(attempts.map { $0["method"] as? String } == ["HEAD", "PUT"], "\(attempts)")
        #expect(attempts.map { $0["outcome"] as? String } == ["retry", "success"], "\(attempts)")
        // The summary counts what the events show: the HEAD that found nothing is the upload's attempt.
        #expect(run.stderr.contains(", 2 attempts in "), "\(run.stderr)")
        #expect(try await Self.counter(sandbox, result: "retry") == 1)
        #expect(try await Self.counter(sandbox, result: "skipped") == nil)
    }

    @Test func aHeadRefusedWith403ParksTheEntryAndSendsNothing() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("s3-put", Self.definition(endpoint: sandbox.server.baseURL))
        try PartFiles.make(sandbox.path("k.bin"), size: 2048, seed: 4)
        sandbox.server.script("/heads/k.bin", [.status(403, body: "<Error><Code>AccessDenied</Code></Error>")])
        #expect(
            try await sandbox.outbox(["enqueue", "s3.put", "--id", "k", "--vars", #"{"path": "k.bin", "name": "k.bin"}"#]).status == 0)
        let run = try await sandbox.outbox(["run", "--drain"], environment: S3MultipartTests.testingCredentials)
        #expect(run.status == 2, "awaiting-auth: \(run.stderr)")
        #expect(sandbox.server.requests(path: "/heads/").map(\.method) == ["HEAD"])
        #expect(try await sandbox.show("k")?["state"] as? String == "awaiting-auth")
    }

    @Test func withoutTheOptionNoHeadIsSent() async throws {
        let sandbox = try OutboxSandbox()
        try sandbox.define("s3-put", Self.definition(endpoint: sandbox.server.baseURL))
        try PartFiles.make(sandbox.path("k.bin"), size: 2048, seed: 4)
        #expect(
            try await sandbox.outbox([
                "enqueue", "s3.put", "--id", "k", "--vars", #"{"path": "k.bin", "name": "k.bin", "skip": false}"#,
            ]).status == 0)
        let run = try await sandbox.outbox(["run", "--drain"], environment: S3MultipartTests.testingCredentials)
        #expect(run.status == 0, "\(run.stderr)")
        #expect(sandbox.server.requests(path: "/heads/").map(\.method) == ["PUT"])
    }
}
