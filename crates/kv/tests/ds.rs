//! The data structures against simple models (std collections), random operation sequences
//! with a fixed seed, over both engines; some transactions abort (the model then stays); the
//! vnvm heap is closed and reopened and compared again.

mod common;

use common::{Eng, Fixture, Rng, ENGINES};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use tiermem_kv::ds::hash::HashObj;
use tiermem_kv::ds::keyspace::{self as ks, T_HASH, T_LIST, T_SET, T_STRING, T_ZSET};
use tiermem_kv::ds::set::SetObj;
use tiermem_kv::ds::zset::{self, AddFlags, Added, Bound};
use tiermem_kv::ds::{dict, garbage, hash, list, set, Mem, Store, View, Wtx};
use tiermem_kv::heap::Heap;

/// The used-bytes counter equals what the allocator says is allocated.
fn check_used(heap: &Heap, st: &Store) {
    let s = heap.stats().unwrap();
    assert_eq!(
        st.used_bytes(&View::of(heap)),
        s.allocated_bytes + 16 * s.allocated_blocks,
        "used-bytes counter vs the allocator's walk"
    );
}

fn finish(w: Wtx, commit: bool) {
    if commit {
        w.commit().unwrap();
    } else {
        w.abort();
    }
}

#[test]
fn strings_and_keyspace() {
    for eng in ENGINES {
        let mut f = Fixture::new(eng);
        let st = Store::open(f.heap()).unwrap();
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut rng = Rng(0x5eed_0001);
        for _ in 0..8000 {
            let heap = f.heap();
            let key = format!("key:{:06}", rng.below(4000)).into_bytes();
            let commit = rng.chance(93);
            let op = rng.below(100);
            let mut w = Wtx::new(heap, st.root);
            if op < 60 {
                let v = if rng.chance(1) {
                    vec![b'B'; 70_000 + rng.below(5000) as usize]
                } else if rng.chance(5) {
                    rng.bytes(3000)
                } else {
                    rng.bytes(40)
                };
                let (p, e) = ks::probe(&w, &st, &key);
                match e {
                    Some(e) => ks::set_string(&mut w, &st, &e, &v).unwrap(),
                    None => ks::insert_string(&mut w, &st, &p, &key, &v).unwrap(),
                }
                // The transaction sees its own write.
                let e = ks::lookup(&w, &st, &key).unwrap();
                assert_eq!(*ks::string_value(&w, &e), v[..]);
                if commit {
                    model.insert(key, v);
                }
            } else if op < 80 {
                if let Some(e) = ks::lookup(&w, &st, &key) {
                    ks::delete(&mut w, &st, &e).unwrap();
                    assert!(ks::lookup(&w, &st, &key).is_none());
                    if commit {
                        model.remove(&key);
                    }
                }
            } else {
                let v = View::of(heap);
                let got = ks::lookup(&v, &st, &key).map(|e| ks::string_value(&v, &e).into_owned());
                assert_eq!(got.as_ref(), model.get(&key), "{eng:?}");
            }
            finish(w, commit);
        }
        let verify = |heap: &Heap, st: &Store| {
            let v = View::of(heap);
            assert_eq!(ks::len(&v, st), model.len() as u64);
            for (k, val) in &model {
                let e = ks::lookup(&v, st, k).expect("key present");
                assert_eq!(e.ty(), T_STRING);
                assert_eq!(*ks::string_value(&v, &e), val[..]);
            }
            let mut n = 0;
            dict::for_each(&v, st.keyspace(), |_| {
                n += 1;
                true
            });
            assert_eq!(n, model.len());
            // Linear hashing keeps the load factor at most 1.
            assert!(dict::nbuckets(&v, st.keyspace()) as usize >= model.len());
            check_used(heap, st);
        };
        verify(f.heap(), &st);
        if f.reopen() {
            let st2 = Store::open(f.heap()).unwrap();
            assert_eq!((st2.root, st2.seed), (st.root, st.seed));
            verify(f.heap(), &st2);
        }
    }
}

fn list_of(w: &impl tiermem_kv::ds::Mem, st: &Store) -> Option<u64> {
    ks::lookup(w, st, b"L").map(|e| {
        assert_eq!(e.ty(), T_LIST);
        e.obj()
    })
}

#[test]
fn lists() {
    for eng in ENGINES {
        let mut f = Fixture::new(eng);
        let st = Store::open(f.heap()).unwrap();
        let mut model: VecDeque<Vec<u8>> = VecDeque::new();
        let mut rng = Rng(0x5eed_0002);
        for step in 0..6000 {
            let heap = f.heap();
            let commit = rng.chance(93);
            let mut w = Wtx::new(heap, st.root);
            let op = rng.below(100);
            let front = rng.chance(50);
            if op < 50 {
                let n = 1 + rng.below(4) as usize;
                let elems: Vec<Vec<u8>> = (0..n)
                    .map(|_| {
                        if rng.chance(2) {
                            vec![b'x'; 4000 + rng.below(3000) as usize]
                        } else {
                            rng.bytes(300)
                        }
                    })
                    .collect();
                let refs: Vec<&[u8]> = elems.iter().map(|e| &e[..]).collect();
                let len = match list_of(&w, &st) {
                    Some(l) => list::push(&mut w, l, &refs, front).unwrap(),
                    None => {
                        let (p, _) = ks::probe(&w, &st, b"L");
                        let l = list::create(&mut w).unwrap();
                        let n = list::push(&mut w, l, &refs, front).unwrap();
                        ks::insert_object(&mut w, &st, &p, b"L", T_LIST, 0, l).unwrap();
                        n
                    }
                };
                if commit {
                    for e in elems {
                        if front {
                            model.push_front(e);
                        } else {
                            model.push_back(e);
                        }
                    }
                    assert_eq!(len, model.len() as u64);
                }
            } else if op < 85 {
                if let Some(l) = list_of(&w, &st) {
                    let c = 1 + rng.below(6) as usize;
                    let got = list::pop(&mut w, l, c, front).unwrap();
                    if list::len(&w, l) == 0 {
                        let e = ks::lookup(&w, &st, b"L").unwrap();
                        ks::delete(&mut w, &st, &e).unwrap();
                    }
                    if commit {
                        let want: Vec<Vec<u8>> = (0..c.min(model.len()))
                            .map(|_| {
                                if front {
                                    model.pop_front().unwrap()
                                } else {
                                    model.pop_back().unwrap()
                                }
                            })
                            .collect();
                        assert_eq!(got, want, "step {step}");
                    }
                } else {
                    assert!(model.is_empty());
                }
            } else {
                let v = View::of(heap);
                match list_of(&v, &st) {
                    None => assert!(model.is_empty()),
                    Some(l) => {
                        let n = model.len() as u64;
                        assert_eq!(list::len(&v, l), n);
                        let s = rng.below(n);
                        let e = s + rng.below(n - s);
                        let mut got = Vec::new();
                        list::range(&v, l, s, e, |x| {
                            got.push(x.to_vec());
                            true
                        });
                        let want: Vec<Vec<u8>> =
                            model.range(s as usize..=e as usize).cloned().collect();
                        assert_eq!(got, want, "range {s}..={e} of {n}");
                    }
                }
            }
            finish(w, commit);
        }
        let verify = |heap: &Heap, st: &Store| {
            let v = View::of(heap);
            let got = list_of(&v, st)
                .map(|l| list::to_vec(&v, l))
                .unwrap_or_default();
            assert_eq!(got, model.iter().cloned().collect::<Vec<_>>());
            check_used(heap, st);
        };
        verify(f.heap(), &st);
        if f.reopen() {
            verify(f.heap(), &Store::open(f.heap()).unwrap());
        }
    }
}

fn set_of(m: &impl tiermem_kv::ds::Mem, st: &Store) -> Option<(ks::Entry, SetObj)> {
    ks::lookup(m, st, b"S").map(|e| {
        assert_eq!(e.ty(), T_SET);
        (
            e,
            SetObj {
                enc: e.enc(),
                obj: e.obj(),
            },
        )
    })
}

#[test]
fn sets() {
    for eng in ENGINES {
        let mut f = Fixture::new(eng);
        let st = Store::open(f.heap()).unwrap();
        let mut model: HashSet<Vec<u8>> = HashSet::new();
        let mut rng = Rng(0x5eed_0003);
        let mut saw_dict = false;
        for _ in 0..5000 {
            let heap = f.heap();
            let commit = rng.chance(93);
            let mut w = Wtx::new(heap, st.root);
            let op = rng.below(100);
            let mut mems = || -> Vec<Vec<u8>> {
                (0..1 + rng.below(5))
                    .map(|_| format!("member-{}", rng.below(400)).into_bytes())
                    .collect()
            };
            if op < 50 {
                let ms = mems();
                let refs: Vec<&[u8]> = ms.iter().map(|m| &m[..]).collect();
                let (p, cur) = ks::probe(&w, &st, b"S");
                let (added, s) = set::add(
                    &mut w,
                    &st,
                    cur.map(|e| SetObj {
                        enc: e.enc(),
                        obj: e.obj(),
                    }),
                    &refs,
                )
                .unwrap();
                match cur {
                    Some(e) => ks::set_value(&mut w, &e, T_SET, s.enc, s.obj).unwrap(),
                    None => ks::insert_object(&mut w, &st, &p, b"S", T_SET, s.enc, s.obj).unwrap(),
                }
                saw_dict |= s.enc == ks::ENC_DICT;
                if commit {
                    let before = model.len();
                    model.extend(ms);
                    assert_eq!(added as usize, model.len() - before);
                }
            } else if op < 75 {
                if let Some((e, s)) = set_of(&w, &st) {
                    let ms = mems();
                    let refs: Vec<&[u8]> = ms.iter().map(|m| &m[..]).collect();
                    let (n, s) = set::remove(&mut w, &st, s, &refs).unwrap();
                    if set::card(&w, s) == 0 {
                        ks::delete(&mut w, &st, &e.with_obj(s.enc, s.obj)).unwrap();
                    } else {
                        ks::set_value(&mut w, &e, T_SET, s.enc, s.obj).unwrap();
                    }
                    if commit {
                        let mut c = 0;
                        for m in &ms {
                            c += model.remove(m) as u64;
                        }
                        assert_eq!(n, c);
                    }
                }
            } else if op < 85 {
                if let Some((e, s)) = set_of(&w, &st) {
                    let (got, s) = set::pop(&mut w, &st, s, 1 + rng.below(3) as usize).unwrap();
                    if set::card(&w, s) == 0 {
                        ks::delete(&mut w, &st, &e.with_obj(s.enc, s.obj)).unwrap();
                    } else {
                        ks::set_value(&mut w, &e, T_SET, s.enc, s.obj).unwrap();
                    }
                    if commit {
                        for m in got {
                            assert!(model.remove(&m), "popped a member not in the set");
                        }
                    }
                }
            } else {
                let v = View::of(heap);
                let m = format!("member-{}", rng.below(400)).into_bytes();
                match set_of(&v, &st) {
                    None => assert!(model.is_empty()),
                    Some((_, s)) => {
                        assert_eq!(set::contains(&v, &st, s, &m), model.contains(&m));
                        assert_eq!(set::card(&v, s), model.len() as u64);
                    }
                }
            }
            finish(w, commit);
        }
        assert!(saw_dict, "the set grew past the pack");
        let verify = |heap: &Heap, st: &Store| {
            let v = View::of(heap);
            let mut got = Vec::new();
            if let Some((_, s)) = set_of(&v, st) {
                set::for_each(&v, s, |m| got.push(m.to_vec()));
            }
            got.sort();
            let mut want: Vec<_> = model.iter().cloned().collect();
            want.sort();
            assert_eq!(got, want);
            check_used(heap, st);
        };
        verify(f.heap(), &st);
        if f.reopen() {
            verify(f.heap(), &Store::open(f.heap()).unwrap());
        }
    }
}

fn hash_of(m: &impl tiermem_kv::ds::Mem, st: &Store, key: &[u8]) -> Option<(ks::Entry, HashObj)> {
    ks::lookup(m, st, key).map(|e| {
        assert_eq!(e.ty(), T_HASH);
        (
            e,
            HashObj {
                enc: e.enc(),
                obj: e.obj(),
            },
        )
    })
}

#[test]
fn hashes() {
    for eng in ENGINES {
        let mut f = Fixture::new(eng);
        let st = Store::open(f.heap()).unwrap();
        // Several hashes: small ones stay packs, "h0" grows into a dict.
        let mut model: HashMap<Vec<u8>, HashMap<Vec<u8>, Vec<u8>>> = HashMap::new();
        let mut rng = Rng(0x5eed_0004);
        for _ in 0..6000 {
            let heap = f.heap();
            let commit = rng.chance(93);
            let mut w = Wtx::new(heap, st.root);
            let key = format!("h{}", rng.below(4)).into_bytes();
            let universe = if key == b"h0" { 300 } else { 12 };
            let op = rng.below(100);
            if op < 55 {
                let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..1 + rng.below(4))
                    .map(|_| {
                        let f = format!("field{}", rng.below(universe)).into_bytes();
                        let v = if rng.chance(3) {
                            vec![b'v'; 2000 + rng.below(9000) as usize]
                        } else {
                            rng.bytes(120)
                        };
                        (f, v)
                    })
                    .collect();
                let refs: Vec<(&[u8], &[u8])> =
                    pairs.iter().map(|(f, v)| (&f[..], &v[..])).collect();
                let (p, cur) = ks::probe(&w, &st, &key);
                let (added, h) = hash::set(
                    &mut w,
                    &st,
                    cur.map(|e| HashObj {
                        enc: e.enc(),
                        obj: e.obj(),
                    }),
                    &refs,
                )
                .unwrap();
                match cur {
                    Some(e) => ks::set_value(&mut w, &e, T_HASH, h.enc, h.obj).unwrap(),
                    None => ks::insert_object(&mut w, &st, &p, &key, T_HASH, h.enc, h.obj).unwrap(),
                }
                if commit {
                    let m = model.entry(key).or_default();
                    let before = m.len();
                    for (f, v) in pairs {
                        m.insert(f, v);
                    }
                    assert_eq!(added as usize, m.len() - before);
                }
            } else if op < 75 {
                if let Some((e, h)) = hash_of(&w, &st, &key) {
                    let fs: Vec<Vec<u8>> = (0..1 + rng.below(3))
                        .map(|_| format!("field{}", rng.below(universe)).into_bytes())
                        .collect();
                    let refs: Vec<&[u8]> = fs.iter().map(|f| &f[..]).collect();
                    let (n, h) = hash::del(&mut w, &st, h, &refs).unwrap();
                    if hash::len(&w, h) == 0 {
                        ks::delete(&mut w, &st, &e.with_obj(h.enc, h.obj)).unwrap();
                    } else {
                        ks::set_value(&mut w, &e, T_HASH, h.enc, h.obj).unwrap();
                    }
                    if commit {
                        let m = model.get_mut(&key).unwrap();
                        let mut c = 0;
                        for f in &fs {
                            c += m.remove(f).is_some() as u64;
                        }
                        if m.is_empty() {
                            model.remove(&key);
                        }
                        assert_eq!(n, c);
                    }
                }
            } else {
                let v = View::of(heap);
                let fld = format!("field{}", rng.below(universe)).into_bytes();
                match hash_of(&v, &st, &key) {
                    None => assert!(!model.contains_key(&key)),
                    Some((_, h)) => {
                        let m = &model[&key];
                        assert_eq!(
                            hash::get(&v, &st, h, &fld).map(|c| c.into_owned()).as_ref(),
                            m.get(&fld)
                        );
                        assert_eq!(hash::len(&v, h), m.len() as u64);
                    }
                }
            }
            finish(w, commit);
        }
        let verify = |heap: &Heap, st: &Store| {
            let v = View::of(heap);
            assert_eq!(ks::len(&v, st), model.len() as u64);
            for (k, m) in &model {
                let (_, h) = hash_of(&v, st, k).unwrap();
                let mut got = HashMap::new();
                hash::for_each(&v, h, |f, x| {
                    got.insert(f.to_vec(), x.to_vec());
                });
                assert_eq!(&got, m);
            }
            check_used(heap, st);
        };
        verify(f.heap(), &st);
        if f.reopen() {
            verify(f.heap(), &Store::open(f.heap()).unwrap());
        }
    }
}

fn zset_of(m: &impl tiermem_kv::ds::Mem, st: &Store) -> Option<(ks::Entry, u64)> {
    ks::lookup(m, st, b"Z").map(|e| {
        assert_eq!(e.ty(), T_ZSET);
        (e, e.obj())
    })
}

fn sorted(model: &BTreeMap<Vec<u8>, f64>) -> Vec<(Vec<u8>, f64)> {
    let mut v: Vec<_> = model.iter().map(|(m, s)| (m.clone(), *s)).collect();
    v.sort_by(|a, b| a.1.partial_cmp(&b.1).unwrap().then(a.0.cmp(&b.0)));
    v
}

/// A range's elements in order (`rev`: reversed), `off` skipped, then at most `lim` (negative:
/// all): what a range command with LIMIT returns.
fn window<T>(mut v: Vec<T>, rev: bool, off: u64, lim: i64) -> Vec<T> {
    if rev {
        v.reverse();
    }
    v.into_iter()
        .skip(off as usize)
        .take(if lim < 0 { usize::MAX } else { lim as usize })
        .collect()
}

#[test]
fn sorted_sets() {
    for eng in ENGINES {
        let mut f = Fixture::new(eng);
        let st = Store::open(f.heap()).unwrap();
        let mut model: BTreeMap<Vec<u8>, f64> = BTreeMap::new();
        let mut rng = Rng(0x5eed_0005);
        for step in 0..6000 {
            let heap = f.heap();
            let commit = rng.chance(93);
            let mut w = Wtx::new(heap, st.root);
            let op = rng.below(100);
            let mem = format!("m{}", rng.below(500)).into_bytes();
            let score = (rng.below(60) as f64 - 30.0) / 2.0;
            if op < 50 {
                let fl = AddFlags {
                    nx: rng.chance(10),
                    xx: false,
                    gt: false,
                    lt: false,
                    incr: rng.chance(10),
                };
                let fl = AddFlags {
                    xx: !fl.nx && rng.chance(10),
                    gt: !fl.nx && rng.chance(10),
                    ..fl
                };
                let fl = AddFlags {
                    lt: !fl.nx && !fl.gt && rng.chance(10),
                    ..fl
                };
                let z = match zset_of(&w, &st) {
                    Some((_, z)) => z,
                    None => {
                        let (p, _) = ks::probe(&w, &st, b"Z");
                        let z = zset::create(&mut w).unwrap();
                        ks::insert_object(&mut w, &st, &p, b"Z", T_ZSET, 0, z).unwrap();
                        z
                    }
                };
                let r = zset::add(&mut w, &st, z, score, &mem, fl).unwrap();
                if zset::len(&w, z) == 0 {
                    let e = ks::lookup(&w, &st, b"Z").unwrap();
                    ks::delete(&mut w, &st, &e).unwrap();
                }
                zset::check(&w, z).unwrap_or_else(|e| panic!("step {step}: {e}"));
                if commit {
                    let cur = model.get(&mem).copied();
                    let want = match cur {
                        None if fl.xx => Added::Skipped,
                        None => Added::New(score),
                        Some(_) if fl.nx => Added::Skipped,
                        Some(c) => {
                            let n = if fl.incr { c + score } else { score };
                            if (fl.gt && n <= c) || (fl.lt && n >= c) {
                                Added::Skipped
                            } else if n == c {
                                Added::Same(c)
                            } else {
                                Added::Changed(n)
                            }
                        }
                    };
                    assert_eq!(r, want);
                    if let Added::New(s) | Added::Changed(s) = r {
                        model.insert(mem, s);
                    }
                }
            } else if op < 70 {
                if let Some((e, z)) = zset_of(&w, &st) {
                    let r = zset::remove(&mut w, &st, z, &mem).unwrap();
                    if zset::len(&w, z) == 0 {
                        ks::delete(&mut w, &st, &e).unwrap();
                    } else {
                        zset::check(&w, z).unwrap();
                    }
                    if commit {
                        assert_eq!(r, model.remove(&mem).is_some());
                    }
                }
            } else if op < 80 {
                if let Some((e, z)) = zset_of(&w, &st) {
                    let max = rng.chance(50);
                    let c = 1 + rng.below(4) as usize;
                    let got = zset::pop(&mut w, &st, z, c, max).unwrap();
                    if zset::len(&w, z) == 0 {
                        ks::delete(&mut w, &st, &e).unwrap();
                    }
                    if commit {
                        let s = sorted(&model);
                        let want: Vec<_> = if max {
                            s.iter().rev().take(c).cloned().collect()
                        } else {
                            s.iter().take(c).cloned().collect()
                        };
                        assert_eq!(got, want);
                        for (m, _) in got {
                            model.remove(&m);
                        }
                    }
                }
            } else {
                let v = View::of(heap);
                let s = sorted(&model);
                match zset_of(&v, &st) {
                    None => assert!(model.is_empty()),
                    Some((_, z)) => {
                        assert_eq!(zset::score_of(&v, &st, z, &mem), model.get(&mem).copied());
                        let (a, b) = (score, (rng.below(60) as f64 - 30.0) / 2.0);
                        let min = Bound {
                            score: a.min(b),
                            excl: rng.chance(50),
                        };
                        let max = Bound {
                            score: a.max(b),
                            excl: rng.chance(50),
                        };
                        let rev = rng.chance(30);
                        let (off, lim) = (rng.below(3), rng.below(8) as i64 - 1);
                        let mut got = Vec::new();
                        let r = zset::ScoreRange {
                            min,
                            max,
                            rev,
                            offset: off,
                            limit: lim,
                        };
                        zset::range_by_score(&v, z, r, |m, s| got.push((m.to_vec(), s)));
                        let inside = |x: f64| {
                            (if min.excl {
                                x > min.score
                            } else {
                                x >= min.score
                            }) && (if max.excl {
                                x < max.score
                            } else {
                                x <= max.score
                            })
                        };
                        let want = window(
                            s.iter().filter(|(_, x)| inside(*x)).cloned().collect(),
                            rev,
                            off,
                            lim,
                        );
                        assert_eq!(
                            got, want,
                            "by score {min:?} {max:?} rev {rev} limit {off} {lim}"
                        );
                        let n = s.len() as u64;
                        let st_ = rng.below(n);
                        let en = st_ + rng.below(n - st_);
                        let mut got = Vec::new();
                        zset::range_by_rank(&v, z, st_, en, rev, |m, s| got.push((m.to_vec(), s)));
                        let mut all = s.clone();
                        if rev {
                            all.reverse();
                        }
                        assert_eq!(got, all[st_ as usize..=en as usize].to_vec());
                        // Ranks and counts from the spans.
                        let want_rank = s.iter().position(|(m, _)| *m == mem).map(|r| r as u64);
                        assert_eq!(zset::rank(&v, &st, z, &mem), want_rank, "rank");
                        let count = s.iter().filter(|(_, x)| inside(*x)).count() as u64;
                        assert_eq!(zset::count_by_score(&v, z, min, max), count, "count");
                    }
                }
            }
            finish(w, commit);
        }
        let verify = |heap: &Heap, st: &Store| {
            let v = View::of(heap);
            match zset_of(&v, st) {
                None => assert!(model.is_empty()),
                Some((_, z)) => {
                    zset::check(&v, z).unwrap();
                    let mut got = Vec::new();
                    zset::range_by_rank(&v, z, 0, zset::len(&v, z) - 1, false, |m, s| {
                        got.push((m.to_vec(), s))
                    });
                    assert_eq!(got, sorted(&model));
                }
            }
            check_used(heap, st);
        };
        verify(f.heap(), &st);
        if f.reopen() {
            verify(f.heap(), &Store::open(f.heap()).unwrap());
        }
    }
}

/// Big values and a whole keyspace go on the garbage list in O(1) and come back to the
/// allocator in bounded batches; a reopen in the middle resumes (vnvm).
#[test]
fn garbage_is_freed_in_batches_and_resumes() {
    for eng in ENGINES {
        let mut f = Fixture::new(eng);
        let st = Store::open(f.heap()).unwrap();
        let base = f.heap().stats().unwrap();
        let heap = f.heap();
        // A big list (~250 nodes), a big set and hash (dicts), a big zset, many small keys.
        let mut w = Wtx::new(heap, st.root);
        let (p, _) = ks::probe(&w, &st, b"biglist");
        let l = list::create(&mut w).unwrap();
        let elems: Vec<Vec<u8>> = (0..10_000)
            .map(|i| format!("{i:0100}").into_bytes())
            .collect();
        let refs: Vec<&[u8]> = elems.iter().map(|e| &e[..]).collect();
        list::push(&mut w, l, &refs, false).unwrap();
        ks::insert_object(&mut w, &st, &p, b"biglist", T_LIST, 0, l).unwrap();
        let ms: Vec<Vec<u8>> = (0..1000).map(|i| format!("m{i}").into_bytes()).collect();
        let mrefs: Vec<&[u8]> = ms.iter().map(|e| &e[..]).collect();
        let (p, _) = ks::probe(&w, &st, b"bigset");
        let (_, s) = set::add(&mut w, &st, None, &mrefs).unwrap();
        ks::insert_object(&mut w, &st, &p, b"bigset", T_SET, s.enc, s.obj).unwrap();
        let (p, _) = ks::probe(&w, &st, b"bigzset");
        let z = zset::create(&mut w).unwrap();
        for (i, m) in mrefs.iter().enumerate() {
            zset::add(&mut w, &st, z, i as f64, m, AddFlags::default()).unwrap();
        }
        ks::insert_object(&mut w, &st, &p, b"bigzset", T_ZSET, 0, z).unwrap();
        w.commit().unwrap();
        let mut w = Wtx::new(heap, st.root);
        for i in 0..3000 {
            let k = format!("k{i}").into_bytes();
            let (p, _) = ks::probe(&w, &st, &k);
            ks::insert_string(&mut w, &st, &p, &k, b"value").unwrap();
        }
        let pairs: Vec<(&[u8], &[u8])> = mrefs.iter().map(|m| (*m, &b"v"[..])).collect();
        let (p, _) = ks::probe(&w, &st, b"bighash");
        let (_, h) = hash::set(&mut w, &st, None, &pairs).unwrap();
        ks::insert_object(&mut w, &st, &p, b"bighash", T_HASH, h.enc, h.obj).unwrap();
        w.commit().unwrap();
        check_used(heap, &st);

        // DEL of the big list: O(1) in its transaction, the nodes wait on the garbage list.
        let mut w = Wtx::new(heap, st.root);
        let e = ks::lookup(&w, &st, b"biglist").unwrap();
        ks::delete(&mut w, &st, &e).unwrap();
        assert!(
            w.logged_bytes() < 4096,
            "DEL of a big list is O(1): {}",
            w.logged_bytes()
        );
        w.commit().unwrap();
        assert!(st.has_garbage(&View::of(heap)));
        // FLUSHALL: O(1) as well.
        let mut w = Wtx::new(heap, st.root);
        garbage::flush(&mut w, &st).unwrap();
        assert!(
            w.logged_bytes() < 8192,
            "FLUSHALL is O(1): {}",
            w.logged_bytes()
        );
        w.commit().unwrap();
        assert_eq!(ks::len(&View::of(heap), &st), 0);
        check_used(heap, &st);

        // Bounded batches; reopen halfway (vnvm).
        let mut batches = 0;
        let mut reopened = false;
        loop {
            let heap = f.heap();
            let mut w = Wtx::new(heap, st.root);
            let n = garbage::collect(&mut w, &st, 200).unwrap();
            assert!(
                w.logged_bytes() < 200_000,
                "a bounded batch: {}",
                w.logged_bytes()
            );
            w.commit().unwrap();
            if n == 0 {
                break;
            }
            batches += 1;
            if batches == 20 && !reopened {
                reopened = true;
                if f.reopen() {
                    let st2 = Store::open(f.heap()).unwrap();
                    assert_eq!(st2.root, st.root);
                    check_used(f.heap(), &st2);
                }
            }
            assert!(batches < 10_000);
        }
        assert!(batches > 30, "freed over many batches ({batches})");
        let heap = f.heap();
        assert!(!st.has_garbage(&View::of(heap)));
        assert_eq!(st.garbage_records(&View::of(heap)), 0);
        check_used(heap, &st);
        let end = heap.stats().unwrap();
        // Everything but the (now larger) keyspace table is back.
        assert!(
            end.allocated_blocks <= base.allocated_blocks + 16,
            "blocks {} -> {}",
            base.allocated_blocks,
            end.allocated_blocks
        );
        let _ = Eng::Vnvm;
    }
}

/// Lexicographic ranges over members of one score, against a sorted model: Redis's ends
/// (`-`, `+`, `[x`, `(x`), offsets and limits, both directions, counts; and ranks after
/// every change.
#[test]
fn sorted_set_lex_ranges_and_ranks() {
    use tiermem_kv::ds::zset::Lex;
    for eng in ENGINES {
        let f = Fixture::new(eng);
        let st = Store::open(f.heap()).unwrap();
        let mut model: std::collections::BTreeSet<Vec<u8>> = Default::default();
        let mut rng = Rng(0x5eed_1e55);
        let mut w = Wtx::new(f.heap(), st.root);
        let (p, _) = ks::probe(&w, &st, b"L");
        let z = zset::create(&mut w).unwrap();
        ks::insert_object(&mut w, &st, &p, b"L", T_ZSET, 0, z).unwrap();
        finish(w, true);
        let word = |rng: &mut Rng| {
            let n = 1 + rng.below(3);
            (0..n)
                .map(|_| b'a' + rng.below(5) as u8)
                .collect::<Vec<u8>>()
        };
        let end = |rng: &mut Rng, w: Vec<u8>| match rng.below(10) {
            0 => Lex::Min,
            1 => Lex::Max,
            2..=5 => Lex::Incl(w),
            _ => Lex::Excl(w),
        };
        for step in 0..3000 {
            let mut w = Wtx::new(f.heap(), st.root);
            let m = word(&mut rng);
            if rng.chance(60) {
                zset::add(&mut w, &st, z, 0.0, &m, AddFlags::default()).unwrap();
                model.insert(m.clone());
            } else if model.len() > 1 {
                zset::remove(&mut w, &st, z, &m).unwrap();
                model.remove(&m);
            }
            if step % 10 == 0 {
                zset::check(&w, z).unwrap_or_else(|e| panic!("step {step}: {e}"));
            }
            let all: Vec<Vec<u8>> = model.iter().cloned().collect();
            let probe = word(&mut rng);
            assert_eq!(
                zset::rank(&w, &st, z, &probe),
                all.iter().position(|x| *x == probe).map(|r| r as u64),
                "step {step}: rank of {probe:?}"
            );
            let (lo, hi) = (word(&mut rng), word(&mut rng));
            let (min, max) = (end(&mut rng, lo), end(&mut rng, hi));
            let inside: Vec<Vec<u8>> = all
                .iter()
                .filter(|x| min.gte_min(x) && max.lte_max(x))
                .cloned()
                .collect();
            assert_eq!(
                zset::count_by_lex(&w, z, &min, &max),
                inside.len() as u64,
                "step {step}: count {min:?} {max:?}"
            );
            let rev = rng.chance(40);
            let (off, lim) = (rng.below(3), rng.below(6) as i64 - 1);
            let mut got = Vec::new();
            zset::range_by_lex(&w, z, &min, &max, rev, off, lim, |m, _| {
                got.push(m.to_vec())
            });
            let want = window(inside, rev, off, lim);
            assert_eq!(
                got, want,
                "step {step}: {min:?} {max:?} rev {rev} {off} {lim}"
            );
            finish(w, true);
        }
    }
}

/// A heap of another layout version (here: version 1, before sorted-set spans) is refused at
/// open with a message naming both versions and what to do, and is left as it was.
#[test]
fn another_layout_version_is_refused_unchanged() {
    let mut f = Fixture::new(Eng::Vnvm);
    let st = Store::open(f.heap()).unwrap();
    let mut w = Wtx::new(f.heap(), st.root);
    w.write_u64(st.root + 8, 1).unwrap();
    finish(w, true);
    let before = View::of(f.heap()).u64(st.root + 8);
    let e = match Store::open(f.heap()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a version-1 heap was opened"),
    };
    assert!(
        e.contains("layout version 1") && e.contains("reads version 2") && e.contains("MIGRATE"),
        "{e}"
    );
    assert!(f.reopen());
    assert!(Store::open(f.heap()).is_err());
    assert_eq!(View::of(f.heap()).u64(st.root + 8), before);
}
