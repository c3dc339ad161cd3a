// One libFuzzer binary for every target: `outbox-fuzz TARGET [libFuzzer flags] [corpus]`.
// The target name is also kept in OUTBOX_FUZZ_TARGET, so the copies libFuzzer starts of
// itself (-minimize_crash, -merge) fuzz the same target without the name in their argv.
#if canImport(Glibc)
import Glibc
#endif

@_silgen_name("LLVMFuzzerRunDriver")
func runFuzzerDriver(
    _ argc: UnsafeMutablePointer<Int32>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> Int32
) -> Int32

/// The fuzz targets: each takes one input and returns normally unless it found a defect.
enum FuzzTarget: String, CaseIterable {
    case json, yaml, template, url, headers, units

    func run(_ input: UnsafeBufferPointer<UInt8>) {
        switch self {
        case .json: FuzzJSON.run(input)
        case .yaml: FuzzYAML.run(input)
        case .template: FuzzTemplate.run(input)
        case .url: FuzzURL.run(input)
        case .headers: FuzzHeaders.run(input)
        case .units: FuzzUnits.run(input)
        }
    }

    /// Sets up what a target needs once per process.
    func prepare() {
        if self == .yaml { FuzzYAML.prepare() }
    }
}

/// The input callback; libFuzzer's runtime also links against this name.
@_cdecl("LLVMFuzzerTestOneInput")
func testOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    selectedTarget.run(UnsafeBufferPointer(start: data, count: size))
    return 0
}

// Read by the C callback, which cannot capture; set once before the driver starts.
nonisolated(unsafe) var selectedTarget = FuzzTarget.json

var arguments = CommandLine.arguments
if arguments.count > 1, FuzzTarget(rawValue: arguments[1]) != nil {
    setenv("OUTBOX_FUZZ_TARGET", arguments[1], 1)
    arguments.remove(at: 1)
}
guard let name = getenv("OUTBOX_FUZZ_TARGET").map({ String(cString: $0) }), let target = FuzzTarget(rawValue: name) else {
    let names = FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")
    let usage = "usage: outbox-fuzz TARGET [libFuzzer flags] [corpus...]\ntargets: \(names)\n"
    _ = usage.withCString { write(2, $0, strlen($0)) }
    exit(64)
}
selectedTarget = target
target.prepare()

// libFuzzer keeps pointers into argv for its whole run: the strings are never freed.
var argc = Int32(arguments.count)
var argv = arguments.map { strdup($0) } + [nil]
let status = argv.withUnsafeMutableBufferPointer { buffer in
    var base = buffer.baseAddress
    return runFuzzerDriver(&argc, &base, testOneInput)
}
exit(status)
