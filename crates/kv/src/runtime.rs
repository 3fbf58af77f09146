//! The settings that change while a server runs ([`Runtime`]): the values the event loops read
//! on every use (client limits, parser limits, timeouts: atomics, read with relaxed loads, no
//! lock on the request path), and the whole configuration as `CONFIG GET` shows it and
//! `CONFIG REWRITE` writes it. Created from the [`KvConfig`] a server starts with, shared by
//! its event loops ([`crate::server::start_with`]) and its command layer
//! ([`crate::commands::KvService::set_runtime`]), changed by `CONFIG SET`
//! ([`Runtime::config_set`]).
//!
//! A change takes effect at each value's next use: the next connection accepted
//! (`maxclients`), the next read of a connection (the parser limits,
//! `client-query-buffer-limit`), the next round (`total-query-buffer-budget`), the next batch
//! of replies (`client-output-buffer-limit`), the next timer tick of each event loop, within a
//! second (`timeout`, `unfinished-frame-timeout`): a change wakes every event loop so that one
//! sleeping without a timer starts ticking. Existing connections are not closed by a lower
//! limit until they next meet it. The encoding thresholds are process-wide
//! ([`crate::config::thresholds`]); `CONFIG SET` updates them too.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use crate::config::{self, KvConfig, ServerConfig};
use crate::resp;
use crate::server::ServerStats;

/// A callback run after every change (the server's event-loop wake-up).
type OnChange = Box<dyn Fn() + Send + Sync>;

/// One server's run-time settings (see the module documentation).
pub struct Runtime {
    max_clients: AtomicU64,
    proto_max_bulk_len: AtomicU64,
    max_multibulk_len: AtomicU64,
    max_inline_len: AtomicU64,
    client_query_buffer_limit: AtomicU64,
    total_query_buffer_budget: AtomicU64,
    /// Nanoseconds.
    unfinished_frame_timeout: AtomicU64,
    client_output_buffer_limit: AtomicU64,
    /// Seconds.
    idle_timeout: AtomicU64,
    /// The configuration as it stands (start values, then every `CONFIG SET`); the lock also
    /// serialises `CONFIG SET`s.
    config: Mutex<KvConfig>,
    on_change: Mutex<Vec<OnChange>>,
    /// The network front end's counters (for `CONFIG RESETSTAT`), once a server runs.
    stats: OnceLock<Arc<ServerStats>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("config", &*self.config.lock())
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// The settings of `cfg` (its thresholds are not made process-wide here: see
    /// [`config::set_thresholds`]).
    pub fn new(cfg: &KvConfig) -> Runtime {
        let rt = Runtime {
            max_clients: AtomicU64::new(0),
            proto_max_bulk_len: AtomicU64::new(0),
            max_multibulk_len: AtomicU64::new(0),
            max_inline_len: AtomicU64::new(0),
            client_query_buffer_limit: AtomicU64::new(0),
            total_query_buffer_budget: AtomicU64::new(0),
            unfinished_frame_timeout: AtomicU64::new(0),
            client_output_buffer_limit: AtomicU64::new(0),
            idle_timeout: AtomicU64::new(0),
            config: Mutex::new(cfg.clone()),
            on_change: Mutex::new(Vec::new()),
            stats: OnceLock::new(),
        };
        rt.store(&cfg.server);
        rt
    }

    /// The settings of a bare network front end: `server` and defaults for the rest.
    pub fn for_server(server: &ServerConfig) -> Runtime {
        Runtime::new(&KvConfig {
            server: server.clone(),
            ..KvConfig::default()
        })
    }

    fn store(&self, s: &ServerConfig) {
        self.max_clients.store(s.max_clients as u64, Relaxed);
        self.proto_max_bulk_len.store(s.proto_max_bulk_len, Relaxed);
        self.max_multibulk_len.store(s.max_multibulk_len, Relaxed);
        self.max_inline_len.store(s.max_inline_len as u64, Relaxed);
        self.client_query_buffer_limit
            .store(s.client_query_buffer_limit, Relaxed);
        self.total_query_buffer_budget
            .store(s.total_query_buffer_budget, Relaxed);
        let uft = u64::try_from(s.unfinished_frame_timeout.as_nanos()).unwrap_or(u64::MAX);
        self.unfinished_frame_timeout.store(uft, Relaxed);
        self.client_output_buffer_limit
            .store(s.client_output_buffer_limit, Relaxed);
        self.idle_timeout.store(s.idle_timeout, Relaxed);
    }

    /// Most simultaneous clients (`maxclients`, as far as the open-file limit allows).
    pub fn max_clients(&self) -> u64 {
        self.max_clients.load(Relaxed)
    }

    /// Sets the `maxclients` in force without changing the configuration (the server at
    /// start, when the open-file limit fits fewer clients).
    pub fn set_effective_max_clients(&self, n: u64) {
        self.max_clients.store(n, Relaxed);
    }

    /// The parser's limits (`proto-max-bulk-len`, `max-multibulk-len`, `max-inline-len`).
    pub fn limits(&self) -> resp::Limits {
        resp::Limits {
            max_bulk_len: self.proto_max_bulk_len.load(Relaxed),
            max_multibulk_len: self.max_multibulk_len.load(Relaxed),
            max_inline_len: self.max_inline_len.load(Relaxed) as usize,
        }
    }

    /// `client-query-buffer-limit`.
    pub fn client_query_buffer_limit(&self) -> u64 {
        self.client_query_buffer_limit.load(Relaxed)
    }

    /// `total-query-buffer-budget` (0: none).
    pub fn total_query_buffer_budget(&self) -> u64 {
        self.total_query_buffer_budget.load(Relaxed)
    }

    /// `unfinished-frame-timeout` (zero: never).
    pub fn unfinished_frame_timeout(&self) -> Duration {
        Duration::from_nanos(self.unfinished_frame_timeout.load(Relaxed))
    }

    /// `client-output-buffer-limit` (0: none).
    pub fn client_output_buffer_limit(&self) -> u64 {
        self.client_output_buffer_limit.load(Relaxed)
    }

    /// `timeout`, the idle-client timeout (zero: never).
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(self.idle_timeout.load(Relaxed))
    }

    /// The configuration as it stands, with the process's encoding thresholds.
    pub fn config(&self) -> KvConfig {
        let mut c = self.config.lock().clone();
        c.thresholds = config::thresholds();
        c
    }

    /// The file `CONFIG REWRITE` rewrites, if the server was started with one.
    pub fn config_file(&self) -> Option<std::path::PathBuf> {
        self.config.lock().config_file.clone()
    }

    /// `CONFIG SET` (pairs as the client sent them): checked as Redis 7.0 checks it
    /// ([`KvConfig::config_set`]; `snapshots`: the server takes snapshots, so the snapshot
    /// keys are live), then a new `maxclients` against the open-file limit (raised as far as
    /// it goes; Redis's "The operating system is not able to handle the specified number of
    /// clients, try with N" when it cannot fit), then applied: the atomics, the thresholds,
    /// the configuration; the event loops are woken. Returns the new configuration (the
    /// caller applies what lives elsewhere: the password, protected mode, the snapshot
    /// settings) or the error reply. All or nothing.
    pub fn config_set(&self, pairs: &[(&str, &str)], snapshots: bool) -> Result<KvConfig, String> {
        let mut cur = self.config.lock();
        cur.thresholds = config::thresholds();
        let next = cur.config_set(pairs, snapshots)?;
        if next.server.max_clients != cur.server.max_clients {
            let want = next.server.max_clients;
            let fit = crate::server::fit_max_clients(want);
            if fit < want {
                return Err(format!(
                    "ERR CONFIG SET failed (possibly related to argument 'maxclients') - The \
                     operating system is not able to handle the specified number of clients, \
                     try with {fit}"
                ));
            }
        }
        let effective = self.max_clients();
        self.store(&next.server);
        if next.server.max_clients == cur.server.max_clients {
            // Unchanged: keep what the open-file limit allowed at start.
            self.set_effective_max_clients(effective);
        }
        if next.thresholds != cur.thresholds {
            config::set_thresholds(next.thresholds);
        }
        *cur = next.clone();
        drop(cur);
        for f in self.on_change.lock().iter() {
            f();
        }
        Ok(next)
    }

    /// Run `f` after every change (the server wakes its event loops with it).
    pub fn on_change(&self, f: OnChange) {
        self.on_change.lock().push(f);
    }

    /// The network front end's counters, for `CONFIG RESETSTAT` (once; later calls are
    /// ignored).
    pub fn set_stats(&self, stats: Arc<ServerStats>) {
        let _ = self.stats.set(stats);
    }

    /// The network front end's counters, once a server runs with these settings.
    pub fn stats(&self) -> Option<&Arc<ServerStats>> {
        self.stats.get()
    }
}
