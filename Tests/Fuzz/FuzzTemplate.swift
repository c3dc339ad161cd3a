@testable import OutboxModel

/// The template engine: the input is a template, parsed, checked and rendered in every
/// mode against a small fixed context (vars, env, entry, part, outcome).
enum FuzzTemplate {
    static func run(_ input: UnsafeBufferPointer<UInt8>) {
        let template = String(decoding: input, as: UTF8.self)
        let parsed = try? TemplateParser.parse(template)
        let problem = Template.validate(template)
        // validate reads the same parse: a template it passes must parse.
        if problem == nil, parsed == nil { fatalError("validate passed a template the parser refuses") }
        _ = Template.paths(in: template)
        for mode in [TemplateMode.value, .url, .header, .text] {
            guard let result = try? Template.render(template, context: context, mode: mode, field: "fuzz") else { continue }
            if mode == .header, let text = result.stringValue, text.utf8.contains(where: { $0 == 0x0A || $0 == 0x0D || $0 == 0 }) {
                fatalError("a header value rendered with CR, LF or NUL")
            }
            if mode == .url, let url = result.stringValue, (try? URLCheck.validate(url, field: "fuzz")) == nil {
                fatalError("a rendered URL fails URLCheck")
            }
        }
    }

    private static let context = TemplateContext(roots: [
        "vars": .object([
            ("s", .string("a/b c")), ("n", .number("42")), ("big", .number("1e400")), ("t", .bool(true)), ("null", .null),
            ("dots", .string("..")), ("empty", .string("")), ("nl", .string("x\r\ny")), ("amp", .string("<&'\"")),
            ("list", .array([.number("1"), .string("x/y"), .object([("k", .null)]), .array([])])),
            ("obj", .object([("a", .string("é")), ("b", .array([.bool(false)]))])),
        ]),
        "env": .object([("HOST", .string("http://127.0.0.1:8080")), ("TOKEN", .string("secret"))]),
        "entry": .object([("id", .string("e-1"))]),
        "part": .object([("number", .number("3")), ("start", .number("0")), ("end", .number("1023"))]),
        "outcome": .object([("status", .number("200")), ("body", .object([("id", .string("x"))]))]),
    ])
}
