import Testing

@testable import OutboxHTTP

/// Header lines that once broke the parser (found by fuzzing, see Tests/Fuzz).
@Suite struct ResponseHeadersTests {
    @Test func aLineBreakInsideAFieldValueIsReadAsTwoLines() {
        // `outbox simulate --header $'X-A: a\n\nb'` builds such a line; reading it trapped.
        let headers = ResponseHeaders(fields: [(name: "x-a", value: "a\n\nb"), (name: "x-b", value: "c")])
        #expect(headers.fields.map(\.name) == ["x-a", "x-b"])
        #expect(headers.value("x-a") == "a")
        #expect(headers.value("x-b") == "c")
    }

    @Test func aLineThatStartsWithALineBreakIsRead() {
        var headers = ResponseHeaders()
        headers.consume("\nRetry-After: 5")
        #expect(headers.value("retry-after") == "5")
        #expect(headers.hasRetryAfter == false)
    }

    @Test func aFoldedLineContinuesTheFieldOfTheLineBeforeIt() {
        var headers = ResponseHeaders()
        for line in ["HTTP/1.1 200 OK\r\n", "A: 1\r\n", "B: 2\r\n", "a: 3\r\n", " more\r\n", "junk\r\n", " lost\r\n"] {
            headers.consume(line)
        }
        #expect(headers.value("a") == "1, 3 more")
        #expect(headers.value("b") == "2")
    }

    @Test(arguments: [("Retry-After: 5", true), ("RETRY-AFTER: 5", true), ("Retry\rAfter: 5", false), ("retry-after: 5", true)])
    func onlyARetryAfterFieldCountsAsOne(_ line: String, _ has: Bool) {
        // Folding every byte with 0x20 made a CR stand for the "-" of the name.
        var headers = ResponseHeaders()
        headers.consume(line)
        #expect(headers.hasRetryAfter == has)
        #expect((headers.value("retry-after") != nil) == has)
    }

    /// Content-Length is digits, or one number repeated in a list; anything libcurl would read
    /// loosely (a prefix, hexadecimal, a clamp past 2^63) is no number of bytes.
    @Test(
        arguments: [
            ("2", 2), ("2, 2", 2), ("0", 0), ("9223372036854775807", Int64.max), ("1e5", nil), ("0x10", nil), ("-1", nil),
            ("+1", nil), ("9223372036854775808", nil), ("2, 3", nil), ("", nil), ("2,", nil), ("1 2", nil),
        ] as [(String, Int64?)])
    func contentLengthIsANumberOfBytes(_ value: String, _ expected: Int64?) {
        #expect(ResponseHeaders.byteCount(value) == expected)
    }

    @Test func aContentLengthThatIsNoNumberIsAProblem() {
        var headers = ResponseHeaders()
        for line in ["HTTP/1.1 200 OK\r\n", "Content-Length: 1e5\r\n"] { headers.consume(line) }
        #expect(headers.contentLengthProblem == #"Content-Length "1e5" is not a number of bytes"#)
        headers.consume("HTTP/1.1 200 OK\r\n")
        for line in ["Content-Length: 5\r\n", "content-length: 5, 5\r\n"] { headers.consume(line) }
        #expect(headers.contentLengthProblem == nil, "a new response starts clean; equal values agree")
    }
}
