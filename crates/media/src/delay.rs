//! The device delay model (`delay = latency + bytes / bandwidth`) and the waits that inject it.
//!
//! A [`DelayModel`] is a property of a device: every access through a pool or SSD device is
//! charged `latency + bytes / bandwidth` nanoseconds, separately for reads and writes, by
//! [`delay_ns`]: a spin on the TSC for short waits ([`busy_wait_ns`]), and for long ones a sleep
//! that ends a calibrated margin before the deadline followed by a spin for the rest, so that a
//! modelled device does not burn a core the application needs (on 2 cores a spinning waiter is a
//! second application thread). The default model is [`DelayModel::NONE`] (no delay), for
//! functional use; experiments set a preset or an explicit model, in code or through the
//! `TIERMEM_DELAY` environment variable.

use crate::error::{MediaError, Result};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Environment variable read by [`DelayModel::from_env`].
pub const DELAY_ENV: &str = "TIERMEM_DELAY";

/// Per-device added latency and bandwidth limit, separately for reads and writes.
///
/// A bandwidth of 0 means unlimited (no per-byte cost). GB is 10^9 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DelayModel {
    /// Fixed cost added to every read, in nanoseconds.
    pub read_latency_ns: u64,
    /// Fixed cost added to every write, in nanoseconds.
    pub write_latency_ns: u64,
    /// Read bandwidth in bytes per second; 0 = unlimited.
    pub read_bytes_per_sec: u64,
    /// Write bandwidth in bytes per second; 0 = unlimited.
    pub write_bytes_per_sec: u64,
}

/// Names accepted by [`DelayModel::preset`], in display order.
pub const PRESETS: [&str; 4] = ["none", "pcm-fam", "nvmm", "ethernet-10g"];

impl DelayModel {
    /// No added delay (the default).
    pub const NONE: DelayModel = DelayModel {
        read_latency_ns: 0,
        write_latency_ns: 0,
        read_bytes_per_sec: 0,
        write_bytes_per_sec: 0,
    };
    /// Phase-change memory behind a fabric: 1 µs read and write latency, 2 GB/s both ways.
    pub const PCM_FAM: DelayModel = DelayModel {
        read_latency_ns: 1_000,
        write_latency_ns: 1_000,
        read_bytes_per_sec: 2_000_000_000,
        write_bytes_per_sec: 2_000_000_000,
    };
    /// Byte-addressable NVM on the memory bus: 100 ns read, 150 ns write, 35 GB/s read, 10 GB/s
    /// write.
    pub const NVMM: DelayModel = DelayModel {
        read_latency_ns: 100,
        write_latency_ns: 150,
        read_bytes_per_sec: 35_000_000_000,
        write_bytes_per_sec: 10_000_000_000,
    };
    /// A 10 Gbit/s link: no added latency, 1.25 GB/s both ways.
    pub const ETHERNET_10G: DelayModel = DelayModel {
        read_latency_ns: 0,
        write_latency_ns: 0,
        read_bytes_per_sec: 1_250_000_000,
        write_bytes_per_sec: 1_250_000_000,
    };

    /// The named preset (`none` — alias `off` —, `pcm-fam`, `nvmm`, `ethernet-10g`;
    /// case-insensitive), or `None` for an unknown name.
    pub fn preset(name: &str) -> Option<DelayModel> {
        match name.trim().to_ascii_lowercase().as_str() {
            "none" | "off" => Some(Self::NONE),
            "pcm-fam" => Some(Self::PCM_FAM),
            "nvmm" => Some(Self::NVMM),
            "ethernet-10g" => Some(Self::ETHERNET_10G),
            _ => None,
        }
    }

    /// The preset name this model equals, if any.
    pub fn preset_name(&self) -> Option<&'static str> {
        PRESETS
            .iter()
            .copied()
            .find(|n| Self::preset(n) == Some(*self))
    }

    /// The model in `TIERMEM_DELAY` (a preset name or an explicit list), or [`DelayModel::NONE`]
    /// when the variable is unset or empty. An unparsable value is an error, never ignored.
    pub fn from_env() -> Result<DelayModel> {
        match std::env::var(DELAY_ENV) {
            Ok(v) if !v.trim().is_empty() => v.parse(),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(Self::NONE),
            Err(std::env::VarError::NotUnicode(v)) => Err(MediaError::InvalidDelayModel {
                input: v.to_string_lossy().into_owned(),
                reason: format!("{DELAY_ENV} is not valid UTF-8"),
            }),
        }
    }

    /// True when the model adds no delay at all.
    pub fn is_none(&self) -> bool {
        *self == Self::NONE
    }

    /// Nanoseconds charged for reading `bytes` bytes: `read_latency + bytes / read_bandwidth`
    /// (rounded to the nearest ns, saturating).
    pub fn read_delay_ns(&self, bytes: u64) -> u64 {
        cost(self.read_latency_ns, self.read_bytes_per_sec, bytes)
    }

    /// Nanoseconds charged for writing `bytes` bytes: `write_latency + bytes / write_bandwidth`
    /// (rounded to the nearest ns, saturating).
    pub fn write_delay_ns(&self, bytes: u64) -> u64 {
        cost(self.write_latency_ns, self.write_bytes_per_sec, bytes)
    }
}

fn cost(latency: u64, bw: u64, bytes: u64) -> u64 {
    let transfer = if bw == 0 {
        0
    } else if bytes <= (u64::MAX - bw) / 1_000_000_000 {
        // Fast path (64-bit division) for every transfer below ~18 GB.
        (bytes * 1_000_000_000 + bw / 2) / bw
    } else {
        ((bytes as u128 * 1_000_000_000 + bw as u128 / 2) / bw as u128).min(u64::MAX as u128) as u64
    };
    latency.saturating_add(transfer)
}

fn fmt_latency(ns: u64) -> String {
    if ns == 0 {
        "0ns".into()
    } else if ns % 1_000_000 == 0 {
        format!("{}ms", ns / 1_000_000)
    } else if ns % 1_000 == 0 {
        format!("{}us", ns / 1_000)
    } else {
        format!("{ns}ns")
    }
}

fn fmt_bandwidth(bps: u64) -> String {
    if bps == 0 {
        return "inf".into();
    }
    for (mult, unit) in [
        (1_000_000_000u64, "GB/s"),
        (1 << 30, "GiB/s"),
        (1_000_000, "MB/s"),
        (1 << 20, "MiB/s"),
        (1_000, "KB/s"),
        (1 << 10, "KiB/s"),
    ] {
        if bps % mult == 0 {
            return format!("{}{unit}", bps / mult);
        }
    }
    format!("{bps}B/s")
}

impl fmt::Display for DelayModel {
    /// A preset name when the model equals one, else `read=..,write=..,bw=..` (or `rbw=..,wbw=..`
    /// when the bandwidths differ). The output parses back to the same model.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(name) = self.preset_name() {
            return f.write_str(name);
        }
        write!(
            f,
            "read={},write={}",
            fmt_latency(self.read_latency_ns),
            fmt_latency(self.write_latency_ns)
        )?;
        if self.read_bytes_per_sec == self.write_bytes_per_sec {
            write!(f, ",bw={}", fmt_bandwidth(self.read_bytes_per_sec))
        } else {
            write!(
                f,
                ",rbw={},wbw={}",
                fmt_bandwidth(self.read_bytes_per_sec),
                fmt_bandwidth(self.write_bytes_per_sec)
            )
        }
    }
}

/// Parse an unsigned decimal with optional fraction ("1.25") times `mult`, exactly (truncating
/// below 1 unit). Errors on overflow or syntax.
fn scaled_decimal(num: &str, mult: u64) -> std::result::Result<u64, String> {
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || frac.len() > 18
    {
        return Err(format!("{num:?} is not a non-negative decimal number"));
    }
    let int_v: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| format!("{num:?} is too large"))?
    };
    let frac_v: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse()
            .map_err(|_| format!("bad fraction in {num:?}"))?
    };
    let scale = 10u128.pow(frac.len() as u32);
    let v = int_v
        .checked_mul(mult as u128)
        .and_then(|a| a.checked_add(frac_v * mult as u128 / scale))
        .filter(|v| *v <= u64::MAX as u128)
        .ok_or_else(|| format!("{num:?} overflows 64 bits"))?;
    Ok(v as u64)
}

fn split_unit(s: &str) -> (&str, &str) {
    let i = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    (&s[..i], s[i..].trim())
}

fn parse_latency(v: &str) -> std::result::Result<u64, String> {
    let (num, unit) = split_unit(v);
    let mult = match unit {
        "" | "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown latency unit {other:?} (use ns, us, ms or s)"
            ))
        }
    };
    scaled_decimal(num, mult)
}

fn parse_bandwidth(v: &str) -> std::result::Result<u64, String> {
    if v.eq_ignore_ascii_case("inf") || v.eq_ignore_ascii_case("unlimited") {
        return Ok(0);
    }
    let (num, unit) = split_unit(v);
    let mult: u64 = match unit {
        "" | "B/s" => 1,
        "KB/s" | "kB/s" => 1_000,
        "MB/s" => 1_000_000,
        "GB/s" => 1_000_000_000,
        "KiB/s" => 1 << 10,
        "MiB/s" => 1 << 20,
        "GiB/s" => 1 << 30,
        other => {
            return Err(format!(
                "unknown bandwidth unit {other:?} (use B/s, KB/s, MB/s, GB/s, KiB/s, MiB/s, GiB/s)"
            ))
        }
    };
    scaled_decimal(num, mult)
}

impl FromStr for DelayModel {
    type Err = MediaError;

    /// A preset name, or a comma-separated list of `key=value` with keys `read`, `write`, `lat`
    /// (both latencies), `bw` (both bandwidths), `rbw`, `wbw`. Unspecified fields are 0 (no
    /// latency / unlimited bandwidth). Later keys override earlier ones.
    fn from_str(s: &str) -> Result<DelayModel> {
        let input = s.trim();
        if let Some(m) = DelayModel::preset(input) {
            return Ok(m);
        }
        let err = |reason: String| MediaError::InvalidDelayModel {
            input: s.to_string(),
            reason,
        };
        if input.is_empty() {
            return Err(err("empty string".into()));
        }
        let mut m = DelayModel::NONE;
        for part in input.split(',') {
            let part = part.trim();
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| err(format!("{part:?} is neither a preset nor key=value")))?;
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            match k.as_str() {
                "read" => m.read_latency_ns = parse_latency(v).map_err(err)?,
                "write" => m.write_latency_ns = parse_latency(v).map_err(err)?,
                "lat" | "latency" => {
                    let l = parse_latency(v).map_err(err)?;
                    m.read_latency_ns = l;
                    m.write_latency_ns = l;
                }
                "bw" => {
                    let b = parse_bandwidth(v).map_err(err)?;
                    m.read_bytes_per_sec = b;
                    m.write_bytes_per_sec = b;
                }
                "rbw" => m.read_bytes_per_sec = parse_bandwidth(v).map_err(err)?,
                "wbw" => m.write_bytes_per_sec = parse_bandwidth(v).map_err(err)?,
                other => {
                    return Err(err(format!(
                        "unknown key {other:?} (use read, write, lat, bw, rbw, wbw)"
                    )))
                }
            }
        }
        Ok(m)
    }
}

/// A [`DelayModel`] that can be replaced while other threads read it (four relaxed atomics; a
/// reader racing with a writer may see a mix of old and new fields for one access).
#[derive(Debug, Default)]
pub(crate) struct DelayCell {
    f: [AtomicU64; 4],
}

impl DelayCell {
    pub(crate) fn new(m: DelayModel) -> Self {
        let c = DelayCell::default();
        c.set(m);
        c
    }
    pub(crate) fn set(&self, m: DelayModel) {
        self.f[0].store(m.read_latency_ns, Ordering::Relaxed);
        self.f[1].store(m.write_latency_ns, Ordering::Relaxed);
        self.f[2].store(m.read_bytes_per_sec, Ordering::Relaxed);
        self.f[3].store(m.write_bytes_per_sec, Ordering::Relaxed);
    }
    pub(crate) fn get(&self) -> DelayModel {
        DelayModel {
            read_latency_ns: self.f[0].load(Ordering::Relaxed),
            write_latency_ns: self.f[1].load(Ordering::Relaxed),
            read_bytes_per_sec: self.f[2].load(Ordering::Relaxed),
            write_bytes_per_sec: self.f[3].load(Ordering::Relaxed),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// TSC clock and busy-wait.

struct TscCal {
    /// Nanoseconds per TSC cycle in 32.32 fixed point.
    ns_per_cycle_q32: u64,
    /// TSC cycles per nanosecond in 32.32 fixed point.
    cycles_per_ns_q32: u64,
    ghz: f64,
    base_tsc: u64,
    base_ns: u64,
    usable: bool,
    /// Cycles by which a spin overshoots its deadline (median, measured at calibration); each
    /// wait ends this much earlier so that the injected delay matches the model on average.
    overshoot_cycles: u64,
}

static CAL: OnceLock<TscCal> = OnceLock::new();

#[inline]
fn rdtsc() -> u64 {
    // SAFETY: RDTSC is available on every x86-64 CPU and has no memory effects.
    unsafe { std::arch::x86_64::_rdtsc() }
}

fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The reading of clock `id` (`clock_gettime`) in nanoseconds; 0 if the clock does not exist.
pub(crate) fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; an unknown clock is an error return.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One (tsc, monotonic ns) pair, taking the tightest of a few tries.
fn paired_sample() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..5 {
        let a = rdtsc();
        let ns = monotonic_ns();
        let b = rdtsc();
        if b - a < best.0 {
            best = (b - a, a + (b - a) / 2, ns);
        }
    }
    (best.1, best.2)
}

/// Calibration window against CLOCK_MONOTONIC.
const CAL_WINDOW_NS: u64 = 20_000_000;

fn calibration() -> &'static TscCal {
    CAL.get_or_init(|| {
        let (t0, n0) = paired_sample();
        while monotonic_ns() - n0 < CAL_WINDOW_NS {
            std::hint::spin_loop();
        }
        let (t1, n1) = paired_sample();
        let cycles = t1.saturating_sub(t0);
        let ns = n1 - n0;
        let usable = crate::persist::cpu_has_tsc_invariant() && cycles > 0;
        let ghz = if cycles > 0 {
            cycles as f64 / ns as f64
        } else {
            1.0
        };
        // Overshoot of the spin loop itself: time spin_until(start + 2000) from just before
        // `start` to just after the loop exits, 101 times, and keep the median excess.
        let mut excess: Vec<u64> = (0..101)
            .map(|_| {
                let t0 = rdtsc();
                spin_until(t0 + 2_000);
                rdtsc().saturating_sub(t0 + 2_000)
            })
            .collect();
        excess.sort_unstable();
        TscCal {
            overshoot_cycles: excess[excess.len() / 2],
            ns_per_cycle_q32: ((ns as u128) << 32)
                .checked_div(cycles.max(1) as u128)
                .unwrap_or(0) as u64,
            cycles_per_ns_q32: (((cycles as u128) << 32) / ns as u128) as u64,
            ghz,
            base_tsc: t1,
            base_ns: n1,
            usable,
        }
    })
}

/// The TSC frequency in GHz, calibrated once (lazily, ~20 ms) against CLOCK_MONOTONIC.
pub fn tsc_ghz() -> f64 {
    calibration().ghz
}

/// A cheap monotonic clock in nanoseconds (TSC-based when the TSC is invariant, otherwise
/// CLOCK_MONOTONIC). Comparable only with other values from this function in this process.
/// The first call of this, [`busy_wait_ns`] (with a non-zero wait) or [`tsc_ghz`] calibrates the
/// TSC (~20 ms).
#[inline]
pub fn now_ns() -> u64 {
    let c = calibration();
    if !c.usable {
        return monotonic_ns();
    }
    let d = rdtsc().wrapping_sub(c.base_tsc);
    if d > u64::MAX / 2 {
        // Read on a CPU whose TSC is slightly behind the calibration sample: clamp.
        return c.base_ns;
    }
    c.base_ns + ((d as u128 * c.ns_per_cycle_q32 as u128) >> 32) as u64
}

/// Spin for `ns` nanoseconds on the TSC (CLOCK_MONOTONIC when the TSC is not invariant). Never
/// sleeps, never yields: this is how device delays are injected. `ns == 0` returns at once.
#[inline]
pub fn busy_wait_ns(ns: u64) {
    if ns == 0 {
        return;
    }
    let c = calibration();
    if !c.usable {
        let end = monotonic_ns() + ns;
        while monotonic_ns() < end {
            std::hint::spin_loop();
        }
        return;
    }
    let start = rdtsc();
    let cycles = ((ns as u128 * c.cycles_per_ns_q32 as u128) >> 32) as u64;
    spin_until(start.saturating_add(cycles.saturating_sub(c.overshoot_cycles)));
}

/// Pace a transfer: wait ([`delay_ns`]) until `cost_ns` have passed since `since_ns` (a
/// [`now_ns`] stamp taken when the transfer started), so that the transfer takes the model's
/// time whatever part of it the real work (the DRAM copy standing in for the medium) already
/// took. Returns the nanoseconds waited (0 when the real work took longer than the model).
pub fn pace_ns(since_ns: u64, cost_ns: u64) -> u64 {
    let end = since_ns.saturating_add(cost_ns);
    let now = now_ns();
    if now >= end {
        return 0;
    }
    delay_ns(end - now);
    end - now
}

/// Pacing of a medium's bulk transfers in aggregate (the dump of a migration, a completion's
/// reads, a network push): the medium is busy until a clock; a transfer of `cost_ns` that
/// started at `since_ns` takes the slot `[max(clock, since_ns − slack), + cost_ns)` and its
/// caller sleeps until the slot ends — it never spins. A wake-up that comes late is made up by
/// the next transfer, whose slot may begin up to `slack` (the calibrated sleep margin) before
/// it started, and a wait shorter than the wake-up latency is not slept at all but carried in
/// the clock; so over any run of transfers the medium's bandwidth holds within one slack, and
/// the wait costs no CPU (per-transfer pacing, [`pace_ns`], spins its last ~100 µs: on two
/// cores that is a core the application needs). Transfers sharing one `Pacer` share the
/// medium: callers on several threads serialise their slots.
#[derive(Debug, Default)]
pub struct Pacer {
    busy_until: std::sync::atomic::AtomicU64,
}

impl Pacer {
    /// A medium idle since forever.
    pub const fn new() -> Pacer {
        Pacer {
            busy_until: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Charge a transfer of `cost_ns` (the model's time for it) that started at `since_ns` (a
    /// [`now_ns`] stamp, before its real work): sleep until its slot ends. Returns the ns
    /// slept or carried (0 when the real work already took the slot).
    pub fn pace(&self, since_ns: u64, cost_ns: u64) -> u64 {
        use std::sync::atomic::Ordering;
        if cost_ns == 0 {
            return 0;
        }
        let slack = sleep_margin_ns().min(1_000_000);
        let mut cur = self.busy_until.load(Ordering::Relaxed);
        let end = loop {
            let end = cur
                .max(since_ns.saturating_sub(slack))
                .saturating_add(cost_ns);
            match self.busy_until.compare_exchange_weak(
                cur,
                end,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break end,
                Err(now) => cur = now,
            }
        };
        let now = now_ns();
        if end <= now {
            return 0;
        }
        if sleep_margin_ns() >= u64::MAX / 8 {
            // TIERMEM_DELAY_SLEEP=0: spin, as every wait did before.
            delay_ns(end - now);
            return end - now;
        }
        // Shorter than a wake-up: carried in the clock (the next transfer waits for it).
        if end - now >= slack / 4 {
            std::thread::sleep(std::time::Duration::from_nanos(end - now));
        }
        end - now
    }
}

/// Environment variable: `0` makes [`delay_ns`] spin for every wait (no sleep), as before
/// 2026-11; anything else, or unset, lets it sleep through long waits.
pub const DELAY_SLEEP_ENV: &str = "TIERMEM_DELAY_SLEEP";

/// How early a sleep must end to leave the deadline to the spin, and the shortest wait worth
/// sleeping for, in ns: calibrated once (lazily, ~5 ms) from 15 sleeps of 200 µs, the
/// 90th-percentile overshoot plus 20 µs (a VM's timer and vCPU wake-up: 50–150 µs here).
/// `u64::MAX / 4` (never sleep) when [`DELAY_SLEEP_ENV`] is `0`.
fn sleep_margin_ns() -> u64 {
    static MARGIN: OnceLock<u64> = OnceLock::new();
    *MARGIN.get_or_init(|| {
        if std::env::var(DELAY_SLEEP_ENV).is_ok_and(|v| v.trim() == "0") {
            return u64::MAX / 4;
        }
        let mut over: Vec<u64> = (0..15)
            .map(|_| {
                let t0 = monotonic_ns();
                std::thread::sleep(std::time::Duration::from_micros(200));
                (monotonic_ns() - t0).saturating_sub(200_000)
            })
            .collect();
        over.sort_unstable();
        over[over.len() * 9 / 10] + 20_000
    })
}

/// Waits `ns` nanoseconds to inject a device delay: a TSC spin ([`busy_wait_ns`]) when the wait
/// is shorter than twice the sleep margin (calibrated once: how late this machine's sleeps
/// end, plus 20 µs), else a sleep to the deadline minus the margin and a spin for the rest. The
/// wait's length is the spin's (the sleep ends early); the CPU it burns is at most the margin.
pub fn delay_ns(ns: u64) {
    if ns == 0 {
        return;
    }
    let start = now_ns();
    let margin = sleep_margin_ns();
    if ns >= 2 * margin {
        std::thread::sleep(std::time::Duration::from_nanos(ns - margin));
    }
    let end = start + ns;
    let now = now_ns();
    if now < end {
        busy_wait_ns(end - now);
    }
}

/// The calibrated sleep margin of [`delay_ns`], ns (benchmarks report it).
pub fn delay_sleep_margin_ns() -> u64 {
    sleep_margin_ns()
}

/// Spin until the TSC reaches `end`. `pause` costs up to ~140 cycles on recent cores: use it
/// only while far from the deadline so that the overshoot stays within one RDTSC.
#[inline]
fn spin_until(end: u64) {
    loop {
        let now = rdtsc();
        if now >= end {
            break;
        }
        if end - now > 1024 {
            std::hint::spin_loop();
        }
    }
}

/// The calibrated overshoot of one busy-wait, in nanoseconds (already compensated for by
/// [`busy_wait_ns`]); reported by benchmarks.
pub fn busy_wait_overshoot_ns() -> f64 {
    let c = calibration();
    c.overshoot_cycles as f64 / c.ghz
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_have_the_documented_values() {
        assert_eq!(
            DelayModel::preset("pcm-fam").unwrap().read_delay_ns(0),
            1_000
        );
        // 2 MB at 2 GB/s = 1 ms, plus 1 µs.
        assert_eq!(DelayModel::PCM_FAM.write_delay_ns(2_000_000), 1_001_000);
        assert_eq!(DelayModel::NVMM.read_delay_ns(35_000), 1_100);
        assert_eq!(DelayModel::NVMM.write_delay_ns(10_000), 1_150);
        assert_eq!(DelayModel::ETHERNET_10G.read_delay_ns(1_250), 1_000);
        assert!(DelayModel::preset("none").unwrap().is_none());
        assert!(DelayModel::preset("bogus").is_none());
        assert_eq!(DelayModel::default(), DelayModel::NONE);
    }

    #[test]
    fn explicit_models_parse() {
        let m: DelayModel = "read=1us,write=1us,bw=2GB/s".parse().unwrap();
        assert_eq!(m, DelayModel::PCM_FAM);
        assert_eq!(m.to_string(), "pcm-fam");
        let m: DelayModel = "read=250ns, write=0.5us, rbw=1.5GiB/s, wbw=800MB/s"
            .parse()
            .unwrap();
        assert_eq!(m.read_latency_ns, 250);
        assert_eq!(m.write_latency_ns, 500);
        assert_eq!(m.read_bytes_per_sec, 3 << 29);
        assert_eq!(m.write_bytes_per_sec, 800_000_000);
        assert_eq!(m.to_string().parse::<DelayModel>().unwrap(), m);
        let m: DelayModel = "lat=2ms".parse().unwrap();
        assert_eq!(
            (m.read_latency_ns, m.write_latency_ns, m.read_bytes_per_sec),
            (2_000_000, 2_000_000, 0)
        );
        assert_eq!(m.to_string(), "read=2ms,write=2ms,bw=inf");
        assert_eq!("NVMM".parse::<DelayModel>().unwrap(), DelayModel::NVMM);
    }

    #[test]
    fn bad_models_are_rejected_with_reason() {
        for bad in [
            "",
            "fast",
            "read=1parsec",
            "bw=3furlongs/s",
            "read=-1us",
            "speed=1us",
            "read=1e3ns",
            "read=99999999999999999999s",
        ] {
            match bad.parse::<DelayModel>() {
                Err(MediaError::InvalidDelayModel { input, reason }) => {
                    assert_eq!(input, bad);
                    assert!(!reason.is_empty());
                }
                other => panic!("{bad:?} parsed as {other:?}"),
            }
        }
    }

    /// CPU time of the calling thread, ns.
    fn thread_cpu_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    #[test]
    fn a_long_delay_sleeps_and_still_ends_on_time() {
        if std::env::var(DELAY_SLEEP_ENV).is_ok_and(|v| v.trim() == "0") {
            return; // spinning asked for
        }
        let margin = delay_sleep_margin_ns();
        assert!(margin >= 20_000, "margin {margin}");
        let want = 4 * margin;
        // CPU time of this thread over the wait: the sleep leaves the core.
        let cpu = thread_cpu_ns;
        let (t0, c0) = (now_ns(), cpu());
        delay_ns(want);
        let (took, burnt) = (now_ns() - t0, cpu() - c0);
        assert!(took >= want, "waited {took} ns of {want}");
        assert!(burnt < want, "burnt {burnt} ns of CPU in a {want} ns wait");
    }

    #[test]
    fn a_pacer_holds_the_rate_across_threads_without_spinning() {
        if std::env::var(DELAY_SLEEP_ENV).is_ok_and(|v| v.trim() == "0") {
            return; // spinning asked for
        }
        let cpu = thread_cpu_ns;
        let pacer = Pacer::new();
        let cost = 1_000_000u64;
        let slack = delay_sleep_margin_ns().min(1_000_000);
        let t0 = now_ns();
        // Two threads, 20 transfers each, sharing the medium: 40 slots in all.
        let burnt: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let c0 = cpu();
                        for _ in 0..20 {
                            pacer.pace(now_ns(), cost);
                        }
                        cpu() - c0
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let took = now_ns() - t0;
        // The medium's rate holds: 40 ms of transfers, less at most one slack and the early
        // return of the last short wait.
        assert!(
            took + slack + cost >= 40 * cost,
            "40 slots of 1 ms in {took} ns"
        );
        for b in burnt {
            assert!(b < 10 * cost, "burnt {b} ns of CPU pacing 20 ms");
        }
    }

    #[test]
    fn busy_wait_waits_at_least_the_requested_time() {
        let t0 = std::time::Instant::now();
        busy_wait_ns(1_000_000);
        assert!(t0.elapsed() >= std::time::Duration::from_millis(1));
        busy_wait_ns(0);
        assert!(
            tsc_ghz() > 0.1 && tsc_ghz() < 20.0,
            "implausible TSC frequency {}",
            tsc_ghz()
        );
    }

    #[test]
    fn now_ns_is_monotonic_and_tracks_the_os_clock() {
        let a = now_ns();
        let i = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = now_ns();
        assert!(b >= a);
        // now_ns measured at least as long as the 5 ms sleep, and not wildly more than Instant.
        let el = i.elapsed().as_nanos() as u64;
        assert!(b - a >= 5_000_000, "{}", b - a);
        assert!(b - a <= el * 2 + 1_000_000, "{} vs {}", b - a, el);
    }
}
