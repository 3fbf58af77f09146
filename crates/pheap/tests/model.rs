//! The allocator against a model under proptest: random malloc / free / realloc / checkpoint
//! sequences; every live object keeps its own byte pattern (so overlaps and lost copies show),
//! sizes and names are as the model says, and a restart restores the last checkpoint exactly.

use proptest::prelude::*;
use std::collections::BTreeMap;
use tiermem_pheap::{Heap, HeapOptions};

#[derive(Debug, Clone)]
enum Op {
    Malloc(usize, bool),
    Free(usize),
    Realloc(usize, usize),
    Write(usize),
    Ckall,
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![1usize..=64, 65usize..=4096, 4097usize..=20000];
    prop_oneof![
        4 => (size.clone(), any::<bool>()).prop_map(|(s, n)| Op::Malloc(s, n)),
        2 => any::<usize>().prop_map(Op::Free),
        2 => (any::<usize>(), size).prop_map(|(i, s)| Op::Realloc(i, s)),
        2 => any::<usize>().prop_map(Op::Write),
        1 => Just(Op::Ckall),
    ]
}

#[derive(Clone, Debug)]
struct M {
    size: usize,
    pat: u8,
    name: Option<String>,
}

fn fill(p: *mut u8, len: usize, v: u8) {
    // SAFETY: p is a live object of at least len bytes.
    unsafe { std::ptr::write_bytes(p, v, len) }
}

fn holds(p: *const u8, len: usize, v: u8) -> bool {
    // SAFETY: p is a live object of at least len bytes.
    unsafe { std::slice::from_raw_parts(p, len) }
        .iter()
        .all(|&b| b == v)
}

fn check(h: &Heap, live: &BTreeMap<usize, M>) {
    assert_eq!(h.len(), live.len());
    for (&p, m) in live {
        assert_eq!(h.size_of(p as *const u8), Some(m.size));
        assert!(
            holds(p as *const u8, m.size, m.pat),
            "object {p:#x} lost its contents"
        );
        if let Some(n) = &m.name {
            assert_eq!(h.get(n), Some(p as *mut u8));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn allocator_matches_model(ops in proptest::collection::vec(op(), 1..120), views in prop_oneof![Just(1usize), Just(2), Just(4), Just(8)]) {
        let d = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = d.path().join("model");
        let h = Heap::create(&path, &HeapOptions { capacity: 2 << 20, views, ..HeapOptions::default() }).unwrap();
        let mut live: BTreeMap<usize, M> = BTreeMap::new();
        let mut committed = live.clone();
        let mut pat = 0u8;
        let mut names = 0;
        for op in ops {
            pat = pat.wrapping_add(1);
            match op {
                Op::Malloc(s, named) => {
                    let name = named.then(|| { names += 1; format!("n{names}") });
                    match h.malloc(s, name.as_deref()) {
                        Ok(p) => {
                            fill(p, s, pat);
                            let fresh = live.insert(p as usize, M { size: s, pat, name }).is_none();
                            prop_assert!(fresh);
                        }
                        Err(tiermem_pheap::Error::OutOfMemory { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let p = *live.keys().nth(i % live.len()).unwrap();
                    h.free(p as *mut u8).unwrap();
                    live.remove(&p);
                }
                Op::Realloc(i, s) if !live.is_empty() => {
                    let p = *live.keys().nth(i % live.len()).unwrap();
                    match h.realloc(p as *mut u8, s) {
                        Ok(q) => {
                            let mut m = live.remove(&p).unwrap();
                            prop_assert!(holds(q, s.min(m.size), m.pat));
                            fill(q, s, m.pat);
                            m.size = s;
                            let fresh = live.insert(q as usize, m).is_none();
                            prop_assert!(fresh);
                        }
                        Err(tiermem_pheap::Error::OutOfMemory { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                Op::Write(i) if !live.is_empty() => {
                    let p = *live.keys().nth(i % live.len()).unwrap();
                    let m = live.get_mut(&p).unwrap();
                    m.pat = pat;
                    fill(p as *mut u8, m.size, pat);
                }
                Op::Ckall => {
                    h.ckall().unwrap();
                    committed = live.clone();
                }
                _ => {}
            }
        }
        check(&h, &live);
        // A restart restores the last checkpoint exactly.
        drop(h);
        let h = Heap::open(&path).unwrap();
        check(&h, &committed);
    }
}
