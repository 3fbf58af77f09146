//! RESP2 reply encoding (private helpers of the command layer; the lead may switch them to the
//! encoders of `crate::resp`).

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

/// A bulk string.
#[inline]
pub fn bulk(out: &mut Vec<u8>, b: &[u8]) {
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
