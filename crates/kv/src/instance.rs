//! A whole tiermem-kv server in this process: engine, heap, command layer, network front end
//! and the idle garbage freer, started from a [`KvConfig`]. `tiermem kv serve` and the C ABI
//! (`tiermem_kv_start`) are thin wrappers around [`KvInstance`].

use crate::commands::{Durability, InfoSource, KvService, GC_ROUND_BUDGET};
use crate::config::KvConfig;
use crate::heap::vnvm::{VnvmEngine, VnvmEngineConfig};
use crate::heap::volatile::VolatileEngine;
use crate::heap::{Engine, Heap};
use crate::server::{self, ServerHandle, ServerStats, ShutdownTrigger};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
        let (engine, dir): (Box<dyn Engine>, Option<PathBuf>) = match cfg.engine.as_str() {
            "vnvm" => {
                let ec = VnvmEngineConfig {
                    dir: dir.clone(),
                    heap_size: cfg.heap_size,
                    log_size: cfg.log_size.unwrap_or(DEFAULT_POOL_SIZE),
                    cache_size: cfg.cache_size.unwrap_or(DEFAULT_POOL_SIZE),
                };
                let e = VnvmEngine::open(&ec).map_err(storage(format!(
                    "opening the vnvm engine in {}",
                    dir.display()
                )))?;
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
            "volatile" if cfg.restore_from.is_some() => {
                (Box::new(restore_migrated(cfg, log)?), None)
            }
            "volatile" => (
                Box::new(
                    VolatileEngine::new(cfg.heap_size, false)
                        .map_err(storage("creating the volatile engine".into()))?,
                ),
                None,
            ),
            other => {
                return Err(KvError::Config(format!(
                    "unknown engine {other:?} (vnvm or volatile)"
                )))
            }
        };
        let durability = match cfg.durability.as_str() {
            "commit" => Durability::Commit,
            "async" => Durability::Async,
            other => {
                return Err(KvError::Config(format!(
                    "unknown durability {other:?} (commit or async)"
                )))
            }
        };
        let info = engine.info();
        log(&format!(
            "engine {} ({}): {}",
            info.name,
            if info.durable {
                format!("durable, durability {}", cfg.durability)
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
        });
        let service = Arc::new(
            KvService::new(heap, durability)
                .map_err(storage("opening the keyspace".into()))?
                .with_info_source(net.clone())
                .with_config(cfg.get("*")),
        );
        let trigger: Arc<std::sync::OnceLock<ShutdownTrigger>> = Arc::default();
        if service.heap().engine().migratable() {
            service.set_migrate_hook(migrate_hook(
                Arc::downgrade(&service),
                trigger.clone(),
                cfg.clone(),
            ));
        }
        let handle =
            server::start(&cfg.server, service.clone(), stats).map_err(|source| KvError::Io {
                what: "starting the server",
                source,
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
        // under traffic).
        let stop_gc = Arc::new(AtomicBool::new(false));
        let gc = {
            let (service, stop) = (service.clone(), stop_gc.clone());
            std::thread::Builder::new()
                .name("kv-gc".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
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
            }
            _ => {}
        }
    }
}

/// The volatile engine of a migration target: restore the migration `cfg.restore_from` names,
/// adopt its region (its pages arrive on first touch, from FAM or the source's page-server),
/// and complete it in the background.
fn restore_migrated(cfg: &KvConfig, log: &mut dyn FnMut(&str)) -> Result<VolatileEngine, KvError> {
    let fam = cfg.restore_from.clone().expect("restore-from");
    let id = cfg
        .migration_id
        .ok_or_else(|| KvError::Config("restore-from needs migration-id".into()))?;
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
    let (base, len, handle) = regions.remove(0).into_parts();
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
    let (b, l) = (base as usize, len);
    std::thread::Builder::new()
        .name("kv-mig-prefetch".into())
        .spawn(move || {
            // SAFETY: the region stays mapped for the engine's life (the engine owns it); the
            // thread only reads.
            unsafe { tiermem_migrate::resolve::prefetch(b as *const u8, l) };
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
    Ok(unsafe { VolatileEngine::adopt(base, len, handle, true) })
}

/// `TIERMEM.MIGRATE <fam-dir> <listen ip:port> <id hex>`: reserve the migration's files in FAM
/// (a full FAM refuses here, with the server still serving), then on a thread: freeze, serve
/// the dump and the target's faults, and shut the server down when the dump is complete.
fn migrate_hook(
    service: std::sync::Weak<KvService>,
    trigger: Arc<std::sync::OnceLock<ShutdownTrigger>>,
    cfg: KvConfig,
) -> crate::commands::MigrateHook {
    Box::new(move |args: &[String]| {
        let svc = service.upgrade().ok_or("the server is shutting down")?;
        if svc.is_frozen() {
            return Err("a migration is already under way".into());
        }
        let fam = PathBuf::from(&args[0]);
        let listen: SocketAddr = args[1]
            .parse()
            .map_err(|_| format!("{:?} is not an ip:port address", args[1]))?;
        let id = u64::from_str_radix(args[2].trim_start_matches("0x"), 16)
            .map_err(|_| format!("{:?} is not a hexadecimal id", args[2]))?;
        let listener = std::net::TcpListener::bind(listen)
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        let view = svc.heap().view();
        let (base, len) = (view.as_ptr(), view.len() as u64);
        let blob = format!(
            "tiermem-kv volatile heap of {len} bytes\nengine {}\n",
            cfg.engine
        );
        let scfg = tiermem_migrate::fam::FamSourceConfig {
            fam: fam.clone(),
            id,
            batching: tiermem_migrate::lazyfile::Batching::PerVector,
            delay: tiermem_media::DelayModel::from_env().unwrap_or(tiermem_media::DelayModel::NONE),
            // A heap is mostly unused space above its bump pointer: dump only what was touched.
            skip_untouched: true,
        };
        // SAFETY: the heap lives as long as `svc` (held by the thread below until serve
        // returns) and is frozen before serve starts dumping.
        let source = unsafe {
            tiermem_migrate::fam::FamSource::checkpoint(scfg, &[(base, len)], blob.as_bytes())
        }
        .map_err(|e| e.to_string())?;
        let trigger = trigger.clone();
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
                if let Some(t) = trigger.get() {
                    t.request();
                }
            })
            .map_err(|e| format!("cannot start the migration thread: {e}"))?;
        Ok(format!("MIGRATING {id:x}"))
    })
}
