//! `tiermem kv serve`: the tiermem-kv server (Redis protocol) on a vnvm or volatile heap.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::sync::OnceLock;
use tiermem_kv::config::KvConfig;
use tiermem_kv::instance::KvInstance;
use tiermem_kv::server::ShutdownTrigger;

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
    let kv = KvInstance::start(
        &cfg,
        &tiermem_media::default_dir().join("kv"),
        &mut |line| eprintln!("tiermem-kv: {line}"),
    )?;
    if let Some(t) = kv.shutdown_trigger() {
        let _ = TRIGGER.set(t);
        // SAFETY: installing async-signal-safe handlers (they only call ShutdownTrigger::request).
        unsafe {
            libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
            libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        }
    }
    let durable = kv.dir().is_some();
    kv.wait()?;
    if durable {
        eprintln!("tiermem-kv: shut down cleanly: everything acknowledged is durable");
    } else {
        eprintln!("tiermem-kv: shut down");
    }
    Ok(())
}
