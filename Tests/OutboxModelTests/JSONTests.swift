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
        let value: JSON = .object([
            ("b", .array([.int(1), .null, .bool(true)])), ("a", .object([("k\"", .string("v"))])),
            ("e", .array([])), ("o", .object([])),
        ])
        #expect(value.serialized() == #"{"b":[1,null,true],"a":{"k\"":"v"},"e":[],"o":{}}"#)
        #expect(value.serialized(sortedKeys: true) == #"{"a":{"k\"":"v"},"b":[1,null,true],"e":[],"o":{}}"#)
        #expect(
            value.pretty() == """
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

    /// Escapes that the writer never produces still parse: `\/`, `\u` for ASCII and for
    /// characters beyond the BMP (a surrogate pair), next to raw UTF-8.
    @Test func escapesAndUTF8Parse() throws {
        #expect(try JSON.parse(#""a\/b\u0041\u00e9\ud83d\ude80""#).stringValue == "a/bAé🚀")
        #expect(try JSON.parse(#"{"k\u00e9": "日本", "plain": "é"}"#) == .object([("ké", .string("日本")), ("plain", .string("é"))]))
    }

    /// What a terminal could act on leaves as an escape, and reads back as the same string:
    /// DEL, C1 controls, bidirectional overrides; other non-ASCII text stays as it is.
    @Test func terminalControlsAreEscapedAndReadBack() throws {
        let text = "a\u{7F}b\u{85}c\u{9B}31m\u{202E}evil\u{2066}é日\u{A0}\u{2026}\u{2028}€"
        let written = JSON.string(text).serialized()
        #expect(written == #""a\u007fb\u0085c\u009b31m\u202eevil\u2066é日\#u{A0}\#u{2026}\#u{2028}€""#)
        #expect(try JSON.parse(written).stringValue == text)
        // A lead byte cut off at the very end is copied, not read past.
        for raw: [UInt8] in [[0x78, 0xC2], [0x78, 0xE2, 0x80]] {
            var out: [UInt8] = []
            raw.withUnsafeBufferPointer { JSON.appendString(utf8: $0, to: &out) }
            #expect(out == [0x22] + raw + [0x22])
        }
    }

    /// Bad strings fail with what is wrong and where (1-based byte offset), whether or not
    /// the string holds an escape: text that is not UTF-8 at its first bad byte.
    @Test(
        arguments: [
            ([0x22, 0x61, 0xFF, 0x22], "string is not valid UTF-8 at byte 3"),
            ([0x22, 0xC3, 0x22], "string is not valid UTF-8 at byte 2"),
            ([0x22, 0x5C, 0x6E, 0xC3, 0x22], "string is not valid UTF-8 at byte 4"),
            ([0x22, 0xED, 0xA0, 0x80, 0x22], "string is not valid UTF-8 at byte 2"),
            ([0x7B, 0x22, 0x6B, 0x22, 0x3A, 0x22, 0xC3, 0xA9, 0xFF, 0x62, 0x22, 0x7D], "string is not valid UTF-8 at byte 9"),
            (Array(#""\ud800""#.utf8), "lone surrogate in \\u escape at byte 8"),
            (Array("\"a\u{01}\"".utf8), "control character in string at byte 3"),
            (Array(#""abc"#.utf8), "unterminated string at byte 5"),
            (Array(#""\q""#.utf8), "bad escape at byte 4"),
        ] as [([UInt8], String)])
    func badStringsAreRejected(_ input: [UInt8], _ message: String) {
        var bytes = input
        do {
            _ = try JSON.parse(bytes: &bytes)
            Issue.record("parsed \(input)")
        } catch {
            #expect(error.description == message)
        }
    }

    /// The reader indexes its input without bounds checks, so every way input can stop short
    /// must be caught by its own tests: each strict prefix of a document using every form is
    /// an error at or before its end, and the whole document parses.
    @Test func everyPrefixOfADocumentIsAnErrorNotACrash() throws {
        let whole = Array(#" {"a": [1, -2.5e+3, 0.5E-2, true, false, null, "x\u00e9\ud83d\ude80\n", "é"], "b": {}, "c": []} "#.utf8)
        var complete = whole
        #expect(try JSON.parse(bytes: &complete)["b"] == .object([]))
        for end in 1..<(whole.count - 1) {
            var prefix = Array(whole[..<end])
            do {
                _ = try JSON.parse(bytes: &prefix)
                Issue.record("parsed the first \(end) bytes")
            } catch {
                #expect(error.offset <= end, "\(end): \(error)")
            }
        }
    }
}
