import Digest

/// Who owns a file body after enqueue.
public enum Ownership: String, Sendable, Equatable {
    case copy, move, reference
}

/// A file as recorded at staging: its identity for the same-body rule and `reference` checks.
public struct FileIdentity: Sendable, Equatable {
    public var path: String
    public var size: Int64
    public var mtimeNs: Int64
    public var inode: UInt64
    /// Permission bits at enqueue: a moved file that goes back gets them again.
    public var mode: UInt32?
    public init(path: String, size: Int64, mtimeNs: Int64, inode: UInt64, mode: UInt32? = nil) {
        self.path = path
        self.size = size
        self.mtimeNs = mtimeNs
        self.inode = inode
        self.mode = mode
    }

    /// Whether a file found now is still this one (size, mtime and inode; `ownership: reference`).
    public func matches(size: Int64, mtimeNs: Int64, inode: UInt64) -> Bool {
        size == self.size && mtimeNs == self.mtimeNs && inode == self.inode
    }

    /// What a check of a referenced file says when the file is gone.
    public static func missing(_ path: String) -> String { "the referenced file \(path) is missing" }

    /// What a check of a referenced file says when it is another file now.
    public static func changed(_ path: String) -> String {
        "the referenced file \(path) changed since enqueue (size, mtime or inode differ)"
    }
}

public struct PreparedFormField: Sendable, Equatable {
    public var name: String
    public var value: String?
    public var file: FileIdentity?
    public var filename: String?
    public var contentType: String?
}

public struct PreparedPart: Sendable, Equatable {
    public var range: ByteRange
    public var url: String
    public var headers: [HeaderPair]
}

/// A header as a (name, value) pair that is Equatable.
public struct HeaderPair: Sendable, Equatable {
    public var name: String
    public var value: String
    public init(_ name: String, _ value: String) {
        self.name = name
        self.value = value
    }
}

public enum PreparedBody: Sendable, Equatable {
    case none
    case bytes([UInt8], kind: BodyKind)      // kind: data or text
    case form([PreparedFormField])
    case file(FileIdentity, Ownership)
    case parts(FileIdentity, Ownership, [PreparedPart])

    /// The file of a `file` or `parts` body.
    public var fileIdentity: FileIdentity? {
        switch self {
        case let .file(f, _), let .parts(f, _, _): return f
        default: return nil
        }
    }

    public var kind: BodyKind {
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
public struct PreparedRequest: Sendable {
    public var method: String
    public var url: String?
    public var headers: [(String, String)]
    public var body: PreparedBody
    public var accept: [AcceptRule]
    public var retry: RetryRules
    public var expiresInMs: Int64
    public var response: ResponseMode
    public var scope: String?
    public var cancelScopeOnError: Bool
    public var followRedirects: Int
    public var wifiOnly: Bool?
    public var idempotencyKey: String?
    /// True when the key came from an explicit `Idempotency-Key` header, not minted here.
    public var idempotencyKeyIsExplicit = false

    /// SHA-256 of the canonical body (method, URL, kind, sorted JSON, text, form, parts, file
    /// identities): equal hashes mean "the same body" for the same-id rule.
    public var bodyHash: String {
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
            canon.append(("form", .array(fields.map { f in
                .object([("name", .string(f.name)), ("value", .optionalString(f.value)),
                         ("file", f.file.map(fileJSON) ?? .null), ("filename", .optionalString(f.filename)),
                         ("content_type", .optionalString(f.contentType))])
            })))
        case let .file(file, _):
            canon.append(("file", fileJSON(file)))
        case let .parts(file, _, parts):
            canon.append(("file", fileJSON(file)))
            canon.append(("parts", .array(parts.map { p in
                .object([("start", .int64(p.range.start)), ("end", .int64(p.range.end)), ("url", .string(p.url)),
                         ("headers", .array(p.headers.map { .array([.string($0.name), .string($0.value)]) }))])
            })))
        }
        return SHA256.hex(Array(JSON.object(canon).serialized(sortedKeys: true).utf8))
    }
}

/// Everything a render needs besides the definition; passed in, never read from globals.
public struct RenderInputs: Sendable {
    public var id: String
    public var vars: JSON
    public var environment: [String: String]
    /// Folder that relative file paths resolve against (the enqueue process's cwd).
    public var cwd: String
    /// Headers from `headers_command`, already run.
    public var commandHeaders: [(String, String)] = []
    public var outcome: JSON?
    /// Files an entry of the same id already moved into the store, by source path: a same-id
    /// enqueue naming one of them still means that file, though it left its folder.
    public var movedFiles: [String: FileIdentity] = [:]
    /// `environment` as the `env` root, when the caller built it once for many renders.
    public var environmentJSON: JSON?

    public init(id: String, vars: JSON, environment: [String: String], cwd: String) {
        self.id = id
        self.vars = vars
        self.environment = environment
        self.cwd = cwd
    }
}

/// `stat` of a path, in the units the store keeps.
public struct FileInfo: Sendable {
    public var size: Int64
    public var mtimeNs: Int64
    public var inode: UInt64
    public var isRegular: Bool
    /// Permission bits (0o7777 of st_mode).
    public var mode: UInt32 = 0
}
