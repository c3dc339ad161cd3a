import Foundation
import Glibc
import Testing
import TestSupport

/// A sparse file (a disk image, a database file) copied into the store, moved across
/// filesystems or copied back keeps its holes: the store takes the space of its data, not
/// of its length, and the bytes read back are the same.
struct SparseFileTests {
    static let length: Int64 = 64 << 20
    /// Data at the start, in the middle and just before the end; the rest is holes.
    static let spans: [(offset: Int64, text: String)] = [(0, "head"), (length / 2, "middle"), (length - 4096, "tail")]

    static func makeSparse(_ path: String) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        try #require(fd >= 0)
        defer { close(fd) }
        for (offset, text) in spans {
            let bytes = Array(String(repeating: text, count: 4096 / text.utf8.count).utf8)
            #expect(pwrite(fd, bytes, bytes.count, off_t(offset)) == bytes.count)
        }
        #expect(ftruncate(fd, off_t(length)) == 0)
    }

    /// The bytes the file takes on disk, and its length.
    static func usage(_ path: String) -> (allocated: Int64, length: Int64)? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return (Int64(info.st_blocks) * 512, Int64(info.st_size))
    }

    /// Whether `path` holds the bytes `makeSparse` wrote: its spans, and zeros between them.
    static func holdsTheSparseBytes(_ path: String) throws -> Bool {
        let copy = try #require(FileHandle(forReadingAtPath: path))
        defer { try? copy.close() }
        var expected = [UInt8](repeating: 0, count: Int(length))
        for (offset, text) in spans {
            let bytes = Array(String(repeating: text, count: 4096 / text.utf8.count).utf8)
            expected.replaceSubrange(Int(offset)..<Int(offset) + bytes.count, with: bytes)
        }
        return Array(copy.readDataToEndOfFile()) == expected
    }

    static func staged(_ store: String) throws -> String {
        let names = try FileManager.default.contentsOfDirectory(atPath: store + "/bodies")
        try #require(names.count == 1, "\(names)")
        return store + "/bodies/" + names[0]
    }

    @Test func aCopyIntoTheStoreKeepsTheHoles() async throws {
        let p = try CLIProject()
        let file = p.path("image.bin")
        try Self.makeSparse(file)
        let source = try #require(Self.usage(file))
        try #require(source.allocated < 8 << 20, "the filesystem here keeps holes: \(source)")
        _ = try p.write(
            "definitions/c.yaml", "key: c\nrequest:\n  method: PUT\n  url: http://127.0.0.1:9/x\n  file: image.bin\n  ownership: copy\n")
        #expect(try await p.outbox(["enqueue", "c", "--id", "c"]).status == 0)
        let staged = try Self.staged(p.storeFolder)
        let copy = try #require(Self.usage(staged))
        #expect(copy.length == Self.length)
        #expect(copy.allocated < 8 << 20, "the copy takes \(copy.allocated) bytes on disk for \(source.allocated) of data")
        #expect(try Self.holdsTheSparseBytes(staged))
        #expect(p.run("audit").status == 0)
    }

    @Test func aMoveAcrossFilesystemsAndItsReturnKeepTheHoles() async throws {
        let p = try CLIProject()
        var here = stat()
        var shm = stat()
        try #require(stat(p.root, &here) == 0 && stat("/dev/shm", &shm) == 0)
        try #require(here.st_dev != shm.st_dev, "no second filesystem at /dev/shm: a move across filesystems cannot be tested here")
        let store = "/dev/shm/outbox-test-\(UUID().uuidString.prefix(8))"
        defer { try? FileManager.default.removeItem(atPath: store) }
        _ = try p.write("config/outbox.yaml", "store: \(store)\n")
        _ = try p.write(
            "definitions/mv.yaml", "key: mv\nrequest:\n  method: PUT\n  url: http://127.0.0.1:9/x\n  file: image.bin\n  ownership: move\n")
        let file = p.path("image.bin")
        try Self.makeSparse(file)
        #expect(try await p.outbox(["enqueue", "mv", "--id", "m"]).status == 0)
        #expect(!FileManager.default.fileExists(atPath: file), "moved into the store")
        let staged = try Self.staged(store)
        let moved = try #require(Self.usage(staged))
        #expect(moved.length == Self.length)
        #expect(moved.allocated < 8 << 20, "the store's copy takes \(moved.allocated) bytes on disk")
        #expect(try Self.holdsTheSparseBytes(staged))

        // A cancel copies it back across the filesystems: sparse again at its source.
        #expect(try await p.outbox(["cancel", "m"]).status == 0)
        let back = try #require(Self.usage(file))
        #expect(back.length == Self.length)
        #expect(back.allocated < 8 << 20, "the file put back takes \(back.allocated) bytes on disk")
        #expect(try Self.holdsTheSparseBytes(file))
    }
}
