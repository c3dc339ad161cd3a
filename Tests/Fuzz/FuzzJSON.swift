@testable import OutboxModel

/// The JSON parser: any bytes either parse or throw; what parses prints back to text that
/// parses to the same value (numbers are kept as their text, so equality is exact). The
/// member scan finds in every object exactly the values the parser reads.
enum FuzzJSON {
    static func run(_ input: UnsafeBufferPointer<UInt8>) {
        guard let value = try? JSON.parse(utf8: input) else { return }
        if let members = value.objectValue {
            var names = ["url", "file"]
            for (name, _) in members.prefix(2) where !names.contains(name) { names.append(name) }
            guard let ranges = JSON.memberValueRanges(in: input, named: names) else {
                fatalError("the member scan cannot walk an object that parses")
            }
            for (name, range) in zip(names, ranges) {
                guard let range else {
                    // Only a name written with escapes is not found (it stays in the request's shape).
                    guard value[name] == nil || input.contains(UInt8(ascii: "\\")) else {
                        fatalError("the member scan misses \(name)")
                    }
                    continue
                }
                let scanned = try? JSON.parse(utf8: UnsafeBufferPointer(rebasing: input[range]))
                guard scanned == value[name] else { fatalError("the member scan finds another value of \(name)") }
            }
        }
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
