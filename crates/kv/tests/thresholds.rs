//! Redis's encoding thresholds in the data structures (issue #14): `hash-max-listpack-entries`
//! ([`tiermem_kv::config::thresholds`]) lowers the size at which a hash pack becomes a dict.
//! A test binary of its own: the thresholds are process-wide.

mod common;

use common::{Eng, Fixture};
use tiermem_kv::config::{self, Thresholds};
use tiermem_kv::ds::hash::{self, HashObj};
use tiermem_kv::ds::keyspace::{ENC_DICT, ENC_PACK};
use tiermem_kv::ds::{Store, View, Wtx};

#[test]
fn hash_max_listpack_entries_turns_hash_packs_into_dicts() {
    let f = Fixture::new(Eng::Volatile);
    let heap = f.heap();
    let st = Store::open(heap).unwrap();
    let fields: Vec<String> = (0..100).map(|i| format!("f{i}")).collect();
    let set = |h: Option<HashObj>, from: usize, to: usize| -> HashObj {
        let mut w = Wtx::new(heap, st.root);
        let pairs: Vec<(&[u8], &[u8])> = fields[from..to]
            .iter()
            .map(|f| (f.as_bytes(), &b"v"[..]))
            .collect();
        let (added, h) = hash::set(&mut w, &st, h, &pairs).unwrap();
        assert_eq!(added as usize, to - from);
        w.commit().unwrap();
        h
    };
    // Redis's default (512) is above the pack's own ceiling: 100 fields stay a pack.
    assert_eq!(config::thresholds(), Thresholds::default());
    assert_eq!(set(None, 0, 100).enc, ENC_PACK);

    config::set_thresholds(Thresholds {
        hash_max_listpack_entries: 3,
        ..Thresholds::default()
    });
    assert_eq!(config::thresholds().hash_max_listpack_entries, 3);
    let h = set(None, 0, 3);
    assert_eq!(h.enc, ENC_PACK);
    let h = set(Some(h), 3, 4);
    assert_eq!(h.enc, ENC_DICT, "a fourth field makes it a dict");
    assert_eq!(hash::len(&View::of(heap), h), 4);
    assert_eq!(set(None, 0, 10).enc, ENC_DICT, "born too big");
    config::set_thresholds(Thresholds {
        hash_max_listpack_entries: 0,
        ..Thresholds::default()
    });
    assert_eq!(set(None, 0, 1).enc, ENC_DICT, "0: never a pack");
    config::set_thresholds(Thresholds::default());
}
