import Testing
import YAML

struct LargeDocumentTests {
    /// About 1 MB of definition-like YAML: nested mappings, sequences, flow and quoted scalars.
    static func bigDocument() -> String {
        var out = "entries:\n"
        var i = 0
        while out.utf8.count < 1_000_000 {
            out += """
                  - key: note.comment.add.\(i)
                    request:
                      method: POST
                      url: "https://api.example.com/sites/{{ vars.site_id }}/notes/\(i)"
                      headers: { X-Client: field-app, X-Seq: \(i) }
                      data:
                        comment: 'text with ünïcode \(i)'
                        ratio: \(i).5
                        enabled: true
                        tags: [a, b, c, \(i)]
                    accept: [200, 201, 204]

                """
            i += 1
        }
        return out
    }

    /// A large document parses completely; its speed is measured in bench/, not asserted here.
    @Test func oneMegabyteParses() throws {
        let text = Self.bigDocument()
        let entries = try #require(try YAMLParser.parse(text)).value("entries").items()
        #expect(entries.count == 2_910)
        #expect(try entries.last?.value("request").value("data").value("ratio").scalar == .float("2909.5"))
        #expect(try entries.last?.value("accept").items().count == 3)
    }
}
