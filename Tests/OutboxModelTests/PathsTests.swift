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

    @Test func relativePathsAreJoinedToTheFolder() {
        #expect(Paths.absolute("x/../y.bin", relativeTo: "/work/p") == "/work/p/y.bin")
        #expect(Paths.absolute("./y.bin", relativeTo: "/work/p/") == "/work/p/y.bin")
        #expect(Paths.absolute("/abs/./z", relativeTo: "/work/p") == "/abs/z")
    }
}
