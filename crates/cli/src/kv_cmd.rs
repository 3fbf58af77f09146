//! `tiermem kv serve`: the tiermem-kv server (Redis protocol) on a vnvm or volatile heap.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tiermem_kv::commands::{Durability, InfoSource, KvService, GC_ROUND_BUDGET};
use tiermem_kv::config::KvConfig;
use tiermem_kv::heap::vnvm::{VnvmEngine, VnvmEngineConfig};
use tiermem_kv::heap::volatile::VolatileEngine;
use tiermem_kv::heap::{Engine, Heap};
use tiermem_kv::server::{self, ServerStats, ShutdownTrigger};

/// `tiermem kv ...`
#[derive(Subcommand)]
pub enum KvCommand {
    /// Serve the Redis protocol (RESP2) over TCP and optionally a Unix socket, with the data in
    /// a tiermem heap. Stop it with SHUTDOWN, SIGTERM or SIGINT.
    Serve(ServeArgs),
}

/// Flags of `tiermem kv serve`. Every flag is also a configuration-file key (same name); flags
/// override the file.
#[derive(Args)]
pub struct ServeArgs {
    /// A redis.conf-style file (`key value` lines; keys as the flags below and Redis' names).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Storage engine: vnvm (durable, default) or volatile (one registered anonymous region).
    #[arg(long, value_name = "vnvm|volatile")]
    engine: Option<String>,
    /// Data directory (default $TIERMEM_DIR/kv, i.e. /dev/shm/tiermem/kv).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// TCP port (default 6379; 0: an ephemeral port, printed at start).
    #[arg(long, value_name = "N")]
    port: Option<String>,
    /// Addresses to listen on, blank-separated (default 127.0.0.1).
    #[arg(long, value_name = "ADDRS")]
    bind: Option<String>,
    /// Also listen on this Unix socket.
    #[arg(long, value_name = "PATH")]
    unixsocket: Option<String>,
    /// commit: every write command is durable before its reply (default); async: see docs/kv.md.
    #[arg(long, value_name = "commit|async")]
    durability: Option<String>,
    /// Heap size (e.g. 1gb) — the most data the server can hold.
    #[arg(long, value_name = "SIZE")]
    heap_size: Option<String>,
    /// Event-loop threads (default: the CPU count).
    #[arg(long, value_name = "N")]
    threads: Option<String>,
    /// Any other configuration key: `--set key=value` (repeatable), e.g. maxclients=100.
    #[arg(long, value_name = "KEY=VALUE")]
    set: Vec<String>,
}

/// Run a `tiermem kv` command.
pub fn run(cmd: KvCommand) -> Result<()> {
    match cmd {
        KvCommand::Serve(a) => serve(a),
    }
}

static TRIGGER: OnceLock<ShutdownTrigger> = OnceLock::new();

extern "C" fn on_signal(_sig: libc::c_int) {
    if let Some(t) = TRIGGER.get() {
        t.request();
    }
}

fn config(a: &ServeArgs) -> Result<KvConfig> {
    let mut cfg = KvConfig::default();
    if let Some(f) = &a.config {
        cfg.load_file(f).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let mut set = |k: &str, v: Option<String>| -> Result<()> {
        if let Some(v) = v {
            cfg.set(k, &v)
                .map_err(|e| anyhow::anyhow!("--{k} {v:?}: {}", e.message))?;
        }
        Ok(())
    };
    set("engine", a.engine.clone())?;
    set("dir", a.dir.as_ref().map(|d| d.display().to_string()))?;
    set("port", a.port.clone())?;
    set("bind", a.bind.clone())?;
    set("unixsocket", a.unixsocket.clone())?;
    set("durability", a.durability.clone())?;
    set("heap-size", a.heap_size.clone())?;
    set("threads", a.threads.clone())?;
    for kv in &a.set {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("--set {kv:?}: expected KEY=VALUE");
        };
        set(k, Some(v.to_string()))?;
    }
    Ok(cfg)
}

fn serve(a: ServeArgs) -> Result<()> {
    let cfg = config(&a)?;
    let dir = cfg
        .dir
        .clone()
        .unwrap_or_else(|| tiermem_media::default_dir().join("kv"));
    let engine: Box<dyn Engine> = match cfg.engine.as_str() {
        "vnvm" => {
            let mut ec = VnvmEngineConfig {
                dir: dir.clone(),
                heap_size: cfg.heap_size,
                log_size: 64 << 20,
                cache_size: 64 << 20,
            };
            if let Some(l) = cfg.log_size {
                ec.log_size = l;
            }
            if let Some(c) = cfg.cache_size {
                ec.cache_size = c;
            }
            let e = VnvmEngine::open(&ec)
                .with_context(|| format!("opening the vnvm engine in {}", dir.display()))?;
            let r = e.report();
            match &r.recovery {
                None => eprintln!("tiermem-kv: new vnvm instance in {}", dir.display()),
                Some(rec) if rec.was_clean => eprintln!(
                    "tiermem-kv: {} was shut down cleanly: nothing to recover",
                    dir.display()
                ),
                Some(rec) => eprintln!(
                    "tiermem-kv: recovered {} after an unclean shutdown: {} dirty cache pages \
                     written back, {} committed transactions ({} bytes) replayed",
                    dir.display(),
                    rec.dirty_pages_written,
                    rec.transactions_replayed,
                    rec.bytes_replayed
                ),
            }
            Box::new(e)
        }
        "volatile" => Box::new(
            VolatileEngine::new(cfg.heap_size, false).context("creating the volatile engine")?,
        ),
        other => bail!("unknown engine {other:?} (vnvm or volatile)"),
    };
    let info = engine.info();
    eprintln!(
        "tiermem-kv: engine {} ({}): {}",
        info.name,
        if info.durable {
            format!("durable, durability {}", cfg.durability)
        } else {
            "not persisted".to_string()
        },
        info.location
    );
    let heap = Heap::open(engine).context("opening the heap")?;
    let durability = match cfg.durability.as_str() {
        "commit" => Durability::Commit,
        "async" => Durability::Async,
        other => bail!("unknown durability {other:?} (commit or async)"),
    };
    let stats = Arc::new(ServerStats::default());
    let net = Arc::new(NetInfo {
        stats: stats.clone(),
        port: std::sync::atomic::AtomicU64::new(0),
        started: Instant::now(),
    });
    let service = Arc::new(
        KvService::new(heap, durability)
            .context("opening the keyspace")?
            .with_info_source(net.clone())
            .with_config(cfg.get("*")),
    );
    let handle =
        server::start(&cfg.server, service.clone(), stats).context("starting the server")?;
    if let Some(a) = handle.tcp_addrs().first() {
        net.port
            .store(a.port() as u64, std::sync::atomic::Ordering::Relaxed);
    }
    // Free the garbage of big deletions when no command comes to do it (round_end does it
    // under traffic).
    let stop_gc = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let gc = {
        let (service, stop) = (service.clone(), stop_gc.clone());
        std::thread::Builder::new()
            .name("kv-gc".into())
            .spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                    if service.has_garbage() {
                        if let Err(e) = service.collect_garbage(16 * GC_ROUND_BUDGET) {
                            eprintln!("tiermem-kv: freeing deleted data failed: {e}");
                        }
                    }
                }
            })
            .context("starting the garbage thread")?
    };
    let _ = TRIGGER.set(handle.shutdown_trigger());
    // SAFETY: installing async-signal-safe handlers (they only call ShutdownTrigger::request).
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    for addr in handle.tcp_addrs() {
        eprintln!("tiermem-kv: listening on {addr}");
    }
    if let Some(p) = handle.unix_path() {
        eprintln!("tiermem-kv: listening on unix socket {}", p.display());
    }
    let joined = handle.join();
    stop_gc.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = gc.join();
    joined.context("server")?;
    eprintln!("tiermem-kv: shutting down: making everything durable");
    service.shutdown().context("closing the engine")?;
    eprintln!("tiermem-kv: bye");
    Ok(())
}

/// The network front end's facts for INFO (the command layer's `InfoSource`).
struct NetInfo {
    stats: Arc<ServerStats>,
    port: std::sync::atomic::AtomicU64,
    started: Instant,
}

impl InfoSource for NetInfo {
    fn info(&self, section: &str, out: &mut Vec<(String, String)>) {
        let s = self.stats.snapshot();
        let mut put = |k: &str, v: u64| out.push((k.to_string(), v.to_string()));
        match section {
            "server" => {
                put(
                    "tcp_port",
                    self.port.load(std::sync::atomic::Ordering::Relaxed),
                );
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
