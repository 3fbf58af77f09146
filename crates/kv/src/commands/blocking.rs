//! Blocking pops: BLPOP, BRPOP, BRPOPLPUSH, BLMOVE, BZPOPMIN, BZPOPMAX (Redis 7.0).
//!
//! A blocking command first runs as its non-blocking twin (`data::write`: LPOP, LMOVE,
//! ZPOPMIN, ... on the first key that holds something); when every key is empty it writes no
//! reply, and the command layer registers the session as a waiter on its keys ([`Waiters`],
//! in arrival order) and returns `Control::Block` with the deadline: the server parks the
//! connection's requests and runs them again when woken or at the deadline. Every write that
//! changes a key wakes the first waiter on it (through its `ConnHandle`, whatever event loop
//! it is on); a served waiter's own pop changes the key again and so wakes the next one, so
//! waiters are served in the order they arrived. A waiter that times out gets a null array;
//! one whose connection closes leaves the queue and passes the turn on. Inside MULTI a
//! blocking command does not block: it answers a null array, as Redis does.

use super::registry::Registry;
use crate::server::ConnHandle;
use std::time::Instant;

/// A blocked session's state.
#[derive(Debug)]
pub struct BlockState {
    /// The keys waited on (`multi::wkey`: database and key).
    pub keys: Vec<Vec<u8>>,
    /// When it times out (`None`: never).
    pub deadline: Option<Instant>,
}

/// The sessions waiting on each key, in arrival order, with the handle that wakes each.
#[derive(Default)]
pub struct Waiters(Registry<ConnHandle>);

impl Waiters {
    /// Whether anyone waits.
    #[inline]
    pub fn active(&self) -> bool {
        self.0.active()
    }

    /// Session `id` waits on `keys` (behind those already waiting).
    pub fn register(&self, id: u64, conn: &ConnHandle, keys: &[Vec<u8>]) {
        self.0.add(id, conn, keys.iter().map(|k| k.as_slice()));
    }

    /// Session `id` stops waiting on `keys` (served, timed out, or gone); the next waiter on
    /// each of them is woken, since what is there may be its turn now.
    pub fn unregister(&self, id: u64, keys: &[Vec<u8>]) {
        self.0
            .remove(id, keys.iter().map(|k| k.as_slice()), ConnHandle::wake);
    }

    /// `keys` changed: wake the first waiter on each.
    pub fn wake<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) {
        self.0.each(keys, |v| {
            if let Some((_, c)) = v.first() {
                c.wake();
            }
        });
    }
}

/// Whether `id` is a blocking command (its table entry's `blocking` flag).
pub fn is_blocking(id: super::table::Id) -> bool {
    use super::table::{spec, Flags};
    spec(id).flags.contains(Flags::BLOCKING)
}

/// A blocking command's timeout argument: the last one, or the first of BLMPOP and BZMPOP.
pub fn timeout_arg<'a>(id: super::table::Id, a: &[&'a [u8]]) -> &'a [u8] {
    use super::table::Id;
    match id {
        Id::Blmpop | Id::Bzmpop => a[1],
        _ => a[a.len() - 1],
    }
}

/// The keys a blocking command waits on: every key of BLPOP, BRPOP, BZPOPMIN, BZPOPMAX (all
/// but the timeout), the source of BRPOPLPUSH and BLMOVE.
pub fn wait_keys<'a>(id: super::table::Id, a: &[&'a [u8]]) -> Vec<&'a [u8]> {
    use super::table::Id;
    match id {
        Id::Brpoplpush | Id::Blmove => vec![a[1]],
        // BLMPOP timeout numkeys key ... (validated before anything blocks).
        Id::Blmpop | Id::Bzmpop => {
            let n = super::parse_i64(a[2]).unwrap_or(0).max(0) as usize;
            a[3..(3 + n).min(a.len())].to_vec()
        }
        _ => a[1..a.len() - 1].to_vec(),
    }
}

/// Redis' getTimeoutFromObjectOrReply: seconds (a float, ≥ 0) as a deadline from `now`
/// (`None`: 0, wait forever); `Err` holds the error reply's text.
pub fn deadline(arg: &[u8], now: Instant) -> Result<Option<Instant>, &'static str> {
    let secs = super::parse_f64(arg).ok_or("ERR timeout is not a float or out of range")?;
    if secs.is_nan() {
        return Err("ERR timeout is not a float or out of range");
    }
    let ms = (secs * 1000.0).ceil();
    // Redis 7.0 converts to a signed 64-bit count of milliseconds: past its range (infinity
    // included) the count comes out negative, and so does the error.
    if ms < 0.0 || ms >= i64::MAX as f64 {
        return Err("ERR timeout is negative");
    }
    if ms == 0.0 {
        return Ok(None);
    }
    // A deadline past what the clock can say is no deadline.
    Ok(now.checked_add(std::time::Duration::from_millis(ms as u64)))
}
