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
        try writeFileClosedOnExec(full, data, mode: mode)
        return full
    }

    package func remove() {
        try? FileManager.default.removeItem(atPath: path)
    }
}

/// Writes `data` to a new file next to `path` and renames it over `path`, its descriptor
/// opened close-on-exec: Foundation's `Process` closes only the descriptors open when it
/// prepared the spawn, so a plain write racing another test's spawn could stay open in a
/// long-lived child, and running the script would then fail with "Text file busy".
package func writeFileClosedOnExec(_ path: String, _ data: Data, mode: Int? = nil) throws {
    let temporary = path + ".writing-\(UInt32.random(in: 0...UInt32.max))"
    let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
    guard fd >= 0 else { throw FixtureError("cannot write \(temporary): \(String(cString: strerror(errno)))") }
    var written = 0
    let failure: Int32? = data.withUnsafeBytes { bytes -> Int32? in
        while written < bytes.count {
            let n = Glibc.write(fd, bytes.baseAddress! + written, bytes.count - written)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return errno }
            written += n
        }
        return nil
    }
    let chmodFailed = fchmod(fd, mode_t(mode ?? 0o644)) != 0
    close(fd)
    guard failure == nil, !chmodFailed, rename(temporary, path) == 0 else {
        unlink(temporary)
        throw FixtureError("cannot write \(path)")
    }
}

/// Copies a file or a folder tree to `destination` (which must not exist) with
/// `writeFileClosedOnExec`, keeping each file's permission bits: copied scripts and
/// binaries are run next, so no copy may stay open for writing in another test's child.
package func copyClosedOnExec(_ source: String, to destination: String) throws {
    var isFolder: ObjCBool = false
    guard FileManager.default.fileExists(atPath: source, isDirectory: &isFolder) else {
        throw FixtureError("cannot copy \(source): no such file")
    }
    if isFolder.boolValue {
        try FileManager.default.createDirectory(atPath: destination, withIntermediateDirectories: false)
        for name in try FileManager.default.contentsOfDirectory(atPath: source).sorted() {
            try copyClosedOnExec(source + "/" + name, to: destination + "/" + name)
        }
    } else {
        guard let data = FileManager.default.contents(atPath: source) else { throw FixtureError("cannot read \(source)") }
        try writeFileClosedOnExec(destination, data, mode: fileMode(source))
    }
}

/// The permission bits of the file or folder at `path` (links followed), or nil.
package func fileMode(_ path: String) -> Int? {
    var st = stat()
    guard stat(path, &st) == 0 else { return nil }
    return Int(st.st_mode & 0o7777)
}
