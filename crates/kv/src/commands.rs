//! The command layer: [`KvService`], the [`Service`] behind the server.
//!
//! ## Concurrency and durability (docs/kv.md)
//!
//! One engine-wide `RwLock`. Read commands hold it shared and read the committed view; write
//! commands hold it exclusively for their whole transaction, from its first write to its
//! commit, and their reply is appended only once the commit has returned — on the vnvm engine,
//! once the transaction is durable. Consecutive commands of one pipeline keep the lock they
//! already hold (a write lock serves reads too: no transaction is open between commands).
//!
//! Commits are *staged* (`Wtx::commit_staged`, vnvm's `nv_commit_staged`): visible at once,
//! durable at the next durability barrier. [`Service::round_end`] — after an event-loop thread
//! executed every ready connection of its wake-up, before it sends any reply — runs one barrier
//! for everything staged so far, by any connection or thread: group commit across connections,
//! one log write-back and one list-word persist per round where a commit used to pay each
//! (on a disk file system, fdatasyncs). A reply is therefore sent only once every write it
//! reports or read is durable. A barrier that fails sends none of the round's replies (the
//! server closes those connections). Sessions opened outside a server sync at the end of each
//! `execute`.
//!
//! * [`Durability::Commit`]: one transaction per write command (each all or nothing).
//! * [`Durability::Pipeline`]: one transaction per pipeline — the write commands of one
//!   [`Service::execute`] batch share one transaction (reads in the batch see the batch's
//!   writes), committed before `execute` returns, and durable before any of the batch's
//!   replies leave (the round's barrier). If a heap error (out of memory, transaction too
//!   large) stops the group midway, the group is aborted and the batch re-executed one
//!   transaction per command (nothing was committed or sent, so the clients cannot tell).
//!
//! Big deletions (DEL of a big value, FLUSHALL) unlink in O(1) and leave the rest to the
//! garbage list ([`crate::ds::garbage`]), freed in bounded batches at each
//! [`Service::round_end`] (or by [`KvService::collect_garbage`] from an idle timer), and at
//! once when a command fails for lack of memory while garbage waits.

mod access;
mod admin;
mod bitfield;
mod bitmaps;
pub mod blocking;
pub mod clients;
mod cmdstats;
mod data;
mod dump;
mod hashes;
mod keys;
pub mod ldfloat;
mod lists;
mod migrate;
pub mod multi;
mod pops;
pub mod pubsub;
pub mod rdb;
mod registry;
pub mod reply;
mod sets;
mod sort;
mod strings;
pub mod table;
mod value;
mod zsets;

use crate::ds::{expire, garbage, Store, View, Wtx};
use crate::heap::{Heap, HeapError, Result};
use crate::server::{Control, Executed, Service};
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use table::{Id, Kind, Spec};

pub use data::{glob, parse_f64, parse_i64};

/// When a write command's transaction commits relative to its reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// One transaction per write command, durable before its reply.
    Commit,
    /// The write commands of one pipeline share one transaction, durable before any of their
    /// replies is sent (acknowledged writes stay durable; fewer commits). The default: what
    /// a crash can lose is the same (writes not yet acknowledged), and a pipeline of N writes
    /// costs one transaction instead of N. `async` is accepted as its former name.
    #[default]
    Pipeline,
}

impl Durability {
    /// The name used by `--durability` and INFO.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Commit => "commit",
            Durability::Pipeline => "pipeline",
        }
    }
}

/// Server facts for INFO that the command layer does not know (port, network counters, ...).
/// The server implements it; its fields are added to (and override same-named fields of) the
/// section's own.
pub trait InfoSource: Send + Sync {
    /// Append `(field, value)` pairs for INFO section `section` (lower case: `server`,
    /// `clients`, `memory`, `persistence`, `stats`, `replication`, `cpu`, `keyspace`, and
    /// `migration`, shown only when it has fields).
    fn info(&self, section: &str, out: &mut Vec<(String, String)>);
}

/// Per-connection state.
#[derive(Debug)]
pub struct Session {
    id: u64,
    name: Option<Vec<u8>>,
    peer: String,
    created: Instant,
    /// The selected database (SELECT).
    db: usize,
    /// Where pub/sub messages for this connection go.
    conn: crate::server::ConnHandle,
    /// Its subscriptions.
    subs: pubsub::Subs,
    /// What it is blocked on (BLPOP and the like), if it is.
    block: Option<blocking::BlockState>,
    /// Authenticated (AUTH, or no password when it connected).
    authed: bool,
    /// It came over the loopback interface or the Unix socket (protected mode).
    local: bool,
    /// What CLIENT LIST shows of it.
    view: clients::SharedView,
    /// The open transaction (MULTI), if any.
    multi: Option<multi::Multi>,
    /// WATCHed keys.
    watch: multi::WatchState,
    /// A server connection: its replies are sent only after the event-loop round's
    /// [`Service::round_end`], which makes the writes they report durable. Otherwise
    /// `execute` does that before it returns.
    round_managed: bool,
}

impl Session {
    /// The client id (CLIENT ID).
    pub fn id(&self) -> u64 {
        self.id
    }
}

#[derive(Default)]
struct Stats {
    connections_total: AtomicU64,
    connected: AtomicU64,
    commands: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    commits: AtomicU64,
    aborts: AtomicU64,
    too_large: AtomicU64,
    oom: AtomicU64,
    gc_work: AtomicU64,
    changes: AtomicU64,
    /// Keys deleted because their deadline passed (INFO expired_keys).
    expired: AtomicU64,
    /// Redis' estimate of the average time to live of volatile keys (ms; INFO keyspace avg_ttl),
    /// updated by the active expiry's samples.
    avg_ttl: AtomicU64,
}

/// Budget (blocks) of one garbage batch at the end of an event-loop round (it runs before the
/// round's replies are sent: ~256 frees keep that delay around 0.1 ms).
pub const GC_ROUND_BUDGET: u64 = 256;

/// Deadlines sampled per active-expiry transaction (Redis: 20 per database and loop).
pub const EXPIRE_SAMPLES: u32 = 20;

/// The Redis command layer over a [`Heap`].
pub struct KvService {
    heap: Heap,
    store: Store,
    lock: RwLock<()>,
    durability: Durability,
    /// DRAM mirror of "the garbage list is not empty" (rebuilt at open, updated after every
    /// commit that may change it).
    garbage: AtomicBool,
    info_source: Option<Arc<dyn InfoSource>>,
    config: Vec<(String, String)>,
    started: Instant,
    last_save: AtomicU64,
    run_id: String,
    next_client: AtomicU64,
    stats: Stats,
    /// Frozen for migration: no command touches the heap any more (see [`KvService::freeze`]).
    frozen: AtomicBool,
    /// What `TIERMEM.MIGRATE` runs (set by the server that can migrate; see
    /// [`KvService::set_migrate_hook`]).
    migrate_hook: std::sync::OnceLock<MigrateHook>,
    /// The first damaged heap offset a command met (`u64::MAX`: none). From then on the
    /// instance is read-only: writes are refused until it is repaired and restarted; reads of
    /// undamaged data go on.
    damaged: AtomicU64,
    /// Damaged offsets already logged (at most [`DAMAGE_LOG_MAX`]).
    damage_logged: parking_lot::Mutex<Vec<u64>>,
    /// The engine's persistence failure as last logged (`None`: writes go through).
    persist_logged: parking_lot::Mutex<Option<String>>,
    /// `persist_logged` is `Some` (checked without the lock).
    persist_failed: AtomicBool,
    /// Write commands refused because the engine could not persist them (INFO).
    writes_refused: AtomicU64,
    /// SHUTDOWN NOSAVE: [`KvService::shutdown`] skips the final flush.
    nosave: AtomicBool,
    /// Snapshots of the heap (the volatile engine; see [`KvService::set_persistence`]).
    persistence: std::sync::OnceLock<Arc<crate::persistence::Persistence>>,
    /// Who WATCHes which key.
    watches: multi::Watches,
    /// Pub/sub subscriptions.
    pubsub: pubsub::Registry,
    /// Sessions blocked on keys.
    waiters: blocking::Waiters,
    /// The default user's password (`requirepass`; CONFIG SET); `None`: none.
    password: parking_lot::RwLock<Option<String>>,
    /// Protected mode (`protected-mode`; CONFIG SET).
    protected: AtomicBool,
    /// Connected clients (CLIENT LIST, CLIENT KILL).
    clients: clients::Clients,
    /// INFO commandstats.
    cmdstats: cmdstats::CmdStats,
    /// The settings the server's event loops read, which CONFIG SET changes
    /// ([`KvService::set_runtime`]; defaults for a service outside a server).
    runtime: std::sync::OnceLock<Arc<crate::runtime::Runtime>>,
}

/// Most damaged heap offsets logged one by one (then one line says that more were found).
const DAMAGE_LOG_MAX: usize = 32;

/// The `TIERMEM.MIGRATE` handler: given the command's arguments (FAM directory, listen address,
/// migration id), start the migration (freeze, checkpoint, serve) and return the reply text, or
/// refuse with a reason. It runs on an event-loop thread and must not block for long: the dump
/// belongs on a thread of its own.
pub type MigrateHook = Box<dyn Fn(&[String]) -> std::result::Result<String, String> + Send + Sync>;

enum Held<'a> {
    None,
    Read(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Write(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

impl KvService {
    /// The service over `heap`: finds the keyspace from the heap's root (or creates an empty
    /// one in a new heap).
    ///
    /// Errors: the heap's root is not a tiermem-kv root, or creating it failed.
    pub fn new(heap: Heap, durability: Durability) -> Result<KvService> {
        let store = Store::open(&heap)?;
        let garbage = store.has_garbage(&View::of(&heap));
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let run_id = (0..3)
            .map(|_| format!("{:016x}", crate::ds::random_u64()))
            .collect::<String>()[..40]
            .to_string();
        let heap_bytes = heap.engine().info().heap_bytes;
        Ok(KvService {
            heap,
            store,
            lock: RwLock::new(()),
            durability,
            garbage: AtomicBool::new(garbage),
            info_source: None,
            config: vec![
                ("save".into(), String::new()),
                ("appendonly".into(), "no".into()),
                // The heap is the memory limit (writes past it fail with -OOM).
                ("maxmemory".into(), heap_bytes.to_string()),
                ("maxmemory-policy".into(), "noeviction".into()),
                ("databases".into(), crate::ds::DATABASES.to_string()),
            ],
            started: Instant::now(),
            last_save: AtomicU64::new(now),
            run_id,
            next_client: AtomicU64::new(1),
            frozen: AtomicBool::new(false),
            migrate_hook: std::sync::OnceLock::new(),
            stats: Stats::default(),
            damaged: AtomicU64::new(u64::MAX),
            damage_logged: parking_lot::Mutex::new(Vec::new()),
            persist_logged: parking_lot::Mutex::new(None),
            persist_failed: AtomicBool::new(false),
            writes_refused: AtomicU64::new(0),
            nosave: AtomicBool::new(false),
            persistence: std::sync::OnceLock::new(),
            watches: multi::Watches::default(),
            pubsub: pubsub::Registry::default(),
            waiters: blocking::Waiters::default(),
            password: parking_lot::RwLock::new(None),
            protected: AtomicBool::new(true),
            clients: clients::Clients::default(),
            cmdstats: cmdstats::CmdStats::default(),
            runtime: std::sync::OnceLock::new(),
        })
    }

    /// Take snapshots with `p` (SAVE, BGSAVE, save points, INFO persistence). Once; later
    /// calls are ignored.
    pub fn set_persistence(&self, p: Arc<crate::persistence::Persistence>) {
        p.loaded(self.stats.changes.load(Relaxed));
        let _ = self.persistence.set(p);
    }

    /// The snapshots' state, if the heap takes snapshots.
    pub fn persistence(&self) -> Option<&Arc<crate::persistence::Persistence>> {
        self.persistence.get()
    }

    /// Starts a background save if a `save` point is due (for a timer); logs why as Redis
    /// does.
    pub fn save_points_tick(&self) {
        let Some(p) = self.persistence.get() else {
            return;
        };
        if self.frozen.load(SeqCst) {
            return;
        }
        let changes = self.stats.changes.load(Relaxed);
        if let Some((secs, n)) = p.due(changes) {
            eprintln!(
                "tiermem-kv: {} changes in {secs} seconds (save point {secs} {n}). Saving...",
                p.changes_since_save(changes)
            );
            if let Err(e) = p.bgsave(&self.lock, &self.stats.changes) {
                eprintln!("tiermem-kv: background save not started: {e}");
            }
        }
    }

    /// Set the password (`requirepass`; empty: none) and protected mode.
    pub fn with_auth(self, requirepass: &str, protected_mode: bool) -> KvService {
        *self.password.write() = (!requirepass.is_empty()).then(|| requirepass.to_string());
        self.protected.store(protected_mode, Relaxed);
        self
    }

    /// Add the server's INFO fields.
    pub fn with_info_source(mut self, src: Arc<dyn InfoSource>) -> KvService {
        self.info_source = Some(src);
        self
    }

    /// Set CONFIG GET's table (name, value); same-named built-in entries are replaced.
    pub fn with_config(mut self, entries: Vec<(String, String)>) -> KvService {
        for (k, v) in entries {
            match self.config.iter_mut().find(|(n, _)| *n == k) {
                Some(e) => e.1 = v,
                None => self.config.push((k, v)),
            }
        }
        self
    }

    /// The heap.
    pub fn heap(&self) -> &Heap {
        &self.heap
    }

    /// Give the heap back (after [`KvService::shutdown`], to reopen it or drop it).
    pub fn into_heap(self) -> Heap {
        self.heap
    }

    /// The data structures' handle (root, hash seed).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The durability mode.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Whether garbage waits to be freed.
    pub fn has_garbage(&self) -> bool {
        self.garbage.load(Relaxed)
    }

    /// Free up to about `budget` blocks of garbage in one transaction (taking the lock
    /// exclusively); returns the work done (0: no garbage). For an idle timer; the service
    /// also does it at each [`Service::round_end`].
    pub fn collect_garbage(&self, budget: u64) -> Result<u64> {
        let Some(_g) = self.write_unfrozen() else {
            return Ok(0);
        };
        self.collect_locked(budget)
    }

    /// Redis' active expiry (its slow cycle, for a 10 Hz timer): sample keys with a deadline
    /// at random, [`EXPIRE_SAMPLES`] per transaction, and delete the expired ones; go on while
    /// more than 10 % of a sample had expired and `budget` allows. Each transaction takes the
    /// lock on its own, so clients get in between. Returns the keys deleted.
    pub fn active_expire(&self, budget: std::time::Duration) -> Result<u64> {
        let t0 = Instant::now();
        let mut total = 0;
        for db in 0..crate::ds::DATABASES {
            loop {
                let Some(_g) = self.write_unfrozen() else {
                    return Ok(total);
                };
                let st = self.store.db(&View::of(&self.heap), db);
                if self.writes_blocked() || expire::count(&View::of(&self.heap), &st) == 0 {
                    break;
                }
                expire::tick();
                crate::ds::take_damage();
                let mut w = Wtx::new(&self.heap, self.store.root);
                let res = expire::active_cycle(&mut w, &st, EXPIRE_SAMPLES);
                // Staged: no reply waits for it; a read that sees it syncs it at its round's
                // end, and vnvm links a staged commit left alone for a poll by itself.
                let res = match res {
                    Ok(c) => w.commit_staged().map(|_| c),
                    Err(e) => {
                        w.abort();
                        Err(e)
                    }
                };
                let c = match res {
                    Ok(c) => c,
                    Err(e) => {
                        if let Some(off) = crate::ds::take_damage() {
                            self.note_damage(off);
                        }
                        return Err(e);
                    }
                };
                if c.deleted > 0 {
                    self.stats.commits.fetch_add(1, Relaxed);
                    self.stats.changes.fetch_add(c.deleted as u64, Relaxed);
                    self.stats.expired.fetch_add(c.deleted as u64, Relaxed);
                    self.garbage
                        .store(self.store.has_garbage(&View::of(&self.heap)), Relaxed);
                }
                if c.live > 0 {
                    // Redis' running estimate: 2 % of each new sample's average.
                    let avg = c.ttl_sum_ms / c.live as u64;
                    let old = self.stats.avg_ttl.load(Relaxed);
                    let new = if old == 0 {
                        avg
                    } else {
                        old / 50 * 49 + avg / 50
                    };
                    self.stats.avg_ttl.store(new, Relaxed);
                }
                total += c.deleted as u64;
                if t0.elapsed() >= budget {
                    return Ok(total);
                }
                if c.sampled == 0 || c.deleted * 10 <= c.sampled {
                    break;
                }
            }
        }
        Ok(total)
    }

    /// Freeze for migration: from the return of this call on, no command reads or changes the
    /// heap — requests get no reply and their connection is closed (clients reconnect to the
    /// target) — and no garbage is freed. Waits for the commands in flight to finish (the
    /// engine-wide lock). Irreversible: the heap now belongs to the migration.
    pub fn freeze(&self) {
        self.frozen.store(true, SeqCst);
        drop(self.lock.write());
    }

    /// Install the `TIERMEM.MIGRATE` handler (once; later calls are ignored).
    pub fn set_migrate_hook(&self, hook: MigrateHook) {
        let _ = self.migrate_hook.set(hook);
    }

    /// The engine-wide lock, shared, unless the service is frozen (checked once the lock is
    /// held, so nothing reads past a freeze).
    fn read_unfrozen(&self) -> Option<RwLockReadGuard<'_, ()>> {
        let g = self.lock.read();
        (!self.frozen.load(SeqCst)).then_some(g)
    }

    /// The engine-wide lock, exclusive, unless the service is frozen (checked once the lock is
    /// held, so nothing writes past a freeze).
    fn write_unfrozen(&self) -> Option<RwLockWriteGuard<'_, ()>> {
        let g = self.lock.write();
        (!self.frozen.load(SeqCst)).then_some(g)
    }

    /// The first damaged heap offset a command met (`None`: none): the instance is read-only.
    pub fn damaged_at(&self) -> Option<u64> {
        let d = self.damaged.load(Relaxed);
        (d != u64::MAX).then_some(d)
    }

    /// Why writes are refused because the engine cannot persist them (`None`: they are not).
    /// Logs the failure once when it starts, and once when it ends.
    pub fn persist_error(&self) -> Option<String> {
        let now = self.heap.engine().persist_error();
        if now.is_none() && !self.persist_failed.load(Relaxed) {
            return None; // (the write path's cost: two atomic loads)
        }
        let mut logged = self.persist_logged.lock();
        if now != *logged {
            match &now {
                Some(e) if logged.is_none() => eprintln!(
                    "tiermem-kv: cannot persist writes: {e}; writes are refused until this \
                     succeeds again (retried every second); reads go on"
                ),
                Some(_) => {}
                None => eprintln!("tiermem-kv: writes persist again: writes resumed"),
            }
            self.persist_failed.store(now.is_some(), Relaxed);
            *logged = now.clone();
        }
        now
    }

    /// Record damage found at heap offset `off`: the instance goes read-only; the offset is
    /// logged once (the first [`DAMAGE_LOG_MAX`] offsets).
    fn note_damage(&self, off: u64) {
        let _ = self.damaged.compare_exchange(u64::MAX, off, SeqCst, SeqCst);
        let mut logged = self.damage_logged.lock();
        if logged.contains(&off) || logged.len() > DAMAGE_LOG_MAX {
            return;
        }
        if logged.len() == DAMAGE_LOG_MAX {
            eprintln!("tiermem-kv: more damaged heap offsets found (not logged one by one)");
        } else {
            eprintln!(
                "tiermem-kv: damaged heap at offset {off}: the data there is not served; the \
                 instance is read-only until it is repaired and restarted"
            );
        }
        logged.push(off);
    }

    /// The reply to a command that met damage at `off`.
    fn damage_reply(&self, off: u64, out: &mut Vec<u8>) {
        self.note_damage(off);
        reply::error(
            out,
            &format!(
                "ERR damaged heap at offset {off}: the data there cannot be served (the instance \
                 is read-only until it is repaired and restarted)"
            ),
        );
    }

    /// If writes are refused (damaged heap, or the engine cannot persist), write the refusal
    /// and return true.
    fn refuse_write(&self, out: &mut Vec<u8>) -> bool {
        if let Some(off) = self.damaged_at() {
            reply::error(
                out,
                &format!(
                    "READONLY tiermem-kv found a damaged heap at offset {off}; writes are \
                     refused until the instance is repaired and restarted"
                ),
            );
            return true;
        }
        if let Some(e) = self.persist_error() {
            self.writes_refused.fetch_add(1, Relaxed);
            reply::error(out, &misconf(&e));
            return true;
        }
        false
    }

    /// Whether writes are refused now (no reply).
    fn writes_blocked(&self) -> bool {
        self.damaged_at().is_some() || self.heap.engine().persist_error().is_some()
    }

    /// Whether [`KvService::freeze`] was called.
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(SeqCst)
    }

    fn collect_locked(&self, budget: u64) -> Result<u64> {
        if self.writes_blocked() {
            return Ok(0);
        }
        crate::ds::take_damage();
        let mut w = Wtx::new(&self.heap, self.store.root);
        let r = garbage::collect(&mut w, &self.store, budget);
        let work = match r {
            Ok(n) => n,
            Err(e) => {
                w.abort();
                if let Some(off) = crate::ds::take_damage() {
                    self.note_damage(off);
                }
                return Err(e);
            }
        };
        let dirty = w.dirty();
        if let Err(e) = w.commit_staged() {
            if let Some(off) = crate::ds::take_damage() {
                self.note_damage(off);
            }
            return Err(e);
        }
        if dirty {
            self.stats.commits.fetch_add(1, Relaxed);
        }
        self.stats.gc_work.fetch_add(work, Relaxed);
        self.garbage
            .store(self.store.has_garbage(&View::of(&self.heap)), Relaxed);
        Ok(work)
    }

    /// Whether SHUTDOWN NOSAVE asked to skip the final flush.
    pub fn nosave_requested(&self) -> bool {
        self.nosave.load(SeqCst)
    }

    /// Make everything committed durable and applied, then close the engine (clean shutdown).
    /// Call once, after the server stopped.
    ///
    /// After SHUTDOWN NOSAVE nothing is flushed: what was acknowledged stays in the engine's
    /// log and cache (durable on vnvm) and is recovered at the next start.
    pub fn shutdown(&self) -> Result<()> {
        if self.nosave.load(SeqCst) {
            return Ok(());
        }
        // With save points, a last snapshot first (Redis saves at shutdown then too).
        if let Some(p) = self.persistence.get() {
            if p.saves_on_shutdown() && !self.frozen.load(SeqCst) {
                p.save_after_running(&self.lock, &self.stats.changes)
                    .map_err(crate::heap::HeapError::Persist)?;
            }
        }
        let _g = self.lock.write();
        self.heap.engine().sync()?;
        self.heap.engine().close()
    }

    /// `spec`, the table entry [`table::lookup`] found for `r` (looked up once per request by
    /// `execute`), when the command exists and its arity fits; else the error reply.
    fn check<'r>(
        &self,
        r: &'r [&'r [u8]],
        spec: Option<&'static Spec>,
        out: &mut Vec<u8>,
    ) -> Option<&'static Spec> {
        let Some(spec) = spec else {
            let mut args = String::new();
            for a in &r[1..] {
                if args.len() >= 128 {
                    break;
                }
                let s = String::from_utf8_lossy(a);
                let room = 128 - args.len();
                args.push('\'');
                args.extend(s.chars().take(room));
                args.push_str("' ");
            }
            let name: String = String::from_utf8_lossy(r[0]).chars().take(128).collect();
            reply::error(
                out,
                &format!("ERR unknown command '{name}', with args beginning with: {args}"),
            );
            return None;
        };
        if !spec.arity_ok(r.len()) {
            reply::error(
                out,
                &format!("ERR wrong number of arguments for '{}' command", spec.name),
            );
            return None;
        }
        Some(spec)
    }

    fn heap_error(&self, out: &mut Vec<u8>, e: &HeapError) {
        match e {
            HeapError::OutOfMemory(d) => {
                self.stats.oom.fetch_add(1, Relaxed);
                reply::error(
                    out,
                    &format!(
                        "OOM command not allowed when used memory > 'maxmemory'. (the tiermem heap of {} bytes is full: {d}; nothing was changed)",
                        self.heap.view().len()
                    ),
                );
            }
            HeapError::TooLarge(d) => {
                self.stats.too_large.fetch_add(1, Relaxed);
                reply::error(
                    out,
                    &format!(
                        "ERR command too large for one transaction ({d}); nothing was changed"
                    ),
                );
            }
            HeapError::Damaged(off) => self.damage_reply(*off, out),
            HeapError::Persist(e) => {
                self.writes_refused.fetch_add(1, Relaxed);
                reply::error(out, &misconf(e));
            }
            e => reply::error(
                out,
                &format!("ERR tiermem heap error: {e}; nothing was changed"),
            ),
        }
    }

    /// One write command in its own transaction (the write lock held by the caller).
    fn write_one(&self, db: usize, spec: &Spec, r: &[&[u8]], out: &mut Vec<u8>) {
        if self.refuse_write(out) {
            return;
        }
        let mark = out.len();
        let mut retried = false;
        loop {
            crate::ds::take_damage();
            let mut w = Wtx::new(&self.heap, self.store.root);
            let st = self.store.db(&w, db);
            let mut expired = 0;
            let flushed = self.flush_touches(&w, db, spec, r);
            let mut before = 0;
            let res = data::purge_expired(&st, &mut w, spec, r).and_then(|n| {
                expired = n;
                before = w.logged_bytes();
                data::write(&st, &mut w, spec, r, out)
            });
            let changed = w.logged_bytes() > before;
            let dirty = w.dirty();
            let res = match res {
                Ok(()) => w.commit_staged().map(|_| ()),
                Err(e) => {
                    w.abort();
                    Err(e)
                }
            };
            match res {
                Ok(()) => {
                    self.stats.expired.fetch_add(expired, Relaxed);
                    if matches!(spec.id, Id::Flushall | Id::Flushdb) {
                        self.stats.avg_ttl.store(0, Relaxed);
                    }
                    if changed && (self.watches.active() || self.waiters.active()) {
                        let keys: Vec<Vec<u8>> = data::written_keys(spec, r)
                            .map(|k| multi::wkey(db, k))
                            .collect();
                        self.touch_keys(keys.iter().map(|k| k.as_slice()));
                    }
                    self.touch_keys(flushed.iter().map(|k| k.as_slice()));
                    if dirty {
                        self.stats.commits.fetch_add(1, Relaxed);
                        self.stats.changes.fetch_add(1, Relaxed);
                        if matches!(spec.id, Id::Del | Id::Unlink | Id::Flushall | Id::Flushdb)
                            || !self.garbage.load(Relaxed)
                        {
                            self.garbage
                                .store(self.store.has_garbage(&View::of(&self.heap)), Relaxed);
                        }
                    }
                    return;
                }
                Err(e) => {
                    self.stats.aborts.fetch_add(1, Relaxed);
                    out.truncate(mark);
                    // What explains the failure best: damage met on the way, or an engine
                    // that cannot persist (its full log then looks like a too-large command).
                    let e = match crate::ds::take_damage() {
                        Some(off) => HeapError::Damaged(off),
                        None => match (&e, self.heap.engine().persist_error()) {
                            (HeapError::TooLarge(_) | HeapError::Engine(_), Some(p)) => {
                                HeapError::Persist(p)
                            }
                            _ => e,
                        },
                    };
                    if matches!(e, HeapError::OutOfMemory(_))
                        && !retried
                        && self.garbage.load(Relaxed)
                    {
                        // Free the waiting garbage, then try once more.
                        retried = true;
                        while self.garbage.load(Relaxed) {
                            if self.collect_locked(64 * GC_ROUND_BUDGET).is_err() {
                                break;
                            }
                        }
                        continue;
                    }
                    self.heap_error(out, &e);
                    return;
                }
            }
        }
    }

    /// One transaction per write command. Stops (`OutputFull`) at the first request whose
    /// reply does not fit `limit` (see [`Service::execute`]): that request's reply is dropped,
    /// its effects (a write's commit) stay.
    fn run_each(
        &self,
        s: &mut Session,
        reqs: &[Vec<&[u8]>],
        specs: &[Option<&'static Spec>],
        out: &mut Vec<u8>,
        cx: &mut data::Counters,
        limit: usize,
    ) -> Executed {
        let budget = reply::Budget::new();
        let mut held = Held::None;
        // INFO commandstats' clock: each command's time runs from the previous one's end.
        let mut clock = Instant::now();
        for (i, r) in reqs.iter().enumerate() {
            let mark = out.len();
            if mark >= limit {
                return Executed::new(Control::OutputFull, i);
            }
            budget.arm(limit - mark);
            // The command's time: a key cannot expire halfway through it.
            crate::ds::expire::tick();
            if !s.authed && !self.authed_now(s, r) {
                reply::error(out, "NOAUTH Authentication required.");
                if let Some(sp) = specs[i] {
                    self.cmdstats.rejected(sp);
                }
                continue;
            }
            let Some(spec) = self.check(r, specs[i], out) else {
                if let Some(m) = &mut s.multi {
                    m.failed = true;
                }
                if let Some(sp) = specs[i] {
                    self.cmdstats.rejected(sp);
                }
                continue;
            };
            if s.subs.count() > 0
                && !matches!(
                    spec.id,
                    Id::Subscribe
                        | Id::Unsubscribe
                        | Id::Psubscribe
                        | Id::Punsubscribe
                        | Id::Ping
                        | Id::Quit
                )
            {
                reply::error(
                    out,
                    &format!(
                        "ERR Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context",
                        spec.name
                    ),
                );
                self.cmdstats.rejected(spec);
                continue;
            }
            if s.multi.is_some() && spec.id != Id::Quit
                || matches!(
                    spec.id,
                    Id::Multi | Id::Exec | Id::Discard | Id::Watch | Id::Unwatch
                )
            {
                let c = self.transaction(s, spec, r, out, cx, &mut held);
                if matches!(
                    spec.id,
                    Id::Multi | Id::Exec | Id::Discard | Id::Watch | Id::Unwatch
                ) {
                    // Queued commands count when EXEC runs them, as in Redis.
                    self.cmdstats
                        .ran(spec, &mut clock, out.get(mark..).unwrap_or_default());
                }
                if c != Control::Continue {
                    return Executed::new(c, i);
                }
                if budget.over() || out.len() > limit {
                    out.truncate(mark);
                    return Executed::new(Control::OutputFull, i + 1);
                }
                continue;
            }
            match spec.kind() {
                Kind::Admin => {
                    let c = self.admin(s, spec, r, out, &mut held);
                    if c != Control::Continue {
                        return Executed::new(c, i + 1);
                    }
                }
                Kind::Read => {
                    if matches!(held, Held::None) {
                        let Some(g) = self.read_unfrozen() else {
                            return Executed::new(Control::Close, i);
                        };
                        held = Held::Read(g);
                    }
                    self.read_checked(cx, &View::of(&self.heap), s, spec, r, out);
                }
                Kind::Write => {
                    if !matches!(held, Held::Write(_)) {
                        // Release a read lock before waiting for the write lock.
                        drop(std::mem::replace(&mut held, Held::None));
                        let Some(g) = self.write_unfrozen() else {
                            return Executed::new(Control::Close, i);
                        };
                        held = Held::Write(g);
                    }
                    self.write_one(s.db, spec, r, out);
                    if blocking::is_blocking(spec.id) {
                        if let Some(c) = self.block_or_serve(s, spec, r, mark, out) {
                            return Executed::new(c, i);
                        }
                    }
                }
            }
            self.cmdstats
                .ran(spec, &mut clock, out.get(mark..).unwrap_or_default());
            if budget.over() || out.len() > limit {
                out.truncate(mark);
                return Executed::new(Control::OutputFull, i + 1);
            }
        }
        Executed::new(Control::Continue, reqs.len())
    }

    /// Group commit: one transaction for the whole batch — or for the requests up to the one
    /// whose reply does not fit `limit` (they are committed; the later ones do not run).
    fn run_group(
        &self,
        s: &mut Session,
        reqs: &[Vec<&[u8]>],
        specs: &[Option<&'static Spec>],
        out: &mut Vec<u8>,
        cx: &mut data::Counters,
        limit: usize,
    ) -> Executed {
        if self.writes_blocked() {
            // Each write gets its refusal; reads go on.
            return self.run_each(s, reqs, specs, out, cx, limit);
        }
        let Some(g) = self.write_unfrozen() else {
            return Executed::new(Control::Close, 0);
        };
        let mark = out.len();
        crate::ds::take_damage();
        let mut w = Wtx::new(&self.heap, self.store.root);
        let mut held = Held::None; // admin commands of a group need no lock of their own
        let mut failed = None;
        let mut writes = 0u64;
        let mut expired = 0u64;
        let mut touched: Vec<Vec<u8>> = Vec::new();
        let mut ran = reqs.len();
        let mut full = false;
        let budget = reply::Budget::new();
        let mut clock = Instant::now();
        for (i, r) in reqs.iter().enumerate() {
            let rmark = out.len();
            if rmark >= limit {
                (ran, full) = (i, true);
                break;
            }
            budget.arm(limit - rmark);
            crate::ds::expire::tick();
            if let Some(spec) = self.check(r, specs[i], out) {
                match spec.kind() {
                    Kind::Admin => {
                        self.admin(s, spec, r, out, &mut held);
                    }
                    Kind::Read => self.read(cx, &w, s, spec, r, out),
                    Kind::Write => {
                        let st = self.store.db(&w, s.db);
                        touched.extend(self.flush_touches(&w, s.db, spec, r));
                        let mut before = 0;
                        let res = data::purge_expired(&st, &mut w, spec, r).and_then(|n| {
                            expired += n;
                            before = w.logged_bytes();
                            data::write(&st, &mut w, spec, r, out)
                        });
                        if let Err(e) = res {
                            failed = Some(e);
                            break;
                        }
                        if (self.watches.active() || self.waiters.active())
                            && w.logged_bytes() > before
                        {
                            touched
                                .extend(data::written_keys(spec, r).map(|k| multi::wkey(s.db, k)));
                        }
                        if matches!(spec.id, Id::Flushall | Id::Flushdb) {
                            self.stats.avg_ttl.store(0, Relaxed);
                        }
                        writes += 1;
                    }
                }
                self.cmdstats
                    .ran(spec, &mut clock, out.get(rmark..).unwrap_or_default());
            } else if let Some(sp) = specs[i] {
                self.cmdstats.rejected(sp);
            }
            if budget.over() || out.len() > limit {
                out.truncate(rmark);
                (ran, full) = (i + 1, true);
                break;
            }
        }
        drop(budget);
        match self.finish_many(w, failed, writes, expired, &touched) {
            Ok(()) => {
                let control = if full {
                    Control::OutputFull
                } else {
                    Control::Continue
                };
                Executed::new(control, ran)
            }
            Err(_) => {
                // Nothing was committed or sent: redo the requests that ran, one command at a
                // time (`ran <= reqs.len()`; damage met in the group then fails only the
                // commands that meet it).
                crate::ds::take_damage();
                self.stats.aborts.fetch_add(1, Relaxed);
                out.truncate(mark);
                drop(g);
                *cx = data::Counters::default();
                let e = self.run_each(s, &reqs[..ran], &specs[..ran], out, cx, limit);
                if full && e.control == Control::Continue {
                    Executed::new(Control::OutputFull, e.ran)
                } else {
                    e
                }
            }
        }
    }

    /// FLUSHALL, FLUSHDB and SWAPDB change every key that exists in the databases they
    /// touch: the watched ones among them, read through `m` before the command runs (empty for
    /// other commands, or when nothing is watched). `db`: the session's database.
    fn flush_touches<M: crate::ds::Mem>(
        &self,
        m: &M,
        db: usize,
        spec: &Spec,
        r: &[&[u8]],
    ) -> Vec<Vec<u8>> {
        if !self.watches.active() {
            return Vec::new();
        }
        let dbs: Vec<usize> = match spec.id {
            Id::Flushall => (0..crate::ds::DATABASES).collect(),
            Id::Flushdb => vec![db],
            Id::Swapdb => r[1..]
                .iter()
                .filter_map(|a| data::parse_i64(a))
                .filter(|&d| (0..crate::ds::DATABASES as i64).contains(&d))
                .map(|d| d as usize)
                .collect(),
            _ => return Vec::new(),
        };
        let mut keys = self.watches.keys();
        keys.retain(|k| {
            let (kdb, key) = multi::split_wkey(k);
            dbs.contains(&kdb)
                && (spec.id == Id::Swapdb
                    || crate::ds::keyspace::lookup(m, &self.store.db(m, kdb), key).is_some())
        });
        keys
    }

    /// After a blocking command ran as its non-blocking twin (its reply, if any, from
    /// `mark`): served, it stops waiting; with nothing to serve it times out (a null array) or
    /// blocks, registered on its keys: `Some(Control::Block)`, the server runs it again when
    /// woken or at the deadline. Runs under the write lock its attempt held, so no write can
    /// slip between the attempt and the registration.
    fn block_or_serve(
        &self,
        s: &mut Session,
        spec: &Spec,
        r: &[&[u8]],
        mark: usize,
        out: &mut Vec<u8>,
    ) -> Option<Control> {
        if out.len() > mark {
            if let Some(b) = s.block.take() {
                self.waiters.unregister(s.id, &b.keys);
            }
            return None;
        }
        let now = Instant::now();
        match &s.block {
            Some(b) if b.deadline.is_some_and(|d| d <= now) => {
                if let Some(b) = s.block.take() {
                    self.waiters.unregister(s.id, &b.keys);
                }
                reply::null_array(out);
                None
            }
            Some(b) => Some(Control::Block(b.deadline)),
            None => {
                // (The attempt validated the timeout: an invalid one wrote an error.)
                let deadline = blocking::deadline(blocking::timeout_arg(spec.id, r), now)
                    .ok()
                    .flatten();
                let keys: Vec<Vec<u8>> = blocking::wait_keys(spec.id, r)
                    .into_iter()
                    .map(|k| multi::wkey(s.db, k))
                    .collect();
                self.waiters.register(s.id, &s.conn, &keys);
                s.block = Some(blocking::BlockState { keys, deadline });
                Some(Control::Block(deadline))
            }
        }
    }

    /// Whether request `r` of a session not yet authenticated may run: AUTH and QUIT may; any
    /// request may once the password is gone (CONFIG SET requirepass "").
    fn authed_now(&self, s: &mut Session, r: &[&[u8]]) -> bool {
        if self.password.read().is_none() {
            s.authed = true;
            return true;
        }
        data::is(r[0], "AUTH") || data::is(r[0], "QUIT")
    }

    /// Protected mode, before anything runs: a client from another host while no password is
    /// set gets Redis' DENIED error and is closed.
    fn gate(&self, s: &Session, reqs: &[Vec<&[u8]>], out: &mut Vec<u8>) -> Option<Executed> {
        if s.local || !self.protected.load(Relaxed) || self.password.read().is_some() {
            return None;
        }
        let _ = reqs;
        // Redis 7.0's words, its "Setup a an" included: clients may compare.
        reply::error(
            out,
            "DENIED Redis is running in protected mode because protected mode is enabled and no \
             password is set for the default user. In this mode connections are only accepted \
             from the loopback interface. If you want to connect from external computers to \
             Redis you may adopt one of the following solutions: 1) Just disable protected mode \
             sending the command 'CONFIG SET protected-mode no' from the loopback interface by \
             connecting to Redis from the same host the server is running, however MAKE SURE \
             Redis is not publicly accessible from internet if you do so. Use CONFIG REWRITE to \
             make this change permanent. 2) Alternatively you can just disable the protected \
             mode by editing the Redis configuration file, and setting the protected mode option \
             to 'no', and then restarting the server. 3) If you started the server manually just \
             for testing, restart it with the '--protected-mode no' option. 4) Setup a an \
             authentication password for the default user. NOTE: You only need to do one of the \
             above things in order for the server to start accepting connections from the \
             outside.",
        );
        Some(Executed::new(Control::Close, 0))
    }

    /// Keys (`multi::wkey`) changed: their watchers' next EXEC fails, their first waiter is
    /// woken.
    fn touch_keys<'k>(&self, keys: impl Iterator<Item = &'k [u8]> + Clone) {
        self.watches.touch(keys.clone());
        self.waiters.wake(keys);
    }

    /// Forget every key `s` watches.
    fn unwatch_all(&self, s: &mut Session) {
        let keys = std::mem::take(&mut s.watch.keys);
        self.watches
            .unwatch(s.id, keys.iter().map(|(k, _)| k.as_slice()));
        s.watch.dirty.store(false, Relaxed);
    }

    /// MULTI, EXEC, DISCARD, WATCH, UNWATCH, and any command of a session inside MULTI (queued).
    fn transaction<'a>(
        &'a self,
        s: &mut Session,
        spec: &Spec,
        r: &[&[u8]],
        out: &mut Vec<u8>,
        cx: &mut data::Counters,
        held: &mut Held<'a>,
    ) -> Control {
        match (spec.id, s.multi.is_some()) {
            (Id::Multi, true) => reply::error(out, "ERR MULTI calls can not be nested"),
            (Id::Multi, false) => {
                s.multi = Some(multi::Multi::default());
                reply::ok(out);
            }
            (Id::Discard, false) => reply::error(out, "ERR DISCARD without MULTI"),
            (Id::Discard, true) => {
                s.multi = None;
                self.unwatch_all(s);
                reply::ok(out);
            }
            (Id::Exec, false) => reply::error(out, "ERR EXEC without MULTI"),
            (Id::Exec, true) => return self.exec(s, out, cx, held),
            (Id::Watch, true) => reply::error(out, "ERR WATCH inside MULTI is not allowed"),
            (Id::Watch, false) => {
                if matches!(held, Held::None) {
                    let Some(g) = self.read_unfrozen() else {
                        return Control::Close;
                    };
                    *held = Held::Read(g);
                }
                let v = View::of(&self.heap);
                let st = self.store.db(&v, s.db);
                for k in &r[1..] {
                    let wk = multi::wkey(s.db, k);
                    if self.watches.watch(s.id, &s.watch.dirty, &wk) {
                        let live = crate::ds::keyspace::lookup(&v, &st, k).is_some();
                        s.watch.keys.push((wk, live));
                    }
                }
                reply::ok(out);
            }
            (Id::Unwatch, false) => {
                self.unwatch_all(s);
                reply::ok(out);
            }
            (_, true) => {
                // Queue it (UNWATCH too, as Redis does).
                let Some(m) = s.multi.as_mut() else {
                    return Control::Continue;
                };
                let bytes: usize = r.iter().map(|a| a.len()).sum();
                if !multi::allowed_in_multi(spec.id) {
                    m.failed = true;
                    reply::error(out, "ERR Command not allowed inside a transaction");
                } else if m.bytes + bytes > multi::MAX_QUEUED_BYTES {
                    m.failed = true;
                    reply::error(
                        out,
                        &format!(
                            "ERR transaction too large: more than {} MiB of queued arguments",
                            multi::MAX_QUEUED_BYTES >> 20
                        ),
                    );
                } else {
                    m.bytes += bytes;
                    m.queued.push(r.iter().map(|a| a.to_vec()).collect());
                    reply::simple(out, "QUEUED");
                }
            }
            (_, false) => reply::error(out, "ERR internal: not a transaction command"),
        }
        Control::Continue
    }

    /// EXEC: the queue in one heap transaction under the write lock (see [`multi`]).
    fn exec<'a>(
        &'a self,
        s: &mut Session,
        out: &mut Vec<u8>,
        cx: &mut data::Counters,
        held: &mut Held<'a>,
    ) -> Control {
        let Some(m) = s.multi.take() else {
            reply::error(out, "ERR EXEC without MULTI");
            return Control::Continue;
        };
        if m.failed {
            self.unwatch_all(s);
            reply::error(
                out,
                "EXECABORT Transaction discarded because of previous errors.",
            );
            return Control::Continue;
        }
        if !matches!(held, Held::Write(_)) {
            drop(std::mem::replace(held, Held::None));
            let Some(g) = self.write_unfrozen() else {
                return Control::Close;
            };
            *held = Held::Write(g);
        }
        let v = View::of(&self.heap);
        let stale = s.watch.dirty.load(Relaxed)
            || s.watch.keys.iter().any(|(k, live)| {
                let (db, key) = multi::split_wkey(k);
                *live && crate::ds::keyspace::lookup(&v, &self.store.db(&v, db), key).is_none()
            });
        self.unwatch_all(s);
        if stale {
            reply::null_array(out);
            return Control::Continue;
        }
        let specs: Vec<&'static Spec> = m
            .queued
            .iter()
            .filter_map(|q| table::lookup(&q[0]))
            .collect();
        if specs.iter().any(|sp| sp.kind() == Kind::Write) && self.refuse_write(out) {
            return Control::Continue;
        }
        let mark = out.len();
        reply::array(out, m.queued.len());
        crate::ds::take_damage();
        let mut w = Wtx::new(&self.heap, self.store.root);
        let mut inner = Held::None; // the EXEC holds the lock
        let (mut writes, mut expired) = (0u64, 0u64);
        let mut touched: Vec<Vec<u8>> = Vec::new();
        let mut failed = None;
        let mut clock = Instant::now();
        for (q, spec) in m.queued.iter().zip(&specs) {
            let r: Vec<&[u8]> = q.iter().map(|a| a.as_slice()).collect();
            crate::ds::expire::tick();
            let qmark = out.len();
            match spec.kind() {
                Kind::Admin => {
                    self.admin(s, spec, &r, out, &mut inner);
                }
                Kind::Read => self.read(cx, &w, s, spec, &r, out),
                Kind::Write => {
                    let rmark = out.len();
                    let st = self.store.db(&w, s.db);
                    touched.extend(self.flush_touches(&w, s.db, spec, &r));
                    let mut before = 0;
                    let res = data::purge_expired(&st, &mut w, spec, &r).and_then(|n| {
                        expired += n;
                        before = w.logged_bytes();
                        data::write(&st, &mut w, spec, &r, out)
                    });
                    if let Err(e) = res {
                        failed = Some(e);
                        break;
                    }
                    if w.logged_bytes() > before {
                        touched.extend(data::written_keys(spec, &r).map(|k| multi::wkey(s.db, k)));
                    }
                    if matches!(spec.id, Id::Flushall | Id::Flushdb) {
                        self.stats.avg_ttl.store(0, Relaxed);
                    }
                    if blocking::is_blocking(spec.id) && out.len() == rmark {
                        // Inside MULTI nothing blocks: empty keys answer a null array.
                        reply::null_array(out);
                    }
                    writes += 1;
                }
            }
            self.cmdstats
                .ran(spec, &mut clock, out.get(qmark..).unwrap_or_default());
        }
        if let Err(e) = self.finish_many(w, failed, writes, expired, &touched) {
            // All or nothing: the EXEC changed nothing and says why.
            self.stats.aborts.fetch_add(1, Relaxed);
            out.truncate(mark);
            let e = match crate::ds::take_damage() {
                Some(off) => HeapError::Damaged(off),
                None => e,
            };
            self.heap_error(out, &e);
        }
        Control::Continue
    }

    /// Commit (or abort, after `failed`) the one transaction of several commands (a group
    /// commit, an EXEC) and account for it once it committed: keys expired on the way, the
    /// changed keys' watchers and waiters, commits, changes, the garbage flag.
    fn finish_many(
        &self,
        w: Wtx,
        failed: Option<HeapError>,
        writes: u64,
        expired: u64,
        touched: &[Vec<u8>],
    ) -> Result<()> {
        let dirty = w.dirty();
        match failed {
            Some(e) => {
                w.abort();
                return Err(e);
            }
            None => {
                w.commit_staged()?;
            }
        }
        self.stats.expired.fetch_add(expired, Relaxed);
        self.touch_keys(touched.iter().map(|k| k.as_slice()));
        if dirty {
            self.stats.commits.fetch_add(1, Relaxed);
            self.stats.changes.fetch_add(writes, Relaxed);
            self.garbage
                .store(self.store.has_garbage(&View::of(&self.heap)), Relaxed);
        }
        Ok(())
    }

    /// [`KvService::read`], its whole reply replaced by an error if it met a damaged heap.
    fn read_checked<M: table::ReadMem>(
        &self,
        cx: &mut data::Counters,
        m: &M,
        s: &Session,
        spec: &Spec,
        r: &[&[u8]],
        out: &mut Vec<u8>,
    ) {
        let mark = out.len();
        crate::ds::take_damage();
        self.read(cx, m, s, spec, r, out);
        if let Some(off) = crate::ds::take_damage() {
            out.truncate(mark);
            self.damage_reply(off, out);
        }
    }

    fn read<M: table::ReadMem>(
        &self,
        cx: &mut data::Counters,
        m: &M,
        s: &Session,
        spec: &Spec,
        r: &[&[u8]],
        out: &mut Vec<u8>,
    ) {
        match spec.id {
            Id::Info => self.info(m, s, r, out),
            _ => data::read(cx, &self.store.db(m, s.db), m, spec, r, out),
        }
    }
}

/// The reply to a write refused because the engine cannot persist it (`e`: why, naming the
/// file and the cause), in the style of Redis' `-MISCONF`.
fn misconf(e: &str) -> String {
    format!(
        "MISCONF tiermem-kv cannot persist writes: {e}; writes are refused until this succeeds \
         again (retried every second; see INFO persistence)"
    )
}

/// Whether a peer (`ip:port`, `[ip]:port`, or a Unix socket's path) is on this host: the
/// loopback interface or a Unix socket.
fn is_local(peer: &str) -> bool {
    match peer.parse::<std::net::SocketAddr>() {
        Ok(a) => a.ip().is_loopback(),
        Err(_) => true, // not an IP address: a Unix socket
    }
}

fn is_write(spec: Option<&Spec>) -> bool {
    spec.is_some_and(|s| s.kind() == Kind::Write)
}

fn is_end(spec: Option<&Spec>) -> bool {
    spec.is_some_and(|s| {
        matches!(
            s.id,
            Id::Quit
                | Id::Shutdown
                | Id::Save
                | Id::Bgsave
                | Id::Multi
                | Id::Exec
                | Id::Discard
                | Id::Watch
                | Id::Unwatch
                | Id::Subscribe
                | Id::Psubscribe
        ) || blocking::is_blocking(s.id)
    })
}

impl KvService {
    /// A new session (counted, listed in CLIENT LIST). Not round-managed: [`Service::execute`]
    /// syncs its writes before returning (see `Session::round_managed`).
    fn new_session(&self, peer: &str, conn: crate::server::ConnHandle) -> Session {
        self.stats.connections_total.fetch_add(1, Relaxed);
        self.stats.connected.fetch_add(1, Relaxed);
        let (id, created) = (self.next_client.fetch_add(1, Relaxed), Instant::now());
        let s = Session {
            id,
            name: None,
            peer: peer.to_string(),
            created,
            view: clients::ClientView::new(id, peer, created),
            db: 0,
            conn,
            subs: pubsub::Subs::default(),
            block: None,
            authed: self.password.read().is_none(),
            local: is_local(peer),
            multi: None,
            watch: multi::WatchState::default(),
            round_managed: false,
        };
        self.clients.add(&s);
        s
    }

    /// A durability barrier failed: the writes it covered are visible but not durable. Logged;
    /// the engine's own error state (`persist_error`) refuses later writes.
    fn note_sync_failure(&self, e: &HeapError) {
        eprintln!("tiermem-kv: cannot make the round's writes durable: {e}");
    }
}

impl Service for KvService {
    type Session = Session;

    fn open_session(&self, peer: &str) -> Session {
        self.new_session(peer, crate::server::ConnHandle::detached())
    }

    /// The server's sessions: their replies wait for the round's durability barrier
    /// ([`Service::round_end`]).
    fn open_session_with(&self, peer: &str, conn: crate::server::ConnHandle) -> Session {
        let mut s = self.new_session(peer, conn);
        s.round_managed = true;
        s
    }

    fn execute(
        &self,
        s: &mut Session,
        reqs: &[Vec<&[u8]>],
        out: &mut Vec<u8>,
        out_limit: usize,
    ) -> Executed {
        if self.frozen.load(SeqCst) {
            return Executed::new(Control::Close, 0);
        }
        if let Some(c) = self.gate(s, reqs, out) {
            return c;
        }
        let mut cx = data::Counters::default();
        let mark = out.len();
        // Each request's table entry, looked up once.
        let specs: smallvec::SmallVec<[Option<&'static Spec>; 64]> =
            reqs.iter().map(|r| table::lookup(r[0])).collect();
        let group = self.durability == Durability::Pipeline
            && s.authed
            && s.multi.is_none()
            && s.subs.count() == 0
            && specs.iter().filter(|sp| is_write(**sp)).count() > 1
            && !specs.iter().any(|sp| is_end(*sp));
        let c = if group {
            self.run_group(s, reqs, &specs, out, &mut cx, out_limit)
        } else {
            self.run_each(s, reqs, &specs, out, &mut cx, out_limit)
        };
        if !s.round_managed {
            // No event-loop round to sync at: make what the replies report durable now.
            if let Err(e) = self.heap.sync_to(self.heap.staged_ticket()) {
                self.note_sync_failure(&e);
                out.truncate(mark);
                return Executed::new(Control::Close, c.ran);
            }
        }
        self.stats.commands.fetch_add(c.ran as u64, Relaxed);
        self.clients.sync(s);
        if cx.hits > 0 {
            self.stats.hits.fetch_add(cx.hits, Relaxed);
        }
        if cx.misses > 0 {
            self.stats.misses.fetch_add(cx.misses, Relaxed);
        }
        c
    }

    fn round_end(&self) -> bool {
        if self.garbage.load(Relaxed) && !self.writes_blocked() {
            if let Some(_g) = self.lock.try_write() {
                if !self.frozen.load(SeqCst) {
                    let _ = self.collect_locked(GC_ROUND_BUDGET);
                }
            }
        }
        // Group commit: one durability barrier for every write this round's replies report or
        // read, whichever connection or thread committed it (the last staged ticket covers
        // them all; when it is durable already this is one atomic load).
        match self.heap.sync_to(self.heap.staged_ticket()) {
            Ok(()) => true,
            Err(e) => {
                self.note_sync_failure(&e);
                false
            }
        }
    }

    /// Nothing staged waits for durability: a reply cannot report or have read a commit that
    /// is not durable yet (a read runs after the commits it sees were staged, under the
    /// store's lock).
    fn replies_ready(&self) -> bool {
        self.heap.durable_ticket() >= self.heap.staged_ticket()
    }

    fn close_session(&self, mut s: Session) {
        self.unwatch_all(&mut s);
        self.clients.remove(s.id);
        self.pubsub.drop_session(s.id, &mut s.subs);
        if let Some(b) = s.block.take() {
            self.waiters.unregister(s.id, &b.keys);
        }
        self.stats.connected.fetch_sub(1, Relaxed);
    }
}
