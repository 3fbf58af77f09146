//! The `TIERMEM_PREFAULT_*` environment variables: their names, their syntax and their reading
//! into one [`Config`] (read once, in the library's constructor). A malformed value is an
//! error naming the variable; the caller prints it and runs the program plain.

use std::time::Duration;
use tiermem_prefault::{Options, Order, Policy, Populate, Thp, MAX_CHUNK, MAX_ENTRIES};

/// `TIERMEM_PREFAULT_DISABLE`: `1` runs the program plain (no warning).
pub const DISABLE: &str = "TIERMEM_PREFAULT_DISABLE";
/// `TIERMEM_PREFAULT_BUDGET`: bytes populated ahead and not yet used, at most (k/m/g).
pub const BUDGET: &str = "TIERMEM_PREFAULT_BUDGET";
/// `TIERMEM_PREFAULT_MIN`: the smallest mapping or allocation registered (bytes, k/m/g).
pub const MIN: &str = "TIERMEM_PREFAULT_MIN";
/// `TIERMEM_PREFAULT_CHUNK`: pages per window entry, 1..=64.
pub const CHUNK: &str = "TIERMEM_PREFAULT_CHUNK";
/// `TIERMEM_PREFAULT_ENTRIES`: window entries per region, 1..=64.
pub const ENTRIES: &str = "TIERMEM_PREFAULT_ENTRIES";
/// `TIERMEM_PREFAULT_ORDER`: auto|ascending|descending|stride|whole.
pub const ORDER: &str = "TIERMEM_PREFAULT_ORDER";
/// `TIERMEM_PREFAULT_POPULATE`: auto|write|read.
pub const POPULATE: &str = "TIERMEM_PREFAULT_POPULATE";
/// `TIERMEM_PREFAULT_THP`: auto|on|off.
pub const THP: &str = "TIERMEM_PREFAULT_THP";
/// `TIERMEM_PREFAULT_INTERVAL_US`: microseconds between the service's passes while idle.
pub const INTERVAL_US: &str = "TIERMEM_PREFAULT_INTERVAL_US";
/// `TIERMEM_PREFAULT_HEAP`: 1 follows `[heap]` (the default), 0 does not.
pub const HEAP: &str = "TIERMEM_PREFAULT_HEAP";
/// `TIERMEM_PREFAULT_STATS`: a file the figures are written to at exit (`%p`: the pid).
pub const STATS: &str = "TIERMEM_PREFAULT_STATS";
/// `TIERMEM_PREFAULT_STATS_PID`: the process that writes the stats file (`tiermem prefault run`
/// sets its own pid, which the command keeps across `exec`); default: every process that
/// loads the library writes it.
pub const STATS_PID: &str = "TIERMEM_PREFAULT_STATS_PID";
/// `TIERMEM_PREFAULT_CHILD`: plain|restart — what a forked child does.
pub const CHILD: &str = "TIERMEM_PREFAULT_CHILD";
/// `TIERMEM_PREFAULT_SCHED_IDLE`: 1 runs the service thread SCHED_IDLE (the default), 0 at
/// normal priority (it then competes with the program for a core).
pub const SCHED_IDLE: &str = "TIERMEM_PREFAULT_SCHED_IDLE";

/// Default of `TIERMEM_PREFAULT_MIN`: 256 KiB (jemalloc's extents, glibc's mmapped chunks).
pub const DEFAULT_MIN: usize = 256 << 10;
/// Registrations larger than this are left alone (sparse reservations: the service keeps two
/// bitmaps per region, one bit per page each).
pub const MAX_REGION: usize = 64 << 30;

/// Everything the library was asked to do.
#[derive(Debug, Clone)]
pub struct Config {
    /// The service's options (budget, interval).
    pub opts: Options,
    /// The policy from the variables (chunk, entries, order, populate, THP).
    pub policy: Policy,
    /// Smallest registration, bytes (at least one page).
    pub min: usize,
    /// Follow `[heap]`.
    pub heap: bool,
    /// Where to write the figures at exit.
    pub stats: Option<String>,
    /// The process that writes them (`None`: the one the library is loaded in).
    pub stats_pid: Option<i32>,
    /// A forked child starts its own service (else it runs plain).
    pub child_restart: bool,
}

impl Config {
    /// The policy for memory an allocator hands out from its start (a malloc block, the heap's
    /// growth, a small mapping): ascending unless an order was asked for.
    pub fn sequential(&self) -> Policy {
        let mut p = self.policy;
        if p.order == Order::Auto {
            p.order = Order::Ascending;
        }
        p
    }

    /// The policy for a mapping of `len` bytes: the asked order; under `auto`, mappings below
    /// 4 MiB are filled ascending (a learned order would start 2 MiB past the first touches,
    /// past their end).
    pub fn for_mapping(&self, len: usize) -> Policy {
        if len < 4 << 20 {
            self.sequential()
        } else {
            self.policy
        }
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

fn bad(name: &str, v: &str, what: &str) -> String {
    format!("{name}={v:?} is not {what}")
}

/// Parses `123`, `64k`, `256M`, `1g`, `2GiB` (binary units).
pub fn parse_size(v: &str) -> Option<u64> {
    let t = v.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

fn size(name: &str) -> Result<Option<u64>, String> {
    match var(name) {
        None => Ok(None),
        Some(v) => parse_size(&v)
            .map(Some)
            .ok_or_else(|| bad(name, &v, "a size (bytes, optionally with k, m or g)")),
    }
}

fn number(name: &str, lo: u64, hi: u64) -> Result<Option<u64>, String> {
    match var(name) {
        None => Ok(None),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
            _ => Err(bad(name, &v, &format!("a number in {lo}..={hi}"))),
        },
    }
}

fn flag(name: &str) -> Result<Option<bool>, String> {
    match var(name) {
        None => Ok(None),
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "1" | "yes" | "true" | "on" => Ok(Some(true)),
            "0" | "no" | "false" | "off" | "" => Ok(Some(false)),
            _ => Err(bad(name, &v, "1 or 0")),
        },
    }
}

fn choice<T: Copy>(name: &str, options: &[(&str, T)]) -> Result<Option<T>, String> {
    let Some(v) = var(name) else { return Ok(None) };
    let key = v.trim().to_ascii_lowercase();
    if let Some((_, t)) = options.iter().find(|(k, _)| *k == key) {
        return Ok(Some(*t));
    }
    let names: Vec<&str> = options.iter().map(|(k, _)| *k).collect();
    Err(bad(name, &v, &format!("one of {}", names.join(", "))))
}

/// Reads the variables. `Ok(None)`: `TIERMEM_PREFAULT_DISABLE` asks for a plain run. `Err`:
/// one line naming the malformed variable and what it should be.
pub fn from_env() -> Result<Option<Config>, String> {
    if flag(DISABLE)?.unwrap_or(false) {
        return Ok(None);
    }
    let mut opts = Options::default();
    if let Some(b) = size(BUDGET)? {
        if b < 4096 {
            return Err(bad(
                BUDGET,
                &b.to_string(),
                "at least one page (4096 bytes)",
            ));
        }
        opts.budget_bytes = usize::try_from(b).unwrap_or(usize::MAX);
    }
    if let Some(us) = number(INTERVAL_US, 1, 10_000_000)? {
        opts.interval = Duration::from_micros(us);
        opts.min_interval = opts.min_interval.min(opts.interval);
    }
    if let Some(idle) = flag(SCHED_IDLE)? {
        opts.sched_idle = idle;
    }
    let mut policy = Policy::default();
    if let Some(c) = number(CHUNK, 1, MAX_CHUNK as u64)? {
        policy.chunk = c as u32;
    }
    if let Some(e) = number(ENTRIES, 1, MAX_ENTRIES as u64)? {
        policy.entries = e as u32;
    }
    if let Some(o) = choice(
        ORDER,
        &[
            ("auto", Order::Auto),
            ("ascending", Order::Ascending),
            ("descending", Order::Descending),
            ("stride", Order::Stride),
            ("whole", Order::Whole),
        ],
    )? {
        policy.order = o;
    }
    if let Some(p) = choice(
        POPULATE,
        &[
            ("auto", Populate::Auto),
            ("write", Populate::Write),
            ("read", Populate::Read),
        ],
    )? {
        policy.populate = p;
    }
    if let Some(t) = choice(
        THP,
        &[("auto", Thp::Auto), ("on", Thp::On), ("off", Thp::Off)],
    )? {
        policy.thp = t;
    }
    policy
        .validate()
        .map_err(|e| format!("TIERMEM_PREFAULT_*: {e}"))?;
    let min = match size(MIN)? {
        Some(m) => usize::try_from(m).unwrap_or(usize::MAX).max(4096),
        None => DEFAULT_MIN,
    };
    let heap = flag(HEAP)?.unwrap_or(true);
    let stats = var(STATS).filter(|s| !s.is_empty());
    let stats_pid = number(STATS_PID, 1, i32::MAX as u64)?.map(|p| p as i32);
    let child_restart = choice(CHILD, &[("plain", false), ("restart", true)])?.unwrap_or(false);
    Ok(Some(Config {
        opts,
        policy,
        min,
        heap,
        stats,
        stats_pid,
        child_restart,
    }))
}
