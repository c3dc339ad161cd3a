import CSystem
import Glibc

/// Path and file-reading helpers on plain POSIX calls (no Foundation in the enqueue path).
package enum Paths {
    package static func join(_ base: String, _ rest: String) -> String {
        if rest.hasPrefix("/") { return rest }
        if base.isEmpty { return rest }
        return base.hasSuffix("/") ? base + rest : base + "/" + rest
    }

    package static func dirname(_ path: String) -> String {
        guard let slash = lastSlash(path) else { return "." }
        if slash == path.startIndex { return "/" }
        return String(path[..<slash])
    }

    package static func basename(_ path: String) -> String {
        guard let slash = lastSlash(path) else { return path }
        return String(path[path.utf8.index(after: slash)...])
    }

    /// Searched in the bytes: a search by `Character` would break the whole path into
    /// graphemes first, and a batch asks this for every file it names.
    private static func lastSlash(_ path: String) -> String.Index? { path.utf8.lastIndex(of: UInt8(ascii: "/")) }

    /// An absolute, lexically normalised path (`.` and `..` folded); symlinks are kept.
    package static func absolute(_ path: String, relativeTo cwd: String) -> String {
        normalize(path.hasPrefix("/") ? path : join(cwd, path))
    }

    package static func normalize(_ path: String) -> String {
        if isNormal(path) { return path }
        var parts: [Substring] = []
        for part in path.split(separator: "/", omittingEmptySubsequences: true) {
            if part == "." { continue }
            if part == ".." { if !parts.isEmpty { parts.removeLast() }; continue }
            parts.append(part)
        }
        return "/" + parts.joined(separator: "/")
    }

    /// Whether `normalize` would return the path unchanged: absolute, and no empty, `.` or
    /// `..` segment (no `//`, no trailing `/` but the root). Most paths are; checking costs a
    /// pass over the bytes, splitting and joining costs allocations.
    static func isNormal(_ path: String) -> Bool {
        path.utf8.withContiguousStorageIfAvailable { bytes -> Bool in
            guard bytes.first == UInt8(ascii: "/") else { return false }
            if bytes.count == 1 { return true }
            var segmentStart = 1
            for i in 1...bytes.count {
                guard i == bytes.count || bytes[i] == UInt8(ascii: "/") else { continue }
                let length = i - segmentStart
                if length == 0 { return false }
                if bytes[segmentStart] == UInt8(ascii: "."), length == 1 || (length == 2 && bytes[segmentStart + 1] == UInt8(ascii: ".")) {
                    return false
                }
                segmentStart = i + 1
            }
            return true
        } ?? false
    }

    /// The path with the links of its existing part resolved (`realpath` of the deepest
    /// folder that exists, the rest appended), so two spellings of one place compare equal.
    package static func resolved(_ path: String) -> String {
        let normal = normalize(path)
        if let real = realpath(normal, nil) {
            defer { free(real) }
            return String(cString: real)
        }
        if normal == "/" { return normal }
        return join(resolved(dirname(normal)), basename(normal))
    }

    /// The target a symbolic link names, as written; nil when `path` is no link (or unreadable).
    package static func readLink(_ path: String) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = readlink(path, &buffer, buffer.count - 1)
        guard n > 0 else { return nil }
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// `path` with symbolic links followed also where the last one dangles (which `resolved`
    /// leaves as is): the file a write through the link creates. Stops after 40 links.
    package static func followingLinks(_ path: String) -> String {
        var current = normalize(path)
        for _ in 0..<40 {
            var st = Glibc.stat()
            guard lstat(current, &st) == 0, (st.st_mode & S_IFMT) == S_IFLNK, let target = readLink(current) else { break }
            current = normalize(absolute(target, relativeTo: dirname(current)))
        }
        return resolved(current)
    }

    /// Whether `path` lies below `folder` (both absolute and normalised).
    package static func isInside(_ path: String, _ folder: String) -> Bool {
        path.hasPrefix(folder == "/" ? "/" : folder + "/") && path != folder
    }

    /// The process's folder; nil when it cannot be read (removed, or a path over PATH_MAX).
    package static func currentDirectory() -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        guard getcwd(&buffer, buffer.count) != nil else { return nil }
        let length = buffer.firstIndex(of: 0) ?? buffer.count
        return String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    package static func exists(_ path: String) -> Bool {
        var st = stat()
        return stat(path, &st) == 0
    }

    /// Whether anything is at `path`, a dangling or looping link included.
    package static func entryExists(_ path: String) -> Bool {
        var st = stat()
        return lstat(path, &st) == 0
    }

    package static func isDirectory(_ path: String) -> Bool {
        var st = stat()
        return stat(path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFDIR
    }

    /// What is wrong with a file the store made (a body it staged), read without following
    /// a link: nil when it is a regular file of `size` bytes (any size when nil).
    package static func stagedFileProblem(_ path: String, size: Int64?) -> String? {
        var st = stat()
        guard lstat(path, &st) == 0 else { return errnoMessage() }
        if (st.st_mode & S_IFMT) == S_IFLNK { return "is a symbolic link, not the file the store staged" }
        if (st.st_mode & S_IFMT) != S_IFREG { return "is not a regular file" }
        if let size, Int64(st.st_size) != size { return "has \(st.st_size) bytes, not the \(size) enqueued" }
        return nil
    }

    package static func isRegularFile(_ path: String) -> Bool {
        var st = stat()
        return stat(path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFREG
    }

    /// The most `readBytes` reads: config, definitions and credentials are small.
    package static let smallFileLimit = 16 << 20

    /// Reads a whole small regular file; nil (with `errno` set) when it cannot be opened, is
    /// not a regular file (EINVAL; a folder EISDIR) or is over `smallFileLimit` (EFBIG). A
    /// FIFO or a device put where a file belongs neither blocks the open nor reads forever.
    package static func readBytes(_ path: String) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)
        guard fd >= 0 else { return nil }
        let result = readSmall(fd)
        close(fd)
        // Set after the close, which must not overwrite the reason.
        if case let .failure(failure) = result { errno = failure.code }
        return try? result.get()
    }

    private static func readSmall(_ fd: Int32) -> Result<[UInt8], Errno> {
        var info = stat()
        guard fstat(fd, &info) == 0 else { return .failure(Errno(code: errno)) }
        guard (info.st_mode & S_IFMT) == S_IFREG else { return .failure(Errno(code: (info.st_mode & S_IFMT) == S_IFDIR ? EISDIR : EINVAL)) }
        guard info.st_size <= smallFileLimit else { return .failure(Errno(code: EFBIG)) }
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            // A file that grows while it is read is cut off at the limit too.
            guard out.count <= smallFileLimit else { return .failure(Errno(code: EFBIG)) }
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                return .failure(Errno(code: errno))
            }
            if n == 0 { return .success(out) }
            out.append(contentsOf: chunk[0..<n])
        }
    }

    /// Why `readBytes` returned nil, in words.
    package static func readFailure(_ code: Int32 = errno) -> String {
        switch code {
        case EINVAL, EISDIR: return "it is not a regular file"
        case EFBIG: return "it is over \(Units.formatBytes(Int64(smallFileLimit)))"
        default: return errnoMessage(code)
        }
    }

    package static func readText(_ path: String) -> String? {
        readBytes(path).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Why a file cannot be opened for reading (the errno text); nil when it can. Asked of
    /// the kernel with the ids `open` would use, without opening the file: one call where
    /// an open and a close were two, for each file of a batch.
    package static func readProblem(_ path: String) -> String? {
        faccessat(AT_FDCWD, path, R_OK, AT_EACCESS) == 0 ? nil : errnoMessage()
    }

    /// The byte offset of the first byte that is not valid UTF-8, or nil when all of it is
    /// (text from outside is refused, never silently repaired).
    package static func invalidUTF8Offset(_ bytes: some Collection<UInt8>) -> Int? {
        // ASCII, the common case, without making a String of it.
        if bytes.withContiguousStorageIfAvailable({ $0.allSatisfy { $0 < 0x80 } }) == true { return nil }
        if String(validating: bytes, as: UTF8.self) != nil { return nil }
        var decoder = UTF8()
        var iterator = bytes.makeIterator()
        var offset = 0
        while true {
            switch decoder.decode(&iterator) {
            case let .scalarValue(scalar): offset += UTF8.width(scalar)
            case .emptyInput: return nil
            case .error: return offset
            }
        }
    }

    /// Names in a folder (no `.`/`..`), sorted; nil when it cannot be read. A name that is
    /// not UTF-8 comes with `\xHH` for its bad bytes, so it names no file: see `listNames`.
    package static func list(_ path: String) -> [String]? {
        listNames(path).map { ($0.names + $0.notUTF8).sorted() }
    }

    /// The names in a folder, with those that are not valid UTF-8 apart (shown with `\xHH`
    /// for each byte outside ASCII): a repaired name would name another file, or none.
    package static func listNames(_ path: String) -> (names: [String], notUTF8: [String])? {
        guard let dir = opendir(path) else { return nil }
        defer { closedir(dir) }
        var names: [String] = []
        var notUTF8: [String] = []
        while let entry = readdir(dir) {
            let bytes = withUnsafePointer(to: entry.pointee.d_name) {
                $0.withMemoryRebound(to: UInt8.self, capacity: 256) { Array(UnsafeBufferPointer(start: $0, count: strlen($0))) }
            }
            guard let name = String(validating: bytes, as: UTF8.self) else {
                notUTF8.append(
                    bytes.map { $0 < 0x80 ? String(UnicodeScalar($0)) : "\\x" + String($0, radix: 16, uppercase: true) }.joined())
                continue
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return (names.sorted(), notUTF8.sorted())
    }

    /// Removes a folder this process made, with everything in it; links are removed, never
    /// followed. Best effort: what cannot be removed stays.
    package static func removeTree(_ path: String) {
        var info = stat()
        guard lstat(path, &info) == 0 else { return }
        if info.st_mode & S_IFMT == S_IFDIR {
            for name in listNames(path)?.names ?? [] { removeTree(join(path, name)) }
            rmdir(path)
        } else {
            unlink(path)
        }
    }

    package static func errnoMessage(_ code: Int32 = errno) -> String {
        String(cString: strerror(code))
    }
}

extension FileInfo {
    /// Size, mtime in nanoseconds and inode (a `Date` would lose the nanoseconds), or nil
    /// when the path cannot be read.
    package static func stat(_ path: String) -> FileInfo? {
        var st = Glibc.stat()
        guard statPath(path, &st) == 0 else { return nil }
        return FileInfo(st)
    }

    /// The same without following a link (`lstat`): a link's own, with `isLink`.
    package static func lstat(_ path: String) -> FileInfo? {
        var st = Glibc.stat()
        guard Glibc.lstat(path, &st) == 0 else { return nil }
        return FileInfo(st)
    }

    /// The same of an open file (`fstat`): the file read from, whatever its path names now.
    package static func stat(fd: Int32) -> FileInfo? {
        var st = Glibc.stat()
        guard fstat(fd, &st) == 0 else { return nil }
        return FileInfo(st)
    }

    private init(_ st: Glibc.stat) {
        self.init(
            size: Int64(st.st_size),
            // Wrapping, as the C side's: a file dated past 2262 (2^63 ns) must not stop the process.
            mtimeNs: Int64(st.st_mtim.tv_sec) &* 1_000_000_000 &+ Int64(st.st_mtim.tv_nsec),
            inode: UInt64(st.st_ino),
            isRegular: (st.st_mode & S_IFMT) == S_IFREG,
            mode: UInt32(st.st_mode & 0o7777), device: UInt64(st.st_dev), isLink: (st.st_mode & S_IFMT) == S_IFLNK)
    }
}

private func statPath(_ path: String, _ st: inout stat) -> Int32 { stat(path, &st) }

extension Paths {
    /// Writes a whole file so that readers see the old one or the new one, never half:
    /// a temporary file beside it, synced, renamed over it, then the folder synced.
    package static func writeAtomically(_ bytes: [UInt8], to path: String, mode: mode_t = 0o644) throws(OutboxError) {
        let temp = "\(path).tmp-\(getpid())"
        unlink(temp)
        let rc = bytes.withUnsafeBytes { csystem_write_file(temp, $0.baseAddress, $0.count) }
        guard rc == 0 else { throw .storage("cannot write \(temp): \(errnoMessage(-rc))") }
        chmod(temp, mode)
        guard rename(temp, path) == 0 else {
            let code = errno
            unlink(temp)
            throw .storage("cannot write \(path): \(errnoMessage(code))")
        }
        _ = csystem_fsync_dir(dirname(path))
    }
}
