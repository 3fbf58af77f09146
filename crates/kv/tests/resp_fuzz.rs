//! Property tests of the RESP2 request parser: random bytes and mutated valid frames never make
//! it panic, consume more than it was given, or allocate more than a small multiple of its input;
//! parsing input split into arbitrary reads gives what parsing it whole gives; valid frames parse
//! back to the requests they encode.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::prelude::*;
use tiermem_kv::resp::{Limits, ProtocolError, RequestParser, VecPool};

/// Counts the bytes this thread has allocated and not freed, and the peak since a reset.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    let _ = LIVE.try_with(|l| {
        let v = l.get() + delta;
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

// SAFETY: delegates to the system allocator; the bookkeeping touches only const-initialised
// thread-locals (no allocation, and `try_with` tolerates thread teardown).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as isize));
        // SAFETY: forwarded; ptr came from System.alloc with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size as isize - layout.size() as isize);
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes allocated at peak while `f` runs, beyond what was live before.
fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.with(|l| l.get());
    PEAK.with(|p| p.set(base));
    let r = f();
    let peak = PEAK.with(|p| p.get());
    (r, (peak - base).max(0) as usize)
}

type Reqs = Vec<Vec<Vec<u8>>>;

/// Parses `input` whole; checks the invariants; returns requests, consumed, error.
fn whole(limits: &Limits, input: &[u8]) -> (Reqs, usize, Option<ProtocolError>) {
    let mut buf = input.to_vec();
    let mut parser = RequestParser::new();
    let mut pool = VecPool::new();
    let ((consumed, error, owned), peak) = peak_during(|| {
        let mut reqs = pool.requests();
        let r = parser.parse(limits, &mut buf, &mut reqs, &mut pool);
        assert!(reqs.iter().all(|r| !r.is_empty()), "an empty request");
        let n = reqs.len();
        pool.give_back(reqs);
        (r.consumed, r.error, n)
    });
    // Memory: a small multiple of the input (slices and vectors for every argument, which
    // needs at least 2 input bytes) plus the bounded argument preallocation.
    assert!(
        peak <= 64 * input.len() + (64 << 10),
        "parse of {} bytes ({owned} requests) allocated {peak} bytes",
        input.len()
    );
    assert!(consumed <= input.len());
    // The requests again, owned, from a fresh parse (the first one's buffer was unescaped in
    // place).
    let mut buf = input.to_vec();
    let mut parser = RequestParser::new();
    let mut reqs = pool.requests();
    let r = parser.parse(limits, &mut buf, &mut reqs, &mut pool);
    assert_eq!((r.consumed, r.error), (consumed, error));
    let owned = reqs
        .iter()
        .map(|r| r.iter().map(|a| a.to_vec()).collect())
        .collect();
    (owned, consumed, error)
}

/// Parses `input` delivered in reads ending at `cuts`, as a server does: unconsumed bytes stay
/// at the front of the buffer and the next read is appended. Returns requests, bytes left
/// unconsumed at the end, error.
fn split(limits: &Limits, input: &[u8], cuts: &[usize]) -> (Reqs, usize, Option<ProtocolError>) {
    let mut points: Vec<usize> = cuts.iter().map(|&c| c % (input.len() + 1)).collect();
    points.sort_unstable();
    points.push(input.len());
    let mut parser = RequestParser::new();
    let mut pool = VecPool::new();
    let mut buf = Vec::new();
    let mut all = Vec::new();
    let mut fed = 0;
    for &end in &points {
        if end < fed {
            continue;
        }
        buf.extend_from_slice(&input[fed..end]);
        fed = end;
        let buffered = buf.len();
        let mut reqs = pool.requests();
        let r = parser.parse(limits, &mut buf, &mut reqs, &mut pool);
        assert!(r.consumed <= buffered);
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

fn small_limits() -> Limits {
    Limits {
        max_bulk_len: 48,
        max_multibulk_len: 6,
        max_inline_len: 40,
    }
}

/// Bytes that matter to the grammar, often.
fn protocol_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        4 => prop::sample::select(b"*$\r\n0123456789- \"'\\xabPING".to_vec()),
        1 => any::<u8>(),
    ]
}

/// One request's arguments.
fn request() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..24), 1..6)
}

fn encode_multibulk(req: &[Vec<u8>], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", req.len()).as_bytes());
    for a in req {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// An inline encoding: every argument double-quoted with every byte as `\xHH`.
fn encode_inline(req: &[Vec<u8>], out: &mut Vec<u8>) {
    for (i, a) in req.iter().enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        out.push(b'"');
        for b in a {
            out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
        }
        out.push(b'"');
    }
    out.extend_from_slice(b"\r\n");
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), protocol_byte()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), protocol_byte()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn apply(input: &mut Vec<u8>, m: &Mutation) {
    if input.is_empty() {
        return;
    }
    let n = input.len();
    match *m {
        Mutation::Flip(i, b) => input[i % n] = b,
        Mutation::Insert(i, b) => input.insert(i % (n + 1), b),
        Mutation::Delete(i) => {
            input.remove(i % n);
        }
        Mutation::Truncate(i) => input.truncate(i % (n + 1)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(input in prop::collection::vec(protocol_byte(), 0..300),
                    cuts in prop::collection::vec(any::<usize>(), 0..8)) {
        for limits in [small_limits(), Limits::default()] {
            let (reqs, consumed, err) = whole(&limits, &input);
            let (sreqs, left, serr) = split(&limits, &input, &cuts);
            prop_assert_eq!(&sreqs, &reqs);
            prop_assert_eq!(serr, err);
            if err.is_none() {
                prop_assert_eq!(left, input.len() - consumed);
            }
        }
    }

    #[test]
    fn valid_frames_round_trip(reqs in prop::collection::vec((request(), any::<bool>()), 0..12),
                               cuts in prop::collection::vec(any::<usize>(), 0..8)) {
        let mut input = Vec::new();
        for (r, inline) in &reqs {
            if *inline { encode_inline(r, &mut input) } else { encode_multibulk(r, &mut input) }
        }
        let want: Reqs = reqs.iter().map(|(r, _)| r.clone()).collect();
        let limits = Limits::default();
        let (got, consumed, err) = whole(&limits, &input);
        prop_assert_eq!(err, None);
        prop_assert_eq!(consumed, input.len());
        prop_assert_eq!(&got, &want);
        prop_assert_eq!(split(&limits, &input, &cuts), (want, 0, None));
    }

    #[test]
    fn mutated_frames(reqs in prop::collection::vec((request(), any::<bool>()), 1..8),
                      muts in prop::collection::vec(mutation(), 1..4),
                      cuts in prop::collection::vec(any::<usize>(), 0..8)) {
        let mut input = Vec::new();
        for (r, inline) in &reqs {
            if *inline { encode_inline(r, &mut input) } else { encode_multibulk(r, &mut input) }
        }
        for m in &muts {
            apply(&mut input, m);
        }
        for limits in [small_limits(), Limits::default()] {
            let (reqs, consumed, err) = whole(&limits, &input);
            let (sreqs, left, serr) = split(&limits, &input, &cuts);
            prop_assert_eq!(&sreqs, &reqs);
            prop_assert_eq!(serr, err);
            if err.is_none() {
                prop_assert_eq!(left, input.len() - consumed);
            }
        }
    }

    #[test]
    fn declared_sizes_do_not_allocate(count in 1u64..2_000_000, len in 0u64..200_000_000) {
        // Headers announcing huge requests allocate only as data arrives (checked in `whole`).
        let input = format!("*{count}\r\n${len}\r\nabc");
        let (_, _, err) = whole(&Limits::default(), input.as_bytes());
        if count > 1 << 20 {
            prop_assert_eq!(err, Some(ProtocolError::InvalidMultibulkLength));
        } else if len > 64 << 20 {
            prop_assert_eq!(err, Some(ProtocolError::InvalidBulkLength));
        } else {
            prop_assert_eq!(err, None);
        }
    }
}
