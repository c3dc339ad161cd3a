/// The version `outbox --version` prints and the default User-Agent carries.
package let outboxVersion = "0.1.0"
