/// The roots and filters templates know, with what each means: the parser takes its names
/// from here, and so does the generated reference.
enum TemplateVocabulary {
    struct Root {
        let name: String
        let holds: String
        let where_: String
    }

    struct Filter {
        let name: String
        let usage: String
        /// nil for a filter that takes an argument (parsed on its own).
        let filter: TemplateFilter?
        let effect: String
    }

    /// Whether `text` holds `{{` then a root and a dot (`{{ vars.id }}`): a template where
    /// none is rendered (a hook's command) is a mistake worth a word.
    static func mentionsARoot(_ text: String) -> Bool {
        var rest = Substring(text)
        while let open = rest.firstRange(of: "{{") {
            rest = rest[open.upperBound...]
            let name = rest.drop { $0 == " " }.prefix { $0.isLetter || $0 == "_" }
            if roots.contains(where: { $0.name == name }), rest.drop(while: { $0 == " " }).dropFirst(name.count).first == "." {
                return true
            }
        }
        return false
    }

    static let roots: [Root] = [
        Root(name: "vars", holds: "the entry's vars (a JSON object, or `null` when none were given)", where_: "everywhere"),
        Root(name: "entry", holds: "`entry.id`: the entry's id (given or minted)", where_: "everywhere (empty in `--id-template`)"),
        Root(
            name: "env", holds: "the environment of the process that renders: `enqueue`, or the runner for follow-ups and hook enqueues",
            where_: "everywhere"),
        Root(
            name: "file", holds: "`file.size`, `file.name`, `file.path`: the `request.file` at enqueue (bytes, base name, absolute path)",
            where_: "in `request` and `scope`, when `request.file` is given"),
        Root(
            name: "part",
            holds:
                "`part.index`, `part.number`, `part.start`, `part.end`, `part.last`: 0-based index, 1-based number, first byte, end (exclusive), last byte",
            where_: "in a parts plan's `url` and `headers`"),
        Root(
            name: "outcome", holds: "the hook input of the outcome that triggered a follow-up",
            where_: "in `then` items and in the follow-up's own request"),
    ]

    static let filters: [Filter] = [
        Filter(
            name: "raw", usage: "raw", filter: .raw,
            effect: "in a URL: insert the value without percent-encoding (needed in the scheme or host); elsewhere no effect"),
        Filter(
            name: "path", usage: "path", filter: .path,
            effect:
                "in a URL or a header (WebDAV's `Destination` names a URL): percent-encode each `/`-separated segment and keep the slashes; a `.` or `..` segment is `E_INVALID`; elsewhere no effect"
        ),
        Filter(name: "json", usage: "json", filter: .json, effect: "the value as compact JSON text (a string gets its quotes)"),
        Filter(
            name: "xml", usage: "xml", filter: .xml,
            effect: "the value as text with `& < > \" '` escaped; characters XML cannot carry are `E_INVALID`"),
        Filter(
            name: "default", usage: "default(\"...\")", filter: nil,
            effect: "the text in quotes when the path does not resolve or is `null`; `\\\"` and `\\\\` escape inside them"),
    ]
}
