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

    /// `text` cut as `previous` was, found by comparing the bytes between the values with
    /// `previous`'s shape instead of walking the whole text; nil when anything but the values
    /// differs (the text is then cut afresh).
    package init?(_ text: String, like previous: StoredRequestText) {
        var text = text
        let values: (url: String?, file: String?)? = text.withUTF8 { utf8 in
            previous.shape.bytes.withUnsafeBufferPointer { shape in
                var s = 0
                var t = 0
                var values: (url: String?, file: String?) = (nil, nil)
                while true {
                    // The shape's bytes up to the next cut (a NUL, never raw in JSON text) are the text's too.
                    let literalEnd = shape[s...].firstIndex(of: 0) ?? shape.count
                    let length = literalEnd - s
                    guard t + length <= utf8.count,
                        length == 0 || memcmp(shape.baseAddress! + s, utf8.baseAddress! + t, length) == 0
                    else { return nil }
                    t += length
                    guard literalEnd < shape.count else { break }
                    guard let end = JSON.valueEnd(in: utf8, at: t) else { return nil }
                    let value = String(decoding: UnsafeBufferPointer(rebasing: utf8[t..<end]), as: UTF8.self)
                    if shape[literalEnd + 1] == UInt8(ascii: "u") { values.url = value } else { values.file = value }
                    t = end
                    s = literalEnd + 2
                }
                return t == utf8.count ? values : nil
            }
        }
        guard let values else { return nil }
        shape = previous.shape
        (url, file) = values
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
        var newFile = differs(file, parsed.file)
        guard newURL != nil || newFile != nil else { return parsed.request }
        var request = parsed.request
        // The identity as the store writes it is read directly; any other form, by the full reader.
        if let text = newFile, let identity = FileIdentity(storedText: text) {
            request.file = identity
            newFile = nil
            guard newURL != nil else { return request }
        }
        var members: [(String, JSON)] = []
        do throws(JSONParseError) {
            if let newURL { members.append(("url", try Self.value(newURL))) }
            if let newFile { members.append(("file", try Self.value(newFile))) }
        } catch {
            throw .storage("the stored request is damaged: \(error)")
        }
        let fields = StoredFields(.object(members), what: "stored request")
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
    /// The last text cut, with its shape's request: rows of one definition come in runs.
    private var lastCut: (cut: StoredRequestText, parsed: StoredRequestText.Parsed)?

    package init() {}

    /// The request of `text`; `parse` reads a text no cached one shares its shape with.
    package mutating func request(
        _ text: String, parse: (String) throws(OutboxError) -> StoredRequest
    ) throws(OutboxError) -> StoredRequest {
        if let last, Self.sameBytes(last.text, text) { return last.request }
        let request: StoredRequest
        if let lastCut, let cut = StoredRequestText(text, like: lastCut.cut) {
            request = try cut.request(sharing: lastCut.parsed)
        } else if let cut = StoredRequestText(text) {
            if let parsed = byShape[cut.shape] {
                request = try cut.request(sharing: parsed)
                lastCut = (cut, parsed)
            } else {
                request = try parse(text)
                if byShape.count >= 256 { byShape.removeAll(keepingCapacity: true) }
                let parsed = cut.parsed(request)
                byShape[cut.shape] = parsed
                lastCut = (cut, parsed)
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

extension FileIdentity {
    /// The identity in the one form the store writes (`path`, `size`, `mtime_ns`, `inode`,
    /// maybe `mode`, in that order; a path of printable ASCII with nothing escaped), read
    /// without building JSON values. Nil for any other text: the full reader then decides,
    /// and names what is damaged.
    package init?(storedText text: String) {
        var text = text
        let read: FileIdentity? = text.withUTF8 { utf8 in
            var reader = StoredIdentityReader(utf8)
            guard reader.skip("{\"path\":\""), let path = reader.plainString(),
                reader.skip(",\"size\":"), let size = reader.integer(),
                reader.skip(",\"mtime_ns\":"), let mtime = reader.integer(),
                reader.skip(",\"inode\":"), let inode = reader.digits()
            else { return nil }
            var mode: UInt32?
            if reader.skip(",\"mode\":") {
                guard let m = reader.integer() else { return nil }
                mode = UInt32(truncatingIfNeeded: m)
            }
            guard reader.skip("}"), reader.atEnd else { return nil }
            return FileIdentity(path: path, size: size, mtimeNs: mtime, inode: inode, mode: mode)
        }
        guard let read else { return nil }
        self = read
    }
}

/// Reads the fixed layout of a stored file identity; every method returns nil (or false)
/// at anything else.
private struct StoredIdentityReader {
    let utf8: UnsafeBufferPointer<UInt8>
    var at = 0

    init(_ utf8: UnsafeBufferPointer<UInt8>) { self.utf8 = utf8 }

    var atEnd: Bool { at == utf8.count }

    mutating func skip(_ literal: StaticString) -> Bool {
        let n = literal.utf8CodeUnitCount
        guard at + n <= utf8.count else { return false }
        let same = literal.withUTF8Buffer { memcmp($0.baseAddress!, utf8.baseAddress! + at, n) == 0 }
        if same { at += n }
        return same
    }

    /// The rest of a string whose opening quote is read: printable ASCII, no escape.
    mutating func plainString() -> String? {
        let start = at
        while at < utf8.count, utf8[at] != UInt8(ascii: "\"") {
            guard (0x20...0x7E).contains(utf8[at]), utf8[at] != UInt8(ascii: "\\") else { return nil }
            at += 1
        }
        guard at < utf8.count else { return nil }
        defer { at += 1 }
        return String(decoding: UnsafeBufferPointer(rebasing: utf8[start..<at]), as: UTF8.self)
    }

    /// A JSON integer (no leading zero, no fraction or exponent) that fits in 64 bits.
    mutating func digits() -> UInt64? {
        let start = at
        var value: UInt64 = 0
        while at < utf8.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(utf8[at]) {
            let (times, o1) = value.multipliedReportingOverflow(by: 10)
            let (sum, o2) = times.addingReportingOverflow(UInt64(utf8[at] - UInt8(ascii: "0")))
            guard !o1, !o2 else { return nil }
            value = sum
            at += 1
        }
        guard at > start, at - start == 1 || utf8[start] != UInt8(ascii: "0") else { return nil }
        return value
    }

    mutating func integer() -> Int64? {
        let negative = skip("-")
        guard let magnitude = digits() else { return nil }
        if negative { return magnitude <= UInt64(Int64.max) + 1 ? Int64(truncatingIfNeeded: 0 &- magnitude) : nil }
        return magnitude <= UInt64(Int64.max) ? Int64(magnitude) : nil
    }
}
