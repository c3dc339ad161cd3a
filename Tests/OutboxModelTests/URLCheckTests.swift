import Testing
@testable import OutboxModel

struct URLCheckTests {
    struct Accept: Sendable, CustomTestStringConvertible {
        let name: String
        let url: String
        var testDescription: String { name }
        init(_ name: String, _ url: String) {
            self.name = name
            self.url = url
        }
    }

    static let accepted: [Accept] = [
        Accept("http", "http://example.com"),
        Accept("https with path", "https://example.com/"),
        Accept("HTTPS upper case", "HTTPS://EXAMPLE.COM/A"),
        Accept("mixed case scheme", "hTTp://example.com/a"),
        Accept("port, query, fragment", "https://api.example.com:8443/x?y=1&z=%20#frag"),
        Accept("highest port", "http://127.0.0.1:65535/"),
        Accept("port 1", "http://127.0.0.1:1/"),
        Accept("IPv6 loopback with port", "http://[::1]:8080/x"),
        Accept("IPv6 address", "http://[2001:db8::7]/"),
        Accept("IPv6 full", "http://[2001:db8:0:0:0:0:0:7]/"),
        Accept("IPv6 with IPv4 tail", "http://[::ffff:192.0.2.1]/"),
        Accept("user info with escape", "https://user:pa%20ss@h.example/x"),
        Accept("presigned escapes kept", "https://h.example/a%2Fb?sig=abc%2F%3D"),
        Accept("brackets in query", "https://h.example/p?filter[name]=x"),
        Accept("all sub-delims and pchars", "https://h.example/~a-b_c.d!$&'()*+,;=:@"),
        Accept("query right after host", "https://h.example?x=1"),
        Accept("underscore host", "http://my_host.local/"),
    ]

    @Test(arguments: accepted)
    func accepts(_ c: Accept) throws {
        #expect(try URLCheck.validate(c.url, field: "request.url") == c.url)
    }

    struct Reject: Sendable, CustomTestStringConvertible {
        let name: String
        let url: String
        let message: String
        var testDescription: String { name }
        init(_ name: String, _ url: String, _ message: String) {
            self.name = name
            self.url = url
            self.message = message
        }
    }

    static let rejected: [Reject] = [
        Reject("empty", "", "u: the URL is empty"),
        Reject("file", "file:///etc/passwd", #"u: scheme "file" is not allowed (http or https only)"#),
        Reject("gopher", "gopher://h.example/", #"u: scheme "gopher" is not allowed (http or https only)"#),
        Reject("ftp", "ftp://h.example/", #"u: scheme "ftp" is not allowed (http or https only)"#),
        Reject("javascript", "javascript:alert(1)", #"u: scheme "javascript" is not allowed (http or https only)"#),
        Reject(
            "long scheme truncated", "abcdefghijklmnopqrstuvwxyz://h/",
            #"u: scheme "abcdefghijklmnop…" is not allowed (http or https only)"#),
        Reject("no scheme", "example.com/x", "u: the URL has no scheme (expected http:// or https://)"),
        Reject("scheme-relative", "//example.com/x", "u: the URL has no scheme (expected http:// or https://)"),
        Reject("host and port without scheme", "localhost:8080/x", #"u: scheme "localhost" is not allowed (http or https only)"#),
        Reject("one slash", "https:/x", #"u: expected "//" and a host after "https:""#),
        Reject("scheme only", "https:", #"u: expected "//" and a host after "https:""#),
        Reject("empty host", "https:///x", "u: the URL has an empty host"),
        Reject("nothing after slashes", "https://", "u: the URL has an empty host"),
        Reject("port without host", "https://:80/", "u: the URL has an empty host"),
        Reject("user info without host", "https://user@/x", "u: the URL has an empty host"),
        Reject("space in path", "https://h.example/a b", "u (https://h.example/…): the URL contains a space at character 20"),
        Reject("space in host", "https://exa mple.com/", "u: the host name contains a space"),
        Reject("space in user info", "https://us er:pw@h.example/", #"u: the user info before "@" contains a space"#),
        Reject(
            "bad escape in user info", "https://u:%zz@h.example/",
            #"u: the user info before "@" has a "%" that does not start a %XX escape"#),
        Reject(
            "truncated escape", "https://h.example/a%2",
            #"u (https://h.example/…): the URL has a "%" that does not start a %XX escape at character 20"#),
        Reject(
            "non-hex escape", "https://h.example/a%zz",
            #"u (https://h.example/…): the URL has a "%" that does not start a %XX escape at character 20"#),
        Reject(
            "control character", "https://h.example/a\nb",
            "u (https://h.example/…): the URL contains a control character (0xA) at character 20"),
        Reject("DEL", "https://h.example/a\u{7F}", "u (https://h.example/…): the URL contains a control character (0x7F) at character 20"),
        Reject(
            "non-ASCII", "https://h.example/é",
            "u (https://h.example/…): the URL contains a non-ASCII character (percent-encode it) at character 19"),
        Reject("non-ASCII host", "https://ex\u{E9}mple.com/", "u: the host name contains a non-ASCII character (percent-encode it)"),
        Reject(
            "brace", "https://h.example/{x}",
            #"u (https://h.example/…): the URL contains "{", which must be percent-encoded at character 19"#),
        Reject(
            "pipe", "https://h.example/a|b",
            #"u (https://h.example/…): the URL contains "|", which must be percent-encoded at character 20"#),
        Reject(
            "backslash host trick", "https://h.example\\@evil/", #"u: the user info before "@" contains "\", which must be percent-encoded"#
        ),
        Reject("port zero", "https://h.example:0/", #"u: the port must be a number from 1 to 65535, not "0""#),
        Reject("port too big", "https://h.example:65536/", #"u: the port must be a number from 1 to 65535, not "65536""#),
        Reject("empty port", "https://h.example:/", #"u: the port must be a number from 1 to 65535, not """#),
        Reject("port with letters", "https://h.example:80a/", #"u: the port must be a number from 1 to 65535, not "80a""#),
        Reject(
            "password with a raw slash", "https://user:s3cr3t/Pa55@h.example/",
            ##"u: the text after the host's ":" is no port, and an "@" follows: a password holding a raw "/", "?" or "#" must write them as %2F, %3F and %23"##
        ),
        Reject("IPv6 unclosed", "http://[::1/", #"u: the IPv6 host has no closing "]""#),
        Reject("IPv6 bad digits", "http://[zz::1]/", "u: the host is not a valid IPv6 address in [...]"),
        Reject("IPv6 too many groups", "http://[1:2:3:4:5:6:7:8:9]/", "u: the host is not a valid IPv6 address in [...]"),
        Reject("IPv6 two double colons", "http://[1::2::3]/", "u: the host is not a valid IPv6 address in [...]"),
        Reject("IPv6 empty", "http://[]/", "u: the host is not a valid IPv6 address in [...]"),
        Reject("IPv6 text after bracket", "http://[::1]x/", #"u: unexpected text after the IPv6 host's "]""#),
        Reject("IPv6 bad port", "http://[::1]:0/", #"u: the port must be a number from 1 to 65535, not "0""#),
    ]

    @Test(arguments: rejected)
    func rejects(_ c: Reject) {
        #expect(throws: OutboxError.invalid(c.message)) {
            try URLCheck.validate(c.url, field: "u")
        }
    }

    @Test func aURLLongerThanLibcurlTakesIsRefused() throws {
        let longest = "http://h.example/" + String(repeating: "a", count: URLCheck.maxLength - 17)
        #expect(try URLCheck.validate(longest, field: "u") == longest)
        #expect(throws: OutboxError.invalid("u: the URL is 8000001 bytes, over the 8000000 libcurl takes")) {
            try URLCheck.validate(longest + "a", field: "u")
        }
    }

    @Test func errorsNeverEchoQueryOrUserInfo() {
        let cases = [
            "https://h.example/x?token=SECRET value",
            "https://h.example/x?token=SECRET%zz",
            "https://user:SECRET pw@h.example/",
        ]
        for url in cases {
            do {
                _ = try URLCheck.validate(url, field: "u")
                Issue.record("accepted \(url)")
            } catch {
                #expect(error.code == .invalid)
                #expect(!error.message.contains("SECRET"), "\(error.message)")
            }
        }
    }

    struct HostCase: Sendable, CustomTestStringConvertible {
        let url: String
        let key: String
        var testDescription: String { url }
    }

    @Test(arguments: [
        HostCase(url: "https://API.Example.com:8443/x", key: "api.example.com:8443"),
        HostCase(url: "https://api.example.com/x", key: "api.example.com"),
        HostCase(url: "https://user:pw@H.example/x", key: "h.example"),
        HostCase(url: "http://[::1]:80/", key: "[::1]:80"),
        HostCase(url: "https://h.example?x=1", key: "h.example"),
        HostCase(url: "https://h.example#f", key: "h.example"),
        HostCase(url: "HTTPS://H.EXAMPLE", key: "h.example"),
        HostCase(url: "not a url", key: ""),
        HostCase(url: "/x://y", key: ""),
    ])
    func hostKey(_ c: HostCase) {
        #expect(URLCheck.hostKey(c.url) == c.key)
    }

    struct EncodeCase: Sendable, CustomTestStringConvertible {
        let name: String
        let input: String
        let output: String
        var testDescription: String { name }
    }

    @Test(arguments: [
        EncodeCase(name: "space", input: "a b", output: "a%20b"),
        EncodeCase(name: "slash", input: "/", output: "%2F"),
        EncodeCase(name: "encoded slash", input: "%2F", output: "%252F"),
        EncodeCase(name: "dot", input: ".", output: "%2E"),
        EncodeCase(name: "dot dot", input: "..", output: "%2E%2E"),
        EncodeCase(name: "three dots", input: "...", output: "%2E%2E%2E"),
        EncodeCase(name: "dot in a name stays", input: "a.b", output: "a.b"),
        EncodeCase(name: "dot-dot-slash", input: "../x", output: "..%2Fx"),
        EncodeCase(name: "unreserved kept", input: "AZaz09-._~", output: "AZaz09-._~"),
        EncodeCase(name: "reserved encoded", input: "?#&=+:@[]!$'()*,;", output: "%3F%23%26%3D%2B%3A%40%5B%5D%21%24%27%28%29%2A%2C%3B"),
        EncodeCase(name: "e acute", input: "é", output: "%C3%A9"),
        EncodeCase(name: "emoji", input: "😀", output: "%F0%9F%98%80"),
        EncodeCase(name: "control and braces", input: "\n{{", output: "%0A%7B%7B"),
        EncodeCase(name: "empty", input: "", output: ""),
    ])
    func encodeComponent(_ c: EncodeCase) {
        #expect(URLCheck.encodeComponent(c.input) == c.output)
    }

    @Test(arguments: [
        EncodeCase(name: "nested path", input: "2026/11/cam 1.mp4", output: "2026/11/cam%201.mp4"),
        EncodeCase(name: "dot dot segment cannot climb", input: "../etc/passwd", output: "%2E%2E/etc/passwd"),
        EncodeCase(name: "dot segment inside", input: "a/./b", output: "a/%2E/b"),
        EncodeCase(name: "dots in names stay", input: "a.b/c..d", output: "a.b/c..d"),
        EncodeCase(name: "empty segments kept", input: "/a//b/", output: "/a//b/"),
        EncodeCase(name: "reserved inside a segment", input: "q?x#y/z", output: "q%3Fx%23y/z"),
        EncodeCase(name: "encoded slash stays data", input: "a%2Fb/c", output: "a%252Fb/c"),
        EncodeCase(name: "no slash", input: "a b", output: "a%20b"),
    ])
    func encodePathKeepsSlashes(_ c: EncodeCase) {
        #expect(URLCheck.encodePath(c.input) == c.output)
    }
}
