/// A YAML syntax or structure error at a 1-based position in the source.
public struct YAMLError: Error, Sendable, Equatable, CustomStringConvertible {
    public var mark: Mark
    public var message: String

    public init(mark: Mark, message: String) {
        self.mark = mark
        self.message = message
    }

    /// `line:column: message`, the shape compilers use.
    public var description: String { "\(mark.line):\(mark.column): \(message)" }
}
