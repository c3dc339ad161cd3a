/// AWS credentials, read by the runner for each attempt of an `s3` request: never stored in
/// the queue, never printed (no message here carries a key or a secret).
package struct S3Credentials: Sendable, Equatable {
    package var accessKeyID: String
    package var secretAccessKey: String
    package var sessionToken: String?

    package init(accessKeyID: String, secretAccessKey: String, sessionToken: String? = nil) {
        self.accessKeyID = accessKeyID
        self.secretAccessKey = secretAccessKey
        self.sessionToken = sessionToken
    }

    /// Why no credentials were found; the message names variables, files and profiles only.
    package struct Missing: Error, Sendable, Equatable {
        package var message: String
    }

    /// `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`) from the
    /// environment; else the profile `AWS_PROFILE` (default `default`) of the shared
    /// credentials file, `AWS_SHARED_CREDENTIALS_FILE` or `~/.aws/credentials`.
    package static func resolve(environment env: [String: String]) -> Result<S3Credentials, Missing> {
        let id = env["AWS_ACCESS_KEY_ID"].flatMap { $0.isEmpty ? nil : $0 }
        let secret = env["AWS_SECRET_ACCESS_KEY"].flatMap { $0.isEmpty ? nil : $0 }
        let token = env["AWS_SESSION_TOKEN"].flatMap { $0.isEmpty ? nil : $0 }
        switch (id, secret) {
        case let (id?, secret?):
            return .success(S3Credentials(accessKeyID: id, secretAccessKey: secret, sessionToken: token))
        case (.some, nil):
            return .failure(Missing(message: "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"))
        case (nil, .some):
            return .failure(Missing(message: "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not"))
        case (nil, nil):
            break
        }
        let profile = env["AWS_PROFILE"].flatMap { $0.isEmpty ? nil : $0 } ?? "default"
        let path: String
        if let file = env["AWS_SHARED_CREDENTIALS_FILE"], !file.isEmpty {
            path = file
        } else if let home = env["HOME"], !home.isEmpty {
            path = Paths.join(home, ".aws/credentials")
        } else {
            return .failure(
                Missing(message: "no AWS credentials: AWS_ACCESS_KEY_ID is not set, and neither HOME nor AWS_SHARED_CREDENTIALS_FILE"))
        }
        guard let bytes = Paths.readBytes(path) else {
            return .failure(Missing(message: "no AWS credentials: AWS_ACCESS_KEY_ID is not set and \(path) cannot be read"))
        }
        // A key with a byte that is not UTF-8 would be signed repaired, as another key.
        if let offset = Paths.invalidUTF8Offset(bytes) {
            return .failure(Missing(message: "\(path) is not valid UTF-8 (at byte \(offset + 1)): its credentials are not used"))
        }
        let text = String(decoding: bytes, as: UTF8.self)
        guard let values = profileValues(text, profile: profile) else {
            return .failure(Missing(message: "no AWS credentials: AWS_ACCESS_KEY_ID is not set and \(path) has no profile [\(profile)]"))
        }
        guard let fileID = values["aws_access_key_id"], !fileID.isEmpty, let fileSecret = values["aws_secret_access_key"],
            !fileSecret.isEmpty
        else {
            return .failure(
                Missing(message: "profile [\(profile)] of \(path) needs aws_access_key_id and aws_secret_access_key"))
        }
        let fileToken = values["aws_session_token"].flatMap { $0.isEmpty ? nil : $0 }
        return .success(S3Credentials(accessKeyID: fileID, secretAccessKey: fileSecret, sessionToken: fileToken))
    }

    /// The `key = value` lines of one `[profile]` section of an INI file; nil when absent.
    /// `[profile NAME]` (the config file's spelling) names the same profile.
    static func profileValues(_ text: String, profile: String) -> [String: String]? {
        var current: String?
        var found: [String: String]?
        for rawLine in text.split(whereSeparator: { $0 == "\n" || $0 == "\r\n" || $0 == "\r" }) {
            let line = trimmed(rawLine)
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") && line.hasSuffix("]") {
                var name = trimmed(line.dropFirst().dropLast())
                if name.hasPrefix("profile ") { name = trimmed(name.dropFirst("profile ".count)) }
                current = name
                if name == profile && found == nil { found = [:] }
                continue
            }
            guard current == profile, let eq = line.firstIndex(of: "=") else { continue }
            found?[trimmed(line[..<eq]).lowercased()] = trimmed(line[line.index(after: eq)...])
        }
        return found
    }

    private static func trimmed(_ s: some StringProtocol) -> String {
        var sub = Substring(s)
        while let c = sub.first, c == " " || c == "\t" { sub.removeFirst() }
        while let c = sub.last, c == " " || c == "\t" { sub.removeLast() }
        return String(sub)
    }
}
