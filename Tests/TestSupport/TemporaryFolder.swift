import Foundation

/// A fresh folder under the temp directory (its real path, no symlinks), removed when the
/// last reference goes away or by `remove()`.
package final class TemporaryFolder: @unchecked Sendable {
    package let path: String

    /// `prefix` names the folder (`outbox-PREFIX-XXXXXX`) so a leftover one says whose it is.
    package init(prefix: String = "test") {
        let name = String(prefix.filter { $0.isLetter || $0.isNumber || $0 == "-" }.prefix(40))
        var template = Array((NSTemporaryDirectory() as NSString).appendingPathComponent("outbox-\(name)-XXXXXX").utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        precondition(made != nil, "mkdtemp failed: \(String(cString: strerror(errno)))")
        let raw = String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        path = URL(fileURLWithPath: raw).resolvingSymlinksInPath().path
    }

    deinit { remove() }

    /// `path` + "/" + `relative`.
    package func path(_ relative: String) -> String { path + "/" + relative }

    /// Writes a text file (creating folders), optionally with a mode; returns its path.
    @discardableResult
    package func write(_ relative: String, _ text: String, mode: Int? = nil) throws -> String {
        try write(relative, Data(text.utf8), mode: mode)
    }

    /// Writes bytes (creating folders), optionally with a mode; returns the file's path.
    @discardableResult
    package func write(_ relative: String, _ data: Data, mode: Int? = nil) throws -> String {
        let full = path(relative)
        try FileManager.default.createDirectory(atPath: (full as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        guard FileManager.default.createFile(atPath: full, contents: data) else { throw FixtureError("cannot write \(full)") }
        if let mode { try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: full) }
        return full
    }

    package func remove() {
        try? FileManager.default.removeItem(atPath: path)
    }
}

/// The permission bits of the file or folder at `path` (links followed), or nil.
package func fileMode(_ path: String) -> Int? {
    var st = stat()
    guard stat(path, &st) == 0 else { return nil }
    return Int(st.st_mode & 0o7777)
}
