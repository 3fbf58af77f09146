//! Owns the call into `csrc/ldfloat.c`: Redis's `long double` addition and printing for
//! INCRBYFLOAT and HINCRBYFLOAT (see the C file for why it is C).

use std::os::raw::{c_char, c_int};

extern "C" {
    fn tiermem_kv_ld_add(
        cur: *const c_char,
        curlen: usize,
        by: *const c_char,
        bylen: usize,
        out: *mut c_char,
        outlen: usize,
    ) -> c_int;
}

/// Room for any `long double` Redis prints (its MAX_LONG_DOUBLE_CHARS).
const OUT: usize = 5 * 1024;

/// What [`add`] gives.
#[derive(Debug, PartialEq, Eq)]
pub enum LdSum {
    /// The sum as Redis prints it.
    Sum(Vec<u8>),
    /// The current value is not a float Redis reads.
    BadCurrent,
    /// The increment is not a float Redis reads.
    BadIncrement,
    /// The sum is NaN or infinite.
    NotFinite,
}

/// `cur + by` in `long double`, both parsed as Redis 7.0 parses floats, the sum printed as
/// Redis prints it (`%.17Lf` without trailing zeros).
pub fn add(cur: &[u8], by: &[u8]) -> LdSum {
    let mut out = vec![0u8; OUT];
    // SAFETY: the inputs are read within their lengths (the C side copies them into buffers of
    // its own, refusing what does not fit); `out` has OUT writable bytes.
    let n = unsafe {
        tiermem_kv_ld_add(
            cur.as_ptr().cast(),
            cur.len(),
            by.as_ptr().cast(),
            by.len(),
            out.as_mut_ptr().cast(),
            out.len(),
        )
    };
    match n {
        -1 => LdSum::BadCurrent,
        -2 => LdSum::BadIncrement,
        n if n < 0 => LdSum::NotFinite,
        n => {
            out.truncate(n as usize);
            LdSum::Sum(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_print_as_redis_prints_them() {
        let s = |a: &str, b: &str| match add(a.as_bytes(), b.as_bytes()) {
            LdSum::Sum(v) => String::from_utf8(v).unwrap(),
            other => format!("{other:?}"),
        };
        assert_eq!(s("0.1", "0.2"), "0.3");
        assert_eq!(s("5000", "1.5e-5"), "5000.00001499999999988");
        assert_eq!(s("0", "10.50"), "10.5");
        assert_eq!(s("1", "-1"), "0");
        assert_eq!(s("-0.5", "0.5"), "0");
        assert_eq!(s("0", "1e30"), "1000000000000000000024696061952");
        assert_eq!(s("x", "1"), "BadCurrent");
        assert_eq!(s("1", " 1"), "BadIncrement");
        assert_eq!(s("1", ""), "BadIncrement");
        assert_eq!(s("1", "nan"), "BadIncrement");
        assert_eq!(s("1", "inf"), "NotFinite");
        assert_eq!(s("1", "1e5000"), "BadIncrement");
    }
}
