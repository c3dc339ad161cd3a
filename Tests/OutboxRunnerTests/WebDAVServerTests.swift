import Foundation
import Testing
import TestSupport

// The README's WebDAV example, its definitions read from the README itself, against two
// WebDAV servers written by others, on loopback: `rclone serve webdav` and nginx's dav
// module. Neither is set to create a missing folder on PUT (nginx without
// create_full_put_path, as Apache mod_dav), so the folders go first with MKCOL.

/// A WebDAV server of another project serving `root` on loopback.
struct WebDAVServer {
    enum Kind: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case rclone, nginx
        var testDescription: String { rawValue }
        var executable: String { self == .rclone ? "/usr/bin/rclone" : "/usr/sbin/nginx" }
        /// Why the server cannot run here, or nil.
        var missing: String? { LoopbackService.missing(executable, package: rawValue) }
    }

    let service: LoopbackService
    var url: String { service.url }

    /// `folder` holds its configuration, log and nginx's request-body files, outside `root`.
    init(_ kind: Kind, root: String, folder: String) async throws {
        let environment = ["PATH": "/usr/bin:/bin", "HOME": folder]
        service = try await LoopbackService(kind.rawValue, executable: kind.executable, folder: folder, environment: environment) {
            port in
            switch kind {
            case .rclone:
                _ = FileManager.default.createFile(atPath: folder + "/rclone.conf", contents: nil)
                return ["serve", "webdav", root, "--addr", "127.0.0.1:\(port)", "--config", folder + "/rclone.conf"]
            case .nginx:
                try FileManager.default.createDirectory(atPath: folder + "/body", withIntermediateDirectories: true)
                // One process, no master: it runs as the test's user and writes files the test can read back.
                let config = """
                    daemon off;
                    master_process off;
                    pid \(folder)/nginx.pid;
                    error_log \(folder)/error.log warn;
                    events { worker_connections 64; }
                    http {
                      access_log off;
                      client_body_temp_path \(folder)/body;
                      proxy_temp_path \(folder)/body; fastcgi_temp_path \(folder)/body;
                      uwsgi_temp_path \(folder)/body; scgi_temp_path \(folder)/body;
                      server {
                        listen 127.0.0.1:\(port);
                        client_max_body_size 0;
                        location / { root \(root); dav_methods PUT DELETE MKCOL COPY MOVE; dav_access user:rw; }
                      }
                    }

                    """
                try config.write(toFile: folder + "/nginx.conf", atomically: true, encoding: .utf8)
                return ["-e", folder + "/error.log", "-p", folder + "/", "-c", folder + "/nginx.conf"]
            }
        }
    }

    func stop() { service.stop() }
}

@Suite struct WebDAVServerTests {
    static let readme = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("README.md").path

    /// The README's text of `definitions/NAME`: what a quoted heredoc writes into it, or a
    /// YAML block whose first line is `# definitions/NAME`.
    static func readmeDefinition(_ name: String) throws -> String {
        let text = try String(contentsOfFile: readme, encoding: .utf8)
        for (opening, closing) in [("cat > definitions/\(name) <<'EOF'\n", "\nEOF\n"), ("```yaml\n# definitions/\(name)\n", "\n```\n")] {
            guard let start = text.range(of: opening) else { continue }
            let end = try #require(text.range(of: closing, range: start.upperBound..<text.endIndex))
            return String(text[start.upperBound..<end.lowerBound]) + "\n"
        }
        throw TestHTTPServerError(description: "README.md no longer has definitions/\(name)")
    }

    /// A project with the README's definitions `names`, and `kind` serving its folder
    /// `served`; nil, with the test failed, when the server is not installed.
    static func start(_ kind: WebDAVServer.Kind, readmeDefinitions names: [String]) async throws -> (OutboxSandbox, WebDAVServer)? {
        if let reason = kind.missing {
            Issue.record(Comment(rawValue: reason))
            return nil
        }
        let sandbox = try OutboxSandbox()
        for name in names { _ = try sandbox.write("definitions/" + name, try readmeDefinition(name)) }
        try FileManager.default.createDirectory(atPath: sandbox.path("served"), withIntermediateDirectories: true)
        return (sandbox, try await WebDAVServer(kind, root: sandbox.path("served"), folder: sandbox.path("server")))
    }

    /// Files of the tree, by relative path: names a URL must encode, an empty file, one sent
    /// with its headers (4 KiB), one past that (70,000 bytes) and one of 5 MiB.
    static let tree: [(path: String, size: Int)] = [
        ("b.txt", 4), ("empty.bin", 0), ("2026/11/a.txt", 4096), ("photos/café au lait #1.jpg", 70_000),
        ("photos/raw/100%+plus?.bin", 5 << 20), ("photos/raw/[x] & y.bin", 1),
    ]

    /// Every regular file under `folder`, relative, with its bytes.
    static func files(under folder: String) -> [String: Data] {
        var found: [String: Data] = [:]
        for case let name as String in FileManager.default.enumerator(atPath: folder)?.allObjects ?? [] {
            var isFolder: ObjCBool = false
            let full = folder + "/" + name
            if FileManager.default.fileExists(atPath: full, isDirectory: &isFolder), !isFolder.boolValue {
                found[name] = FileManager.default.contents(atPath: full)
            }
        }
        return found
    }

    @Test(arguments: WebDAVServer.Kind.allCases)
    func aFolderTreeLandsByteForByteAsTheReadmeSays(_ kind: WebDAVServer.Kind) async throws {
        // A missing server is a failure, never a silent pass.
        guard let (sandbox, server) = try await Self.start(kind, readmeDefinitions: ["dav-mkcol.yaml", "dav-put.yaml"]) else { return }
        defer { server.stop() }
        let served = sandbox.path("served"), source = sandbox.path("tree")
        var expected: [String: Data] = [:]
        for (n, file) in Self.tree.enumerated() {
            let bytes = Data((0..<file.size).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ n &* 7 &+ $0 >> 9) })
            let path = source + "/" + file.path
            try FileManager.default.createDirectory(
                atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            try bytes.write(to: URL(fileURLWithPath: path))
            expected[file.path] = bytes
        }
        let env = ["DAV_URL": server.url]

        // The folders, parents first, from stdin; a second time each one is there already (405).
        let folders = ["2026", "2026/11", "photos", "photos/raw"]
        let lines = folders.map { #"{"vars": {"dir": "\#($0)"}}"# }.joined(separator: "\n") + "\n"
        for round in 1...2 {
            let mkcol = try await sandbox.outbox(["enqueue", "dav.mkcol", "--from", "-"], stdin: lines, environment: env)
            #expect(mkcol.status == 0 && mkcol.lines.count == folders.count, "\(mkcol)")
            let run = try await sandbox.outbox(["run", "--drain"], environment: env)
            #expect(run.status == 0 && run.stderr.contains("4 completed, 0 error"), "round \(round): \(run)")
        }

        let put = try await sandbox.outbox(["enqueue", "dav.put", "--from-dir", source], environment: env)
        #expect(put.status == 0 && put.lines.count == Self.tree.count, "\(put)")
        let run = try await sandbox.outbox(["run", "--drain"], environment: env)
        #expect(run.status == 0 && run.stderr.contains("\(Self.tree.count) completed, 0 error"), "\(run)")
        // The server decoded every name back to the file's own, and holds exactly the tree.
        let landed = Self.files(under: served)
        #expect(landed.keys.sorted() == expected.keys.sorted())
        for (path, bytes) in expected { #expect(landed[path] == bytes, "\(path)") }
        #expect(try await sandbox.list().isEmpty)
    }

    /// A PUT into a folder the server does not have is not taken: rclone answers 404 (which
    /// outbox's default config retries, as a resource that may appear), nginx 500 (it fails to
    /// rename its body file into place). Either way the entry waits; once the folder is made
    /// with MKCOL, a later attempt puts the file.
    @Test(arguments: [(WebDAVServer.Kind.rclone, 404), (.nginx, 500)])
    func aPutIntoAMissingFolderIsRetriedUntilTheFolderIsMade(_ kind: WebDAVServer.Kind, _ refusal: Int) async throws {
        // A missing server is a failure, never a silent pass.
        guard let (sandbox, server) = try await Self.start(kind, readmeDefinitions: ["dav-mkcol.yaml", "dav-put.yaml"]) else { return }
        defer { server.stop() }
        let served = sandbox.path("served")
        let env = ["DAV_URL": server.url]
        let file = try sandbox.write("x.txt", "x")
        let vars = #"{"path": "\#(file)", "relative_path": "missing/x.txt"}"#
        let enqueue = try await sandbox.outbox(["enqueue", "dav.put", "--vars", vars], environment: env)
        #expect(enqueue.status == 0, "\(enqueue)")
        let id = try #require(enqueue.lines.first)
        // One attempt: the next one is not due at once.
        let first = try await sandbox.outbox(["run", "--drain", "--horizon", "0s"])
        #expect(first.status == 0 && first.stderr.contains("0 completed, 0 error, 1 retried"), "\(first)")
        let shown = try #require(try await sandbox.show(id))
        #expect(shown["state"] as? String == "queued")
        #expect((shown["attempts_log"] as? [[String: Any]] ?? []).map { $0["http_code"] as? Int } == [refusal])
        #expect(Self.files(under: served).isEmpty)

        let mkcol = try await sandbox.outbox(["enqueue", "dav.mkcol", "--vars", #"{"dir": "missing"}"#], environment: env)
        #expect(mkcol.status == 0, "\(mkcol)")
        let second = try await sandbox.outbox(["run", "--drain"])
        #expect(second.status == 0, "\(second)")
        #expect(Self.files(under: served) == ["missing/x.txt": Data("x".utf8)])
        #expect(try await sandbox.list().isEmpty)
    }

    /// A runner killed in the middle of a file's body (SIGKILL, as a power cut would do)
    /// leaves the server a request cut off, which is not the file; the next run sends the
    /// file again, and the server ends with it whole.
    @Test(arguments: WebDAVServer.Kind.allCases)
    func aPutCutOffByAKillIsSentWholeByTheNextRun(_ kind: WebDAVServer.Kind) async throws {
        // A missing server is a failure, never a silent pass.
        guard let (sandbox, server) = try await Self.start(kind, readmeDefinitions: ["dav-put.yaml"]) else { return }
        defer { server.stop() }
        let served = sandbox.path("served")
        let bytes = Data((0..<(24 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 13) })
        let file = sandbox.path("big.bin")
        try bytes.write(to: URL(fileURLWithPath: file))
        let vars = #"{"path": "\#(file)", "relative_path": "big.bin"}"#
        let enqueue = try await sandbox.outbox(["enqueue", "dav.put", "--vars", vars], environment: ["DAV_URL": server.url])
        #expect(enqueue.status == 0, "\(enqueue)")

        // The debug build kills itself once half of the body has been read for sending.
        let killed = try await sandbox.outbox(["run", "--drain"], environment: ["OUTBOX_FAULT": "send.mid-body"])
        #expect(killed.exitCode == -9, "\(killed)")
        #expect(Self.files(under: served)["big.bin"] != bytes)
        // rclone answers 423 Locked until it has closed the cut-off upload, which the example
        // retries with backoff: runs go on (a few at most) until the entry is gone.
        var runs: [OutboxRun] = []
        var left = 1
        while runs.count < 5 && left > 0 && runs.last.map({ $0.status == 0 }) != false {
            runs.append(try await sandbox.outbox(["run", "--drain"]))
            left = try await sandbox.list().count
        }
        #expect(runs.allSatisfy { $0.status == 0 } && runs.last?.stderr.contains("1 completed, 0 error") == true, "\(runs)")
        #expect(Self.files(under: served) == ["big.bin": bytes])
        #expect(try await sandbox.list().isEmpty)
    }

    /// The README's publishing workflow: each file is put under a temporary name, and the
    /// PUT's outcome chains a MOVE to its own name (a `Destination` encoded by `| path`), so a
    /// reader of the folder never sees half a file under the final one. Both servers move it;
    /// nothing is left under the temporary name.
    @Test(arguments: WebDAVServer.Kind.allCases)
    func aPutThenAChainedMovePublishesEachFileWhole(_ kind: WebDAVServer.Kind) async throws {
        // A missing server is a failure, never a silent pass.
        guard let (sandbox, server) = try await Self.start(kind, readmeDefinitions: ["dav-publish.yaml", "dav-move.yaml"]) else { return }
        defer { server.stop() }
        let served = sandbox.path("served"), source = sandbox.path("tree")
        try FileManager.default.createDirectory(atPath: source, withIntermediateDirectories: true)
        var expected: [String: Data] = [:]
        for (n, name) in ["one.bin", "two words.txt", "three%.csv"].enumerated() {
            let bytes = Data((0..<(70_000 * (n + 1))).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ n) })
            try bytes.write(to: URL(fileURLWithPath: source + "/" + name))
            expected[name] = bytes
        }
        let env = ["DAV_URL": server.url]
        let put = try await sandbox.outbox(["enqueue", "dav.publish", "--from-dir", source], environment: env)
        #expect(put.status == 0 && put.lines.count == 3, "\(put)")
        let run = try await sandbox.outbox(["run", "--drain"], environment: env)
        #expect(run.status == 0 && run.stderr.contains("6 completed, 0 error"), "\(run)")
        #expect(Self.files(under: served) == expected)
        #expect(try await sandbox.list().isEmpty)

        // A MOVE sent again (as after a kill while it was in flight) finds its source gone and
        // its name taken: the server's 404 or 412 completes it, and the published file stays
        // (with `Overwrite: T`, rclone deleted it and answered 403).
        let again = try await sandbox.outbox(["enqueue", "dav.move", "--vars", #"{"relative_path": "two words.txt"}"#], environment: env)
        #expect(again.status == 0, "\(again)")
        let second = try await sandbox.outbox(["run", "--drain"], environment: env)
        #expect(second.status == 0 && second.stderr.contains("1 completed, 0 error"), "\(second)")
        #expect(Self.files(under: served) == expected)
        #expect(try await sandbox.list().isEmpty)
    }
}
