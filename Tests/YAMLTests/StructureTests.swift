import Testing
import YAML

struct DuplicateKeyTests {
    struct Case: CustomTestStringConvertible, Sendable {
        var name: String
        var source: String
        var error: YAMLError
        var testDescription: String { name }
    }

    @Test(arguments: [
        Case(
            name: "top level", source: "a: 1\nb: 2\na: 3",
            error: YAMLError(mark: at(3, 1), message: #"duplicate key "a" (first at line 1)"#)),
        Case(
            name: "nested", source: "x:\n  y: 0\n  name: 1\n  name: 2",
            error: YAMLError(mark: at(4, 3), message: #"duplicate key "name" (first at line 3)"#)),
        Case(
            name: "flow", source: "{a: 1, a: 2}",
            error: YAMLError(mark: at(1, 8), message: #"duplicate key "a" (first at line 1)"#)),
        Case(
            name: "quoted and plain spellings", source: "a: 1\n'a': 2",
            error: YAMLError(mark: at(2, 1), message: #"duplicate key "a" (first at line 1)"#)),
        Case(
            name: "in a sequence item", source: "- k: 1\n  k: 2",
            error: YAMLError(mark: at(2, 3), message: #"duplicate key "k" (first at line 1)"#)),
        Case(
            name: "through an alias", source: "&k a: 1\n*k : 2",
            error: YAMLError(mark: at(2, 1), message: #"duplicate key "a" (first at line 1)"#)),
        Case(
            name: "two empty keys", source: "\"\": 1\n'': 2",
            error: YAMLError(mark: at(2, 1), message: #"duplicate key "" (first at line 1)"#)),
    ])
    func rejected(_ c: Case) {
        #expect(loadError(c.source) == c.error)
    }

    @Test func sameKeyInSiblingMappingsIsFine() throws {
        let root = try load("- a: 1\n- a: 2")
        #expect(try root.items().map { try $0.value("a").text } == ["1", "2"])
    }

    @Test func keyOrderIsKept() throws {
        let root = try load("z: 1\na: 2\nm: 3")
        #expect(try root.keys() == ["z", "a", "m"])
    }

    @Test func nonScalarKeysAreRejected() {
        #expect(loadError("? [a]\n: 1") == YAMLError(mark: at(1, 3), message: "mapping keys must be scalars"))
        #expect(loadError("? {a: 1}\n: 1") == YAMLError(mark: at(1, 3), message: "mapping keys must be scalars"))
    }
}

struct AnchorTests {
    @Test func aliasCopiesMappingWithAliasMarkOnTop() throws {
        let root = try load("base: &b\n  x: 1\n  y: [1, 2]\nother: *b")
        let other = try root.value("other")
        #expect(other.mark == at(4, 8))
        #expect(try other.keys() == ["x", "y"])
        #expect(try other.value("x").scalar == .int("1"))
        // Nodes inside the copy keep the marks of where they were written.
        #expect(try other.keyNode("x").mark == at(2, 3))
        #expect(try other.value("y").items().map(\.text) == ["1", "2"])
    }

    @Test func scalarAlias() throws {
        let root = try load("a: &v hello\nb: *v\nc: [*v, *v]")
        #expect(try root.value("b").text == "hello")
        #expect(try root.value("b").mark == at(2, 4))
        #expect(try root.value("c").items().map(\.text) == ["hello", "hello"])
    }

    @Test func laterAnchorWins() throws {
        let root = try load("a: &x 1\nb: &x 2\nc: *x")
        #expect(try root.value("c").scalar == .int("2"))
    }

    @Test func aliasKeepsTag() throws {
        let root = try load("a: &x !!str 1\nb: *x")
        #expect(try root.value("b").scalar == .string("1"))
    }

    @Test func unknownAlias() {
        #expect(loadError("a: 1\nb: *nope") == YAMLError(mark: at(2, 4), message: "unknown alias *nope"))
    }

    @Test func aliasUsedBeforeItsAnchor() {
        #expect(loadError("a: *x\nb: &x 1") == YAMLError(mark: at(1, 4), message: "unknown alias *x"))
    }

    @Test func recursiveAlias() {
        #expect(loadError("a: &r [1, *r]") == YAMLError(mark: at(1, 11), message: "alias *r refers to a node that contains it"))
    }

    /// The classic billion laughs: nine levels of nine aliases, about 10^9 nodes.
    @Test func billionLaughsIsRefused() {
        var lines = [#"a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]"#]
        let names = Array("abcdefghi")
        for level in 1..<names.count {
            let refs = Array(repeating: "*\(names[level - 1])", count: 9).joined(separator: ", ")
            lines.append("\(names[level]): &\(names[level]) [\(refs)]")
        }
        let error = loadError(lines.joined(separator: "\n"))
        // a: 10 nodes; b adds 9×10; c adds 9×91; d adds 9×820 (8289 so far); the first *d
        // in e adds 7381 more, crossing 10000 at line 5, column 8.
        #expect(error == YAMLError(mark: at(5, 8), message: "alias expansion exceeds 10000 nodes (alias bomb?)"))
    }

    @Test func manySmallAliasesUnderTheCapAreFine() throws {
        let refs = Array(repeating: "*s", count: 9_999).joined(separator: ", ")
        let root = try load("a: &s x\nb: [\(refs)]")
        #expect(try root.value("b").items().count == 9_999)
    }

    @Test func capCountsTheTextOfAliasesToo() {
        // Few nodes, one big scalar: a thousand copies of 1 MB would be a gigabyte.
        let big = String(repeating: "x", count: 1_000_000)
        let source = "a: &a \"\(big)\"\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b]\n"
        let error = loadError(source)
        #expect(error?.message == "alias expansion exceeds 16 MiB of text (alias bomb?)")
        #expect(error?.mark.line == 3)
    }

    @Test func capCountsNodesNotAliases() {
        let refs = Array(repeating: "*s", count: 10_001).joined(separator: ", ")
        let error = loadError("a: &s x\nb: [\(refs)]")
        #expect(error?.message == "alias expansion exceeds 10000 nodes (alias bomb?)")
        #expect(error?.mark == at(2, 5 + 10_000 * 4))
    }
}

struct MergeKeyTests {
    @Test func mergeKeyIsRejected() {
        let source = "base: &b {x: 1}\nother:\n  <<: *b\n  y: 2"
        #expect(loadError(source) == YAMLError(mark: at(3, 3), message: "merge keys (<<) are not supported; repeat the keys"))
    }

    @Test func taggedMergeKeyIsRejected() {
        #expect(loadError("!!merge x: 1")?.message == "merge keys (<<) are not supported; repeat the keys")
    }

    @Test func quotedLessLessIsAnOrdinaryKey() throws {
        let root = try load("'<<': 1")
        #expect(try root.value("<<").scalar == .int("1"))
    }
}

struct TemplateHintTests {
    static let hint = #"quote templates: "{{ ... }}""#

    struct Case: CustomTestStringConvertible, Sendable {
        var name: String
        var source: String
        var mark: Mark
        var testDescription: String { name }
    }

    @Test(arguments: [
        Case(name: "whole value", source: "url: {{ vars.x }}", mark: at(1, 6)),
        Case(name: "nested value", source: "request:\n  data:\n    id: {{vars.id}}\n", mark: at(3, 9)),
        Case(name: "value then text", source: "url: {{ vars.x }}/path", mark: at(1, 6)),
        Case(name: "in a flow sequence", source: "a: [ {{x}} ]", mark: at(1, 6)),
        Case(name: "sequence item", source: "- {{ vars.a }}", mark: at(1, 3)),
        Case(name: "libyaml error on a template line", source: "x: y: {{ z }}", mark: at(1, 5)),
        Case(name: "after multi-byte characters", source: "ünï: é\nü: {{ x }}", mark: at(2, 4)),
    ])
    func hinted(_ c: Case) throws {
        let error = try #require(loadError(c.source))
        #expect(error.mark == c.mark)
        #expect(error.message.contains(Self.hint))
    }

    @Test func exactTemplateMessage() {
        #expect(
            loadError("url: {{ vars.x }}")
                == YAMLError(
                    mark: at(1, 6),
                    message: #"a value starting with {{ is read as a YAML flow mapping, not a template; quote templates: "{{ ... }}""#))
    }

    @Test func quotedAndInlineTemplatesAreStrings() throws {
        let root = try load("a: \"{{ vars.x }}\"\nb: https://x/{{ vars.y }}\nc: { d: {e: 1} }")
        #expect(try root.value("a").scalar == .string("{{ vars.x }}"))
        #expect(try root.value("b").scalar == .string("https://x/{{ vars.y }}"))
        #expect(try root.value("c").value("d").value("e").scalar == .int("1"))
    }

    @Test func spacedNestedFlowMappingKeyIsNotATemplate() {
        #expect(loadError("d: { {e: 1}: 2 }") == YAMLError(mark: at(1, 6), message: "mapping keys must be scalars"))
    }

    @Test func noHintOnUnrelatedErrors() throws {
        let error = try #require(loadError("a: [1, 2"))
        #expect(!error.message.contains("quote templates"))
    }
}

struct MalformedTests {
    struct Case: CustomTestStringConvertible, Sendable {
        var name: String
        var source: String
        var error: YAMLError
        var testDescription: String { name }
    }

    @Test(arguments: [
        Case(
            name: "unclosed flow sequence", source: "a: [1, 2",
            error: YAMLError(
                mark: at(1, 9), message: "did not find expected ',' or ']' (while parsing a flow sequence at line 1, column 4)")),
        Case(
            name: "unclosed flow sequence, final newline", source: "a: [1, 2\n",
            error: YAMLError(
                mark: at(2, 1), message: "did not find expected ',' or ']' (while parsing a flow sequence at line 1, column 4)")),
        Case(
            name: "bad indentation", source: "a:\n  b: 1\n c: 2",
            error: YAMLError(mark: at(3, 2), message: "did not find expected key (while parsing a block mapping at line 1, column 1)")),
        Case(
            name: "tab indentation", source: "a:\n\tb: 1",
            error: YAMLError(
                mark: at(2, 1),
                message: "found character that cannot start any token (while scanning for the next token at line 2, column 1)")),
        Case(
            name: "sequence then mapping", source: "- a\nb: 1",
            error: YAMLError(
                mark: at(2, 1), message: "did not find expected '-' indicator (while parsing a block collection at line 1, column 1)")),
        Case(
            name: "unterminated quote", source: "a: 'x\nb: 1",
            error: YAMLError(mark: at(2, 5), message: "found unexpected end of stream (while scanning a quoted scalar at line 1, column 4)")
        ),
        Case(
            name: "control character", source: "a: 1\nb: \u{01}",
            error: YAMLError(mark: at(2, 4), message: "control characters are not allowed (U+0001)")),
    ])
    func rejected(_ c: Case) {
        #expect(loadError(c.source) == c.error)
    }

    @Test func descriptionIsCompilerStyle() {
        #expect(YAMLError(mark: at(3, 7), message: "boom").description == "3:7: boom")
    }

    @Test func aliasCannotNestPastTheDepthCap() {
        let source = "a: &a [[[1]]]\nb: " + String(repeating: "[", count: 998) + "*a" + String(repeating: "]", count: 998)
        #expect(loadError(source) == YAMLError(mark: at(2, 4 + 998), message: "nesting deeper than 1000 levels"))
        let ok = "a: &a [[[1]]]\nb: " + String(repeating: "[", count: 996) + "*a" + String(repeating: "]", count: 996)
        #expect(loadError(ok) == nil)
    }

    @Test func tooDeep() {
        let source = String(repeating: "[", count: 1_001) + String(repeating: "]", count: 1_001)
        #expect(loadError(source) == YAMLError(mark: at(1, 1_001), message: "nesting deeper than 1000 levels"))
        let ok = String(repeating: "[", count: 1_000) + String(repeating: "]", count: 1_000)
        #expect(loadError(ok) == nil)
    }
}

struct DocumentTests {
    @Test(arguments: ["", "# only a comment\n", "\n\n   \n", "---\n", "--- # empty\n...\n"])
    func emptyIsNil(_ source: String) throws {
        #expect(try YAMLParser.parse(source) == nil)
    }

    @Test func explicitNullDocumentIsANode() throws {
        #expect(try load("~").scalar == .null)
        #expect(try load("--- ''").scalar == .string(""))
    }

    @Test func scalarDocument() throws {
        let root = try load("--- 42\n...\n")
        #expect(root.scalar == .int("42"))
        #expect(root.mark == at(1, 5))
    }

    @Test func secondDocumentIsAnError() {
        let message = "a second YAML document starts here; a file holds exactly one document"
        #expect(loadError("a: 1\n---\nb: 2") == YAMLError(mark: at(2, 1), message: message))
        #expect(loadError("--- a\n--- b") == YAMLError(mark: at(2, 1), message: message))
        #expect(loadError("a: 1\n...\n---\n") == YAMLError(mark: at(3, 1), message: message))
    }

    @Test func documentEndMarkerAloneIsFine() throws {
        #expect(try load("a: 1\n...\n").keys() == ["a"])
    }

    @Test func unicodeStrings() throws {
        let root = try load("名前: 値\nemoji: \"🎉 party\"\n\"ключ\": 'зна''чение'\ncombining: e\u{301}")
        #expect(try root.keys() == ["名前", "emoji", "ключ", "combining"])
        #expect(try root.value("名前").scalar == .string("値"))
        #expect(try root.value("emoji").scalar == .string("🎉 party"))
        #expect(try root.value("ключ").scalar == .string("зна'чение"))
        #expect(try root.value("combining").text == "e\u{301}")
    }
}
