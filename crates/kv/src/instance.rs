//! A whole tiermem-kv server in this process: engine, heap, command layer, network front end
//! and the idle garbage freer, started from a [`KvConfig`]. `tiermem kv serve` and the C ABI
//! (`tiermem_kv_start`) are thin wrappers around [`KvInstance`].

use crate::commands::{Durability, InfoSource, KvService, GC_ROUND_BUDGET};
use crate::config::KvConfig;
use crate::heap::vnvm::{VnvmEngine, VnvmEngineConfig};
use crate::heap::volatile::VolatileEngine;
use crate::heap::{Engine, Heap};
use crate::persistence::{self, Persistence, SnapshotSettings};
use crate::runtime::Runtime;
use crate::server::{self, ServerHandle, ServerStats, ShutdownTrigger};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tiermem_snapshot::Method;

/// vnvm log and NVM-cache size when the configuration names none.
pub const DEFAULT_POOL_SIZE: u64 = 64 << 20;

/// Why a server could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The configuration is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// The engine or the heap failed (opening, recovery, the final sync).
    #[error("{what}: {source}")]
    Storage {
        /// What was being done.
        what: String,
        /// The storage error.
        source: crate::heap::HeapError,
    },
    /// The network front end failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A running server. Dropping it without [`KvInstance::wait`] / [`KvInstance::stop`] stops it
/// (errors are then ignored).
pub struct KvInstance {
    service: Arc<KvService>,
    handle: Option<ServerHandle>,
    gc: Option<JoinHandle<()>>,
    stop_gc: Arc<AtomicBool>,
    dir: Option<PathBuf>,
}

impl KvInstance {
    /// Open the engine `cfg` names (its data directory `cfg.dir`, else `default_dir`), the heap
    /// and the keyspace, and start serving. `log` receives the start-up lines (where data lives,
    /// what was recovered, the addresses listened on).
    pub fn start(
        cfg: &KvConfig,
        default_dir: &Path,
        log: &mut dyn FnMut(&str),
    ) -> Result<KvInstance, KvError> {
        let dir = cfg.dir.clone().unwrap_or_else(|| default_dir.to_path_buf());
        let storage = |what: String| move |source| KvError::Storage { what, source };
        let mut migration: Option<Arc<MigrationStatus>> = None;
        let mut snapshots: Option<SnapshotSettings> = None;
        let (engine, dir): (Box<dyn Engine>, Option<PathBuf>) = match cfg.engine.as_str() {
            "vnvm" => {
                let ec = VnvmEngineConfig {
                    dir: dir.clone(),
                    heap_size: cfg.heap_size,
                    log_size: cfg.log_size.unwrap_or(DEFAULT_POOL_SIZE),
                    cache_size: cfg.cache_size.unwrap_or(DEFAULT_POOL_SIZE),
                };
                let e = if cfg.new {
                    VnvmEngine::create(&ec).map_err(storage(format!(
                        "creating a vnvm instance in {}",
                        dir.display()
                    )))?
                } else {
                    VnvmEngine::open(&ec).map_err(storage(format!(
                        "opening the vnvm instance in {}",
                        dir.display()
                    )))?
                };
                log(&match &e.report().recovery {
                    None => format!("new vnvm instance in {}", dir.display()),
                    Some(r) if r.was_clean => format!(
                        "{} was shut down cleanly: nothing to recover",
                        dir.display()
                    ),
                    Some(r) => format!(
                        "recovered {} after an unclean shutdown: {} dirty cache pages written \
                         back, {} committed transactions ({} bytes) replayed",
                        dir.display(),
                        r.dirty_pages_written,
                        r.transactions_replayed,
                        r.bytes_replayed
                    ),
                });
                (Box::new(e), Some(dir))
            }
            "volatile" if cfg.restore_from.is_some() || cfg.migration_method == "socket" => {
                let (e, status) = restore_migrated(cfg, log)?;
                migration = Some(status);
                (Box::new(e), None)
            }
            "volatile" => {
                let (e, settings) = open_volatile(cfg, &dir, log)?;
                snapshots = settings;
                (Box::new(e), None)
            }
            other => {
                return Err(KvError::Config(format!(
                    "unknown engine {other:?} (vnvm or volatile)"
                )))
            }
        };
        let durability = match cfg.durability.as_str() {
            "commit" => Durability::Commit,
            "pipeline" | "async" => Durability::Pipeline,
            other => {
                return Err(KvError::Config(format!(
                    "unknown durability {other:?} (pipeline or commit)"
                )))
            }
        };
        let info = engine.info();
        log(&format!(
            "engine {} ({}): {}",
            info.name,
            if info.durable {
                format!("durable, durability {}", cfg.durability)
            } else if let (Some(s), Some(_)) = (&snapshots, engine.snapshot_memory()) {
                format!(
                    "persisted by snapshots to {} ({}, {}; save points: {})",
                    s.path().display(),
                    s.method.name(),
                    s.target.name(),
                    if s.save_points.is_empty() {
                        "none".to_string()
                    } else {
                        persistence::format_save_points(&s.save_points)
                    }
                )
            } else {
                "not persisted".to_string()
            },
            info.location
        ));
        let heap = Heap::open(engine).map_err(storage("opening the heap".into()))?;
        let stats = Arc::new(ServerStats::default());
        let net = Arc::new(NetInfo {
            stats: stats.clone(),
            port: AtomicU64::new(0),
            started: Instant::now(),
            migration: migration.clone(),
        });
        let service = Arc::new(
            KvService::new(heap, durability)
                .map_err(storage("opening the keyspace".into()))?
                .with_info_source(net.clone())
                .with_config(cfg.get("*"))
                .with_auth(&cfg.requirepass, cfg.protected_mode),
        );
        // The settings CONFIG SET changes, shared by the event loops and the command layer;
        // the encoding thresholds are the process's.
        crate::config::set_thresholds(cfg.thresholds);
        let runtime = Arc::new(Runtime::new(cfg));
        service.set_runtime(runtime.clone());
        if let (Some(settings), Some(mem)) = (snapshots, service.heap().engine().snapshot_memory())
        {
            service.set_persistence(Arc::new(Persistence::new(mem, settings)));
        }
        let trigger: Arc<std::sync::OnceLock<ShutdownTrigger>> = Arc::default();
        if service.heap().engine().migratable() {
            service.set_migrate_hook(migrate_hook(
                Arc::downgrade(&service),
                trigger.clone(),
                cfg.clone(),
                migration,
            ));
        }
        let handle =
            server::start_with(&cfg.server, runtime, service.clone(), stats).map_err(|source| {
                KvError::Io {
                    what: "starting the server",
                    source,
                }
            })?;
        if let Some(a) = handle.tcp_addrs().first() {
            net.port.store(a.port() as u64, Ordering::Relaxed);
        }
        let _ = trigger.set(handle.shutdown_trigger());
        for a in handle.tcp_addrs() {
            log(&format!("listening on {a}"));
        }
        if let Some(p) = handle.unix_path() {
            log(&format!("listening on unix socket {}", p.display()));
        }
        // Free the garbage of big deletions when no command comes to do it (round_end does it
        // under traffic), and delete expired keys (active expiry).
        let stop_gc = Arc::new(AtomicBool::new(false));
        let gc = {
            let (service, stop) = (service.clone(), stop_gc.clone());
            std::thread::Builder::new()
                .name("kv-gc".into())
                .spawn(move || {
                    let mut tick = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
                        tick += 1;
                        service.save_points_tick();
                        // Active expiry ten times a second, at most 2.5 ms each (Redis' slow
                        // cycle takes up to 25 % of a core; here a core is half the machine).
                        if tick % 2 == 0 {
                            if let Err(e) = service.active_expire(Duration::from_micros(2500)) {
                                eprintln!("tiermem-kv: deleting expired keys failed: {e}");
                            }
                        }
                        if service.has_garbage() {
                            if let Err(e) = service.collect_garbage(16 * GC_ROUND_BUDGET) {
                                eprintln!("tiermem-kv: freeing deleted data failed: {e}");
                            }
                        }
                    }
                })
                .map_err(|source| KvError::Io {
                    what: "starting the garbage thread",
                    source,
                })?
        };
        Ok(KvInstance {
            service,
            handle: Some(handle),
            gc: Some(gc),
            stop_gc,
            dir,
        })
    }

    /// The TCP addresses served, with their actual ports.
    pub fn tcp_addrs(&self) -> &[SocketAddr] {
        self.handle.as_ref().map_or(&[], |h| h.tcp_addrs())
    }

    /// The Unix socket served, if any.
    pub fn unix_path(&self) -> Option<&Path> {
        self.handle.as_ref().and_then(|h| h.unix_path())
    }

    /// The data directory (`None` for the volatile engine).
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// A trigger that stops the server from anywhere, a signal handler included.
    pub fn shutdown_trigger(&self) -> Option<ShutdownTrigger> {
        self.handle.as_ref().map(|h| h.shutdown_trigger())
    }

    /// The command layer this server runs (for its state after [`KvInstance::wait`], e.g.
    /// whether SHUTDOWN NOSAVE skipped the final flush).
    pub fn service(&self) -> &Arc<KvService> {
        &self.service
    }

    /// Wait until the server stops (SHUTDOWN, or a trigger), then make everything durable and
    /// close the engine.
    pub fn wait(mut self) -> Result<(), KvError> {
        self.finish()
    }

    /// Stop the server now (as SHUTDOWN does) and close the engine.
    pub fn stop(mut self) -> Result<(), KvError> {
        if let Some(h) = &self.handle {
            h.shutdown();
        }
        self.finish()
    }

    fn finish(&mut self) -> Result<(), KvError> {
        let joined = match self.handle.take() {
            Some(h) => h.join(),
            None => Ok(()),
        };
        self.stop_gc.store(true, Ordering::Relaxed);
        if let Some(g) = self.gc.take() {
            let _ = g.join();
        }
        joined.map_err(|source| KvError::Io {
            what: "the server",
            source,
        })?;
        self.service.shutdown().map_err(|source| KvError::Storage {
            what: "closing the engine".into(),
            source,
        })
    }
}

impl Drop for KvInstance {
    fn drop(&mut self) {
        if self.handle.is_some() {
            if let Some(h) = &self.handle {
                h.shutdown();
            }
            let _ = self.finish();
        }
    }
}

/// The network front end's facts for INFO (the command layer's `InfoSource`).
struct NetInfo {
    stats: Arc<ServerStats>,
    port: AtomicU64,
    started: Instant,
    /// This server is a migration target: its progress (INFO `migration`).
    migration: Option<Arc<MigrationStatus>>,
}

impl InfoSource for NetInfo {
    fn info(&self, section: &str, out: &mut Vec<(String, String)>) {
        let s = self.stats.snapshot();
        let mut put = |k: &str, v: u64| out.push((k.to_string(), v.to_string()));
        match section {
            "server" => {
                put("tcp_port", self.port.load(Ordering::Relaxed));
                put("uptime_in_seconds", self.started.elapsed().as_secs());
            }
            "clients" => put("connected_clients", s.connected_clients),
            "stats" => {
                put("total_connections_received", s.total_connections_received);
                put("total_commands_processed", s.total_commands_processed);
                put("rejected_connections", s.rejected_connections);
                put("total_net_input_bytes", s.total_net_input_bytes);
                put("total_net_output_bytes", s.total_net_output_bytes);
                put("tiermem_protocol_errors", s.protocol_errors);
                put("tiermem_cut_query_buffer_limit", s.cut_query_buffer_limit);
                put("tiermem_cut_query_buffer_budget", s.cut_query_buffer_budget);
                put(
                    "tiermem_cut_unfinished_frame_timeout",
                    s.cut_unfinished_frame_timeout,
                );
                put("tiermem_cut_output_buffer_limit", s.cut_output_buffer_limit);
                put("tiermem_cut_idle_timeout", s.cut_idle_timeout);
            }
            "migration" => {
                if let Some(m) = &self.migration {
                    m.fields(out);
                }
            }
            _ => {}
        }
    }
}

/// Migration states of [`MigrationStatus`].
const MIG_RESTORING: u8 = 0;
const MIG_COMPLETE: u8 = 1;
const MIG_FAILED: u8 = 2;

/// A migration target's progress, for INFO's `# Migration` section.
struct MigrationStatus {
    method: &'static str,
    id: u64,
    source: Option<SocketAddr>,
    state: std::sync::atomic::AtomicU8,
    /// Restore time (restore start to the heap being usable), µs.
    restore_us: AtomicU64,
    /// Restore start to every page present, µs (0 until complete).
    complete_us: AtomicU64,
    /// FAM: the resolver's live counters.
    fam_stats: Option<Arc<tiermem_migrate::resolve::ResolverStats>>,
    /// Socket: faults answered by the source, faults served from pushed pages, pages pushed
    /// (known at completion).
    on_demand: AtomicU64,
    from_push: AtomicU64,
    pushed: AtomicU64,
    error: std::sync::Mutex<String>,
}

impl MigrationStatus {
    fn new(
        method: &'static str,
        id: u64,
        source: Option<SocketAddr>,
        fam_stats: Option<Arc<tiermem_migrate::resolve::ResolverStats>>,
    ) -> MigrationStatus {
        MigrationStatus {
            method,
            id,
            source,
            state: std::sync::atomic::AtomicU8::new(MIG_RESTORING),
            restore_us: AtomicU64::new(0),
            complete_us: AtomicU64::new(0),
            fam_stats,
            on_demand: AtomicU64::new(0),
            from_push: AtomicU64::new(0),
            pushed: AtomicU64::new(0),
            error: std::sync::Mutex::new(String::new()),
        }
    }

    fn complete(&self, since_restore: Duration) {
        self.complete_us
            .store(since_restore.as_micros() as u64, Ordering::Relaxed);
        self.state.store(MIG_COMPLETE, Ordering::Release);
    }

    fn fail(&self, why: String) {
        if let Ok(mut e) = self.error.lock() {
            *e = why;
        }
        self.state.store(MIG_FAILED, Ordering::Release);
    }

    /// The `# Migration` fields.
    fn fields(&self, out: &mut Vec<(String, String)>) {
        let mut put = |k: &str, v: String| out.push((k.to_string(), v));
        let ms = |us: &AtomicU64| format!("{:.3}", us.load(Ordering::Relaxed) as f64 / 1e3);
        put("migration_method", self.method.into());
        put("migration_id", format!("{:x}", self.id));
        put(
            "migration_source",
            self.source.map_or(String::new(), |a| a.to_string()),
        );
        let state = self.state.load(Ordering::Acquire);
        put(
            "migration_state",
            match state {
                MIG_COMPLETE => "complete",
                MIG_FAILED => "failed",
                _ => "restoring",
            }
            .into(),
        );
        put("migration_restore_ms", ms(&self.restore_us));
        put("migration_complete_ms", ms(&self.complete_us));
        let (fam, on_demand) = match &self.fam_stats {
            Some(s) => (
                s.from_fam.load(Ordering::Relaxed),
                s.on_demand.load(Ordering::Relaxed),
            ),
            None => (0, self.on_demand.load(Ordering::Relaxed)),
        };
        put("migration_faults_from_fam", fam.to_string());
        put("migration_faults_on_demand", on_demand.to_string());
        put(
            "migration_faults_from_push",
            self.from_push.load(Ordering::Relaxed).to_string(),
        );
        put(
            "migration_pages_pushed",
            self.pushed.load(Ordering::Relaxed).to_string(),
        );
        if state == MIG_FAILED {
            put(
                "migration_error",
                self.error.lock().map(|e| e.clone()).unwrap_or_default(),
            );
        }
    }
}

/// The volatile engine of a migration target: restore the migration `cfg` names and adopt its
/// region — pages arrive on first touch, from FAM (`migration-method fam`, the dump in
/// `restore-from`) or from the source's page-server (`socket`) — and complete it in the
/// background. Returns the engine and the migration's status for INFO.
fn restore_migrated(
    cfg: &KvConfig,
    log: &mut dyn FnMut(&str),
) -> Result<(VolatileEngine, Arc<MigrationStatus>), KvError> {
    let id = cfg
        .migration_id
        .ok_or_else(|| KvError::Config("a migration target needs migration-id".into()))?;
    match cfg.migration_method.as_str() {
        "fam" => restore_fam(cfg, id, log),
        "socket" => restore_socket(cfg, id, log),
        other => Err(KvError::Config(format!(
            "unknown migration-method {other:?} (fam or socket)"
        ))),
    }
}

fn restore_fam(
    cfg: &KvConfig,
    id: u64,
    log: &mut dyn FnMut(&str),
) -> Result<(VolatileEngine, Arc<MigrationStatus>), KvError> {
    let fam = cfg
        .restore_from
        .clone()
        .filter(|p| p.as_os_str() != "-")
        .ok_or_else(|| {
            KvError::Config("migration-method fam needs restore-from (the FAM directory)".into())
        })?;
    let t0 = Instant::now();
    let mut target = tiermem_migrate::fam::FamTarget::restore(
        &fam,
        id,
        cfg.migration_source,
        tiermem_media::DelayModel::from_env().unwrap_or(tiermem_media::DelayModel::NONE),
        Duration::from_secs(5),
    )
    .map_err(|e| {
        KvError::Config(format!(
            "restoring migration {id:x} from {}: {e}",
            fam.display()
        ))
    })?;
    let mut regions = target.take_regions();
    if regions.len() != 1 {
        return Err(KvError::Config(format!(
            "migration {id:x} carries {} regions; a tiermem-kv heap is one",
            regions.len()
        )));
    }
    let region = regions.remove(0);
    let status = Arc::new(MigrationStatus::new(
        "fam",
        id,
        cfg.migration_source,
        Some(region.shared_stats()),
    ));
    let (base, len, handle) = region.into_parts();
    status
        .restore_us
        .store(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
    log(&format!(
        "restored migration {id:x} from {} in {:.1} ms: a {} MiB heap whose pages arrive on \
         first touch (from FAM, or from the source at {})",
        fam.display(),
        t0.elapsed().as_secs_f64() * 1e3,
        len >> 20,
        cfg.migration_source
            .map_or("(none: the dump is complete)".to_string(), |a| a
                .to_string())
    ));
    // Complete the migration in the background: touch every page (each faults in through the
    // migration's resolver).
    let (b, l, st) = (base as usize, len, status.clone());
    std::thread::Builder::new()
        .name("kv-mig-prefetch".into())
        .spawn(move || {
            // SAFETY: the region stays mapped for the engine's life (the engine owns it); the
            // thread only reads.
            unsafe { tiermem_migrate::resolve::prefetch(b as *const u8, l) };
            st.complete(t0.elapsed());
            eprintln!(
                "tiermem-kv: migration {id:x} complete: every page present {:.1} ms after restore",
                t0.elapsed().as_secs_f64() * 1e3
            );
            drop(target);
        })
        .map_err(|source| KvError::Io {
            what: "starting the migration prefetcher",
            source,
        })?;
    // SAFETY: the target handed the mapping and its registration over; nothing else writes it.
    Ok((
        unsafe { VolatileEngine::adopt(base, len, handle, true) },
        status,
    ))
}

/// The volatile engine of `cfg`, with the snapshot at `dir/dbfilename` loaded into it when
/// there is one (the heap then takes the snapshot's size), and the snapshot settings.
/// A snapshot that fails a check refuses the start (the file stays as it is).
fn open_volatile(
    cfg: &KvConfig,
    dir: &Path,
    log: &mut dyn FnMut(&str),
) -> Result<(VolatileEngine, Option<SnapshotSettings>), KvError> {
    let storage = |what: String| move |source| KvError::Storage { what, source };
    let settings = SnapshotSettings {
        dir: dir.to_path_buf(),
        dbfilename: cfg.dbfilename.clone(),
        method: Method::parse(&cfg.snapshot_method).ok_or_else(|| {
            KvError::Config(format!(
                "unknown snapshot-method {:?} (wp, fork-mdc or fork)",
                cfg.snapshot_method
            ))
        })?,
        target: tiermem_snapshot::Target::parse(&cfg.snapshot_target).ok_or_else(|| {
            KvError::Config(format!(
                "unknown snapshot-target {:?} (file or nvm-pool)",
                cfg.snapshot_target
            ))
        })?,
        staging_slots: cfg.snapshot_staging_slots,
        save_points: persistence::parse_save_points(&cfg.save)
            .ok_or_else(|| KvError::Config(format!("bad save points {:?}", cfg.save)))?,
    };
    let path = settings.path();
    for t in persistence::remove_stale_temporaries(&path) {
        log(&format!(
            "removed {t}, an unfinished snapshot's temporary file"
        ));
    }
    let heap_len = persistence::snapshot_heap_len(&path).map_err(|e| {
        KvError::Config(format!(
            "cannot load the snapshot {}: {e} (move it away to start empty)",
            path.display()
        ))
    })?;
    if let Some(l) = heap_len.filter(|&l| l != cfg.heap_size.div_ceil(4096) * 4096) {
        log(&format!(
            "the snapshot's heap is {l} bytes: heap-size {} is not used",
            cfg.heap_size
        ));
    }
    let e = VolatileEngine::new(heap_len.unwrap_or(cfg.heap_size), false)
        .map_err(storage("creating the volatile engine".into()))?;
    let Some(mem) = e.snapshot_memory() else {
        if heap_len.is_some() {
            return Err(KvError::Config(format!(
                "the snapshot {} cannot be loaded: the heap is not snapshot-able memory here \
                 (no userfaultfd)",
                path.display()
            )));
        }
        return Ok((e, None));
    };
    if heap_len.is_some() {
        let r = persistence::load(&path, &mem).map_err(|e| {
            KvError::Config(format!(
                "cannot load the snapshot {}: {e} (move it away to start empty)",
                path.display()
            ))
        })?;
        log(&format!(
            "loaded the snapshot {} ({} MiB of pages, taken by {}) in {:.1} ms",
            r.path.display(),
            (r.present_pages * 4096) >> 20,
            r.method.name(),
            r.millis
        ));
    }
    Ok((e, Some(settings)))
}

/// Offset of the heap-end word in a tiermem heap's header (vnvm's allocator layout): the
/// formatted heap's length rounded down to 16 bytes.
const HEAP_END_WORD: usize = 24;

fn restore_socket(
    cfg: &KvConfig,
    id: u64,
    log: &mut dyn FnMut(&str),
) -> Result<(VolatileEngine, Arc<MigrationStatus>), KvError> {
    use tiermem_migrate::socket::{SocketTarget, TargetOptions};
    let addr = cfg.migration_source.ok_or_else(|| {
        KvError::Config(
            "migration-method socket needs migration-source (the source's page-server)".into(),
        )
    })?;
    let page = tiermem_fault::PAGE_SIZE as u64;
    let len = cfg
        .heap_size
        .div_ceil(page)
        .checked_mul(page)
        .filter(|&l| l >= page)
        .ok_or_else(|| KvError::Config(format!("heap-size {} is unusable", cfg.heap_size)))?;
    let t0 = Instant::now();
    let opts = TargetOptions {
        migration_id: id,
        io_timeout: Duration::from_secs(5),
        complete_timeout: Duration::from_secs(5),
    };
    let target = SocketTarget::connect(addr, len as usize, &opts).map_err(|e| {
        KvError::Config(format!(
            "connecting to migration {id:x}'s page-server at {addr}: {e}"
        ))
    })?;
    let base = target.base();
    // The wire does not carry the region's length: check it against the heap's own header (its
    // first page comes from the source now) before anything else reads the heap.
    // SAFETY: the target's region is mapped for `len` ≥ 4 KiB bytes; the read faults the first
    // page in through the target's resolver. An aligned u64 inside the first page.
    let end = unsafe { std::ptr::read_volatile(base.add(HEAP_END_WORD) as *const u64) };
    if end != len & !15 {
        return Err(KvError::Config(format!(
            "migration {id:x}: the source's heap is {end} bytes (rounded down to 16), this \
             target's heap-size is {len}: start the target with --heap-size equal to the \
             source's heap size (the TIERMEM.MIGRATE reply's last field)"
        )));
    }
    let status = Arc::new(MigrationStatus::new("socket", id, Some(addr), None));
    status
        .restore_us
        .store(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
    log(&format!(
        "restored migration {id:x} by socket post-copy from {addr} in {:.1} ms: a {} MiB heap \
         whose pages arrive on first touch or pushed by the source",
        t0.elapsed().as_secs_f64() * 1e3,
        len >> 20
    ));
    // The region belongs to the target (its receiver fills it): the engine adopts it without
    // owning it and holds the target through `slot` until it is dropped; the completion thread
    // borrows the target from the slot while it waits.
    let slot: Arc<std::sync::Mutex<Option<SocketTarget>>> =
        Arc::new(std::sync::Mutex::new(Some(target)));
    // SAFETY: the region stays mapped while the SocketTarget lives, which the engine's keeper
    // (`slot`) or the completion thread guarantees for the engine's whole life; only the
    // engine writes it (the resolver installs pages only where none is present).
    let engine = unsafe { VolatileEngine::adopt(base, len as usize, None, false) };
    engine.keep_alive(Box::new(slot.clone()));
    let st = status.clone();
    std::thread::Builder::new()
        .name("kv-mig-socket".into())
        .spawn(move || {
            let taken = slot.lock().ok().and_then(|mut s| s.take());
            let Some(mut target) = taken else { return };
            match target.wait() {
                Ok(ts) => {
                    st.on_demand.store(ts.faults_on_demand, Ordering::Relaxed);
                    st.from_push
                        .store(ts.faults_from_staging, Ordering::Relaxed);
                    st.pushed.store(ts.pages_pushed, Ordering::Relaxed);
                    st.complete(t0.elapsed());
                    eprintln!(
                        "tiermem-kv: migration {id:x} complete: every page present {:.1} ms \
                         after restore ({} faults on demand, {} pages pushed)",
                        t0.elapsed().as_secs_f64() * 1e3,
                        ts.faults_on_demand,
                        ts.pages_pushed
                    );
                }
                Err(e) => {
                    eprintln!("tiermem-kv: migration {id:x} failed: {e}");
                    st.fail(e.to_string());
                }
            }
            // Hand the target back to the engine's keeper (if the engine is gone, it drops
            // here, after the engine stopped using the region).
            if let Ok(mut s) = slot.lock() {
                *s = Some(target);
            }
        })
        .map_err(|source| KvError::Io {
            what: "starting the migration completion thread",
            source,
        })?;
    Ok((engine, status))
}

/// Parse `TIERMEM.MIGRATE`'s arguments: `<fam-dir> <listen ip:port> <id hex> [METHOD
/// [EXPIRATION_MS [NET_DELAY]]]`.
struct MigrateArgs {
    fam: PathBuf,
    listen: SocketAddr,
    id: u64,
    socket: bool,
    expiration: Duration,
    delay: tiermem_media::DelayModel,
}

fn migrate_args(args: &[String]) -> Result<MigrateArgs, String> {
    // `args[0..3]` below: at least 3 arguments.
    if args.len() < 3 || args.len() > 6 {
        return Err(
            "usage: TIERMEM.MIGRATE <fam-dir> <listen ip:port> <id hex> [fam|socket \
             [expiration-ms [net-delay]]]"
                .into(),
        );
    }
    let listen: SocketAddr = args[1]
        .parse()
        .map_err(|_| format!("{:?} is not an ip:port address", args[1]))?;
    let id = u64::from_str_radix(args[2].trim_start_matches("0x"), 16)
        .map_err(|_| format!("{:?} is not a hexadecimal id", args[2]))?;
    let socket = match args.get(3).map(|m| m.to_ascii_lowercase()).as_deref() {
        None | Some("fam") => false,
        Some("socket") => true,
        Some(m) => return Err(format!("unknown method {m:?} (fam or socket)")),
    };
    let expiration = match args.get(4) {
        None => tiermem_migrate::socket::SourceOptions::default().expiration,
        Some(ms) => Duration::from_millis(
            ms.parse()
                .map_err(|_| format!("{ms:?} is not an expiration in milliseconds"))?,
        ),
    };
    let delay = match args.get(5) {
        None => tiermem_media::DelayModel::from_env()
            .map_err(|e| format!("{}: {e}", "TIERMEM_DELAY"))?,
        Some(d) => d
            .parse()
            .map_err(|e| format!("{d:?} is not a delay model: {e}"))?,
    };
    if !socket && args[0] == "-" {
        return Err("the fam method needs a FAM directory (not \"-\")".into());
    }
    Ok(MigrateArgs {
        fam: PathBuf::from(&args[0]),
        listen,
        id,
        socket,
        expiration,
        delay,
    })
}

/// `TIERMEM.MIGRATE <fam-dir> <listen ip:port> <id hex> [fam|socket [expiration-ms
/// [net-delay]]]`, replying `MIGRATING <id hex> <listen ip:port> <heap bytes>`. A migration
/// target accepts it only once its own incoming migration is complete.
///
/// * `fam` (default): reserve the migration's files in FAM (a full FAM refuses here, with the
///   server still serving), then on a thread: freeze, serve the dump and the target's faults,
///   and shut the server down when the dump is complete.
/// * `socket`: socket post-copy (the FAM directory is unused, `-`): on a thread, freeze, hold
///   the heap's pages, serve the target's two connections on `listen` (faults on demand; every
///   remaining page pushed once no fault came for `expiration-ms`, default 100) and shut the
///   server down when every page was sent. The target's heap-size must be the reply's heap
///   bytes.
///
/// `net-delay` (a delay model, e.g. `ethernet-10g`; default `TIERMEM_DELAY`) is charged per
/// message the source sends.
fn migrate_hook(
    service: std::sync::Weak<KvService>,
    trigger: Arc<std::sync::OnceLock<ShutdownTrigger>>,
    cfg: KvConfig,
    incoming: Option<Arc<MigrationStatus>>,
) -> crate::commands::MigrateHook {
    Box::new(move |args: &[String]| {
        let svc = service.upgrade().ok_or("the server is shutting down")?;
        if svc.is_frozen() {
            return Err("a migration is already under way".into());
        }
        if svc.persistence().is_some_and(|p| p.in_progress()) {
            return Err(
                "a snapshot is being taken (retry when rdb_bgsave_in_progress is 0)".into(),
            );
        }
        if let Some(m) = &incoming {
            if m.state.load(Ordering::Acquire) != MIG_COMPLETE {
                return Err(format!(
                    "this server's own incoming migration {:x} is not complete (INFO migration)",
                    m.id
                ));
            }
        }
        let m = migrate_args(args)?;
        let (fam, listen, id) = (m.fam.clone(), m.listen, m.id);
        let listener = std::net::TcpListener::bind(listen)
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        let listen = listener.local_addr().unwrap_or(listen);
        let view = svc.heap().view();
        let (base, len) = (view.as_ptr(), view.len() as u64);
        let reply = format!("MIGRATING {id:x} {listen} {len}");
        let trigger = trigger.clone();
        let done = move || {
            if let Some(t) = trigger.get() {
                t.request();
            }
        };
        if m.socket {
            let opts = tiermem_migrate::socket::SourceOptions {
                migration_id: id,
                expiration: m.expiration,
                delay: m.delay,
                ..Default::default()
            };
            std::thread::Builder::new()
                .name("kv-migrate".into())
                .spawn(move || {
                    let t0 = Instant::now();
                    svc.freeze();
                    svc.heap().engine().prepare_migration();
                    eprintln!(
                        "tiermem-kv: frozen for migration {id:x} in {:.1} ms; serving {} MiB by \
                         socket post-copy on {listen} (expiration {} ms)",
                        t0.elapsed().as_secs_f64() * 1e3,
                        len >> 20,
                        opts.expiration.as_millis()
                    );
                    let region = svc.heap().view();
                    match tiermem_migrate::socket::SocketSource::freeze_and_serve(
                        region, &listener, &opts,
                    ) {
                        Ok(s) => eprintln!(
                            "tiermem-kv: migration {id:x} sent: busy {:.1} ms, {} pages on \
                             demand, {} pushed; exiting",
                            (s.busy_end_ns.saturating_sub(s.serve_start_ns)) as f64 / 1e6,
                            s.pages_on_demand,
                            s.pages_pushed
                        ),
                        Err(e) => eprintln!("tiermem-kv: migration {id:x} failed: {e}"),
                    }
                    done();
                })
                .map_err(|e| format!("cannot start the migration thread: {e}"))?;
            return Ok(reply);
        }
        let blob = format!(
            "tiermem-kv volatile heap of {len} bytes\nengine {}\n",
            cfg.engine
        );
        let scfg = tiermem_migrate::fam::FamSourceConfig {
            fam: fam.clone(),
            id,
            batching: tiermem_migrate::lazyfile::Batching::PerVector,
            delay: m.delay,
            // A heap is mostly unused space above its bump pointer: dump only what was touched.
            skip_untouched: true,
        };
        // SAFETY: the heap lives as long as `svc` (held by the thread below until serve
        // returns) and is frozen before serve starts dumping.
        let source = unsafe {
            tiermem_migrate::fam::FamSource::checkpoint(scfg, &[(base, len)], blob.as_bytes())
        }
        .map_err(|e| e.to_string())?;
        std::thread::Builder::new()
            .name("kv-migrate".into())
            .spawn(move || {
                let t0 = Instant::now();
                svc.freeze();
                svc.heap().engine().prepare_migration();
                eprintln!(
                    "tiermem-kv: frozen for migration {id:x} in {:.1} ms; dumping {} MiB to {}",
                    t0.elapsed().as_secs_f64() * 1e3,
                    len >> 20,
                    fam.display()
                );
                match source.serve(listener) {
                    Ok(r) => eprintln!(
                        "tiermem-kv: migration {id:x} dumped: busy {:.1} ms, {} requests from \
                         the target, {} vectors on demand; exiting",
                        r.busy_ns as f64 / 1e6,
                        r.requests,
                        r.on_demand_vectors
                    ),
                    Err(e) => eprintln!("tiermem-kv: migration {id:x} failed: {e}"),
                }
                done();
            })
            .map_err(|e| format!("cannot start the migration thread: {e}"))?;
        Ok(reply)
    })
}
