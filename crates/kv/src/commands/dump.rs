//! DUMP and RESTORE, as Redis 7.0 has them: a key's value as a payload in Redis's own format
//! (`rdb`), and a key created from one, with its TTL (relative or ABSTTL) and REPLACE.
//! Payloads move both ways between tiermem-kv and Redis.

use super::data::{is, parse_i64, Counters};
use super::rdb;
use super::reply::{self, bulk, not_int, null, syntax};
use super::value;
use crate::ds::keyspace as ks;
use crate::ds::{expire, Mem, Store, Wtx};
use crate::heap::HeapError;

/// DUMP key: the payload, or nil for a missing key.
pub fn dump<M: Mem>(_: &mut Counters, st: &Store, m: &M, a: &[&[u8]], out: &mut Vec<u8>) {
    match ks::lookup(m, st, a[1]).map(|e| value::read(m, &e)) {
        None => null(out),
        Some(Ok(v)) => bulk(out, &rdb::encode(&v)),
        // A damaged entry: recorded, and the command layer replies with the error.
        Some(Err(HeapError::Damaged(off))) => crate::ds::damaged(off),
        Some(Err(_)) => null(out),
    }
}

/// RESTORE key ttl payload [REPLACE] [ABSTTL] [IDLETIME s] [FREQ f], checked in Redis 7.0's
/// order: options, an existing key (BUSYKEY), the TTL, the payload's version and checksum,
/// its format. IDLETIME sets the key's access clock (`access`); FREQ is validated and
/// ignored (no LFU policy, no frequency kept). A deadline already past creates nothing (and REPLACE still
/// deleted the old key), as in Redis.
pub fn restore(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> Result<(), HeapError> {
    let (mut replace, mut absttl) = (false, false);
    let (mut idle, mut freq) = (None, false);
    let mut j = 4;
    while j < a.len() {
        let more = a.len() - j - 1;
        if is(a[j], "replace") {
            replace = true;
        } else if is(a[j], "absttl") {
            absttl = true;
        } else if is(a[j], "idletime") && more >= 1 && !freq {
            match parse_i64(a[j + 1]) {
                None => {
                    not_int(out);
                    return Ok(());
                }
                Some(v) if v < 0 => {
                    reply::error(out, "ERR Invalid IDLETIME value, must be >= 0");
                    return Ok(());
                }
                Some(v) => idle = Some(v as u64),
            }
            j += 1;
        } else if is(a[j], "freq") && more >= 1 && idle.is_none() {
            match parse_i64(a[j + 1]) {
                None => {
                    not_int(out);
                    return Ok(());
                }
                Some(v) if !(0..=255).contains(&v) => {
                    reply::error(out, "ERR Invalid FREQ value, must be >= 0 and <= 255");
                    return Ok(());
                }
                Some(_) => freq = true,
            }
            j += 1;
        } else {
            syntax(out);
            return Ok(());
        }
        j += 1;
    }
    let old = ks::lookup(w, st, a[1]);
    if old.is_some() && !replace {
        reply::error(out, "BUSYKEY Target key name already exists.");
        return Ok(());
    }
    let ttl = match parse_i64(a[2]) {
        None => {
            not_int(out);
            return Ok(());
        }
        Some(t) if t < 0 => {
            reply::error(out, "ERR Invalid TTL value, must be >= 0");
            return Ok(());
        }
        Some(t) => t as u64,
    };
    let v = match rdb::decode(a[3]) {
        Ok(v) => v,
        Err(e) => {
            reply::error(out, e.message());
            return Ok(());
        }
    };
    if let Some(e) = old {
        ks::delete(w, st, &e)?;
    }
    let at = match ttl {
        0 => None,
        t if absttl => Some(t),
        t => Some(t.saturating_add(expire::now_ms())),
    };
    if at.is_some_and(|t| t <= expire::now_ms()) {
        reply::ok(out);
        return Ok(());
    }
    value::insert(w, st, a[1], &v)?;
    if let Some(secs) = idle {
        super::access::set_idle(st.db, a[1], secs);
    }
    if let Some(t) = at {
        if let Some(e) = ks::lookup(w, st, a[1]) {
            expire::set(w, st, &e, t)?;
        }
    }
    reply::ok(out);
    Ok(())
}
