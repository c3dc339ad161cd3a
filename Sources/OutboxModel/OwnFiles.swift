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
        inodes = Set((database + (config.file.map { [$0] } ?? [])).compactMap { FileInfo.stat($0).map { [$0.device, $0.inode] } })
    }

    /// The last folder `refuse` resolved, with its real path: the files of a batch mostly
    /// share one, and resolving it costs a `readlink` per path segment.
    private let lastFolder = Locked<(folder: String, real: String)?>(nil)

    /// Throws when the file at `path` is one of them, through any link. `unlinked`: what
    /// `lstat` found at `path` already, when it is no link. `why` ends the message.
    package func refuse(
        _ path: String, field: String, unlinked: FileInfo? = nil, why: String = "outbox does not send its own files"
    ) throws(OutboxError) {
        let file: String
        let found: FileInfo
        if Paths.isNormal(path), path != "/", let info = unlinked ?? FileInfo.lstat(path), !info.isLink {
            // Not a link itself: its real path is its folder's real path and its own name.
            let folder = Paths.dirname(path)
            let real =
                lastFolder.withLock { $0?.folder == folder ? $0?.real : nil }
                ?? {
                    let real = Paths.resolved(folder)
                    lastFolder.withLock { $0 = (folder, real) }
                    return real
                }()
            file = Paths.join(real, Paths.basename(path))
            found = info
        } else if let real = realpath(path, nil) {
            defer { free(real) }
            file = String(cString: real)
            guard let info = FileInfo.stat(path) else { return try refuseByPath(path, file, field: field, why: why) }
            found = info
        } else {
            return try refuseByPath(path, Paths.resolved(path), field: field, why: why)
        }
        try refuseByPath(path, file, field: field, why: why)
        if inodes.contains([found.device, found.inode]) {
            throw .invalid("\(field): \(path) is a hard link to the store's database or the config; \(why)")
        }
    }

    private func refuseByPath(_ path: String, _ file: String, field: String, why: String) throws(OutboxError) {
        if file == storeFolder || Paths.isInside(file, storeFolder) {
            throw .invalid("\(field): \(path) is in the store's folder \(shownStoreFolder); \(why)")
        }
        if let configFile, file == configFile {
            throw .invalid("\(field): \(path) is the project's config file; \(why)")
        }
    }
}
