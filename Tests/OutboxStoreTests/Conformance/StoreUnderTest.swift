import Foundation
import OutboxModel
import OutboxStore
import Testing

/// The store implementations the conformance suite runs against. Every conformance test
/// takes `StoreUnderTest.all` as its arguments, so a new implementation is one more case
/// here (how to make an empty store, how to open it again, how to remove it).
enum StoreUnderTest: String, Sendable, CaseIterable, CustomTestStringConvertible {
    case sqlite

    static let all: [StoreUnderTest] = allCases

    var testDescription: String { rawValue }

    /// Whether several runners (on several hosts) use the store at once, each holding its
    /// claims by a `Lease`. SQLite admits one runner at a time (its runner lock), so it
    /// writes no lease; the lease rules are known issues for it.
    var sharedByRunners: Bool {
        switch self {
        case .sqlite: return false
        }
    }

    /// A fresh, empty store of this implementation in a new temp folder.
    func make() throws -> StoreInstance { try StoreInstance(self) }

    /// Where a store lives inside the instance's temp folder.
    fileprivate func location(in folder: String) -> String {
        switch self {
        case .sqlite: return folder + "/store"
        }
    }

    /// Opens (creating if needed) the store at `location`.
    fileprivate func open(_ location: String) throws -> any Store {
        switch self {
        case .sqlite: return try SQLiteStore(folder: location)
        }
    }

    /// Removes what `open` made outside the temp folder (nothing, for SQLite).
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
        location = kind.location(in: folder)
        store = try kind.open(location)
    }

    /// A second store object on the same data, as another process (or host) opens it.
    func another() throws -> any Store { try kind.open(location) }

    deinit {
        kind.destroy(location)
        try? FileManager.default.removeItem(atPath: folder)
    }
}
