import OutboxHTTP
import OutboxModel
@testable import OutboxRunner
import Testing

/// The documents a hook and an events reader get, field by field.
struct OutcomePayloadsTests {
    static let at: Int64 = 1_800_000_000_123

    @Test func aCompletedOutcomeCarriesTheEntryAndItsMeta() throws {
        var entry = Sample.entry("e1", key: "notes.create")
        entry.vars = .object([("n", .int(1))])
        entry.idempotencyKey = "idem"
        entry.parent = "p0"
        let payload = OutcomePayloads.base(entry, outcome: .completed, attempts: 3, requestID: "r-1", at: Self.at)
        #expect(
            payload.serialized() == """
                {"outcome":"completed","id":"e1","key":"notes.create","vars":{"n":1},"data":null,"response":null,"parts":null,\
                "meta":{"at":1800000000123,"attempts":3,\
                "request_id":"r-1","idempotency_key":"idem","generation":1,"header_generation":0,"parent":"p0"}}
                """)
    }

    @Test func anErrorOutcomeHasTheErrorTheResponseAndNoData() {
        let result = HTTPResult(status: 422, headers: [(name: "Content-Type", value: "text/plain")], body: Array("bad".utf8))
        let error = OutcomePayloads.error(.http, "HTTP 422", status: 422, body: result.body)
        let payload = OutcomePayloads.failed(Sample.entry("e1"), error: error, response: result, attempts: 1, requestID: "r", at: Self.at)
        #expect(payload["outcome"] == .string("error"))
        #expect(payload["error"]?.serialized() == #"{"kind":"http","message":"HTTP 422","status":422,"body":"bad"}"#)
        #expect(
            payload["response"]?.serialized()
                == #"{"status":422,"headers":{"content-type":"text/plain"},"body":"bad","body_truncated":false}"#)
        #expect(payload["data"] == .null)
    }

    @Test func aBodyThatIsNotUTF8IsBase64() {
        let error = OutcomePayloads.error(.http, "x", body: [0xFF, 0x00, 0x41])
        #expect(error["body"] == .string("/wBB"))
        #expect(error["body_encoding"] == .string("base64"))
    }

    @Test func aPartErrorNamesItsPart() {
        let error = OutcomePayloads.error(.http, "part 2 of 3 failed", status: 500, partIndex: 1)
        #expect(error.serialized() == #"{"kind":"http","message":"part 2 of 3 failed","status":500,"part_index":1,"body":null}"#)
    }

    @Test func anEntryCancelledByItsScopeSaysWhy() {
        let payload = OutcomePayloads.cancelledByScope(Sample.entry("e2", scope: "s"), failed: "e1", scope: "s", at: Self.at)
        #expect(payload["error"]?["kind"] == .string("cancelled"))
        #expect(payload["error"]?["message"] == .string("cancelled because e1 in scope s settled error"))
        #expect(payload["reason"] == .string("scope"))
        #expect(payload["meta"]?["request_id"] == .null)
    }

    @Test(arguments: [
        ("https://h/x", "https://h/x"),
        ("https://h/x?X-Amz-Signature=secret&a=b", "https://h/x?[redacted]"),
        ("https://h/?", "https://h/?[redacted]"),
    ])
    func eventsNeverShowAQueryString(url: String, shown: String) {
        #expect(OutcomePayloads.redactURL(url, secret: false) == shown)
        let event = OutcomePayloads.attemptEvent(
            Sample.entry("e1"), requestID: "r", attempt: 2, url: url, method: "PUT", partIndex: nil,
            result: HTTPResult(status: 503), outcome: .retry(reason: "HTTP 503"), at: Self.at, secrets: { [] })
        #expect(event["url"] == .string(shown))
        #expect(event["outcome"] == .string("retry"))
        #expect(event["http_code"] == .int(503))
    }

    @Test func anAttemptEventMasksSecretsTheServerEchoedBack() {
        var entry = Sample.entry("e1")
        entry.request.headers = [
            ("Authorization", "Bearer tok-123456"), ("Cookie", "sid=cookie-value; lang=en"), ("X-Api-Key", "key-abcdef"),
            ("X-Trace", "trace-visible"),
        ]
        entry.request.secretHeaders = ["x-api-key"]
        let echoed =
            #"{"authorization":"Bearer tok-123456","token":"tok-123456","sid":"cookie-value","lang":"en","#
            + #""x-api-key":"key-abcdef","x-trace":"trace-visible"}"#
        let event = OutcomePayloads.attemptEvent(
            entry, requestID: "r", attempt: 1, url: "https://h/", method: "POST", partIndex: nil,
            result: HTTPResult(status: 500, body: Array(echoed.utf8)), outcome: .retry(reason: "HTTP 500"), at: Self.at,
            secrets: {
                HeaderRules.secretValues(entry.request.headers, names: entry.request.secretHeaders.union(["authorization", "cookie"]))
            })
        #expect(
            event["body"]
                == .string(
                    #"{"authorization":"[redacted]","token":"[redacted]","sid":"[redacted]","lang":"en","#
                        + #""x-api-key":"[redacted]","x-trace":"trace-visible"}"#))
    }

    @Test func shortSecretValuesAreLeftSoOrdinaryTextStaysReadable() {
        let secrets = HeaderRules.secretValues([("Authorization", "ab")], names: ["authorization"])
        #expect(secrets.isEmpty)
        #expect(HeaderRules.redactingValues(Array("ab ab".utf8), secrets) == Array("ab ab".utf8))
        let long = HeaderRules.secretValues([("Authorization", "Basic Zm9vOmJhcg==")], names: ["authorization"])
        #expect(
            String(decoding: HeaderRules.redactingValues(Array("x Zm9vOmJhcg== y Basic Zm9vOmJhcg==".utf8), long), as: UTF8.self)
                == "x [redacted] y [redacted]")
    }

    @Test func anAttemptEventNamesATransportFailure() {
        let result = HTTPResult(failure: TransportFailure(.timeout, "no bytes for 2s"))
        let event = OutcomePayloads.attemptEvent(
            Sample.entry("e1"), requestID: "r", attempt: 1, url: "https://h/", method: "GET",
            partIndex: 4, result: result, outcome: .retry(reason: "timeout"), at: Self.at, secrets: { [] })
        #expect(event["error_kind"] == .string("timeout"))
        #expect(event["error_message"] == .string("no bytes for 2s"))
        #expect(event["part_index"] == .int(4))
        #expect(event["http_code"] == .null)
    }

    @Test func aStateEventIsTheListRowWithItsReason() {
        let event = OutcomePayloads.stateEvent(Sample.entry("e1"), state: "queued", reason: "HTTP 503", at: Self.at)
        #expect(event["type"] == .string("state"))
        #expect(event["state"] == .string("queued"))
        #expect(event["reason"] == .string("HTTP 503"))
        #expect(event["updated_at"] == .int64(Self.at))
        #expect(
            event.objectValue?.map(\.0) == [
                "type", "id", "key", "vars", "state", "reason", "bytes_sent", "total_bytes", "attempts",
                "created_at", "updated_at", "next_attempt_at", "generation", "parent",
            ])
    }

    @Test func aProgressEventCountsSentAndAccepted() {
        #expect(
            OutcomePayloads.progressEvent(Sample.entry("e1"), sent: 30, accepted: 20).serialized()
                == #"{"type":"progress","id":"e1","bytes_sent":30,"bytes_accepted":20,"total_bytes":0}"#)
    }
}

/// A body cut at a size limit inside a UTF-8 character is still text: the cut character is
/// left out; a body that is not UTF-8 elsewhere stays base64.
struct CutBodyTests {
    @Test(
        arguments: [
            ([0x61, 0xE2, 0x82], 1), ([0x61, 0xE2, 0x82, 0xAC], 4), ([0x61, 0xF0, 0x9F], 1), ([0x61, 0xC3], 1),
            ([0x61, 0x80], 2), ([0xE2, 0x82], 0), ([], 0), ([0x61, 0x62], 2),
        ] as [([UInt8], Int)])
    func theCutCharacterIsLeftOut(_ bytes: [UInt8], _ end: Int) {
        #expect(endOfWholeCharacters(bytes) == end)
    }

    @Test func onlyACutBodyLosesItsLastIncompleteCharacter() {
        let cut = Array("ab€".utf8.dropLast())
        var object: JSON = .object([])
        bodyJSON(cut, into: &object, cut: true)
        #expect(object["body"] == .string("ab"))
        #expect(object["body_encoding"] == nil)
        var whole: JSON = .object([])
        bodyJSON(cut, into: &whole)
        #expect(whole["body_encoding"] == .string("base64"), "a whole body is shown as it came")
    }
}
