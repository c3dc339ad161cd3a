import Foundation
import OutboxModel
import OutboxStore
import Testing
import TestSupport

/// The store implementations the conformance suite runs against. Every conformance test
/// takes `StoreUnderTest.all` as its arguments, so a new implementation is one more case
/// here (how to make an empty store, how to open it again, how to remove it).
enum StoreUnderTest: String, Sendable, CaseIterable, CustomTestStringConvertible {
    case sqlite
    /// A schema of its own on the test process's throwaway PostgreSQL cluster.
    case postgres

    static let all: [StoreUnderTest] = allCases

    var testDescription: String { rawValue }

    /// Whether several runners (on several hosts) use the store at once, each holding its
    /// claims by a `Lease`. SQLite admits one runner at a time (its runner lock), so it
    /// writes no lease; the lease rules are known issues for it.
    var sharedByRunners: Bool {
        switch self {
        case .sqlite: return false
        case .postgres: return true
        }
    }

    /// A fresh, empty store of this implementation in a new temp folder.
    func make() throws -> StoreInstance { try StoreInstance(self) }

    /// Where a store lives inside the instance's temp folder.
    fileprivate func location(in folder: String) throws -> String {
        switch self {
        case .sqlite: return folder + "/store"
        case .postgres:
            // The URL, then the local folder of staged file bodies.
            return try PostgresCluster.shared().url(schema: PostgresCluster.uniqueSchema("conformance")) + "\n" + folder + "/staging"
        }
    }

    /// Opens (creating if needed) the store at `location`.
    fileprivate func open(_ location: String) throws -> any Store {
        switch self {
        case .sqlite: return try SQLiteStore(folder: location)
        case .postgres:
            let parts = location.split(separator: "\n").map(String.init)
            return try PostgresStore(url: try PostgresURL(parts[0]), folder: parts[1])
        }
    }

    /// Removes what `open` made outside the temp folder (nothing: a PostgreSQL schema goes
    /// with the throwaway cluster at the end of the test process).
    fileprivate func destroy(_ location: String) {}
}

/// One test's store: made empty in a temp folder of its own, removed when freed.
final class StoreInstance {
    let kind: StoreUnderTest
    /// The test's own temp folder; user files may live in it too.
    let folder: String
    /// The store as the test's process sees it.
    let store: any Store
    private let location: String

    fileprivate init(_ kind: StoreUnderTest) throws {
        self.kind = kind
        folder =
            FileManager.default.temporaryDirectory
            .appendingPathComponent("outbox-conformance-\(kind.rawValue)-\(UUID().uuidString.prefix(12))").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        location = try kind.location(in: folder)
        store = try kind.open(location)
    }

    /// A second store object on the same data, as another process (or host) opens it.
    func another() throws -> any Store { try kind.open(location) }

    deinit {
        kind.destroy(location)
        try? FileManager.default.removeItem(atPath: folder)
    }
}
