import Foundation
import Testing
import TestSupport

// The server-side check of `x-amz-checksum-sha256`: bytes that are not the ones checksummed
// at enqueue are refused, and the entry settles error naming the checksum. moto checks no
// checksum, so the in-repo test server checks it as S3 does (400 BadDigest).

@Suite struct S3ChecksumRefusalTests {
    /// Appended to a definition: each error outcome is kept as `error-ID.json`.
    static let keepsErrorOutcomes = "\non_error: \"cat > error-$OUTBOX_ID.json\"\n"

    /// A sandbox whose `s3.put` (keeping its error outcomes) has one 3,000-byte file enqueued
    /// as `one` into `bucket`, under `in/one.bin`; `extra`: more `enqueue` arguments.
    static func stageOne(bucket: String, seed: UInt64, extra: [String] = []) async throws -> OutboxSandbox {
        let sandbox = try OutboxSandbox()
        try sandbox.define("s3-put", S3RequestKindTests.definition(endpoint: sandbox.server.baseURL, bucket: bucket) + keepsErrorOutcomes)
        try PartFiles.make(sandbox.path("data/one.bin"), size: 3000, seed: seed)
        let vars = #"{"path": "data/one.bin", "relative_path": "one.bin"}"#
        let enqueue = try await sandbox.outbox(["enqueue", "s3.put", "--id", "one", "--vars", vars] + extra)
        #expect(enqueue.status == 0, "\(enqueue.stderr)")
        return sandbox
    }

    /// Overwrites `count` bytes of the entry's staged copy at `offset` with other bytes of the
    /// same length: what a disk or a bug could do to a body between enqueue and send.
    static func damageStagedBody(_ sandbox: OutboxSandbox, id: String, offset: Int64, count: Int = 16) throws {
        let path = try sandbox.sqlite("SELECT body_file FROM entries WHERE id = '\(id)'").trimmingCharacters(in: .whitespacesAndNewlines)
        let handle = try #require(FileHandle(forUpdatingAtPath: path), "the staged body \(path)")
        defer { try? handle.close() }
        try handle.seek(toOffset: UInt64(offset))
        let old = try handle.read(upToCount: count) ?? Data()
        try handle.seek(toOffset: UInt64(offset))
        try handle.write(contentsOf: Data(old.map { ~$0 }))
    }

    @Test func aPutWhoseBytesDoNotMatchItsChecksumSettlesError() async throws {
        let sandbox = try await Self.stageOne(bucket: "digest", seed: 8)
        try Self.damageStagedBody(sandbox, id: "one", offset: 1000)

        let run = try await sandbox.outbox(["run", "--drain"], environment: S3MultipartTests.testingCredentials)
        #expect(run.status == 1, "an entry settled error: \(run.stderr)")
        let puts = sandbox.server.requests(path: "/digest/").filter { $0.method == "PUT" }
        #expect(puts.count == 1, "refused for good, not retried")
        let put = try #require(puts.first)
        #expect(put.header("x-amz-checksum-sha256") == base64OfHex(try PartFiles.sha(sandbox.path("data/one.bin"), 0, 3000)))
        #expect(put.header("x-amz-checksum-sha256") != base64OfHex(put.bodySHA256), "the bytes sent were not those checksummed")
        #expect(try await sandbox.show("one")?["state"] as? String == "error")
        let outcome = try #require(PartFiles.readJSON(sandbox.path("error-one.json")))
        let error = try #require(outcome["error"] as? [String: Any])
        #expect(error["kind"] as? String == "http")
        let message = error["message"] as? String ?? ""
        #expect(message.contains("BadDigest") && message.contains("SHA256 you specified did not match"), "\(message)")
        #expect(outcome["s3"] == nil || (outcome["s3"] as? [String: Any])?["etag"] == nil)
    }

    @Test func aPartWhoseBytesDoNotMatchItsChecksumSettlesErrorAndAbortsTheUpload() async throws {
        let sandbox = try await S3MultipartTests.stage()
        try S3MultipartTests.keepErrorOutcomes(sandbox)
        // Part 2 holds bytes 5 MiB to 10 MiB.
        try Self.damageStagedBody(sandbox, id: "big", offset: (5 << 20) + 4096)
        let server = sandbox.server
        server.script("/crash/big.bin?uploadId=", [.status(204)])

        let run = try await sandbox.outbox(["run", "--drain"], environment: S3MultipartTests.testingCredentials)
        #expect(run.status == 1, "an entry settled error: \(run.stderr)")
        #expect(S3MultipartTests.partNumbers(server) == [1, 2], "one part at a time: part 2 is refused for good")
        let part2 = try #require(server.requests.first { $0.path.contains("?partNumber=2&") })
        #expect(part2.header("x-amz-checksum-sha256") != base64OfHex(part2.bodySHA256))
        let shown = try #require(try await sandbox.show("big"))
        #expect(shown["state"] as? String == "error")
        let parts = shown["parts"] as? [[String: Any]] ?? []
        // Part 1 was accepted, but by the upload the abort ended: forgotten with it, so a retry starts over.
        #expect(parts.map { $0["accepted"] as? Bool } == [false, false, false, false, false], "\(parts)")
        let message = ((PartFiles.readJSON(sandbox.path("error-big.json"))?["error"] as? [String: Any])?["message"] as? String) ?? ""
        #expect(message.contains("part 2 of 5") && message.contains("BadDigest"), "\(message)")
        #expect(await eventually("the upload is aborted") { server.requests.contains { $0.method == "DELETE" } })
    }
}

/// S3 answers an expired or invalid session token with 400 (`ExpiredToken`), not 403: the
/// entry waits for new credentials (`awaiting-auth`, exit 2) as for a refused key, and is
/// sent again once they are there; another 400 still settles error, naming S3's refusal.
@Suite struct S3ExpiredTokenTests {
    static let expired = Array(
        "<Error><Code>ExpiredToken</Code><Message>The provided token has expired.</Message></Error>".utf8)

    @Test func anExpiredTokenParksAPutUntilCredentialsAreRenewed() async throws {
        let sandbox = try await S3ChecksumRefusalTests.stageOne(bucket: "tok", seed: 4)
        sandbox.server.script("/tok/in/one.bin", [TestResponse(status: 400, body: Self.expired), .status(200)])
        var credentials = S3MultipartTests.testingCredentials
        credentials["AWS_SESSION_TOKEN"] = "old-token"
        let parked = try await sandbox.outbox(["run", "--drain"], environment: credentials)
        #expect(parked.status == 2, "awaiting-auth: \(parked.stderr)")
        #expect(try await sandbox.show("one")?["state"] as? String == "awaiting-auth")
        #expect(!FileManager.default.fileExists(atPath: sandbox.path("error-one.json")), "no error outcome")
        #expect(try await sandbox.outbox(["retry", "one"]).status == 0)
        credentials["AWS_SESSION_TOKEN"] = "new-token"
        let sent = try await sandbox.outbox(["run", "--drain"], environment: credentials)
        #expect(sent.status == 0, "\(sent.stderr)")
        let puts = sandbox.server.requests(path: "/tok/in/one.bin").filter { $0.method == "PUT" }
        #expect(puts.map { $0.header("x-amz-security-token") } == ["old-token", "new-token"])
    }

    /// A HEAD has no body to name the refusal: a 400 to a `skip_existing` HEAD that carried a
    /// session token parks the entry too; without a token the same 400 settles error.
    @Test(arguments: [true, false])
    func aBodylessRefusalOfASkipExistingHeadWithASessionTokenParksTheEntry(withToken: Bool) async throws {
        let sandbox = try await S3ChecksumRefusalTests.stageOne(bucket: "tok", seed: 5, extra: ["--skip-existing"])
        sandbox.server.script("/tok/in/one.bin", [.status(400)])
        var credentials = S3MultipartTests.testingCredentials
        if withToken { credentials["AWS_SESSION_TOKEN"] = "old-token" }
        let run = try await sandbox.outbox(["run", "--drain"], environment: credentials)
        #expect(run.status == (withToken ? 2 : 1), "\(run.stderr)")
        #expect(try await sandbox.show("one")?["state"] as? String == (withToken ? "awaiting-auth" : "error"))
        #expect(sandbox.server.requests(path: "/tok/in/one.bin").map(\.method) == ["HEAD"])
    }

    @Test func anExpiredTokenParksAMultipartUploadAtItsCreate() async throws {
        let sandbox = try await S3MultipartTests.stage()
        sandbox.server.script("/crash/big.bin?uploads=", [TestResponse(status: 400, body: Self.expired)])
        let parked = try await sandbox.outbox(["run", "--drain"], environment: S3MultipartTests.testingCredentials)
        #expect(parked.status == 2, "awaiting-auth: \(parked.stderr)")
        #expect(try await sandbox.show("big")?["state"] as? String == "awaiting-auth")
    }

    @Test func anotherRefusedCreateNamesS3sCodeAndMessage() async throws {
        let sandbox = try await S3MultipartTests.stage()
        try S3MultipartTests.keepErrorOutcomes(sandbox)
        let refusal = Array("<Error><Code>InvalidArgument</Code><Message>Bad storage class.</Message></Error>".utf8)
        sandbox.server.script("/crash/big.bin?uploads=", [TestResponse(status: 400, body: refusal)])
        let run = try await sandbox.outbox(["run", "--drain"], environment: S3MultipartTests.testingCredentials)
        #expect(run.status == 1, "\(run.stderr)")
        #expect(try await sandbox.show("big")?["state"] as? String == "error")
        let outcome = try #require(PartFiles.readJSON(sandbox.path("error-big.json")))
        let message = (outcome["error"] as? [String: Any])?["message"] as? String ?? ""
        #expect(message == "CreateMultipartUpload: HTTP 400 (S3 InvalidArgument: Bad storage class.)", "\(outcome)")
    }
}
