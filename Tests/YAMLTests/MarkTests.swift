import Testing
import YAML

struct MarkTests {
    static let document = """
        name: demo
        request:
          method: POST
          headers:
            X-A: "1"
          items:
            - one
            - k: v
              k2: [a, b]
        """

    @Test func nestedMappingsAndSequences() throws {
        let root = try load(Self.document)
        #expect(root.mark == at(1, 1))
        #expect(try root.keyNode("name").mark == at(1, 1))
        #expect(try root.value("name").mark == at(1, 7))
        #expect(try root.keyNode("request").mark == at(2, 1))
        let request = try root.value("request")
        #expect(request.mark == at(3, 3))
        #expect(try request.keyNode("method").mark == at(3, 3))
        #expect(try request.value("method").mark == at(3, 11))
        let headers = try request.value("headers")
        #expect(headers.mark == at(5, 5))
        #expect(try headers.value("X-A").mark == at(5, 10))
        let items = try request.value("items")
        #expect(items.mark == at(7, 5))
        let list = try items.items()
        #expect(list.map(\.mark) == [at(7, 7), at(8, 7)])
        #expect(try list[1].keyNode("k").mark == at(8, 7))
        #expect(try list[1].value("k").mark == at(8, 10))
        #expect(try list[1].keyNode("k2").mark == at(9, 7))
        let flow = try list[1].value("k2")
        #expect(flow.mark == at(9, 11))
        #expect(try flow.items().map(\.mark) == [at(9, 12), at(9, 15)])
    }

    @Test func topLevelSequence() throws {
        let root = try load("- a\n- b\n-\n  - c")
        let items = try root.items()
        #expect(items.map(\.mark) == [at(1, 3), at(2, 3), at(4, 3)])
        #expect(try items[2].items().map(\.mark) == [at(4, 5)])
    }

    @Test func columnsCountCharactersNotBytes() throws {
        let root = try load("ünï: 🌍x\nb: 1")
        #expect(try root.value("ünï").mark == at(1, 6))
        #expect(try root.value("ünï").text == "🌍x")
        #expect(try root.keyNode("b").mark == at(2, 1))
    }

    @Test func crlfLineBreaks() throws {
        let root = try load("a: 1\r\nb:\r\n  c: 2\r\n")
        #expect(try root.keyNode("b").mark == at(2, 1))
        #expect(try root.value("b").value("c").mark == at(3, 6))
    }

    @Test func byteOrderMarkIsNotAColumn() throws {
        let root = try load("\u{FEFF}a: 1")
        #expect(try root.keyNode("a").mark == at(1, 1))
        #expect(try root.value("a").mark == at(1, 4))
    }

    @Test func blockScalarMarkIsItsIndicator() throws {
        let root = try load("a:\n  b: |\n    text\n")
        #expect(try root.value("a").value("b").mark == at(2, 6))
    }
}
