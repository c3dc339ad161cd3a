import OutboxModel
import Testing

struct PathsTests {
    /// Paths already normal come back as they are (the fast path); the others are folded.
    @Test(arguments: [
        ("/", "/"), ("/a", "/a"), ("/a/b.bin", "/a/b.bin"), ("/a/.hidden/...", "/a/.hidden/..."), ("/a/..b/b..", "/a/..b/b.."),
        ("/a/", "/a"), ("//a//b", "/a/b"), ("/a/./b", "/a/b"), ("/a/.", "/a"), ("/a/b/..", "/a"), ("/..", "/"),
        ("/a/../../b", "/b"), ("/./", "/"), ("/a/b/../c/./d/", "/a/c/d"),
    ])
    func normalizeFoldsDotsAndSlashes(_ path: String, _ expected: String) {
        #expect(Paths.normalize(path) == expected)
    }

    /// A path is split at its last slash byte, as the kernel reads it: a slash followed by a
    /// combining mark is still a slash (one `Character`, which a search by `Character` missed).
    @Test(arguments: [
        ("/a/b.bin", "/a", "b.bin"), ("b.bin", ".", "b.bin"), ("/b.bin", "/", "b.bin"), ("/a/", "/a", ""),
        ("/é/ü.bin", "/é", "ü.bin"), ("/a/b/\u{301}c", "/a/b", "\u{301}c"), ("/a\u{301}/b", "/a\u{301}", "b"),
    ])
    func dirnameAndBasenameSplitAtTheLastSlashByte(_ path: String, _ folder: String, _ name: String) {
        #expect(Array(Paths.dirname(path).unicodeScalars) == Array(folder.unicodeScalars))
        #expect(Array(Paths.basename(path).unicodeScalars) == Array(name.unicodeScalars))
    }

    @Test func relativePathsAreJoinedToTheFolder() {
        #expect(Paths.absolute("x/../y.bin", relativeTo: "/work/p") == "/work/p/y.bin")
        #expect(Paths.absolute("./y.bin", relativeTo: "/work/p/") == "/work/p/y.bin")
        #expect(Paths.absolute("/abs/./z", relativeTo: "/work/p") == "/abs/z")
    }
}
