//! The checksum of NVM cache page contents, chunk by chunk: each chunk (a 64th of a page) has a
//! CRC32C seeded with its index, and a page's checksum is the XOR of its valid chunks' CRCs
//! (see `recovery::cache_page_sum`). The redo worker keeps every valid chunk's CRC in DRAM
//! (`CacheState::sums`), computed from the bytes it stores, so a page's checksum is an XOR of
//! table entries and no cache page is read back. This file owns that hash and its fast path:
//! three chunks are hashed side by side, because one 64-byte CRC is bound by the crc32
//! instruction's latency.

/// Seed of chunk 0; chunk `ch` is seeded with `SEED ^ ch`.
const SEED: u32 = 0x9e37_79b9;

/// The checksum of chunk `ch` holding `bytes`.
pub(crate) fn chunk_sum(ch: u64, bytes: &[u8]) -> u32 {
    crate::crc::append(SEED ^ ch as u32, bytes)
}

/// The XOR of [`chunk_sum`] over the chunks of `page` (chunks of `cs` bytes) set in `mask`.
/// Chunks that lie (partly) outside `page` are skipped.
pub(crate) fn chunks_xor(page: &[u8], cs: usize, mut mask: u64) -> u32 {
    let chunk = |ch: usize| page.get(ch * cs..(ch + 1) * cs);
    let mut x = 0;
    #[cfg(target_arch = "x86_64")]
    if cs % 8 == 0 && std::arch::is_x86_feature_detected!("sse4.2") {
        while mask.count_ones() >= 3 {
            let mut next = || {
                let ch = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                ch
            };
            let (a, b, c) = (next(), next(), next());
            match (chunk(a), chunk(b), chunk(c)) {
                (Some(sa), Some(sb), Some(sc)) => {
                    // SAFETY: SSE4.2 is available (checked above).
                    x ^= unsafe { three_sse42([a, b, c], [sa, sb, sc]) }
                        .iter()
                        .fold(0, |x, s| x ^ s);
                }
                (sa, sb, sc) => {
                    for (ch, s) in [(a, sa), (b, sb), (c, sc)] {
                        if let Some(s) = s {
                            x ^= chunk_sum(ch as u64, s);
                        }
                    }
                }
            }
        }
    }
    while mask != 0 {
        let ch = mask.trailing_zeros() as usize;
        mask &= mask - 1;
        if let Some(s) = chunk(ch) {
            x ^= chunk_sum(ch as u64, s);
        }
    }
    x
}

/// The [`chunk_sum`]s of the consecutive chunks `bytes` holds (chunks of `cs` bytes, the first
/// of index `first`), into `out` (one per chunk; `bytes.len()` is `out.len() · cs`). Three at
/// a time where the CPU has the crc32 instruction.
pub(crate) fn chunk_sums(first: u64, bytes: &[u8], cs: usize, out: &mut [u32]) {
    let n = out.len();
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if cs % 8 == 0 && std::arch::is_x86_feature_detected!("sse4.2") {
        // Three lanes per pass; with one or two chunks left the last one fills the other
        // lanes (a three-lane pass costs what one chain does).
        while done < n {
            let lane = |k: usize| (done + k).min(n - 1);
            let ch = [0, 1, 2].map(|k| first as usize + lane(k));
            let s = [0, 1, 2].map(|k| bytes.get(lane(k) * cs..(lane(k) + 1) * cs));
            let (Some(a), Some(b), Some(c)) = (s[0], s[1], s[2]) else {
                break;
            };
            // SAFETY: SSE4.2 is available (checked above).
            let three = unsafe { three_sse42(ch, [a, b, c]) };
            let k = (n - done).min(3);
            out[done..done + k].copy_from_slice(&three[..k]);
            done += k;
        }
    }
    for (k, o) in out.iter_mut().enumerate().skip(done) {
        *o = bytes
            .get(k * cs..(k + 1) * cs)
            .map_or(0, |b| chunk_sum(first + k as u64, b));
    }
}

/// The XOR of the entries of `sums` (one per chunk of a page) whose bits are set in `mask`: a
/// loop over the set bits when there are few (a page a batch wrote a few bytes of), branch-free
/// over all 64 entries otherwise (the compiler vectorises it; a busy heap page has most chunks
/// valid, and the bit loop then cost ~100 cycles per record published).
pub(crate) fn xor_masked(sums: &[u32], mut mask: u64) -> u32 {
    let mut x = 0;
    if mask.count_ones() <= 8 {
        while mask != 0 {
            let ch = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            x ^= sums.get(ch).copied().unwrap_or(0);
        }
        return x;
    }
    for (i, &s) in sums.iter().take(64).enumerate() {
        x ^= s & 0u32.wrapping_sub(((mask >> i) & 1) as u32);
    }
    x
}

/// [`chunk_sum`] of three chunks of equal length (a multiple of 8): three independent crc32
/// chains, so the instruction's throughput rather than its latency bounds it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn three_sse42(ch: [usize; 3], s: [&[u8]; 3]) -> [u32; 3] {
    use std::arch::x86_64::_mm_crc32_u64;
    let mut c = ch.map(|ch| u64::from(!(SEED ^ ch as u32)));
    let n = s[0].len().min(s[1].len()).min(s[2].len()) / 8;
    let p = s.map(|s| s.as_ptr());
    for i in 0..n {
        // SAFETY: i < n, so bytes [8i, 8i + 8) lie in each of the three slices.
        let (a, b, d) = unsafe {
            (
                std::ptr::read_unaligned(p[0].add(8 * i) as *const u64),
                std::ptr::read_unaligned(p[1].add(8 * i) as *const u64),
                std::ptr::read_unaligned(p[2].add(8 * i) as *const u64),
            )
        };
        c[0] = _mm_crc32_u64(c[0], u64::from_le(a));
        c[1] = _mm_crc32_u64(c[1], u64::from_le(b));
        c[2] = _mm_crc32_u64(c[2], u64::from_le(d));
    }
    c.map(|c| !(c as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_path_equals_the_crate_chunk_by_chunk() {
        let page: Vec<u8> = (0..4096u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for mask in [
            0u64,
            1,
            0b111,
            0b1011,
            u64::MAX,
            0x8000_0000_0000_0001,
            0xdead_beef_f00d,
        ] {
            let mut want = 0;
            for ch in 0..64 {
                if mask & (1 << ch) != 0 {
                    want ^= crc32c::crc32c_append(SEED ^ ch as u32, &page[ch * 64..ch * 64 + 64]);
                }
            }
            assert_eq!(chunks_xor(&page, 64, mask), want, "mask {mask:#x}");
        }
        // chunk_sums: each chunk's own sum, for runs of every length from every first chunk,
        // 64- and 128-byte chunks (4 and 8 KiB pages).
        for cs in [64usize, 128] {
            for first in 0..5u64 {
                for n in 0..8usize {
                    let bytes = &page[first as usize * cs..(first as usize + n) * cs];
                    let mut out = vec![0u32; n];
                    chunk_sums(first, bytes, cs, &mut out);
                    for (k, o) in out.iter().enumerate() {
                        let want = chunk_sum(first + k as u64, &bytes[k * cs..(k + 1) * cs]);
                        assert_eq!(*o, want, "cs {cs} first {first} n {n} chunk {k}");
                    }
                    let all = (1u64 << n) - 1;
                    assert_eq!(
                        xor_masked(&out, all),
                        out.iter().fold(0, |x, s| x ^ s),
                        "xor_masked"
                    );
                }
            }
        }
        // A chunk past the end is skipped, not a panic.
        assert_eq!(
            chunks_xor(&page[..100], 64, 0b11),
            chunk_sum(0, &page[..64])
        );
    }
}
