import Glibc
import OutboxProcess
import YAML

/// Strict reading of a YAML tree into typed values, collecting every problem with its mark.
///
/// Each accessor reports a diagnostic and returns nil on a wrong type, so one pass over a
/// file reports all of its errors, not only the first.
struct YAMLReader {
    let path: String
    var diagnostics: [Diagnostic] = []
    /// Every command read, with where it was written, so `check` can look for its program.
    var commands: [CommandRef] = []

    init(path: String) { self.path = path }

    mutating func error(_ mark: Mark, _ message: String) {
        diagnostics.append(Diagnostic(path: path, line: mark.line, column: mark.column, message: message))
    }

    /// Reports each tag outside the core schema's (`!!binary`, `!custom`): read as if it were
    /// not there, it would quietly change what a value means.
    mutating func refuseUnknownTags(_ root: YAMLNode) {
        let known: Set<String> = ["!!str", "!!int", "!!float", "!!bool", "!!null", "!!map", "!!seq", "!"]
        var stack = [root]
        while let node = stack.popLast() {
            if let tag = node.tag, !known.contains(tag) {
                error(node.mark, "tag \(tag) is not supported (only !!str, !!int, !!float, !!bool, !!null, !!map and !!seq)")
            }
            switch node.kind {
            case .scalar: break
            case let .sequence(items): stack += items
            case let .mapping(pairs): for pair in pairs { stack += [pair.key, pair.value] }
            }
        }
    }

    /// The diagnostics by position in the file (checks run in code order, people read top down).
    var diagnosticsInSourceOrder: [Diagnostic] {
        diagnostics.enumerated().sorted { a, b in
            (a.element.line, a.element.column, a.offset) < (b.element.line, b.element.column, b.offset)
        }.map(\.element)
    }

    /// The members of a mapping node with names the field table does not list reported;
    /// `context` names the section in messages ("request", "retry.backoff").
    mutating func fields(_ node: YAMLNode, _ mapping: FieldMapping, context: String) -> [String: YAMLNode]? {
        fields(node, allowed: mapping.names, context: context)
    }

    private mutating func fields(_ node: YAMLNode, allowed: [String], context: String) -> [String: YAMLNode]? {
        guard case let .mapping(pairs) = node.kind else {
            error(node.mark, "\(context) must be a mapping, not \(Self.describe(node))")
            return nil
        }
        var result: [String: YAMLNode] = [:]
        for pair in pairs {
            guard case let .scalar(name, _) = pair.key.kind else {
                error(pair.key.mark, "keys in \(context) must be names")
                continue
            }
            guard allowed.contains(name) else {
                let known = allowed.joined(separator: ", ")
                error(pair.key.mark, "unknown field \"\(name)\" in \(context) (known fields: \(known))")
                continue
            }
            result[name] = pair.value
        }
        return result
    }

    static func describe(_ node: YAMLNode) -> String {
        switch node.kind {
        case .mapping: return "a mapping"
        case .sequence: return "a list"
        case .scalar:
            switch node.scalar {
            case .null?: return "null"
            case .bool?: return "a boolean"
            case .int?: return "a number"
            // What was written names it: "must be a whole number, not 16.0", "a number, not .nan".
            case .float?:
                if case let .scalar(raw, _) = node.kind { return String(raw.prefix(40)) }
                return "a number"
            default: return "a string"
            }
        }
    }

    mutating func string(_ node: YAMLNode?, _ field: String) -> String? {
        guard let node else { return nil }
        switch node.scalar {
        case let .string(s)?: return s
        case .int?, .float(_?)?:
            // As written: a number where text goes keeps its digits (`01234` stays, `0x10` is not 16).
            if case let .scalar(raw, _) = node.kind { return raw }
            return nil
        default:
            error(node.mark, "\(field) must be a string, not \(Self.describe(node))")
            return nil
        }
    }

    /// A path, made absolute against `base`: an empty one or one starting with `~` (no shell
    /// expands it here) would quietly name the project root or a folder called `~`.
    mutating func path(_ node: YAMLNode?, _ field: String, relativeTo base: String) -> String? {
        guard let node, let text = string(node, field) else { return nil }
        if text.isEmpty {
            error(node.mark, "\(field) is empty: give a path")
            return nil
        }
        if text.utf8.contains(0) {
            error(node.mark, "\(field) holds a NUL character, which no path can")
            return nil
        }
        if text.hasPrefix("~") {
            error(node.mark, "\(field): \(Units.quoted(text, limit: 40)) starts with ~, which is not expanded here; give the full path")
            return nil
        }
        return Paths.absolute(text, relativeTo: base)
    }

    /// A string that may also be written as a number in YAML (for example an id).
    mutating func int(_ node: YAMLNode?, _ field: String, range: ClosedRange<Int64> = 0...Int64.max) -> Int64? {
        guard let node else { return nil }
        // A whole number beyond 64 bits reads as a float that keeps its digits: out of range too.
        if case let .float(text?)? = node.scalar, !text.isEmpty,
            text.drop(while: { $0 == "-" }).utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 })
        {
            error(node.mark, "\(field) must be between \(range.lowerBound) and \(range.upperBound), not \(text)")
            return nil
        }
        guard case let .int(text)? = node.scalar, let value = Int64(text) else {
            error(node.mark, "\(field) must be a whole number, not \(Self.describe(node))")
            return nil
        }
        guard range.contains(value) else {
            error(node.mark, "\(field) must be between \(range.lowerBound) and \(range.upperBound), not \(value)")
            return nil
        }
        return value
    }

    mutating func double(_ node: YAMLNode?, _ field: String, range: ClosedRange<Double>) -> Double? {
        guard let node else { return nil }
        let value: Double?
        switch node.scalar {
        case let .int(text)?: value = Double(text)
        case let .float(text?)?: value = Double(text)
        default: value = nil
        }
        guard let value else {
            error(node.mark, "\(field) must be a number, not \(Self.describe(node))")
            return nil
        }
        guard range.contains(value) else {
            error(node.mark, "\(field) must be between \(range.lowerBound) and \(range.upperBound), not \(value)")
            return nil
        }
        return value
    }

    mutating func bool(_ node: YAMLNode?, _ field: String) -> Bool? {
        guard let node else { return nil }
        guard case let .bool(b)? = node.scalar else {
            var hint = ""
            if case let .string(s)? = node.scalar, ["yes", "no", "on", "off", "y", "n"].contains(s.lowercased()) {
                hint = " (YAML 1.2: write true or false)"
            }
            error(node.mark, "\(field) must be true or false, not \(Self.describe(node))\(hint)")
            return nil
        }
        return b
    }

    mutating func duration(_ node: YAMLNode?, _ field: String) -> Int64? {
        guard let node else { return nil }
        guard let text = string(node, field) else { return nil }
        do {
            return try Units.parseDuration(text)
        } catch {
            self.error(node.mark, "\(field): \(error.message)")
            return nil
        }
    }

    mutating func size(_ node: YAMLNode?, _ field: String) -> Int64? {
        guard let node else { return nil }
        if case let .int(text)? = node.scalar, let value = Int64(text), value >= 0 { return value }
        guard let text = string(node, field) else { return nil }
        do {
            return try Units.parseSize(text)
        } catch {
            self.error(node.mark, "\(field): \(error.message)")
            return nil
        }
    }

    /// A hook or plugin command: a string for `/bin/sh -c`, or a list run directly.
    mutating func command(_ node: YAMLNode?, _ field: String) -> CommandSpec? {
        guard let node else { return nil }
        switch node.kind {
        case .scalar:
            if case .null? = node.scalar { return nil }
            guard let text = string(node, field) else { return nil }
            guard !text.trimmingSpaces.isEmpty else {
                error(node.mark, "\(field) is an empty command")
                return nil
            }
            commands.append(CommandRef(field: field, command: .shell(text), path: path, mark: node.mark))
            return .shell(text)
        case let .sequence(items):
            var argv: [String] = []
            for item in items {
                guard let s = string(item, "\(field) items") else { return nil }
                argv.append(s)
            }
            guard !argv.isEmpty else {
                error(node.mark, "\(field) is an empty command")
                return nil
            }
            // Arguments may be empty; the program's name may not (exec would fail at every run).
            guard !argv[0].trimmingSpaces.isEmpty else {
                error(items[0].mark, "\(field): the program name (the list's first item) is empty")
                return nil
            }
            commands.append(CommandRef(field: field, command: .argv(argv), path: path, mark: node.mark))
            return .argv(argv)
        case .mapping:
            error(node.mark, "\(field) must be a command string or a list of arguments")
            return nil
        }
    }

    /// Any YAML value as JSON (YAML 1.2 core schema), for templates and literal data.
    mutating func json(_ node: YAMLNode, _ field: String) -> JSON? {
        switch node.kind {
        case .scalar:
            switch node.scalar {
            case .null?, nil: return .null
            case let .bool(b)?: return .bool(b)
            case let .int(text)?: return .number(text)
            case let .float(text?)?: return .number(text)
            case .float(nil)?:
                error(node.mark, "\(field): .inf and .nan cannot be sent as JSON")
                return nil
            case let .string(s)?: return .string(s)
            }
        case let .sequence(items):
            var out: [JSON] = []
            for (i, item) in items.enumerated() {
                guard let value = json(item, "\(field)[\(i)]") else { return nil }
                out.append(value)
            }
            return .array(out)
        case let .mapping(pairs):
            var out: [(String, JSON)] = []
            for pair in pairs {
                guard let key = string(pair.key, "keys of \(field)") else { return nil }
                guard let value = json(pair.value, "\(field).\(key)") else { return nil }
                out.append((key, value))
            }
            return .object(out)
        }
    }
}

extension String {
    package var trimmingSpaces: String {
        var s = Substring(self)
        while let c = s.first, c == " " || c == "\t" || c == "\n" || c == "\r" { s.removeFirst() }
        while let c = s.last, c == " " || c == "\t" || c == "\n" || c == "\r" { s.removeLast() }
        return String(s)
    }
}

/// A command written in a config or definition file (a hook or a plugin) and where.
package struct CommandRef: Sendable, Equatable {
    package var field: String
    package var command: CommandSpec
    package var path: String
    package var mark: Mark

    /// `path` and `mark` say where it was written; a command met at run time has neither.
    package init(field: String, command: CommandSpec, path: String = "", mark: Mark = Mark(line: 0, column: 0)) {
        self.field = field
        self.command = command
        self.path = path
        self.mark = mark
    }

    /// The program a person would expect to run: the first argument, or for a shell
    /// string its first word when that is a path (`./hooks/x.sh arg`) or a plain name the
    /// shell looks up in PATH; nil when the first word is a builtin, a keyword, an
    /// assignment or anything the shell expands.
    package var program: String? {
        switch command {
        case let .argv(argv): return argv.first
        case let .shell(line):
            let first = line.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).first.map(String.init) ?? ""
            if first.contains("/") { return first.contains(where: { "$`'\"*?[<>|;&(){}".contains($0) }) ? nil : first }
            let plain = !first.isEmpty && first.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || "-_.+".contains($0)) }
            return plain && !Self.shellWords.contains(first) ? first : nil
        }
    }

    /// Builtins and reserved words of a POSIX shell: found without PATH.
    static let shellWords: Set<String> = [
        ".", ":", "[", "alias", "bg", "break", "case", "cd", "command", "continue", "do", "done", "echo", "elif", "else",
        "esac", "eval", "exec", "exit", "export", "false", "fc", "fg", "fi", "for", "getopts", "hash", "if", "in", "jobs",
        "kill", "local", "printf", "pwd", "read", "readonly", "return", "set", "shift", "test", "then", "times", "trap",
        "true", "type", "ulimit", "umask", "unalias", "unset", "until", "wait", "while",
    ]

    /// Why the program cannot run (missing, not executable, not found in `searchPath`), or nil.
    /// A program with a `/` resolves against `root`; one without is looked up in `searchPath`.
    package func problem(root: String, searchPath: String) -> String? {
        programProblem(root: root, searchPath: searchPath).map { "\(field): \($0)" }
    }

    /// Why a shell said it could not run this command (exit 126 or 127), when the file shows
    /// it: a missing `#!` interpreter, which the shell reports as the script not found.
    package func whyNotRun(status: Int32?, root: String, searchPath: String) -> String? {
        guard let status, [126, 127].contains(status) else { return nil }
        return programProblem(root: root, searchPath: searchPath)
    }

    /// `problem` without the field's name in front.
    package func programProblem(root: String, searchPath: String) -> String? {
        let words: [String]
        switch command {
        case let .argv(argv): words = argv
        case let .shell(line): words = [line]
        }
        if let templated = words.first(where: TemplateVocabulary.mentionsARoot) {
            // Only hooks get OUTBOX_* variables; a plugin gets its input as JSON on stdin alone.
            let hook = field.hasPrefix("on_")
            let advice = hook ? "a hook gets vars on stdin and in OUTBOX_* variables" : "a plugin gets its input as JSON on stdin"
            return "\(Units.quoted(templated, limit: 60)) is run as written, not rendered: \(advice)"
        }
        guard let program, !program.isEmpty else { return nil }
        if program.contains("/") {
            let full = program.hasPrefix("/") ? program : Paths.join(root, program)
            guard Paths.exists(full) else { return "\(program) does not exist" }
            guard Paths.isRegularFile(full), access(full, X_OK) == 0 else { return "\(program) is not an executable file" }
            let direct: Bool
            if case .argv = command { direct = true } else { direct = false }
            if let problem = ProcessRunner.execProblem(full, runDirectly: direct, folder: root) { return "\(program) \(problem)" }
            return scriptProblem(root: root)
        }
        for folder in searchPath.split(separator: ":") where !folder.isEmpty {
            let candidate = Paths.join(String(folder), program)
            if Paths.isRegularFile(candidate), access(candidate, X_OK) == 0 { return scriptProblem(root: root) }
        }
        return "\(program) is not found in PATH"
    }

    /// An interpreter given a script (`[python3, hooks/done.py]`): a missing script fails every
    /// run at the interpreter, though the program is there. An option first (`-c`, `-m`)
    /// names no file, and is left alone.
    func scriptProblem(root: String) -> String? {
        guard case let .argv(argv) = command, argv.count > 1 else { return nil }
        let name = Paths.basename(argv[0])
        let versioned = name.hasPrefix("python") && name.dropFirst(6).allSatisfy { $0.isNumber || $0 == "." }
        guard versioned || Self.interpreters.contains(name), !argv[1].hasPrefix("-") else { return nil }
        let script = argv[1]
        let full = script.hasPrefix("/") ? script : Paths.join(root, script)
        return Paths.isRegularFile(full) ? nil : "\(script), the script given to \(name), does not exist"
    }

    /// Programs whose first argument, when not an option, is a script file they read.
    static let interpreters: Set<String> = ["sh", "bash", "dash", "zsh", "ksh", "perl", "ruby", "node", "php"]
}
