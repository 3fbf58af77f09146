//! RESP2: request parsing (multibulk and inline) and reply encoding.
//!
//! # Requests
//!
//! [`RequestParser`] turns the bytes a client sent into requests, each a list of arguments that
//! point into the read buffer (no copy). It is incremental: it parses every complete request of
//! the buffer, reports how many bytes they used ([`Parsed::consumed`]) and remembers how far it got
//! into the unfinished request at the end, so a frame that arrives a byte at a time costs linear,
//! not quadratic, work. It is bounded by [`Limits`]: a bulk length above
//! [`Limits::max_bulk_len`] is rejected when its `$len` line arrives, before the data; an
//! argument count above [`Limits::max_multibulk_len`] when its `*N` line arrives; a line (inline
//! request, or a `*`/`$` header) longer than [`Limits::max_inline_len`] as soon as that many bytes
//! are buffered without its end. Requests are flat: an array inside a request is the protocol
//! error `expected '$', got '*'`, so nesting depth is 1 by construction.
//!
//! Both request forms follow Redis (`networking.c`, `processMultibulkBuffer` and
//! `processInlineBuffer`), including its error strings ([`ProtocolError`]) and its quirks:
//! a request starting with `*` is multibulk, anything else is an inline line split like
//! `sdssplitargs` does (blanks separate arguments, `"..."` with `\n \r \t \b \a \\ \" \xHH`
//! escapes, `'...'` with `\'`; a quoted argument must be followed by a blank or the end of the
//! line; a NUL byte ends the line), `*0` and `*-1` and blank lines are skipped, and the two bytes
//! after bulk data are skipped without being checked. After a protocol error Redis replies with
//! the error and closes the connection; the server does the same.
//!
//! # Replies
//!
//! Small functions appending one RESP2 value to a `Vec<u8>`: [`simple_string`], [`ok`],
//! [`error`], [`integer`], [`bulk`], [`null_bulk`], [`array_len`], [`null_array`]. They build no
//! temporary values (integers are formatted with a digit-pair table, not `format!`).

use std::fmt;
use std::mem;

/// Default [`Limits::max_bulk_len`]: 64 MiB (Redis's `proto-max-bulk-len` is 512 MiB).
pub const DEFAULT_MAX_BULK_LEN: u64 = 64 << 20;
/// Default [`Limits::max_multibulk_len`]: 1,048,576 arguments per request.
pub const DEFAULT_MAX_MULTIBULK_LEN: u64 = 1 << 20;
/// Default [`Limits::max_inline_len`]: 64 KiB, Redis's `PROTO_INLINE_MAX_SIZE`.
pub const DEFAULT_MAX_INLINE_LEN: usize = 64 << 10;

/// The bounds a [`RequestParser`] enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest bulk argument, in bytes (`proto-max-bulk-len`); a larger `$len` is
    /// [`ProtocolError::InvalidBulkLength`].
    pub max_bulk_len: u64,
    /// Largest argument count of a multibulk request; a larger `*N` is
    /// [`ProtocolError::InvalidMultibulkLength`].
    pub max_multibulk_len: u64,
    /// Longest line, in bytes before its `\n` (inline requests) or `\r` (`*N` and `$len` header
    /// lines); longer is [`ProtocolError::TooBigInline`] or one of the "too big count string"
    /// errors.
    pub max_inline_len: usize,
}

impl Default for Limits {
    /// 64 MiB bulks, 1,048,576 arguments, 64 KiB lines.
    fn default() -> Self {
        Limits {
            max_bulk_len: DEFAULT_MAX_BULK_LEN,
            max_multibulk_len: DEFAULT_MAX_MULTIBULK_LEN,
            max_inline_len: DEFAULT_MAX_INLINE_LEN,
        }
    }
}

/// A malformed request. [`ProtocolError::write_reply`] writes Redis's exact error reply; the
/// connection must then be closed (the parser's state is reset and the rest of the input is
/// meaningless).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// `*N` with N not an integer, or above [`Limits::max_multibulk_len`].
    InvalidMultibulkLength,
    /// `$len` with len not an integer, negative, or above [`Limits::max_bulk_len`].
    InvalidBulkLength,
    /// An argument of a multibulk request does not start with `$` (the byte it starts with;
    /// `*` for a nested array).
    ExpectedDollar(u8),
    /// A `*N` line longer than [`Limits::max_inline_len`].
    TooBigMultibulkCount,
    /// A `$len` line longer than [`Limits::max_inline_len`].
    TooBigBulkCount,
    /// An inline request line longer than [`Limits::max_inline_len`].
    TooBigInline,
    /// An inline request with an unterminated quote, or a closing quote not followed by a blank.
    UnbalancedQuotes,
}

impl ProtocolError {
    /// The text after `ERR ` of Redis's reply, except for [`ProtocolError::ExpectedDollar`]
    /// whose byte is not included (see [`ProtocolError::write_reply`]).
    fn text(self) -> &'static str {
        match self {
            ProtocolError::InvalidMultibulkLength => "Protocol error: invalid multibulk length",
            ProtocolError::InvalidBulkLength => "Protocol error: invalid bulk length",
            ProtocolError::ExpectedDollar(_) => "Protocol error: expected '$', got '",
            ProtocolError::TooBigMultibulkCount => "Protocol error: too big mbulk count string",
            ProtocolError::TooBigBulkCount => "Protocol error: too big bulk count string",
            ProtocolError::TooBigInline => "Protocol error: too big inline request",
            ProtocolError::UnbalancedQuotes => "Protocol error: unbalanced quotes in request",
        }
    }

    /// Appends Redis's reply for this error, e.g. `-ERR Protocol error: invalid bulk
    /// length\r\n`. The byte of `expected '$', got 'x'` is sent raw, except that `\r` and `\n`
    /// become a space (as Redis's `addReplyErrorFormat` does, so the reply stays one line).
    pub fn write_reply(self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"-ERR ");
        out.extend_from_slice(self.text().as_bytes());
        if let ProtocolError::ExpectedDollar(b) = self {
            out.push(if b == b'\r' || b == b'\n' { b' ' } else { b });
            out.push(b'\'');
        }
        out.extend_from_slice(b"\r\n");
    }
}

impl fmt::Display for ProtocolError {
    /// The reply's text without `-ERR ` (a non-printable byte of `ExpectedDollar` escaped).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())?;
        if let ProtocolError::ExpectedDollar(b) = *self {
            write!(f, "{}'", std::ascii::escape_default(b))?;
        }
        Ok(())
    }
}

impl std::error::Error for ProtocolError {}

/// What one [`RequestParser::parse`] call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// Bytes at the start of the buffer used by the complete requests (and skipped empty ones)
    /// before any error; the caller drops them before the next call. Always ≤ the buffer length.
    pub consumed: usize,
    /// The protocol error that stopped parsing, after the requests that preceded it.
    pub error: Option<ProtocolError>,
}

/// Progress inside the unfinished request at the start of the buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// At a request boundary.
    #[default]
    Start,
    /// An inline line: no `\n` in `buf[..scanned]`.
    Inline { scanned: usize },
    /// A `*N` line: no `\r` in `buf[1..scanned]` (or the `\r` at `scanned` lacks its next byte).
    Count { scanned: usize },
    /// The arguments of a multibulk request: `left` still to read; the next one's `$len` line
    /// (`bulk == None`, no `\r` in `buf[pos..scanned]`) or data (`bulk == Some(len)`) at `pos`.
    Args {
        left: u64,
        pos: usize,
        bulk: Option<usize>,
        scanned: usize,
    },
}

/// The result of advancing over the request at the start of a buffer.
enum Step {
    /// More bytes are needed (progress saved in the parser).
    Incomplete,
    /// A request without arguments (`*0`, `*-1`) of this many bytes.
    Skip(usize),
    /// A multibulk request of this many bytes; its arguments are in `RequestParser::args`.
    Multibulk(usize),
    /// An inline request of `frame` bytes whose line (without `\r\n`/`\n`) is `line` bytes.
    Inline { frame: usize, line: usize },
    /// A protocol error.
    Error(ProtocolError),
}

/// An incremental RESP2 request parser for one connection (see the module documentation).
///
/// Contract: each [`RequestParser::parse`] call is given the bytes the previous call did not
/// consume, possibly followed by more; the parser keeps offsets into them. Call
/// [`RequestParser::reset`] to start over on unrelated input.
#[derive(Debug, Default)]
pub struct RequestParser {
    state: State,
    /// The (offset, length) of each argument of the current multibulk request read so far, or
    /// of the arguments of the inline line being split.
    args: Vec<(usize, usize)>,
}

/// Arguments capacity reserved up front for a `*N` request (as Redis caps its `argv`
/// preallocation): a client announcing a million arguments gets memory only as they arrive.
const ARGS_PREALLOC: u64 = 1024;

impl RequestParser {
    /// A parser at a request boundary.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets the unfinished request (after an error, or to reuse the parser on a new stream).
    pub fn reset(&mut self) {
        self.state = State::Start;
        self.args.clear();
        if self.args.capacity() > 4 * ARGS_PREALLOC as usize {
            self.args = Vec::new();
        }
    }

    /// True when the parser is inside a request (some of its bytes were seen).
    pub fn in_request(&self) -> bool {
        self.state != State::Start
    }

    /// While the parser waits for the data of a bulk argument: how many more bytes (beyond the
    /// `buffered` bytes the next call's buffer will start with) complete it, with its `\r\n`.
    /// A reader can reserve that much (bounded by [`Limits::max_bulk_len`] + 2) to read the
    /// argument with few reallocations. `None` otherwise.
    pub fn bulk_remaining(&self, buffered: usize) -> Option<usize> {
        match self.state {
            State::Args {
                pos,
                bulk: Some(len),
                ..
            } => Some((pos + len + 2).saturating_sub(buffered)),
            _ => None,
        }
    }

    /// Parses every complete request at the start of `buf`, appending each (its arguments,
    /// never empty) to `requests`, with argument vectors taken from `pool`. Stops at the first
    /// unfinished request (its progress is kept for the next call) or at a protocol error
    /// (returned after the requests that preceded it; the parser is reset).
    ///
    /// `buf` is mutable because inline arguments are unescaped in place (an unescaped
    /// argument is never longer than its quoted form); multibulk requests are not modified.
    /// Argument slices point into `buf`.
    pub fn parse<'a>(
        &mut self,
        limits: &Limits,
        buf: &'a mut [u8],
        requests: &mut Vec<Vec<&'a [u8]>>,
        pool: &mut VecPool,
    ) -> Parsed {
        let mut rest: &'a mut [u8] = buf;
        let mut consumed = 0;
        while !rest.is_empty() {
            match self.step(limits, rest) {
                Step::Incomplete => break,
                Step::Error(e) => {
                    self.reset();
                    return Parsed {
                        consumed,
                        error: Some(e),
                    };
                }
                Step::Skip(n) => {
                    rest = &mut mem::take(&mut rest)[n..];
                    consumed += n;
                }
                Step::Multibulk(n) => {
                    let (frame, tail) = mem::take(&mut rest).split_at_mut(n);
                    rest = tail;
                    consumed += n;
                    let frame: &'a [u8] = frame;
                    requests.push(self.take_args(frame, pool));
                }
                Step::Inline { frame: n, line } => {
                    let (frame, tail) = mem::take(&mut rest).split_at_mut(n);
                    rest = tail;
                    self.args.clear();
                    if split_in_place(&mut frame[..line], &mut self.args).is_err() {
                        self.reset();
                        return Parsed {
                            consumed,
                            error: Some(ProtocolError::UnbalancedQuotes),
                        };
                    }
                    consumed += n;
                    if !self.args.is_empty() {
                        let frame: &'a [u8] = frame;
                        requests.push(self.take_args(frame, pool));
                    }
                }
            }
        }
        Parsed {
            consumed,
            error: None,
        }
    }

    /// The slices of `self.args` in `frame`, in a pooled vector; clears `self.args`.
    fn take_args<'a>(&mut self, frame: &'a [u8], pool: &mut VecPool) -> Vec<&'a [u8]> {
        // Every (start, len) in `args` was found inside `frame` by `step`/`split_in_place`.
        let mut v = pool.args();
        v.extend(self.args.iter().map(|&(s, l)| &frame[s..s + l]));
        self.args.clear();
        if self.args.capacity() > 4 * ARGS_PREALLOC as usize {
            self.args = Vec::new();
        }
        v
    }

    /// Advances over the request at the start of `buf` (non-empty).
    fn step(&mut self, limits: &Limits, buf: &[u8]) -> Step {
        let max_line = limits.max_inline_len;
        loop {
            match self.state {
                State::Start => {
                    self.state = if buf[0] == b'*' {
                        State::Count { scanned: 1 }
                    } else {
                        State::Inline { scanned: 0 }
                    };
                }
                State::Inline { scanned } => {
                    // A line longer than the limit is an error whether or not its `\n` has
                    // arrived, so the result does not depend on how the input was split.
                    return match find(b'\n', buf, scanned) {
                        None => {
                            if buf.len() > max_line {
                                return Step::Error(ProtocolError::TooBigInline);
                            }
                            self.state = State::Inline { scanned: buf.len() };
                            Step::Incomplete
                        }
                        Some(nl) if nl > max_line => Step::Error(ProtocolError::TooBigInline),
                        Some(nl) => {
                            self.state = State::Start;
                            let line = if nl > 0 && buf[nl - 1] == b'\r' {
                                nl - 1
                            } else {
                                nl
                            };
                            Step::Inline {
                                frame: nl + 1,
                                line,
                            }
                        }
                    };
                }
                State::Count { scanned } => {
                    let cr = match find(b'\r', buf, scanned) {
                        None if buf.len() > max_line => {
                            return Step::Error(ProtocolError::TooBigMultibulkCount)
                        }
                        None => {
                            self.state = State::Count { scanned: buf.len() };
                            return Step::Incomplete;
                        }
                        Some(cr) if cr > max_line => {
                            return Step::Error(ProtocolError::TooBigMultibulkCount)
                        }
                        Some(cr) => cr,
                    };
                    // Redis wants the byte after `\r` present and skips it unchecked.
                    if cr + 1 >= buf.len() {
                        self.state = State::Count { scanned: cr };
                        return Step::Incomplete;
                    }
                    // `cr >= scanned >= 1` (the `*` is at 0).
                    let n = match parse_i64(&buf[1..cr]) {
                        Some(n) if n <= 0 => {
                            self.state = State::Start;
                            return Step::Skip(cr + 2);
                        }
                        Some(n) if n as u64 <= limits.max_multibulk_len => n as u64,
                        _ => return Step::Error(ProtocolError::InvalidMultibulkLength),
                    };
                    self.args.clear();
                    self.args.reserve(n.min(ARGS_PREALLOC) as usize);
                    self.state = State::Args {
                        left: n,
                        pos: cr + 2,
                        bulk: None,
                        scanned: cr + 2,
                    };
                }
                State::Args {
                    mut left,
                    mut pos,
                    mut bulk,
                    mut scanned,
                } => {
                    let step = loop {
                        if left == 0 {
                            break Step::Multibulk(pos);
                        }
                        match bulk {
                            None => {
                                let cr = match find(b'\r', buf, scanned) {
                                    None if buf.len() - pos > max_line => {
                                        break Step::Error(ProtocolError::TooBigBulkCount)
                                    }
                                    None => {
                                        scanned = buf.len();
                                        break Step::Incomplete;
                                    }
                                    Some(cr) if cr - pos > max_line => {
                                        break Step::Error(ProtocolError::TooBigBulkCount)
                                    }
                                    Some(cr) => cr,
                                };
                                if cr + 1 >= buf.len() {
                                    scanned = cr;
                                    break Step::Incomplete;
                                }
                                // `pos <= scanned <= cr < buf.len()`; and `cr > pos` once
                                // `buf[pos]` is `$`, so `pos + 1..cr` is a range.
                                if buf[pos] != b'$' {
                                    break Step::Error(ProtocolError::ExpectedDollar(buf[pos]));
                                }
                                match parse_i64(&buf[pos + 1..cr]) {
                                    Some(len) if len >= 0 && len as u64 <= limits.max_bulk_len => {
                                        match usize::try_from(len) {
                                            Ok(len) if len < usize::MAX - 2 => bulk = Some(len),
                                            _ => {
                                                break Step::Error(ProtocolError::InvalidBulkLength)
                                            }
                                        }
                                    }
                                    _ => break Step::Error(ProtocolError::InvalidBulkLength),
                                }
                                pos = cr + 2;
                            }
                            Some(len) => {
                                if buf.len() - pos < len + 2 {
                                    break Step::Incomplete;
                                }
                                self.args.push((pos, len));
                                pos += len + 2;
                                left -= 1;
                                bulk = None;
                                scanned = pos;
                            }
                        }
                    };
                    self.state = match step {
                        Step::Incomplete => State::Args {
                            left,
                            pos,
                            bulk,
                            scanned,
                        },
                        _ => State::Start,
                    };
                    return step;
                }
            }
        }
    }
}

/// The position of the first `b` in `buf[from..]`, as an index of `buf`.
#[inline]
fn find(b: u8, buf: &[u8], from: usize) -> Option<usize> {
    // `from <= buf.len()` by the parser's invariants; `get` makes a broken one "not found"
    // rather than a panic.
    buf.get(from..)?
        .iter()
        .position(|&x| x == b)
        .map(|i| from + i)
}

/// Redis's `string2ll`: an optional `-`, then digits without a leading zero (or just `0`),
/// no `+`, no blanks, no overflow.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    if s == b"0" {
        return Some(0);
    }
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    let mut v: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if neg {
        if v > i64::MAX as u64 + 1 {
            None
        } else {
            Some((v as i64).wrapping_neg())
        }
    } else {
        i64::try_from(v).ok()
    }
}

/// C's `isspace` in the "C" locale.
#[inline]
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

#[inline]
fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Redis's `sdssplitargs` over `line`, unescaping in place: each argument's bytes are written
/// at or before where they were read, and its (offset, length) pushed to `args`. The end of
/// `line` and a NUL byte both end the line (Redis splits a C string). Err on unbalanced quotes.
fn split_in_place(line: &mut [u8], args: &mut Vec<(usize, usize)>) -> Result<(), ()> {
    let n = line.len();
    // The byte at `i`, or NUL past the end: the C string view.
    let at = |line: &[u8], i: usize| if i < n { line[i] } else { 0 };
    // Indexing: a byte is written only when the byte read is not NUL, i.e. `p < n`, at
    // `w <= p`; `line[p]` after `p += 1` follows a check that `at(line, p + 1)` is not NUL.
    let mut p = 0; // read position
    let mut w = 0; // write position, always <= p
    loop {
        while at(line, p) != 0 && is_space(at(line, p)) {
            p += 1;
        }
        if at(line, p) == 0 {
            return Ok(());
        }
        let start = w;
        let (mut inq, mut insq) = (false, false);
        loop {
            let c = at(line, p);
            if inq {
                if c == b'\\' && at(line, p + 1) == b'x' {
                    if let (Some(h), Some(l)) =
                        (hex_value(at(line, p + 2)), hex_value(at(line, p + 3)))
                    {
                        line[w] = h * 16 + l;
                        w += 1;
                        p += 4;
                        continue;
                    }
                }
                if c == b'\\' && at(line, p + 1) != 0 {
                    p += 1;
                    line[w] = match line[p] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 0x08,
                        b'a' => 0x07,
                        other => other,
                    };
                    w += 1;
                } else if c == b'"' {
                    // A closing quote must be followed by a blank or the end.
                    if at(line, p + 1) != 0 && !is_space(at(line, p + 1)) {
                        return Err(());
                    }
                    p += 1;
                    break;
                } else if c == 0 {
                    return Err(());
                } else {
                    line[w] = c;
                    w += 1;
                }
            } else if insq {
                if c == b'\\' && at(line, p + 1) == b'\'' {
                    p += 1;
                    line[w] = b'\'';
                    w += 1;
                } else if c == b'\'' {
                    if at(line, p + 1) != 0 && !is_space(at(line, p + 1)) {
                        return Err(());
                    }
                    p += 1;
                    break;
                } else if c == 0 {
                    return Err(());
                } else {
                    line[w] = c;
                    w += 1;
                }
            } else {
                match c {
                    b' ' | b'\n' | b'\r' | b'\t' => {
                        p += 1;
                        break;
                    }
                    0 => break,
                    b'"' => inq = true,
                    b'\'' => insq = true,
                    _ => {
                        line[w] = c;
                        w += 1;
                    }
                }
            }
            p += 1;
        }
        args.push((start, w - start));
    }
}

/// Splits one line the way Redis splits an inline request or a `redis.conf` line
/// (`sdssplitargs`: blanks, `"..."` with escapes, `'...'`). Err on unbalanced quotes.
pub fn split_args(line: &[u8]) -> Result<Vec<Vec<u8>>, ProtocolError> {
    let mut copy = line.to_vec();
    let mut ranges = Vec::new();
    split_in_place(&mut copy, &mut ranges).map_err(|()| ProtocolError::UnbalancedQuotes)?;
    Ok(ranges
        .into_iter()
        .map(|(s, l)| copy[s..s + l].to_vec())
        .collect())
}

/// Turns an empty vector of one element type into an empty vector of another with the same
/// layout, keeping its allocation (std collects a `vec::IntoIter` + `map` in place). Used to
/// reuse request vectors whose argument slices borrow a different read buffer each time.
fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    // `v` is empty: the closure is never called.
    v.into_iter().map(|_| -> U { unreachable!() }).collect()
}

/// Empty request and argument vectors kept across reads so that parsing a batch allocates
/// nothing in the steady state. The vectors are stored empty, so the `'static` lifetime of their
/// element type is never used for a real reference.
#[derive(Debug, Default)]
pub struct VecPool {
    outer: Vec<Vec<&'static [u8]>>,
    inner: Vec<Vec<&'static [u8]>>,
}

/// At most this many argument vectors are pooled, ...
const POOL_MAX_VECS: usize = 1024;
/// ... each with at most this capacity.
const POOL_MAX_ARGS: usize = 256;

impl VecPool {
    /// A new, empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty vector of requests (with the capacity of the last one given back).
    pub fn requests<'a>(&mut self) -> Vec<Vec<&'a [u8]>> {
        recycle(mem::take(&mut self.outer))
    }

    /// An empty argument vector.
    pub fn args<'a>(&mut self) -> Vec<&'a [u8]> {
        self.inner.pop().map(recycle).unwrap_or_default()
    }

    /// Takes back a vector of requests (from [`VecPool::requests`]) and its argument vectors.
    pub fn give_back(&mut self, mut requests: Vec<Vec<&[u8]>>) {
        for v in requests.drain(..) {
            if self.inner.len() < POOL_MAX_VECS && v.capacity() <= POOL_MAX_ARGS {
                self.inner.push(recycle(v));
            }
        }
        if requests.capacity() <= POOL_MAX_VECS * 16 {
            self.outer = recycle(requests);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reply encoding.

/// Two ASCII digits for each of 0..100.
const DIGIT_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Appends the decimal digits of `v`.
#[inline]
pub fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    while v >= 100 {
        let d = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[d..d + 2]);
    }
    if v >= 10 {
        let d = v as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[d..d + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + v as u8;
    }
    out.extend_from_slice(&buf[i..]);
}

/// Appends the decimal form of `v` (with `-` when negative).
#[inline]
pub fn push_i64(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    push_u64(out, v.unsigned_abs());
}

/// Appends `\r\n`.
#[inline]
fn crlf(out: &mut Vec<u8>) {
    out.extend_from_slice(b"\r\n");
}

/// Appends `s` with `\r` and `\n` replaced by spaces (a simple string or error is one line).
#[inline]
fn push_line(out: &mut Vec<u8>, s: &[u8]) {
    if s.iter().any(|&b| b == b'\r' || b == b'\n') {
        out.extend(
            s.iter()
                .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
    } else {
        out.extend_from_slice(s);
    }
}

/// Appends a simple string `+s\r\n` (`\r`/`\n` in `s` become spaces).
#[inline]
pub fn simple_string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'+');
    push_line(out, s);
    crlf(out);
}

/// Appends `+OK\r\n`.
#[inline]
pub fn ok(out: &mut Vec<u8>) {
    out.extend_from_slice(b"+OK\r\n");
}

/// Appends an error `-msg\r\n`. `msg` starts with the error code, e.g. `ERR unknown command` or
/// `WRONGTYPE Operation against a key holding the wrong kind of value`; `\r`/`\n` in it become
/// spaces.
#[inline]
pub fn error(out: &mut Vec<u8>, msg: &[u8]) {
    out.push(b'-');
    push_line(out, msg);
    crlf(out);
}

/// Appends an integer `:v\r\n`.
#[inline]
pub fn integer(out: &mut Vec<u8>, v: i64) {
    out.push(b':');
    push_i64(out, v);
    crlf(out);
}

/// Appends a bulk string `$len\r\ndata\r\n`.
#[inline]
pub fn bulk(out: &mut Vec<u8>, data: &[u8]) {
    out.reserve(data.len() + 16);
    out.push(b'$');
    push_u64(out, data.len() as u64);
    crlf(out);
    out.extend_from_slice(data);
    crlf(out);
}

/// Appends the null bulk string `$-1\r\n` (a missing value, e.g. GET of an absent key).
#[inline]
pub fn null_bulk(out: &mut Vec<u8>) {
    out.extend_from_slice(b"$-1\r\n");
}

/// Appends an array header `*n\r\n`; the caller then appends the `n` elements.
#[inline]
pub fn array_len(out: &mut Vec<u8>, n: usize) {
    out.push(b'*');
    push_u64(out, n as u64);
    crlf(out);
}

/// Appends the null array `*-1\r\n` (e.g. a timed-out blocking pop, an aborted EXEC).
#[inline]
pub fn null_array(out: &mut Vec<u8>) {
    out.extend_from_slice(b"*-1\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `input` in one call; returns the requests (owned), consumed, error.
    fn parse_whole(
        limits: &Limits,
        input: &[u8],
    ) -> (Vec<Vec<Vec<u8>>>, usize, Option<ProtocolError>) {
        let mut buf = input.to_vec();
        let mut p = RequestParser::new();
        let mut pool = VecPool::new();
        let mut reqs = pool.requests();
        let r = p.parse(limits, &mut buf, &mut reqs, &mut pool);
        let owned = reqs
            .iter()
            .map(|r| r.iter().map(|a| a.to_vec()).collect())
            .collect();
        (owned, r.consumed, r.error)
    }

    /// Feeds `input` in the given chunk sizes (a server's reads): the buffer keeps the
    /// unconsumed tail and gets the next chunk appended. Returns all requests, the bytes left
    /// unconsumed and the error.
    fn parse_chunks(
        limits: &Limits,
        input: &[u8],
        cuts: &[usize],
    ) -> (Vec<Vec<Vec<u8>>>, usize, Option<ProtocolError>) {
        let mut p = RequestParser::new();
        let mut pool = VecPool::new();
        let mut buf: Vec<u8> = Vec::new();
        let mut all = Vec::new();
        let mut fed = 0;
        let mut points: Vec<usize> = cuts.iter().copied().filter(|&c| c < input.len()).collect();
        points.sort_unstable();
        points.push(input.len());
        for &end in &points {
            if end < fed {
                continue;
            }
            buf.extend_from_slice(&input[fed..end]);
            fed = end;
            let mut reqs = pool.requests();
            let r = p.parse(limits, &mut buf, &mut reqs, &mut pool);
            for q in &reqs {
                all.push(q.iter().map(|a| a.to_vec()).collect());
            }
            pool.give_back(reqs);
            if r.error.is_some() {
                return (all, 0, r.error);
            }
            buf.drain(..r.consumed);
        }
        (all, buf.len(), None)
    }

    fn req(args: &[&str]) -> Vec<Vec<u8>> {
        args.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    fn reply(e: ProtocolError) -> String {
        let mut out = Vec::new();
        e.write_reply(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn multibulk_and_inline_requests() {
        let l = Limits::default();
        let input = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\nPING\r\n*1\r\n$4\r\nPING\r\n";
        let (reqs, consumed, err) = parse_whole(&l, input);
        assert_eq!(err, None);
        assert_eq!(consumed, input.len());
        assert_eq!(
            reqs,
            vec![req(&["SET", "k", "hello"]), req(&["PING"]), req(&["PING"])]
        );
    }

    #[test]
    fn empty_requests_are_skipped() {
        let l = Limits::default();
        let input = b"*0\r\n*-1\r\n\r\n   \r\n\nPING\n*-5\r\n";
        let (reqs, consumed, err) = parse_whole(&l, input);
        assert_eq!(
            (reqs, consumed, err),
            (vec![req(&["PING"])], input.len(), None)
        );
    }

    #[test]
    fn binary_and_empty_bulks() {
        let l = Limits::default();
        let input = b"*3\r\n$0\r\n\r\n$4\r\n\r\n\0\x01\r\n$2\r\n*$\r\n";
        let (reqs, _, err) = parse_whole(&l, input);
        assert_eq!(err, None);
        assert_eq!(
            reqs,
            vec![vec![b"".to_vec(), b"\r\n\0\x01".to_vec(), b"*$".to_vec()]]
        );
    }

    #[test]
    fn every_error_string() {
        let l = Limits {
            max_bulk_len: 100,
            max_multibulk_len: 10,
            max_inline_len: 32,
        };
        let cases: &[(&[u8], ProtocolError, &str)] = &[
            (
                b"*x\r\n",
                ProtocolError::InvalidMultibulkLength,
                "-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"*\r\n",
                ProtocolError::InvalidMultibulkLength,
                "-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"*+1\r\n",
                ProtocolError::InvalidMultibulkLength,
                "-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"*01\r\n",
                ProtocolError::InvalidMultibulkLength,
                "-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"*11\r\n",
                ProtocolError::InvalidMultibulkLength,
                "-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"*99999999999999999999\r\n",
                ProtocolError::InvalidMultibulkLength,
                "-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"*1\r\n$x\r\n",
                ProtocolError::InvalidBulkLength,
                "-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"*1\r\n$-1\r\n",
                ProtocolError::InvalidBulkLength,
                "-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"*1\r\n$101\r\n",
                ProtocolError::InvalidBulkLength,
                "-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"*1\r\n$\r\n",
                ProtocolError::InvalidBulkLength,
                "-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"*1\r\nx3\r\n",
                ProtocolError::ExpectedDollar(b'x'),
                "-ERR Protocol error: expected '$', got 'x'\r\n",
            ),
            (
                b"*1\r\n*1\r\n$1\r\na\r\n",
                ProtocolError::ExpectedDollar(b'*'),
                "-ERR Protocol error: expected '$', got '*'\r\n",
            ),
            (
                b"*1\r\n\r\n",
                ProtocolError::ExpectedDollar(b'\r'),
                "-ERR Protocol error: expected '$', got ' '\r\n",
            ),
            (
                b"*1234567890123456789012345678901234567890",
                ProtocolError::TooBigMultibulkCount,
                "-ERR Protocol error: too big mbulk count string\r\n",
            ),
            (
                b"*1\r\n$1234567890123456789012345678901234567890",
                ProtocolError::TooBigBulkCount,
                "-ERR Protocol error: too big bulk count string\r\n",
            ),
            (
                b"PING 12345678901234567890123456789012345",
                ProtocolError::TooBigInline,
                "-ERR Protocol error: too big inline request\r\n",
            ),
            (
                b"PING 12345678901234567890123456789012345\r\n",
                ProtocolError::TooBigInline,
                "-ERR Protocol error: too big inline request\r\n",
            ),
            (
                b"SET \"a\r\n",
                ProtocolError::UnbalancedQuotes,
                "-ERR Protocol error: unbalanced quotes in request\r\n",
            ),
            (
                b"SET 'a\r\n",
                ProtocolError::UnbalancedQuotes,
                "-ERR Protocol error: unbalanced quotes in request\r\n",
            ),
            (
                b"SET \"a\"b\r\n",
                ProtocolError::UnbalancedQuotes,
                "-ERR Protocol error: unbalanced quotes in request\r\n",
            ),
        ];
        for (input, want, text) in cases {
            let (reqs, consumed, err) = parse_whole(&l, input);
            assert_eq!(err, Some(*want), "{:?}", String::from_utf8_lossy(input));
            assert!(reqs.is_empty());
            assert_eq!(consumed, 0);
            assert_eq!(reply(*want), *text);
        }
    }

    #[test]
    fn requests_before_an_error_are_returned() {
        let l = Limits::default();
        let input = b"PING\r\n*1\r\n$4\r\nECHO\r\n*1\r\n%4\r\n";
        let (reqs, consumed, err) = parse_whole(&l, input);
        assert_eq!(reqs, vec![req(&["PING"]), req(&["ECHO"])]);
        assert_eq!(consumed, 20);
        assert_eq!(err, Some(ProtocolError::ExpectedDollar(b'%')));
    }

    #[test]
    fn bulk_length_rejected_before_its_data() {
        let l = Limits::default();
        // Only the header line of a 1 GiB bulk: rejected on sight.
        let (_, _, err) = parse_whole(&l, b"*2\r\n$3\r\nGET\r\n$1073741824\r\n");
        assert_eq!(err, Some(ProtocolError::InvalidBulkLength));
        // At the limit it is accepted and waits for the data.
        let (reqs, consumed, err) = parse_whole(&l, b"*2\r\n$3\r\nGET\r\n$67108864\r\nabc");
        assert_eq!((reqs.len(), consumed, err), (0, 0, None));
    }

    #[test]
    fn huge_argument_count_allocates_as_arguments_arrive() {
        let l = Limits::default();
        let mut p = RequestParser::new();
        let mut pool = VecPool::new();
        let mut buf = b"*1048576\r\n$1\r\na\r\n".to_vec();
        let mut reqs = pool.requests();
        let r = p.parse(&l, &mut buf, &mut reqs, &mut pool);
        assert_eq!((r.consumed, r.error, reqs.len()), (0, None, 0));
        assert!(p.args.capacity() <= ARGS_PREALLOC as usize);
        let (_, _, err) = parse_whole(&l, b"*1048577\r\n");
        assert_eq!(err, Some(ProtocolError::InvalidMultibulkLength));
    }

    #[test]
    fn nested_arrays_are_rejected_at_any_depth() {
        let l = Limits::default();
        let mut deep = Vec::new();
        for _ in 0..10_000 {
            deep.extend_from_slice(b"*1\r\n");
        }
        let (_, _, err) = parse_whole(&l, &deep);
        assert_eq!(err, Some(ProtocolError::ExpectedDollar(b'*')));
    }

    #[test]
    fn inline_quotes_like_redis() {
        let l = Limits::default();
        let cases: &[(&[u8], &[&[u8]])] = &[
            (b"set k v\r\n", &[b"set", b"k", b"v"]),
            (b"  set\t k   v  \n", &[b"set", b"k", b"v"]),
            (
                b"set \"hello world\" x\r\n",
                &[b"set", b"hello world", b"x"],
            ),
            (
                b"set \"a\\nb\\r\\t\\b\\a\\\\\\\"\"\r\n",
                &[b"set", b"a\nb\r\t\x08\x07\\\""],
            ),
            // An invalid `\x` escape is an ordinary escape of `x` (the backslash is dropped).
            (b"set \"\\x41\\x7a\\xZZ\"\r\n", &[b"set", b"AzxZZ"]),
            (b"set 'it\\'s' '\\n'\r\n", &[b"set", b"it's", b"\\n"]),
            (b"set \"\" ''\r\n", &[b"set", b"", b""]),
            (b"foo\"bar baz\"\r\n", &[b"foobar baz"]),
            (b"a\x0bb c\r\n", &[b"a\x0bb", b"c"]),
            (b"a\rb\r\n", &[b"a", b"b"]),
            (b"get k\0 ignored \"\r\n", &[b"get", b"k"]),
        ];
        for (input, want) in cases {
            let (reqs, consumed, err) = parse_whole(&l, input);
            assert_eq!(err, None, "{:?}", String::from_utf8_lossy(input));
            assert_eq!(consumed, input.len());
            let want: Vec<Vec<u8>> = want.iter().map(|a| a.to_vec()).collect();
            assert_eq!(reqs, vec![want], "{:?}", String::from_utf8_lossy(input));
        }
        assert_eq!(
            split_args(b"save \"\"").unwrap(),
            vec![b"save".to_vec(), b"".to_vec()]
        );
        assert_eq!(
            split_args(b"x \"").unwrap_err(),
            ProtocolError::UnbalancedQuotes
        );
    }

    #[test]
    fn split_at_every_byte_position() {
        let l = Limits::default();
        let input: &[u8] = b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$10\r\n0123456789\r\nset \"a b\" 'c'\r\n*0\r\n*1\r\n$4\r\nPING\r\nGET k\n";
        let whole = parse_whole(&l, input);
        for cut in 0..=input.len() {
            assert_eq!(
                parse_chunks(&l, input, &[cut]),
                (whole.0.clone(), 0, None),
                "cut {cut}"
            );
        }
        // A byte at a time.
        let cuts: Vec<usize> = (0..input.len()).collect();
        assert_eq!(parse_chunks(&l, input, &cuts), (whole.0.clone(), 0, None));
        // A byte at a time up to an error.
        let bad = b"*2\r\n$3\r\nGET\r\n!3\r\nkey\r\n";
        let cuts: Vec<usize> = (0..bad.len()).collect();
        assert_eq!(
            parse_chunks(&l, bad, &cuts).2,
            Some(ProtocolError::ExpectedDollar(b'!'))
        );
    }

    #[test]
    fn byte_at_a_time_does_not_rescan() {
        // A long inline line fed one byte at a time: each call scans only the new byte, which
        // the saved state shows.
        let l = Limits::default();
        let mut p = RequestParser::new();
        let mut pool = VecPool::new();
        let mut buf = Vec::new();
        for i in 0..1000 {
            buf.push(b'a');
            let mut reqs = pool.requests();
            let r = p.parse(&l, &mut buf, &mut reqs, &mut pool);
            assert_eq!((r.consumed, reqs.len()), (0, 0));
            pool.give_back(reqs);
            assert_eq!(p.state, State::Inline { scanned: i + 1 });
        }
        // A bulk being received reports how much more it needs.
        let mut p = RequestParser::new();
        let mut buf = b"*1\r\n$100\r\n0123456789".to_vec();
        let mut reqs = pool.requests();
        p.parse(&l, &mut buf, &mut reqs, &mut pool);
        assert_eq!(p.bulk_remaining(buf.len()), Some(92));
    }

    #[test]
    fn line_limits_do_not_depend_on_the_split() {
        let l = Limits {
            max_inline_len: 8,
            ..Limits::default()
        };
        for input in [
            &b"123456789\r\n"[..],
            b"*123456789\r\n",
            b"*1\r\n$123456789\r\n",
        ] {
            let whole = parse_whole(&l, input).2;
            assert!(whole.is_some());
            for cut in 0..input.len() {
                assert_eq!(parse_chunks(&l, input, &[cut]).2, whole, "cut {cut}");
            }
        }
        // Exactly at the limit is fine (the `\r` before `\n` counts, as in Redis).
        let (reqs, _, err) = parse_whole(&l, b"1234567\r\n");
        assert_eq!((reqs.len(), err), (1, None));
    }

    #[test]
    fn parse_i64_matches_string2ll() {
        for (s, v) in [
            ("0", Some(0)),
            ("-0", None),
            ("01", None),
            ("+1", None),
            ("", None),
            ("-", None),
            ("12", Some(12)),
            ("-12", Some(-12)),
            ("9223372036854775807", Some(i64::MAX)),
            ("9223372036854775808", None),
            ("-9223372036854775808", Some(i64::MIN)),
            ("-9223372036854775809", None),
            ("1 ", None),
        ] {
            assert_eq!(parse_i64(s.as_bytes()), v, "{s:?}");
        }
    }

    #[test]
    fn encoders() {
        let mut out = Vec::new();
        simple_string(&mut out, b"PONG");
        ok(&mut out);
        error(&mut out, b"ERR bad\r\nthing");
        integer(&mut out, 0);
        integer(&mut out, -42);
        integer(&mut out, i64::MIN);
        integer(&mut out, i64::MAX);
        bulk(&mut out, b"a\r\nb");
        bulk(&mut out, b"");
        null_bulk(&mut out);
        array_len(&mut out, 3);
        null_array(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "+PONG\r\n+OK\r\n-ERR bad  thing\r\n:0\r\n:-42\r\n:-9223372036854775808\r\n\
             :9223372036854775807\r\n$4\r\na\r\nb\r\n$0\r\n\r\n$-1\r\n*3\r\n*-1\r\n"
        );
        for v in [0u64, 9, 10, 99, 100, 101, 999, 1000, 12345, u64::MAX] {
            let mut o = Vec::new();
            push_u64(&mut o, v);
            assert_eq!(o, v.to_string().into_bytes());
        }
    }

    #[test]
    fn pool_reuses_allocations() {
        let mut pool = VecPool::new();
        let data = b"abc".to_vec();
        let mut reqs = pool.requests();
        let mut a = pool.args();
        a.push(&data[..]);
        let a_ptr = a.as_ptr() as usize;
        reqs.push(a);
        let r_ptr = reqs.as_ptr() as usize;
        pool.give_back(reqs);
        let data2 = b"xyz".to_vec();
        let mut reqs2 = pool.requests();
        let mut b = pool.args();
        b.push(&data2[..]);
        assert_eq!(b.as_ptr() as usize, a_ptr);
        reqs2.push(b);
        assert_eq!(reqs2.as_ptr() as usize, r_ptr);
    }
}
