import CLibPQ
import Glibc
import OutboxModel

/// libpq's functions, looked up in libpq.so.5 opened with dlopen at the first PostgreSQL
/// connection: linked, it made every command (SQLite ones too) start 6 ms later.
struct LibPQ: @unchecked Sendable {
    let connectdb: @convention(c) (UnsafePointer<CChar>?) -> OpaquePointer?
    let status: @convention(c) (OpaquePointer?) -> ConnStatusType
    let errorMessage: @convention(c) (OpaquePointer?) -> UnsafeMutablePointer<CChar>?
    let finish: @convention(c) (OpaquePointer?) -> Void
    let reset: @convention(c) (OpaquePointer?) -> Void
    let exec: @convention(c) (OpaquePointer?, UnsafePointer<CChar>?) -> OpaquePointer?
    let prepare: @convention(c) (OpaquePointer?, UnsafePointer<CChar>?, UnsafePointer<CChar>?, Int32, UnsafePointer<Oid>?) -> OpaquePointer?
    let execPrepared:
        @convention(c) (
            OpaquePointer?, UnsafePointer<CChar>?, Int32, UnsafePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int32>?,
            UnsafePointer<Int32>?, Int32
        ) -> OpaquePointer?
    let resultStatus: @convention(c) (OpaquePointer?) -> ExecStatusType
    let resultErrorMessage: @convention(c) (OpaquePointer?) -> UnsafeMutablePointer<CChar>?
    let resultErrorField: @convention(c) (OpaquePointer?, Int32) -> UnsafeMutablePointer<CChar>?
    let clear: @convention(c) (OpaquePointer?) -> Void
    let cmdTuples: @convention(c) (OpaquePointer?) -> UnsafeMutablePointer<CChar>?
    let ntuples: @convention(c) (OpaquePointer?) -> Int32
    let getisnull: @convention(c) (OpaquePointer?, Int32, Int32) -> Int32
    let getvalue: @convention(c) (OpaquePointer?, Int32, Int32) -> UnsafeMutablePointer<CChar>?
    let getlength: @convention(c) (OpaquePointer?, Int32, Int32) -> Int32
    let consumeInput: @convention(c) (OpaquePointer?) -> Int32
    let notifies: @convention(c) (OpaquePointer?) -> UnsafeMutablePointer<PGnotify>?
    let freemem: @convention(c) (UnsafeMutableRawPointer?) -> Void
    /// Replaces libpq's notice printer, which writes raw lines ("FATAL: terminating
    /// connection ...") on stderr, outside the log's format.
    let setNoticeProcessor:
        @convention(c) (
            OpaquePointer?, (@convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?) -> Void)?, UnsafeMutableRawPointer?
        ) -> (@convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?) -> Void)?

    /// The library of this process, loaded once; E_STORAGE when it cannot be.
    static func get() throws(OutboxError) -> LibPQ { try loaded.get() }

    private static let loaded: Result<LibPQ, OutboxError> = load()

    private static func load() -> Result<LibPQ, OutboxError> {
        guard let handle = dlopen("libpq.so.5", RTLD_NOW | RTLD_LOCAL) else {
            let reason = dlerror().map { String(cString: $0) } ?? "not found"
            return .failure(.storage("cannot load libpq.so.5 for the PostgreSQL store (Debian: apt-get install libpq5): \(reason)"))
        }
        var missing: [String] = []
        func symbol<T>(_ name: String, _: T.Type) -> T? {
            guard let p = dlsym(handle, name) else {
                missing.append(name)
                return nil
            }
            return unsafeBitCast(p, to: T.self)
        }
        guard let connectdb = symbol("PQconnectdb", (@convention(c) (UnsafePointer<CChar>?) -> OpaquePointer?).self),
            let status = symbol("PQstatus", (@convention(c) (OpaquePointer?) -> ConnStatusType).self),
            let errorMessage = symbol("PQerrorMessage", (@convention(c) (OpaquePointer?) -> UnsafeMutablePointer<CChar>?).self),
            let finish = symbol("PQfinish", (@convention(c) (OpaquePointer?) -> Void).self),
            let reset = symbol("PQreset", (@convention(c) (OpaquePointer?) -> Void).self),
            let exec = symbol("PQexec", (@convention(c) (OpaquePointer?, UnsafePointer<CChar>?) -> OpaquePointer?).self),
            let prepare = symbol(
                "PQprepare",
                (@convention(c) (OpaquePointer?, UnsafePointer<CChar>?, UnsafePointer<CChar>?, Int32, UnsafePointer<Oid>?) -> OpaquePointer?)
                    .self),
            let execPrepared = symbol(
                "PQexecPrepared",
                (@convention(c) (
                    OpaquePointer?, UnsafePointer<CChar>?, Int32, UnsafePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int32>?,
                    UnsafePointer<Int32>?, Int32
                ) -> OpaquePointer?).self),
            let resultStatus = symbol("PQresultStatus", (@convention(c) (OpaquePointer?) -> ExecStatusType).self),
            let resultErrorMessage = symbol(
                "PQresultErrorMessage", (@convention(c) (OpaquePointer?) -> UnsafeMutablePointer<CChar>?).self),
            let resultErrorField = symbol(
                "PQresultErrorField", (@convention(c) (OpaquePointer?, Int32) -> UnsafeMutablePointer<CChar>?).self),
            let clear = symbol("PQclear", (@convention(c) (OpaquePointer?) -> Void).self),
            let cmdTuples = symbol("PQcmdTuples", (@convention(c) (OpaquePointer?) -> UnsafeMutablePointer<CChar>?).self),
            let ntuples = symbol("PQntuples", (@convention(c) (OpaquePointer?) -> Int32).self),
            let getisnull = symbol("PQgetisnull", (@convention(c) (OpaquePointer?, Int32, Int32) -> Int32).self),
            let getvalue = symbol("PQgetvalue", (@convention(c) (OpaquePointer?, Int32, Int32) -> UnsafeMutablePointer<CChar>?).self),
            let getlength = symbol("PQgetlength", (@convention(c) (OpaquePointer?, Int32, Int32) -> Int32).self),
            let consumeInput = symbol("PQconsumeInput", (@convention(c) (OpaquePointer?) -> Int32).self),
            let notifies = symbol("PQnotifies", (@convention(c) (OpaquePointer?) -> UnsafeMutablePointer<PGnotify>?).self),
            let freemem = symbol("PQfreemem", (@convention(c) (UnsafeMutableRawPointer?) -> Void).self),
            let setNoticeProcessor = symbol(
                "PQsetNoticeProcessor",
                (@convention(c) (
                    OpaquePointer?, (@convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?) -> Void)?, UnsafeMutableRawPointer?
                ) -> (@convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?) -> Void)?).self)
        else {
            return .failure(.storage("libpq.so.5 lacks \(missing.joined(separator: ", "))"))
        }
        return .success(
            LibPQ(
                connectdb: connectdb, status: status, errorMessage: errorMessage, finish: finish, reset: reset, exec: exec,
                prepare: prepare,
                execPrepared: execPrepared, resultStatus: resultStatus, resultErrorMessage: resultErrorMessage,
                resultErrorField: resultErrorField, clear: clear,
                cmdTuples: cmdTuples, ntuples: ntuples, getisnull: getisnull, getvalue: getvalue, getlength: getlength,
                consumeInput: consumeInput, notifies: notifies, freemem: freemem, setNoticeProcessor: setNoticeProcessor))
    }
}
