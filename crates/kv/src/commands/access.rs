//! The access clock behind OBJECT IDLETIME: when each key was last used by a command, kept in
//! DRAM (never in the heap: a read must not write there) in a fixed table indexed by a hash of
//! the database and the key. Like Redis's own 24-bit LRU clock it is approximate and counts
//! seconds; unlike it, two keys that share a slot share a clock (a key then reads as recently
//! used when its neighbour was), and SWAPDB does not carry clocks along. A key nobody has
//! used since the server started reads as idle since then, as Redis reports keys it loaded.

use rustc_hash::FxHasher;
use std::hash::Hasher;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::OnceLock;

/// Slots: 1 MiB of clocks, small enough to stay mostly in the CPU's caches.
const SLOTS: usize = 1 << 18;

struct Clock {
    /// Seconds since the epoch of each slot's last use (0: none since start).
    slots: Box<[AtomicU32]>,
    /// When this process started serving, in seconds since the epoch.
    start: u32,
}

fn clock() -> &'static Clock {
    static C: OnceLock<Clock> = OnceLock::new();
    C.get_or_init(|| Clock {
        slots: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
        start: now_s(),
    })
}

/// Seconds since the epoch from the coarse real-time clock: a read of the vDSO's page, no
/// time-stamp counter (the command time of `expire::now_ms` reads the precise clock, which
/// was 5 % of a pipelined GET's server CPU when every command asked for it).
fn now_s() -> u32 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass and nothing else.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    ts.tv_sec as u32
}

fn slot(db: usize, key: &[u8]) -> usize {
    let mut h = FxHasher::default();
    h.write_usize(db);
    h.write(key);
    (h.finish() >> 20) as usize % SLOTS
}

/// Note a use of `key` in database `db` now (a command that looked it up).
#[inline]
pub fn touch(db: usize, key: &[u8]) {
    let c = clock();
    let now = now_s();
    let s = &c.slots[slot(db, key)];
    // Read first: a key used again within the second leaves its cache line clean.
    if s.load(Relaxed) != now {
        s.store(now, Relaxed);
    }
}

/// Make `key` in database `db` read as idle for `secs` seconds (RESTORE's IDLETIME).
pub fn set_idle(db: usize, key: &[u8], secs: u64) {
    let c = clock();
    let at = (now_s() as u64).saturating_sub(secs).max(1) as u32;
    c.slots[slot(db, key)].store(at, Relaxed);
}

/// Seconds since `key` in database `db` was last used (OBJECT IDLETIME).
pub fn idle_seconds(db: usize, key: &[u8]) -> u64 {
    let c = clock();
    let at = c.slots[slot(db, key)].load(Relaxed);
    // Never used since start: idle since then. (A RESTORE's IDLETIME may reach further back.)
    let last = if at == 0 { c.start } else { at };
    now_s().saturating_sub(last) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_touched_key_is_not_idle() {
        touch(3, b"access-test-key");
        assert_eq!(idle_seconds(3, b"access-test-key"), 0);
        // Another slot's key: idle since start at most.
        assert!(idle_seconds(3, b"another-key") <= now_s().saturating_sub(clock().start) as u64);
    }
}
