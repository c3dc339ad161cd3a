import Glibc

/// The store's own files (its database, staged bodies) and the config are never a body:
/// `ownership: move` would take the store apart, and a copy would send its secrets.
package struct OwnFiles: Sendable {
    let storeFolder: String
    let shownStoreFolder: String
    let configFile: String?

    /// Resolved once: a batch checks thousands of files against them.
    package init(_ config: Config) {
        shownStoreFolder = config.stagingFolder
        storeFolder = Paths.resolved(config.stagingFolder)
        configFile = config.file.map(Paths.resolved)
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
    }
}
