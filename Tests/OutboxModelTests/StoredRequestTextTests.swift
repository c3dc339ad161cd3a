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
        #expect(shared.json == (try StoredRequest(json: JSON.parse(second))).json)
        #expect(shared.url == "https://other/\"quoted\"/é")
        #expect(shared.file?.path == "/q \\ \"r\"")
    }

    @Test func onlyAValueWhoseBytesDifferIsReadAgain() throws {
        let first = Self.text()
        let parsed = try Self.cut(first).parsed(StoredRequest(json: JSON.parse(first)))
        #expect(try Self.cut(first).request(sharing: parsed).json == (try StoredRequest(json: JSON.parse(first))).json)
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
            #expect(try read(text).json == (try StoredRequest(json: JSON.parse(text))).json, "\(text)")
        }
        #expect(parses == 2, "one parse per shape")
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

    @Test(arguments: ["[]", "{\"url\":\"a\"} x", "{\"url\":\"a\",\"url\":\"b\"}", "{\"url\":\"a", "{\"a\":[1,}", "{\"a\":\"\u{1}\"}", ""])
    func textsTheScanCannotWalkAreLeftToTheFullParse(_ text: String) {
        #expect(StoredRequestText(text) == nil)
    }
}
