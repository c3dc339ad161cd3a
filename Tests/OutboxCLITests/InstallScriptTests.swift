import Foundation
import OutboxModel
import TestSupport
import Testing

/// `scripts/install.sh` builds outbox and installs the binary, the manual page and the three
/// completion scripts under a prefix, and nothing else. The tests install the debug build,
/// which the test run has built already (the release build is `.ci/extended`'s). One at a
/// time: two `swift build`s in one build folder fail on its locked database.
@Suite(.serialized)
struct InstallScriptTests {
    /// The repository (#filePath is Tests/OutboxCLITests/InstallScriptTests.swift).
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    static let installed = [
        "bin/outbox", "share/man/man1/outbox.1", "share/bash-completion/completions/outbox",
        "share/zsh/site-functions/_outbox", "share/fish/vendor_completions.d/outbox.fish",
    ]

    /// Runs the script with the toolchain on PATH (it builds with `swift build`).
    static func install(_ arguments: [String], _ p: TestProject) async throws -> CommandResult {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
        let environment = p.processEnvironment(["PATH": path]), cwd = p.base
        // A build waits on a thread of its own, not on one of the test pool's two.
        return try await offload {
            try runProcess("/bin/bash", [repository + "/scripts/install.sh"] + arguments, cwd: cwd, environment: environment, timeout: 1200)
        }
    }

    /// Every regular file under a folder, relative to it, sorted.
    static func files(under folder: String) -> [String] {
        let all = FileManager.default.enumerator(atPath: folder)?.allObjects as? [String] ?? []
        return all.filter { name in
            var isFolder: ObjCBool = false
            return FileManager.default.fileExists(atPath: folder + "/" + name, isDirectory: &isFolder) && !isFolder.boolValue
        }.sorted()
    }

    @Test func installsTheBinaryManualAndCompletionsUnderAPrefix() async throws {
        let p = try TestProject(config: nil)
        let prefix = p.base + "/prefix"
        let r = try await Self.install(["--configuration", "debug", prefix], p)
        #expect(r.exitCode == 0, "\(r)")
        // Exactly these files: no test server, no temporary names left behind.
        #expect(Self.files(under: prefix) == Self.installed.sorted(), "\(Self.files(under: prefix))")
        #expect(!FileManager.default.fileExists(atPath: prefix + "/bin/outbox-testserver"))

        let outbox = prefix + "/bin/outbox"
        p.executable = outbox
        let version = try await p.outbox(["--version"])
        #expect(version.exitCode == 0 && version.stdout == "outbox \(outboxVersion)\n", "\(version)")
        // A fresh project made and checked by the installed binary.
        let fresh = p.base + "/fresh"
        try FileManager.default.createDirectory(atPath: fresh, withIntermediateDirectories: true)
        let made = try await p.outbox(["init"], cwd: fresh)
        #expect(made.exitCode == 0, "\(made)")
        let check = try await p.outbox(["check"], cwd: fresh)
        #expect(check.exitCode == 0 && check.stdout.hasPrefix("ok:"), "\(check)")

        // The page and the scripts are what the installed binary prints.
        let generated: [(String, [String])] = [
            ("share/man/man1/outbox.1", ["man"]), ("share/bash-completion/completions/outbox", ["completion", "bash"]),
            ("share/zsh/site-functions/_outbox", ["completion", "zsh"]),
            ("share/fish/vendor_completions.d/outbox.fish", ["completion", "fish"]),
        ]
        for (file, arguments) in generated {
            let text = try String(contentsOfFile: prefix + "/" + file, encoding: .utf8)
            let printed = try await p.outbox(arguments)
            #expect(!text.isEmpty && text == printed.stdout, "\(file)")
        }
        // Stripped, and the Swift runtime, the C++ library and SQLite linked in.
        let sections = try runProcess("/usr/bin/readelf", ["-S", outbox])
        #expect(sections.exitCode == 0 && sections.stdout.contains(".text") && !sections.stdout.contains(".symtab"), "\(sections)")
        let libraries = try runProcess("/usr/bin/ldd", [outbox])
        #expect(libraries.exitCode == 0 && !libraries.stdout.contains("libswift"), "\(libraries)")
        #expect(!libraries.stdout.contains("libstdc++") && !libraries.stdout.contains("libsqlite3"), "\(libraries)")
        // No library search path of its own: its folder is not where its libraries come from.
        let dynamic = try runProcess("/usr/bin/readelf", ["-d", outbox])
        #expect(dynamic.exitCode == 0 && dynamic.stdout.contains("NEEDED"), "\(dynamic)")
        #expect(!dynamic.stdout.contains("RUNPATH") && !dynamic.stdout.contains("RPATH"), "\(dynamic)")

        // Installing again replaces the files in place.
        let again = try await Self.install(["--configuration=debug", prefix], p)
        #expect(again.exitCode == 0, "\(again)")
        #expect(Self.files(under: prefix) == Self.installed.sorted())
    }

    @Test(arguments: [
        (["--configuration", "fast"], "not \"fast\""), (["--configuration"], "--configuration needs"),
        (["--prefix", "/tmp/x"], "unknown option --prefix"), (["/tmp/a", "/tmp/b"], "one PREFIX only"),
    ])
    func badArgumentsFailBeforeBuilding(_ arguments: [String], _ message: String) async throws {
        let p = try TestProject(config: nil)
        let r = try await Self.install(arguments, p)
        #expect(r.exitCode != 0, "\(r)")
        #expect(r.stderr.contains("install.sh: ") && r.stderr.contains(message), "\(r)")
        #expect(!r.stderr.contains("building"), "\(r)")
    }

    @Test func aStepThatFailsStopsTheScriptWithItsReason() async throws {
        let p = try TestProject(config: nil)
        // A prefix under a regular file cannot be created (root could write a read-only folder).
        try p.write("file", "not a folder")
        let prefix = p.path("file") + "/prefix"
        let r = try await Self.install(["--configuration", "debug", prefix], p)
        #expect(r.exitCode != 0, "\(r)")
        #expect(r.stderr.contains("install.sh: ") && r.stderr.contains(prefix + "/bin"), "\(r)")
        #expect(!FileManager.default.fileExists(atPath: prefix))
    }

    @Test func helpNamesEveryInstalledFile() async throws {
        let p = try TestProject(config: nil)
        let r = try await Self.install(["--help"], p)
        #expect(r.exitCode == 0, "\(r)")
        for file in Self.installed { #expect(r.stdout.contains("PREFIX/" + file), "\(file)") }
    }
}
