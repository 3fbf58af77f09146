//! A key's whole value taken out of the heap and put back in: what DUMP serializes, and what
//! RESTORE and COPY create. One mechanism for every command that moves a value as a whole.

use super::rdb::Value;
use crate::ds::hash::HashObj;
use crate::ds::keyspace::{self as ks, Entry, T_HASH, T_LIST, T_SET, T_STRING, T_ZSET};
use crate::ds::set::SetObj;
use crate::ds::zset::AddFlags;
use crate::ds::{hash, list, set, zset, Mem, Store, Wtx};
use crate::heap::HeapError;

/// Every element of `e`'s value, in its order (a list's, a sorted set's by rank; a set's and
/// a hash's in iteration order). Errors: an entry of no known type (a damaged heap).
pub fn read<M: Mem>(m: &M, e: &Entry) -> Result<Value, HeapError> {
    Ok(match e.ty() {
        T_STRING => Value::Str(ks::string_value(m, e).into_owned()),
        T_LIST => Value::List(list::to_vec(m, e.obj())),
        T_SET => {
            let mut all = Vec::new();
            let s = SetObj {
                enc: e.enc(),
                obj: e.obj(),
            };
            set::for_each(m, s, |v| all.push(v.to_vec()));
            Value::Set(all)
        }
        T_HASH => {
            let mut all = Vec::new();
            let h = HashObj {
                enc: e.enc(),
                obj: e.obj(),
            };
            hash::for_each(m, h, |f, v| all.push((f.to_vec(), v.to_vec())));
            Value::Hash(all)
        }
        T_ZSET => {
            let mut all = Vec::new();
            let n = zset::len(m, e.obj());
            if n > 0 {
                zset::range_by_rank(m, e.obj(), 0, n - 1, false, |mem, sc| {
                    all.push((mem.to_vec(), sc))
                });
            }
            Value::Zset(all)
        }
        _ => return Err(HeapError::Damaged(e.off)),
    })
}

/// Create `key` in `st` holding `v` (no deadline). The key must not exist (the caller deleted
/// it or checked). Errors: the heap's (out of memory, transaction too large).
pub fn insert(w: &mut Wtx, st: &Store, key: &[u8], v: &Value) -> Result<(), HeapError> {
    match v {
        Value::Str(s) => {
            let (p, _) = ks::probe(w, st, key);
            ks::insert_string(w, st, &p, key, s)
        }
        Value::List(items) => {
            let refs: Vec<&[u8]> = items.iter().map(|v| v.as_slice()).collect();
            let l = list::create(w)?;
            list::push(w, l, &refs, false)?;
            let (p, _) = ks::probe(w, st, key);
            ks::insert_object(w, st, &p, key, T_LIST, 0, l)
        }
        Value::Set(members) => {
            let refs: Vec<&[u8]> = members.iter().map(|v| v.as_slice()).collect();
            let (_, s) = set::add(w, st, None, &refs)?;
            let (p, _) = ks::probe(w, st, key);
            ks::insert_object(w, st, &p, key, T_SET, s.enc, s.obj)
        }
        Value::Hash(pairs) => {
            let refs: Vec<(&[u8], &[u8])> = pairs
                .iter()
                .map(|(f, v)| (f.as_slice(), v.as_slice()))
                .collect();
            let (_, h) = hash::set(w, st, None, &refs)?;
            let (p, _) = ks::probe(w, st, key);
            ks::insert_object(w, st, &p, key, T_HASH, h.enc, h.obj)
        }
        Value::Zset(members) => {
            let z = zset::create(w)?;
            for (m, sc) in members {
                zset::add(w, st, z, *sc, m, AddFlags::default())?;
            }
            let (p, _) = ks::probe(w, st, key);
            ks::insert_object(w, st, &p, key, T_ZSET, 0, z)
        }
    }
}
