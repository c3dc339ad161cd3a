@testable import OutboxModel

/// The URL checks: any text validates or throws; an accepted URL has a host key; text
/// encoded as a path or a component always makes a valid URL after a valid base.
enum FuzzURL {
    static func run(_ input: UnsafeBufferPointer<UInt8>) {
        let text = String(decoding: input, as: UTF8.self)
        if (try? URLCheck.validate(text, field: "url")) != nil {
            if URLCheck.hostKey(text).isEmpty { fatalError("an accepted URL has no host key") }
        }
        _ = URLCheck.redactingPassword(text)
        if URLCheck.shown(text, secret: true).hasSuffix("[redacted]") == false { fatalError("a secret URL was shown whole") }
        _ = URLCheck.hostKey(text)
        for encoded in [URLCheck.encodePath(text), URLCheck.encodeComponent(text)] {
            let url = "https://example.com/" + encoded + "?q=" + URLCheck.encodeComponent(text)
            if (try? URLCheck.validate(url, field: "url")) == nil { fatalError("an encoded text made an invalid URL") }
        }
    }
}
