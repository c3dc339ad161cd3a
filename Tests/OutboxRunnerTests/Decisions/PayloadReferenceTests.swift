import OutboxHTTP
import OutboxModel
import OutboxProcess
@testable import OutboxRunner
import Testing

/// The generated reference lists every field of the documents the runner writes (a hook's
/// stdin, event lines, the run's summary), and no field the runner never writes.
struct PayloadReferenceTests {
    static let at: Int64 = 1_800_000_000_123
    /// Not valid UTF-8, so bodies come out as base64 with their `_encoding` field.
    static let binary: [UInt8] = [0xFF, 0x00, 0x41]

    /// Dotted paths of a document's fields; a list adds its items' fields under its own path,
    /// and an open object (vars, headers) only itself.
    static func paths(_ json: JSON, prefix: String = "") -> Set<String> {
        var out: Set<String> = []
        switch json {
        case let .object(members):
            for (key, value) in members {
                let path = prefix.isEmpty ? key : prefix + "." + key
                out.insert(path)
                if !PayloadFields.openObjects.contains(path) { out.formUnion(paths(value, prefix: path)) }
            }
        case let .array(items):
            for item in items { out.formUnion(paths(item, prefix: prefix)) }
        default:
            break
        }
        return out
    }

    static func documented(_ fields: [PayloadField]) -> Set<String> { Set(fields.map(\.path)) }

    /// Every kind of hook input the runner builds, as a hook receives it.
    static func hookInputs() throws -> [JSON] {
        var entry = Sample.entry("e1", key: "notes.create")
        entry.vars = .object([("n", .int(1))])
        let response = HTTPResult(status: 201, headers: [(name: "ETag", value: "\"a\"")], body: binary)
        let parts = OutcomePayloads.parts([Sample.part(0, accepted: true), Sample.part(1, accepted: true)])
        let completed = OutcomePayloads.success(
            entry, result: response, parts: parts, attempts: 2, requestID: "r", at: at, maxResponseBytes: 1024,
            parse: { _, _, _ in .success(.null) }
        ).payload
        // An s3 entry's success adds what S3 answered about the object.
        var stored = completed
        stored.set("s3", Runner.s3Outcome(entry, result: response, parts: nil))
        let refused = OutcomePayloads.failed(
            entry, error: OutcomePayloads.error(.http, "HTTP 422", status: 422, partIndex: 3, body: binary),
            response: HTTPResult(status: 422, body: binary), attempts: 1, requestID: "r", at: at)
        let expired = OutcomePayloads.failed(
            entry, error: OutcomePayloads.error(.expired, "expired"), response: nil, attempts: 4, requestID: "", at: at)
        let cancelled = OutcomePayloads.cancelledByScope(Sample.entry("e2", scope: "s"), failed: "e1", scope: "s", at: at)
        // The hook's stdin adds `meta.deliveries` to the journaled payload.
        return try [completed, stored, refused, expired, cancelled].map { payload in
            let record = OutcomeRecord(
                seq: 1, entryID: "e1", key: "notes.create", generation: 1, outcome: .completed, payload: payload, deliveries: 0,
                acknowledged: false, nextDeliveryAt: nil, reason: nil, hookPgid: nil, hookStart: nil, createdAt: at)
            let spec = Runner.hookSpec(
                .shell("true"), outcome: record, deliveries: 2, config: Config(root: "/p"), environment: EncodedEnvironment([:]))
            return try JSON.parse(String(decoding: spec.stdin, as: UTF8.self))
        }
    }

    @Test func everyHookInputFieldIsInTheReference() throws {
        let inputs = try Self.hookInputs()
        let emitted = inputs.reduce(into: Set<String>()) { $0.formUnion(Self.paths($1)) }
        let documented = Self.documented(PayloadFields.hookInput)
        #expect(emitted.subtracting(documented).isEmpty, "not in the reference: \(emitted.subtracting(documented).sorted())")
        // `follow_up_errors` is added when a chain fails to build (FollowUpFailureTests sees it).
        let unseen = documented.subtracting(emitted).filter { !$0.hasPrefix("follow_up_errors") }
        #expect(unseen.isEmpty, "documented but never written: \(unseen.sorted())")
        #expect(inputs.allSatisfy { $0["meta"]?["deliveries"] == .int(2) })
    }

    @Test func aHooksVariablesAreTheReferences() {
        let record = OutcomeRecord(
            seq: 1, entryID: "e1", key: "k", generation: 3, outcome: .error, payload: .object([]), deliveries: 0,
            acknowledged: false, nextDeliveryAt: nil, reason: nil, hookPgid: nil, hookStart: nil, createdAt: Self.at)
        let spec = Runner.hookSpec(
            .shell("true"), outcome: record, deliveries: 2, config: Config(root: "/p"), environment: EncodedEnvironment(["HOME": "/h"]))
        #expect(Set(spec.environment.variables.keys) == Set(HookEnvironment.variables.map(\.name) + ["HOME"]))
        #expect(spec.environment["OUTBOX_ID"] == "e1")
        #expect(spec.environment["OUTBOX_KEY"] == "k")
        #expect(spec.environment["OUTBOX_OUTCOME"] == "error")
        #expect(spec.environment["OUTBOX_DELIVERIES"] == "2")
        #expect(spec.environment["OUTBOX_GENERATION"] == "3")
    }

    @Test func everyEventFieldIsInTheReference() {
        let entry = Sample.entry("e1")
        let cases: [(String, [JSON], [PayloadField])] = [
            ("state", [OutcomePayloads.stateEvent(entry, state: "queued", reason: "HTTP 503", at: Self.at)], PayloadFields.stateEvent),
            ("progress", [OutcomePayloads.progressEvent(entry, sent: 3, accepted: 2)], PayloadFields.progressEvent),
            (
                "attempt",
                [
                    OutcomePayloads.attemptEvent(
                        entry, requestID: "r", attempt: 1, url: "https://h/x?sig=1", method: "PUT", partIndex: 2,
                        result: HTTPResult(status: 503, body: Self.binary), outcome: .retry(reason: "HTTP 503"), at: Self.at,
                        secrets: { [] })
                ],
                PayloadFields.attemptEvent
            ),
            ("summary", [RunSummary().json], PayloadFields.runSummary),
        ]
        for (name, documents, fields) in cases {
            let emitted = documents.reduce(into: Set<String>()) { $0.formUnion(Self.paths($1)) }
            let documented = Self.documented(fields)
            #expect(emitted.subtracting(documented).isEmpty, "\(name): \(emitted.subtracting(documented).sorted())")
            #expect(
                documented.subtracting(emitted).isEmpty,
                "\(name) documents fields never written: \(documented.subtracting(emitted).sorted())")
        }
    }
}
