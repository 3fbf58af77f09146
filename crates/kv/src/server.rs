//! The network front end: event loops over TCP and Unix sockets, calling a [`Service`].
//!
//! # Threads
//!
//! [`ServerConfig::threads`] event-loop threads (`kv-net-N`), each with its own epoll instance
//! and its own connections; a connection stays on one thread for its life. Thread 0 also owns the
//! listening sockets: it accepts, applies `maxclients`, and hands each new connection to the
//! threads in turn (round-robin through a mutex-protected inbox and an eventfd wake-up), which
//! spreads a benchmark's connections evenly, unlike SO_REUSEPORT hashing or `EPOLLEXCLUSIVE`
//! wake-ups, where one thread can take a whole burst of connects.
//!
//! We use raw `epoll` through `libc` rather than `mio`: the project is Linux-only, `libc` is
//! already a dependency, we need exactly one mechanism (level-triggered epoll plus an eventfd),
//! and owning the eventfd lets [`ShutdownTrigger::request`] be documented async-signal-safe (an
//! atomic store and `write(2)`), which a `mio::Waker` does not promise.
//!
//! # A wake-up
//!
//! For every ready connection: read what is available (one `recv` in the common case, more while
//! the buffer fills, at most [`READ_CAP`] per wake-up; level-triggered epoll brings us back for
//! the rest, which keeps busy clients from starving others), parse every complete request, and
//! call [`Service::execute`] once with all of them. Then [`Service::round_end`], then one `send`
//! per connection with replies. A partial write keeps the rest and waits for `EPOLLOUT`.
//! Argument slices point into the read buffer. A connection without an unfinished request owns no
//! read buffer: it reads into its thread's scratch buffer, and only the unfinished tail, if any,
//! is copied into a buffer of its own — so idle connections cost no buffer memory.
//!
//! # Limits (each counted in [`ServerStats`] when it closes a client)
//!
//! * A protocol error: Redis's error reply, then the connection is closed.
//! * `proto-max-bulk-len`, `max-multibulk-len`, `max-inline-len`: enforced by the parser on the
//!   header line, before the data arrives.
//! * `client-query-buffer-limit`: a client whose unfinished request grows beyond it is closed
//!   (no reply, as Redis does). The whole request must fit, so it also caps a request's size.
//! * `total-query-buffer-budget`: when all clients' unfinished requests together exceed it, the
//!   client with the largest one is closed (exactly the largest among buffers of 1 MiB or more,
//!   which are tracked globally; the thread's own largest when no buffer is that large).
//! * `unfinished-frame-timeout`: a client holding an unfinished request that sends nothing for
//!   this long is closed.
//! * `timeout` (Redis's idle-client timeout, 0 by default = never): a client that sent nothing
//!   and was sent no reply for more than this many seconds is closed, unless it is blocked
//!   ([`Control::Block`]) or a subscriber ([`ConnHandle::set_subscriber`]), as Redis does.
//! * `client-output-buffer-limit`: a client whose pending replies would exceed it is closed (no
//!   flow control: like Redis, we keep reading from a client that does not read its replies).
//!   The limit is the output budget of [`Service::execute`]: the service stops at the first
//!   request whose reply does not fit, measuring a big reply before copying it, so a pipeline
//!   of GETs that is never read costs at most the limit, not its whole batch of replies. What
//!   ran stays done; nothing is sent to the closed client.
//!
//! # Memory
//!
//! Connection buffers are freed when they drain (replies sent, requests complete) and when the
//! connection closes; a big read buffer left holding a small unfinished tail shrinks. Input
//! buffers of 1 MiB and more are mappings of their own ([`crate::iobuf`]), unmapped when
//! freed: after a flood of big unfinished requests is cut, the process shrinks back instead of
//! keeping the flood's size. For the rest, once a thread has freed [`TRIM_AFTER`] bytes of
//! buffers it calls glibc's `malloc_trim(0)` (at most every [`TRIM_EVERY`]), which gives whole
//! free pages inside the arenas back to the OS (not the free top of a thread's arena: that is
//! why the big buffers are mapped).
//! * `maxclients`: a connection beyond it gets `-ERR max number of clients reached` and is
//!   closed. At start the process's open-file limit is raised (up to its hard limit) to fit it.
//!
//! Every limit is read from the server's [`Runtime`] at each use (relaxed atomic loads), so
//! `CONFIG SET` changes it for the running server ([`start_with`]).
//!
//! # Control and shutdown
//!
//! [`Control::Close`] (QUIT): the rest of the connection's input is ignored, its replies are
//! sent, then it is closed. [`Control::Shutdown`] (SHUTDOWN), [`ServerHandle::shutdown`] or
//! [`ShutdownTrigger::request`] (from a signal handler): every thread stops accepting and
//! reading, flushes pending replies (for at most [`SHUTDOWN_FLUSH`]), closes its connections
//! and exits; [`ServerHandle::join`] (and [`serve`]) then return. A panic in the service is
//! caught, counted, and closes only the connection whose requests caused it.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::config::{parse_bind, ServerConfig};
use crate::iobuf::IoBuf;
use crate::resp::{RequestParser, VecPool};
use crate::runtime::Runtime;

/// What the connection does after a batch of requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// Keep serving the connection.
    Continue,
    /// Send the replies written so far, then close the connection (QUIT).
    Close,
    /// Send the replies written so far, then shut the whole server down (SHUTDOWN).
    Shutdown,
    /// The output budget ran out (see [`Service::execute`]): close the connection now, sending
    /// nothing (`client-output-buffer-limit`).
    OutputFull,
    /// The request at index `ran` blocks (BLPOP on empty lists): it wrote no reply. The server
    /// keeps it and the batch's later requests, reads nothing more from the connection, and
    /// executes them again when the service calls [`ConnHandle::wake`] or at the deadline
    /// (`None`: none), whichever comes first.
    Block(Option<Instant>),
}

/// What [`Service::execute`] did with a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Executed {
    /// What the connection does next.
    pub control: Control,
    /// Requests executed (a prefix of the batch).
    pub ran: usize,
}

impl Executed {
    /// `ran` requests executed, then `control`.
    pub fn new(control: Control, ran: usize) -> Executed {
        Executed { control, ran }
    }
}

/// The command layer behind the server. One value serves every connection of every event-loop
/// thread, hence `Sync`; per-connection state lives in a `Session`.
pub trait Service: Send + Sync + 'static {
    /// Per-connection state (selected database, client name, ...).
    type Session: Send + 'static;

    /// A new connection from `peer` (an address, or the socket path for Unix sockets).
    fn open_session(&self, peer: &str) -> Self::Session;

    /// [`Service::open_session`] for a connection the service may send to at any time
    /// through `conn` (pub/sub messages). The server calls this one; by default it ignores
    /// the handle.
    fn open_session_with(&self, peer: &str, conn: ConnHandle) -> Self::Session {
        let _ = conn;
        self.open_session(peer)
    }

    /// Execute the complete requests read from one connection in one go (a pipeline), in order,
    /// appending exactly one RESP2 reply per request to `out`. Each request is its arguments
    /// (command name first, never empty). The server sends `out` only after this returns (and
    /// after [`Service::round_end`]), so a service may make a whole batch durable before any of
    /// its replies leaves. After a request that returns [`Control::Close`] or
    /// [`Control::Shutdown`], the service must execute none of the batch's later requests: the
    /// server drops them unanswered.
    ///
    /// `out_limit` is the output budget: the length `out` must not exceed
    /// (`client-output-buffer-limit`; `usize::MAX` when there is none). A service stops at the
    /// first request whose reply does not fit — it should measure a big reply before copying
    /// it, so `out` never grows far past the limit — and returns [`Control::OutputFull`]; the
    /// server then closes the connection without sending anything (as Redis does). Whatever
    /// the service executed must stay executed (committed); later requests must not run.
    /// `ran` counts the requests executed (for `total_commands_processed`).
    fn execute(
        &self,
        session: &mut Self::Session,
        requests: &[Vec<&[u8]>],
        out: &mut Vec<u8>,
        out_limit: usize,
    ) -> Executed;

    /// Called by an event-loop thread after it has executed the requests of every ready
    /// connection of one wake-up and before it sends their replies: the place for group
    /// commit (one durability barrier for every write of the round). `false`: the round's
    /// replies must not be sent (their writes could not be made durable); the server then
    /// closes every connection with replies of the round pending, without sending them.
    fn round_end(&self) -> bool {
        true
    }

    /// Whether the replies written so far may be sent before the round ends: nothing they
    /// could report or have read waits for [`Service::round_end`] (no write is staged and not
    /// yet durable). Asked after each connection's batch; `true` sends its replies at once,
    /// so that the client reads them while the thread serves the round's other connections.
    /// Default: `false` (every reply waits for the round's end).
    fn replies_ready(&self) -> bool {
        false
    }

    /// The connection is gone (closed by either side).
    fn close_session(&self, _session: Self::Session) {}
}

/// A way to send bytes to one connection from any thread, outside its requests' replies
/// (pub/sub messages): [`ConnHandle::push`] queues them in the connection's event-loop thread
/// and wakes it; that thread appends them to the connection's pending output (after the
/// replies already there) and sends them. Messages pushed from one thread arrive in the order
/// pushed. A handle outliving its connection or server pushes into nothing.
#[derive(Clone, Debug)]
pub struct ConnHandle {
    shared: std::sync::Weak<Shared>,
    thread: usize,
    token: u64,
    /// The connection is a subscriber (shared with the connection's event loop).
    subscriber: Arc<AtomicBool>,
}

impl ConnHandle {
    /// A handle that reaches no connection (sessions opened outside a server).
    pub fn detached() -> ConnHandle {
        ConnHandle {
            shared: std::sync::Weak::new(),
            thread: 0,
            token: u64::MAX,
            subscriber: Arc::default(),
        }
    }

    /// Says whether the connection subscribes to anything: the idle-client timeout
    /// (`timeout`) leaves subscribers alone, as Redis does. One relaxed store.
    pub fn set_subscriber(&self, on: bool) {
        self.subscriber.store(on, Ordering::Relaxed);
    }

    /// Have the connection's blocked requests (see [`Control::Block`]) executed again soon; a
    /// connection that is not blocked is left alone.
    pub fn wake(&self) {
        let Some(sh) = self.shared.upgrade() else {
            return;
        };
        let Some(q) = sh.wakes.get(self.thread) else {
            return;
        };
        let first = {
            let mut q = q.lock();
            q.push(self.token);
            q.len() == 1
        };
        if first {
            sh.wake(self.thread);
        }
    }

    /// Close the connection (CLIENT KILL): its pending replies are sent, then it is closed;
    /// nothing more of its input is read.
    pub fn close(&self) {
        let Some(sh) = self.shared.upgrade() else {
            return;
        };
        if let Some(q) = sh.closes.get(self.thread) {
            q.lock().push(self.token);
            sh.wake(self.thread);
        }
    }

    /// Queue `bytes` for the connection; false if it cannot be reached (no server).
    pub fn push(&self, bytes: Vec<u8>) -> bool {
        let Some(sh) = self.shared.upgrade() else {
            return false;
        };
        let Some(q) = sh.pushes.get(self.thread) else {
            return false;
        };
        let first = {
            let mut q = q.lock();
            q.push((self.token, bytes));
            q.len() == 1
        };
        if first {
            sh.wake(self.thread);
        }
        true
    }
}

/// Counters of the network front end, for `INFO` (all monotonic except `connected_clients`).
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Connections open now.
    pub connected_clients: AtomicU64,
    /// Connections accepted (not counting those rejected by `maxclients`).
    pub total_connections_received: AtomicU64,
    /// Requests passed to [`Service::execute`].
    pub total_commands_processed: AtomicU64,
    /// Connections refused because of `maxclients`.
    pub rejected_connections: AtomicU64,
    /// Bytes read from clients.
    pub total_net_input_bytes: AtomicU64,
    /// Bytes written to clients.
    pub total_net_output_bytes: AtomicU64,
    /// Connections closed after a protocol error.
    pub protocol_errors: AtomicU64,
    /// Clients closed for exceeding `client-query-buffer-limit`.
    pub cut_query_buffer_limit: AtomicU64,
    /// Clients closed to bring all buffers under `total-query-buffer-budget`.
    pub cut_query_buffer_budget: AtomicU64,
    /// Clients closed by `unfinished-frame-timeout`.
    pub cut_unfinished_frame_timeout: AtomicU64,
    /// Clients closed for exceeding `client-output-buffer-limit`.
    pub cut_output_buffer_limit: AtomicU64,
    /// Idle clients closed by `timeout`.
    pub cut_idle_timeout: AtomicU64,
    /// Panics of the service caught (each closed the connection that caused it).
    pub service_panics: AtomicU64,
}

/// A plain copy of [`ServerStats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // the fields mirror ServerStats's, documented there
pub struct ServerStatsSnapshot {
    pub connected_clients: u64,
    pub total_connections_received: u64,
    pub total_commands_processed: u64,
    pub rejected_connections: u64,
    pub total_net_input_bytes: u64,
    pub total_net_output_bytes: u64,
    pub protocol_errors: u64,
    pub cut_query_buffer_limit: u64,
    pub cut_query_buffer_budget: u64,
    pub cut_unfinished_frame_timeout: u64,
    pub cut_output_buffer_limit: u64,
    pub cut_idle_timeout: u64,
    pub service_panics: u64,
}

impl ServerStats {
    /// Every counter, read with relaxed loads (each is exact; they are not one atomic picture).
    pub fn snapshot(&self) -> ServerStatsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ServerStatsSnapshot {
            connected_clients: l(&self.connected_clients),
            total_connections_received: l(&self.total_connections_received),
            total_commands_processed: l(&self.total_commands_processed),
            rejected_connections: l(&self.rejected_connections),
            total_net_input_bytes: l(&self.total_net_input_bytes),
            total_net_output_bytes: l(&self.total_net_output_bytes),
            protocol_errors: l(&self.protocol_errors),
            cut_query_buffer_limit: l(&self.cut_query_buffer_limit),
            cut_query_buffer_budget: l(&self.cut_query_buffer_budget),
            cut_unfinished_frame_timeout: l(&self.cut_unfinished_frame_timeout),
            cut_output_buffer_limit: l(&self.cut_output_buffer_limit),
            cut_idle_timeout: l(&self.cut_idle_timeout),
            service_panics: l(&self.service_panics),
        }
    }

    /// `CONFIG RESETSTAT`: every monotonic counter back to 0 (`connected_clients` stays).
    pub fn reset(&self) {
        for c in [
            &self.total_connections_received,
            &self.total_commands_processed,
            &self.rejected_connections,
            &self.total_net_input_bytes,
            &self.total_net_output_bytes,
            &self.protocol_errors,
            &self.cut_query_buffer_limit,
            &self.cut_query_buffer_budget,
            &self.cut_unfinished_frame_timeout,
            &self.cut_output_buffer_limit,
            &self.cut_idle_timeout,
            &self.service_panics,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// Most bytes read from one connection per wake-up.
pub const READ_CAP: usize = 1 << 20;
/// How long shutdown waits for pending replies to drain before closing anyway.
pub const SHUTDOWN_FLUSH: Duration = Duration::from_secs(2);
/// Free space wanted in a read buffer before a `recv`.
const MIN_READ: usize = 16 << 10;
/// The scratch read buffer's capacity.
const SCRATCH: usize = 64 << 10;
/// A connection's output buffer is freed after a flush when it grew beyond this.
const OUT_KEEP: usize = 64 << 10;
/// Freed buffer bytes that make a thread return memory to the OS (see `Worker::maybe_trim`).
const TRIM_AFTER: usize = 1 << 20;
/// The least time between two `malloc_trim` calls of one thread (a trim costs a walk of the
/// allocator's free lists, and pages given back are faulted in again when reused).
const TRIM_EVERY: Duration = Duration::from_millis(250);
/// Unfinished requests at least this large are tracked globally for the budget.
const BIG_BUFFER: u64 = 1 << 20;
/// How long an event loop polls for events before it sleeps, while events keep coming within
/// it (`Worker::run`). Measured on this 2-vCPU VM with redis-benchmark -P 16 GET (5 runs each,
/// interleaved): median 1.36 M/s sleeping at once, 1.46 M/s polling 50 µs first.
const BUSY_POLL: Duration = Duration::from_micros(50);
/// How long accepting pauses after running out of file descriptors.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// The Redis reply to a connection beyond `maxclients`.
const MAX_CLIENTS_REPLY: &[u8] = b"-ERR max number of clients reached\r\n";

/// epoll tokens: the eventfd, the listeners (below it), connections (slot | generation << 32).
const WAKE_TOKEN: u64 = u64::MAX;
const LISTENER_TOKEN_BASE: u64 = u64::MAX - 1;
const MAX_LISTENERS: u64 = 1 << 16;

/// Asks a running server to shut down; cheap to clone; see [`ShutdownTrigger::request`].
#[derive(Clone)]
pub struct ShutdownTrigger {
    shared: Arc<Shared>,
}

impl ShutdownTrigger {
    /// Asks every event-loop thread to flush, close its connections and exit. Idempotent.
    /// Async-signal-safe: an atomic store and one `write(2)` per thread to an eventfd, no
    /// allocation or lock — a SIGTERM/SIGINT handler may call it (on a trigger it can reach
    /// without locking, e.g. one stored in a `static OnceLock` before the handler is installed).
    pub fn request(&self) {
        self.shared.request_shutdown();
    }
}

impl std::fmt::Debug for ShutdownTrigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShutdownTrigger").finish_non_exhaustive()
    }
}

/// A running server: its addresses, a way to stop it, and its threads.
pub struct ServerHandle {
    tcp_addrs: Vec<SocketAddr>,
    unix_path: Option<PathBuf>,
    trigger: ShutdownTrigger,
    threads: Vec<JoinHandle<()>>,
}

impl ServerHandle {
    /// The TCP addresses listened on, with the actual ports (useful with port 0).
    pub fn tcp_addrs(&self) -> &[SocketAddr] {
        &self.tcp_addrs
    }

    /// The Unix socket path listened on, if any.
    pub fn unix_path(&self) -> Option<&Path> {
        self.unix_path.as_deref()
    }

    /// A trigger that can stop the server from elsewhere (another thread, a signal handler).
    pub fn shutdown_trigger(&self) -> ShutdownTrigger {
        self.trigger.clone()
    }

    /// Asks the server to shut down (see [`ShutdownTrigger::request`]); [`ServerHandle::join`]
    /// waits for it.
    pub fn shutdown(&self) {
        self.trigger.request();
    }

    /// Waits for every event-loop thread to exit (after a shutdown request, or a SHUTDOWN
    /// command). Err if a thread panicked (a bug in the server, not in the service, whose
    /// panics are caught).
    pub fn join(mut self) -> io::Result<()> {
        self.join_threads()
    }

    fn join_threads(&mut self) -> io::Result<()> {
        let mut result = Ok(());
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                result = Err(io::Error::other("a tiermem-kv event-loop thread panicked"));
            }
        }
        // Connections thread 0 handed to a thread that had already exited.
        let shared = &self.trigger.shared;
        for inbox in &shared.inboxes {
            let late = std::mem::take(&mut *inbox.lock());
            shared
                .stats
                .connected_clients
                .fetch_sub(late.len() as u64, Ordering::Relaxed);
        }
        result
    }
}

impl Drop for ServerHandle {
    /// A handle dropped without [`ServerHandle::join`] shuts the server down and waits for it.
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.trigger.request();
            let _ = self.join_threads();
        }
    }
}

/// Starts the server on `config`'s addresses and returns once it listens: the OS-chosen ports
/// of a port 0 and the Unix socket are in the handle. Errors: invalid configuration, an address
/// that cannot be bound (except optional `-` binds), an existing non-socket file at the Unix
/// socket path, or no event-loop resources. Its limits stay `config`'s ([`start_with`] takes
/// settings that change at run time).
pub fn start<S: Service>(
    config: &ServerConfig,
    service: Arc<S>,
    stats: Arc<ServerStats>,
) -> io::Result<ServerHandle> {
    start_with(
        config,
        Arc::new(Runtime::for_server(config)),
        service,
        stats,
    )
}

/// [`start`], with the limits read from `runtime` at each use (created from the same
/// configuration; `CONFIG SET` changes it): `config` gives what is fixed at start (addresses,
/// threads). The server registers with `runtime`: its counters (for `CONFIG RESETSTAT`) and a
/// wake-up of every event loop after each change (so a new timeout takes effect in a loop
/// that sleeps without a timer).
pub fn start_with<S: Service>(
    config: &ServerConfig,
    runtime: Arc<Runtime>,
    service: Arc<S>,
    stats: Arc<ServerStats>,
) -> io::Result<ServerHandle> {
    config
        .validate()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let max_clients = raise_fd_limit(config.max_clients);
    runtime.set_effective_max_clients(max_clients as u64);
    runtime.set_stats(Arc::clone(&stats));

    let mut listeners = Vec::new();
    let mut tcp_addrs = Vec::new();
    for entry in &config.bind {
        let (ip, optional) =
            parse_bind(entry).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let addr = SocketAddr::new(ip, config.port);
        let listener = match TcpListener::bind(addr) {
            Ok(l) => l,
            Err(e)
                if optional
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::EADDRNOTAVAIL) | Some(libc::EAFNOSUPPORT)
                    ) =>
            {
                continue
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("cannot bind {addr}: {e}"))),
        };
        listener.set_nonblocking(true)?;
        set_backlog(listener.as_raw_fd());
        tcp_addrs.push(listener.local_addr()?);
        listeners.push(Listener::Tcp(listener));
    }
    let mut unix_path = None;
    let mut unlink_guard = UnlinkOnDrop(None);
    if let Some(path) = &config.unix_socket {
        // Like Redis, replace a stale socket file; refuse to delete anything else.
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot bind {}: {e}", path.display()))
        })?;
        unlink_guard.0 = Some(path.clone());
        if let Some(perm) = config.unix_socket_perm {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(perm))?;
        }
        listener.set_nonblocking(true)?;
        set_backlog(listener.as_raw_fd());
        unix_path = Some(path.clone());
        listeners.push(Listener::Unix(listener, path.clone()));
    }
    if listeners.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            "none of the bind addresses is available",
        ));
    }

    let threads = config.threads;
    let mut wakers = Vec::with_capacity(threads);
    let mut epolls = Vec::with_capacity(threads);
    for _ in 0..threads {
        wakers.push(eventfd()?);
        epolls.push(Epoll::new()?);
    }
    let shared = Arc::new(Shared {
        shutdown: AtomicBool::new(false),
        wake_fds: wakers.iter().map(|w| w.as_raw_fd()).collect(),
        _wakers: wakers,
        inboxes: (0..threads).map(|_| Mutex::new(Vec::new())).collect(),
        evictions: (0..threads).map(|_| Mutex::new(Vec::new())).collect(),
        pushes: (0..threads).map(|_| Mutex::new(Vec::new())).collect(),
        wakes: (0..threads).map(|_| Mutex::new(Vec::new())).collect(),
        closes: (0..threads).map(|_| Mutex::new(Vec::new())).collect(),
        buffered: AtomicU64::new(0),
        evicting: AtomicU64::new(0),
        big: Mutex::new(HashMap::new()),
        rt: Arc::clone(&runtime),
        threads,
        next_thread: AtomicUsize::new(0),
        stats: Arc::clone(&stats),
    });

    {
        let weak = Arc::downgrade(&shared);
        runtime.on_change(Box::new(move || {
            if let Some(sh) = weak.upgrade() {
                for t in 0..sh.threads {
                    sh.wake(t);
                }
            }
        }));
    }
    let mut handles = Vec::with_capacity(threads);
    let mut listeners = Some(listeners);
    for (id, epoll) in epolls.into_iter().enumerate() {
        let mut worker = Worker::new(
            id,
            epoll,
            Arc::clone(&shared),
            Arc::clone(&service),
            Arc::clone(&stats),
        )?;
        if id == 0 {
            worker.set_listeners(listeners.take().unwrap_or_default())?;
        }
        let spawned = std::thread::Builder::new()
            .name(format!("kv-net-{id}"))
            .spawn(move || worker.run());
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                shared.request_shutdown();
                for h in handles {
                    let _ = h.join();
                }
                return Err(e);
            }
        }
    }
    // From here on thread 0 removes the socket file at shutdown.
    unlink_guard.0 = None;
    Ok(ServerHandle {
        tcp_addrs,
        unix_path,
        trigger: ShutdownTrigger { shared },
        threads: handles,
    })
}

/// [`start`], then wait until the server shuts down (a SHUTDOWN command, or a trigger obtained
/// elsewhere — use [`start`] to get one).
pub fn serve<S: Service>(
    config: &ServerConfig,
    service: Arc<S>,
    stats: Arc<ServerStats>,
) -> io::Result<()> {
    start(config, service, stats)?.join()
}

// ---------------------------------------------------------------------------------------------
// Shared state and OS helpers.

/// Removes a Unix socket file when `start` fails after creating it.
struct UnlinkOnDrop(Option<PathBuf>);

impl Drop for UnlinkOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A connection's token and bytes pushed to it ([`ConnHandle::push`]).
type Push = (u64, Vec<u8>);

/// What the event-loop threads share.
struct Shared {
    shutdown: AtomicBool,
    /// The raw fds of `_wakers`, for the signal-safe trigger.
    wake_fds: Vec<RawFd>,
    /// One eventfd per thread (kept open as long as anything can write to it).
    _wakers: Vec<OwnedFd>,
    /// New connections handed to each thread by thread 0.
    inboxes: Vec<Mutex<Vec<NewConn>>>,
    /// Connections (token, bytes) each thread is asked to close for the budget.
    evictions: Vec<Mutex<Vec<(u64, u64)>>>,
    /// Bytes to append to each thread's connections' output ([`ConnHandle`]).
    pushes: Vec<Mutex<Vec<Push>>>,
    /// Blocked connections of each thread to run again ([`ConnHandle::wake`]).
    wakes: Vec<Mutex<Vec<u64>>>,
    /// Connections of each thread to close ([`ConnHandle::close`]).
    closes: Vec<Mutex<Vec<u64>>>,
    /// All unfinished request bytes held by every connection.
    buffered: AtomicU64,
    /// Bytes of `buffered` whose connections another thread was asked to close (not yet done):
    /// the budget counts `buffered - evicting`, so one victim is not chased by several cuts.
    evicting: AtomicU64,
    /// Unfinished requests of at least [`BIG_BUFFER`] bytes: (thread, token) -> bytes.
    big: Mutex<HashMap<(usize, u64), u64>>,
    /// The limits, read at each use.
    rt: Arc<Runtime>,
    threads: usize,
    next_thread: AtomicUsize,
    stats: Arc<ServerStats>,
}

impl Shared {
    /// Async-signal-safe (see [`ShutdownTrigger::request`]).
    fn request_shutdown(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        for &fd in &self.wake_fds {
            wake_fd(fd);
        }
    }

    fn wake(&self, thread: usize) {
        // Out of range only through a bug (thread ids are < `threads`): then nobody is woken.
        if let Some(&fd) = self.wake_fds.get(thread) {
            wake_fd(fd);
        }
    }
}

/// Adds 1 to an eventfd (async-signal-safe; a full counter or a closed fd is ignored: the
/// reader is awake or gone).
fn wake_fd(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live local to an fd; an invalid fd only yields EBADF.
    unsafe {
        libc::write(fd, (&one as *const u64).cast(), 8);
    }
}

/// A non-blocking, close-on-exec eventfd.
fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd has no memory arguments.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Re-listens with Redis's default backlog (511; std uses 128), capped by the kernel's somaxconn.
fn set_backlog(fd: RawFd) {
    // SAFETY: listen on a socket we own; calling it again on a listening socket only updates the
    // backlog; failure is harmless (the old backlog stays).
    unsafe {
        libc::listen(fd, 511);
    }
}

/// Raises the soft open-file limit so `max_clients` connections fit (plus room for listeners,
/// the engine's files, ...), as Redis does; returns the `maxclients` that fits afterwards, and
/// says so when that is fewer.
fn raise_fd_limit(max_clients: usize) -> usize {
    let fit = fit_max_clients(max_clients);
    if fit < max_clients {
        eprintln!(
            "tiermem-kv: the open-file limit allows {fit} clients, not maxclients {max_clients}"
        );
    }
    fit
}

/// Raises the process's soft open-file limit (up to its hard limit) so that `max_clients`
/// connections fit with room to spare, as Redis does for `maxclients`; returns how many
/// clients fit afterwards (`max_clients` when they all do). For `CONFIG SET maxclients`.
pub fn fit_max_clients(max_clients: usize) -> usize {
    const RESERVED: u64 = 64;
    let want = (max_clients as u64).saturating_add(RESERVED);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into a live local of the right type.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return max_clients;
    }
    if lim.rlim_cur < want {
        let new = libc::rlimit {
            rlim_cur: want.min(lim.rlim_max),
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads a live local of the right type.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            lim.rlim_cur = new.rlim_cur;
        }
    }
    if lim.rlim_cur < want {
        lim.rlim_cur.saturating_sub(RESERVED).max(1) as usize
    } else {
        max_clients
    }
}

/// An epoll instance.
struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 has no memory arguments.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a new descriptor that nothing else owns.
        Ok(Epoll {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: ev is a live, initialised epoll_event; the kernel validates the fds.
        if unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn add(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, token)
    }

    fn modify(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, events, token)
    }

    fn delete(&self, fd: RawFd) {
        let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0);
    }

    /// [`Epoll::wait`], polling without sleeping for up to `spin` first: on this VM a thread
    /// that sleeps in epoll_wait costs the next request a vCPU wake-up, which under a
    /// saturating load (redis-benchmark -P 16, pipelined GET) took ~7 % of the throughput.
    fn wait_spinning(
        &self,
        events: &mut [libc::epoll_event],
        timeout: Option<Duration>,
        spin: Duration,
    ) -> usize {
        let t0 = Instant::now();
        loop {
            let n = self.wait(events, Some(Duration::ZERO));
            if n > 0 {
                return n;
            }
            let spent = t0.elapsed();
            if spent >= spin || timeout.is_some_and(|t| spent >= t) {
                return self.wait(events, timeout.map(|t| t.saturating_sub(spent)));
            }
            std::hint::spin_loop();
        }
    }

    /// Waits up to `timeout` (None: forever) and returns the number of events filled in.
    fn wait(&self, events: &mut [libc::epoll_event], timeout: Option<Duration>) -> usize {
        let ms = match timeout {
            None => -1,
            Some(d) => (d.as_millis().min(i32::MAX as u128) as i32)
                .saturating_add(i32::from(d.subsec_nanos() % 1_000_000 != 0)),
        };
        let cap = events.len().min(i32::MAX as usize) as i32;
        // SAFETY: the kernel writes at most `cap` events into the live slice.
        let n = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), events.as_mut_ptr(), cap, ms) };
        // EINTR (or any other error of a valid epoll fd): no events this time. The kernel
        // returns at most `cap`; the `min` keeps callers' `events[..n]` in bounds regardless.
        (n.max(0) as usize).min(events.len())
    }
}

/// `recv` into `buf`'s spare capacity; Ok(0) is end of stream.
fn recv_into(fd: RawFd, buf: &mut IoBuf, max: usize) -> io::Result<usize> {
    let len = (buf.capacity() - buf.len()).min(max);
    let spare = buf.spare_ptr();
    loop {
        // SAFETY: the kernel writes at most `len` bytes into the spare capacity, which is
        // allocated and writable.
        let n = unsafe { libc::recv(fd, spare.cast(), len, 0) };
        if n >= 0 {
            let n = n as usize;
            // SAFETY: the kernel initialised the first n <= len bytes of the spare capacity.
            unsafe { buf.set_len(buf.len() + n) };
            return Ok(n);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `send` without SIGPIPE (a peer that closed must not kill the process).
fn send_nosignal(fd: RawFd, data: &[u8], flags: libc::c_int) -> io::Result<usize> {
    loop {
        // SAFETY: the kernel reads at most data.len() bytes from the live slice.
        let n = unsafe {
            libc::send(
                fd,
                data.as_ptr().cast(),
                data.len(),
                flags | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A listening socket of thread 0.
enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    fn fd(&self) -> RawFd {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l, _) => l.as_raw_fd(),
        }
    }

    /// The next connection: its socket (non-blocking; TCP_NODELAY for TCP) and peer name.
    fn accept(&self) -> io::Result<(OwnedFd, String)> {
        match self {
            Listener::Tcp(l) => {
                let (s, addr) = l.accept()?;
                s.set_nonblocking(true)?;
                s.set_nodelay(true)?;
                Ok((s.into(), addr.to_string()))
            }
            Listener::Unix(l, path) => {
                let (s, _) = l.accept()?;
                s.set_nonblocking(true)?;
                Ok((s.into(), path.display().to_string()))
            }
        }
    }
}

/// A connection accepted by thread 0 for another thread.
struct NewConn {
    fd: OwnedFd,
    peer: String,
}

// ---------------------------------------------------------------------------------------------
// Connections and event-loop threads.

/// Why a client was closed by a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    QueryLimit,
    Budget,
    Timeout,
    Output,
    Idle,
    Panic,
}

/// One client connection.
struct Conn<Sess> {
    fd: OwnedFd,
    session: Option<Sess>,
    parser: RequestParser,
    /// The unfinished request's bytes; empty (no allocation) between requests.
    inbuf: IoBuf,
    /// Replies not yet sent: `out[out_pos..]`.
    out: Vec<u8>,
    out_pos: usize,
    /// Bytes of this connection counted in `Shared::buffered`.
    accounted: u64,
    /// When the last byte arrived.
    last_input: Instant,
    /// When the client last sent something or was last sent a reply (the idle timeout).
    last_active: Instant,
    /// A subscriber (set by the service through its [`ConnHandle`]).
    subscriber: Arc<AtomicBool>,
    /// No more input: send the replies, then close.
    closing: bool,
    /// EPOLLOUT is registered.
    want_write: bool,
    /// Queued in the thread's flush list for this round.
    queued: bool,
    /// Blocked ([`Control::Block`]): the requests to run again, the first one blocked.
    pending: Vec<Vec<Vec<u8>>>,
    /// Whether it is blocked, and until when.
    blocked: bool,
    deadline: Option<Instant>,
}

/// A slab entry: a connection and the generation that makes tokens of closed ones stale.
struct Slot<Sess> {
    gen: u32,
    conn: Option<Conn<Sess>>,
}

fn token(idx: usize, gen: u32) -> u64 {
    (u64::from(gen) << 32) | idx as u64
}

fn token_parts(tok: u64) -> (usize, u32) {
    ((tok & 0xffff_ffff) as usize, (tok >> 32) as u32)
}

/// The outcome of reading and executing a connection's input.
enum Outcome {
    Keep,
    Close,
    Cut(Cut),
    /// A request blocked (its requests are in `Conn::pending`).
    Block(Option<Instant>),
}

/// Epoll interest of a connection: nothing while closing; only a hang-up while blocked (its
/// input waits); else input; plus EPOLLOUT while replies are pending.
fn interest(closing: bool, blocked: bool, want_write: bool) -> u32 {
    (if closing {
        0
    } else if blocked {
        libc::EPOLLRDHUP as u32
    } else {
        libc::EPOLLIN as u32
    }) | if want_write { libc::EPOLLOUT as u32 } else { 0 }
}

/// One event-loop thread.
struct Worker<S: Service> {
    id: usize,
    epoll: Epoll,
    shared: Arc<Shared>,
    service: Arc<S>,
    stats: Arc<ServerStats>,
    listeners: Vec<Listener>,
    accept_paused_until: Option<Instant>,
    slots: Vec<Slot<S::Session>>,
    free: Vec<usize>,
    live: usize,
    scratch: IoBuf,
    pool: VecPool,
    /// Connections with replies to send at the end of the round.
    flush: Vec<u64>,
    /// Connections holding an unfinished request.
    partial: usize,
    next_tick: Instant,
    /// Buffer bytes freed since the last `malloc_trim` (see [`Worker::maybe_trim`]).
    freed: usize,
    /// The earliest time of the next `malloc_trim`.
    next_trim: Instant,
    /// Deadlines of blocked connections (stale entries are skipped).
    deadlines: std::collections::BTreeSet<(Instant, u64)>,
    /// The last wait was shorter than [`BUSY_POLL`]: poll before sleeping in the next.
    spin_next: bool,
}

impl<S: Service> Worker<S> {
    fn new(
        id: usize,
        epoll: Epoll,
        shared: Arc<Shared>,
        service: Arc<S>,
        stats: Arc<ServerStats>,
    ) -> io::Result<Self> {
        // `id < threads == wake_fds.len()` (`start` numbers the workers it creates).
        epoll.add(shared.wake_fds[id], libc::EPOLLIN as u32, WAKE_TOKEN)?;
        Ok(Worker {
            id,
            epoll,
            shared,
            service,
            stats,
            listeners: Vec::new(),
            accept_paused_until: None,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            scratch: IoBuf::with_capacity(SCRATCH),
            pool: VecPool::new(),
            flush: Vec::new(),
            partial: 0,
            spin_next: false,
            next_tick: Instant::now(),
            freed: 0,
            next_trim: Instant::now(),
            deadlines: std::collections::BTreeSet::new(),
        })
    }

    fn set_listeners(&mut self, listeners: Vec<Listener>) -> io::Result<()> {
        if listeners.len() as u64 >= MAX_LISTENERS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("too many bind addresses (at most {})", MAX_LISTENERS - 1),
            ));
        }
        for (i, l) in listeners.iter().enumerate() {
            self.epoll
                .add(l.fd(), libc::EPOLLIN as u32, LISTENER_TOKEN_BASE - i as u64)?;
        }
        self.listeners = listeners;
        Ok(())
    }

    /// How often connections are checked against the timeouts: a quarter of the shorter one,
    /// between 10 ms and 1 s.
    fn tick_period(&self) -> Duration {
        let rt = &self.shared.rt;
        [rt.unfinished_frame_timeout(), rt.idle_timeout()]
            .into_iter()
            .filter(|t| !t.is_zero())
            .map(|t| t / 4)
            .fold(Duration::from_secs(1), Duration::min)
            .max(Duration::from_millis(10))
    }

    /// Whether a timer must check this thread's connections: unfinished requests under
    /// `unfinished-frame-timeout`, or any connection under `timeout`.
    fn ticking(&self) -> bool {
        let rt = &self.shared.rt;
        (self.partial > 0 && !rt.unfinished_frame_timeout().is_zero())
            || (self.live > 0 && !rt.idle_timeout().is_zero())
    }

    fn run(mut self) {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        loop {
            let now = Instant::now();
            let mut timeout: Option<Duration> = None;
            if self.ticking() {
                timeout = Some(self.next_tick.saturating_duration_since(now));
            }
            if let Some(t) = self.accept_paused_until {
                let d = t.saturating_duration_since(now);
                timeout = Some(timeout.map_or(d, |x| x.min(d)));
            }
            if self.freed > 0 {
                let d = self.next_trim.saturating_duration_since(now);
                timeout = Some(timeout.map_or(d, |x| x.min(d)));
            }
            if let Some(&(t, _)) = self.deadlines.first() {
                let d = t.saturating_duration_since(now);
                timeout = Some(timeout.map_or(d, |x| x.min(d)));
            }
            // Busy polling while work comes faster than a sleep and a wake-up (the last wait
            // was shorter than the spin); a thread whose waits are longer sleeps at once, so a
            // lightly loaded server burns nothing.
            let n = if self.spin_next {
                self.epoll.wait_spinning(&mut events, timeout, BUSY_POLL)
            } else {
                self.epoll.wait(&mut events, timeout)
            };
            let waited = now.elapsed();
            self.spin_next = n > 0 && waited < BUSY_POLL;
            let now = Instant::now();
            let mut executed = false;
            while let Some(&(t, tok)) = self.deadlines.first() {
                if t > now {
                    break;
                }
                self.deadlines.pop_first();
                if self
                    .conn(tok)
                    .is_some_and(|c| c.blocked && c.deadline == Some(t))
                {
                    executed |= self.resume(tok, now);
                }
            }
            for ev in &events[..n] {
                let (flags, tok) = (ev.events, ev.u64);
                if tok == WAKE_TOKEN {
                    executed |= self.on_wake(now);
                } else if tok > LISTENER_TOKEN_BASE - MAX_LISTENERS {
                    self.accept((LISTENER_TOKEN_BASE - tok) as usize, now);
                } else {
                    executed |= self.on_conn_event(tok, flags, now);
                }
            }
            if executed {
                let service = &self.service;
                let send = match catch_unwind(AssertUnwindSafe(|| service.round_end())) {
                    Ok(send) => send,
                    Err(_) => {
                        self.stats.service_panics.fetch_add(1, Ordering::Relaxed);
                        eprintln!("tiermem-kv: the service panicked in round_end");
                        false
                    }
                };
                if !send {
                    // Replies that would report writes the service could not make durable:
                    // the clients see their connections close instead.
                    for tok in std::mem::take(&mut self.flush) {
                        self.close(tok);
                    }
                }
            }
            self.flush_round();
            self.enforce_budget();
            if now >= self.next_tick {
                self.tick(now);
            }
            self.maybe_trim(now, n == 0);
            if self.shared.shutdown.load(Ordering::SeqCst) {
                self.drain_and_exit();
                return;
            }
        }
    }

    /// The eventfd fired: new connections, eviction requests, pushes, blocked connections to
    /// run again, or shutdown (checked by `run`). True if requests were executed.
    fn on_wake(&mut self, now: Instant) -> bool {
        // Here and below, `self.id` indexes the per-thread vectors of `Shared`, all `threads`
        // long, and `self.id < threads` (see `Worker::new`).
        let mut counter = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live local; the eventfd is non-blocking.
        unsafe {
            libc::read(
                self.shared.wake_fds[self.id],
                counter.as_mut_ptr().cast(),
                8,
            );
        }
        let new: Vec<NewConn> = std::mem::take(&mut *self.shared.inboxes[self.id].lock());
        for c in new {
            self.register(c.fd, &c.peer, now);
        }
        let evict: Vec<(u64, u64)> = std::mem::take(&mut *self.shared.evictions[self.id].lock());
        for (tok, bytes) in evict {
            if self.conn(tok).is_some() {
                self.cut(tok, Cut::Budget);
            }
            self.shared.evicting.fetch_sub(bytes, Ordering::Relaxed);
        }
        let pushes: Vec<Push> = std::mem::take(&mut *self.shared.pushes[self.id].lock());
        let limit = self.shared.rt.client_output_buffer_limit();
        for (tok, bytes) in pushes {
            let Some(c) = self.conn(tok) else {
                continue; // closed meanwhile
            };
            if c.closing {
                continue;
            }
            c.out.extend_from_slice(&bytes);
            if limit != 0 && (c.out.len() - c.out_pos) as u64 > limit {
                // A subscriber that does not read its messages (Redis' pubsub output limit).
                self.cut(tok, Cut::Output);
                continue;
            }
            self.queue_flush(tok);
        }
        let closes: Vec<u64> = std::mem::take(&mut *self.shared.closes[self.id].lock());
        for tok in closes {
            if let Some(c) = self.conn(tok) {
                c.closing = true;
                self.set_interest(tok);
                self.queue_flush(tok);
            }
        }
        let wakes: Vec<u64> = std::mem::take(&mut *self.shared.wakes[self.id].lock());
        let mut executed = false;
        for tok in wakes {
            executed |= self.resume(tok, now);
        }
        executed
    }

    /// Runs a blocked connection's pending requests again (woken, or at its deadline); then,
    /// if it no longer blocks, whatever input waits. True if requests were executed.
    fn resume(&mut self, tok: u64, now: Instant) -> bool {
        let limit = self.shared.rt.client_output_buffer_limit();
        let service = Arc::clone(&self.service);
        let Some(c) = self.conn(tok) else {
            return false;
        };
        if !c.blocked || c.closing {
            return false;
        }
        c.blocked = false;
        c.deadline = None;
        c.last_active = now;
        let pending = std::mem::take(&mut c.pending);
        let reqs: Vec<Vec<&[u8]>> = pending
            .iter()
            .map(|r| r.iter().map(|a| a.as_slice()).collect())
            .collect();
        if c.out_pos > 0 && c.out_pos >= c.out.len() - c.out_pos {
            c.out.drain(..c.out_pos);
            c.out_pos = 0;
        }
        let out_limit = match limit {
            0 => usize::MAX,
            l => c
                .out_pos
                .saturating_add(usize::try_from(l).unwrap_or(usize::MAX)),
        };
        let (out, session) = (&mut c.out, &mut c.session);
        let res = match session.as_mut() {
            None => Ok(Executed::new(Control::Close, 0)),
            Some(sess) => catch_unwind(AssertUnwindSafe(|| {
                service.execute(sess, &reqs, out, out_limit)
            })),
        };
        let e = match res {
            Ok(e) => e,
            Err(_) => {
                self.stats.service_panics.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "tiermem-kv: the service panicked executing a request; closing that client"
                );
                self.cut(tok, Cut::Panic);
                return true;
            }
        };
        let ran = e.ran.min(reqs.len());
        self.stats
            .total_commands_processed
            .fetch_add(ran as u64, Ordering::Relaxed);
        match e.control {
            Control::OutputFull => {
                self.cut(tok, Cut::Output);
                return true;
            }
            Control::Block(until) => {
                if let Some(c) = self.conn(tok) {
                    c.pending = pending[ran..].to_vec();
                    c.blocked = true;
                    c.deadline = until;
                }
                if let Some(t) = until {
                    self.deadlines.insert((t, tok));
                }
            }
            Control::Close => {
                if let Some(c) = self.conn(tok) {
                    c.closing = true;
                }
            }
            Control::Shutdown => {
                if let Some(c) = self.conn(tok) {
                    c.closing = true;
                }
                self.shared.request_shutdown();
            }
            Control::Continue => {}
        }
        self.set_interest(tok);
        self.queue_flush(tok);
        // No longer blocked: the input that waited meanwhile (buffered or in the socket).
        if self.conn(tok).is_some_and(|c| !c.blocked && !c.closing) {
            self.serve_input(tok, now);
        }
        true
    }

    /// Registers the connection's epoll interest as its state says (see [`interest`]).
    fn set_interest(&mut self, tok: u64) {
        let Some(c) = self.conn(tok) else {
            return;
        };
        let (fd, ev) = (
            c.fd.as_raw_fd(),
            interest(c.closing, c.blocked, c.want_write),
        );
        if self.epoll.modify(fd, ev, tok).is_err() {
            self.close(tok);
        }
    }

    /// Accepts what is pending on listener `i` (thread 0 only).
    fn accept(&mut self, i: usize, now: Instant) {
        for _ in 0..1024 {
            let res = match self.listeners.get(i) {
                Some(l) => l.accept(),
                None => return,
            };
            match res {
                Ok((fd, peer)) => self.admit(fd, peer, now),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::ECONNABORTED) | Some(libc::EPROTO)
                    ) => {}
                Err(e) => {
                    // Out of descriptors or memory: stop polling the listeners for a moment
                    // (level-triggered, they would wake us in a loop), then try again.
                    eprintln!("tiermem-kv: accept failed: {e}; pausing accepts");
                    for l in &self.listeners {
                        self.epoll.delete(l.fd());
                    }
                    self.accept_paused_until = Some(now + ACCEPT_PAUSE);
                    return;
                }
            }
        }
    }

    /// Applies `maxclients` to an accepted connection and hands it to a thread.
    fn admit(&mut self, fd: OwnedFd, peer: String, now: Instant) {
        let stats = &self.stats;
        if self.shared.shutdown.load(Ordering::Relaxed) {
            return;
        }
        if stats.connected_clients.load(Ordering::Relaxed) >= self.shared.rt.max_clients() {
            stats.rejected_connections.fetch_add(1, Ordering::Relaxed);
            let _ = send_nosignal(fd.as_raw_fd(), MAX_CLIENTS_REPLY, libc::MSG_DONTWAIT);
            return;
        }
        stats.connected_clients.fetch_add(1, Ordering::Relaxed);
        stats
            .total_connections_received
            .fetch_add(1, Ordering::Relaxed);
        // `threads >= 1` (validated), so `target < threads`, the length of `inboxes`.
        let target = self.shared.next_thread.fetch_add(1, Ordering::Relaxed) % self.shared.threads;
        if target == self.id {
            self.register(fd, &peer, now);
        } else {
            self.shared.inboxes[target]
                .lock()
                .push(NewConn { fd, peer });
            self.shared.wake(target);
        }
    }

    /// Makes an accepted connection (already counted in `connected_clients`) one of ours.
    fn register(&mut self, fd: OwnedFd, peer: &str, now: Instant) {
        if self.shared.shutdown.load(Ordering::Relaxed) {
            self.stats.connected_clients.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        // `idx < slots.len()`: the free list holds indices of existing slots (slots never
        // shrink), or a slot was just pushed.
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { gen: 0, conn: None });
                self.slots.len() - 1
            }
        };
        let tok = token(idx, self.slots[idx].gen);
        if let Err(e) = self.epoll.add(fd.as_raw_fd(), libc::EPOLLIN as u32, tok) {
            eprintln!("tiermem-kv: cannot register a connection: {e}");
            self.free.push(idx);
            self.stats.connected_clients.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let service = &self.service;
        let subscriber: Arc<AtomicBool> = Arc::default();
        let handle = ConnHandle {
            shared: Arc::downgrade(&self.shared),
            thread: self.id,
            token: tok,
            subscriber: Arc::clone(&subscriber),
        };
        let session =
            match catch_unwind(AssertUnwindSafe(|| service.open_session_with(peer, handle))) {
                Ok(s) => s,
                Err(_) => {
                    self.stats.service_panics.fetch_add(1, Ordering::Relaxed);
                    eprintln!("tiermem-kv: the service panicked in open_session");
                    self.epoll.delete(fd.as_raw_fd());
                    self.free.push(idx);
                    self.stats.connected_clients.fetch_sub(1, Ordering::Relaxed);
                    return;
                }
            };
        self.slots[idx].conn = Some(Conn {
            fd,
            session: Some(session),
            parser: RequestParser::new(),
            inbuf: IoBuf::new(),
            out: Vec::new(),
            out_pos: 0,
            accounted: 0,
            last_input: now,
            last_active: now,
            subscriber,
            closing: false,
            want_write: false,
            queued: false,
            pending: Vec::new(),
            blocked: false,
            deadline: None,
        });
        self.live += 1;
    }

    /// The live connection of `tok`, if the token is not stale.
    fn conn(&mut self, tok: u64) -> Option<&mut Conn<S::Session>> {
        let (idx, gen) = token_parts(tok);
        match self.slots.get_mut(idx) {
            Some(slot) if slot.gen == gen => slot.conn.as_mut(),
            _ => None,
        }
    }

    /// Handles readiness of a connection; true if requests were executed.
    fn on_conn_event(&mut self, tok: u64, flags: u32, now: Instant) -> bool {
        let readable = flags & (libc::EPOLLIN | libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
        let writable = flags & libc::EPOLLOUT as u32 != 0;
        let Some(conn) = self.conn(tok) else {
            return false;
        };
        if writable || conn.closing {
            self.queue_flush(tok);
        }
        let Some(conn) = self.conn(tok) else {
            return false;
        };
        if conn.blocked {
            // Only a hang-up is listened for while blocked: the client left.
            if flags & (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                self.close(tok);
            }
            return false;
        }
        if !readable || conn.closing {
            return false;
        }
        self.serve_input(tok, now)
    }

    /// Reads and executes the connection's input (see [`Worker::input`]) and acts on the
    /// outcome; true if requests were executed.
    fn serve_input(&mut self, tok: u64, now: Instant) -> bool {
        let (outcome, executed) = self.input(tok, now);
        match outcome {
            Outcome::Keep => {}
            Outcome::Close => {
                if let Some(c) = self.conn(tok) {
                    c.closing = true;
                }
            }
            Outcome::Cut(reason) => {
                self.cut(tok, reason);
                return executed;
            }
            Outcome::Block(until) => {
                if let Some(t) = until {
                    self.deadlines.insert((t, tok));
                }
                self.set_interest(tok);
            }
        }
        self.update_accounting(tok);
        let Some(c) = self.conn(tok) else {
            return executed;
        };
        if c.out.len() > c.out_pos || c.closing {
            // Replies that wait for nothing go now, while the round's other connections are
            // served: the client reads them meanwhile. A connection already queued keeps
            // its place (its earlier replies may be waiting for the round's barrier).
            let queued = c.queued;
            let service = &self.service;
            let early = !queued
                && catch_unwind(AssertUnwindSafe(|| service.replies_ready())).unwrap_or(false);
            if early {
                self.flush_conn(tok);
            } else {
                self.queue_flush(tok);
            }
        }
        executed
    }

    fn queue_flush(&mut self, tok: u64) {
        if let Some(c) = self.conn(tok) {
            if !c.queued {
                c.queued = true;
                self.flush.push(tok);
            }
        }
    }

    /// Reads, parses and executes a connection's input. Returns the outcome and whether
    /// requests were executed.
    fn input(&mut self, tok: u64, now: Instant) -> (Outcome, bool) {
        let (idx, _) = token_parts(tok);
        let Worker {
            slots,
            scratch,
            pool,
            service,
            stats,
            shared,
            freed,
            ..
        } = self;
        let Some(conn) = slots.get_mut(idx).and_then(|s| s.conn.as_mut()) else {
            return (Outcome::Keep, false);
        };
        let fd = conn.fd.as_raw_fd();

        // Read: into the thread's scratch buffer between requests, else into the connection's.
        let use_scratch = conn.inbuf.is_empty();
        let buf: &mut IoBuf = if use_scratch {
            scratch.clear();
            scratch
        } else {
            &mut conn.inbuf
        };
        let mut eof = false;
        let mut total = 0;
        loop {
            let want = conn
                .parser
                .bulk_remaining(buf.len())
                .unwrap_or(0)
                .clamp(MIN_READ, READ_CAP);
            if buf.capacity() - buf.len() < MIN_READ {
                buf.reserve(want);
            }
            let room = (buf.capacity() - buf.len()).min(READ_CAP - total);
            match recv_into(fd, buf, room) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => {
                    total += n;
                    if n < room || total >= READ_CAP {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return (Outcome::Close, false), // reset by peer etc.: nothing to send
            }
        }
        if total > 0 {
            stats
                .total_net_input_bytes
                .fetch_add(total as u64, Ordering::Relaxed);
            conn.last_input = now;
            conn.last_active = now;
        }

        // Parse and execute.
        let mut requests = pool.requests();
        let limits = shared.rt.limits();
        let parsed = conn
            .parser
            .parse(&limits, &mut buf[..], &mut requests, pool);
        let mut control = Control::Continue;
        let mut panicked = false;
        let executed = !requests.is_empty();
        if executed {
            // Sent replies still at the front of `out` (after a partial send) are dead bytes:
            // move the pending ones down once they are no more than the dead ones (amortised
            // O(1) per byte sent), so `out` holds at most twice the pending bytes.
            if conn.out_pos > 0 && conn.out_pos >= conn.out.len() - conn.out_pos {
                conn.out.drain(..conn.out_pos);
                conn.out_pos = 0;
            }
            let output_limit = shared.rt.client_output_buffer_limit();
            let out_limit = match output_limit {
                0 => usize::MAX,
                l => conn
                    .out_pos
                    .saturating_add(usize::try_from(l).unwrap_or(usize::MAX)),
            };
            let out = &mut conn.out;
            let reqs = &requests;
            let ran = match conn.session.as_mut() {
                // A live connection always has a session (taken only by `close`).
                None => {
                    control = Control::Close;
                    0
                }
                Some(session) => match catch_unwind(AssertUnwindSafe(|| {
                    service.execute(session, reqs, out, out_limit)
                })) {
                    Ok(e) => {
                        control = e.control;
                        let ran = e.ran.min(reqs.len());
                        if let Control::Block(until) = control {
                            conn.pending = reqs[ran..]
                                .iter()
                                .map(|r| r.iter().map(|a| a.to_vec()).collect())
                                .collect();
                            conn.blocked = true;
                            conn.deadline = until;
                        }
                        ran
                    }
                    Err(_) => {
                        panicked = true;
                        reqs.len()
                    }
                },
            };
            stats
                .total_commands_processed
                .fetch_add(ran as u64, Ordering::Relaxed);
        }
        pool.give_back(requests);
        if panicked {
            stats.service_panics.fetch_add(1, Ordering::Relaxed);
            eprintln!("tiermem-kv: the service panicked executing a request; closing that client");
            return (Outcome::Cut(Cut::Panic), executed);
        }
        if control == Control::OutputFull {
            return (Outcome::Cut(Cut::Output), executed);
        }
        let mut close = eof;
        if let Some(e) = parsed.error {
            stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
            e.write_reply(&mut conn.out);
            close = true;
        }
        match control {
            Control::Continue | Control::OutputFull | Control::Block(_) => {}
            Control::Close => close = true,
            Control::Shutdown => {
                close = true;
                shared.request_shutdown();
            }
        }

        // Keep the unfinished request, if any, in the connection's own buffer; give back what
        // the buffer no longer needs.
        let before = conn.inbuf.capacity();
        if close {
            conn.inbuf = IoBuf::new();
            conn.parser.reset();
        } else if use_scratch {
            if parsed.consumed < scratch.len() {
                // `consumed <= scratch.len()`: the parser consumes only bytes it was given.
                conn.inbuf.extend_from_slice(&scratch[parsed.consumed..]);
            }
        } else if parsed.consumed >= conn.inbuf.len() {
            conn.inbuf = IoBuf::new();
        } else {
            conn.inbuf.consume_front(parsed.consumed);
            let (len, cap) = (conn.inbuf.len(), conn.inbuf.capacity());
            if cap > OUT_KEEP && cap > 4 * len {
                conn.inbuf.shrink_to(len.max(MIN_READ));
            }
        }
        *freed += before.saturating_sub(conn.inbuf.capacity());
        if use_scratch && scratch.capacity() > 2 * READ_CAP {
            *freed += scratch.capacity();
            *scratch = IoBuf::with_capacity(SCRATCH);
        }
        if conn.inbuf.len() as u64 > shared.rt.client_query_buffer_limit() {
            return (Outcome::Cut(Cut::QueryLimit), executed);
        }
        // For a service that does not honour the budget.
        let output_limit = shared.rt.client_output_buffer_limit();
        if output_limit != 0 && (conn.out.len() - conn.out_pos) as u64 > output_limit {
            return (Outcome::Cut(Cut::Output), executed);
        }
        if close {
            return (Outcome::Close, executed);
        }
        if let Control::Block(until) = control {
            return (Outcome::Block(until), executed);
        }
        (Outcome::Keep, executed)
    }

    /// Brings `Shared::buffered`, the big-buffer registry and the partial count in line with the
    /// connection's unfinished request.
    fn update_accounting(&mut self, tok: u64) {
        let id = self.id;
        let shared = Arc::clone(&self.shared);
        let Some(conn) = self.conn(tok) else {
            return;
        };
        let old = conn.accounted;
        let new = conn.inbuf.len() as u64;
        if old == new {
            return;
        }
        conn.accounted = new;
        if new > old {
            shared.buffered.fetch_add(new - old, Ordering::Relaxed);
        } else {
            shared.buffered.fetch_sub(old - new, Ordering::Relaxed);
        }
        if old >= BIG_BUFFER || new >= BIG_BUFFER {
            let mut big = shared.big.lock();
            if new >= BIG_BUFFER {
                big.insert((id, tok), new);
            } else {
                big.remove(&(id, tok));
            }
        }
        if old == 0 {
            self.partial += 1;
        } else if new == 0 {
            self.partial -= 1;
        }
    }

    /// While all unfinished requests exceed the budget, closes the client with the largest.
    fn enforce_budget(&mut self) {
        let budget = self.shared.rt.total_query_buffer_budget();
        if budget == 0 {
            return;
        }
        let over = |sh: &Shared| {
            let buffered = sh.buffered.load(Ordering::Relaxed);
            buffered.saturating_sub(sh.evicting.load(Ordering::Relaxed)) > budget
        };
        while over(&self.shared) {
            let victim = {
                let mut big = self.shared.big.lock();
                let best = big.iter().max_by_key(|(_, &v)| v).map(|(&k, &v)| (k, v));
                if let Some((k, _)) = best {
                    big.remove(&k);
                }
                best
            };
            match victim {
                Some(((owner, tok), _)) if owner == self.id => self.cut(tok, Cut::Budget),
                Some(((owner, tok), bytes)) => {
                    // `owner` is a worker id (< threads), as every key of `big` is.
                    self.shared.evicting.fetch_add(bytes, Ordering::Relaxed);
                    self.shared.evictions[owner].lock().push((tok, bytes));
                    self.shared.wake(owner);
                }
                None => {
                    // No buffer is big: close our own largest, if we have one.
                    let largest = self
                        .slots
                        .iter()
                        .enumerate()
                        .filter_map(|(i, s)| {
                            s.conn.as_ref().map(|c| (c.accounted, token(i, s.gen)))
                        })
                        .filter(|&(a, _)| a > 0)
                        .max();
                    match largest {
                        Some((_, tok)) => self.cut(tok, Cut::Budget),
                        None => return,
                    }
                }
            }
        }
    }

    /// Sends the replies of every connection queued this round.
    fn flush_round(&mut self) {
        let mut queue = std::mem::take(&mut self.flush);
        for &tok in &queue {
            if let Some(c) = self.conn(tok) {
                c.queued = false;
                self.flush_conn(tok);
            }
        }
        queue.clear();
        self.flush = queue;
    }

    /// One `send` of the pending replies; closes the connection when it is closing and done,
    /// or on a write error; registers EPOLLOUT when the socket is full.
    fn flush_conn(&mut self, tok: u64) {
        let stats = Arc::clone(&self.stats);
        let Some(c) = self.conn(tok) else {
            return;
        };
        let mut failed = false;
        // `out_pos <= out.len()` always: it only advances by bytes `send` took from the rest.
        if c.out_pos < c.out.len() {
            match send_nosignal(c.fd.as_raw_fd(), &c.out[c.out_pos..], 0) {
                Ok(n) => {
                    c.out_pos += n;
                    stats
                        .total_net_output_bytes
                        .fetch_add(n as u64, Ordering::Relaxed);
                    if n > 0 && c.out_pos < c.out.len() {
                        // A slow reader still being sent a reply is not idle (a reply sent
                        // at once follows its request's input, which counted already).
                        c.last_active = Instant::now();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => failed = true,
            }
        }
        if failed {
            self.close(tok);
            return;
        }
        let done = c.out_pos == c.out.len();
        let mut freed = 0;
        if done {
            c.out_pos = 0;
            if c.out.capacity() > OUT_KEEP {
                freed = c.out.capacity();
                c.out = Vec::new();
            } else {
                c.out.clear();
            }
            if c.closing {
                self.freed += freed;
                self.close(tok);
                return;
            }
        }
        // Interest: EPOLLOUT while replies are pending; EPOLLIN unless closing.
        let want_write = !done;
        let events = interest(c.closing, c.blocked, want_write);
        if want_write != c.want_write || c.closing {
            c.want_write = want_write;
            let fd = c.fd.as_raw_fd();
            if self.epoll.modify(fd, events, tok).is_err() {
                self.close(tok);
            }
        }
        self.freed += freed;
    }

    /// Gives freed buffer memory back to the OS: once [`TRIM_AFTER`] bytes of connection
    /// buffers were freed, at most every [`TRIM_EVERY`], `malloc_trim(0)`. glibc keeps freed
    /// memory in its arenas (buffers of 1 MiB come from an arena, not from their own mapping,
    /// once its mmap threshold has risen past them), so without this a flood of big unfinished
    /// requests left the process as large as the flood after the clients were gone;
    /// `malloc_trim` returns every whole free page of every arena. A fixed `M_MMAP_THRESHOLD`
    /// would do it too, but would change the allocator of a program that embeds the server.
    /// `idle`: the loop woke with no event (its timeout): then any freed byte is enough, so
    /// that what was freed after the last trim, however little each thread counted since,
    /// goes back once the server is quiet.
    fn maybe_trim(&mut self, now: Instant, idle: bool) {
        let enough = self.freed >= TRIM_AFTER || (idle && self.freed > 0);
        if !enough || now < self.next_trim {
            return;
        }
        self.freed = 0;
        self.next_trim = now + TRIM_EVERY;
        #[cfg(target_env = "gnu")]
        // SAFETY: malloc_trim only returns free arena memory to the kernel.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    /// Closes connections whose unfinished request has been silent too long; resumes accepts.
    fn tick(&mut self, now: Instant) {
        self.next_tick = now + self.tick_period();
        if let Some(t) = self.accept_paused_until {
            if now >= t {
                self.accept_paused_until = None;
                for (i, l) in self.listeners.iter().enumerate() {
                    let _ = self.epoll.add(
                        l.fd(),
                        libc::EPOLLIN as u32,
                        LISTENER_TOKEN_BASE - i as u64,
                    );
                }
            }
        }
        self.close_idle(now);
        let timeout = self.shared.rt.unfinished_frame_timeout();
        if self.partial == 0 || timeout.is_zero() {
            return;
        }
        let stale: Vec<u64> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let c = s.conn.as_ref()?;
                (c.accounted > 0 && now.duration_since(c.last_input) >= timeout)
                    .then(|| token(i, s.gen))
            })
            .collect();
        for tok in stale {
            self.cut(tok, Cut::Timeout);
        }
    }

    /// `timeout`: closes the connections idle for longer (neither blocked nor subscribers nor
    /// already closing), as Redis's `clientsCronHandleTimeout` does, without a reply.
    fn close_idle(&mut self, now: Instant) {
        let idle = self.shared.rt.idle_timeout();
        if idle.is_zero() || self.live == 0 {
            return;
        }
        let stale: Vec<u64> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let c = s.conn.as_ref()?;
                (!c.blocked
                    && !c.closing
                    && !c.subscriber.load(Ordering::Relaxed)
                    && now.saturating_duration_since(c.last_active) > idle)
                    .then(|| token(i, s.gen))
            })
            .collect();
        for tok in stale {
            self.cut(tok, Cut::Idle);
        }
    }

    /// Closes a client for a limit (pending replies are dropped).
    fn cut(&mut self, tok: u64, reason: Cut) {
        let s = &self.stats;
        let counter = match reason {
            Cut::QueryLimit => &s.cut_query_buffer_limit,
            Cut::Budget => &s.cut_query_buffer_budget,
            Cut::Timeout => &s.cut_unfinished_frame_timeout,
            Cut::Output => &s.cut_output_buffer_limit,
            Cut::Idle => &s.cut_idle_timeout,
            Cut::Panic => {
                self.close(tok);
                return;
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.close(tok);
    }

    /// Closes a connection: deregisters it, releases its accounting and session.
    fn close(&mut self, tok: u64) {
        let (idx, gen) = token_parts(tok);
        let Some(slot) = self.slots.get_mut(idx) else {
            return;
        };
        if slot.gen != gen {
            return;
        }
        let Some(mut conn) = slot.conn.take() else {
            return;
        };
        slot.gen = (slot.gen + 1) & 0x7fff_ffff;
        self.freed += conn.inbuf.capacity() + conn.out.capacity();
        self.free.push(idx);
        self.live -= 1;
        self.epoll.delete(conn.fd.as_raw_fd());
        if conn.accounted > 0 {
            self.shared
                .buffered
                .fetch_sub(conn.accounted, Ordering::Relaxed);
            self.partial -= 1;
            if conn.accounted >= BIG_BUFFER {
                self.shared.big.lock().remove(&(self.id, tok));
            }
        }
        self.stats.connected_clients.fetch_sub(1, Ordering::Relaxed);
        if let Some(session) = conn.session.take() {
            let service = &self.service;
            if catch_unwind(AssertUnwindSafe(|| service.close_session(session))).is_err() {
                self.stats.service_panics.fetch_add(1, Ordering::Relaxed);
                eprintln!("tiermem-kv: the service panicked in close_session");
            }
        }
        // `conn.fd` closes the socket when `conn` drops here.
    }

    /// Shutdown: stop accepting and reading, flush what is pending (bounded), close everything.
    fn drain_and_exit(&mut self) {
        for l in self.listeners.drain(..) {
            self.epoll.delete(l.fd());
            if let Listener::Unix(_, path) = &l {
                let _ = std::fs::remove_file(path);
            }
        }
        let all: Vec<u64> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.conn.is_some())
            .map(|(i, s)| token(i, s.gen))
            .collect();
        for &tok in &all {
            if let Some(c) = self.conn(tok) {
                c.closing = true;
            }
            self.flush_conn(tok);
        }
        let deadline = Instant::now() + SHUTDOWN_FLUSH;
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        while self.live > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let n = self.epoll.wait(&mut events, Some(deadline - now));
            for ev in &events[..n] {
                let (flags, tok) = (ev.events, ev.u64);
                if tok == WAKE_TOKEN || tok > LISTENER_TOKEN_BASE - MAX_LISTENERS {
                    continue;
                }
                if flags & (libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0 {
                    self.flush_conn(tok);
                }
            }
        }
        for &tok in &all {
            self.close(tok);
        }
        // Connections handed to us after the shutdown began.
        let late = std::mem::take(&mut *self.shared.inboxes[self.id].lock());
        self.stats
            .connected_clients
            .fetch_sub(late.len() as u64, Ordering::Relaxed);
    }
}
