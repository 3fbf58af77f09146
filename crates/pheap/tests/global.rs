//! The process-global `nvh_*` API: open (create), allocate named objects, checkpoint one and
//! all, close, reopen and find them by name.

use tiermem_pheap::*;

#[test]
fn nvh_api_round_trip() {
    let d = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = d.path().join("global");
    assert!(matches!(nvh_malloc(8, None), Err(Error::NotOpen)));
    nvh_open_with(
        &path,
        &HeapOptions {
            capacity: 1 << 20,
            ..HeapOptions::default()
        },
    )
    .unwrap();
    assert!(matches!(nvh_open(&path), Err(Error::AlreadyOpen)));
    let a = nvh_malloc(64, Some("counter")).unwrap();
    let b = nvh_malloc(64, Some("other")).unwrap();
    // SAFETY: a and b are live 64-byte objects.
    unsafe {
        a.write_bytes(1, 64);
        b.write_bytes(2, 64);
    }
    let st = nvh_ckone("counter").unwrap();
    assert_eq!(st.bytes_copied, 64, "ckone copies only the named object");
    assert!(matches!(nvh_ckone("nope"), Err(Error::NoSuchName(_))));
    let b2 = nvh_realloc(b, 9000).unwrap();
    // SAFETY: b2 is a live object of 9000 bytes.
    unsafe { b2.add(64).write_bytes(3, 100) };
    nvh_ckall().unwrap();
    // SAFETY: a is live.
    unsafe { a.write_bytes(9, 64) };
    nvh_free(nvh_get("counter").unwrap()).unwrap();
    nvh_close().unwrap();
    assert!(matches!(nvh_ckall(), Err(Error::NotOpen)));
    nvh_open(&path).unwrap();
    assert_eq!(
        nvh_get("counter"),
        None,
        "the free was checkpointed by nvh_close"
    );
    let o = nvh_get("other").unwrap();
    assert_eq!(o, b2);
    // SAFETY: o is a live 9000-byte object.
    let s = unsafe { std::slice::from_raw_parts(o, 164) };
    assert!(s[..64].iter().all(|&x| x == 2) && s[64..].iter().all(|&x| x == 3));
    nvh_close().unwrap();
}
