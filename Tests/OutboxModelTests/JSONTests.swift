import OutboxModel
import Testing

struct JSONTests {
    static let strings: [String] = [
        "", "plain", "quote \" inside", "back\\slash", "line\nbreak\r\n", "tab\there", "\u{08}\u{0C}",
        "\u{01}\u{1F}\u{00}", "é ü 日本 🚀", "mixed \"\\\n\u{02}é", String(repeating: "x\"", count: 500),
    ]

    /// The byte writer used by `list --json` escapes exactly as the String writer does, and
    /// what it writes parses back to the same text.
    @Test(arguments: strings)
    func byteWriterMatchesTheStringWriter(_ text: String) throws {
        var expected = ""
        JSON.writeString(text, to: &expected)
        var bytes: [UInt8] = []
        var copy = text
        copy.withUTF8 { JSON.appendString(utf8: $0, to: &bytes) }
        let written = String(decoding: bytes, as: UTF8.self)
        #expect(written == expected)
        #expect(try JSON.parse(written).stringValue == text)
    }
}
