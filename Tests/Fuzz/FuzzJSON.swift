@testable import OutboxModel

/// The JSON parser: any bytes either parse or throw; what parses prints back to text that
/// parses to the same value (numbers are kept as their text, so equality is exact).
enum FuzzJSON {
    static func run(_ input: UnsafeBufferPointer<UInt8>) {
        guard let value = try? JSON.parse(utf8: input) else { return }
        let printed = value.serialized()
        guard let again = try? JSON.parse(printed) else {
            fatalError("the serialized form of a parsed value does not parse: \(printed.prefix(200))")
        }
        guard again == value else { fatalError("parse(serialize(v)) != v for \(printed.prefix(200))") }
        let pretty = value.pretty()
        guard let fromPretty = try? JSON.parse(pretty), fromPretty == value else {
            fatalError("the pretty form does not parse back to the value: \(pretty.prefix(200))")
        }
    }
}
