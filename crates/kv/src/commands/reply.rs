//! RESP2 reply encoding (private helpers of the command layer; the lead may switch them to the
//! encoders of `crate::resp`), and the output budget of the request being executed.
//!
//! # Output budget
//!
//! [`Service::execute`](crate::server::Service::execute) receives a limit on its output
//! (`client-output-buffer-limit`). The command layer arms [`Budget`] before each request with
//! the room left; [`bulk`] (every value, member, field and INFO text goes through it) charges
//! its size before copying and, when it does not fit, copies nothing and marks the request
//! over budget. The command layer then drops the request's partial reply and stops the batch.
//! The budget is thread-local so the data-structure code needs no extra argument; it is armed
//! only while a request executes (a [`Budget`] guard disarms it).

use std::cell::Cell;

thread_local! {
    /// Bytes the request being executed on this thread may still add (`usize::MAX`: no limit).
    static ROOM: Cell<usize> = const { Cell::new(usize::MAX) };
    /// A reply of that request did not fit and was not copied.
    static OVER: Cell<bool> = const { Cell::new(false) };
}

/// The output budget of this thread while a batch executes; disarmed when dropped.
pub(crate) struct Budget(());

impl Budget {
    /// Start a batch (no limit until [`Budget::arm`]).
    pub fn new() -> Budget {
        ROOM.set(usize::MAX);
        OVER.set(false);
        Budget(())
    }

    /// The next request may add `room` bytes of replies.
    pub fn arm(&self, room: usize) {
        ROOM.set(room);
        OVER.set(false);
    }

    /// Whether a reply of the armed request did not fit (and was not copied).
    pub fn over(&self) -> bool {
        OVER.get()
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        ROOM.set(usize::MAX);
        OVER.set(false);
    }
}

/// Charge `n` bytes of reply to the armed budget: false (the request is marked over budget)
/// when they do not fit.
#[inline]
fn charge(n: usize) -> bool {
    let room = ROOM.get();
    if n <= room {
        ROOM.set(room - n);
        true
    } else {
        OVER.set(true);
        false
    }
}

/// `+OK`.
#[inline]
pub fn ok(out: &mut Vec<u8>) {
    out.extend_from_slice(b"+OK\r\n");
}

/// A simple string (`+s`); `s` must not contain CR or LF.
#[inline]
pub fn simple(out: &mut Vec<u8>, s: &str) {
    out.push(b'+');
    out.extend_from_slice(s.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// An error (`-msg`); `msg` starts with its code (`ERR ...`, `WRONGTYPE ...`). CR and LF are
/// replaced by spaces, as Redis does.
pub fn error(out: &mut Vec<u8>, msg: &str) {
    out.push(b'-');
    out.extend(
        msg.bytes()
            .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
}

/// `-WRONGTYPE ...`.
pub fn wrongtype(out: &mut Vec<u8>) {
    out.extend_from_slice(
        b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
    );
}

/// `-ERR value is not an integer or out of range`.
pub fn not_int(out: &mut Vec<u8>) {
    out.extend_from_slice(b"-ERR value is not an integer or out of range\r\n");
}

/// `-ERR syntax error`.
pub fn syntax(out: &mut Vec<u8>) {
    out.extend_from_slice(b"-ERR syntax error\r\n");
}

/// Append the decimal digits of `v`.
#[inline]
pub fn push_int(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    push_uint(out, v.unsigned_abs());
}

/// Append the decimal digits of `v`.
#[inline]
pub fn push_uint(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// An integer (`:n`).
#[inline]
pub fn int(out: &mut Vec<u8>, v: i64) {
    out.push(b':');
    push_int(out, v);
    out.extend_from_slice(b"\r\n");
}

/// A bulk string; nothing when it does not fit the output budget (see the module's
/// documentation).
#[inline]
pub fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    // `$<len>\r\n<bytes>\r\n`: the bytes, the length's digits and 5.
    let digits = b.len().checked_ilog10().unwrap_or(0) as usize + 1;
    if !charge(b.len().saturating_add(digits + 5)) {
        return;
    }
    out.reserve(b.len() + 16);
    out.push(b'$');
    push_uint(out, b.len() as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

/// The null bulk string (`$-1`).
#[inline]
pub fn null(out: &mut Vec<u8>) {
    out.extend_from_slice(b"$-1\r\n");
}

/// The null array (`*-1`).
#[inline]
pub fn null_array(out: &mut Vec<u8>) {
    out.extend_from_slice(b"*-1\r\n");
}

/// An array header of `n` elements.
#[inline]
pub fn array(out: &mut Vec<u8>, n: usize) {
    out.push(b'*');
    push_uint(out, n as u64);
    out.extend_from_slice(b"\r\n");
}

/// A double as Redis formats it (shortest round-trip form, `inf` / `-inf`, exponent form for
/// very large or small magnitudes).
pub fn fmt_double(d: f64) -> String {
    if d.is_infinite() {
        return if d > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if d == 0.0 {
        return if d.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    let a = d.abs();
    if !(1e-5..1e21).contains(&a) {
        // Rust writes `1e21`; Redis (fpconv / %.17g) writes `1e+21`.
        let s = format!("{d:e}");
        match s.find('e') {
            Some(i) if !s[i + 1..].starts_with('-') => format!("{}e+{}", &s[..i], &s[i + 1..]),
            _ => s,
        }
    } else {
        format!("{d}")
    }
}

/// A double as a bulk string.
pub fn double(out: &mut Vec<u8>, d: f64) {
    bulk(out, fmt_double(d).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        let mut o = Vec::new();
        int(&mut o, -120);
        int(&mut o, 0);
        int(&mut o, i64::MIN);
        assert_eq!(o, b":-120\r\n:0\r\n:-9223372036854775808\r\n");
        assert_eq!(fmt_double(1.5), "1.5");
        assert_eq!(fmt_double(3.0), "3");
        assert_eq!(fmt_double(f64::NEG_INFINITY), "-inf");
        assert_eq!(fmt_double(1e21), "1e+21");
        assert_eq!(fmt_double(1.5e-7), "1.5e-7");
        assert_eq!(fmt_double(0.1), "0.1");
    }
}
