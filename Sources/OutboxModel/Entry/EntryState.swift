/// The states of an entry (docs/states-and-exit-codes.md); the last three are settled.
package enum EntryState: String, Sendable, CaseIterable {
    case queued, running, paused
    case awaitingAuth = "awaiting-auth"
    case completed, error, cancelled

    /// Completed, error and cancelled entries make no more attempts in their generation.
    package var isSettled: Bool {
        switch self {
        case .completed, .error, .cancelled: return true
        case .queued, .running, .paused, .awaitingAuth: return false
        }
    }
}
