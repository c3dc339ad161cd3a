import Testing
import YAML

struct ScalarCase: CustomTestStringConvertible, Sendable {
    var name: String
    /// Written after `v: `.
    var source: String
    var expected: YAMLScalar
    var testDescription: String { name }
    init(_ name: String, _ source: String, _ expected: YAMLScalar) {
        self.name = name
        self.source = source
        self.expected = expected
    }
}

struct ScalarResolutionTests {
    /// 2ⁿ in decimal by doubling digits, a way independent of the resolver's.
    static func powerOfTwo(_ n: Int) -> String {
        var digits: [UInt8] = [1]  // least significant first
        for _ in 0..<n {
            var carry: UInt8 = 0
            for k in digits.indices {
                let x = digits[k] * 2 + carry
                digits[k] = x % 10
                carry = x / 10
            }
            if carry > 0 { digits.append(carry) }
        }
        return String(digits.reversed().map { Character(String($0)) })
    }

    static let cases: [ScalarCase] = [
        // null
        .init("null lower", "null", .null),
        .init("null title", "Null", .null),
        .init("null upper", "NULL", .null),
        .init("tilde", "~", .null),
        .init("empty value", "", .null),
        .init("null mixed case is a string", "nULL", .string("nULL")),
        // bool
        .init("true", "true", .bool(true)),
        .init("True", "True", .bool(true)),
        .init("TRUE", "TRUE", .bool(true)),
        .init("false", "false", .bool(false)),
        .init("False", "False", .bool(false)),
        .init("FALSE", "FALSE", .bool(false)),
        .init("tRUE is a string", "tRUE", .string("tRUE")),
        .init("yes is a string", "yes", .string("yes")),
        .init("no is a string", "no", .string("no")),
        .init("on is a string", "on", .string("on")),
        .init("off is a string", "off", .string("off")),
        .init("y is a string", "y", .string("y")),
        // quoted and block scalars never resolve
        .init("single-quoted 3", "'3'", .string("3")),
        .init("double-quoted 3", "\"3\"", .string("3")),
        .init("double-quoted true", "\"true\"", .string("true")),
        .init("double-quoted null", "\"null\"", .string("null")),
        .init("single-quoted tilde", "'~'", .string("~")),
        .init("quoted empty", "''", .string("")),
        .init("literal 42", "|\n  42\n", .string("42\n")),
        .init("folded true", ">-\n  true", .string("true")),
        // int
        .init("zero", "0", .int("0")),
        .init("decimal", "42", .int("42")),
        .init("negative", "-17", .int("-17")),
        .init("plus sign dropped", "+5", .int("5")),
        .init("leading zeros dropped", "007", .int("7")),
        .init("minus zero", "-0", .int("0")),
        .init("hex", "0x1F", .int("31")),
        .init("hex lower", "0xff", .int("255")),
        .init("octal", "0o17", .int("15")),
        .init("octal bad digit", "0o8", .string("0o8")),
        .init("hex bad digit", "0xG", .string("0xG")),
        .init("hex upper X is a string", "0X1F", .string("0X1F")),
        .init("YAML 1.1 octal is decimal", "010", .int("10")),
        .init("Int64 max", "9223372036854775807", .int("9223372036854775807")),
        .init("Int64 min", "-9223372036854775808", .int("-9223372036854775808")),
        .init("beyond Int64 is a float", "9223372036854775808", .float("9223372036854775808")),
        .init("beyond Int64 with plus and zeros", "+009223372036854775808", .float("9223372036854775808")),
        .init("hex Int64 max", "0x7FFFFFFFFFFFFFFF", .int("9223372036854775807")),
        .init("hex beyond Int64 keeps its digits", "0x8000000000000000", .float("9223372036854775808")),
        .init("hex of 128 bits", "0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF", .float("340282366920938463463374607431768211455")),
        .init("octal beyond Int64", "0o1000000000000000000000", .float("9223372036854775808")),
        .init("hex beyond Int64 with leading zeros", "0x0000010000000000000000", .float("18446744073709551616")),
        .init("hex limb of zeros inside", "0x3B9ACA00000000000", .float("68719476736000000000")),
        .init("hex at the cap", "0x1" + String(repeating: "0", count: 1_023), .float(Self.powerOfTwo(4_092))),
        .init(
            "hex beyond the cap stays text", "0x1" + String(repeating: "0", count: 1_024),
            .string("0x1" + String(repeating: "0", count: 1_024))),
        .init("underscores are a string", "1_000", .string("1_000")),
        .init("sexagesimal is a string", "12:30", .string("12:30")),
        .init("date is a string", "2024-01-01", .string("2024-01-01")),
        // float
        .init("float", "1.5", .float("1.5")),
        .init("trailing dot", "1.", .float("1.0")),
        .init("leading dot", ".5", .float("0.5")),
        .init("plus float", "+1.5", .float("1.5")),
        .init("negative leading dot", "-.5", .float("-0.5")),
        .init("exponent", "1e3", .float("1e3")),
        .init("exponent upper signed", "1.5E-3", .float("1.5E-3")),
        .init("float leading zeros", "00.5", .float("0.5")),
        .init("everything", "+.5e+2", .float("0.5e+2")),
        .init("negative zero float", "-0.0", .float("-0.0")),
        .init("inf", ".inf", .float(nil)),
        .init("negative Inf", "-.Inf", .float(nil)),
        .init("plus INF", "+.INF", .float(nil)),
        .init("nan", ".nan", .float(nil)),
        .init("NaN", ".NaN", .float(nil)),
        .init("NAN", ".NAN", .float(nil)),
        .init("signed nan is a string", "-.nan", .string("-.nan")),
        .init("bare inf is a string", "inf", .string("inf")),
        .init("two dots", "1.2.3", .string("1.2.3")),
        .init("dangling exponent", "1e", .string("1e")),
        .init("exponent only", "e5", .string("e5")),
        .init("lone dot", ".", .string(".")),
        .init("double minus", "--", .string("--")),
        // strings
        .init("word", "hello", .string("hello")),
        .init("unicode", "héllo 🌍", .string("héllo 🌍")),
        .init("double-quoted escapes", #""tab\there \u00e9 \U0001F30D""#, .string("tab\there é 🌍")),
        .init("literal block", "|\n  line one\n  line two\n", .string("line one\nline two\n")),
        .init("literal keep", "|+\n  a\n\n", .string("a\n\n")),
        .init("folded block", ">\n  folded\n  text\n\n  para\n", .string("folded text\npara\n")),
        // explicit tags
        .init("!!str on a number", "!!str 3", .string("3")),
        .init("!!str on true", "!!str true", .string("true")),
        .init("!!int on a quoted number", "!!int '42'", .int("42")),
        .init("!!int hex", "!!int 0x10", .int("16")),
        .init("!!float on an int", "!!float 1", .float("1")),
        .init("!!float inf", "!!float -.inf", .float(nil)),
        .init("!!bool quoted", "!!bool \"true\"", .bool(true)),
        .init("!!null on quoted empty", "!!null ''", .null),
        .init("non-specific tag", "! 12", .string("12")),
        .init("custom tag resolves by style", "!env 12", .int("12")),
    ]

    @Test(arguments: cases)
    func resolves(_ c: ScalarCase) throws {
        let root = try load("v: \(c.source)")
        #expect(try root.value("v").scalar == c.expected)
    }

    @Test func tagsAreStoredShort() throws {
        let root = try load("a: !!str 3\nb: !env HOME\nc: !<tag:example.com,2024:x> y\nd: plain")
        #expect(try root.value("a").tag == "!!str")
        #expect(try root.value("b").tag == "!env")
        #expect(try root.value("b").scalar == .string("HOME"))
        #expect(try root.value("c").tag == "tag:example.com,2024:x")
        #expect(try root.value("d").tag == nil)
    }

    @Test func collectionsHaveNoScalar() throws {
        let root = try load("a: [1]\nb: {c: 1}")
        #expect(root.scalar == nil)
        #expect(try root.value("a").scalar == nil)
        #expect(try root.value("b").scalar == nil)
    }

    @Test func scalarStylesAreKept() throws {
        let root = try load("a: x\nb: 'x'\nc: \"x\"\nd: |\n  x\ne: >\n  x\n")
        let styles: [ScalarStyle] = try ["a", "b", "c", "d", "e"].map { key in
            guard case .scalar(_, let style) = try root.value(key).kind else { return .plain }
            return style
        }
        #expect(styles == [.plain, .singleQuoted, .doubleQuoted, .literal, .folded])
    }

    struct BadTag: CustomTestStringConvertible, Sendable {
        var name: String
        var source: String
        var error: YAMLError
        var testDescription: String { name }
    }

    @Test(arguments: [
        BadTag(name: "!!int word", source: "v: !!int abc", error: YAMLError(mark: at(1, 4), message: #""abc" is not a valid !!int value"#)),
        BadTag(
            name: "!!int float", source: "v: !!int 1.5", error: YAMLError(mark: at(1, 4), message: #""1.5" is not a valid !!int value"#)),
        BadTag(
            name: "!!int too big", source: "v: !!int 99999999999999999999",
            error: YAMLError(mark: at(1, 4), message: #""99999999999999999999" is not a valid !!int value"#)),
        BadTag(
            name: "!!bool yes", source: "v: !!bool yes", error: YAMLError(mark: at(1, 4), message: #""yes" is not a valid !!bool value"#)),
        BadTag(
            name: "!!null word", source: "v: !!null nil", error: YAMLError(mark: at(1, 4), message: #""nil" is not a valid !!null value"#)),
        BadTag(
            name: "!!float word", source: "v: !!float x", error: YAMLError(mark: at(1, 4), message: #""x" is not a valid !!float value"#)),
        BadTag(
            name: "!!str on a sequence", source: "v: !!str [1]",
            error: YAMLError(mark: at(1, 4), message: "tag !!str cannot be applied to a sequence")),
        BadTag(
            name: "!!map on a scalar", source: "v: !!map x",
            error: YAMLError(mark: at(1, 4), message: "tag !!map cannot be applied to a scalar")),
        BadTag(
            name: "!!seq on a mapping", source: "v: !!seq {a: 1}",
            error: YAMLError(mark: at(1, 4), message: "tag !!seq cannot be applied to a mapping")),
    ])
    func badExplicitTag(_ c: BadTag) {
        #expect(loadError(c.source) == c.error)
    }
}
