import Testing
@testable import OutboxModel

/// `skip_existing`: the option at enqueue, and what a HEAD of the object decides.
@Suite struct S3ExistingTests {
    struct HeadCase: Sendable, CustomTestStringConvertible {
        var name: String
        var status: Int?
        var headers: [String: String]
        var size: Int64 = 5
        var checksum: String? = "c2hhLW9mLXRoZS1ieXRlcw=="
        var parts = 0
        var expected: S3Existing
        var testDescription: String { name }
    }

    static let sum = "c2hhLW9mLXRoZS1ieXRlcw=="

    @Test(arguments: [
        HeadCase(
            name: "same size and checksum", status: 200, headers: ["content-length": "5", "x-amz-checksum-sha256": sum],
            expected: .skip),
        HeadCase(name: "no object", status: 404, headers: [:], expected: .upload("no object at the key")),
        HeadCase(
            name: "another size", status: 200, headers: ["content-length": "6", "x-amz-checksum-sha256": sum],
            expected: .upload("the object has another size (6, not 5)")),
        HeadCase(
            name: "no size", status: 200, headers: ["x-amz-checksum-sha256": sum],
            expected: .upload("the object has another size (none, not 5)")),
        HeadCase(
            name: "another checksum", status: 200, headers: ["content-length": "5", "x-amz-checksum-sha256": "b3RoZXI="],
            expected: .upload("the object has another SHA-256 checksum")),
        HeadCase(
            name: "no checksum on the object (an ETag is not compared)", status: 200,
            headers: ["content-length": "5", "etag": "\"5d41402abc4b2a76b9719d911017c592\""],
            expected: .upload("the object has no SHA-256 checksum to compare")),
        HeadCase(
            name: "no checksum of ours", status: 200, headers: ["content-length": "5", "x-amz-checksum-sha256": sum],
            checksum: nil, expected: .upload("the object has no SHA-256 checksum to compare")),
        HeadCase(
            name: "multipart, S3's BASE64-N", status: 200, headers: ["content-length": "5", "x-amz-checksum-sha256": "Y29tcA==-3"],
            checksum: "Y29tcA==-3", parts: 3, expected: .skip),
        HeadCase(
            name: "multipart, bare composite", status: 200, headers: ["content-length": "5", "x-amz-checksum-sha256": "Y29tcA=="],
            checksum: "Y29tcA==-3", parts: 3, expected: .skip),
        HeadCase(
            name: "multipart of another part count", status: 200,
            headers: ["content-length": "5", "x-amz-checksum-sha256": "Y29tcA==-2"], checksum: "Y29tcA==-3", parts: 3,
            expected: .upload("the object has another SHA-256 checksum")),
        HeadCase(
            name: "a whole-object checksum is not a bare composite", status: 200,
            headers: ["content-length": "5", "x-amz-checksum-sha256": "Y29tcA=="], checksum: "Y29tcA==-3", parts: 0,
            expected: .upload("the object has another SHA-256 checksum")),
        HeadCase(name: "refused", status: 403, headers: [:], expected: .failed),
        HeadCase(name: "server error", status: 503, headers: [:], expected: .failed),
        HeadCase(name: "a redirect", status: 301, headers: [:], expected: .failed),
        HeadCase(name: "no answer", status: nil, headers: [:], expected: .failed),
    ])
    func aHeadDecides(_ c: HeadCase) {
        #expect(S3Existing.decide(status: c.status, headers: c.headers, size: c.size, checksum: c.checksum, parts: c.parts) == c.expected)
    }

    @Test func theOptionIsStoredWithTheTarget() throws {
        let on = try S3RequestTests.render(#"{bucket: b12, key: k, region: us-east-1, skip_existing: true}"#).get()
        #expect(on.s3?.skipExisting == true)
        let stored = StoredRequest(prepared: on, form: [])
        #expect(stored.text.contains(#""skip_existing":true"#))
        #expect(try StoredRequest(json: try JSON.parse(stored.text)).s3?.skipExisting == true)

        let templated = try S3RequestTests.render(
            #"{bucket: b12, key: k, region: us-east-1, skip_existing: "{{ vars.skip }}"}"#, vars: #"{"skip": false}"#
        ).get()
        #expect(templated.s3?.skipExisting == false)
        let off = try S3RequestTests.render(#"{bucket: b12, key: k, region: us-east-1}"#).get()
        #expect(off.s3?.skipExisting == false)
        // A row written before the option has no field: it always uploads.
        #expect(!StoredRequest(prepared: off, form: []).text.contains("skip_existing"))
        // Another way of sending: for the same-id rule, another request (a pending entry is replaced).
        #expect(on.bodyHash != off.bodyHash)
    }

    @Test func aSinglePutNamesItsChecksumAlgorithm() throws {
        let p = try S3RequestTests.render(#"{bucket: b12, key: k, region: us-east-1}"#).get()
        #expect(HeaderRules.value(p.headers, "x-amz-sdk-checksum-algorithm") == "SHA256")
        #expect(HeaderRules.value(p.headers, "x-amz-checksum-sha256") != nil)
    }

    @Test func aValueThatIsNotABooleanIsRefused() throws {
        let (_, diagnostics) = readDefinition(
            "key: s3.put\nrequest:\n  s3: {bucket: b12, key: k, region: us-east-1, skip_existing: maybe}\n  file: f.bin\n")
        #expect(diagnostics.contains { $0.message.contains("request.s3.skip_existing") }, "\(diagnostics.map(\.message))")
        switch try S3RequestTests.render(
            #"{bucket: b12, key: k, region: us-east-1, skip_existing: "{{ vars.rel }}"}"#, vars: #"{"rel": "perhaps"}"#)
        {
        case .success: Issue.record("a templated value that is not a boolean must be refused")
        case let .failure(error):
            #expect(error.code == .invalid)
            #expect(error.message.contains("request.s3.skip_existing must be true or false"), "\(error.message)")
        }
    }
}
