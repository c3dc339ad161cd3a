import Glibc
import OutboxEnqueue
import OutboxModel

/// One line of an `enqueue --from` file (or one file of `--from-dir`), checked and ready
/// for its render.
struct LineToRender: Sendable {
    var number: Int
    /// `FILE:LINE` (the file's path for `--from-dir`), which every error about it starts with.
    var at: String
    var vars: JSON
    var id: String?
    var notBefore: Int64?
    var movedFiles: [String: FileIdentity]
    /// An error found before the render (a bad delay), given in the line's turn.
    var failure: OutboxError?
}

/// Renders the lines of a `--from` file (or the files of `--from-dir`) into entries, many
/// at a time: templates, file checks and hashing are most of an enqueue's work for each
/// line, and with no plugin to run they share nothing, so half of each batch renders on a
/// second thread.
struct LineRenderer {
    /// Lines rendered together: enough to be worth a thread, few enough to keep memory flat.
    static let batch = 1024
    /// Fewer lines than this render on the calling thread alone.
    static let parallelFrom = 64

    let factory: EntryFactory
    let definition: Definition
    let expiresAt: Int64?
    /// Plugins are run one at a time, in line order, as a user reading the file expects.
    let parallel: Bool

    init(factory: EntryFactory, definition: Definition, expiresAt: Int64?) {
        self.factory = factory
        self.definition = definition
        self.expiresAt = expiresAt
        parallel =
            factory.config.headersCommand == nil && definition.requestCommand == nil
            && sysconf(Int32(_SC_NPROCESSORS_ONLN)) > 1
    }

    /// Each line's entry or error, in the order of `lines`.
    func render(_ lines: [LineToRender]) -> [Result<NewEntry, OutboxError>] {
        guard parallel, lines.count >= Self.parallelFrom else { return lines.map(renderLine) }
        // The first line renders before the second thread starts: the tables a render makes
        // on first use (a template's parse, JSON's escapes) are then made here, and the
        // thread's start hands them over; made by both at once, ThreadSanitizer, which
        // cannot see how Swift guards them, would report it.
        var first = [renderLine(lines[0])]
        let half = lines.count / 2
        let second = Locked<[Result<NewEntry, OutboxError>]>([])
        // One line at a time there: `render(_:)` again would split its half, and so on down.
        let work = SendableRender(renderer: self, lines: Array(lines[half...]), split: false)
        guard case let .success(thread) = Threads.start(detached: false, { second.withLock { $0 = work.run() } }) else {
            return first + lines[1...].map(renderLine)
        }
        first.reserveCapacity(lines.count)
        for line in lines[1..<half] { first.append(renderLine(line)) }
        pthread_join(thread, nil)
        // Appended in place: `first + second` would copy every render of both halves.
        second.withLock { first.append(contentsOf: $0) }
        return first
    }

    fileprivate func renderLine(_ line: LineToRender) -> Result<NewEntry, OutboxError> {
        if let failure = line.failure { return .failure(failure) }
        do throws(OutboxError) {
            var entry = try factory.make(
                definition: definition, vars: line.vars, id: line.id, notBefore: line.notBefore,
                expiresAt: expiresAt, movedFiles: line.movedFiles)
            // Made here, on the batch's two threads, not one by one in the write transaction.
            entry.encode()
            return .success(entry)
        } catch {
            return .failure(error)
        }
    }
}

extension LineRenderer {
    /// Renders the batches `read` gives (empty after the last) and enqueues their entries in
    /// one transaction; `check` turns a batch's renders into its entries, or throws the first
    /// error. The first batch renders here (the tables a render makes on first use are then
    /// made before any other thread renders); each later one renders while the one before it
    /// is written and the lines after it are read.
    ///
    /// With `streaming` (input read at disk speed), each batch is written as it comes, inside
    /// the transaction. Not when the first batch's entries copy or move files in (copies may
    /// take long; the lines of one definition take files in alike): then, as for input that
    /// may pause for long (a pipe), every batch is read, and its files taken in, before the
    /// write lock is, so no other writer waits for them.
    func enqueue(
        into project: Project, streaming: Bool, now: Int64, read: () throws(OutboxError) -> [LineToRender],
        check: ([LineToRender], [Result<NewEntry, OutboxError>]) throws(OutboxError) -> [NewEntry]
    ) throws(OutboxError) -> [EnqueueResult] {
        let firstLines = try read()
        var ready: [NewEntry]? = firstLines.isEmpty ? nil : try check(firstLines, render(firstLines))
        var rendering: RenderJob?
        defer { _ = rendering?.join() }
        func nextBatch() throws(OutboxError) -> [NewEntry]? {
            if let job = rendering {
                rendering = nil
                ready = try check(job.lines, job.join())
            }
            guard let batch = ready else { return nil }
            ready = nil
            let lines = try read()
            if !lines.isEmpty { rendering = RenderJob(self, lines) }
            return batch
        }
        if streaming, !(ready ?? []).contains(where: { EnqueueCommand.takesAFileIn($0.prepared.body) }) {
            return try project.enqueue(batches: nextBatch, now: now)
        }
        var entries: [NewEntry] = []
        while let batch = try nextBatch() { entries += batch }
        return try project.enqueue(entries, now: now)
    }
}

/// A batch rendering on its own threads while the caller reads the next lines and writes
/// the batch before it: with the write of one batch overlapping the render of the next,
/// both cores work through an enqueue, not one while the other waits.
final class RenderJob {
    let lines: [LineToRender]
    private let renderer: LineRenderer
    private let rendered = Locked<[Result<NewEntry, OutboxError>]>([])
    private var thread: pthread_t?

    /// Starts the render; with a plugin to run (one at a time, in line order) it waits for `join`.
    init(_ renderer: LineRenderer, _ lines: [LineToRender]) {
        self.renderer = renderer
        self.lines = lines
        guard renderer.parallel else { return }
        let work = SendableRender(renderer: renderer, lines: lines, split: true)
        let rendered = rendered
        if case let .success(thread) = Threads.start(detached: false, { rendered.withLock { $0 = work.run() } }) {
            self.thread = thread
        }
    }

    /// Each line's entry or error, in line order; rendered here if no thread did it. Once.
    func join() -> [Result<NewEntry, OutboxError>] {
        guard let thread else { return renderer.render(lines) }
        pthread_join(thread, nil)
        self.thread = nil
        return rendered.withLock { $0 }
    }
}

/// Lines handed to the thread that renders them: a whole batch (`split`: halved again over
/// two threads) or a batch's second half. A render with no plugin reads the factory's config,
/// environment and file checks, never the project it came from, which is why this may cross
/// threads though the factory's definition lookup may not.
private struct SendableRender: @unchecked Sendable {
    let renderer: LineRenderer
    let lines: [LineToRender]
    let split: Bool
    func run() -> [Result<NewEntry, OutboxError>] { split ? renderer.render(lines) : lines.map(renderer.renderLine) }
}

extension EnqueueCommand {
    /// The next non-blank line of a `--from` file, checked up to its render; nil at the end.
    /// `movedFiles` looks up the files an entry of the line's id moved into the store.
    static func nextLine(
        _ reader: inout LineReader, absolute: String, maxLine: Int, now: Int64, seen: inout [String: Int],
        movedFiles: (String?) throws(OutboxError) -> [String: FileIdentity]
    ) throws(OutboxError) -> LineToRender? {
        while true {
            let next: [UInt8]?
            do {
                next = try reader.next()
            } catch {
                switch error {
                case let .tooLong(line): throw .invalid("\(absolute):\(line): the line is over \(Units.formatBytes(Int64(maxLine)))")
                case let .readFailed(code): throw .unreadable("--from: cannot read \(absolute): \(Paths.errnoMessage(code))", errno: code)
                case let .shrank(from, to):
                    throw .invalid("--from: \(absolute) was cut from \(from) to \(to) bytes while it was read: nothing is stored")
                }
            }
            guard var line = next else { return nil }
            let lineNumber = reader.lineNumber
            // A byte order mark some editors write first is not content.
            if lineNumber == 1, line.starts(with: [0xEF, 0xBB, 0xBF]) { line.removeFirst(3) }
            if let offset = Paths.invalidUTF8Offset(line) {
                throw .invalid("\(absolute):\(lineNumber): the line is not valid UTF-8 (at byte \(offset + 1))")
            }
            // Blank: only spaces, tabs and the CR of a CRLF line end (looked at in the bytes).
            if line.allSatisfy({ $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") || $0 == UInt8(ascii: "\r") }) { continue }
            let at = "\(absolute):\(lineNumber)"
            let object: JSON
            do { object = try JSON.parse(bytes: &line) } catch { throw .invalid("\(at): not valid JSON: \(error)") }
            guard case let .object(members) = object else { throw .invalid("\(at): each line must be a JSON object") }
            for (name, _) in members where !["vars", "id", "delay", "not_before"].contains(name) {
                throw .invalid("\(at): unknown field \"\(name)\" (allowed: vars, id, delay, not_before)")
            }
            var id: String?
            if let idValue = object["id"] {
                guard let s = idValue.stringValue else { throw .invalid("\(at): id must be a string") }
                if let problem = Identifiers.validateUserID(s) { throw .invalid("\(at): \(problem)") }
                if let first = seen[s] { throw .invalid("\(at): the id \"\(s)\" was already used on line \(first)") }
                seen[s] = lineNumber
                id = s
            }
            let delay = object["delay"].map { $0.stringValue ?? $0.serialized() }
            let notBefore = object["not_before"].map { $0.stringValue ?? $0.serialized() }
            if delay != nil && notBefore != nil { throw .invalid("\(at): give delay or not_before, not both") }
            var result = LineToRender(number: lineNumber, at: at, vars: object["vars"] ?? .null, id: id, notBefore: nil, movedFiles: [:])
            // Errors the render would have met first are given in the line's turn, after the lines before it.
            do throws(OutboxError) {
                result.notBefore = try holdUntil(delay: delay, notBefore: notBefore, now: now, names: ("delay", "not_before"))
                result.movedFiles = try movedFiles(id)
            } catch {
                result.failure = error
            }
            return result
        }
    }
}
