extension YAMLNode {
    /// The YAML 1.2 core-schema value of a scalar node (nil for non-scalars).
    ///
    /// Only plain scalars are resolved; quoted, literal and folded ones are strings.
    /// `!!str`, `!!int`, `!!float`, `!!bool` and `!!null` decide the type whatever the
    /// style (the parser rejects values that do not fit them); other tags are ignored here.
    /// A decimal integer beyond Int64 becomes `.float` with its exact digits; a hex or
    /// octal one beyond Int64 stays a string.
    package var scalar: YAMLScalar? {
        guard case .scalar(let text, let style) = kind else { return nil }
        return CoreSchema.resolve(text, style: style, tag: tag) ?? .string(text)
    }
}

/// YAML 1.2 core schema resolution (https://yaml.org/spec/1.2.2/#103-core-schema).
enum CoreSchema {
    static func isCoreScalarTag(_ tag: String) -> Bool {
        switch tag {
        case "!!str", "!!int", "!!float", "!!bool", "!!null": true
        default: false
        }
    }

    /// The value of a scalar, or nil when an explicit core tag does not fit the text.
    static func resolve(_ text: String, style: ScalarStyle, tag: String?) -> YAMLScalar? {
        switch tag {
        case "!!str", "!":
            // `!` is the non-specific tag: "not resolved", so a string.
            return .string(text)
        case "!!null":
            return text.isEmpty || isNull(text) ? .null : nil
        case "!!bool":
            return bool(text).map(YAMLScalar.bool)
        case "!!int":
            guard case .int(let digits)? = number(text) else { return nil }
            return .int(digits)
        case "!!float":
            switch number(text) {
            case .int(let digits)?: return .float(digits)
            case .float(let digits)?: return .float(digits)
            default: return nil
            }
        default:
            break
        }
        guard style == .plain else { return .string(text) }
        return resolvePlain(text)
    }

    static func resolvePlain(_ text: String) -> YAMLScalar {
        guard let first = text.utf8.first else { return .null }
        switch first {
        case UInt8(ascii: "n"), UInt8(ascii: "N"), UInt8(ascii: "~"):
            if isNull(text) { return .null }
        case UInt8(ascii: "t"), UInt8(ascii: "T"), UInt8(ascii: "f"), UInt8(ascii: "F"):
            if let value = bool(text) { return .bool(value) }
        case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "+"), UInt8(ascii: "."):
            if let value = number(text) {
                // Hex/octal beyond Int64 come back as strings; anything else is a number.
                return value
            }
        default:
            break
        }
        return .string(text)
    }

    static func isNull(_ text: String) -> Bool {
        switch text {
        case "~", "null", "Null", "NULL": true
        default: false
        }
    }

    static func bool(_ text: String) -> Bool? {
        switch text {
        case "true", "True", "TRUE": true
        case "false", "False", "FALSE": false
        default: nil
        }
    }

    /// An int or float per the core schema, normalised to JSON number text; nil when the
    /// text is neither. A hex/octal int too big for Int64 yields `.string`.
    static func number(_ text: String) -> YAMLScalar? {
        let b = Array(text.utf8)
        guard !b.isEmpty else { return nil }
        switch text {
        case ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF", ".nan", ".NaN", ".NAN":
            return .float(nil)
        default:
            break
        }
        if b.count > 2, b[0] == UInt8(ascii: "0") {
            if b[1] == UInt8(ascii: "x") { return radixInt(text, digits: b[2...], radix: 16) }
            if b[1] == UInt8(ascii: "o") { return radixInt(text, digits: b[2...], radix: 8) }
        }
        var i = 0
        var negative = false
        if b[i] == UInt8(ascii: "-") || b[i] == UInt8(ascii: "+") {
            negative = b[i] == UInt8(ascii: "-")
            i += 1
        }
        let intStart = i
        while i < b.count, isDigit(b[i]) { i += 1 }
        let intDigits = b[intStart..<i]
        if i == b.count {
            guard !intDigits.isEmpty else { return nil }
            if let value = Int64(text) { return .int(String(value)) }
            // Beyond Int64: keep every digit, as a JSON number that is not an integer to us.
            return .float((negative ? "-" : "") + stripZeros(intDigits))
        }
        var fraction: ArraySlice<UInt8>?
        if b[i] == UInt8(ascii: ".") {
            i += 1
            let start = i
            while i < b.count, isDigit(b[i]) { i += 1 }
            fraction = b[start..<i]
        }
        if intDigits.isEmpty && (fraction?.isEmpty ?? true) { return nil }
        var exponent = ""
        if i < b.count, b[i] == UInt8(ascii: "e") || b[i] == UInt8(ascii: "E") {
            let start = i
            i += 1
            if i < b.count, b[i] == UInt8(ascii: "-") || b[i] == UInt8(ascii: "+") { i += 1 }
            let digitsStart = i
            while i < b.count, isDigit(b[i]) { i += 1 }
            guard i > digitsStart else { return nil }
            exponent = String(decoding: b[start..<i], as: UTF8.self)
        }
        guard i == b.count else { return nil }
        var out = negative ? "-" : ""
        out += stripZeros(intDigits)
        if let fraction {
            out += "." + (fraction.isEmpty ? "0" : String(decoding: fraction, as: UTF8.self))
        }
        return .float(out + exponent)
    }

    private static func radixInt(_ text: String, digits: ArraySlice<UInt8>, radix: Int) -> YAMLScalar? {
        for d in digits {
            let ok = radix == 16 ? isHexDigit(d) : (UInt8(ascii: "0")...UInt8(ascii: "7")).contains(d)
            guard ok else { return nil }
        }
        if let value = Int64(String(decoding: digits, as: UTF8.self), radix: radix) { return .int(String(value)) }
        // Beyond Int64: every digit kept in decimal, as decimal text beyond Int64 is; the cap keeps
        // a hostile file's conversion (quadratic in its length) short.
        let significant = digits.drop { $0 == UInt8(ascii: "0") }
        guard significant.count <= maxRadixDigits else { return .string(text) }
        return .float(decimal(significant, radix: radix))
    }

    /// The longest hex or octal number converted to decimal (4,096 bits in hex).
    static let maxRadixDigits = 1_024

    /// Hex or octal digits in decimal, through base-10⁹ limbs (least significant first).
    private static func decimal(_ digits: ArraySlice<UInt8>, radix: Int) -> String {
        let base: UInt64 = 1_000_000_000
        var limbs: [UInt64] = []
        for d in digits {
            var carry = UInt64(hexValue(d))
            for k in limbs.indices {
                let x = limbs[k] * UInt64(radix) + carry
                limbs[k] = x % base
                carry = x / base
            }
            while carry > 0 {
                limbs.append(carry % base)
                carry /= base
            }
        }
        guard let top = limbs.last else { return "0" }
        var out = String(top)
        for limb in limbs.dropLast().reversed() {
            let text = String(limb)
            out += String(repeating: "0", count: 9 - text.count) + text
        }
        return out
    }

    private static func hexValue(_ c: UInt8) -> UInt8 {
        if isDigit(c) { return c - UInt8(ascii: "0") }
        return (c | 0x20) - UInt8(ascii: "a") + 10
    }

    /// Leading zeros are not valid in a JSON number; an all-zero or empty part is "0".
    private static func stripZeros(_ digits: ArraySlice<UInt8>) -> String {
        let kept = digits.drop { $0 == UInt8(ascii: "0") }
        return kept.isEmpty ? "0" : String(decoding: kept, as: UTF8.self)
    }

    private static func isDigit(_ c: UInt8) -> Bool { c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") }

    private static func isHexDigit(_ c: UInt8) -> Bool {
        isDigit(c) || (c >= UInt8(ascii: "a") && c <= UInt8(ascii: "f")) || (c >= UInt8(ascii: "A") && c <= UInt8(ascii: "F"))
    }
}
