//! `tiermem pheap info|verify|rm` on heaps made through the library, and on corrupted copies:
//! a torn header copy (tolerated), both copies bad, a metadata journal failing its CRC, an
//! object table that overlaps or leaves the heap (with valid CRCs), a committed but unapplied
//! redo log (crash after the commit; reported, not replayed) and that log corrupted.

use serde_json::Value;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tiermem_pheap::alloc::{MetaRec, Obj};
use tiermem_pheap::format::{encode_meta, Header};
use tiermem_pheap::{Heap, HeapOptions};

/// File offset of the pool's data area (the media pool header comes first).
const DATA: u64 = tiermem_media::pool::HEADER_SIZE;

struct Scratch(PathBuf);
impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = PathBuf::from("/dev/shm")
            .join(format!("tiermem-pheapcli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tiermem(args: &[&str], path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(["pheap"])
        .args(args)
        .arg(path)
        .env_remove("TIERMEM_DELAY")
        .output()
        .expect("run tiermem")
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A 2-view, 4 MiB heap with 100 anonymous 64-byte objects and 3 named ones, two checkpoints.
fn make_heap(path: &Path) -> Vec<usize> {
    let h = Heap::create(
        path,
        &HeapOptions {
            capacity: 4 << 20,
            views: 2,
            ..HeapOptions::default()
        },
    )
    .unwrap();
    for i in 0..100 {
        let p = h.malloc(64, None).unwrap();
        // SAFETY: p has 64 writable bytes.
        unsafe { std::ptr::write_bytes(p, i as u8, 64) };
    }
    for (n, size) in [("alpha", 10), ("beta", 5000), ("gamma", 300)] {
        let p = h.malloc(size, Some(n)).unwrap();
        // SAFETY: p has `size` writable bytes.
        unsafe { std::ptr::write_bytes(p, 0xab, size) };
    }
    h.ckall().unwrap();
    // SAFETY: "alpha" has 10 bytes.
    unsafe { *h.get("alpha").unwrap() = 1 };
    h.ckall().unwrap();
    let bases = h.view_bases();
    drop(h);
    bases
}

fn read_header(path: &Path, copy: u64) -> Header {
    let f = std::fs::File::open(path).unwrap();
    let mut b = [0u8; 256];
    f.read_exact_at(&mut b, DATA + copy * 4096).unwrap();
    Header::decode(&b).unwrap()
}

/// The newest valid header and its copy index.
fn newest(path: &Path) -> (Header, u64) {
    let (a, b) = (read_header(path, 0), read_header(path, 1));
    if a.seq > b.seq {
        (a, 0)
    } else {
        (b, 1)
    }
}

fn write_at(path: &Path, off: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, off).unwrap();
}

fn flip(path: &Path, off: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, off).unwrap();
}

/// Replaces the committed object table with `recs` (valid CRCs, newer header).
fn rewrite_table(path: &Path, recs: &[MetaRec]) {
    let (mut h, _) = newest(path);
    let mut buf = Vec::new();
    for r in recs {
        encode_meta(r, &mut buf);
    }
    write_at(path, DATA + h.meta_off(h.meta_active) as u64, &buf);
    h.meta_len = buf.len() as u64;
    h.meta_crc = crc32fast_hash(&buf);
    h.seq += 1;
    write_at(path, DATA + (h.seq % 2) * 4096, &h.encode());
}

fn crc32fast_hash(b: &[u8]) -> u32 {
    // CRC-32 (IEEE), bitwise: the format's checksum, computed independently of the library.
    let mut crc = !0u32;
    for &x in b {
        crc ^= x as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn info_and_verify_describe_a_library_heap() {
    let s = Scratch::new("info");
    let path = s.0.join("h");
    let bases = make_heap(&path);
    let out = tiermem(&["info", "--json"], &path);
    assert!(out.status.success(), "{}", text(&out));
    let v = json_of(&out);
    assert_eq!(v["ok"], true);
    assert_eq!(v["views"], 2);
    assert_eq!(v["capacity"], 4 << 20);
    assert_eq!(v["epoch"], 2);
    assert_eq!(v["objects"], 103);
    assert_eq!(v["named_objects"], 3);
    assert_eq!(v["bytes_in_use"], 100 * 64 + 10 + 5000 + 300);
    assert_eq!(v["log"]["state"], "empty");
    assert_eq!(v["lib_view"], format!("{:#x}", bases[0]));
    let uv: Vec<String> = bases[1..].iter().map(|b| format!("{b:#x}")).collect();
    assert_eq!(v["user_views"], serde_json::json!(uv));
    let names: Vec<&str> = v["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha", "beta", "gamma"]);
    let out = tiermem(&["info"], &path);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("2 user views") && t.contains("beta"), "{t}");

    let out = tiermem(&["verify"], &path);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("is consistent"), "{}", text(&out));
    let v = json_of(&tiermem(&["verify", "--json"], &path));
    assert_eq!(v["ok"], true);
    assert_eq!(v["problems"].as_array().unwrap().len(), 0);
    // Read-only: the heap still opens and holds its data.
    let h = Heap::open(&path).unwrap();
    // SAFETY: "alpha" has 10 bytes.
    assert_eq!(unsafe { *h.get("alpha").unwrap() }, 1);
}

#[test]
fn verify_reports_corrupted_copies() {
    let s = Scratch::new("corrupt");
    let good = s.0.join("good");
    make_heap(&good);
    let copy = |name: &str| {
        let p = s.0.join(name);
        std::fs::copy(&good, &p).unwrap();
        p
    };
    let fails_with = |p: &Path, what: &str| {
        let out = tiermem(&["verify"], p);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(
            text(&out).contains(what),
            "expected {what:?}:\n{}",
            text(&out)
        );
        let v = json_of(&tiermem(&["verify", "--json"], p));
        assert_eq!(v["ok"], false);
        assert!(!v["problems"].as_array().unwrap().is_empty());
        let out = tiermem(&["info"], p);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    };

    // One torn header copy: the heap opens from the other, but verify flags it and exits 1
    // (before issue #13 it exited 0 with a note).
    let p = copy("torn");
    let (_, active) = newest(&p);
    flip(&p, DATA + active * 4096 + 40);
    let out = tiermem(&["verify", "--json"], &p);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let v = json_of(&out);
    let bad = if active == 0 { 0 } else { 1 };
    assert_eq!(v["header_copies"][bad]["valid"], false);
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["clean"], false, "{v}");
    assert!(
        v["warnings"][0].as_str().unwrap().contains("damaged"),
        "{v}"
    );
    let out = tiermem(&["verify"], &p);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("WARNING: header copy"),
        "{}",
        text(&out)
    );
    // Open still works (the other copy describes the same checkpoint).
    let heap = Heap::open(&p).unwrap();
    // SAFETY: "alpha" holds at least one byte.
    assert_eq!(unsafe { *heap.get("alpha").unwrap() }, 1);
    drop(heap);
    // A flipped byte of an object's checkpointed bytes: refused by verify and by open.
    let p = copy("image");
    let (h, _) = newest(&p);
    let off = {
        let heap = Heap::open(&p).unwrap();
        let a = heap.get("alpha").unwrap() as usize;
        let off = heap
            .view_bases()
            .into_iter()
            .filter(|&b| a >= b)
            .map(|b| a - b)
            .min()
            .unwrap();
        drop(heap);
        off
    };
    flip(&p, DATA + h.image_off() as u64 + off as u64);
    fails_with(&p, "fail their checksum");
    let e = Heap::open(&p).unwrap_err().to_string();
    assert!(e.contains("fail their checksum"), "{e}");

    // Both header copies bad.
    let p = copy("both");
    flip(&p, DATA + 40);
    flip(&p, DATA + 4096 + 40);
    fails_with(&p, "no valid heap header");

    // Metadata journal byte flipped.
    let p = copy("meta");
    let (h, _) = newest(&p);
    flip(&p, DATA + h.meta_off(h.meta_active) as u64 + 3);
    fails_with(&p, "metadata journal fails its checksum");

    // Overlapping objects with valid CRCs.
    let p = copy("overlap");
    let big = |off| MetaRec::Alloc {
        off,
        obj: Obj {
            size: 8192,
            slot: 8192,
            name: None,
        },
    };
    rewrite_table(&p, &[big(0), big(4096)]);
    fails_with(&p, "overlaps");

    // An object beyond the capacity.
    let p = copy("bounds");
    rewrite_table(&p, &[big((4 << 20) - 4096)]);
    fails_with(&p, "bad size");

    // Not a heap at all.
    let p = s.0.join("junk");
    std::fs::write(&p, vec![7u8; 8192]).unwrap();
    let out = tiermem(&["verify"], &p);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
}

#[test]
fn committed_unapplied_log_is_reported_and_its_corruption_detected() {
    if let Ok(path) = std::env::var("PHEAP_CLI_CHILD") {
        // Child: create a heap and crash right after a checkpoint's commit.
        let h = Heap::create(
            &path,
            &HeapOptions {
                capacity: 4 << 20,
                ..HeapOptions::default()
            },
        )
        .unwrap();
        let p = h.malloc(100, Some("x")).unwrap();
        // SAFETY: p has 100 bytes.
        unsafe { std::ptr::write_bytes(p, 8, 100) };
        // A first, complete checkpoint: its page now holds committed data, so the next
        // checkpoint's copy goes through the redo log (a page without committed data is
        // written straight into the image and logs nothing).
        h.ckall().unwrap();
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(p, 9, 100) };
        std::env::set_var("TIERMEM_PHEAP_FAIL_AT", "after-commit");
        let _ = h.ckall();
        unreachable!("the fail point aborts");
    }
    let s = Scratch::new("log");
    let path = s.0.join("h");
    let st = Command::new(std::env::current_exe().unwrap())
        .args([
            "committed_unapplied_log_is_reported_and_its_corruption_detected",
            "--exact",
            "--nocapture",
        ])
        .env("PHEAP_CLI_CHILD", &path)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!st.success(), "the child must abort at the fail point");
    let bad = s.0.join("bad");
    std::fs::copy(&path, &bad).unwrap();
    let out = tiermem(&["verify", "--json"], &path);
    assert!(out.status.success(), "{}", text(&out));
    let v = json_of(&out);
    assert_eq!(v["log"]["state"], "committed", "{v}");
    assert_eq!(v["log"]["bytes"], 100);
    assert_eq!(v["epoch"], 2);
    // verify did not replay it.
    assert_eq!(
        json_of(&tiermem(&["info", "--json"], &path))["log"]["state"],
        "committed"
    );
    let (h, _) = newest(&bad);
    flip(&bad, DATA + h.log_off() as u64 + 20);
    let out = tiermem(&["verify"], &bad);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("redo log fails its checksum"),
        "{}",
        text(&out)
    );
    // The library replays the good one.
    let heap = Heap::open(&path).unwrap();
    // SAFETY: "x" has 100 bytes.
    assert_eq!(unsafe { *heap.get("x").unwrap().add(99) }, 9);
}

#[test]
fn rm_removes_heaps_and_refuses_other_files() {
    let s = Scratch::new("rm");
    let path = s.0.join("h");
    make_heap(&path);
    let out = tiermem(&["rm"], &path);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!path.exists());
    let out = tiermem(&["rm"], &path);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("no such file"), "{}", text(&out));
    let junk = s.0.join("junk");
    std::fs::write(&junk, b"not a heap").unwrap();
    let out = tiermem(&["rm"], &junk);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(junk.exists());
    let out = Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(["pheap", "rm", "--force"])
        .arg(&junk)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!junk.exists());
}
