//! The one flush indirection: CPU feature detection, cache-line write-back, store fences,
//! non-temporal copies and the per-medium persist method.
//!
//! Everything above this module that needs data to reach the persistence domain goes through
//! [`PersistMethod::persist`] (or [`flush_lines`] + [`fence`]), so the same code runs on a real
//! DAX mapping (MAP_SYNC: clwb + sfence suffices), on tmpfs-backed emulated NVM (clwb + sfence,
//! same ordering as real hardware) and on an ordinary block-backed file (msync).

use std::arch::asm;
use std::arch::x86_64::{__cpuid, __cpuid_count};
use std::sync::OnceLock;

/// Size of a CPU cache line on x86-64, the unit of flushing and of the crash model.
pub const CACHE_LINE: usize = 64;

/// Copies shorter than this use ordinary stores followed by a cache-line write-back; longer ones
/// use non-temporal stores for their aligned body.
const NT_THRESHOLD: usize = 256;

/// CPU features relevant to persistence and timing, read once with CPUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CpuFeatures {
    /// `clwb` (write back a line without evicting it): CPUID.7.0:EBX bit 24.
    pub clwb: bool,
    /// `clflushopt` (weakly ordered flush): CPUID.7.0:EBX bit 23.
    pub clflushopt: bool,
    /// AVX2 usable (CPU and OS support).
    pub avx2: bool,
    /// AVX-512F usable (CPU and OS support).
    pub avx512f: bool,
    /// Invariant TSC (constant rate across P/C-states): CPUID.80000007H:EDX bit 8.
    pub invariant_tsc: bool,
}

/// Which instruction [`flush_lines`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushInstr {
    /// `clwb`: write back, keep the line cached (preferred).
    Clwb,
    /// `clflushopt`: write back and evict, weakly ordered.
    Clflushopt,
    /// `clflush`: write back and evict, strongly ordered (always available on x86-64).
    Clflush,
}

static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();

/// The CPU's features, detected once (CPUID) and cached.
pub fn cpu_features() -> CpuFeatures {
    // `__cpuid` is a safe fn on newer toolchains and unsafe on the 1.80 MSRV.
    #[allow(unused_unsafe)]
    *FEATURES.get_or_init(|| {
        // SAFETY: CPUID is available on every x86-64 CPU; leaf 0 reports the highest basic leaf.
        let max_basic = unsafe { __cpuid(0) }.eax;
        let (clwb, clflushopt) = if max_basic >= 7 {
            // SAFETY: leaf 7 exists (checked against max_basic above).
            let l7 = unsafe { __cpuid_count(7, 0) };
            (l7.ebx & (1 << 24) != 0, l7.ebx & (1 << 23) != 0)
        } else {
            (false, false)
        };
        // SAFETY: CPUID is available on every x86-64 CPU; 0x8000_0000 reports the highest
        // extended leaf.
        let max_ext = unsafe { __cpuid(0x8000_0000) }.eax;
        let invariant_tsc = if max_ext >= 0x8000_0007 {
            // SAFETY: the leaf exists (checked against max_ext above).
            unsafe { __cpuid(0x8000_0007) }.edx & (1 << 8) != 0
        } else {
            false
        };
        CpuFeatures {
            clwb,
            clflushopt,
            avx2: std::arch::is_x86_feature_detected!("avx2"),
            avx512f: std::arch::is_x86_feature_detected!("avx512f"),
            invariant_tsc,
        }
    })
}

/// True when the TSC runs at a constant rate (so TSC-based delays and clocks are exact).
pub fn cpu_has_tsc_invariant() -> bool {
    cpu_features().invariant_tsc
}

/// The flush instruction this CPU uses: clwb if present, else clflushopt, else clflush.
pub fn flush_instr() -> FlushInstr {
    let f = cpu_features();
    if f.clwb {
        FlushInstr::Clwb
    } else if f.clflushopt {
        FlushInstr::Clflushopt
    } else {
        FlushInstr::Clflush
    }
}

/// Store fence (`sfence`): orders all earlier stores, cache-line write-backs and non-temporal
/// stores before any later store. After `flush_lines(p, n); fence();` the lines are in the
/// persistence domain on ADR/eADR platforms.
#[inline]
pub fn fence() {
    // SAFETY: sfence has no operands and no memory-safety effect; the asm is not `nomem`, so the
    // compiler also treats it as a compiler barrier for memory accesses.
    unsafe { asm!("sfence", options(nostack, preserves_flags)) };
}

/// Write back every cache line overlapping `[ptr, ptr + len)` with clwb, clflushopt or clflush
/// (the best this CPU has). Does not fence: the write-backs are ordered only by a later
/// [`fence`]. `len == 0` does nothing.
///
/// # Safety
/// The whole range, rounded out to cache lines, must be mapped in this process (flushing an
/// unmapped address faults). The memory is not read or written in the Rust sense.
#[inline]
pub unsafe fn flush_lines(ptr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let start = ptr as usize & !(CACHE_LINE - 1);
    let end = ptr as usize + len;
    let mut p = start;
    match flush_instr() {
        FlushInstr::Clwb => {
            while p < end {
                // SAFETY: p lies in a cache line overlapping the caller's mapped range.
                unsafe { asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags)) };
                p += CACHE_LINE;
            }
        }
        FlushInstr::Clflushopt => {
            while p < end {
                // SAFETY: as above.
                unsafe { asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags)) };
                p += CACHE_LINE;
            }
        }
        FlushInstr::Clflush => {
            while p < end {
                // SAFETY: as above.
                unsafe { asm!("clflush [{0}]", in(reg) p, options(nostack, preserves_flags)) };
                p += CACHE_LINE;
            }
        }
    }
}

/// Safe form of [`flush_lines`] for a slice (which is mapped by construction).
#[inline]
pub fn flush_slice(s: &[u8]) {
    // SAFETY: a live slice is mapped memory.
    unsafe { flush_lines(s.as_ptr(), s.len()) }
}

/// Copy `len` bytes from `src` to `dst` so that they bypass (or are written back from) the CPU
/// cache, then `sfence`. On return the bytes are ordered before any later store, i.e. durable on
/// a real persistent-memory mapping.
///
/// The 64-byte-aligned body is written with non-temporal stores (AVX2 when available, else SSE2);
/// the unaligned head and tail, and copies shorter than 256 bytes, use ordinary stores followed by
/// a cache-line write-back ([`flush_lines`]).
///
/// # Safety
/// `src` must be valid for reads and `dst` valid for writes of `len` bytes, and the two ranges
/// must not overlap.
pub unsafe fn nt_copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded caller contract.
    unsafe { nt_copy_nofence(dst, src, len) };
    fence();
}

/// Safe form of [`nt_copy`]: copies `src` into the start of `dst` (panics if `dst` is shorter,
/// like `copy_from_slice`).
pub fn nt_copy_slice(dst: &mut [u8], src: &[u8]) {
    assert!(
        dst.len() >= src.len(),
        "nt_copy_slice: destination shorter than source"
    );
    // SAFETY: both are live slices of sufficient length; &mut excludes overlap with &.
    unsafe { nt_copy(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
}

/// [`nt_copy`] without the trailing fence: the stores and write-backs are issued but not yet
/// ordered. Used by `Pool::write`, whose contract leaves ordering to a later persist/fence.
///
/// # Safety
/// Same as [`nt_copy`].
pub(crate) unsafe fn nt_copy_nofence(dst: *mut u8, src: *const u8, len: usize) {
    if len < NT_THRESHOLD {
        // SAFETY: caller guarantees validity and non-overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, len);
            flush_lines(dst, len);
        }
        return;
    }
    let head = (CACHE_LINE - (dst as usize & (CACHE_LINE - 1))) & (CACHE_LINE - 1);
    let body = (len - head) & !(CACHE_LINE - 1);
    let tail = len - head - body;
    // SAFETY: head + body + tail == len, so every access stays inside the caller's ranges; the
    // body destination is 64-byte aligned by construction of `head`.
    unsafe {
        if head > 0 {
            std::ptr::copy_nonoverlapping(src, dst, head);
            flush_lines(dst, head);
        }
        let (d, s) = (dst.add(head), src.add(head));
        if cpu_features().avx2 {
            stream_avx2(d, s, body);
        } else {
            stream_sse2(d, s, body);
        }
        if tail > 0 {
            let (d, s) = (dst.add(head + body), src.add(head + body));
            std::ptr::copy_nonoverlapping(s, d, tail);
            flush_lines(d, tail);
        }
    }
}

/// Non-temporal copy of `len` bytes (a multiple of 64) to a 64-byte-aligned `dst`, AVX2.
///
/// # Safety
/// AVX2 must be available; `dst` 64-byte aligned and valid for `len` writes, `src` valid for
/// `len` reads, no overlap, `len % 64 == 0`.
#[target_feature(enable = "avx2")]
unsafe fn stream_avx2(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256};
    let mut off = 0;
    // SAFETY: every offset accessed is < len; dst + off is 32-byte aligned because dst is
    // 64-byte aligned and off advances in multiples of 32.
    unsafe {
        while off + 128 <= len {
            let s = src.add(off) as *const __m256i;
            let d = dst.add(off) as *mut __m256i;
            let a = _mm256_loadu_si256(s);
            let b = _mm256_loadu_si256(s.add(1));
            let c = _mm256_loadu_si256(s.add(2));
            let e = _mm256_loadu_si256(s.add(3));
            _mm256_stream_si256(d, a);
            _mm256_stream_si256(d.add(1), b);
            _mm256_stream_si256(d.add(2), c);
            _mm256_stream_si256(d.add(3), e);
            off += 128;
        }
        while off < len {
            let s = src.add(off) as *const __m256i;
            let d = dst.add(off) as *mut __m256i;
            _mm256_stream_si256(d, _mm256_loadu_si256(s));
            _mm256_stream_si256(d.add(1), _mm256_loadu_si256(s.add(1)));
            off += 64;
        }
    }
}

/// Non-temporal copy of `len` bytes (a multiple of 64) to a 64-byte-aligned `dst`, SSE2.
///
/// # Safety
/// Same as [`stream_avx2`] minus the AVX2 requirement (SSE2 is baseline on x86-64).
unsafe fn stream_sse2(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let mut off = 0;
    // SAFETY: every offset accessed is < len; dst + off is 16-byte aligned.
    unsafe {
        while off < len {
            let s = src.add(off) as *const __m128i;
            let d = dst.add(off) as *mut __m128i;
            let a = _mm_loadu_si128(s);
            let b = _mm_loadu_si128(s.add(1));
            let c = _mm_loadu_si128(s.add(2));
            let e = _mm_loadu_si128(s.add(3));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
            off += 64;
        }
    }
}

/// How data in a mapping reaches the persistence domain; chosen per mapping by medium detection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PersistMethod {
    /// Memory-backed file (tmpfs/hugetlbfs) emulating NVM: clwb + sfence, the same ordering a
    /// real persistent-memory program performs.
    CacheFlush,
    /// A real DAX mapping obtained with MAP_SYNC (pmem, CXL): clwb + sfence makes data durable.
    DaxSync,
    /// An ordinary block-backed file: `msync(MS_SYNC)` of the page-aligned range.
    Msync,
}

impl PersistMethod {
    /// Make `[ptr, ptr + len)` durable: flush + fence for `CacheFlush`/`DaxSync`, page-aligned
    /// `msync(MS_SYNC)` for `Msync`. `len == 0` still fences (cache methods) and does nothing for
    /// `Msync`.
    ///
    /// # Safety
    /// The range must lie inside a live mapping (for `Msync`, a shared file mapping).
    pub unsafe fn persist(self, ptr: *const u8, len: usize) -> std::io::Result<()> {
        match self {
            PersistMethod::CacheFlush | PersistMethod::DaxSync => {
                // SAFETY: forwarded caller contract.
                unsafe { flush_lines(ptr, len) };
                fence();
                Ok(())
            }
            PersistMethod::Msync => {
                if len == 0 {
                    return Ok(());
                }
                let page = page_size();
                let start = ptr as usize & !(page - 1);
                let end = (ptr as usize + len).div_ceil(page) * page;
                // SAFETY: [start, end) is the caller's range rounded out to whole pages, all of
                // which belong to the caller's mapping (mappings are page-granular).
                let rc =
                    unsafe { libc::msync(start as *mut libc::c_void, end - start, libc::MS_SYNC) };
                if rc != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            }
        }
    }

    /// True when a flush must be followed by msync rather than relying on cache write-backs.
    pub fn is_msync(self) -> bool {
        self == PersistMethod::Msync
    }
}

/// The system page size (cached).
pub fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if v > 0 {
            v as usize
        } else {
            4096
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_match_proc_cpuinfo() {
        let info = std::fs::read_to_string("/proc/cpuinfo").expect("read /proc/cpuinfo");
        let flags: Vec<&str> = info
            .lines()
            .find(|l| l.starts_with("flags"))
            .expect("flags line")
            .split_whitespace()
            .collect();
        let f = cpu_features();
        assert_eq!(f.clwb, flags.contains(&"clwb"));
        assert_eq!(f.clflushopt, flags.contains(&"clflushopt"));
        assert_eq!(f.avx2, flags.contains(&"avx2"));
        assert_eq!(f.avx512f, flags.contains(&"avx512f"));
    }

    #[test]
    fn nt_copy_large_unaligned_is_exact() {
        let src: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut dst = vec![0u8; 100_100];
        for shift in [0usize, 1, 31, 63] {
            dst.iter_mut().for_each(|b| *b = 0xEE);
            nt_copy_slice(&mut dst[shift..], &src[5..]);
            assert_eq!(&dst[shift..shift + src.len() - 5], &src[5..]);
            assert!(dst[..shift].iter().all(|&b| b == 0xEE), "wrote before dst");
            assert!(
                dst[shift + src.len() - 5..].iter().all(|&b| b == 0xEE),
                "wrote past end"
            );
        }
    }

    #[test]
    fn sse2_path_is_exact() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i ^ 0x5a) as u8).collect();
        let mut dst = crate::ssd::AlignedBuf::new(4096, 64).unwrap();
        // SAFETY: dst is 64-aligned, 4096 bytes, distinct from src.
        unsafe { stream_sse2(dst.as_mut_ptr(), src.as_ptr(), 4096) };
        fence();
        assert_eq!(&dst[..], &src[..]);
    }

    #[test]
    fn msync_persist_on_anonymous_shared_mapping_is_reported() {
        // msync on a MAP_SHARED anonymous mapping succeeds; on an unmapped range it fails with
        // ENOMEM, which persist must surface rather than swallow.
        let page = page_size();
        // SAFETY: plain anonymous mapping, checked for MAP_FAILED below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: p is a live 2-page mapping.
        unsafe { PersistMethod::Msync.persist((p as *const u8).add(10), 100) }.unwrap();
        // SAFETY: unmapping the second page we own; afterwards only msync (not clwb) touches it.
        unsafe { libc::munmap((p as *mut u8).add(page) as *mut _, page) };
        // SAFETY: msync on an unmapped range is defined to fail with ENOMEM, not fault.
        let e = unsafe { PersistMethod::Msync.persist((p as *const u8).add(page), 8) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOMEM));
        // SAFETY: unmapping the remaining page we own.
        unsafe { libc::munmap(p, page) };
    }
}
