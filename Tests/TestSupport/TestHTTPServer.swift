// The loopback HTTP test server lives in Sources/OutboxTestServer (the demo and the
// `outbox-testserver` binary use it too); tests get it through TestSupport.
@_exported import OutboxTestServer
