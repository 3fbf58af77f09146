//! The garbage list: values too big to free within one command, and old keyspaces.
//!
//! DEL of a big value and FLUSHALL unlink in O(1) inside the command's transaction (atomic for
//! clients) and put the unlinked structure on a list reachable from the root; [`collect`]
//! frees it in bounded batches, each inside some later transaction together with the cursor
//! that says how far it got. A crash at any point leaves the list consistent: the batch either
//! committed with its cursor or did not happen, and the next [`collect`] resumes.
//!
//! Record (48 bytes): `0 next, 8 kind, 16 structure (list header or dict header), 24 cursor
//! (list: next node to free; dict: next bucket), 32 block to free last, 40 its usable size`.
//! A keyspace record's entries carry values: each is dropped as DEL would (freed at once if
//! small, else pushed as a record of its own).

use super::keyspace::{self, ENC_BLOB, ENC_PACK, T_HASH, T_LIST, T_SET, T_STRING, T_ZSET};
use super::set::SetObj;
use super::{dict, list, pack, set, zset, Mem, Store, Wtx, R_GARBAGE};
use crate::heap::{Off, Result};

const G_LIST: u64 = 1;
const G_DICT: u64 = 2;
const G_KEYSPACE: u64 = 3;
const REC: u64 = 48;
/// Values of at most this many blocks are freed inside the deleting command.
pub const FREE_NOW: u64 = 64;

fn push(w: &mut Wtx, kind: u64, a: Off, cursor: u64, obj: Off, cap: u64) -> Result<()> {
    let root = w.root();
    let head = w.u64(root + R_GARBAGE);
    let (r, _) = w.alloc(REC)?;
    let mut b = [0u8; REC as usize];
    for (i, v) in [head, kind, a, cursor, obj, cap].iter().enumerate() {
        b[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
    }
    w.write(r, &b)?;
    w.write_u64(root + R_GARBAGE, r)?;
    w.garbage_records(1);
    Ok(())
}

/// Drop a value object of type `ty`, encoding `enc` (not an inline string): free it now if it
/// is at most [`FREE_NOW`] blocks, else put it on the garbage list.
pub fn drop_value(w: &mut Wtx, st: &Store, ty: u8, enc: u8, val: Off) -> Result<()> {
    let _ = st;
    match ty {
        T_STRING => {
            if enc == ENC_BLOB {
                keyspace::free_blob(w, val)?;
            }
            Ok(())
        }
        T_LIST => {
            if list::nodes(w, val) < FREE_NOW {
                list::free_all(w, val)
            } else {
                let head = list::head(w, val);
                push(w, G_LIST, val, head, val, list::LIST_HDR)
            }
        }
        T_SET | T_HASH => {
            if enc == ENC_PACK {
                pack::free(w, val)
            } else if set::blocks(w, SetObj { enc, obj: val }) <= FREE_NOW {
                set::free_dict(w, val)
            } else {
                push(w, G_DICT, val, 0, val, dict::DICT_HDR)
            }
        }
        T_ZSET => {
            if zset::len(w, val) + 2 <= FREE_NOW {
                zset::free_all(w, val)
            } else {
                push(w, G_DICT, val, 0, val, zset::ZSET_SIZE)
            }
        }
        _ => Ok(()),
    }
}

/// FLUSHALL: replace the keyspace by an empty one; the old one and the expires dict go on the
/// garbage list.
pub fn flush(w: &mut Wtx, st: &Store) -> Result<()> {
    // The deadlines go with the keys: the expires dict (header block and entries, which own
    // nothing else) is freed as a set's dict would be.
    if let Some(x) = super::expire::detach(w, st)? {
        push(w, G_DICT, x, 0, x, dict::DICT_HDR)?;
    }
    let ks = st.keyspace();
    if dict::len(w, ks) == 0 {
        return Ok(());
    }
    let (copy, _) = w.alloc(dict::DICT_HDR)?;
    let hdr = w.bytes(ks, dict::DICT_HDR as usize).into_owned();
    w.write(copy, &hdr)?;
    dict::init(w, ks)?;
    push(w, G_KEYSPACE, copy, 0, copy, dict::DICT_HDR)
}

/// Free garbage: about `budget` blocks (a bucket's chain is finished once begun). Returns the
/// work done (blocks freed plus buckets visited / 16); 0 when there is no garbage.
pub fn collect(w: &mut Wtx, st: &Store, budget: u64) -> Result<u64> {
    let root = w.root();
    let mut work = 0u64;
    let mut buckets = 0u64;
    while work < budget {
        let r = w.u64(root + R_GARBAGE);
        if r == 0 {
            break;
        }
        let (next, kind, a, cursor, obj, cap) = {
            let b = w.bytes(r, REC as usize);
            // (`b` holds REC = 48 bytes: a read outside the heap gives as many zeros.)
            let f = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]));
            (f(0), f(1), f(2), f(3), f(4), f(5))
        };
        super::intact()?;
        let done = match kind {
            G_LIST if cursor != 0 => {
                let n = list::free_node(w, cursor)?;
                w.write_u64(r + 24, n)?;
                work += 1;
                false
            }
            G_LIST => true,
            G_DICT | G_KEYSPACE => {
                let nb = dict::nbuckets(w, a);
                if cursor < nb {
                    // A batch of buckets; dropping keyspace values may push records in front
                    // of this one, so it finishes only in an iteration that starts at its end.
                    let mut i = cursor;
                    while i < nb && work < budget {
                        let mut chain = Vec::new();
                        dict::for_bucket(w, a, i, |e| {
                            chain.push(e);
                            true
                        });
                        // (The chain is read whole first: freeing a block overwrites its
                        // first word with the allocator's free-list link.)
                        super::intact()?;
                        for e in chain {
                            if kind == G_KEYSPACE {
                                let ent = keyspace::entry_at(w, e);
                                super::intact()?;
                                keyspace::drop_entry_value(w, st, &ent)?;
                                keyspace::free_entry(w, &ent)?;
                            } else {
                                // (Set, hash or zset entries: only their size class counts.)
                                let meta = w.u64(e + dict::E_META);
                                keyspace::free_classed(w, e, meta)?;
                            }
                            work += 1;
                        }
                        i += 1;
                        buckets += 1;
                        if buckets % 16 == 0 {
                            work += 1;
                        }
                    }
                    w.write_u64(r + 24, i)?;
                    false
                } else {
                    dict::free_table(w, a)?;
                    true
                }
            }
            _ => true,
        };
        if done {
            // Nothing was pushed in this iteration: `r` is still the head.
            if obj != 0 {
                w.free(obj, cap)?;
            }
            w.write_u64(root + R_GARBAGE, next)?;
            w.free(r, REC)?;
            w.garbage_records(-1);
            work += 1;
        }
    }
    Ok(work)
}

/// Whether the garbage list is empty (as `m` sees it).
pub fn is_empty<M: Mem>(m: &M, st: &Store) -> bool {
    !st.has_garbage(m)
}
