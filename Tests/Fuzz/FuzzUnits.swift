@testable import OutboxModel

/// Duration and size parsing: any text parses or throws E_INVALID; a parsed duration is
/// within 0...100 years and a size is not negative, and both print.
enum FuzzUnits {
    static func run(_ input: UnsafeBufferPointer<UInt8>) {
        let text = String(decoding: input, as: UTF8.self)
        do {
            let ms = try Units.parseDuration(text)
            if ms < 0 || ms > Units.maxDurationMs { fatalError("duration \(ms) ms out of range") }
            _ = Units.formatDuration(ms: ms)
            _ = Units.rfc3339(ms: ms)
        } catch {
            if error.code != .invalid { fatalError("parseDuration threw \(error.code)") }
        }
        do {
            let bytes = try Units.parseSize(text)
            if bytes < 0 { fatalError("size \(bytes) is negative") }
            _ = Units.formatBytes(bytes)
        } catch {
            if error.code != .invalid { fatalError("parseSize threw \(error.code)") }
        }
        _ = LogText.escaped(text[...])
    }
}
