//! Per-command statistics for INFO commandstats, as Redis 7.0 keeps them: calls, the time
//! they took, calls rejected before they ran (a wrong arity, NOAUTH, a command not allowed in
//! the context), and calls that ran and replied with an error. One slot per command of the
//! table, relaxed atomic counters (event loops add to them without a lock).

use super::table::{Spec, TABLE};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// One command's counters.
#[derive(Default)]
struct Slot {
    calls: AtomicU64,
    nanos: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
}

/// Every command's counters.
pub struct CmdStats {
    slots: Box<[Slot]>,
}

impl Default for CmdStats {
    fn default() -> Self {
        CmdStats {
            slots: (0..TABLE.len()).map(|_| Slot::default()).collect(),
        }
    }
}

impl CmdStats {
    /// `spec` ran from `*clock` until now, replying `reply` (an error when it starts with
    /// `-`); `*clock` becomes now, the start of the next command (one clock read a command).
    #[inline]
    pub fn ran(&self, spec: &Spec, clock: &mut Instant, reply: &[u8]) {
        let now = Instant::now();
        let nanos = now.duration_since(*clock).as_nanos() as u64;
        *clock = now;
        let failed = reply.first() == Some(&b'-');
        let s = &self.slots[spec.id as usize];
        s.calls.fetch_add(1, Relaxed);
        s.nanos.fetch_add(nanos, Relaxed);
        if failed {
            s.failed.fetch_add(1, Relaxed);
        }
    }

    /// `spec` was refused before it ran.
    pub fn rejected(&self, spec: &Spec) {
        self.slots[spec.id as usize].rejected.fetch_add(1, Relaxed);
    }

    /// CONFIG RESETSTAT.
    pub fn reset(&self) {
        for s in self.slots.iter() {
            for c in [&s.calls, &s.nanos, &s.rejected, &s.failed] {
                c.store(0, Relaxed);
            }
        }
    }

    /// INFO commandstats' lines: `cmdstat_<name>` and
    /// `calls=…,usec=…,usec_per_call=…,rejected_calls=…,failed_calls=…` for every command
    /// called or refused at least once, in table order.
    pub fn lines(&self) -> Vec<(String, String)> {
        let mut v = Vec::new();
        for (spec, s) in TABLE.iter().zip(self.slots.iter()) {
            let (calls, nanos) = (s.calls.load(Relaxed), s.nanos.load(Relaxed));
            let (rejected, failed) = (s.rejected.load(Relaxed), s.failed.load(Relaxed));
            if calls + rejected + failed == 0 {
                continue;
            }
            let usec = nanos / 1000;
            let per = if calls > 0 {
                usec as f64 / calls as f64
            } else {
                0.0
            };
            v.push((
                format!("cmdstat_{}", spec.name),
                format!(
                    "calls={calls},usec={usec},usec_per_call={per:.2},rejected_calls={rejected},failed_calls={failed}"
                ),
            ));
        }
        v
    }
}
