import OutboxRunner
import Testing

/// When `outbox run` draws its live progress line.
struct ProgressChoiceTests {
    @Test(arguments: [
        // (mode, stderr a terminal, events to a terminal, drawn)
        (ProgressMode.auto, true, false, true), (.auto, false, false, false),
        // `--events -` on the terminal: the line would run into the events.
        (.auto, true, true, false), (.always, true, true, true), (.always, false, false, true),
        (.never, true, false, false),
    ])
    func theLineIsDrawnOnATerminalUnlessTheEventsGoThere(_ mode: ProgressMode, _ stderr: Bool, _ events: Bool, _ drawn: Bool) {
        var options = RunOptions()
        (options.progress, options.stderrIsTerminal, options.eventsToTerminal) = (mode, stderr, events)
        #expect(options.showsProgress == drawn)
    }
}
