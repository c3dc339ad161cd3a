/// A YAML syntax or structure error at a 1-based position in the source.
package struct YAMLError: Error, Sendable, Equatable, CustomStringConvertible {
    package var mark: Mark
    package var message: String

    package init(mark: Mark, message: String) {
        self.mark = mark
        self.message = message
    }

    /// `line:column: message`, the shape compilers use.
    package var description: String { "\(mark.line):\(mark.column): \(message)" }
}
