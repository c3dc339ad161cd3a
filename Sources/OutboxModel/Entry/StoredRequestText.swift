import Glibc

/// A stored request's text cut where entries of one definition differ: the values of its
/// `url` and `file`. What is left, the shape, is shared by all of them, so a request parsed
/// once per shape serves each entry with only its own URL and file read again.
package struct StoredRequestText {
    /// The text without the cut values; a NUL (never raw in JSON) and a letter mark each cut,
    /// so two texts share a shape only if they differ in nothing but those values.
    package struct Shape: Hashable {
        let bytes: [UInt8]

        package func hash(into hasher: inout Hasher) {
            bytes.withUnsafeBytes { hasher.combine(bytes: $0) }
        }
    }

    package let shape: Shape
    /// The cut values as JSON text, nil where the text had no such member.
    let url: String?
    let file: String?

    /// Nil when the text is not an object the scan can walk: the full parse then says why.
    package init?(_ text: String) {
        var text = text
        let cut: (Shape, String?, String?)? = text.withUTF8 { utf8 in
            guard let ranges = JSON.memberValueRanges(in: utf8, named: ["url", "file"]) else { return nil }
            let cuts = zip([UInt8(ascii: "u"), UInt8(ascii: "f")], ranges)
                .compactMap { marker, range in range.map { (marker, $0) } }
                .sorted { $0.1.lowerBound < $1.1.lowerBound }
            var shape: [UInt8] = []
            shape.reserveCapacity(utf8.count)
            var at = 0
            for (marker, range) in cuts {
                shape.append(contentsOf: utf8[at..<range.lowerBound])
                shape += [0, marker]
                at = range.upperBound
            }
            shape.append(contentsOf: utf8[at...])
            func value(_ range: Range<Int>?) -> String? {
                range.map { String(decoding: UnsafeBufferPointer(rebasing: utf8[$0]), as: UTF8.self) }
            }
            return (Shape(bytes: shape), value(ranges[0]), value(ranges[1]))
        }
        guard let cut else { return nil }
        (shape, url, file) = cut
    }

    /// A request parsed from a text, with the URL and file values it was read from.
    package struct Parsed {
        let request: StoredRequest
        let url: String?
        let file: String?
    }

    /// `request`, parsed from this text, kept for the texts of its shape.
    package func parsed(_ request: StoredRequest) -> Parsed { Parsed(request: request, url: url, file: file) }

    /// This text's request, from one parsed from a text of the same shape: only a URL or
    /// file whose bytes differ is read (entries of one definition often share their URL).
    package func request(sharing parsed: Parsed) throws(OutboxError) -> StoredRequest {
        func differs(_ mine: String?, _ theirs: String?) -> String? {
            guard let mine, let theirs, !StoredRequestCache.sameBytes(mine, theirs) else { return nil }
            return mine
        }
        let newURL = differs(url, parsed.url)
        let newFile = differs(file, parsed.file)
        guard newURL != nil || newFile != nil else { return parsed.request }
        var members: [(String, JSON)] = []
        do throws(JSONParseError) {
            if let newURL { members.append(("url", try Self.value(newURL))) }
            if let newFile { members.append(("file", try Self.value(newFile))) }
        } catch {
            throw .storage("the stored request is damaged: \(error)")
        }
        let fields = StoredFields(.object(members), what: "stored request")
        var request = parsed.request
        if newURL != nil { request.url = try StoredRequest.url(fields) }
        if newFile != nil { request.file = try StoredRequest.file(fields) }
        return request
    }
}

extension StoredRequestText {
    /// A cut value's JSON text as a value. A string with nothing escaped (a URL or path almost
    /// always) is taken as it stands; anything else goes through the parser, which also says
    /// what is wrong with a damaged one.
    package static func value(_ text: String) throws(JSONParseError) -> JSON {
        var text = text
        let plain: String? = text.withUTF8 { utf8 in
            guard utf8.count >= 2, utf8.first == UInt8(ascii: "\""), utf8.last == UInt8(ascii: "\"") else { return nil }
            let inner = UnsafeBufferPointer(rebasing: utf8[1..<(utf8.count - 1)])
            // A backslash starts an escape (an inner quote too); a raw control byte is damage.
            guard !inner.contains(where: { $0 == UInt8(ascii: "\\") || $0 < 0x20 || $0 == UInt8(ascii: "\"") }) else { return nil }
            return String(decoding: inner, as: UTF8.self)
        }
        if let plain { return .string(plain) }
        return try JSON.parse(text)
    }
}

/// Parsed stored requests by shape, and the last text read: a queue of one definition with
/// one URL (a webhook) repeats its text exactly, which is cheaper to see than to cut.
package struct StoredRequestCache {
    private var byShape: [StoredRequestText.Shape: StoredRequestText.Parsed] = [:]
    private var last: (text: String, request: StoredRequest)?

    package init() {}

    /// The request of `text`; `parse` reads a text no cached one shares its shape with.
    package mutating func request(
        _ text: String, parse: (String) throws(OutboxError) -> StoredRequest
    ) throws(OutboxError) -> StoredRequest {
        if let last, Self.sameBytes(last.text, text) { return last.request }
        let request: StoredRequest
        if let cut = StoredRequestText(text) {
            if let parsed = byShape[cut.shape] {
                request = try cut.request(sharing: parsed)
            } else {
                request = try parse(text)
                if byShape.count >= 256 { byShape.removeAll(keepingCapacity: true) }
                byShape[cut.shape] = cut.parsed(request)
            }
        } else {
            request = try parse(text)
        }
        last = (text, request)
        return request
    }

    /// Byte for byte (String's == takes canonically equivalent texts as equal).
    static func sameBytes(_ a: String, _ b: String) -> Bool {
        var a = a
        var b = b
        return a.withUTF8 { x in
            b.withUTF8 { y in x.count == y.count && (x.count == 0 || memcmp(x.baseAddress!, y.baseAddress!, x.count) == 0) }
        }
    }
}
