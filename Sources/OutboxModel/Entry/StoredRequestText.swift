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

    /// This text's request, from one parsed from a text of the same shape.
    package func request(sharing parsed: StoredRequest) throws(OutboxError) -> StoredRequest {
        var members: [(String, JSON)] = []
        do throws(JSONParseError) {
            if let url { members.append(("url", try JSON.parse(url))) }
            if let file { members.append(("file", try JSON.parse(file))) }
        } catch {
            throw .storage("the stored request is damaged: \(error)")
        }
        let fields = StoredFields(.object(members), what: "stored request")
        var request = parsed
        if url != nil { request.url = try StoredRequest.url(fields) }
        if file != nil { request.file = try StoredRequest.file(fields) }
        return request
    }
}
