@testable import OutboxModel

/// Duration and size parsing: any text parses or throws E_INVALID; a parsed duration is
/// within 0...100 years and a size is not negative, and both print. Any text shown on a
/// terminal keeps no escape character, and its excerpt's column stays within it.
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
        let shown = TerminalText.visible(text)
        if shown.unicodeScalars.contains(where: { $0.value == 0x1B }) { fatalError("an escape character got through") }
        let cut = TerminalText.excerpt(shown, column: text.count / 2 + 1, width: 40)
        if cut.column < 1 || cut.column > cut.text.count + 1 { fatalError("excerpt column \(cut.column) is outside \(cut.text.count)") }
    }
}
