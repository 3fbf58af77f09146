//! `tiermem kv serve`: the tiermem-kv server (Redis protocol) on a vnvm or volatile heap.
//! `tiermem kv migrate`: live-migrate a volatile server to a new target process.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tiermem_kv::client::{Client, Reply};
use tiermem_kv::config::KvConfig;
use tiermem_kv::instance::KvInstance;
use tiermem_kv::server::ShutdownTrigger;

/// `tiermem kv ...`
#[derive(Subcommand)]
pub enum KvCommand {
    /// Serve the Redis protocol (RESP2) over TCP and optionally a Unix socket, with the data in
    /// a tiermem heap. Stop it with SHUTDOWN, SIGTERM or SIGINT.
    Serve(ServeArgs),
    /// Live-migrate a running volatile server: send it TIERMEM.MIGRATE, start the target
    /// (`tiermem kv serve` restoring the migration, detached, optionally inside a network
    /// namespace), wait until it serves and the migration is complete, print its address and
    /// the migration's metrics. The source exits by itself once everything was sent.
    Migrate(MigrateArgs),
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
    /// Create a new instance (vnvm engine) in the data directory, which must be empty or not
    /// exist. Without it the server opens the instance the directory holds, and refuses a
    /// directory holding none or only part of one.
    #[arg(long)]
    new: bool,
    /// TCP port (default 6379; 0: an ephemeral port, printed at start).
    #[arg(long, value_name = "N")]
    port: Option<String>,
    /// Addresses to listen on, blank-separated (default 127.0.0.1).
    #[arg(long, value_name = "ADDRS")]
    bind: Option<String>,
    /// Also listen on this Unix socket.
    #[arg(long, value_name = "PATH")]
    unixsocket: Option<String>,
    /// Every write is durable before its reply either way: pipeline (default): the writes of
    /// one pipeline share one transaction; commit: one transaction per write command. One
    /// durability barrier per event-loop round serves every connection (docs/kv.md).
    #[arg(long, value_name = "pipeline|commit")]
    durability: Option<String>,
    /// Heap size (e.g. 1gb) — the most data the server can hold.
    #[arg(long, value_name = "SIZE")]
    heap_size: Option<String>,
    /// Event-loop threads (default: the CPU count minus one, at least one).
    #[arg(long, value_name = "N")]
    threads: Option<String>,
    /// The default user's password: clients must AUTH first (default: none).
    #[arg(long, value_name = "PASSWORD")]
    requirepass: Option<String>,
    /// Redis' protected mode: with no password, serve only clients on this host (yes, the
    /// default, or no).
    #[arg(long, value_name = "yes|no")]
    protected_mode: Option<String>,
    /// Any other configuration key: `--set key=value` (repeatable), e.g. maxclients=100.
    #[arg(long, value_name = "KEY=VALUE")]
    set: Vec<String>,
}

/// Run a `tiermem kv` command.
pub fn run(cmd: KvCommand) -> Result<()> {
    match cmd {
        KvCommand::Serve(a) => serve(a),
        KvCommand::Migrate(a) => migrate(a),
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
    set("new", a.new.then(|| "yes".to_string()))?;
    set("port", a.port.clone())?;
    set("bind", a.bind.clone())?;
    set("unixsocket", a.unixsocket.clone())?;
    set("durability", a.durability.clone())?;
    set("heap-size", a.heap_size.clone())?;
    set("threads", a.threads.clone())?;
    set("requirepass", a.requirepass.clone())?;
    set("protected-mode", a.protected_mode.clone())?;
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
    let service = std::sync::Arc::clone(kv.service());
    kv.wait()?;
    if durable && service.nosave_requested() {
        eprintln!(
            "tiermem-kv: stopped without the final flush (SHUTDOWN NOSAVE): everything \
             acknowledged is in the vnvm log and cache and is recovered at the next start"
        );
    } else if durable {
        eprintln!("tiermem-kv: shut down cleanly: everything acknowledged is durable");
    } else {
        eprintln!("tiermem-kv: shut down");
    }
    Ok(())
}

/// Flags of `tiermem kv migrate`.
#[derive(Args)]
pub struct MigrateArgs {
    /// The source server (a `tiermem kv serve --engine volatile`), ip:port.
    #[arg(long, value_name = "IP:PORT")]
    from: std::net::SocketAddr,
    /// The FAM directory both hosts see (method fam); unused by method socket ("-").
    #[arg(long, value_name = "DIR")]
    fam: Option<PathBuf>,
    /// fam (FAM-aware post-copy, default) or socket (socket post-copy, CRIU's way).
    #[arg(long, value_name = "fam|socket", default_value = "fam")]
    method: String,
    /// Socket method: push every remaining page once no fault came for this long (default:
    /// the source's, 100 ms).
    #[arg(long, value_name = "N")]
    expiration_ms: Option<u64>,
    /// Where the source's page-server listens (default: the --from IP, a port it picks).
    #[arg(long, value_name = "IP:PORT")]
    page_server: Option<std::net::SocketAddr>,
    /// The migration id (hex; default random).
    #[arg(long, value_name = "HEX")]
    id: Option<String>,
    /// Start the target inside this network namespace (`ip netns exec NAME`); its readiness is
    /// checked from inside it.
    #[arg(long, value_name = "NAME")]
    target_netns: Option<String>,
    /// The target's TCP port (default: the source's port inside --target-netns, else a free
    /// port).
    #[arg(long, value_name = "P")]
    target_port: Option<u16>,
    /// Addresses the target listens on (default: * inside --target-netns, else the --from IP).
    #[arg(long, value_name = "ADDRS")]
    target_bind: Option<String>,
    /// The target's log (default: kv-target-<id>.log in the FAM directory, or the temporary
    /// directory for method socket).
    #[arg(long, value_name = "FILE")]
    target_log: Option<PathBuf>,
    /// More arguments for the target's `tiermem kv serve` (repeatable), e.g.
    /// `--target-arg=--threads --target-arg=2`.
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    target_arg: Vec<String>,
    /// Give up after this many seconds (target start-up plus completion).
    #[arg(long, value_name = "S", default_value_t = 120)]
    timeout: u64,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Send one command to `addr` and read its reply; every step bounded by `timeout`.
fn resp_command(addr: SocketAddr, args: &[&str], timeout: Duration) -> std::io::Result<Reply> {
    Client::connect(addr, timeout)?.command(args)
}

/// Run `f` on a thread inside network namespace `netns` (when given; sockets it creates belong
/// there), else on this thread.
fn in_netns<T: Send>(netns: Option<&str>, f: impl FnOnce() -> T + Send) -> Result<T> {
    match netns {
        None => Ok(f()),
        Some(name) => Ok(tiermem_migrate::netns::run_in_named(name, f)?),
    }
}

/// The `# Migration` fields of a target's INFO, or why there are none yet.
fn migration_info(
    netns: Option<&str>,
    addr: std::net::SocketAddr,
) -> Result<std::io::Result<Vec<(String, String)>>> {
    in_netns(netns, move || {
        match resp_command(addr, &["INFO", "migration"], Duration::from_secs(5))? {
            Reply::Bulk(Some(b)) => Ok(String::from_utf8_lossy(&b)
                .lines()
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.to_string(), v.trim().to_string()))
                .collect()),
            other => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("INFO answered {other:?}"),
            )),
        }
    })
}

fn migrate(a: MigrateArgs) -> Result<()> {
    use anyhow::Context;
    let method = a.method.to_ascii_lowercase();
    if method != "fam" && method != "socket" {
        bail!("--method {:?}: fam or socket", a.method);
    }
    let fam = match (&a.fam, method.as_str()) {
        (Some(f), _) if f.as_os_str() != "-" => Some(f.clone()),
        (_, "fam") => bail!("--method fam needs --fam DIR (a directory both hosts see)"),
        _ => None,
    };
    let id = match &a.id {
        Some(h) => u64::from_str_radix(h.trim_start_matches("0x"), 16)
            .map_err(|_| anyhow::anyhow!("--id {h:?}: not hexadecimal"))?,
        None => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            // splitmix64 of time and pid: distinct ids for concurrent migrations.
            let mut z = t ^ ((std::process::id() as u64) << 32);
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) | 1
        }
    };
    let timeout = Duration::from_secs(a.timeout.max(1));
    let netns = a.target_netns.as_deref();
    let page_server = a
        .page_server
        .unwrap_or_else(|| std::net::SocketAddr::new(a.from.ip(), 0));
    let target_port = match (a.target_port, netns) {
        (Some(p), _) => p,
        (None, Some(_)) => a.from.port(),
        (None, None) => std::net::TcpListener::bind((a.from.ip(), 0))
            .and_then(|l| l.local_addr())
            .map(|x| x.port())
            .context("finding a free port for the target")?,
    };
    let bind = a.target_bind.clone().unwrap_or_else(|| {
        if netns.is_some() {
            "*".to_string()
        } else {
            a.from.ip().to_string()
        }
    });
    // Where this command reaches the target: its first specific bind address, else loopback.
    let first = bind.split_whitespace().next().unwrap_or("*");
    let target_ip: std::net::IpAddr = first
        .trim_start_matches('-')
        .parse()
        .unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
    let target = std::net::SocketAddr::new(target_ip, target_port);

    // The target serves the source's clients as the source did: the same protected mode.
    let protected = match resp_command(
        a.from,
        &["CONFIG", "GET", "protected-mode"],
        Duration::from_secs(10),
    ) {
        Ok(Reply::Array(Some(v))) => match v.get(1) {
            Some(Reply::Bulk(Some(b))) => String::from_utf8_lossy(b).into_owned(),
            _ => "yes".to_string(),
        },
        _ => "yes".to_string(),
    };
    // Progress on stderr while it runs (a terminal only).
    let _progress = tiermem_bench::progress::show("kv migrate");
    // 1. The source: freeze and serve.
    tiermem_bench::progress::step(&format!("freezing the source at {}", a.from));
    let fam_arg = fam
        .as_ref()
        .map_or("-".to_string(), |f| f.display().to_string());
    let mut margs = vec![
        "TIERMEM.MIGRATE".to_string(),
        fam_arg.clone(),
        page_server.to_string(),
        format!("{id:x}"),
        method.clone(),
    ];
    if let Some(ms) = a.expiration_ms {
        margs.push(ms.to_string());
    }
    let margs: Vec<&str> = margs.iter().map(|s| s.as_str()).collect();
    let t0 = Instant::now();
    let reply = resp_command(a.from, &margs, Duration::from_secs(10))
        .with_context(|| format!("cannot reach the source at {}", a.from))?;
    let text = match reply {
        Reply::Simple(t) => t,
        Reply::Error(e) => bail!("the source at {} refused: {e}", a.from),
        other => bail!(
            "the source at {} answered {other:?} to TIERMEM.MIGRATE",
            a.from
        ),
    };
    // MIGRATING <id> <page-server ip:port> <heap bytes>
    let f: Vec<&str> = text.split_whitespace().collect();
    let (ps, heap): (std::net::SocketAddr, u64) = match f.as_slice() {
        ["MIGRATING", _, ps, heap] => (
            ps.parse().context("the page-server address in the reply")?,
            heap.parse().context("the heap size in the reply")?,
        ),
        _ => bail!(
            "unexpected reply to TIERMEM.MIGRATE from {}: {text:?}",
            a.from
        ),
    };
    let migrate_ms = t0.elapsed().as_secs_f64() * 1e3;

    // 2. The target, detached (its own session; it outlives this command).
    tiermem_bench::progress::step("starting the target");
    let log = a.target_log.clone().unwrap_or_else(|| {
        fam.clone()
            .unwrap_or_else(std::env::temp_dir)
            .join(format!("kv-target-{id:x}.log"))
    });
    let logf = std::fs::File::create(&log)
        .with_context(|| format!("creating the target's log {}", log.display()))?;
    let exe = std::env::current_exe().context("locating the tiermem binary")?;
    let mut cmd = match netns {
        Some(n) => {
            let mut c = std::process::Command::new("ip");
            c.args(["netns", "exec", n]).arg(&exe);
            c
        }
        None => std::process::Command::new(&exe),
    };
    cmd.args(["kv", "serve", "--engine", "volatile"])
        .args(["--port", &target_port.to_string(), "--bind", &bind])
        .args(["--protected-mode", &protected])
        .args(["--heap-size", &heap.to_string()])
        .args(["--set", &format!("migration-id={id:x}")])
        .args(["--set", &format!("migration-source={ps}")])
        .args(["--set", &format!("migration-method={method}")]);
    if let Some(f) = &fam {
        cmd.args(["--set", &format!("restore-from={}", f.display())]);
    }
    cmd.args(&a.target_arg)
        .stdin(std::process::Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf);
    // SAFETY: setsid is async-signal-safe and touches only the child.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the target")?;
    let pid = child.id();
    let tail = || tiermem_bench::kv_harness::log_tail(&log, 8);

    // 3. Wait until it serves, then until the migration is complete.
    tiermem_bench::progress::step("waiting for the target to serve, then for the last page");
    let deadline = Instant::now() + timeout;
    let mut serving_ms = None;
    let fields = loop {
        if let Ok(Some(st)) = child.try_wait() {
            bail!(
                "the target exited ({st}) before the migration completed; its log {}: {}",
                log.display(),
                tail()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "the target (pid {pid}) did not {} within {} s; its log {}: {}",
                if serving_ms.is_none() {
                    "answer PING"
                } else {
                    "complete the migration"
                },
                timeout.as_secs(),
                log.display(),
                tail()
            );
        }
        if serving_ms.is_none() {
            let ping = in_netns(netns, move || {
                resp_command(target, &["PING"], Duration::from_secs(2))
            })?;
            if matches!(ping, Ok(Reply::Simple(ref p)) if p == "PONG") {
                serving_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        if serving_ms.is_some() {
            if let Ok(f) = migration_info(netns, target)? {
                match f
                    .iter()
                    .find(|(k, _)| k == "migration_state")
                    .map(|(_, v)| v.as_str())
                {
                    Some("complete") => break f,
                    Some("failed") => bail!(
                        "the migration failed at the target: {}; its log {}: {}",
                        f.iter()
                            .find(|(k, _)| k == "migration_error")
                            .map_or("", |(_, v)| v.as_str()),
                        log.display(),
                        tail()
                    ),
                    Some(_) => {}
                    None => bail!(
                        "the target at {target} has no migration state in INFO (not a \
                         migration target?)"
                    ),
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let total_ms = t0.elapsed().as_secs_f64() * 1e3;
    let serving_ms = serving_ms.unwrap_or(total_ms);
    if a.json {
        let mut m = serde_json::Map::new();
        let mut put = |k: &str, v: serde_json::Value| {
            m.insert(k.to_string(), v);
        };
        put("id", format!("{id:x}").into());
        put("method", method.clone().into());
        put("source", a.from.to_string().into());
        put("page_server", ps.to_string().into());
        put("heap_bytes", heap.into());
        put("target", target.to_string().into());
        put(
            "target_netns",
            netns.map_or(serde_json::Value::Null, |n| n.into()),
        );
        put("target_pid", pid.into());
        put("target_log", log.display().to_string().into());
        put("migrate_reply_ms", migrate_ms.into());
        put("target_serving_ms", serving_ms.into());
        put("complete_seen_ms", total_ms.into());
        for (k, v) in &fields {
            let val = v
                .parse::<u64>()
                .map(serde_json::Value::from)
                .or_else(|_| v.parse::<f64>().map(serde_json::Value::from))
                .unwrap_or_else(|_| v.clone().into());
            put(k, val);
        }
        println!("{}", serde_json::Value::Object(m));
    } else {
        println!(
            "migration {id:x} ({method}) complete: the target serves at {target}{} (pid {pid}, \
             log {})",
            netns.map_or(String::new(), |n| format!(" in network namespace {n}")),
            log.display()
        );
        println!(
            "  source {} replied in {migrate_ms:.1} ms; target serving {serving_ms:.1} ms and \
             complete (seen) {total_ms:.1} ms after TIERMEM.MIGRATE; heap {} MiB",
            a.from,
            heap >> 20
        );
        for (k, v) in &fields {
            println!("  {k}: {v}");
        }
    }
    Ok(())
}
