// swift-tools-version:6.0
import PackageDescription

let strict: [SwiftSetting] = [.swiftLanguageMode(.v6)]
// The modules linked into `outbox` use no async/await: without the implicit import, the
// concurrency runtime stays out of the binary and out of every command's start.
// Concrete generic types (`[String: JSON]`, ...) are reached through their metadata accessors
// rather than mangled names, so the first use of each demangles nothing: one `enqueue`
// runs 19 % fewer instructions.
let lean: [SwiftSetting] = strict + [
    .unsafeFlags([
        "-Xfrontend", "-disable-implicit-concurrency-module-import",
        "-Xfrontend", "-disable-concrete-type-metadata-mangled-name-accessors",
    ])
]

let package = Package(
    name: "outbox",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "outbox", targets: ["outbox"]),
        .executable(name: "outbox-testserver", targets: ["outbox-testserver"]),
    ],
    targets: [
        // C modules: typed wrappers for what Swift cannot call (variadic setopt, macros).
        .systemLibrary(name: "CSQLite", path: "Sources/CSQLite"),
        .systemLibrary(name: "CYAML", path: "Sources/CYAML"),
        // libpq (libpq-dev) for the PostgreSQL store.
        .systemLibrary(name: "CLibPQ", path: "Sources/CLibPQ", providers: [.apt(["libpq-dev"])]),
        // libcurl is loaded with dlopen only by `outbox run`, so enqueue starts fast.
        .target(name: "CCurl", path: "Sources/CCurl"),
        .target(name: "CSystem", path: "Sources/CSystem"),

        // SHA-256 of bodies; optimised even in debug builds, since tests hash gigabytes.
        // CDigest: the SHA-NI instructions, 4-5 times the pure Swift rounds on CPUs that have them.
        .target(name: "CDigest", path: "Sources/CDigest", cSettings: [.unsafeFlags(["-O2"])]),
        .target(name: "Digest", dependencies: ["CDigest"], swiftSettings: lean + [.unsafeFlags(["-O"])]),
        .target(name: "YAML", dependencies: ["CYAML"], swiftSettings: lean),
        .target(name: "OutboxProcess", dependencies: ["CSystem"], swiftSettings: lean),
        .target(name: "OutboxModel", dependencies: ["YAML", "Digest", "CSystem", "OutboxProcess"], swiftSettings: lean),
        .target(name: "OutboxStore", dependencies: ["OutboxModel", "CSQLite", "CLibPQ", "CSystem"], swiftSettings: lean),
        .target(name: "OutboxHTTP", dependencies: ["OutboxModel", "CCurl"], swiftSettings: lean),
        // The enqueue rules (vars checks, plugins, templates): shared by `enqueue` and the runner's follow-ups.
        .target(name: "OutboxEnqueue", dependencies: ["OutboxModel", "OutboxProcess"], swiftSettings: lean),
        .target(name: "OutboxRunner", dependencies: ["OutboxModel", "OutboxStore", "OutboxEnqueue", "OutboxHTTP", "OutboxProcess", "CSystem"], swiftSettings: lean),
        .target(name: "OutboxCLI", dependencies: ["OutboxModel", "OutboxStore", "OutboxEnqueue", "OutboxRunner", "OutboxProcess", "YAML", "CSystem"], swiftSettings: lean),
        // The Swift runtime linked in: each command starts 2-4 ms sooner (no symbol lookups
        // across the runtime's shared libraries), which every shell script and timer pays.
        // The C++ library it needs and SQLite are linked in too (Sources/outbox/link says how):
        // 0.5 ms more.
        .executableTarget(
            name: "outbox", dependencies: ["OutboxCLI", "OutboxModel", "CSystem"], exclude: ["link"], swiftSettings: lean,
            linkerSettings: [
                .unsafeFlags(["-static-stdlib", "-L", Context.packageDirectory + "/Sources/outbox/link"], .when(platforms: [.linux]))
            ]),

        // A scriptable loopback HTTP server for tests, the demo and benchmarks.
        // Optimised even in debug builds: it hashes every uploaded byte.
        .target(name: "OutboxTestServer", dependencies: ["Digest", "OutboxModel"], swiftSettings: strict + [.unsafeFlags(["-O"])]),
        .executableTarget(name: "outbox-testserver", dependencies: ["OutboxTestServer"], swiftSettings: strict),

        .target(name: "TestSupport", dependencies: ["CSystem", "OutboxModel", "OutboxTestServer"], path: "Tests/TestSupport", swiftSettings: strict),
        .testTarget(name: "YAMLTests", dependencies: ["YAML"], swiftSettings: strict),
        .testTarget(name: "OutboxModelTests", dependencies: ["OutboxModel", "Digest"], exclude: ["Fixtures"], swiftSettings: strict),
        .testTarget(name: "OutboxProcessTests", dependencies: ["OutboxProcess", "CSystem", "TestSupport"], swiftSettings: strict),
        .testTarget(name: "OutboxStoreTests", dependencies: ["OutboxStore", "OutboxModel", "TestSupport"], swiftSettings: strict),
        .testTarget(name: "OutboxHTTPTests", dependencies: ["OutboxHTTP", "OutboxModel", "TestSupport"], swiftSettings: strict),
        .testTarget(name: "OutboxRunnerTests", dependencies: ["OutboxRunner", "OutboxProcess", "TestSupport", "Digest"], swiftSettings: strict),
        .testTarget(name: "OutboxCLITests", dependencies: ["OutboxCLI", "OutboxModel", "OutboxStore", "TestSupport", "Digest"], swiftSettings: strict),
    ]
)

// libFuzzer targets (Tests/Fuzz): in the manifest only when `.ci/fuzz` builds them, with
// `-sanitize=fuzzer,address` into their own scratch path, so the normal build never sees them.
if Context.environment["OUTBOX_FUZZ"] == "1" {
    package.targets.append(
        .executableTarget(
            name: "outbox-fuzz", dependencies: ["OutboxModel", "OutboxHTTP", "YAML"], path: "Tests/Fuzz",
            exclude: ["corpus"], swiftSettings: strict))
}
