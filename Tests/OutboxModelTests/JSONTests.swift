import OutboxModel
import Testing

struct JSONTests {
    static let literals: [(String, String)] = [
        ("", #""""#),
        ("plain", #""plain""#),
        ("quote \" inside", #""quote \" inside""#),
        ("back\\slash", #""back\\slash""#),
        ("line\nbreak\r\n", #""line\nbreak\r\n""#),
        ("tab\there \u{08}\u{0C}", #""tab\there \b\f""#),
        ("\u{01}\u{1F}\u{00}", #""\u0001\u001f\u0000""#),
        ("é ü 日本 🚀 /", "\"é ü 日本 🚀 /\""),
    ]

    /// String literals: short escapes where JSON has them, \u00XX for other control
    /// characters, UTF-8 and `/` as they are; and the text parses back.
    @Test(arguments: literals)
    func stringLiterals(_ text: String, _ expected: String) throws {
        #expect(JSON.string(text).serialized() == expected)
        #expect(try JSON.parse(expected).stringValue == text)
    }

    @Test func compactAndPrettyText() throws {
        let value: JSON = .object([("b", .array([.int(1), .null, .bool(true)])), ("a", .object([("k\"", .string("v"))])),
                                   ("e", .array([])), ("o", .object([]))])
        #expect(value.serialized() == #"{"b":[1,null,true],"a":{"k\"":"v"},"e":[],"o":{}}"#)
        #expect(value.serialized(sortedKeys: true) == #"{"a":{"k\"":"v"},"b":[1,null,true],"e":[],"o":{}}"#)
        #expect(value.pretty() == """
            {
              "b": [
                1,
                null,
                true
              ],
              "a": {
                "k\\"": "v"
              },
              "e": [],
              "o": {}
            }
            """)
        #expect(try JSON.parse(value.pretty()) == value)
    }
}
