import Digest
import Glibc

/// Who owns a file body after enqueue.
package enum Ownership: String, Sendable, Equatable {
    case copy, move, reference
}

/// A file as recorded at staging: its identity for the same-body rule and `reference` checks.
package struct FileIdentity: Sendable, Equatable {
    package var path: String
    package var size: Int64
    package var mtimeNs: Int64
    package var inode: UInt64
    /// Permission bits at enqueue: a moved file that goes back gets them again.
    package var mode: UInt32?
    package init(path: String, size: Int64, mtimeNs: Int64, inode: UInt64, mode: UInt32? = nil) {
        self.path = path
        self.size = size
        self.mtimeNs = mtimeNs
        self.inode = inode
        self.mode = mode
    }

    /// The file at `path` as it is now: E_FILE_MISSING when it is not there, E_INVALID when it
    /// is not a regular file; `field` names it in the message. With it, what `lstat` found
    /// when the path is no link (nil for a link), for `OwnFiles.refuse`: a batch looks each
    /// path up once for both (a lookup costs about 2 µs).
    package static func of(_ path: String, field: String) throws(OutboxError) -> (identity: FileIdentity, unlinked: FileInfo?) {
        // The system reads a path up to its first NUL: it would name another file than the one given.
        guard !path.utf8.contains(0) else { throw .invalid("\(field): the path contains a NUL character") }
        let found = FileInfo.lstat(path)
        let unlinked = found.flatMap { $0.isLink ? nil : $0 }
        guard let info = unlinked ?? FileInfo.stat(path) else {
            if found != nil { throw .fileMissing("\(field): \(path) is a link to nothing (or a loop of links)") }
            if errno == EACCES { throw .fileMissing("\(field): cannot reach \(path): \(Paths.errnoMessage())") }
            throw .fileMissing("\(field): no such file \(path)")
        }
        guard info.isRegular else { throw .invalid("\(field): \(path) is not a regular file") }
        // A kernel file (in /proc or /sys) says its size is 0 and has bytes to read: it would be sent empty.
        if info.size == 0, readsPastItsSize(path) {
            throw .invalid(
                "\(field): \(path) says its size is 0 but has bytes to read (a kernel file, as in /proc or /sys): copy it to a regular file first"
            )
        }
        return (FileIdentity(path: path, size: info.size, mtimeNs: info.mtimeNs, inode: info.inode, mode: info.mode), unlinked)
    }

    /// Whether a file whose size reads 0 gives a byte all the same.
    private static func readsPastItsSize(_ path: String) -> Bool {
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var byte: UInt8 = 0
        return read(fd, &byte, 1) > 0
    }

    /// Whether a file found now is still this one (size, mtime and inode; `ownership: reference`).
    package func matches(size: Int64, mtimeNs: Int64, inode: UInt64) -> Bool {
        size == self.size && mtimeNs == self.mtimeNs && inode == self.inode
    }

    /// What a check of a referenced file says when the file is gone.
    package static func missing(_ path: String) -> String { "the referenced file \(path) is missing" }

    /// What a check of a referenced file says when it is another file now.
    package static func changed(_ path: String) -> String {
        "the referenced file \(path) changed since enqueue (size, mtime or inode differ)"
    }

    /// A file moved in by a rename that a program still holding it open wrote to.
    package static func writtenAfterMove(_ staged: String, source: String) -> String {
        "the file moved in from \(source) was written to after enqueue (\(staged): size or mtime differ); `outbox cancel` puts it back whole"
    }
}

package struct PreparedFormField: Sendable, Equatable {
    package var name: String
    package var value: String?
    package var file: FileIdentity?
    package var filename: String?
    package var contentType: String?
}

package struct PreparedPart: Sendable, Equatable {
    package var range: ByteRange
    package var url: String
    package var headers: [HeaderPair]
}

/// A header as a (name, value) pair that is Equatable.
package struct HeaderPair: Sendable, Equatable {
    package var name: String
    package var value: String
    package init(_ name: String, _ value: String) {
        self.name = name
        self.value = value
    }
}

package enum PreparedBody: Sendable, Equatable {
    case none
    case bytes([UInt8], kind: BodyKind)  // kind: data or text
    case form([PreparedFormField])
    case file(FileIdentity, Ownership)
    case parts(FileIdentity, Ownership, [PreparedPart])

    /// The file of a `file` or `parts` body.
    package var fileIdentity: FileIdentity? {
        switch self {
        case let .file(f, _), let .parts(f, _, _): return f
        default: return nil
        }
    }

    package var kind: BodyKind {
        switch self {
        case .none: return .none
        case let .bytes(_, kind): return kind
        case .form: return .form
        case .file: return .file
        case .parts: return .parts
        }
    }
}

/// A request rendered once at enqueue and checked: what the store persists, so editing a
/// definition never changes an entry already queued.
package struct PreparedRequest: Sendable {
    package var method: String
    package var url: String?
    package var headers: [(String, String)]
    package var body: PreparedBody
    package var accept: [AcceptRule]
    package var retry: RetryRules
    package var expiresInMs: Int64
    package var response: ResponseMode
    package var scope: String?
    package var cancelScopeOnError: Bool
    package var followRedirects: Int
    /// Follow a 301/302/303 of a request other than GET/HEAD as a GET without its body.
    package var redirectMethodChange = false
    /// Headers never printed, lowercased: those rendered from the environment or given by
    /// headers_command, whatever their names.
    package var secretHeaders: Set<String> = []
    /// The URL's template (or a part's) reads `env`: a webhook URL kept there, a token in the
    /// path. Shown by its origin alone (`URLCheck.shown`), as a header from `env` is redacted.
    package var secretURL = false
    /// Paths of the vars that went into a secret header (see `SecretVars`).
    package var secretVars: [[JSON]] = []
    package var wifiOnly: Bool?
    package var idempotencyKey: String?
    /// True when the key came from an explicit `Idempotency-Key` header, not minted here.
    package var idempotencyKeyIsExplicit = false
    /// The object of an `s3` request, whose credentials are read and signature made at send time.
    package var s3: S3Target?

    /// SHA-256 of the canonical body (method, URL, kind, sorted JSON, text, form, parts, file
    /// identities): equal hashes mean "the same body" for the same-id rule.
    package var bodyHash: String { SHA256.hex(canonicalBody) }

    /// The text `bodyHash` hashes. A whole file's, the common body of a batch of files, is
    /// written directly: the same bytes as the general form, without a JSON tree per entry.
    package var canonicalBody: [UInt8] {
        guard case let .file(file, _) = body, s3 == nil else { return generalCanonicalBody }
        var out: [UInt8] = []
        out.reserveCapacity(96 + file.path.utf8.count + (url?.utf8.count ?? 0))
        out += #"{"file":{"mtime_ns":"#.utf8
        out += String(file.mtimeNs).utf8
        out += #","path":"#.utf8
        JSON.appendString(file.path, to: &out)
        out += #","size":"#.utf8
        out += String(file.size).utf8
        out += #"},"kind":"file","method":"#.utf8
        JSON.appendString(method, to: &out)
        out += #","url":"#.utf8
        if let url { JSON.appendString(url, to: &out) } else { out += "null".utf8 }
        out.append(UInt8(ascii: "}"))
        return out
    }

    /// The canonical body of any request: its fields as a JSON object with sorted keys.
    package var generalCanonicalBody: [UInt8] {
        var canon: [(String, JSON)] = [("method", .string(method)), ("url", .optionalString(url)), ("kind", .string(body.kind.rawValue))]
        func fileJSON(_ f: FileIdentity) -> JSON {
            .object([("path", .string(f.path)), ("size", .int64(f.size)), ("mtime_ns", .int64(f.mtimeNs))])
        }
        switch body {
        case .none: break
        case let .bytes(bytes, kind):
            if kind == .data, let json = try? JSON.parse(String(decoding: bytes, as: UTF8.self)) {
                canon.append(("data", .string(json.serialized(sortedKeys: true))))
            } else {
                canon.append(("text", .string(SHA256.hex(bytes))))
            }
        case let .form(fields):
            canon.append(
                (
                    "form",
                    .array(
                        fields.map { f in
                            .object([
                                ("name", .string(f.name)), ("value", .optionalString(f.value)),
                                ("file", f.file.map(fileJSON) ?? .null), ("filename", .optionalString(f.filename)),
                                ("content_type", .optionalString(f.contentType)),
                            ])
                        })
                ))
        case let .file(file, _):
            canon.append(("file", fileJSON(file)))
        case let .parts(file, _, parts):
            canon.append(("file", fileJSON(file)))
            canon.append(
                (
                    "parts",
                    .array(
                        parts.map { p in
                            .object([
                                ("start", .int64(p.range.start)), ("end", .int64(p.range.end)), ("url", .string(p.url)),
                                ("headers", .array(p.headers.map { .array([.string($0.name), .string($0.value)]) })),
                            ])
                        })
                ))
        }
        // The region changes the signature, not the URL; absent otherwise, so older hashes stay equal.
        if let s3 { canon.append(("s3_region", .string(s3.region))) }
        if s3?.skipExisting == true { canon.append(("s3_skip_existing", .bool(true))) }
        return JSON.object(canon).serializedBytes(sortedKeys: true)
    }
}

/// Everything a render needs besides the definition; passed in, never read from globals.
package struct RenderInputs: Sendable {
    package var id: String
    package var vars: JSON
    package var environment: [String: String]
    /// Folder that relative file paths resolve against (the enqueue process's cwd).
    package var cwd: String
    /// Headers from `headers_command`, already run.
    package var commandHeaders: [(String, String)] = []
    package var outcome: JSON?
    /// Files an entry of the same id already moved into the store, by source path: a same-id
    /// enqueue naming one of them still means that file, though it left its folder.
    package var movedFiles: [String: FileIdentity] = [:]
    /// `environment` as the `env` root, when the caller built it once for many renders.
    package var environmentJSON: JSON?
    /// The strings of a plugin's answer, read by `PluginAnswer` references (`literal.N`).
    package var literals: JSON?
    /// The store's folder and the config, resolved once for many renders.
    package var ownFiles: OwnFiles?

    package init(id: String, vars: JSON, environment: [String: String], cwd: String) {
        self.id = id
        self.vars = vars
        self.environment = environment
        self.cwd = cwd
    }
}

/// `stat` of a path, in the units the store keeps.
package struct FileInfo: Sendable {
    package var size: Int64
    package var mtimeNs: Int64
    package var inode: UInt64
    package var isRegular: Bool
    /// Permission bits (0o7777 of st_mode).
    package var mode: UInt32 = 0
    package var device: UInt64 = 0
    /// A symbolic link itself (from `lstat`).
    package var isLink = false
}
