import Glibc
import OutboxEnqueue
import OutboxModel
import OutboxStore

/// `outbox enqueue KEY --from-dir DIR`: one entry per regular file of a folder tree, all in
/// one transaction (all enqueued or none), for batch migrations.
///
/// Each file's vars are `path` (absolute), `relative_path` (from DIR, `/`-separated), `name`
/// and `size`, merged over the object given with `--vars`. Symbolic links are never followed
/// (a link to a file or a folder is skipped), nor are sockets, FIFOs or devices; hidden
/// files and folders are included, since a migration should not silently leave data behind.
/// Files are enqueued in byte order of their relative paths.
enum EnqueueDirectory {
    static let option = OptionSpec(
        name: "from-dir", valueName: "DIR",
        help: "one entry per file under DIR (vars: path, relative_path, name, size); all or nothing")
    static let idTemplateOption = OptionSpec(
        name: "id-template", valueName: "T",
        help: "with --from-dir: each entry's id, a template over its vars (default: a new UUID)", completes: .nothing)

    /// A regular file found under the folder.
    struct FoundFile: Equatable {
        var path: String
        var relativePath: String
        var name: String
        var size: Int64
    }

    /// What a walk found, and what it left out (symbolic links, special files).
    struct Walk {
        var files: [FoundFile] = []
        var skippedLinks: [String] = []
        var skippedSpecial: [String] = []
    }

    /// Lists the regular files under `root` without following symbolic links.
    static func walk(_ root: String) throws(OutboxError) -> Walk {
        var st = Glibc.stat()
        guard stat(root, &st) == 0 else {
            if errno == ENOENT { throw .fileMissing("--from-dir: no such folder \(root)") }
            throw .unreadable("--from-dir: cannot read \(root): \(Paths.errnoMessage())", errno: errno)
        }
        guard (st.st_mode & S_IFMT) == S_IFDIR else { throw .invalid("--from-dir: \(root) is not a folder") }
        var result = Walk()
        // Depth-first with an explicit stack, so deep trees cannot overflow the call stack.
        var folders: [String] = [""]
        while let relativeFolder = folders.popLast() {
            let folder = relativeFolder.isEmpty ? root : Paths.join(root, relativeFolder)
            guard let (names, notUTF8) = Paths.listNames(folder) else {
                throw .unreadable("--from-dir: cannot read the folder \(folder): \(Paths.errnoMessage())", errno: errno)
            }
            // Refused rather than skipped: the batch must not quietly leave a file behind.
            if let bad = notUTF8.first {
                throw .invalid(
                    "--from-dir: the name \(Paths.join(folder, bad)) is not valid UTF-8 (\(notUTF8.count) such name\(notUTF8.count == 1 ? "" : "s") in that folder); rename it"
                )
            }
            for name in names {
                let relative = relativeFolder.isEmpty ? name : relativeFolder + "/" + name
                let path = Paths.join(root, relative)
                var info = Glibc.stat()
                guard lstat(path, &info) == 0 else {
                    throw .unreadable("--from-dir: cannot stat \(path): \(Paths.errnoMessage())", errno: errno)
                }
                switch info.st_mode & S_IFMT {
                case S_IFREG:
                    result.files.append(FoundFile(path: path, relativePath: relative, name: name, size: Int64(info.st_size)))
                case S_IFDIR:
                    folders.append(relative)
                case S_IFLNK:
                    result.skippedLinks.append(relative)
                default:
                    result.skippedSpecial.append(relative)
                }
            }
        }
        result.files.sort { Array($0.relativePath.utf8).lexicographicallyPrecedes(Array($1.relativePath.utf8)) }
        return result
    }

    /// The vars of one file: the base object with the file's own fields over it.
    static func vars(for file: FoundFile, base: JSON) -> JSON {
        var vars: JSON = base.isNull ? .object([]) : base
        vars.set("path", .string(file.path))
        vars.set("relative_path", .string(file.relativePath))
        vars.set("name", .string(file.name))
        vars.set("size", .int64(file.size))
        return vars
    }

    static func run(_ i: inout Invocation, key: String, folder: String, now: Int64) throws(OutboxError) -> Int32 {
        for conflicting in ["from", "id"] where i.args.flag(conflicting) {
            throw .usage("--from-dir cannot be combined with --\(conflicting)")
        }
        let base = try EnqueueCommand.readVars(i)
        switch base {
        case .object, .null: break
        default: throw .invalid("--vars with --from-dir must be a JSON object (the base of every file's vars)")
        }
        let root = Paths.normalize(Paths.absolute(folder, relativeTo: try i.cwd))
        let walk = try walk(root)
        let hold = try EnqueueCommand.holdUntil(
            delay: i.args.value("delay"), notBefore: i.args.value("not-before"), now: now, names: ("--delay", "--not-before"))
        let expiresAt = try i.args.value("expires-at").map { t throws(OutboxError) in try TimeText.parse(t, field: "--expires-at") }
        let idTemplate = i.args.value("id-template")
        let project = try i.project()
        let definition = try project.definition(key)
        let factory = try EnqueueCommand.factory(project, i)
        var seen: [String: String] = [:]
        let environment = RequestBuilder.environmentJSON(i.environment)
        let skipped = walk.skippedLinks.count + walk.skippedSpecial.count
        if skipped > 0 {
            // Names from outside: a control character in one is shown as an escape, never acted on.
            let first = (walk.skippedLinks + walk.skippedSpecial).sorted().prefix(3).map(TerminalText.cell).joined(separator: ", ")
            i.console.err(
                "outbox: skipped \(walk.skippedLinks.count) symbolic link(s) and \(walk.skippedSpecial.count) special file(s) under \(root) (\(first)\(skipped > 3 ? ", ..." : ""))"
            )
        }
        if walk.files.isEmpty {
            i.console.err("outbox: no files under \(root)")
            if i.json { i.console.out("[]") }
            return 0
        }
        // The files, a batch at a time, rendered many at a time (see `LineRenderer`).
        var next = 0
        func readBatch() -> [LineToRender] {
            let batch = walk.files[next..<min(next + LineRenderer.batch, walk.files.count)]
            next = batch.endIndex
            return batch.enumerated().map { offset, file in
                var line = LineToRender(
                    number: batch.startIndex + offset + 1, at: file.path, vars: vars(for: file, base: base), id: nil, notBefore: hold,
                    movedFiles: [:])
                // An error found here is given in the file's turn, after those of the files before it.
                do throws(OutboxError) {
                    if let idTemplate {
                        var inputs = RenderInputs(id: "", vars: line.vars, environment: i.environment, cwd: try i.cwd)
                        inputs.environmentJSON = environment
                        let rendered = try Template.render(
                            idTemplate, context: RequestBuilder.context(inputs), mode: .value, field: "--id-template")
                        let text = rendered.stringValue ?? rendered.serialized()
                        if let problem = Identifiers.validateUserID(text) { throw OutboxError.invalid("--id-template: \(problem)") }
                        if let other = seen[text] { throw OutboxError.invalid("--id-template gives the id \"\(text)\" to \(other) too") }
                        seen[text] = file.relativePath
                        line.id = text
                    }
                    line.movedFiles = try EnqueueCommand.movedFiles(project, id: line.id)
                } catch {
                    line.failure = error
                }
                return line
            }
        }
        func checked(_ files: [LineToRender], _ rendered: [Result<NewEntry, OutboxError>]) throws(OutboxError) -> [NewEntry] {
            var entries: [NewEntry] = []
            for (file, result) in zip(files, rendered) {
                do throws(OutboxError) {
                    var entry = try result.get()
                    try EnqueueCommand.skipExisting(&entry, key: key, i)
                    entries.append(entry)
                } catch {
                    throw OutboxError(error.code, "\(file.at): \(error.message)")
                }
            }
            return entries
        }
        let renderer = LineRenderer(factory: factory, definition: definition, expiresAt: expiresAt)
        let results = try renderer.enqueue(into: project, streaming: true, now: now, read: readBatch, check: checked)
        if i.json {
            i.console.out(
                JSON.array(
                    zip(results, walk.files).map { result, file in
                        .object([("id", .string(result.id)), ("path", .string(file.path))])
                    }
                ).serialized())
        } else {
            i.console.out(results.map(\.id).joined(separator: "\n"))
        }
        return 0
    }
}
