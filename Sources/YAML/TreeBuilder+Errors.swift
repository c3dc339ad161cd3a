import CYAML

/// Errors and small helpers of the tree builder: libyaml's messages, tags and scalar styles.
extension TreeBuilder {
    func parserError(_ parser: UnsafeMutablePointer<yaml_parser_t>) -> YAMLError {
        let p = parser.pointee
        if p.error == YAML_MEMORY_ERROR {
            return YAMLError(mark: Mark(line: 1, column: 1), message: "out of memory while parsing YAML")
        }
        var message = p.problem.map { String(cString: $0) } ?? "invalid YAML"
        var mark = Mark(line: p.problem_mark.line + 1, column: p.problem_mark.column + 1)
        // At end of input libyaml reports the line after the last one, even when the text
        // has no final newline; point at the real end instead.
        let end = SourceText.mark(in: source, atByte: source.count)
        if mark.line > end.line { mark = end }
        if p.error == YAML_READER_ERROR {
            // Reader errors carry a byte offset, not a mark.
            mark = SourceText.mark(in: source, atByte: p.problem_offset)
            if p.problem_value >= 0 {
                let hex = String(p.problem_value, radix: 16, uppercase: true)
                message += " (U+\(String(repeating: "0", count: max(0, 4 - hex.count)))\(hex))"
            }
        }
        var hintLines = [mark.line]
        if let context = p.context {
            let contextMark = Mark(line: p.context_mark.line + 1, column: p.context_mark.column + 1)
            message += " (\(String(cString: context)) at line \(contextMark.line), column \(contextMark.column))"
            hintLines.append(contextMark.line)
        }
        if hintLines.contains(where: { SourceText.line($0, in: source).contains("{{") }) {
            message += "; \(templateHint)"
        }
        return YAMLError(mark: mark, message: message)
    }

    static func checkCollectionTag(_ tag: String, isMapping: Bool, mark: Mark) throws(YAMLError) {
        let kind = isMapping ? "mapping" : "sequence"
        if CoreSchema.isCoreScalarTag(tag) || (tag == "!!map" && !isMapping) || (tag == "!!seq" && isMapping) {
            throw YAMLError(mark: mark, message: "tag \(tag) cannot be applied to a \(kind)")
        }
    }

    static func scalarStyle(_ style: Int) -> ScalarStyle {
        switch style {
        case CYAML_SINGLE_QUOTED: .singleQuoted
        case CYAML_DOUBLE_QUOTED: .doubleQuoted
        case CYAML_LITERAL: .literal
        case CYAML_FOLDED: .folded
        default: .plain
        }
    }

    /// libyaml expands `!!int` to `tag:yaml.org,2002:int`; store the short form people write.
    static func shortTag(_ tag: UnsafePointer<UInt8>?) -> String? {
        guard let tag else { return nil }
        let full = String(cString: tag)
        let prefix = "tag:yaml.org,2002:"
        if full.hasPrefix(prefix) { return "!!" + full.dropFirst(prefix.count) }
        return full
    }

    static func quoted(_ text: String) -> String {
        let shown = text.count > 60 ? String(text.prefix(60)) + "…" : text
        return "\"\(shown)\""
    }
}
