//! Helpers shared by the vnvm integration tests.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;
use tiermem_vnvm::VnvmConfig;

/// A scratch directory on tmpfs.
pub fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tiermem-vnvm-test")
        .tempdir_in("/dev/shm")
        .unwrap()
}

/// A small instance configuration in `dir/inst`.
pub fn small_cfg(dir: &Path, log_pages: u64, cache_pages: u64) -> VnvmConfig {
    VnvmConfig {
        dir: dir.join("inst"),
        log_size: log_pages * 4096,
        cache_size: cache_pages * 4096,
        page_size: 4096,
        writeback_start_pct: 30,
        writeback_stop_pct: 10,
        max_tx_age: Duration::from_secs(600),
        max_files: 16,
        domain: None,
        group_shared: false,
        redo_paused: false,
        writeback_fault: None,
    }
}

/// Read a region's bytes.
pub fn region_bytes(r: &tiermem_vnvm::Region) -> Vec<u8> {
    let mut v = vec![0u8; r.len()];
    r.read(0, &mut v);
    v
}

/// splitmix64: deterministic pseudo-random numbers.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The self-describing workload used by the crash tests: transaction `i` (0-based) of a run
/// with `seed` writes `k` records of 16 bytes `{i + 1, mix(seed, i, slot)}` to slots chosen by
/// the seed; a slot holds one record. `apply_prefix` computes the file after the first `n`.
pub const SLOT: usize = 16;

pub fn tx_slots(seed: u64, i: u64, slots: usize, k: usize) -> Vec<usize> {
    // k == 0: a per-transaction count from 1 to 400 (several log pages for the large ones).
    let k = if k == 0 {
        1 + (mix(seed ^ 0xabcd ^ i) % 400) as usize
    } else {
        k
    };
    (0..k as u64)
        .map(|j| (mix(seed ^ mix(i * 1000 + j)) % slots as u64) as usize)
        .collect()
}

pub fn record(seed: u64, i: u64, slot: usize) -> [u8; SLOT] {
    let mut r = [0u8; SLOT];
    r[..8].copy_from_slice(&(i + 1).to_le_bytes());
    r[8..].copy_from_slice(&mix(seed ^ (i << 20) ^ slot as u64).to_le_bytes());
    r
}

pub fn apply_prefix(init: &[u8], seed: u64, n: u64, slots: usize, k: usize) -> Vec<u8> {
    let mut v = init.to_vec();
    for i in 0..n {
        for s in tx_slots(seed, i, slots, k) {
            v[s * SLOT..(s + 1) * SLOT].copy_from_slice(&record(seed, i, s));
        }
    }
    v
}

/// Which prefix length of the workload `got` equals, if any, searching `lo..=hi`.
pub fn matching_prefix(
    init: &[u8],
    got: &[u8],
    seed: u64,
    lo: u64,
    hi: u64,
    slots: usize,
    k: usize,
) -> Option<u64> {
    (lo..=hi).find(|&n| apply_prefix(init, seed, n, slots, k) == got)
}
