//! The network front end: event loops over TCP and Unix sockets, calling a [`Service`].

/// What the connection does after a batch of requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// Keep serving the connection.
    Continue,
    /// Send the replies written so far, then close the connection (QUIT).
    Close,
    /// Send the replies written so far, then shut the whole server down (SHUTDOWN).
    Shutdown,
}

/// The command layer behind the server. One value serves every connection of every event-loop
/// thread, hence `Sync`; per-connection state lives in a `Session`.
pub trait Service: Send + Sync + 'static {
    /// Per-connection state (selected database, client name, ...).
    type Session: Send + 'static;

    /// A new connection from `peer` (an address, or the socket path for Unix sockets).
    fn open_session(&self, peer: &str) -> Self::Session;

    /// Execute the complete requests read from one connection in one go (a pipeline), in order,
    /// appending exactly one RESP2 reply per request to `out`. Each request is its arguments
    /// (command name first, never empty). The server sends `out` only after this returns (and
    /// after [`Service::round_end`]), so a service may make a whole batch durable before any of
    /// its replies leaves.
    fn execute(
        &self,
        session: &mut Self::Session,
        requests: &[Vec<&[u8]>],
        out: &mut Vec<u8>,
    ) -> Control;

    /// Called by an event-loop thread after it has executed the requests of every ready
    /// connection of one wake-up and before it sends their replies (a place for group commit).
    fn round_end(&self) {}

    /// The connection is gone (closed by either side).
    fn close_session(&self, _session: Self::Session) {}
}
