import CYAML

/// Loads YAML text into a `YAMLNode` tree with libyaml's event parser.
///
/// Rules beyond libyaml: one document per text; duplicate keys, non-scalar keys and the
/// YAML 1.1 merge key `<<` are errors; alias expansion is capped at
/// `YAMLParser.maxAliasNodes` nodes and `YAMLParser.maxAliasBytes` of text; nesting is capped
/// at `YAMLParser.maxDepth`.
/// An alias yields a copy of the anchored node whose top node carries the alias's mark,
/// while the nodes inside keep the marks of where they were written.
package enum YAMLParser {
    /// Total nodes that alias expansion may produce in one document.
    package static let maxAliasNodes = 10_000
    /// As much text as a file may hold (16 MiB): aliases of a big scalar count by its size.
    package static let maxAliasBytes = 16 << 20
    /// Deepest nesting of collections; deeper trees would risk the stack when freed.
    package static let maxDepth = 1_000

    /// Parses one YAML document (a second document in the stream is an error). Returns nil for an empty document.
    package static func parse(_ text: String) throws(YAMLError) -> YAMLNode? {
        var text = text
        // withUTF8 keeps the bytes pinned for libyaml's whole run.
        let result: Result<YAMLNode?, YAMLError> = text.withUTF8 { bytes in
            guard bytes.count > 0, let base = bytes.baseAddress else { return .success(nil) }
            var builder = TreeBuilder(source: UnsafeBufferPointer(start: base, count: bytes.count))
            return Result { () throws(YAMLError) in try builder.run() }
        }
        return try result.get()
    }
}

/// The text every template hint contains.
let templateHint = #"quote templates: "{{ ... }}""#

/// Builds the node tree from libyaml events, with explicit stacks instead of recursion.
///
/// Written for debug-build speed too (tests parse megabytes): finished nodes wait on one
/// flat `values` stack until their collection ends, so no per-collection array grows
/// step by step, and the open collection lives in `current`, so reading it copies nothing.
struct TreeBuilder {
    private struct Frame {
        /// Bools, not an enum: comparing enums is a function call in debug builds.
        var isDocument: Bool
        var isMapping: Bool
        var isFlow = false
        var mark = Mark(line: 1, column: 1)
        var tag: String?
        var anchor: String?
        /// Where this collection's children start in `values` and its keys in `keyTexts`.
        var valueStart = 0
        var keyStart = 0
        /// `produced` when the collection started, to size an anchored subtree.
        var producedAtStart = 0
        var producedBytesAtStart = 0
        /// Height of the tallest child collection so far (aliases included).
        var childHeight = 0
        /// Key text → index in `keyTexts`, built once a mapping grows past `linearKeyLimit`.
        var keyIndex: [String: Int] = [:]

        init(isDocument: Bool = false, isMapping: Bool) {
            self.isDocument = isDocument
            self.isMapping = isMapping
        }
    }

    private struct Anchored {
        var node: YAMLNode
        var nodeCount: Int
        /// Scalar bytes in the node: an alias of a big scalar is as big as the scalar.
        var byteCount: Int
        /// Collection levels in the node (0 for a scalar), so an alias cannot nest past `maxDepth`.
        var height: Int
    }

    /// Up to this many keys a linear search beats hashing.
    private static let linearKeyLimit = 16

    let source: UnsafeBufferPointer<UInt8>
    /// The innermost open collection (the document frame when none is open).
    private var current = Frame(isDocument: true, isMapping: false)
    /// The enclosing open collections, outermost first; only `0..<depth` is live.
    private var parents: [Frame] = []
    private var depth = 0
    /// Finished nodes of all open collections, innermost last; a mapping's are key, value, ...
    /// A raw buffer so nodes move in and out without retain/release pairs; `run` frees it.
    private var values: UnsafeMutablePointer<YAMLNode>
    private var valueCapacity = 256
    private var valueCount = 0
    /// Key texts of all open mappings, innermost last; only `0..<keyCount` is live: the
    /// stack shrinks by moving a count, since `removeLast` is an unspecialised generic
    /// call per element in debug builds.
    private var keyTexts: [String] = []
    private var keyCount = 0
    private var root: YAMLNode?
    private var anchors: [String: Anchored] = [:]
    /// Nodes completed so far, alias copies counted by their full size.
    private var produced = 0
    private var aliasNodes = 0
    /// Scalar bytes completed so far, and those that came from aliases.
    private var producedBytes = 0
    private var aliasBytes = 0
    private var documents = 0

    init(source: UnsafeBufferPointer<UInt8>) {
        self.source = source
        values = .allocate(capacity: valueCapacity)
    }

    /// Parses the whole source; call once.
    mutating func run() throws(YAMLError) -> YAMLNode? {
        defer {
            values.deinitialize(count: valueCount)
            values.deallocate()
        }
        let parser = UnsafeMutablePointer<yaml_parser_t>.allocate(capacity: 1)
        defer { parser.deallocate() }
        guard yaml_parser_initialize(parser) == 1 else {
            throw YAMLError(mark: Mark(line: 1, column: 1), message: "cannot initialise the YAML parser")
        }
        defer { yaml_parser_delete(parser) }
        yaml_parser_set_input_string(parser, source.baseAddress, source.count)

        var event = yaml_event_t()
        while true {
            guard yaml_parser_parse(parser, &event) == 1 else { throw parserError(parser) }
            defer { yaml_event_delete(&event) }
            let info = cyaml_event_info_of(&event)
            if info.kind == CYAML_STREAM_END { break }
            try handle(info)
        }
        if let root, case .scalar("", .plain) = root.kind, root.tag == nil {
            return nil  // `---` with nothing after it
        }
        return root
    }

    // MARK: Events

    // One small function per event kind, with error text built out of line: debug builds
    // zero every local of a function on entry, so one big switch paid for all branches.
    private mutating func handle(_ info: cyaml_event_info) throws(YAMLError) {
        switch info.kind {
        case CYAML_SCALAR: try scalar(info)
        case CYAML_SEQUENCE_START, CYAML_MAPPING_START: try startCollection(info)
        case CYAML_SEQUENCE_END, CYAML_MAPPING_END: add(try finishCollection())
        case CYAML_ALIAS: try alias(info)
        case CYAML_DOCUMENT_START: try startDocument(info)
        default: break  // stream start, document end
        }
    }

    /// True when the next node of the open mapping is a key.
    /// `mutating` only for speed: a debug build copies the whole builder to call a
    /// non-mutating member from a mutating one.
    private mutating func expectsKey() -> Bool {
        current.isMapping && (valueCount - current.valueStart) & 1 == 0
    }

    private mutating func scalar(_ info: cyaml_event_info) throws(YAMLError) {
        let mark = Mark(line: info.line + 1, column: info.column + 1)
        var text = ""
        if let value = info.value {
            // String(cString:) is compiled code, the generic String(decoding:) is not (debug);
            // it is exact unless the scalar holds a NUL (a "\0" escape).
            if strlen(value) == info.length {
                text = String(cString: value)
            } else {
                text = String(decoding: UnsafeBufferPointer(start: value, count: info.length), as: UTF8.self)
            }
        }
        let style = Self.scalarStyle(info.style)
        var tag: String?
        if info.tag != nil {
            tag = Self.shortTag(info.tag)
            try Self.checkScalarTag(text, tag: tag, mark: mark)
        }
        produced += 1
        producedBytes += info.length
        if expectsKey() { try checkKey(text, style: style, tag: tag, mark: mark) }
        let node = YAMLNode(kind: .scalar(text, style), mark: mark, tag: tag)
        if let anchor = info.anchor {
            anchors[String(cString: anchor)] = Anchored(node: node, nodeCount: 1, byteCount: info.length, height: 0)
        }
        add(node)
    }

    private mutating func startCollection(_ info: cyaml_event_info) throws(YAMLError) {
        let mark = Mark(line: info.line + 1, column: info.column + 1)
        if depth >= YAMLParser.maxDepth { throw Self.tooDeep(mark) }
        let isMapping = info.kind == CYAML_MAPPING_START
        // Before the key check: `{{ x }}` is exactly a mapping used as a key.
        if isMapping && info.style != 0 { try checkTemplate(at: mark) }
        if expectsKey() { throw YAMLError(mark: mark, message: "mapping keys must be scalars") }
        var frame = Frame(isMapping: isMapping)
        frame.isFlow = info.style != 0
        frame.mark = mark
        if info.tag != nil { frame.tag = Self.shortTag(info.tag) }
        if let anchor = info.anchor { frame.anchor = String(cString: anchor) }
        frame.valueStart = valueCount
        frame.keyStart = keyCount
        frame.producedAtStart = produced
        frame.producedBytesAtStart = producedBytes
        if depth < parents.count {
            parents[depth] = current
        } else {
            parents.append(current)
        }
        depth += 1
        current = frame
    }

    private mutating func alias(_ info: cyaml_event_info) throws(YAMLError) {
        let mark = Mark(line: info.line + 1, column: info.column + 1)
        var name = ""
        if let anchor = info.anchor { name = String(cString: anchor) }
        guard let anchored = anchors[name] else { throw missingAnchor(name, mark: mark) }
        aliasNodes += anchored.nodeCount
        aliasBytes += anchored.byteCount
        if aliasNodes > YAMLParser.maxAliasNodes {
            throw YAMLError(mark: mark, message: "alias expansion exceeds \(YAMLParser.maxAliasNodes) nodes (alias bomb?)")
        }
        if aliasBytes > YAMLParser.maxAliasBytes {
            throw YAMLError(mark: mark, message: "alias expansion exceeds \(YAMLParser.maxAliasBytes >> 20) MiB of text (alias bomb?)")
        }
        if depth + anchored.height > YAMLParser.maxDepth { throw Self.tooDeep(mark) }
        if anchored.height > current.childHeight { current.childHeight = anchored.height }
        produced += anchored.nodeCount
        producedBytes += anchored.byteCount
        var node = anchored.node
        node.mark = mark
        if expectsKey() {
            guard case .scalar(let text, let style) = node.kind else {
                throw YAMLError(mark: mark, message: "mapping keys must be scalars")
            }
            try checkKey(text, style: style, tag: node.tag, mark: mark)
        }
        add(node)
    }

    private mutating func startDocument(_ info: cyaml_event_info) throws(YAMLError) {
        documents += 1
        if documents > 1 {
            throw YAMLError(
                mark: Mark(line: info.line + 1, column: info.column + 1),
                message: "a second YAML document starts here; a file holds exactly one document")
        }
    }

    private func missingAnchor(_ name: String, mark: Mark) -> YAMLError {
        if current.anchor == name || parents[0..<depth].contains(where: { $0.anchor == name }) {
            return YAMLError(mark: mark, message: "alias *\(name) refers to a node that contains it")
        }
        return YAMLError(mark: mark, message: "unknown alias *\(name)")
    }

    private static func tooDeep(_ mark: Mark) -> YAMLError {
        YAMLError(mark: mark, message: "nesting deeper than \(YAMLParser.maxDepth) levels")
    }

    /// An explicit `!!int` etc. must fit its value, so `scalar` never has to guess later.
    private static func checkScalarTag(_ text: String, tag: String?, mark: Mark) throws(YAMLError) {
        guard let tag else { return }
        if tag == "!!map" || tag == "!!seq" {
            throw YAMLError(mark: mark, message: "tag \(tag) cannot be applied to a scalar")
        }
        if CoreSchema.isCoreScalarTag(tag), CoreSchema.resolve(text, style: .plain, tag: tag) == nil {
            throw YAMLError(mark: mark, message: "\(quoted(text)) is not a valid \(tag) value")
        }
    }

    private mutating func add(_ node: YAMLNode) {
        if current.isDocument {
            root = node
        } else {
            if valueCount == valueCapacity {
                let grown = UnsafeMutablePointer<YAMLNode>.allocate(capacity: valueCapacity * 2)
                grown.moveInitialize(from: values, count: valueCount)
                values.deallocate()
                values = grown
                valueCapacity *= 2
            }
            (values + valueCount).initialize(to: node)
            valueCount += 1
        }
    }

    /// Pops the open collection and returns it as a node.
    ///
    /// Plain `while` loops on purpose: ranges, slices and `removeSubrange` look up generic
    /// metadata on every call in debug builds, which cost more than the copying itself.
    private mutating func finishCollection() throws(YAMLError) -> YAMLNode {
        let start = current.valueStart
        var index = start
        let kind: YAMLNode.Kind
        if current.isMapping {
            var pairs: [YAMLPair] = []
            pairs.reserveCapacity((valueCount - start) / 2)
            while index + 1 < valueCount {
                pairs.append(YAMLPair(key: (values + index).move(), value: (values + index + 1).move()))
                index += 2
            }
            kind = .mapping(pairs)
            keyCount = current.keyStart
        } else {
            var items: [YAMLNode] = []
            items.reserveCapacity(valueCount - start)
            while index < valueCount {
                items.append((values + index).move())
                index += 1
            }
            kind = .sequence(items)
        }
        if index < valueCount {
            (values + index).deinitialize(count: valueCount - index)  // a key without value; libyaml never sends one
        }
        valueCount = start
        let node = YAMLNode(kind: kind, mark: current.mark, tag: current.tag)
        if let tag = current.tag {
            try Self.checkCollectionTag(tag, isMapping: current.isMapping, mark: current.mark)
        }
        produced += 1
        let height = current.childHeight + 1
        if let anchor = current.anchor {
            anchors[anchor] = Anchored(
                node: node, nodeCount: produced - current.producedAtStart, byteCount: producedBytes - current.producedBytesAtStart,
                height: height)
        }
        depth -= 1
        current = parents[depth]
        if height > current.childHeight { current.childHeight = height }
        return node
    }

    /// Rejects merge keys and duplicates, then records the key's text.
    private mutating func checkKey(_ text: String, style: ScalarStyle, tag: String?, mark: Mark) throws(YAMLError) {
        if tag != nil || (style == .plain && text.utf8.count == 2) {
            try Self.checkMergeKey(text, style: style, tag: tag, mark: mark)
        }
        let start = current.keyStart
        let count = keyCount - start
        var duplicate: Int?
        if count < Self.linearKeyLimit {
            // A plain loop: the generic firstIndex(of:) costs a metadata lookup per call in debug.
            var index = start
            while index < keyCount {
                if keyTexts[index] == text {
                    duplicate = index - start
                    break
                }
                index += 1
            }
        } else {
            if count == Self.linearKeyLimit {
                for index in 0..<count { current.keyIndex[keyTexts[start + index]] = index }
            }
            duplicate = current.keyIndex.updateValue(count, forKey: text)
        }
        if let duplicate { throw duplicateKey(text, index: duplicate, mark: mark) }
        if keyCount < keyTexts.count {
            keyTexts[keyCount] = text
        } else {
            keyTexts.append(text)
        }
        keyCount += 1
    }

    private static func checkMergeKey(_ text: String, style: ScalarStyle, tag: String?, mark: Mark) throws(YAMLError) {
        if (style == .plain && text == "<<" && tag == nil) || tag == "!!merge" {
            throw YAMLError(mark: mark, message: "merge keys (<<) are not supported; repeat the keys")
        }
    }

    private func duplicateKey(_ text: String, index: Int, mark: Mark) -> YAMLError {
        let firstLine = values[current.valueStart + 2 * index].mark.line  // still live: not yet moved
        return YAMLError(mark: mark, message: "duplicate key \(Self.quoted(text)) (first at line \(firstLine))")
    }

    /// `url: {{ vars.x }}` is a flow mapping holding a flow mapping, which would later
    /// surface as a baffling type error; catch it where it is written.
    private mutating func checkTemplate(at mark: Mark) throws(YAMLError) {
        // Cheap filter from events first: the outer `{` is open, still empty, and this
        // mapping starts one column to its right.
        guard current.isMapping, current.isFlow, valueCount == current.valueStart,
            current.mark.line == mark.line, current.mark.column + 1 == mark.column
        else { return }
        guard let offset = SourceText.byteOffset(in: source, of: current.mark),
            offset + 1 < source.count, source[offset] == UInt8(ascii: "{"), source[offset + 1] == UInt8(ascii: "{")
        else { return }
        throw YAMLError(
            mark: current.mark,
            message: "a value starting with {{ is read as a YAML flow mapping, not a template; \(templateHint)")
    }
}
