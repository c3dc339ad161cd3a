import Glibc
import Testing
import YAML

struct PerformanceTests {
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

    /// CPU time of this thread, so other processes on a busy machine do not count.
    static func threadCPUTime() -> Duration {
        var now = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now)
        return .seconds(now.tv_sec) + .nanoseconds(now.tv_nsec)
    }

    @Test func oneMegabyteParsesFast() throws {
        let text = Self.bigDocument()
        var trees: [YAMLNode?] = []  // kept, so freeing one tree is not timed with the next parse
        // Best of three, so a busy machine does not fail the test by accident.
        var best = Duration.seconds(1_000)
        for _ in 0..<3 {
            let start = Self.threadCPUTime()
            trees.append(try YAMLParser.parse(text))
            best = min(best, Self.threadCPUTime() - start)
        }
        let entries = try #require(trees.last ?? nil).value("entries").items()
        #expect(entries.count == 2_910)
        #expect(try entries.last?.value("request").value("data").value("ratio").scalar == .float("2909.5"))
        #expect(try entries.last?.value("accept").items().count == 3)
        #expect(best < .milliseconds(100), "1 MB took \(best) of CPU time")
    }
}
