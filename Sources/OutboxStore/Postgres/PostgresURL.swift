import OutboxModel

/// A `store: postgres://user:password@host:port/db?schema=NAME` value: the libpq URI to
/// connect with, the schema that keeps one project's tables apart, and the URL as messages
/// may show it (without the password).
package struct PostgresURL: Sendable, Equatable {
    /// What libpq is given: the URL without `schema`, with a connect timeout by default.
    package var connectionURI: String
    package var schema: String
    /// The server, database and schema, without the user, password and options: two URLs
    /// naming the same store have the same place.
    package var place: String
    /// The URL with its password replaced by `***`.
    package var redacted: String
    /// The password as written (and percent-decoded), for `scrub`.
    private var passwords: [String] = []

    /// Whether a store value names a PostgreSQL server rather than a folder.
    package static func isPostgres(_ text: String) -> Bool {
        text.hasPrefix("postgres://") || text.hasPrefix("postgresql://")
    }

    /// Parses a store URL; E_CONFIG naming what is wrong (never the password).
    package init(_ text: String) throws(OutboxError) {
        guard Self.isPostgres(text), let colon = text.firstIndex(of: ":") else {
            throw OutboxError(.config, "store: \(Units.quoted(text, limit: 40)) is not a postgres:// URL")
        }
        let scheme = String(text[..<colon])
        var rest = String(text.dropFirst(scheme.count + 3))
        // libpq ends the user and password at the first '@', '/', '?' or '#': one written raw
        // would be read in part as the host or the query, and quoted back in its errors.
        if let at = rest.lastIndex(of: "@"), rest[..<at].contains(where: { "@/?#".contains($0) }) {
            throw OutboxError(
                .config,
                "store: the PostgreSQL URL's user or password holds a raw \"@\", \"/\", \"?\" or \"#\": write them as %40, %2F, %3F and %23"
            )
        }
        var query: [(String, String)] = []
        if let q = rest.firstIndex(of: "?") {
            for item in rest[rest.index(after: q)...].split(separator: "&") where !item.isEmpty {
                let pair = item.split(separator: "=", maxSplits: 1).map(String.init)
                query.append((pair[0], pair.count > 1 ? pair[1] : ""))
            }
            rest = String(rest[..<q])
        }
        // The password sits between the user's ':' and the '@' of the authority.
        let authorityEnd = rest.firstIndex(of: "/") ?? rest.endIndex
        var shown = rest
        var secrets: [String] = []
        if let at = rest[..<authorityEnd].lastIndex(of: "@"), let colon = rest[..<at].firstIndex(of: ":") {
            shown = String(rest[...colon]) + "***" + String(rest[at...])
            secrets.append(String(rest[rest.index(after: colon)..<at]))
        }
        secrets += query.filter { $0.0 == "password" }.map(\.1)
        passwords = (secrets + secrets.map(URLCheck.percentDecoded)).filter { !$0.isEmpty }
        let schema = query.first { $0.0 == "schema" }?.1 ?? "outbox"
        guard Self.isIdentifier(schema) else {
            throw OutboxError(
                .config,
                "store: schema \(Units.quoted(schema, limit: 70)) must be 1 to \(Self.maxSchemaLength) lowercase letters, digits or _ (not starting with a digit)"
            )
        }
        // PostgreSQL keeps `pg_` names for itself and refuses to create them.
        guard !schema.hasPrefix("pg_") else {
            throw OutboxError(.config, "store: schema \"\(schema)\" starts with pg_, which PostgreSQL keeps for its own schemas")
        }
        self.schema = schema
        let hostStart = rest[..<authorityEnd].lastIndex(of: "@").map { rest.index(after: $0) } ?? rest.startIndex
        // libpq would take an IPv6 host left open for a name it cannot reach (74, with its own options quoted).
        let host = rest[hostStart..<authorityEnd]
        if host.hasPrefix("["), !host.contains("]") {
            throw OutboxError(
                .config, "store: the host \(Units.quoted(host, limit: 60)) opens an IPv6 address with [ and never closes it with ]")
        }
        place = String(rest[hostStart...]) + "?schema=" + schema
        var kept = query.filter { $0.0 != "schema" }
        if !kept.contains(where: { $0.0 == "connect_timeout" }) { kept.append(("connect_timeout", "10")) }
        if !kept.contains(where: { $0.0 == "application_name" }) { kept.append(("application_name", "outbox")) }
        // A server that vanished without closing the connection (a cut link, a dead host) is
        // noticed within about half a minute instead of a statement waiting for ever.
        for (name, value) in [
            ("keepalives_idle", "10"), ("keepalives_interval", "5"), ("keepalives_count", "3"), ("tcp_user_timeout", "30000"),
        ]
        where !kept.contains(where: { $0.0 == name }) {
            kept.append((name, value))
        }
        connectionURI = "\(scheme)://\(rest)?" + kept.map { "\($0.0)=\($0.1)" }.joined(separator: "&")
        redacted = "\(scheme)://\(shown)?schema=\(schema)"
    }

    /// A message from libpq with the password taken out of what it quotes (`"..."`: the parts
    /// of a URL it cannot read). Its own words stay whole: a password replaced everywhere
    /// would be spelled out by the words it cut ("***word authentication failed").
    package func scrub(_ message: String) -> String {
        guard !passwords.isEmpty else { return message }
        var pieces = message.split(separator: "\"", omittingEmptySubsequences: false).map(String.init)
        for i in stride(from: 1, to: pieces.count, by: 2) {
            for secret in passwords.sorted(by: { $0.count > $1.count }) { pieces[i] = pieces[i].replacing(secret, with: "***") }
        }
        return pieces.joined(separator: "\"")
    }

    /// PostgreSQL names are at most 63 bytes, and the schema's wake-up channel is `outbox_`
    /// and the schema name.
    static let maxSchemaLength = 63 - "outbox_".utf8.count

    static func isIdentifier(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        guard (1...maxSchemaLength).contains(bytes.count), !(UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[0]) else { return false }
        return bytes.allSatisfy { b in
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(b) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(b)
                || b == UInt8(ascii: "_")
        }
    }

    /// A stable number for the schema: the key of the advisory locks that serialize its writers.
    var lockKey: Int32 {
        var hash: UInt32 = 2_166_136_261
        for b in schema.utf8 { hash = (hash ^ UInt32(b)) &* 16_777_619 }
        return Int32(bitPattern: hash)
    }
}
