import Glibc

/// The store's own files (its database, staged bodies) and the config are never a body:
/// `ownership: move` would take the store apart, and a copy would send its secrets.
package struct OwnFiles: Sendable {
    let storeFolder: String
    let shownStoreFolder: String
    let configFile: String?
    /// Device and inode of the database files and the config: a hard link elsewhere is them too.
    let inodes: Set<[UInt64]>

    /// Resolved once: a batch checks thousands of files against them.
    package init(_ config: Config) {
        shownStoreFolder = config.stagingFolder
        storeFolder = Paths.resolved(config.stagingFolder)
        configFile = config.file.map(Paths.resolved)
        let database = ["outbox.db", "outbox.db-wal", "outbox.db-shm"].map { Paths.join(config.stagingFolder, $0) }
        inodes = Set((database + (config.file.map { [$0] } ?? [])).compactMap(Self.inode))
    }

    private static func inode(_ path: String) -> [UInt64]? {
        var st = Glibc.stat()
        guard stat(path, &st) == 0 else { return nil }
        return [UInt64(st.st_dev), UInt64(st.st_ino)]
    }

    /// Throws when the file at `path` (which exists) is one of them, through any link.
    func refuse(_ path: String, field: String) throws(OutboxError) {
        let file: String
        if let real = realpath(path, nil) {
            defer { free(real) }
            file = String(cString: real)
        } else {
            file = Paths.resolved(path)
        }
        if file == storeFolder || Paths.isInside(file, storeFolder) {
            throw .invalid("\(field): \(path) is in the store's folder \(shownStoreFolder); outbox does not send its own files")
        }
        if let configFile, file == configFile {
            throw .invalid("\(field): \(path) is the project's config file; outbox does not send its own files")
        }
        if let inode = Self.inode(path), inodes.contains(inode) {
            throw .invalid("\(field): \(path) is a hard link to the store's database or the config; outbox does not send its own files")
        }
    }
}
