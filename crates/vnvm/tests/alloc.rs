//! The transactional allocator: randomized sequences against a model across commit and abort,
//! persistence across instances, crash safety, bad offsets, concurrency.

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::time::Duration;
use tiermem_vnvm::alloc::{AllocError, HeapStats, TxAlloc, HEAP_HEADER};
use tiermem_vnvm::{nv_init, Mode, Region, Vnvm, VnvmError};

fn write(vn: &Vnvm, r: &Region, tid: u64, off: u64, data: &[u8]) {
    // SAFETY: callers pass offsets of blocks inside the region.
    let dst = unsafe { r.as_ptr().add(off as usize) };
    assert_eq!(vn.nv_write(tid, dst, data).unwrap(), data.len());
}

fn read_u64(r: &Region, off: u64) -> u64 {
    let mut b = [0u8; 8];
    r.read(off as usize, &mut b);
    u64::from_le_bytes(b)
}

fn header(r: &Region) -> Vec<u8> {
    let mut v = vec![0u8; HEAP_HEADER as usize];
    r.read(0, &mut v);
    v
}

/// Live blocks must not overlap and must lie in the heap.
fn assert_disjoint(live: &BTreeMap<u64, u64>, a: &TxAlloc, tid: Option<u64>) {
    let mut end = HEAP_HEADER;
    for (&off, &size) in live {
        assert!(
            off >= end,
            "block {off} overlaps the previous one (ends {end})"
        );
        let usable = a.usable_size(tid, off).unwrap();
        assert!(usable >= size, "usable {usable} < requested {size}");
        end = off + usable;
    }
}

fn random_size(rng: &mut impl Rng) -> u64 {
    match rng.gen_range(0..10) {
        0..=5 => rng.gen_range(1..=128),
        6..=8 => rng.gen_range(129..=70_000),
        _ => rng.gen_range(70_001..=300_000),
    }
}

#[test]
fn randomized_against_a_model() {
    let d = tmp();
    let vn = nv_init(&small_cfg(d.path(), 512, 256)).unwrap();
    let r = vn
        .nv_allocate(d.path().join("heap"), 16 << 20, Mode::Private)
        .unwrap();
    let a = TxAlloc::open(&vn, &r).unwrap();
    let empty = a.check().unwrap();
    assert_eq!(empty.allocated_blocks, 0);
    // Committed model: payload offset -> (requested size, tag written into the block).
    let mut model: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for seed in 0..6u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for _ in 0..40 {
            let before_hdr = header(&r);
            let before = a.check().unwrap();
            let tid = vn.nv_txbegin();
            let mut live = model.clone();
            let mut root = a.nv_root(None).unwrap();
            for _ in 0..rng.gen_range(1..12) {
                if live.is_empty() || rng.gen_bool(0.6) {
                    let size = random_size(&mut rng);
                    match a.nv_tx_alloc(&vn, tid, size) {
                        Ok(off) => {
                            assert_eq!(off % 16, 0);
                            assert!(!live.contains_key(&off), "{off} handed out twice");
                            let tagv = rng.gen::<u64>() | 1;
                            write(&vn, &r, tid, off, &tagv.to_le_bytes());
                            live.insert(off, (size, tagv));
                        }
                        Err(AllocError::OutOfSpace { .. }) => {}
                        Err(e) => panic!("alloc {size}: {e}"),
                    }
                } else if rng.gen_bool(0.15) {
                    let k = *live.keys().nth(rng.gen_range(0..live.len())).unwrap();
                    a.nv_set_root(&vn, tid, k).unwrap();
                    assert_eq!(a.nv_root(Some(tid)).unwrap(), k);
                    root = k;
                } else {
                    let k = *live.keys().nth(rng.gen_range(0..live.len())).unwrap();
                    if k == root {
                        assert!(matches!(
                            a.nv_tx_free(&vn, tid, k),
                            Err(AllocError::BadOffset { .. })
                        ));
                        continue;
                    }
                    a.nv_tx_free(&vn, tid, k).unwrap();
                    live.remove(&k);
                    assert!(matches!(
                        a.nv_tx_free(&vn, tid, k),
                        Err(AllocError::DoubleFree { .. })
                    ));
                }
                let sizes: BTreeMap<u64, u64> = live.iter().map(|(&o, &(s, _))| (o, s)).collect();
                assert_disjoint(&sizes, &a, Some(tid));
            }
            if rng.gen_bool(0.3) {
                a.abort(&vn, tid).unwrap();
                assert_eq!(header(&r), before_hdr, "abort changed the allocator header");
                assert_eq!(a.check().unwrap(), before, "abort changed the heap");
            } else {
                a.commit(&vn, tid).unwrap();
                model = live;
                let s = a.check().unwrap();
                assert_eq!(s.allocated_blocks, model.len() as u64);
                assert_eq!(s.root, a.nv_root(None).unwrap());
            }
            for (&off, &(_, tagv)) in &model {
                assert_eq!(read_u64(&r, off), tagv, "block {off} was overwritten");
            }
        }
    }
    vn.nv_release().unwrap();
}

#[test]
fn persists_across_instances() {
    let d = tmp();
    let file = d.path().join("heap");
    let (root, other, stats) = {
        let vn = nv_init(&small_cfg(d.path(), 64, 64)).unwrap();
        let r = vn.nv_allocate(&file, 1 << 20, Mode::Private).unwrap();
        let a = TxAlloc::open(&vn, &r).unwrap();
        let tid = vn.nv_txbegin();
        let root = a.nv_tx_alloc(&vn, tid, 100).unwrap();
        let other = a.nv_tx_alloc(&vn, tid, 100_000).unwrap();
        let gone = a.nv_tx_alloc(&vn, tid, 40).unwrap();
        write(&vn, &r, tid, root, b"the root object");
        write(&vn, &r, tid, other, &other.to_le_bytes());
        a.nv_set_root(&vn, tid, root).unwrap();
        a.nv_tx_free(&vn, tid, gone).unwrap();
        // Read committed: nothing visible before the commit.
        assert_eq!(a.nv_root(None).unwrap(), 0);
        assert_eq!(a.nv_root(Some(tid)).unwrap(), root);
        a.commit(&vn, tid).unwrap();
        let stats = a.check().unwrap();
        assert_eq!(stats.allocated_blocks, 2);
        assert_eq!(stats.free_blocks, 1);
        vn.nv_release().unwrap();
        (root, other, stats)
    };
    let vn = nv_init(&small_cfg(d.path(), 64, 64)).unwrap();
    let r = vn.nv_allocate(&file, 1 << 20, Mode::Private).unwrap();
    let a = TxAlloc::open(&vn, &r).unwrap();
    assert_eq!(a.check().unwrap(), stats);
    assert_eq!(a.nv_root(None).unwrap(), root);
    let mut b = [0u8; 15];
    r.read(root as usize, &mut b);
    assert_eq!(&b, b"the root object");
    assert_eq!(read_u64(&r, other), other);
    assert!(a.usable_size(None, other).unwrap() >= 100_000);
    // The freed 40-byte block is reused; nothing overlaps the live ones.
    let tid = vn.nv_txbegin();
    let n = a.nv_tx_alloc(&vn, tid, 33).unwrap();
    assert!(n != root && n != other);
    a.commit(&vn, tid).unwrap();
    assert_eq!(a.check().unwrap().free_blocks, 0);
    vn.nv_release().unwrap();
}

#[test]
fn abort_and_crash_leave_the_free_state_unchanged() {
    let d = tmp();
    let file = d.path().join("heap");
    let vn = nv_init(&small_cfg(d.path(), 64, 64)).unwrap();
    let r = vn.nv_allocate(&file, 1 << 20, Mode::Private).unwrap();
    let a = TxAlloc::open(&vn, &r).unwrap();
    let t = vn.nv_txbegin();
    let keep = a.nv_tx_alloc(&vn, t, 64).unwrap();
    let freed = a.nv_tx_alloc(&vn, t, 64).unwrap();
    a.commit(&vn, t).unwrap();
    let t = vn.nv_txbegin();
    a.nv_tx_free(&vn, t, freed).unwrap();
    a.commit(&vn, t).unwrap();
    let before = a.check().unwrap();
    let hdr = header(&r);

    // Abort: allocations, frees and a root change all vanish.
    let t = vn.nv_txbegin();
    let x = a.nv_tx_alloc(&vn, t, 64).unwrap();
    assert_eq!(x, freed, "LIFO reuse of the freed block");
    a.nv_tx_alloc(&vn, t, 200_000).unwrap();
    a.nv_tx_free(&vn, t, keep).unwrap();
    a.nv_set_root(&vn, t, x).unwrap();
    a.abort(&vn, t).unwrap();
    assert_eq!(a.check().unwrap(), before);
    assert_eq!(header(&r), hdr);

    // Crash in the middle of a transaction: recovery leaves the committed heap.
    let t = vn.nv_txbegin();
    a.nv_tx_alloc(&vn, t, 64).unwrap();
    a.nv_tx_alloc(&vn, t, 5000).unwrap();
    a.nv_tx_free(&vn, t, keep).unwrap();
    drop(a);
    drop(r);
    vn.abandon();
    let vn = nv_init(&small_cfg(d.path(), 64, 64)).unwrap();
    let r = vn.nv_allocate(&file, 1 << 20, Mode::Private).unwrap();
    let a = TxAlloc::open(&vn, &r).unwrap();
    assert_eq!(a.check().unwrap(), before);
    assert_eq!(header(&r), hdr);
    // A committed transaction before a crash is kept entirely.
    let t = vn.nv_txbegin();
    let y = a.nv_tx_alloc(&vn, t, 64).unwrap();
    a.nv_set_root(&vn, t, y).unwrap();
    a.commit(&vn, t).unwrap();
    let after = a.check().unwrap();
    drop(a);
    drop(r);
    vn.abandon();
    let vn = nv_init(&small_cfg(d.path(), 64, 64)).unwrap();
    let r = vn.nv_allocate(&file, 1 << 20, Mode::Private).unwrap();
    let a = TxAlloc::open(&vn, &r).unwrap();
    assert_eq!(a.check().unwrap(), after);
    assert_eq!(a.nv_root(None).unwrap(), y);
    vn.nv_release().unwrap();
}

#[test]
fn bad_offsets_double_free_and_bad_tids() {
    let d = tmp();
    let vn = nv_init(&small_cfg(d.path(), 64, 64)).unwrap();
    let r = vn
        .nv_allocate(d.path().join("heap"), 1 << 20, Mode::Private)
        .unwrap();
    let a = TxAlloc::open(&vn, &r).unwrap();
    let t = vn.nv_txbegin();
    let b = a.nv_tx_alloc(&vn, t, 100).unwrap();
    let big = a.nv_tx_alloc(&vn, t, 100_000).unwrap();
    a.commit(&vn, t).unwrap();
    let before = a.check().unwrap();

    let t = vn.nv_txbegin();
    for off in [0, 8, HEAP_HEADER, b + 16, b + 8, b + 1, big + 4096, 1 << 30] {
        match a.nv_tx_free(&vn, t, off) {
            Err(AllocError::BadOffset { offset, .. }) => assert_eq!(offset, off),
            other => panic!("free of foreign offset {off}: {other:?}"),
        }
    }
    // Data that looks like a header is still not a block (the tag includes its offset).
    let mut hdr = [0u8; 16];
    r.read((b - 16) as usize, &mut hdr);
    write(&vn, &r, t, b + 32, &hdr);
    a.commit(&vn, t).unwrap();
    let t = vn.nv_txbegin();
    assert!(matches!(
        a.nv_tx_free(&vn, t, b + 48),
        Err(AllocError::BadOffset { .. })
    ));
    a.nv_tx_free(&vn, t, b).unwrap();
    let e = a.nv_tx_free(&vn, t, b).unwrap_err();
    assert!(
        matches!(e, AllocError::DoubleFree { offset } if offset == b),
        "{e}"
    );
    assert!(e.to_string().contains("double free"), "{e}");
    a.commit(&vn, t).unwrap();
    let t = vn.nv_txbegin();
    assert!(matches!(
        a.nv_tx_free(&vn, t, b),
        Err(AllocError::DoubleFree { .. })
    ));
    assert!(matches!(
        a.nv_set_root(&vn, t, b),
        Err(AllocError::DoubleFree { .. })
    ));
    assert!(matches!(
        a.nv_tx_alloc(&vn, t, 0),
        Err(AllocError::InvalidSize { .. })
    ));
    assert!(matches!(
        a.nv_tx_alloc(&vn, t, 1_000_000),
        Err(AllocError::OutOfSpace { .. })
    ));
    a.abort(&vn, t).unwrap();
    let s = a.check().unwrap();
    assert_eq!(s.allocated_blocks, before.allocated_blocks - 1);

    // Bad tids: never begun, committed, aborted.
    assert!(matches!(
        a.nv_tx_alloc(&vn, 999_999, 10),
        Err(AllocError::Vnvm(VnvmError::UnknownTx(999_999)))
    ));
    assert!(matches!(
        a.nv_tx_alloc(&vn, t, 10),
        Err(AllocError::Vnvm(VnvmError::TxAborted { .. }))
    ));
    let t2 = vn.nv_txbegin();
    vn.nv_commit(t2).unwrap();
    assert!(matches!(
        a.nv_tx_free(&vn, t2, big),
        Err(AllocError::Vnvm(VnvmError::TxCommitted(_)))
    ));
    assert_eq!(a.check().unwrap(), s);

    // A region with other data is not a heap, and is left alone.
    let other = vn
        .nv_allocate(d.path().join("other"), 8192, Mode::Private)
        .unwrap();
    let t = vn.nv_txbegin();
    write(&vn, &other, t, 0, b"user data");
    vn.nv_commit(t).unwrap();
    let e = TxAlloc::open(&vn, &other).unwrap_err();
    assert!(matches!(e, AllocError::NotAHeap { .. }), "{e}");
    // A damaged header is reported, not used.
    let t = vn.nv_txbegin();
    write(&vn, &r, t, 40, &7u64.to_le_bytes());
    vn.nv_commit(t).unwrap();
    let t = vn.nv_txbegin();
    let e = a.nv_tx_alloc(&vn, t, 10).unwrap_err();
    assert!(matches!(e, AllocError::Damaged { .. }), "{e}");
    vn.nv_release().unwrap();
}

#[test]
fn one_transaction_holds_the_allocator_until_it_ends() {
    let d = tmp();
    let vn = nv_init(&small_cfg(d.path(), 256, 64)).unwrap();
    let r = vn
        .nv_allocate(d.path().join("heap"), 4 << 20, Mode::Private)
        .unwrap();
    let a = TxAlloc::open(&vn, &r).unwrap();
    // Every open of the region is the same allocator.
    let a2 = TxAlloc::open(&vn, &r).unwrap();
    a.set_lock_timeout(Duration::from_millis(50));
    let t1 = vn.nv_txbegin();
    let t2 = vn.nv_txbegin();
    let x = a.nv_tx_alloc(&vn, t1, 64).unwrap();
    match a2.nv_tx_alloc(&vn, t2, 64) {
        Err(AllocError::Busy { tid, holder, .. }) => assert_eq!((tid, holder), (t2, t1)),
        other => panic!("expected Busy, got {other:?}"),
    }
    // Committed behind the allocator's back: the next transaction takes over safely.
    vn.nv_commit(t1).unwrap();
    let y = a2.nv_tx_alloc(&vn, t2, 64).unwrap();
    assert_ne!(x, y);
    a2.commit(&vn, t2).unwrap();
    assert_eq!(a.check().unwrap().allocated_blocks, 2);

    // Threads allocating concurrently: every block distinct, heap consistent.
    a.set_lock_timeout(Duration::from_secs(30));
    let offs: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let (vn, a, r) = (&vn, &a, &r);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for j in 0..25u64 {
                        let t = vn.nv_txbegin();
                        let o = a.nv_tx_alloc(vn, t, 16 + (i * 25 + j) % 300).unwrap();
                        write(vn, r, t, o, &(o ^ 0x5a5a).to_le_bytes());
                        if j % 5 == 4 {
                            a.abort(vn, t).unwrap();
                        } else {
                            a.commit(vn, t).unwrap();
                            mine.push(o);
                        }
                    }
                    mine
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut sorted = offs.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), offs.len(), "a block was handed out twice");
    for &o in &offs {
        assert_eq!(read_u64(&r, o), o ^ 0x5a5a);
    }
    let s: HeapStats = a.check().unwrap();
    assert_eq!(s.allocated_blocks, 2 + offs.len() as u64);
    vn.nv_release().unwrap();
}

/// A memory over a caller's buffer whose writes apply at commit, named `name` (a stand-in for
/// a mapping: two of them over one buffer are two memories mapped at the same address).
struct BufMem {
    base: *mut u8,
    len: usize,
    name: &'static str,
    open: std::sync::Mutex<(u64, BTreeMap<u64, Writes>)>,
}

/// A transaction's writes: (offset, bytes).
type Writes = Vec<(u64, Vec<u8>)>;

impl tiermem_vnvm::alloc::TxMemory for BufMem {
    fn base(&self) -> *const u8 {
        self.base
    }
    fn len(&self) -> usize {
        self.len
    }
    fn describe(&self) -> String {
        self.name.to_string()
    }
    fn begin(&self) -> u64 {
        let mut st = self.open.lock().unwrap();
        st.0 += 1;
        let tid = st.0;
        st.1.insert(tid, Vec::new());
        tid
    }
    fn write(&self, tid: u64, off: u64, src: &[u8]) -> Result<usize, VnvmError> {
        let mut st = self.open.lock().unwrap();
        let w = st.1.get_mut(&tid).ok_or(VnvmError::UnknownTx(tid))?;
        assert!(off as usize + src.len() <= self.len);
        w.push((off, src.to_vec()));
        Ok(src.len())
    }
    fn wait_space(&self, _: Duration) -> bool {
        true
    }
    fn commit(&self, tid: u64) -> Result<(), VnvmError> {
        let w = self.open.lock().unwrap().1.remove(&tid);
        for (off, data) in w.ok_or(VnvmError::UnknownTx(tid))? {
            // SAFETY: bounds checked in `write`; the test's buffer outlives the memory.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    self.base.add(off as usize),
                    data.len(),
                )
            };
        }
        Ok(())
    }
    fn abort(&self, tid: u64) -> Result<(), VnvmError> {
        self.open.lock().unwrap().1.remove(&tid);
        Ok(())
    }
}

/// An allocator that outlives its memory (its owner unmapped it first) is not handed to a new
/// memory mapped at the same address: the new one is formatted and reads as an empty heap.
/// (Before, `open_in` returned the old allocator by address alone and skipped the format, and
/// the new heap read as damaged — `magic 0` — the kv commands test's intermittent failure.)
#[test]
fn open_in_never_shares_an_allocator_with_another_memory_at_the_same_address() {
    let mut buf = vec![0u64; (64 << 10) / 8];
    let (base, len) = (buf.as_mut_ptr() as *mut u8, buf.len() * 8);
    let mem = |name| BufMem {
        base,
        len,
        name,
        open: Default::default(),
    };
    let old = mem("old memory");
    let a = TxAlloc::open_in(&old, None).unwrap();
    assert_eq!(a.nv_root(None).unwrap(), 0);
    // The old memory is gone (its allocator `a` still alive); a new, zero one at its address.
    buf.iter_mut().for_each(|w| *w = 0);
    let new = mem("new memory");
    let b = TxAlloc::open_in(&new, None).unwrap();
    assert_eq!(b.nv_root(None).unwrap(), 0, "the new memory was formatted");
    assert_ne!(buf[0], 0, "the heap magic was written");
    drop((a, b));
}
