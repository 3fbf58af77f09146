//! What a caller can ask of the service: the process-wide [`Options`] of a [`Service`](crate::Service)
//! and the per-region [`Policy`] (order, populate kind, chunk, window entries, THP), plus their
//! packing into one word so that a registration can be published without a lock or an
//! allocation (the preload library registers from inside `mmap`).

use std::time::Duration;

/// The order in which the application is expected to first-touch a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// Learned from the footprint: direction, stride or random ("whole"), re-learned when the
    /// footprint contradicts it.
    #[default]
    Auto,
    /// Low addresses first.
    Ascending,
    /// High addresses first.
    Descending,
    /// Every `stride`-th page, ascending; the stride is learned from the footprint (1 until then).
    Stride,
    /// No order: the whole region, chunk by chunk, as far as the budget allows.
    Whole,
}

/// How pages are populated ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Populate {
    /// Learned from the footprint: `Read` while the pages the application faults itself are
    /// mapped to the zero page (it reads before it writes), `Write` otherwise. Populating a page
    /// for writing after the application mapped the zero page there replaces a present entry:
    /// a TLB shootdown of the application's core, which made back-to-back reads 2× slower than
    /// the kernel alone.
    #[default]
    Auto,
    /// `MADV_POPULATE_WRITE`: a private zeroed page, so the first write does not fault either.
    Write,
    /// `MADV_POPULATE_READ`: page tables to the shared zero page (the first write still
    /// faults, but cheaply: a copy-on-write of the zero page). For data only read.
    Read,
}

/// Transparent huge pages for a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Thp {
    /// Decided by the kernel: the first populate shows whether the region gets huge pages.
    #[default]
    Auto,
    /// Populate whole 2 MiB units (the region must be THP-eligible to gain anything).
    On,
    /// 4 KiB chunks with one tripwire page each, even where the kernel could map huge pages.
    Off,
}

/// A region's policy. The defaults are the paper's parameters: a window table of 64 entries
/// of one chunk each, 16 pages a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Touch order (see [`Order`]).
    pub order: Order,
    /// Populate kind (see [`Populate`]).
    pub populate: Populate,
    /// Pages per window entry, 1..=64 (4 KiB mode; one of them is the tripwire when > 1).
    pub chunk: u32,
    /// Window entries, 1..=64.
    pub entries: u32,
    /// Huge pages (see [`Thp`]).
    pub thp: Thp,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            order: Order::Auto,
            populate: Populate::Auto,
            chunk: 16,
            entries: 64,
            thp: Thp::Auto,
        }
    }
}

/// Most entries of a window table (the paper's 64).
pub const MAX_ENTRIES: u32 = 64;
/// Most pages of a 4 KiB chunk: one populate call stays within 256 KiB.
pub const MAX_CHUNK: u32 = 64;

impl Policy {
    /// Checks the numbers; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.chunk == 0 || self.chunk > MAX_CHUNK {
            return Err(format!(
                "policy chunk {} pages: must be 1..={MAX_CHUNK}",
                self.chunk
            ));
        }
        if self.entries == 0 || self.entries > MAX_ENTRIES {
            return Err(format!(
                "policy entries {}: must be 1..={MAX_ENTRIES}",
                self.entries
            ));
        }
        Ok(())
    }

    /// Packs the policy into one word (bits: order 0..3, populate 3..5, thp 5..7, chunk 8..16,
    /// entries 16..24).
    pub(crate) fn pack(&self) -> u64 {
        let order = match self.order {
            Order::Auto => 0,
            Order::Ascending => 1,
            Order::Descending => 2,
            Order::Stride => 3,
            Order::Whole => 4,
        };
        let populate = match self.populate {
            Populate::Auto => 0,
            Populate::Write => 1,
            Populate::Read => 2,
        };
        let thp = match self.thp {
            Thp::Auto => 0,
            Thp::On => 1,
            Thp::Off => 2,
        };
        order | populate << 3 | thp << 5 | (self.chunk as u64) << 8 | (self.entries as u64) << 16
    }

    /// The inverse of [`Policy::pack`].
    pub(crate) fn unpack(w: u64) -> Policy {
        Policy {
            order: match w & 7 {
                1 => Order::Ascending,
                2 => Order::Descending,
                3 => Order::Stride,
                4 => Order::Whole,
                _ => Order::Auto,
            },
            populate: match w >> 3 & 3 {
                1 => Populate::Write,
                2 => Populate::Read,
                _ => Populate::Auto,
            },
            thp: match w >> 5 & 3 {
                1 => Thp::On,
                2 => Thp::Off,
                _ => Thp::Auto,
            },
            chunk: (w >> 8 & 0xff) as u32,
            entries: (w >> 16 & 0xff) as u32,
        }
    }
}

/// The service's process-wide settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Upper bound on bytes populated ahead and not yet known to be used, over all regions.
    pub budget_bytes: usize,
    /// Time between passes while nothing gets used (the paper's 2 ms).
    pub interval: Duration,
    /// Shortest time between passes while entries get used.
    pub min_interval: Duration,
    /// Most bytes one populate call covers in 4 KiB mode (a huge-page unit is one call).
    pub max_call_bytes: usize,
    /// Populating stops while the memory cgroup has less than this much room below its limit.
    pub memcg_headroom_bytes: usize,
    /// Run the service thread as SCHED_IDLE, so it only uses a core nobody else wants.
    pub sched_idle: bool,
    /// Adapt the interval (down to `min_interval`) while entries get used; off: every pass
    /// waits `interval` (the paper's fixed 2 ms delayed work).
    pub adaptive: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            budget_bytes: 64 << 20,
            interval: Duration::from_millis(2),
            min_interval: Duration::from_micros(100),
            max_call_bytes: 256 << 10,
            memcg_headroom_bytes: 32 << 20,
            sched_idle: true,
            adaptive: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips() {
        for order in [
            Order::Auto,
            Order::Ascending,
            Order::Descending,
            Order::Stride,
            Order::Whole,
        ] {
            for populate in [Populate::Auto, Populate::Write, Populate::Read] {
                for thp in [Thp::Auto, Thp::On, Thp::Off] {
                    let p = Policy {
                        order,
                        populate,
                        chunk: 37,
                        entries: 64,
                        thp,
                    };
                    assert_eq!(Policy::unpack(p.pack()), p);
                }
            }
        }
    }

    #[test]
    fn validate_names_the_field() {
        let mut p = Policy::default();
        assert!(p.validate().is_ok());
        p.chunk = 0;
        assert!(p.validate().unwrap_err().contains("chunk"));
        p.chunk = 16;
        p.entries = 65;
        assert!(p.validate().unwrap_err().contains("entries"));
    }
}
