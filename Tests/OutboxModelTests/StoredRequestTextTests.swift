import Foundation
import OutboxModel
import Testing

/// Requests of one shape are parsed once: each text still reads back as its own full parse.
struct StoredRequestTextTests {
    static func text(url: String = "https://h/x", path: String = "/p", header: String = "1") -> String {
        var json = StoredRequestTests.whole
        json.set("url", .string(url))
        json.set("headers", .array([.array([.string("A"), .string(header)])]))
        json.set("file", .object([("path", .string(path)), ("size", .int64(5)), ("mtime_ns", .int64(7)), ("inode", .number("9"))]))
        return json.serialized()
    }

    static func cut(_ text: String) throws -> StoredRequestText {
        try #require(StoredRequestText(text))
    }

    @Test func textsThatDifferInURLAndFileShareAShapeAndReadBackTheirOwn() throws {
        let first = Self.text()
        let second = Self.text(url: "https://other/\"quoted\"/é", path: "/q \\ \"r\"")
        #expect(try Self.cut(first).shape == Self.cut(second).shape)
        let parsed = try Self.cut(first).parsed(StoredRequest(json: JSON.parse(first)))
        let shared = try Self.cut(second).request(sharing: parsed)
        #expect(shared.text == (try StoredRequest(json: JSON.parse(second))).text)
        #expect(shared.url == "https://other/\"quoted\"/é")
        #expect(shared.file?.path == "/q \\ \"r\"")
    }

    /// The member scan matches a name as written: raw bytes with escapes read as another name
    /// (`"\\\\"` is one backslash), so such a member is never taken for the one asked for.
    @Test func theMemberScanMatchesNamesAsWrittenOnly() throws {
        func ranges(_ text: String, _ names: [String]) -> [String?]? {
            let bytes = Array(text.utf8)
            return bytes.withUnsafeBufferPointer { buffer in
                JSON.memberValueRanges(in: buffer, named: names).map { found in
                    found.map { $0.map { String(decoding: bytes[$0], as: UTF8.self) } }
                }
            }
        }
        // Found by fuzzing: the key written `\\\\` (two backslashes) was taken for the name it spells.
        #expect(ranges(#"{"\\":2, "\\\\": 0}"#, ["\\", "\\\\"]).map { $0 } == [nil, nil])
        #expect(ranges(#"{"url": "u", "u\u0072l": 1}"#, ["url"]).map { $0 } == ["\"u\""])
        #expect(ranges(#"{"file": {"a": 1}, "url": "x"}"#, ["url", "file"]).map { $0 } == ["\"x\"", #"{"a": 1}"#])
    }

    @Test func onlyAValueWhoseBytesDifferIsReadAgain() throws {
        let first = Self.text()
        let parsed = try Self.cut(first).parsed(StoredRequest(json: JSON.parse(first)))
        #expect(try Self.cut(first).request(sharing: parsed).text == (try StoredRequest(json: JSON.parse(first))).text)
        let otherFile = try Self.cut(Self.text(path: "/other")).request(sharing: parsed)
        #expect(otherFile.file?.path == "/other" && otherFile.url == "https://h/x")
        // Equal as Swift strings (é composed and decomposed), not as the bytes that are sent.
        let composed = Self.text(url: "https://h/caf\u{E9}")
        let sharedByComposed = try Self.cut(composed).parsed(StoredRequest(json: JSON.parse(composed)))
        let decomposed = try Self.cut(Self.text(url: "https://h/cafe\u{301}")).request(sharing: sharedByComposed)
        #expect(Array((decomposed.url ?? "").utf8) == Array("https://h/cafe\u{301}".utf8))
    }

    /// The cache gives each text its own request, parsing a shape once.
    @Test func theCacheParsesEachShapeOnce() throws {
        var cache = StoredRequestCache()
        var parses = 0
        func read(_ text: String) throws -> StoredRequest {
            try cache.request(text) { (text) throws(OutboxError) in
                parses += 1
                do { return try StoredRequest(json: JSON.parse(text)) } catch { throw .storage("\(error)") }
            }
        }
        let texts = [
            Self.text(), Self.text(), Self.text(path: "/q"), Self.text(url: "https://h/caf\u{E9}"),
            Self.text(url: "https://h/cafe\u{301}"), Self.text(), Self.text(header: "2"),
        ]
        for text in texts {
            #expect(try read(text).text == (try StoredRequest(json: JSON.parse(text))).text, "\(text)")
        }
        #expect(parses == 2, "one parse per shape")
    }

    /// A text cut like the one before it (the bytes around the values compared) is cut as a
    /// fresh cut would cut it; any other difference is left to a fresh cut.
    @Test func aTextIsCutLikeTheOneBeforeItWhenOnlyTheValuesDiffer() throws {
        let previous = try Self.cut(Self.text())
        for text in [
            Self.text(path: "/q \\ \"r\""), Self.text(url: "https://other/é"), Self.text(url: "https://x", path: "/y"), Self.text(),
        ] {
            let like = try #require(StoredRequestText(text, like: previous), "\(text)")
            let fresh = try Self.cut(text)
            #expect(like.shape == fresh.shape)
            let parsed = previous.parsed(try StoredRequest(json: JSON.parse(Self.text())))
            #expect(try like.request(sharing: parsed).text == (try StoredRequest(json: JSON.parse(text))).text)
        }
        let unlike = [
            Self.text(header: "2"), Self.text() + " ", " " + Self.text(), String(Self.text().dropLast()),
            Self.text().replacingOccurrences(of: #""url":"https://h/x""#, with: #""url": "https://h/x""#),
            Self.text().replacingOccurrences(of: #""url":"https://h/x""#, with: #""url":"https://h/x"#),
            Self.text().replacingOccurrences(of: #""inode":9}"#, with: #""inode":9,}"#),
        ]
        for text in unlike { #expect(StoredRequestText(text, like: previous) == nil, "\(text)") }
    }

    @Test func anyOtherDifferenceIsAnotherShape() throws {
        #expect(try Self.cut(Self.text()).shape != Self.cut(Self.text(header: "2")).shape)
        // A header value that looks like a url member is still part of the shape.
        #expect(try Self.cut(Self.text()).shape != Self.cut(Self.text(header: "\",\"url\":\"")).shape)
        var noFile = StoredRequestTests.without("file")
        noFile.set("url", .string("https://h/x"))
        #expect(try Self.cut(noFile.serialized()).shape != Self.cut(Self.text()).shape)
    }

    @Test func aDamagedURLOrFileIsAStorageError() throws {
        let parsed = try Self.cut(Self.text()).parsed(StoredRequest(json: JSON.parse(Self.text())))
        let badURL = Self.text().replacingOccurrences(of: "\"url\":\"https://h/x\"", with: "\"url\":7")
        #expect(badURL != Self.text())
        #expect(throws: OutboxError(.storage, "the stored request is damaged: url: not a string")) {
            try Self.cut(badURL).request(sharing: parsed)
        }
        let badFile = Self.text().replacingOccurrences(of: "\"path\":\"/p\",", with: "")
        #expect(throws: OutboxError(.storage, "the stored request is damaged: file: the file identity is incomplete")) {
            try Self.cut(badFile).request(sharing: parsed)
        }
    }

    /// The identity as the store writes it is read without the JSON reader, to the same values.
    @Test(arguments: [
        (#"{"path":"/p","size":5,"mtime_ns":7,"inode":9}"#, FileIdentity(path: "/p", size: 5, mtimeNs: 7, inode: 9)),
        (
            #"{"path":"/a b/c.bin","size":0,"mtime_ns":-1500000000,"inode":18446744073709551615,"mode":420}"#,
            FileIdentity(path: "/a b/c.bin", size: 0, mtimeNs: -1_500_000_000, inode: .max, mode: 420)
        ),
        (
            #"{"path":"/p","size":9223372036854775807,"mtime_ns":-9223372036854775808,"inode":0,"mode":4294967297}"#,
            FileIdentity(path: "/p", size: .max, mtimeNs: .min, inode: 0, mode: 1)
        ),
    ])
    func theStoredFormOfAFileIdentityIsReadDirectly(_ text: String, _ expected: FileIdentity) throws {
        #expect(FileIdentity(storedText: text) == expected)
        // The same values as the full reader of a whole request.
        let whole = Self.text().replacingOccurrences(of: #""file":{"path":"/p","size":5,"mtime_ns":7,"inode":9}"#, with: #""file":"# + text)
        #expect(try StoredRequest(json: JSON.parse(whole)).file == expected)
    }

    /// Any other form of a valid identity is left to the full reader, which reads it as before.
    @Test(arguments: [
        #"{"path":"/q \\ \"r\"","size":5,"mtime_ns":7,"inode":9}"#, #"{"path":"/é","size":5,"mtime_ns":7,"inode":9}"#,
        #"{"size":5,"path":"/p","mtime_ns":7,"inode":9}"#, #"{"path":"/p", "size":5,"mtime_ns":7,"inode":9}"#,
        #"{"path":"/p","size":5,"mtime_ns":7,"inode":9,"mode":null}"#, #"{"path":"/p","size":-0,"mtime_ns":7,"inode":9}"#,
        #"{"path":"/p","size":5,"mtime_ns":7,"inode":9,"extra":1}"#,
    ])
    func otherFormsOfAnIdentityAreReadByTheFullReader(_ text: String) throws {
        let whole = Self.text().replacingOccurrences(of: #""file":{"path":"/p","size":5,"mtime_ns":7,"inode":9}"#, with: #""file":"# + text)
        #expect(whole != Self.text())
        let full = try StoredRequest(json: JSON.parse(whole))
        let direct = FileIdentity(storedText: text)
        #expect(direct == nil || direct == full.file, "only what it reads as the full reader does")
        let parsed = try Self.cut(Self.text()).parsed(StoredRequest(json: JSON.parse(Self.text())))
        #expect(try Self.cut(whole).request(sharing: parsed).file == full.file)
    }

    /// Numbers that are not what the store writes (or do not fit) are not read directly.
    @Test(arguments: [
        #"{"path":"/p","size":05,"mtime_ns":7,"inode":9}"#, #"{"path":"/p","size":5.0,"mtime_ns":7,"inode":9}"#,
        #"{"path":"/p","size":5e3,"mtime_ns":7,"inode":9}"#, #"{"path":"/p","size":9223372036854775808,"mtime_ns":7,"inode":9}"#,
        #"{"path":"/p","size":5,"mtime_ns":7,"inode":-9}"#, #"{"path":"/p","size":5,"mtime_ns":7,"inode":18446744073709551616}"#,
        #"{"path":"/p","size":5,"mtime_ns":7,"inode":9} "#, #"{"path":"/p","size":5,"mtime_ns":7,"inode":9"#, "",
    ])
    func numbersTheStoreDoesNotWriteAreNotReadDirectly(_ text: String) {
        #expect(FileIdentity(storedText: text) == nil)
    }

    @Test(arguments: [0, 1, -1, 9, 10, -10, 1_234_567_890, Int64.max, Int64.min])
    func decimalsAreSpelledAsStringSpellsThem(_ value: Int64) {
        var out: [UInt8] = []
        JSONObjectText.appendDecimal(value, to: &out)
        #expect(String(decoding: out, as: UTF8.self) == String(value))
        out = []
        JSONObjectText.appendDecimal(value.magnitude, to: &out)
        #expect(String(decoding: out, as: UTF8.self) == String(value.magnitude))
    }

    @Test(arguments: ["[]", "{\"url\":\"a\"} x", "{\"url\":\"a\",\"url\":\"b\"}", "{\"url\":\"a", "{\"a\":[1,}", "{\"a\":\"\u{1}\"}", ""])
    func textsTheScanCannotWalkAreLeftToTheFullParse(_ text: String) {
        #expect(StoredRequestText(text) == nil)
    }
}
