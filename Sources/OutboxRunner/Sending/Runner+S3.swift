import OutboxHTTP
import OutboxModel

/// Signing an `s3` request at the moment it is sent, with the runner's credentials.
extension Runner {
    /// libcurl 7.88 takes the payload hash from this header and computes none for a body it
    /// streams; S3 accepts UNSIGNED-PAYLOAD, so no pass over the file precedes the send.
    static let s3PayloadHash = "UNSIGNED-PAYLOAD"

    /// S3's own words for a refusal (`S3 BadDigest: The SHA256 you specified did not match the
    /// calculated checksum.`), so the error names what S3 found wrong; nil for other requests.
    static func s3Refusal(_ entry: Entry, body: [UInt8]) -> String? {
        guard entry.request.s3 != nil, let code = xmlElement("Code", in: body) else { return nil }
        let message = xmlElement("Message", in: body).map { ": \(xmlUnescaped($0))" } ?? ""
        return "S3 \(code)\(message)"
    }

    /// Adds the signature options and S3's headers, or a refusal when no credentials are found.
    func signS3(_ request: inout HTTPRequest, target: S3Target) {
        switch S3Credentials.resolve(environment: environment) {
        case let .success(credentials):
            request.headers.append((name: "x-amz-content-sha256", value: Self.s3PayloadHash))
            // Sent through libcurl's own option, which the signature leaves out, as AWS's SDKs
            // do: proxies rewrite it, and servers that verify as botocore does refuse it signed.
            if let i = request.headers.firstIndex(where: { $0.name.lowercased() == "user-agent" }) {
                request.userAgent = request.headers.remove(at: i).value
            }
            if let token = credentials.sessionToken { request.headers.append((name: "x-amz-security-token", value: token)) }
            request.awsSigV4 = AWSSigV4(
                provider: target.signingProvider, accessKeyID: credentials.accessKeyID,
                secretAccessKey: credentials.secretAccessKey)
            // A signed request never follows a redirect to another origin with its token.
            request.credentialHeaders.insert("x-amz-security-token")
        case let .failure(missing):
            request.refusal = TransportFailure(.credentials, missing.message)
        }
    }
}
