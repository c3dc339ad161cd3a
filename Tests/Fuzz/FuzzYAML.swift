#if canImport(Glibc)
import Glibc
#endif
@testable import OutboxModel
import YAML

/// The YAML loaders, through the files the commands read: the input is written as a config
/// file and as a definition file, both are loaded, and a definition that loads is rendered
/// as `outbox render` would (fixed vars, no plugins).
enum FuzzYAML {
    /// A project folder of this process (`prepare`), rewritten for every input.
    nonisolated(unsafe) static var project = ""

    static func prepare() {
        let base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp")
        var template = Array("\(base)/outbox-fuzz-yaml.XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { fatalError("cannot make a temp folder in \(base)") }
        project = String(cString: made)
        mkdir(project + "/config", 0o700)
        mkdir(project + "/definitions", 0o700)
        // Best effort: a folder per fuzzing run, removed when it ends normally.
        atexit { _ = system("rm -rf '\(FuzzYAML.project)'") }
    }

    static func run(_ input: UnsafeBufferPointer<UInt8>) {
        let bytes = Array(input)
        if let text = String(validating: bytes, as: UTF8.self) { _ = try? YAMLParser.parse(text) }
        let configFile = project + "/config/outbox.yaml"
        write(bytes, to: configFile)
        write(bytes, to: project + "/definitions/fuzz.yaml")
        let config = (try? Config.load(file: configFile)) ?? Config(root: project)
        let set = DefinitionSet.load(folder: project + "/definitions")
        for definition in set.definitions.values {
            guard let request = definition.request else { continue }
            var inputs = RenderInputs(id: "fuzz-1", vars: vars, environment: ["HOST": "http://127.0.0.1:9"], cwd: project)
            inputs.environmentJSON = nil
            _ = try? RequestBuilder.prepare(request: request, definition: definition, config: config, inputs: inputs)
        }
    }

    private static let vars: JSON = .object([
        ("id", .string("n7")), ("name", .string("a b/c")), ("count", .number("3")), ("flag", .bool(true)),
        ("list", .array([.number("1"), .string("x")])), ("path", .string("../etc/passwd")),
    ])

    private static func write(_ bytes: [UInt8], to path: String) {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { fatalError("cannot write \(path)") }
        let written = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        close(fd)
        guard written == bytes.count else { fatalError("short write to \(path)") }
    }
}
