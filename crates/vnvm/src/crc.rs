//! CRC32C (Castagnoli) for vnvm's checksums: the `crc32c` crate's function, with a fast path for
//! the short inputs that most of them are (cache page records, log page and entry headers, a
//! 64-byte chunk, a log entry of a few dozen bytes), and three short messages side by side (the
//! redo worker's check of log entries). For short inputs the crate's dispatch, alignment and
//! three-way set-up cost more than the hashing itself. Measured on the development VM (AMD
//! EPYC, 2 vCPUs), per message of a 16-byte header and S bytes: S = 16: crate 33-36 ns, short
//! path 15 ns, three side by side 10-11 ns; S = 128: 59-75 / 29 / 27 ns; S = 512: 120 / 108 /
//! 89 ns. (This CPU's crc32 instruction issues about one per 3 cycles, so side-by-side chains
//! gain little; the crate's 4 KiB CRC runs at ~4.7 GB/s here.) Results are identical to the
//! crate's (tested), so nothing on media changes.

/// Inputs up to this many bytes take the short path; longer ones the crate's three-way path.
const SHORT: usize = 256;

/// The CRC32C of `data` continued from `crc` (as `crc32c::crc32c_append`).
#[inline]
pub(crate) fn append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if data.len() <= SHORT && std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: SSE4.2 is available (checked above).
        return unsafe { short_sse42(crc, data) };
    }
    crc32c::crc32c_append(crc, data)
}

/// The CRC32C of `data` (as `crc32c::crc32c`).
#[inline]
pub(crate) fn crc32c(data: &[u8]) -> u32 {
    append(0, data)
}

/// One crc32 instruction per 8 bytes, then per byte for the tail: latency-bound, which for a few
/// dozen bytes is a few nanoseconds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn short_sse42(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut c = u64::from(!crc);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        c = _mm_crc32_u64(c, u64::from_le_bytes(b));
    }
    let mut c = c as u32;
    for &b in words.remainder() {
        c = _mm_crc32_u8(c, b);
    }
    !c
}

/// The CRC32C of each of three messages, each the concatenation `m.0 ++ m.1` (as
/// `crc32c_append(crc32c(m.0), m.1)`): the three crc32 chains run side by side, so that three
/// short messages cost about what one does (one chain is bound by the instruction's latency).
pub(crate) fn crc32c_3(m: [(&[u8], &[u8]); 3]) -> [u32; 3] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: SSE4.2 is available (checked above).
        return unsafe { three_sse42(m) };
    }
    m.map(|(a, b)| append(crc32c(a), b))
}

/// [`crc32c_3`] with the crc32 instruction: the first parts (equal lengths, whole words: the
/// 16-byte entry headers) and then the second parts' common whole words in lockstep, then each
/// message's rest on its own. Other shapes go one message at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn three_sse42(m: [(&[u8], &[u8]); 3]) -> [u32; 3] {
    use std::arch::x86_64::_mm_crc32_u64;
    let la = m[0].0.len();
    if la % 8 != 0 || m[1].0.len() != la || m[2].0.len() != la {
        // SAFETY: SSE4.2 is available (this function's own requirement).
        return m.map(|(a, b)| unsafe { short_sse42(short_sse42(0, a), b) });
    }
    let mut c = [u64::from(u32::MAX); 3];
    let load = |p: *const u8, i: usize| {
        // SAFETY: callers pass i with 8·i + 8 ≤ the length of the slice `p` starts.
        u64::from_le(unsafe { std::ptr::read_unaligned(p.add(8 * i) as *const u64) })
    };
    let a = [m[0].0.as_ptr(), m[1].0.as_ptr(), m[2].0.as_ptr()];
    for i in 0..la / 8 {
        c[0] = _mm_crc32_u64(c[0], load(a[0], i));
        c[1] = _mm_crc32_u64(c[1], load(a[1], i));
        c[2] = _mm_crc32_u64(c[2], load(a[2], i));
    }
    let n = m[0].1.len().min(m[1].1.len()).min(m[2].1.len()) / 8;
    let b = [m[0].1.as_ptr(), m[1].1.as_ptr(), m[2].1.as_ptr()];
    for i in 0..n {
        c[0] = _mm_crc32_u64(c[0], load(b[0], i));
        c[1] = _mm_crc32_u64(c[1], load(b[1], i));
        c[2] = _mm_crc32_u64(c[2], load(b[2], i));
    }
    // The rest of each message: `short_sse42` continues a CRC given in its finished form.
    // SAFETY: SSE4.2 is available (this function's own requirement).
    [0, 1, 2].map(|k| unsafe { short_sse42(!(c[k] as u32), &m[k].1[8 * n..]) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn equals_the_crate_for_every_length_and_seed() {
        let data: Vec<u8> = (0..700u32).map(|i| (i * 31 + i / 7) as u8).collect();
        for len in 0..data.len() {
            for (off, seed) in [(0, 0u32), (3, 0x9e37_79b9), (5, u32::MAX)] {
                let d = &data[off..(off + len).min(data.len())];
                assert_eq!(
                    super::append(seed, d),
                    crc32c::crc32c_append(seed, d),
                    "len {len}"
                );
            }
        }
        assert_eq!(super::crc32c(b"123456789"), 0xe306_9283);
        // Three messages of two parts side by side, of every mix of lengths (first parts of
        // 0, 5, 8 and 16 bytes: aligned or not).
        for la in [0usize, 5, 8, 16] {
            for lens in [
                [0usize, 0, 0],
                [1, 9, 17],
                [40, 40, 40],
                [128, 3, 64],
                [600, 7, 300],
            ] {
                let m = [0, 1, 2].map(|k| (&data[k..k + la], &data[100 + k..100 + k + lens[k]]));
                let want = m.map(|(a, b)| crc32c::crc32c_append(crc32c::crc32c(a), b));
                assert_eq!(
                    super::crc32c_3(m),
                    want,
                    "first part {la}, lengths {lens:?}"
                );
            }
        }
    }
}
