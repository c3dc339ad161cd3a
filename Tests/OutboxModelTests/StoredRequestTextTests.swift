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
        let parsed = try StoredRequest(json: JSON.parse(first))
        let shared = try Self.cut(second).request(sharing: parsed)
        #expect(shared.json == (try StoredRequest(json: JSON.parse(second))).json)
        #expect(shared.url == "https://other/\"quoted\"/é")
        #expect(shared.file?.path == "/q \\ \"r\"")
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
        let parsed = try StoredRequest(json: JSON.parse(Self.text()))
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
