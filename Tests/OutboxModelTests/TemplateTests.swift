import Testing
@testable import OutboxModel

private func json(_ text: String) -> JSON {
    do { return try JSON.parse(text) } catch { fatalError("bad fixture JSON: \(error)") }
}

private let fixtureVars = json(
    #"""
    {
      "site_id": 42, "big": 12345678901234567890, "pi": 3.14, "flag": true, "nothing": null,
      "note_id": "n 1", "comment": "hi {{ vars.site_id }}", "slash": "a/b", "pct": "%2F",
      "dot": ".", "dotdot": "..", "dotted": "x/..y/.z", "climb": "a/../b", "climbingurl": "https://h.example/a/b/../../x", "climbingurl2": "https://h.example/a/x%2F..%2F..%2Fy", "backclimb": "x\\..", "uni": "é", "space": "a b", "quote": "say \"hi\"",
      "obj": {"a": 1, "b": [true, null]},
      "parts": [{"url": "https://u.example/1", "range": {"start": 0, "end": 5}}],
      "items": [{"id": "i0"}, {"id": "i1"}], "empty": [], "grid": [["x", "y"], ["z"]],
      "host": "evil.example", "base": "https://api.example.com",
      "full": "https://s3.example.com/b/k?X-Amz-Signature=abc%2Fdef",
      "fileurl": "file:///etc/passwd", "spaced": "https://h.example/a b",
      "xml": "<a & 'b'>\"", "crlf": "a\r\nX-Evil: 1", "lf": "a\nb", "nul": "a\u0000b", "ctl": "a\u0001b"
    }
    """#)

private let context = TemplateContext(roots: [
    "vars": fixtureVars,
    "entry": json(#"{"id": "e-1"}"#),
    "env": json(#"{"API_TOKEN": "tok"}"#),
    "file": json(#"{"size": 1000, "name": "a b.txt"}"#),
    "part": json(#"{"index": 0, "number": 1, "start": 0, "end": 100, "last": 99}"#),
])

struct TemplateRenderTests {
    struct RenderCase: Sendable, CustomTestStringConvertible {
        let name: String
        let template: String
        let mode: TemplateMode
        let expected: JSON
        var testDescription: String { name }

        init(_ name: String, _ template: String, _ mode: TemplateMode, _ expected: JSON) {
            self.name = name
            self.template = template
            self.mode = mode
            self.expected = expected
        }
    }

    struct FailCase: Sendable, CustomTestStringConvertible {
        let name: String
        let template: String
        let mode: TemplateMode
        let message: String
        var testDescription: String { name }

        init(_ name: String, _ template: String, _ mode: TemplateMode, _ message: String) {
            self.name = name
            self.template = template
            self.mode = mode
            self.message = message
        }
    }

    static let typing: [RenderCase] = [
        RenderCase("number stays number", "{{ vars.site_id }}", .value, .number("42")),
        RenderCase("no spaces inside braces", "{{vars.site_id}}", .value, .number("42")),
        RenderCase("big number keeps its text", "{{ vars.big }}", .value, .number("12345678901234567890")),
        RenderCase("decimal keeps its text", "{{ vars.pi }}", .value, .number("3.14")),
        RenderCase("bool stays bool", "{{ vars.flag }}", .value, .bool(true)),
        RenderCase("null stays null", "{{ vars.nothing }}", .value, .null),
        RenderCase("object stays object", "{{ vars.obj }}", .value, json(#"{"a": 1, "b": [true, null]}"#)),
        RenderCase(
            "list for parts", "{{ vars.parts }}", .value, json(#"[{"url": "https://u.example/1", "range": {"start": 0, "end": 5}}]"#)),
        RenderCase("raw keeps the type", "{{ vars.site_id | raw }}", .value, .number("42")),
        RenderCase("default unused keeps the type", "{{ vars.site_id | default(\"0\") }}", .value, .number("42")),
        RenderCase("json filter gives text", "{{ vars.obj | json }}", .value, .string(#"{"a":1,"b":[true,null]}"#)),
        RenderCase("surrounding space is not whole", " {{ vars.site_id }}", .value, .string(" 42")),
        RenderCase("number in a longer string", "site-{{ vars.site_id }}", .value, .string("site-42")),
        RenderCase("bool in a longer string", "x{{ vars.flag }}", .value, .string("xtrue")),
        RenderCase("array index", "{{ vars.items.1.id }}", .value, .string("i1")),
        RenderCase("index into nested list", "{{ vars.grid.0.1 }}{{ vars.grid.1.0 }}", .value, .string("yz")),
        RenderCase("entry root", "complete-{{ entry.id }}", .value, .string("complete-e-1")),
        RenderCase("whole root", "{{ entry }}", .value, json(#"{"id": "e-1"}"#)),
        RenderCase("var holding braces stays literal", "c: {{ vars.comment }}", .value, .string("c: hi {{ vars.site_id }}")),
        RenderCase("whole var holding braces stays literal", "{{ vars.comment }}", .value, .string("hi {{ vars.site_id }}")),
        RenderCase("no tags", "plain", .value, .string("plain")),
        RenderCase("empty template", "", .value, .string("")),
        RenderCase("lone closing braces are literal", "a }} b {x}", .value, .string("a }} b {x}")),
        RenderCase("whole number in header is text", "{{ vars.site_id }}", .header, .string("42")),
        RenderCase("whole bool in header is text", "{{ vars.flag }}", .header, .string("true")),
        RenderCase("whole number in text is text", "{{ vars.site_id }}", .text, .string("42")),
    ]

    @Test(arguments: typing)
    func wholeValueTyping(_ c: RenderCase) throws {
        #expect(try Template.render(c.template, context: context, mode: c.mode, field: "f") == c.expected)
    }

    static let filters: [RenderCase] = [
        RenderCase("default when missing", "{{ vars.missing | default(\"x\") }}", .value, .string("x")),
        RenderCase("default when null", "{{ vars.nothing | default(\"none\") }}", .value, .string("none")),
        RenderCase("default in a longer string", "id-{{ vars.nothing | default(\"0\") }}", .value, .string("id-0")),
        RenderCase(
            "default with escapes, pipe and braces", #"{{ vars.missing | default("a \"b\" \\ | }}") }}"#, .value, .string(#"a "b" \ | }}"#)),
        RenderCase("default then json", "{{ vars.missing | default(\"x\") | json }}", .value, .string("\"x\"")),
        RenderCase("json of null is text null", "{{ vars.nothing | json }}", .value, .string("null")),
        RenderCase("json of a string quotes it", "q: {{ vars.quote | json }}", .value, .string(#"q: "say \"hi\"""#)),
        RenderCase("json then xml", "{{ vars.obj | json | xml }}", .value, .string("{&quot;a&quot;:1,&quot;b&quot;:[true,null]}")),
        RenderCase("xml escapes all five", "<v>{{ vars.xml | xml }}</v>", .text, .string("<v>&lt;a &amp; &apos;b&apos;&gt;&quot;</v>")),
        RenderCase("xml then json", "{{ vars.xml | xml | json }}", .value, .string(#""&lt;a &amp; &apos;b&apos;&gt;&quot;""#)),
        RenderCase("xml of a number", "{{ vars.site_id | xml }}", .value, .string("42")),
        RenderCase("raw is a no-op outside urls", "a{{ vars.slash | raw }}", .value, .string("aa/b")),
        // In a header (WebDAV's Destination names a URL) `path` encodes the value itself.
        RenderCase(
            "path encodes in a header", "http://h/{{ vars.dotted | path }}/{{ vars.space | path }}", .header,
            .string("http://h/x/..y/.z/a%20b")),
        RenderCase("path encodes a percent in a header", "a/{{ vars.pct | path }}", .header, .string("a/%252F")),
        RenderCase("path of a whole header value", "{{ vars.uni | path }}", .header, .string("%C3%A9")),
        RenderCase("default then path", "{{ vars.missing | default(\"x y\") | path }}", .header, .string("x%20y")),
        // Elsewhere (an s3 key, encoded when its request is made) it changes nothing.
        RenderCase("path is a no-op in values", "a{{ vars.slash | path }} {{ vars.space | path }}", .value, .string("aa/b a b")),
        RenderCase("path is a no-op in text bodies", "{{ vars.pct | path }}", .text, .string("%2F")),
        RenderCase("spaces around filters", "{{  vars.missing|default( \"y\" )  }}", .value, .string("y")),
    ]

    @Test(arguments: filters)
    func filterChains(_ c: RenderCase) throws {
        #expect(try Template.render(c.template, context: context, mode: c.mode, field: "f") == c.expected)
    }

    static let urls: [RenderCase] = [
        RenderCase("space", "https://api.example.com/notes/{{ vars.note_id }}", .url, .string("https://api.example.com/notes/n%201")),
        RenderCase("slash", "https://h.example/{{ vars.slash }}/x", .url, .string("https://h.example/a%2Fb/x")),
        RenderCase("encoded slash is encoded again", "https://h.example/{{ vars.pct }}", .url, .string("https://h.example/%252F")),
        RenderCase(
            "dots in the query", "https://h.example/a?p={{ vars.dotdot }}&q={{ vars.dot }}", .url,
            .string("https://h.example/a?p=%2E%2E&q=%2E")),
        RenderCase("dots in the fragment", "https://h.example/a#{{ vars.dotdot }}", .url, .string("https://h.example/a#%2E%2E")),
        RenderCase(
            "the template's own dot segment", "https://h.example/a/../{{ vars.site_id }}", .url, .string("https://h.example/a/../42")),
        RenderCase("dots beside other bytes", "https://h.example/a/x{{ vars.dotdot }}/b", .url, .string("https://h.example/a/x%2E%2E/b")),
        // The contract: a value that is `.` or `..` becomes `%2E` or `%2E%2E`, a segment of its own.
        RenderCase("a dot segment", "https://h.example/a/{{ vars.dot }}/b", .url, .string("https://h.example/a/%2E/b")),
        RenderCase("a dot dot segment", "https://h.example/a/{{ vars.dotdot }}/b", .url, .string("https://h.example/a/%2E%2E/b")),
        RenderCase("dot dot right after the host", "https://h.example/{{ vars.dotdot }}", .url, .string("https://h.example/%2E%2E")),
        RenderCase(
            "dot dot after a raw base", "{{ vars.base | raw }}/{{ vars.dotdot }}", .url, .string("https://api.example.com/%2E%2E")),
        RenderCase("unicode as UTF-8 bytes", "https://h.example/{{ vars.uni }}", .url, .string("https://h.example/%C3%A9")),
        RenderCase("number", "https://h.example/sites/{{ vars.site_id }}", .url, .string("https://h.example/sites/42")),
        RenderCase(
            "query values", "https://h.example/x?q={{ vars.space }}&r={{ vars.slash }}", .url,
            .string("https://h.example/x?q=a%20b&r=a%2Fb")),
        RenderCase("query right after host", "https://h.example?q={{ vars.space }}", .url, .string("https://h.example?q=a%20b")),
        RenderCase(
            "braces in a var are encoded", "https://h.example/{{ vars.comment }}", .url,
            .string("https://h.example/hi%20%7B%7B%20vars.site_id%20%7D%7D")),
        RenderCase("raw in path", "https://h.example/{{ vars.slash | raw }}", .url, .string("https://h.example/a/b")),
        RenderCase("path keeps slashes", "https://h.example/{{ vars.slash | path }}/x", .url, .string("https://h.example/a/b/x")),
        RenderCase("path encodes inside segments", "https://h.example/{{ vars.space | path }}", .url, .string("https://h.example/a%20b")),
        RenderCase(
            "path keeps dotted names", "https://h.example/a/{{ vars.dotted | path }}", .url, .string("https://h.example/a/x/..y/.z")),
        RenderCase("raw in host", "https://{{ vars.host | raw }}/x", .url, .string("https://evil.example/x")),
        RenderCase(
            "raw base then encoded", "{{ vars.base | raw }}/sites/{{ vars.site_id }}", .url, .string("https://api.example.com/sites/42")),
        RenderCase("whole url used as is", "{{ vars.full }}", .url, .string("https://s3.example.com/b/k?X-Amz-Signature=abc%2Fdef")),
        RenderCase("whole raw url", "{{ vars.full | raw }}", .url, .string("https://s3.example.com/b/k?X-Amz-Signature=abc%2Fdef")),
        RenderCase("upper-case scheme literal", "HTTPS://H.EXAMPLE/{{ vars.site_id }}", .url, .string("HTTPS://H.EXAMPLE/42")),
        RenderCase("part url", "https://u.example/up/parts/{{ part.number }}", .url, .string("https://u.example/up/parts/1")),
    ]

    @Test(arguments: urls)
    func urlEncoding(_ c: RenderCase) throws {
        #expect(try Template.render(c.template, context: context, mode: c.mode, field: "request.url") == c.expected)
    }

    static let headersAndText: [RenderCase] = [
        RenderCase("bearer token", "Bearer {{ env.API_TOKEN }}", .header, .string("Bearer tok")),
        RenderCase("content range", "bytes {{ part.start }}-{{ part.last }}/{{ file.size }}", .header, .string("bytes 0-99/1000")),
        RenderCase("header keeps slashes and spaces", "{{ file.name }}; {{ vars.slash }}", .header, .string("a b.txt; a/b")),
        RenderCase(
            "loop index and number", "{{ for p in vars.items }}{{ loop.index }}:{{ loop.number }}:{{ p.id }};{{ end }}", .text,
            .string("0:1:i0;1:2:i1;")),
        RenderCase(
            "nested loops", "{{ for a in vars.grid }}[{{ for b in a }}{{ loop.index }}{{ b }}{{ end }}]{{ end }}", .text,
            .string("[0x1y][0z]")),
        RenderCase(
            "outer variable inside inner loop", "{{ for a in vars.grid }}{{ for b in a }}{{ a.0 }}{{ end }}|{{ end }}", .text,
            .string("xx|z|")),
        RenderCase(
            "inner loop shadows loop",
            "{{ for a in vars.grid }}{{ loop.number }}({{ for b in a }}{{ loop.number }}{{ end }}){{ loop.number }} {{ end }}", .text,
            .string("1(12)1 2(1)2 ")),
        RenderCase("empty list", "<l>{{ for p in vars.empty }}x{{ end }}</l>", .text, .string("<l></l>")),
        RenderCase(
            "roots visible inside a loop", "{{ for p in vars.items }}{{ entry.id }}/{{ p.id }} {{ end }}", .text, .string("e-1/i0 e-1/i1 ")),
        RenderCase(
            "braces in a loop item stay literal",
            "{{ for p in vars.parts }}{{ p.url }}{{ end }}{{ for c in vars.grid.1 }}{{ vars.comment }}{{ end }}", .text,
            .string("https://u.example/1hi {{ vars.site_id }}")),
        RenderCase(
            "standalone block lines vanish", "id,n\n{{ for p in vars.items }}\n{{ p.id }},{{ loop.number }}\n{{ end }}\ndone", .text,
            .string("id,n\ni0,1\ni1,2\ndone")),
        RenderCase(
            "indented standalone lines with CRLF", "<ps>\r\n  {{ for p in vars.items }}\r\n  <p>{{ p.id }}</p>\r\n  {{ end }}\r\n</ps>",
            .text, .string("<ps>\r\n  <p>i0</p>\r\n  <p>i1</p>\r\n</ps>")),
        RenderCase("block at template start and end", "{{ for p in vars.items }}\n{{ p.id }}\n{{ end }}", .text, .string("i0\ni1\n")),
        RenderCase("inline blocks keep their spaces", "a {{ for p in vars.items }} {{ p.id }} {{ end }} b", .text, .string("a  i0  i1  b")),
        RenderCase(
            "xml body", "<parts>{{ for p in vars.items }}<p n=\"{{ loop.number }}\">{{ p.id | xml }}</p>{{ end }}</parts>", .text,
            .string("<parts><p n=\"1\">i0</p><p n=\"2\">i1</p></parts>")),
    ]

    @Test(arguments: headersAndText)
    func headersAndTextBodies(_ c: RenderCase) throws {
        #expect(try Template.render(c.template, context: context, mode: c.mode, field: "f") == c.expected)
    }

    static let failures: [FailCase] = [
        FailCase(
            "path of a climbing value in a header", "http://h/{{ vars.climb | path }}", .header,
            #"f: {{ vars.climb }} gives a "." or ".." path segment, which could climb the path it names"#),
        FailCase(
            "path of a backslash climb in a header", "http://h/{{ vars.backclimb | path }}", .header,
            #"f: {{ vars.backclimb }} gives a "." or ".." path segment, which could climb the path it names"#),
        FailCase(
            "path of a dot in a header", "{{ vars.dot | path }}", .header,
            #"f: {{ vars.dot }} gives a "." or ".." path segment, which could climb the path it names"#),
        FailCase(
            "path of a missing value in a header", "{{ vars.nope | path }}", .header,
            #"f: {{ vars.nope }} does not resolve (vars has no "nope")"#),
        FailCase(
            "missing key", "https://h.example/sites/{{ vars.site }}", .url,
            #"f: {{ vars.site }} does not resolve (vars has no "site")"#),
        FailCase(
            "missing nested key", "{{ vars.obj.c }}", .value,
            #"f: {{ vars.obj.c }} does not resolve (vars.obj has no "c")"#),
        FailCase(
            "index out of range", "{{ vars.items.5.id }}", .value,
            "f: {{ vars.items.5.id }} does not resolve (vars.items has 2 items, no index 5)"),
        FailCase(
            "key on a list", "{{ vars.items.id }}", .value,
            #"f: {{ vars.items.id }} does not resolve (vars.items is a list; "id" is not an index)"#),
        FailCase(
            "key on a number", "{{ vars.site_id.x }}", .value,
            #"f: {{ vars.site_id.x }} does not resolve (vars.site_id is a number, it has no "x")"#),
        FailCase(
            "key on null", "{{ vars.nothing.x }}", .value,
            "f: {{ vars.nothing.x }} does not resolve (vars.nothing is null)"),
        FailCase(
            "unknown root", "{{ outcome.parts }}", .value,
            #"f: {{ outcome.parts }} does not resolve (no root "outcome" here; roots: entry, env, file, part, vars)"#),
        FailCase(
            "missing path with json", "{{ vars.missing | json }}", .value,
            #"f: {{ vars.missing }} does not resolve (vars has no "missing")"#),
        FailCase(
            "null inside a longer string", "x{{ vars.nothing }}", .value,
            #"f: {{ vars.nothing }} is null; write {{ vars.nothing | default("...") }} to give a fallback"#),
        FailCase(
            "object inside a longer string", "x{{ vars.obj }}", .value,
            "f: {{ vars.obj }} is an object, which cannot be inserted as text; write {{ vars.obj | json }}"),
        FailCase(
            "list in a header", "{{ vars.items }}", .header,
            "f: {{ vars.items }} is a list, which cannot be inserted as text; write {{ vars.items | json }}"),
        FailCase(
            "null in a header", "{{ vars.nothing }}", .header,
            #"f: {{ vars.nothing }} is null; write {{ vars.nothing | default("...") }} to give a fallback"#),
        FailCase(
            "null in a text body", "{{ vars.nothing }}", .text,
            #"f: {{ vars.nothing }} is null; write {{ vars.nothing | default("...") }} to give a fallback"#),
        FailCase(
            "substitution in scheme", "{{ vars.host }}://h.example/", .url,
            "f: {{ vars.host }} is in the URL's scheme or host; write {{ vars.host | raw }} if the value is trusted"),
        FailCase(
            "substitution in host", "https://{{ vars.host }}/x", .url,
            "f: {{ vars.host }} is in the URL's scheme or host; write {{ vars.host | raw }} if the value is trusted"),
        FailCase(
            "path filter in host", "https://{{ vars.host | path }}/x", .url,
            "f: {{ vars.host }} is in the URL's scheme or host; write {{ vars.host | raw }} if the value is trusted"),
        FailCase(
            "substitution in subdomain", "https://{{ vars.note_id }}.h.example/x", .url,
            "f: {{ vars.note_id }} is in the URL's scheme or host; write {{ vars.note_id | raw }} if the value is trusted"),
        FailCase(
            "substitution in port", "https://h.example:{{ vars.site_id }}/x", .url,
            "f: {{ vars.site_id }} is in the URL's scheme or host; write {{ vars.site_id | raw }} if the value is trusted"),
        FailCase(
            "json filter alone in url", "{{ vars.obj | json }}", .url,
            "f: {{ vars.obj }} is in the URL's scheme or host; write {{ vars.obj | raw }} if the value is trusted"),
        FailCase("whole url is a number", "{{ vars.site_id }}", .url, "f: {{ vars.site_id }} is a number; a URL must be a string"),
        FailCase("whole url is null", "{{ vars.nothing }}", .url, "f: {{ vars.nothing }} is null; a URL must be a string"),
        FailCase("whole url with file scheme", "{{ vars.fileurl }}", .url, #"f: scheme "file" is not allowed (http or https only)"#),
        FailCase(
            "raw value with a space", "{{ vars.spaced | raw }}?x=1", .url,
            "f (https://h.example/…): the URL contains a space at character 20"),
        FailCase(
            "relative url", "/notes/{{ vars.site_id }}", .url,
            "f: {{ vars.site_id }} is in the URL's scheme or host; write {{ vars.site_id | raw }} if the value is trusted"),
        FailCase(
            "two dots from a dot and a literal dot", "https://h.example/a/.{{ vars.dot }}/b", .url,
            "f: {{ vars.dot }} gives a \".\" or \"..\" path segment, which could climb the URL's path"),
        FailCase(
            "dot dot inside a path value", "https://h.example/a/{{ vars.climb | path }}", .url,
            "f: {{ vars.climb }} gives a \".\" or \"..\" path segment, which could climb the URL's path"),
        FailCase(
            "dot dot beside an encoded dot of the template", "https://h.example/a/%2e{{ vars.dot }}", .url,
            "f: {{ vars.dot }} gives a \".\" or \"..\" path segment, which could climb the URL's path"),
        FailCase(
            "dot dot behind an encoded slash", "https://h.example/a/{{ vars.climb }}/b", .url,
            "f: {{ vars.climb }} gives a \".\" or \"..\" path segment, which could climb the URL's path"),
        FailCase(
            "dot dot behind an encoded backslash", "https://h.example/a/{{ vars.backclimb }}", .url,
            "f: {{ vars.backclimb }} gives a \".\" or \"..\" path segment, which could climb the URL's path"),
        FailCase(
            "dot dot from a raw value", "https://h.example/a/{{ vars.climb | raw }}", .url,
            "f: {{ vars.climb }} gives a \".\" or \"..\" path segment, which could climb the URL's path"),
        FailCase(
            "dot dot in a whole URL", "{{ vars.climbingurl }}", .url,
            "f: {{ vars.climbingurl }} gives a \".\" or \"..\" path segment, which could climb the URL's path"),
        FailCase(
            "encoded dot dot in a whole raw URL", "{{ vars.climbingurl2 | raw }}", .url,
            "f: {{ vars.climbingurl2 }} gives a \".\" or \"..\" path segment, which could climb the URL's path"),
        FailCase("header CR LF", "x {{ vars.crlf }}", .header, "f: header value contains CR, LF or NUL"),
        FailCase("header LF whole", "{{ vars.lf }}", .header, "f: header value contains CR, LF or NUL"),
        FailCase("header NUL", "{{ vars.nul }}", .header, "f: header value contains CR, LF or NUL"),
        FailCase("header literal LF", "a\nb", .header, "f: header value contains CR, LF or NUL"),
        FailCase("xml control character", "{{ vars.ctl | xml }}", .text, "f: {{ vars.ctl | xml }} contains U+0001, which XML cannot carry"),
        FailCase(
            "unknown filter", "{{ vars.site_id | upper }}", .value,
            #"f: unknown filter "upper" in {{ vars.site_id | upper }} (filters: raw, path, json, xml, default("..."))"#),
        FailCase("unclosed braces", "a {{ vars.site_id", .value, #"f: "{{" at character 3 is never closed by "}}""#),
        FailCase("second open before close", "{{ vars.a {{ vars.b }}", .value, #"f: "{{" at character 1 is never closed by "}}""#),
        FailCase(
            "for block outside text", "{{ for p in vars.items }}x{{ end }}", .value,
            "f: {{ for p in vars.items }} blocks are allowed only in a text body"),
        FailCase(
            "for over an object", "{{ for p in vars.obj }}x{{ end }}", .text,
            "f: {{ for p in vars.obj }}: vars.obj is an object, not a list"),
        FailCase(
            "for over null", "{{ for p in vars.nothing }}x{{ end }}", .text,
            "f: {{ for p in vars.nothing }}: vars.nothing is null, not a list"),
        FailCase(
            "for over missing", "{{ for p in vars.nope }}x{{ end }}", .text, #"f: {{ vars.nope }} does not resolve (vars has no "nope")"#),
        FailCase(
            "loop var outside its block", "{{ for p in vars.items }}{{ end }}{{ p.id }}", .text,
            #"f: {{ p.id }} does not resolve (no root "p" here; roots: entry, env, file, part, vars)"#),
        FailCase("end without for", "a {{ end }}", .text, "f: {{ end }} at character 3 has no matching {{ for }}"),
        FailCase(
            "for without end", "x{{ for p in vars.items }}y", .text,
            "f: {{ for p in vars.items }} at character 2 is never closed by {{ end }}"),
    ]

    @Test(arguments: failures)
    func failuresNameTheProblem(_ c: FailCase) {
        #expect(throws: OutboxError.invalid(c.message)) {
            try Template.render(c.template, context: context, mode: c.mode, field: "f")
        }
    }

    @Test func nullVarsFailButDefaultsWork() throws {
        let noVars = TemplateContext(roots: ["vars": .null, "entry": json(#"{"id": "e"}"#)])
        #expect(throws: OutboxError.invalid("request.data: {{ vars.a }} does not resolve (the entry has no vars)")) {
            try Template.render("{{ vars.a }}", context: noVars, mode: .value, field: "request.data")
        }
        #expect(throws: OutboxError.invalid("request.url: {{ vars.a.b }} does not resolve (the entry has no vars)")) {
            try Template.render("https://h.example/{{ vars.a.b }}", context: noVars, mode: .url, field: "request.url")
        }
        #expect(try Template.render("{{ vars }}", context: noVars, mode: .value, field: "f") == .null)
        #expect(try Template.render("{{ vars.a | default(\"d\") }}", context: noVars, mode: .value, field: "f") == .string("d"))
        #expect(try Template.render("{{ entry.id }}", context: noVars, mode: .value, field: "f") == .string("e"))
    }

    @Test func errorsCarryTheInvalidCode() {
        do {
            _ = try Template.render("{{ vars.nope }}", context: context, mode: .value, field: "f")
            Issue.record("expected an error")
        } catch {
            #expect(error.code == .invalid)
            #expect(error.code.exitStatus == 65)
        }
    }

    @Test func renderTreeRendersLeavesNotKeys() throws {
        let tree = json(
            #"""
            {"{{ vars.site_id }}": "{{ vars.site_id }}", "c": "{{ vars.comment }}", "n": 7, "b": false, "z": null,
             "list": ["{{ vars.obj }}", "p-{{ part.number }}", ["{{ vars.items.0.id }}"]]}
            """#)
        let rendered = try Template.renderTree(tree, context: context, field: "request.data")
        #expect(
            rendered
                == json(
                    #"""
                    {"{{ vars.site_id }}": 42, "c": "hi {{ vars.site_id }}", "n": 7, "b": false, "z": null,
                     "list": [{"a": 1, "b": [true, null]}, "p-1", ["i0"]]}
                    """#))
    }

    @Test func renderTreeNamesTheFailingLeaf() {
        let tree = json(#"{"items": [{"n": "ok"}, {"n": "{{ vars.missing }}"}]}"#)
        #expect(throws: OutboxError.invalid(#"request.data.items[1].n: {{ vars.missing }} does not resolve (vars has no "missing")"#)) {
            try Template.renderTree(tree, context: context, field: "request.data")
        }
    }
}

struct TemplateHostileInputTests {
    static let size = 100 * 1024

    /// Runs `body`; how long a large render takes is measured in bench/, not asserted here.
    private func rendering(_ body: () throws -> Void) rethrows {
        try body()
    }

    @Test func hundredKiBValueInEveryMode() throws {
        // A value full of everything hostile at once: braces, dot segments, escapes, unicode, quotes.
        let unit = "{{ vars.x }}/../%2F é\"'<&"
        let big = String(repeating: unit, count: Self.size / unit.utf8.count + 1)
        let ctx = TemplateContext(roots: ["vars": .object([("big", .string(big))])])
        try rendering { () throws -> Void in
            // In the path its ".." between encoded slashes is refused; in the query it is only encoded.
            #expect(throws: OutboxError.self) {
                try Template.render("https://h.example/{{ vars.big }}", context: ctx, mode: .url, field: "f")
            }
            let url = try Template.render("https://h.example/?q={{ vars.big }}", context: ctx, mode: .url, field: "f")
            let unitEncoded = "%7B%7B%20vars.x%20%7D%7D%2F..%2F%252F%20%C3%A9%22%27%3C%26"
            #expect(url == .string("https://h.example/?q=" + String(repeating: unitEncoded, count: Self.size / unit.utf8.count + 1)))
            #expect(try Template.render("x{{ vars.big }}", context: ctx, mode: .value, field: "f") == .string("x" + big))
            #expect(try Template.render("{{ vars.big }}", context: ctx, mode: .header, field: "f") == .string(big))
            let xml = try Template.render("{{ vars.big | xml }}", context: ctx, mode: .text, field: "f")
            #expect(xml.stringValue?.hasPrefix("{{ vars.x }}/../%2F é&quot;&apos;&lt;&amp;{{") == true)
            let quoted = try Template.render("{{ vars.big | json }}", context: ctx, mode: .text, field: "f")
            #expect(quoted == .string(JSON.string(big).serialized()))
        }
    }

    @Test func nestedLoopsStopAtTheRenderCap() {
        // 100³ × 1,000 bytes would be a gigabyte from a few hundred bytes of vars.
        let ctx = TemplateContext(roots: ["vars": .object([("l", .array((0..<100).map { .int($0) }))])])
        let body = String(repeating: "0123456789", count: 100)
        let template = "{{ for a in vars.l }}{{ for b in vars.l }}{{ for c in vars.l }}\(body){{ end }}{{ end }}{{ end }}"
        let error = #expect(throws: OutboxError.self) { try Template.render(template, context: ctx, mode: .text, field: "request.text") }
        #expect(error?.code == .invalid)
        #expect(error?.message.hasPrefix("request.text: {{ for") == true)
        #expect(error?.message.hasSuffix("renders more than 16 MiB") == true, "\(error?.message ?? "")")
    }

    @Test func nestedLoopsThatRenderNothingStopAtTheRepeatCap() throws {
        // 400³ empty insides: nothing for the size cap to see, minutes of work.
        let ctx = TemplateContext(roots: ["vars": .object([("l", .array((0..<400).map { .int($0) })), ("s", .string(""))])])
        let template = "{{ for a in vars.l }}{{ for b in vars.l }}{{ for c in vars.l }}{{ vars.s }}{{ end }}{{ end }}{{ end }}"
        let error = #expect(throws: OutboxError.self) { try Template.render(template, context: ctx, mode: .text, field: "request.text") }
        #expect(error?.code == .invalid)
        #expect(error?.message.hasSuffix("more than 1000000 times in all") == true, "\(error?.message ?? "")")
        // A list as long as a million-line body renders.
        let long = TemplateContext(roots: ["vars": .object([("l", .array((0..<1_000_000).map { _ in .int(1) }))])])
        #expect(
            try Template.render("{{ for a in vars.l }}x{{ end }}", context: long, mode: .text, field: "f").stringValue?.count == 1_000_000)
    }

    @Test func eightThousandSubstitutionsRenderLinearly() throws {
        let ctx = TemplateContext(roots: [
            "vars": .object([("a", .string("x y")), ("list", .array(Array(repeating: .string("é"), count: 8_000)))])
        ])
        let urlTemplate = "https://h.example/" + String(repeating: "{{ vars.a }}/", count: 8_000)
        let textTemplate = String(repeating: "<{{ vars.a | xml }}>", count: 8_000)
        try rendering { () throws -> Void in
            let url = try Template.render(urlTemplate, context: ctx, mode: .url, field: "f")
            #expect(url == .string("https://h.example/" + String(repeating: "x%20y/", count: 8_000)))
            let text = try Template.render(textTemplate, context: ctx, mode: .text, field: "f")
            #expect(text == .string(String(repeating: "<x y>", count: 8_000)))
            let loop = try Template.render("{{ for v in vars.list }}{{ v }}{{ end }}", context: ctx, mode: .text, field: "f")
            #expect(loop == .string(String(repeating: "é", count: 8_000)))
        }
    }

    @Test func hundredKiBDefaultAndLiteral() throws {
        let long = String(repeating: "ab\\\"", count: Self.size / 4)
        let expected = String(repeating: "ab\"", count: Self.size / 4)
        let literal = String(repeating: "}} { } ", count: Self.size / 7)
        try rendering { () throws -> Void in
            #expect(
                try Template.render("{{ vars.none | default(\"\(long)\") }}", context: context, mode: .value, field: "f")
                    == .string(expected))
            #expect(try Template.render(literal, context: context, mode: .text, field: "f") == .string(literal))
            #expect(Template.validate(literal) == nil)
        }
    }
}

struct TemplateValidateTests {
    struct Case: Sendable, CustomTestStringConvertible {
        let name: String
        let template: String
        let message: String?
        var testDescription: String { name }
        init(_ name: String, _ template: String, _ message: String?) {
            self.name = name
            self.template = template
            self.message = message
        }
    }

    static let cases: [Case] = [
        Case("plain text", "no tags here }}", nil),
        Case("every root", "{{ vars.a }}{{ entry.id }}{{ env.X }}{{ file.size }}{{ part.number }}{{ outcome.data.id }}", nil),
        Case("all filters", #"{{ vars.a | raw | json | xml | default("x \"y\"") }}"#, nil),
        Case(
            "loop variables",
            "{{ for p in outcome.parts }}{{ p.etag }}{{ loop.index }}{{ for q in p.list }}{{ q }}{{ p.x }}{{ end }}{{ end }}", nil),
        Case("hyphen and digits in paths", "{{ vars.site-id.0.x_y }}", nil),
        Case("unclosed", "{{ vars.a", #""{{" at character 1 is never closed by "}}""#),
        Case("unclosed after text", "héllo {{ vars.a } }", #""{{" at character 7 is never closed by "}}""#),
        Case(
            "unterminated default", #"{{ vars.a | default("x }}"#, #"unterminated quoted string in the tag opened by "{{" at character 1"#),
        Case("empty tag", "a{{ }}", #"empty "{{ }}" at character 2"#),
        Case(
            "unknown filter", "{{ vars.a | lower }}",
            #"unknown filter "lower" in {{ vars.a | lower }} (filters: raw, path, json, xml, default("..."))"#),
        Case(
            "unknown filter with arguments", "{{ vars.a | trim(1) }}",
            #"unknown filter "trim" in {{ vars.a | trim(1) }} (filters: raw, path, json, xml, default("..."))"#),
        Case("empty filter", "{{ vars.a | }}", #"empty filter after "|" in {{ vars.a | }}"#),
        Case(
            "default without quotes", "{{ vars.a | default(x) }}",
            #"default needs one double-quoted argument, like default("x"), in {{ vars.a | default(x) }}"#),
        Case(
            "default with two arguments", #"{{ vars.a | default("x", "y") }}"#,
            #"default needs one double-quoted argument, like default("x"), in {{ vars.a | default("x", "y") }}"#),
        Case(
            "default with a bad escape", #"{{ vars.a | default("\n") }}"#,
            #"default("...") allows only \" and \\ escapes, in {{ vars.a | default("\n") }}"#),
        Case(
            "empty path segment", "{{ vars..a }}",
            #""vars..a" is not a valid path in {{ vars..a }} (expected a dotted path like vars.items.0.id)"#),
        Case(
            "space in path", "{{ vars.a b }}",
            #""vars.a b" is not a valid path in {{ vars.a b }} (expected a dotted path like vars.items.0.id)"#),
        Case("unknown root", "{{ var.a }}", #"unknown root "var" in {{ var.a }} (roots: entry, env, file, outcome, part, vars)"#),
        Case(
            "loop outside a block", "{{ loop.index }}",
            #"unknown root "loop" in {{ loop.index }} (roots: entry, env, file, outcome, part, vars)"#),
        Case(
            "loop variable after its block", "{{ for p in vars.l }}{{ end }}{{ p }}",
            #"unknown root "p" in {{ p }} (roots: entry, env, file, outcome, part, vars)"#),
        Case(
            "for over an unknown root", "{{ for p in parts }}{{ end }}",
            #"unknown root "parts" in {{ for p in parts }} (roots: entry, env, file, outcome, part, vars)"#),
        Case("end without for", "{{ end }}", "{{ end }} at character 1 has no matching {{ for }}"),
        Case("for without end", "{{ for p in vars.l }}", "{{ for p in vars.l }} at character 1 is never closed by {{ end }}"),
        Case("malformed for", "{{ for p of vars.l }}{{ end }}", #""{{ for p of vars.l }}" should read {{ for NAME in PATH }}"#),
        Case("bare for", "{{ for }}{{ end }}", #""{{ for }}" should read {{ for NAME in PATH }}"#),
        Case("path starting with for", "{{ vars.for }}{{ vars.format }}", nil),
        Case(
            "loop variable hiding a root", "{{ for vars in outcome.parts }}{{ end }}",
            #"loop variable "vars" in {{ for vars in outcome.parts }} hides a root; pick another name"#),
        Case(
            "loop variable named loop", "{{ for loop in outcome.parts }}{{ end }}",
            #"loop variable "loop" in {{ for loop in outcome.parts }} hides a root; pick another name"#),
        Case(
            "bad loop variable", "{{ for 1p in outcome.parts }}{{ end }}",
            #""1p" in {{ for 1p in outcome.parts }} is not a valid loop variable name"#),
    ]

    @Test(arguments: cases)
    func validate(_ c: Case) {
        #expect(Template.validate(c.template) == c.message)
    }

    struct PathCase: Sendable, CustomTestStringConvertible {
        let name: String
        let template: String
        let paths: [String]
        var testDescription: String { name }
        init(_ name: String, _ template: String, _ paths: [String]) {
            self.name = name
            self.template = template
            self.paths = paths
        }
    }

    static let pathCases: [PathCase] = [
        PathCase("plain", "https://h.example/x", []),
        PathCase(
            "in order without duplicates", "https://h.example/{{ vars.site_id }}/{{ env.API_TOKEN }}/{{ vars.site_id | raw }}",
            ["vars.site_id", "env.API_TOKEN"]),
        PathCase("array indexes", "{{ vars.items.0.id }}", ["vars.items.0.id"]),
        PathCase("default argument is not a path", #"{{ vars.a | default("{{ env.X }}") }}"#, ["vars.a"]),
        PathCase(
            "loop-local paths left out",
            "{{ for p in outcome.parts }}{{ p.etag }}{{ loop.number }}{{ vars.x }}{{ for q in p.l }}{{ q }}{{ end }}{{ end }}{{ entry.id }}",
            ["outcome.parts", "vars.x", "entry.id"]),
        PathCase("invalid template", "{{ vars.a", []),
    ]

    @Test(arguments: pathCases)
    func paths(_ c: PathCase) {
        #expect(Template.paths(in: c.template) == c.paths)
    }

    // What makes a rendered value a secret; text that only spells "env" elsewhere is not it.
    @Test(arguments: [
        ("{{ env.TOKEN }}", true), ("x{{env.A}}y", true), ("{{ vars.a }}{{ env.B }}", true), ("{{ env }}", true),
        ("{{ for k in env }}{{ k }}{{ end }}", true), ("{{ vars.environment }}", false), ("https://env.example/{{ vars.x }}", false),
        ("{{ vars.x }}", false), ("plain", false), ("", false), ("e n v", false), ("{{ env.A", false),
    ])
    func readsEnvironment(_ template: String, _ reads: Bool) {
        #expect(Template.readsEnvironment(template) == reads, "\(template)")
    }
}
