//! The storage interface over both engines: reads of own writes, commit, abort, reopen.

use tiermem_kv::heap::vnvm::{VnvmEngine, VnvmEngineConfig};
use tiermem_kv::heap::volatile::VolatileEngine;
use tiermem_kv::heap::Heap;

fn vnvm_cfg(dir: &std::path::Path) -> VnvmEngineConfig {
    VnvmEngineConfig {
        dir: dir.to_path_buf(),
        heap_size: 16 << 20,
        log_size: 4 << 20,
        cache_size: 4 << 20,
    }
}

fn exercise(heap: &Heap) {
    let mut tx = heap.begin();
    let a = tx.alloc(100).unwrap();
    tx.write(a, &[7u8; 100]).unwrap();
    tx.write_u64(a + 8, 0x1122334455667788).unwrap();
    // Own writes are seen, overlapping ones in order.
    assert_eq!(tx.read_u64(a + 8), 0x1122334455667788);
    let mut b = [0u8; 20];
    tx.read(a, &mut b);
    assert_eq!(&b[..8], &[7u8; 8]);
    assert_eq!(&b[16..], &[7u8; 4]);
    tx.set_root(a).unwrap();
    assert_eq!(tx.root().unwrap(), a);
    tx.commit().unwrap();
    assert_eq!(heap.root().unwrap(), a);
    assert_eq!(&heap.view()[a as usize..a as usize + 8], &[7u8; 8]);

    // An aborted transaction leaves nothing behind.
    let mut tx = heap.begin();
    tx.write_u64(a, 42).unwrap();
    let c = tx.alloc(64).unwrap();
    tx.abort();
    assert_eq!(&heap.view()[a as usize..a as usize + 8], &[7u8; 8]);
    let mut tx = heap.begin();
    assert_eq!(
        tx.alloc(64).unwrap(),
        c,
        "the aborted allocation is free again"
    );
    drop(tx); // dropped = aborted
    let s = heap.stats().unwrap();
    assert_eq!(s.allocated_blocks, 1);
    assert_eq!(s.root, a);
}

#[test]
fn volatile_heap_transactions() {
    let e = VolatileEngine::new(8 << 20, true).unwrap();
    assert!(e.region_id().is_some(), "registered with the fault engine");
    let heap = Heap::open(Box::new(e)).unwrap();
    exercise(&heap);
    assert!(!heap.engine().info().durable);
}

#[test]
fn vnvm_heap_transactions_and_reopen() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let a;
    {
        let heap =
            Heap::open(Box::new(VnvmEngine::create(&vnvm_cfg(dir.path())).unwrap())).unwrap();
        exercise(&heap);
        a = heap.root().unwrap();
        assert!(heap.engine().info().durable);
    }
    let e = VnvmEngine::open(&vnvm_cfg(dir.path())).unwrap();
    let rec = e.report().recovery.clone().expect("an existing instance");
    assert!(rec.was_clean, "clean shutdown: {rec:?}");
    let heap = Heap::open(Box::new(e)).unwrap();
    assert_eq!(heap.root().unwrap(), a);
    assert_eq!(&heap.view()[a as usize..a as usize + 8], &[7u8; 8]);
}
