/// Collects the header lines libcurl hands over, keeping only the final response's.
///
/// The header callback also sees 1xx and redirect responses (T-curl9), so every status
/// line starts a fresh set.
struct ResponseHeaders {
    private(set) var fields: [(name: String, value: String)] = []
    private var index: [String: Int] = [:]

    /// Feeds one raw header line (with or without its CRLF).
    mutating func consume(_ raw: UnsafeRawBufferPointer) {
        var end = raw.count
        while end > 0, raw[end - 1] == 0x0A || raw[end - 1] == 0x0D { end -= 1 }
        let line = UnsafeRawBufferPointer(rebasing: raw[0..<end])
        if line.isEmpty { return }
        if line.starts(with: Array("HTTP/".utf8)) {
            fields.removeAll(keepingCapacity: true)
            index.removeAll(keepingCapacity: true)
            return
        }
        if line[0] == 0x20 || line[0] == 0x09 {
            // Obsolete line folding: the line continues the previous value.
            guard !fields.isEmpty else { return }
            let more = trimmed(line[...])
            if !more.isEmpty {
                let last = fields.count - 1
                fields[last].value += (fields[last].value.isEmpty ? "" : " ") + more
            }
            return
        }
        guard let colon = line.firstIndex(of: 0x3A) else { return }
        let name = asciiLowercased(String(decoding: UnsafeRawBufferPointer(rebasing: line[0..<colon]), as: UTF8.self))
        let value = trimmed(line[(colon + 1)...])
        if let at = index[name] {
            fields[at].value += ", " + value
        } else {
            index[name] = fields.count
            fields.append((name: name, value: value))
        }
    }

    /// Feeds a line given as a string (tests).
    mutating func consume(_ line: String) {
        var copy = Array(line.utf8)
        copy.withUnsafeMutableBytes { consume(UnsafeRawBufferPointer($0)) }
    }

    func value(_ name: String) -> String? {
        index[name].map { fields[$0].value }
    }

    private func trimmed(_ slice: Slice<UnsafeRawBufferPointer>) -> String {
        var lo = slice.startIndex
        var hi = slice.endIndex
        while lo < hi, slice[lo] == 0x20 || slice[lo] == 0x09 { lo += 1 }
        while hi > lo, slice[hi - 1] == 0x20 || slice[hi - 1] == 0x09 { hi -= 1 }
        return String(decoding: UnsafeRawBufferPointer(rebasing: slice.base[lo..<hi]), as: UTF8.self)
    }
}
