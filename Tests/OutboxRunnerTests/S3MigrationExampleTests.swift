import Foundation
import Testing
import TestSupport

// examples/s3-migration end to end against a real S3-compatible server on loopback: moto's
// server mode, installed from PyPI when missing.

/// moto's S3 server as a child process.
final class MotoServer: Sendable {
    let service: LoopbackService
    let folder: String

    var endpoint: String { service.url }
    /// What moto logs: a line per request.
    var log: String { service.log }

    /// Makes sure `moto.server` imports (pip-installing `moto[server]` once if needed); nil
    /// with the reason when it cannot be had.
    static func ensureInstalled() -> String? {
        if (try? python(["-c", "import moto.server"]))?.exitCode == 0 { return nil }
        let install = try? python(["-m", "pip", "install", "--quiet", "moto[server]"])
        if (try? python(["-c", "import moto.server"]))?.exitCode == 0 { return nil }
        return "pip could not install moto[server]: \(install?.stderr.suffix(400) ?? "python3 did not run")"
    }

    /// moto and pip are the caller's tools (pyenv, proxies, certificates): they get the
    /// caller's environment, as the only children of the tests that do.
    static let toolEnvironment = ProcessInfo.processInfo.environment

    static func python(_ arguments: [String]) throws -> TestHTTPProcessResult {
        try TestHTTPCurl.runExecutable("/usr/bin/env", ["python3"] + arguments, environment: toolEnvironment)
    }

    /// `checkingSignatures`: after the first `unchecked` requests (which make its user and
    /// key), moto verifies each request's signature and the key's policy, as S3 does.
    init(checkingSignatures unchecked: Int? = nil) async throws {
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("moto-\(UUID().uuidString)").path
        var environment = Self.toolEnvironment
        if let unchecked { environment["INITIAL_NO_AUTH_ACTION_COUNT"] = String(unchecked) }
        service = try await LoopbackService(
            "moto", executable: "/usr/bin/env", folder: folder, environment: environment
        ) { port in ["python3", "-m", "moto.server", "-H", "127.0.0.1", "-p", String(port)] }
    }

    deinit {
        service.stop()
        try? FileManager.default.removeItem(atPath: folder)
    }

    func stop() { service.stop() }
}

@Suite struct S3MigrationExampleTests {
    /// examples/s3-migration in this checkout.
    static var example: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("examples/s3-migration").path
    }

    /// moto (missing, a failure: never a silent pass), the example in a sandbox pointed at it,
    /// and the bucket `migration` made.
    static func exampleWithBucket() async throws -> (MotoServer, OutboxSandbox, [String: String])? {
        if let reason = try await offload({ MotoServer.ensureInstalled() }) {
            Issue.record("moto is needed for this test: \(reason)")
            return nil
        }
        let moto = try await MotoServer()
        let (sandbox, env) = try Self.sandbox(moto)
        #expect(try await python(["tools/s3_tool.py", "mb", "migration"], in: sandbox, environment: env).status == 0)
        return (moto, sandbox, env)
    }

    /// The example's folders in a new sandbox, and the environment that points it at `moto`.
    static func sandbox(_ moto: MotoServer) throws -> (OutboxSandbox, [String: String]) {
        let sandbox = try OutboxSandbox()
        for folder in ["config", "definitions", "lib", "plugins", "hooks", "tools"] {
            try? FileManager.default.removeItem(atPath: sandbox.path(folder))
            try copyClosedOnExec(Self.example + "/" + folder, to: sandbox.path(folder))
        }
        let binaries = (OutboxSandbox.binary("outbox") as NSString).deletingLastPathComponent
        let env = [
            "AWS_ENDPOINT_URL": moto.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1", "S3_BUCKET": "migration",
            "PATH": binaries + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"),
        ]
        return (sandbox, env)
    }

    /// `python3 ARGS` in the sandbox's root, with its environment and `env`.
    static func python(_ arguments: [String], in sandbox: OutboxSandbox, environment env: [String: String]) async throws -> OutboxRun {
        let root = sandbox.root, environment = sandbox.processEnvironment(env)
        return try await offload { try Self.python(arguments, in: root, environment: environment) }
    }

    /// Runs `python3 ARGS` in `folder` with exactly `environment`, and waits.
    static func python(_ arguments: [String], in folder: String, environment: [String: String]) throws -> OutboxRun {
        try runProcess("/usr/bin/env", ["python3"] + arguments, cwd: folder, environment: environment)
    }

    /// A runner killed after the hook completed an upload, before its exit 0 was recorded; the
    /// tree enqueued again (the README's resume) then changes nothing: no second upload, no
    /// part sent again, none left open. Once outbox let the entry go, an enqueue uploads afresh.
    @Test func aResumeAfterTheCompletingHookStartsNoSecondUpload() async throws {
        guard let (moto, sandbox, env) = try await Self.exampleWithBucket() else { return }
        func python(_ arguments: [String]) async throws -> OutboxRun { try await Self.python(arguments, in: sandbox, environment: env) }
        try await offload { try PartFiles.make(sandbox.path("data/big.bin"), size: 17 << 20, seed: 5) }
        let enqueue = ["enqueue", "s3.upload", "--from-dir", "data", "--id-template", "mig-{{ vars.name }}"]
        #expect(try await sandbox.outbox(enqueue, environment: env).status == 0)
        let firstUpload = try #require(PartFiles.readJSON(sandbox.path(".s3-uploads/mig-big.bin.json"))?["upload_id"] as? String)

        // Killed once the hook exited 0, before that was recorded.
        let killed = try await sandbox.outbox(["run", "--drain"], environment: env.merging(["OUTBOX_FAULT": "hook.before-ack"]) { $1 })
        #expect(killed.status != 0, "the fault point kills the runner: \(killed.stderr)")
        #expect(try await sandbox.list().map { $0["state"] as? String } == ["completed"], "its outcome not acknowledged")
        #expect(try await sandbox.outbox(enqueue, environment: env).status == 0)
        let kept = try #require(PartFiles.readJSON(sandbox.path(".s3-uploads/mig-big.bin.json")))
        #expect(kept["upload_id"] as? String == firstUpload)
        #expect(kept["completed"] as? Bool == true)
        let run = try await sandbox.outbox(["run", "--drain", "--json"], environment: env)
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.stderr.contains("was already complete"), "\(run.stderr)")
        #expect(try S3SkipExistingTests.summary(run)["attempts"] as? Int == 0, "no part sent again: \(run.stdout)")
        #expect(try await sandbox.list().isEmpty)
        let open = try await python([
            "-c", "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1] + '/migration?uploads').read().decode())",
            moto.endpoint,
        ])
        #expect(open.status == 0 && !open.stdout.contains("<UploadId>"), "no upload left open: \(open.stdout)")

        // The entry gone, the same id enqueued again asks for the file again: a new upload.
        #expect(try await sandbox.outbox(enqueue, environment: env).status == 0)
        let again = try #require(PartFiles.readJSON(sandbox.path(".s3-uploads/mig-big.bin.json")))
        #expect(again["upload_id"] as? String != firstUpload && again["completed"] == nil)
        #expect(try await sandbox.outbox(["run", "--drain"], environment: env).status == 0)
        let remote = try await python(["tools/s3_tool.py", "sha256", "migration", "big.bin"])
        let local = try await offload { try PartFiles.sha(sandbox.path("data/big.bin"), 0, 17 << 20) }
        #expect(remote.stdout.hasPrefix(local), "\(remote.stdout)")
    }

    @Test func signerMatchesBotocore() async throws {
        if let reason = try await offload({ MotoServer.ensureInstalled() }) {
            // A missing server is a failure, never a silent pass.
            Issue.record("moto is needed for this test: \(reason)")
            return
        }
        let example = Self.example
        let check = try await offload { try MotoServer.python([example + "/tests/check_sigv4.py"]) }
        #expect(check.exitCode == 0, "\(check.stdoutText)\(check.stderr)")
        #expect(check.stdoutText.contains("check_sigv4: 0 mismatches"))
    }

    @Test func aTreeOfFilesLandsInS3ByteForByte() async throws {
        guard let (moto, sandbox, env) = try await Self.exampleWithBucket() else { return }
        // moto serves the whole test: it stops when released.
        defer { withExtendedLifetime(moto) {} }
        func python(_ arguments: [String]) async throws -> OutboxRun { try await Self.python(arguments, in: sandbox, environment: env) }

        let files: [(relative: String, size: Int)] = [
            ("empty.bin", 0), ("small.txt", 1024), ("nested/medium.bin", 12 << 20),
            ("big.bin", 130 << 20),
        ]
        for (n, file) in files.enumerated() {
            let path = sandbox.path("data/" + file.relative)
            try await offload { try PartFiles.make(path, size: file.size, seed: UInt64(n + 11)) }
        }
        let enqueue = [
            "enqueue", "s3.upload", "--from-dir", "data", "--vars", #"{"prefix": "run1/"}"#, "--id-template", "mig-{{ vars.name }}",
        ]
        let first = try await sandbox.outbox(enqueue, environment: env)
        #expect(first.status == 0, "\(first.stderr)")
        #expect(first.lines == ["mig-big.bin", "mig-empty.bin", "mig-medium.bin", "mig-small.txt"])
        let bigState = try #require(PartFiles.readJSON(sandbox.path(".s3-uploads/mig-big.bin.json")))
        let uploadID = try #require(bigState["upload_id"] as? String)
        #expect(((bigState["descriptor"] as? [String: Any])?["parts"] as? [Any])?.count == 7)

        // A first run stopped after a second; the same tree enqueued again resumes.
        #expect(try await sandbox.outbox(["run", "--max-time", "1s", "--grace", "0s"], environment: env).status == 0)
        let again = try await sandbox.outbox(enqueue, environment: env)
        #expect(again.status == 0, "\(again.stderr)")
        if let state = PartFiles.readJSON(sandbox.path(".s3-uploads/mig-big.bin.json")) {
            #expect(state["upload_id"] as? String == uploadID, "a resume must keep the multipart upload")
        }
        // A hook the first run left mid-way is stopped and delivered again; S3 may refuse that
        // interrupted completion once (moto answers 500), and the redelivery then succeeds: the
        // drain then says a delivery failed in it (exit 4), though every outcome is acknowledged.
        // That redelivery is due 2 s (the example's backoff) after the refusal, which may come
        // late on a busy machine: a horizon of 2 minutes, not 10 s from the drain's start,
        // keeps it in this run.
        let run = try await sandbox.outbox(["run", "--drain", "--horizon", "2m"], environment: env)
        #expect(run.status == 0 || run.status == 4, "nothing settled error or awaits auth: \(run.stderr)")
        #expect(try await sandbox.list().isEmpty, "every outcome acknowledged and forgotten")
        // A completed multipart upload's state stays, marked, until its id is enqueued again.
        let states = (try? FileManager.default.contentsOfDirectory(atPath: sandbox.path(".s3-uploads"))) ?? []
        #expect(states.sorted() == ["mig-big.bin.json", "mig-medium.bin.json"])
        for name in states { #expect(PartFiles.readJSON(sandbox.path(".s3-uploads/" + name))?["completed"] as? Bool == true, "\(name)") }

        for file in files {
            let path = sandbox.path("data/" + file.relative)
            let local = try await offload { try PartFiles.sha(path, 0, Int64(file.size)) }
            let remote = try await python(["tools/s3_tool.py", "sha256", "migration", "run1/" + file.relative])
            #expect(remote.status == 0, "\(remote.stderr)")
            let fields = remote.stdout.split(separator: " ").map(String.init)
            #expect(fields.count == 3)
            #expect(fields.first == local, "run1/\(file.relative) differs from its file")
            #expect(fields.dropFirst().first == String(file.size))
            // Multipart objects have an ETag ending in -<parts>; single PUTs do not.
            let etag = fields.last?.trimmingCharacters(in: CharacterSet(charactersIn: "\"\n")) ?? ""
            let suffix = file.size >= 8 << 20 ? (file.size == 12 << 20 ? "-1" : "-7") : nil
            if let suffix { #expect(etag.hasSuffix(suffix), "\(file.relative): ETag \(etag)") } else { #expect(!etag.contains("-")) }
        }
    }
}
