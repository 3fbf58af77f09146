//! The live tiermem-kv case of `tiermem bench migrate`: a `volatile` tiermem-kv server in the
//! source namespace under a YCSB-A-like load (50 % GET, 50 % SET of 100-byte values over a
//! preloaded key space, several client connections), migrated to the target namespace with
//! `TIERMEM.MIGRATE` by FAM-aware or socket post-copy; the clients reconnect to the target and
//! go on. As in the paper's Fig. 8 (YCSB running a fixed number of operations right after the
//! migration starts), the throughput *during migration* is that of the first `ops_after`
//! operations acknowledged after the freeze, measured from the freeze; degradation is it over
//! the steady throughput before. CPU (`cpu_s`): the servers', each a process of its own — the
//! source's from the freeze to its exit, the target's from its start to the `ops_after`-th
//! operation after the freeze; the load clients (this process) are the same for every method
//! and not counted.

use anyhow::{bail, Context, Result};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiermem_kv::client::{Client, Reply};
use tiermem_migrate::harness::Method;
use tiermem_migrate::netns::{Host, TwoHosts};

const SRC_PORT: u16 = 7400;
const DST_PORT: u16 = 7401;
const PAGE_SERVER_PORT: u16 = 7402;
const VALUE_LEN: usize = 100;

/// What one kv migration measured.
#[derive(Clone, Debug, Default)]
pub struct KvResult {
    pub downtime_ms: f64,
    pub busy_ms: f64,
    pub total_ms: f64,
    pub steady_ops_per_s: f64,
    /// Throughput of the first `ops_after` operations after the freeze (from the freeze).
    pub after_ops_per_s: f64,
    pub degradation: f64,
    /// CPU seconds (user + system, all threads) of the source server from the freeze to its
    /// exit plus the target server's from its start to the `ops_after`-th operation after the
    /// freeze.
    pub cpu_s: f64,
    /// (ms since the freeze, ops/s) in 10 ms buckets.
    pub timeline: Vec<(f64, f64)>,
}

fn connect_in(hosts: &TwoHosts, host: Host, addr: SocketAddr) -> Result<Client> {
    hosts
        .run_in(host, || {
            TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_context(|| format!("connecting to {addr}"))
        .and_then(|s| Client::new(s, Some(Duration::from_secs(10))).context("client socket"))
}

fn wait_ping(hosts: &TwoHosts, host: Host, addr: SocketAddr, child: &mut Child) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut c) = connect_in(hosts, host, addr) {
            if matches!(c.command::<&[u8]>(&[b"PING"]), Ok(Reply::Simple(_))) {
                return Ok(());
            }
        }
        if let Some(st) = child.try_wait()? {
            bail!("the tiermem-kv server at {addr} exited ({st}) before answering PING");
        }
        if Instant::now() > deadline {
            bail!("the tiermem-kv server at {addr} did not answer PING within 20 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn key(i: u64) -> Vec<u8> {
    format!("user{i:010}").into_bytes()
}

/// A server process that is killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Run one kv migration by `method` (`fam/pcm-fam`, `socket/<delay>/<ms>`): a `heap` heap
/// preloaded with `keys` keys, `clients` connections, `steady` before the migration, and the
/// throughput of the first `ops_after` operations after the freeze.
#[allow(clippy::too_many_arguments)]
pub fn run_kv_case(
    hosts: &TwoHosts,
    fam: &Path,
    method: &Method,
    heap: &str,
    keys: u64,
    clients: usize,
    steady: Duration,
    ops_after: u64,
    id: u64,
) -> Result<KvResult> {
    let exe = std::env::current_exe().context("locating the tiermem binary")?;
    let src_addr = SocketAddr::from((hosts.src_addr(), SRC_PORT));
    let dst_addr = SocketAddr::from((hosts.dst_addr(), DST_PORT));
    let fam_delay = match method {
        Method::Fam { delay } => delay.clone(),
        _ => "none".into(),
    };
    let log_dir = fam.join(format!("kv-logs-{id:x}"));
    std::fs::create_dir_all(&log_dir)?;
    let log =
        |name: &str| -> Result<Stdio> { Ok(std::fs::File::create(log_dir.join(name))?.into()) };
    let mut src = Server(
        hosts
            .command(Host::Src, exe.to_str().context("tiermem path")?)
            .args(["kv", "serve", "--engine", "volatile", "--heap-size", heap])
            // Reached from the other namespace, with no password: protected mode off.
            .args(["--protected-mode", "no"])
            .args([
                "--port",
                &SRC_PORT.to_string(),
                "--bind",
                &hosts.src_addr().to_string(),
            ])
            .args(["--dir", &log_dir.join("src").display().to_string()])
            .env("TIERMEM_DELAY", &fam_delay)
            .stdout(log("src.log")?)
            .stderr(log("src.err")?)
            .spawn()
            .context("starting the source tiermem-kv server")?,
    );
    wait_ping(hosts, Host::Src, src_addr, &mut src.0)?;
    // Preload the key space (pipelined).
    let mut c = connect_in(hosts, Host::Src, src_addr)?;
    let value = vec![b'v'; VALUE_LEN];
    let mut i = 0;
    while i < keys {
        let batch: Vec<Vec<Vec<u8>>> = (i..(i + 256).min(keys))
            .map(|k| vec![b"SET".to_vec(), key(k), value.clone()])
            .collect();
        c.pipeline(&batch).context("preloading the key space")?;
        i += 256;
    }
    drop(c);

    // Clients: YCSB-A-like until stopped; on a closed connection they reconnect to the target.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let after: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(Vec::new()));
    let t0_ns = Arc::new(AtomicU64::new(u64::MAX));
    let after_count = Arc::new(AtomicU64::new(0));
    let first_at_target = Arc::new(AtomicU64::new(u64::MAX));
    let epoch = Instant::now();
    let now_ns = move || epoch.elapsed().as_nanos() as u64;
    let mut handles = Vec::new();
    for t in 0..clients {
        let (stop, acked, after, t0_ns, first, after_count) = (
            stop.clone(),
            acked.clone(),
            after.clone(),
            t0_ns.clone(),
            first_at_target.clone(),
            after_count.clone(),
        );
        let src_c = connect_in(hosts, Host::Src, src_addr)?;
        let dst_ns = hosts.name(Host::Dst).to_string();
        handles.push(std::thread::spawn(move || -> Result<()> {
            let mut c = Some(src_c);
            let mut at_target = false;
            let mut rng = (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let value = vec![b'w'; VALUE_LEN];
            let mut local_after = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let Some(cl) = c.as_mut() else {
                    // Reconnect to the target (inside its namespace), retrying while it starts.
                    match tiermem_migrate::netns::run_in_named(&dst_ns, || {
                        TcpStream::connect_timeout(&dst_addr, Duration::from_millis(200))
                    }) {
                        Ok(Ok(s)) => {
                            c = Some(Client::new(s, Some(Duration::from_secs(10)))?);
                            at_target = true;
                        }
                        _ => std::thread::sleep(Duration::from_millis(1)),
                    }
                    continue;
                };
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let k = key(rng % keys);
                let r = if rng & (1 << 40) != 0 {
                    cl.command::<&[u8]>(&[b"GET", &k])
                } else {
                    cl.command::<&[u8]>(&[b"SET", &k, &value])
                };
                match r {
                    Ok(Reply::Simple(_) | Reply::Int(_) | Reply::Bulk(_)) => {
                        let n = now_ns();
                        acked.fetch_add(1, Ordering::Relaxed);
                        if n >= t0_ns.load(Ordering::Relaxed) {
                            local_after.push(n);
                            after_count.fetch_add(1, Ordering::Relaxed);
                            if at_target {
                                first.fetch_min(n, Ordering::Relaxed);
                            }
                        }
                    }
                    // Refused while frozen, or the connection closed: go to the target.
                    Ok(_) | Err(_) => {
                        c = None;
                        if !at_target {
                            continue;
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
            after.lock().expect("after").extend(local_after);
            Ok(())
        }));
    }
    std::thread::sleep(Duration::from_millis(100));
    let s0 = acked.load(Ordering::Relaxed);
    let ts = Instant::now();
    std::thread::sleep(steady);
    let steady_ops_per_s = (acked.load(Ordering::Relaxed) - s0) as f64 / ts.elapsed().as_secs_f64();

    // Migrate.
    let mut ctl = connect_in(hosts, Host::Src, src_addr)?;
    let listen = format!("{}:{PAGE_SERVER_PORT}", hosts.src_addr());
    let idhex = format!("{id:x}");
    let fam_s = fam.display().to_string();
    let mut args: Vec<&[u8]> = vec![
        b"TIERMEM.MIGRATE",
        fam_s.as_bytes(),
        listen.as_bytes(),
        idhex.as_bytes(),
    ];
    let (exp_s, net_delay);
    match method {
        Method::Fam { .. } => args.push(b"fam"),
        Method::Socket {
            delay,
            expiration_ms,
        } => {
            exp_s = expiration_ms.to_string();
            net_delay = if delay == "veth" {
                "none".to_string()
            } else {
                delay.clone()
            };
            args.push(b"socket");
            args.push(exp_s.as_bytes());
            args.push(net_delay.as_bytes());
        }
        other => bail!(
            "the kv case migrates by fam or socket, not {}",
            other.name()
        ),
    }
    // The server reserves the FAM files while it still serves, replies, then freezes: the
    // migration starts at the reply.
    let reply = ctl.command::<&[u8]>(&args).context("TIERMEM.MIGRATE")?;
    let t0 = now_ns();
    t0_ns.store(t0, Ordering::Relaxed);
    // The source's CPU so far, and what the reaped children used so far: the source's total
    // is read from the latter once it exited (and was reaped), when /proc/PID is gone.
    let src_cpu0 = crate::cpu::process_cpu_s(src.0.id());
    let reaped0 = crate::cpu::reaped_children_s();
    let mut src_cpu = None;
    let (Reply::Simple(_) | Reply::Int(_)) = reply else {
        bail!("TIERMEM.MIGRATE answered {reply:?}");
    };
    let mut set = vec![
        format!("restore-from={}", fam.display()),
        format!("migration-id={idhex}"),
        format!("migration-source={listen}"),
    ];
    if let Method::Socket { .. } = method {
        set.push("migration-method=socket".into());
    }
    let mut cmd: Command = hosts.command(Host::Dst, exe.to_str().context("tiermem path")?);
    cmd.args(["kv", "serve", "--engine", "volatile", "--heap-size", heap])
        .args(["--protected-mode", "no"])
        .args([
            "--port",
            &DST_PORT.to_string(),
            "--bind",
            &hosts.dst_addr().to_string(),
        ])
        .args(["--dir", &log_dir.join("dst").display().to_string()])
        .env("TIERMEM_DELAY", &fam_delay)
        .stdout(log("dst.log")?)
        .stderr(log("dst.err")?);
    for s in &set {
        cmd.args(["--set", s]);
    }
    let mut dst = Server(
        cmd.spawn()
            .context("starting the target tiermem-kv server")?,
    );
    // Busy time: the source exits by itself when its last duty is done.
    let mut busy_end = None;
    let mut complete_end = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut info: Option<Client> = None;
    while busy_end.is_none() || complete_end.is_none() {
        if Instant::now() > deadline {
            bail!(
                "the kv migration did not finish within 120 s (logs in {})",
                log_dir.display()
            );
        }
        if busy_end.is_none() && src.0.try_wait()?.is_some() {
            busy_end = Some(now_ns());
            src_cpu = src_cpu0.map(|c0| (crate::cpu::reaped_children_s() - reaped0 - c0).max(0.0));
        }
        if complete_end.is_none() {
            if let Some(st) = dst.0.try_wait()? {
                bail!(
                    "the target server exited ({st}) during the migration; see {}",
                    log_dir.join("dst.err").display()
                );
            }
            if info.is_none() {
                info = hosts
                    .run_in(Host::Dst, || {
                        TcpStream::connect_timeout(&dst_addr, Duration::from_millis(200))
                    })
                    .ok()
                    .and_then(|r| r.ok())
                    .and_then(|s| Client::new(s, Some(Duration::from_secs(10))).ok());
            }
            if let Some(ic) = info.as_mut() {
                match ic.command::<&[u8]>(&[b"INFO", b"migration"]) {
                    Ok(Reply::Bulk(Some(b))) => {
                        let text = String::from_utf8_lossy(&b);
                        if text.contains("migration_state:complete") {
                            complete_end = Some(now_ns());
                        } else if text.contains("migration_state:failed") {
                            bail!("the target reports the migration failed:\n{text}");
                        }
                    }
                    _ => info = None,
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // The fixed amount of work after the freeze: ops_after acknowledged operations.
    let work_deadline = Instant::now() + Duration::from_secs(60);
    while after_count.load(Ordering::Relaxed) < ops_after && Instant::now() < work_deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let dst_cpu = crate::cpu::process_cpu_s(dst.0.id());
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("a client panicked"))??;
    }
    let mut times = std::mem::take(&mut *after.lock().expect("after"));
    times.sort_unstable();
    if (times.len() as u64) < ops_after {
        bail!(
            "only {} operations were acknowledged after the freeze within 60 s",
            times.len()
        );
    }
    let t_n = times[ops_after as usize - 1];
    let after_ops_per_s = ops_after as f64 / ((t_n - t0) as f64 / 1e9);
    let first = first_at_target.load(Ordering::Relaxed);
    let ms = |t: u64| t.saturating_sub(t0) as f64 / 1e6;
    let mut timeline = Vec::new();
    let bucket = 10_000_000u64;
    let mut j = 0;
    let mut b = t0;
    while b < t_n {
        let mut n = 0;
        while j < times.len() && times[j] < b + bucket {
            n += 1;
            j += 1;
        }
        timeline.push((ms(b + bucket), n as f64 / (bucket as f64 / 1e9)));
        b += bucket;
    }
    drop(dst);
    drop(src);
    if std::env::var_os("TIERMEM_BENCH_KEEP_LOGS").is_some() {
        crate::progress::note(&format!("kv logs kept in {}", log_dir.display()));
    } else {
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    Ok(KvResult {
        downtime_ms: ms(first),
        busy_ms: ms(busy_end.unwrap_or(t0)),
        total_ms: ms(complete_end.unwrap_or(t0)),
        steady_ops_per_s,
        after_ops_per_s,
        degradation: after_ops_per_s / steady_ops_per_s.max(1.0),
        cpu_s: match (src_cpu, dst_cpu) {
            (Some(a), Some(b)) => a + b,
            _ => f64::NAN,
        },
        timeline,
    })
}
