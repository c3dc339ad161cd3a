import Foundation
import TestSupport
import Testing

/// One row of `docs/bad-input.md`: a setup, an `outbox` call, and the error it must give.
struct BadInputCase: Sendable, CustomTestStringConvertible {
    var id: String
    var area: String
    /// Setup actions, each as its words (`write PATH TEXT`, `chmod MODE PATH`, ...).
    var setup: [[String]]
    var command: [String]
    var exit: Int32
    var code: String
    /// Texts the error must contain.
    var names: [String]

    var testDescription: String { "\(id) \(area): outbox \(command.joined(separator: " "))" }
}

/// The page `docs/bad-input.md`, read as the test's table: its fixture definitions and its cases.
enum BadInputCatalogue {
    static let page: String = {
        let repo = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let path = repo.appendingPathComponent("docs/bad-input.md").path
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { fatalError("cannot read \(path)") }
        return text
    }()

    /// The cases, or one case that cannot pass naming what in the page does not parse.
    static let cases: [BadInputCase] = {
        do { return try parseCases(page) } catch {
            return [BadInputCase(id: "page", area: "parse", setup: [], command: [], exit: -1, code: "\(error)", names: [])]
        }
    }()

    /// `<!-- fixture: PATH -->` followed by a fenced block: the files every case starts with.
    static var fixtureFiles: [(path: String, text: String)] {
        var files: [(String, String)] = []
        let lines = page.components(separatedBy: "\n")
        var i = 0
        while i < lines.count {
            let line = lines[i]
            i += 1
            guard line.hasPrefix("<!-- fixture: "), line.hasSuffix(" -->") else { continue }
            let path = String(line.dropFirst("<!-- fixture: ".count).dropLast(" -->".count))
            guard i < lines.count, lines[i].hasPrefix("```") else { continue }
            i += 1
            var body: [String] = []
            while i < lines.count, !lines[i].hasPrefix("```") {
                body.append(lines[i])
                i += 1
            }
            files.append((path, body.joined(separator: "\n") + "\n"))
        }
        return files
    }

    static func parseCases(_ page: String) throws -> [BadInputCase] {
        let lines = page.components(separatedBy: "\n")
        guard let header = lines.firstIndex(where: { $0.hasPrefix("| id | area | setup | command |") }) else {
            throw FixtureError("no case table in docs/bad-input.md")
        }
        var cases: [BadInputCase] = []
        for line in lines[(header + 2)...] {
            guard line.hasPrefix("|") else { break }
            let cells = splitRow(line)
            guard cells.count == 7, let exit = Int32(cells[4]) else { throw FixtureError("a row does not have 7 cells: \(line)") }
            let setupWords = try shellWords(codeSpans(cells[2]).first ?? "")
            var setup: [[String]] = []
            var current: [String] = []
            for word in setupWords {
                if word == ";" {
                    setup.append(current)
                    current = []
                } else {
                    current.append(word)
                }
            }
            if !current.isEmpty, current != ["-"] { setup.append(current) }
            cases.append(
                BadInputCase(
                    id: cells[0], area: cells[1], setup: setup, command: try shellWords(codeSpans(cells[3]).first ?? ""),
                    exit: exit, code: cells[5], names: codeSpans(cells[6])))
        }
        return cases
    }

    /// The cells of a table row; `\|` is a literal bar.
    static func splitRow(_ line: String) -> [String] {
        var cells: [String] = []
        var cell = ""
        var chars = Array(line.dropFirst())
        if chars.last == "|" { chars.removeLast() }
        var i = 0
        while i < chars.count {
            if chars[i] == "\\", i + 1 < chars.count, chars[i + 1] == "|" {
                cell.append("|")
                i += 2
                continue
            }
            if chars[i] == "|" {
                cells.append(cell.trimmingCharacters(in: .whitespaces))
                cell = ""
            } else {
                cell.append(chars[i])
            }
            i += 1
        }
        cells.append(cell.trimmingCharacters(in: .whitespaces))
        return cells
    }

    /// The texts between backticks.
    static func codeSpans(_ cell: String) -> [String] {
        cell.split(separator: "`", omittingEmptySubsequences: false).enumerated().filter { $0.offset % 2 == 1 }.map { String($0.element) }
    }

    /// Splits like a POSIX shell: single quotes literal, double quotes with `\"` and `\\`,
    /// words separated by blanks.
    static func shellWords(_ text: String) throws -> [String] {
        var words: [String] = []
        var word = ""
        var inWord = false
        var chars = text.makeIterator()
        while let c = chars.next() {
            switch c {
            case " ", "\t":
                if inWord { words.append(word) }
                word = ""
                inWord = false
            case "'":
                inWord = true
                while true {
                    guard let q = chars.next() else { throw FixtureError("unclosed ' in \(text)") }
                    if q == "'" { break }
                    word.append(q)
                }
            case "\"":
                inWord = true
                while true {
                    guard let q = chars.next() else { throw FixtureError("unclosed \" in \(text)") }
                    if q == "\"" { break }
                    if q == "\\", let next = chars.next() {
                        if next != "\"" && next != "\\" { word.append("\\") }
                        word.append(next)
                    } else {
                        word.append(q)
                    }
                }
            default:
                inWord = true
                word.append(c)
            }
        }
        if inWord { words.append(word) }
        return words
    }

    /// The bytes of a `write` or `stdin` text: `\n`, `\t`, `\r`, `\\` and `\xHH` decoded.
    static func unescape(_ text: String) -> Data {
        var out: [UInt8] = []
        let bytes = Array(text.utf8)
        var i = 0
        while i < bytes.count {
            if bytes[i] == UInt8(ascii: "\\"), i + 1 < bytes.count {
                switch bytes[i + 1] {
                case UInt8(ascii: "n"): out.append(0x0A); i += 2; continue
                case UInt8(ascii: "t"): out.append(0x09); i += 2; continue
                case UInt8(ascii: "r"): out.append(0x0D); i += 2; continue
                case UInt8(ascii: "\\"): out.append(0x5C); i += 2; continue
                case UInt8(ascii: "x") where i + 3 < bytes.count:
                    if let value = UInt8(String(decoding: bytes[(i + 2)...(i + 3)], as: UTF8.self), radix: 16) {
                        out.append(value)
                        i += 4
                        continue
                    }
                default: break
                }
            }
            out.append(bytes[i])
            i += 1
        }
        return Data(out)
    }
}
