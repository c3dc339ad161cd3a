import OutboxTestServer

// A loopback HTTP test server as its own process, for CLI tests and the demo.
TestHTTPServer.runStandalone(arguments: Array(CommandLine.arguments.dropFirst()))
