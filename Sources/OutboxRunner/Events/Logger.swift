import OutboxModel

/// How serious a log line is; `--quiet` keeps `warn` and up, `-v` adds `debug`.
package enum LogLevel: String, Sendable, CaseIterable {
    case debug, info, warn, error

    var rank: Int { LogLevel.allCases.firstIndex(of: self) ?? 0 }
}

/// `--log-format`: text for people, one JSON object a line for log collectors.
package enum LogFormat: String, Sendable, CaseIterable {
    case text, json
}

/// Every line `outbox run` writes on stderr: with its time and level, as text
/// (`2026-12-01T08:00:00.123Z info  message`) or as JSON (`time`, `level`, `message` and
/// the line's fields, such as `id`).
package struct Logger: Sendable {
    package var format: LogFormat
    package var minimum: LogLevel
    private let write: @Sendable (String) -> Void
    private let clock: @Sendable () -> Int64

    package init(
        format: LogFormat = .text, minimum: LogLevel = .info, clock: @escaping @Sendable () -> Int64 = { Identifiers.nowMs() },
        write: @escaping @Sendable (String) -> Void
    ) {
        self.format = format
        self.minimum = minimum
        self.clock = clock
        self.write = write
    }

    package func log(_ level: LogLevel, _ message: String, fields: [(String, JSON)] = []) {
        guard level.rank >= minimum.rank else { return }
        let time = Units.rfc3339(ms: clock())
        switch format {
        case .text:
            // One record a line: a line break from a key, a server or a hook would forge the next record.
            write("\(time) \(level.rawValue.padding(5)) \(TerminalText.cell(message))")
        case .json:
            write(
                JSON.object([("time", .string(time)), ("level", .string(level.rawValue)), ("message", .string(message))] + fields)
                    .serialized())
        }
    }
}

extension String {
    fileprivate func padding(_ width: Int) -> String { count >= width ? self : self + String(repeating: " ", count: width - count) }
}
