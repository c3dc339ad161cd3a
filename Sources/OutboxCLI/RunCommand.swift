import OutboxModel
import OutboxRunner
import OutboxStore

enum RunCommand {
    static let options: [OptionSpec] = [
        OptionSpec(name: "drain", valueName: nil, help: "return when nothing is due within the horizon (for cron and timers)"),
        OptionSpec(name: "horizon", valueName: "D", help: "with --drain: how far ahead counts as due (default 10s)"),
        OptionSpec(name: "max-time", valueName: "D", help: "stop after this long, as on SIGTERM"),
        OptionSpec(name: "grace", valueName: "D", help: "on stop, how long attempts in flight may finish (default 30s)"),
        OptionSpec(name: "events", valueName: "-", help: "write state, progress and attempt events as JSON lines to stdout"),
        OptionSpec(name: "progress", valueName: "auto|always|never", help: "the live display on a terminal (default auto)"),
        CLI.json,
    ]
    static let details = """
    Runs until SIGINT or SIGTERM (the first lets attempts in flight finish within --grace; a
    second stops at once), or with --drain until nothing is due. One runner holds a store at a time.
    """

    static func run(_ i: inout Invocation) throws(OutboxError) -> Int32 {
        throw .usage("run is not available yet")
    }
}
