//! `tiermem migrate inspect|rm`, run as the real binary on migrations the library creates in a
//! FAM directory on tmpfs: a complete one (checkpoint + serve, no target), an incomplete one
//! (checkpoint only), a corrupt and a truncated lazy-page file.

use serde_json::Value;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::net::TcpListener;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tiermem_media::DelayModel;
use tiermem_migrate::fam::{migration_dir, FamSource, FamSourceConfig};
use tiermem_migrate::lazyfile::{Batching, LazyFile, MIG_HEADER_SIZE};

fn tiermem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(args)
        .output()
        .expect("run tiermem")
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A scratch FAM directory under /dev/shm, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d =
            PathBuf::from("/dev/shm").join(format!("tiermem-migcli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Page-aligned heap memory holding a byte pattern.
struct Region {
    ptr: *mut u8,
    layout: Layout,
}

impl Region {
    fn new(len: usize, seed: u8) -> Region {
        let layout = Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        for i in 0..len {
            // SAFETY: i < len, inside the allocation.
            unsafe { *ptr.add(i) = (i as u8).wrapping_mul(31).wrapping_add(seed) };
        }
        Region { ptr, layout }
    }
    fn span(&self) -> (*const u8, u64) {
        (self.ptr, self.layout.size() as u64)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in new with this layout.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

const LENS: [usize; 2] = [64 << 10, 3 << 20];
const BLOB: &[u8] = b"engine volatile\n";

/// Checkpoint migration `id` of two regions; `serve` dumps it completely (nobody connects).
fn make_migration(fam: &Path, id: u64, serve: bool) {
    let regions: Vec<Region> = LENS
        .iter()
        .enumerate()
        .map(|(i, &l)| Region::new(l, i as u8))
        .collect();
    let spans: Vec<_> = regions.iter().map(Region::span).collect();
    let cfg = FamSourceConfig {
        fam: fam.to_path_buf(),
        id,
        batching: Batching::PerVector,
        delay: DelayModel::NONE,
        skip_untouched: false,
    };
    // SAFETY: the regions stay allocated and unwritten until serve returns or the source drops.
    let src = unsafe { FamSource::checkpoint(cfg, &spans, BLOB) }.expect("checkpoint");
    if serve {
        let report = src
            .serve(TcpListener::bind("127.0.0.1:0").unwrap())
            .expect("serve");
        assert_eq!(report.bytes, LENS.iter().sum::<usize>() as u64);
    }
}

fn inspect_json(fam: &Scratch, id: &str) -> (Output, Value) {
    let o = tiermem(&["migrate", "inspect", fam.arg(), "--id", id, "--json"]);
    let v = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o)));
    (o, v)
}

#[test]
fn inspect_reports_complete_and_incomplete_migrations() {
    let fam = Scratch::new("inspect");
    make_migration(&fam.0, 0xa1, true);
    make_migration(&fam.0, 0xb2, false);

    let o = tiermem(&["migrate", "inspect", fam.arg()]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("migration 00000000000000a1  complete"),
        "{out}"
    );
    assert!(
        out.contains("migration 00000000000000b2  incomplete"),
        "{out}"
    );
    assert!(out.contains(&format!("{} bytes", 3 << 20)), "{out}");

    let (o, v) = inspect_json(&fam, "a1");
    assert!(o.status.success(), "{}", text(&o));
    let m = &v["migrations"][0];
    assert_eq!(v["migrations"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(m["id"], "00000000000000a1");
    assert_eq!(m["complete"], true, "{v}");
    assert_eq!(m["errors"], 0);
    assert_eq!(m["checkpoint"]["ok"], true);
    assert_eq!(m["checkpoint"]["blob_len"], BLOB.len());
    assert_eq!(m["checkpoint"]["regions"], 2);
    for (i, &len) in LENS.iter().enumerate() {
        let r = &m["regions"][i];
        assert_eq!(r["index"], i);
        assert_eq!(r["ok"], true, "{v}");
        assert_eq!(r["length"], len);
        assert_eq!(r["watermark"], len);
        assert_eq!(r["complete"], true);
    }

    let (o, v) = inspect_json(&fam, "0xb2");
    assert!(o.status.success(), "{}", text(&o));
    let m = &v["migrations"][0];
    assert_eq!(m["complete"], false, "{v}");
    assert_eq!(m["errors"], 0);
    assert_eq!(m["regions"][1]["watermark"], 0);
    assert_eq!(m["regions"][1]["complete"], false);

    let o = tiermem(&["migrate", "inspect", fam.arg(), "--id", "c3"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no migration 00000000000000c3"),
        "{}",
        text(&o)
    );
}

#[test]
fn inspect_reports_corrupt_and_truncated_lazy_files() {
    let fam = Scratch::new("corrupt");
    make_migration(&fam.0, 0xa1, true);
    let dir = migration_dir(&fam.0, 0xa1);
    let lazy0 = dir.join("region-0.lazy");
    let header = LazyFile::open(&lazy0, DelayModel::NONE)
        .unwrap()
        .image_file_offset()
        - MIG_HEADER_SIZE;
    // Flip a bit of the region-length field of region 0's migrate header.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&lazy0)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, header + 16).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], header + 16).unwrap();
    drop(f);
    // Truncate region 1's file.
    let lazy1 = dir.join("region-1.lazy");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&lazy1)
        .unwrap();
    f.set_len(f.metadata().unwrap().len() - 4096).unwrap();
    drop(f);

    let o = tiermem(&["migrate", "inspect", fam.arg()]);
    assert!(!o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("CORRUPT"), "{}", text(&o));
    assert!(
        out.contains("region 0    ERROR: corrupt migrate header"),
        "{}",
        text(&o)
    );
    assert!(out.contains("region 1    ERROR:"), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("2 corrupt, truncated or missing file(s)"),
        "{}",
        text(&o)
    );

    let (o, v) = inspect_json(&fam, "a1");
    assert!(!o.status.success(), "{}", text(&o));
    let m = &v["migrations"][0];
    assert_eq!(m["errors"], 2, "{v}");
    assert_eq!(m["complete"], false);
    assert_eq!(m["checkpoint"]["ok"], true);
    assert_eq!(m["regions"][0]["ok"], false);
    assert!(
        m["regions"][0]["error"].as_str().unwrap().contains("crc"),
        "{v}"
    );
    assert_eq!(m["regions"][1]["ok"], false);

    // A corrupt migration is not removed without --force.
    let o = tiermem(&["migrate", "rm", fam.arg(), "--id", "a1"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(dir.exists());
    let o = tiermem(&["migrate", "rm", fam.arg(), "--id", "a1", "--force"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!dir.exists());
}

#[test]
fn rm_refuses_an_incomplete_migration_without_force() {
    let fam = Scratch::new("rm");
    make_migration(&fam.0, 0xa1, true);
    make_migration(&fam.0, 0xb2, false);
    let (done, partial) = (migration_dir(&fam.0, 0xa1), migration_dir(&fam.0, 0xb2));

    let o = tiermem(&["migrate", "rm", fam.arg(), "--id", "b2"]);
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        err.contains("is not complete") && err.contains("--force"),
        "{}",
        text(&o)
    );
    assert!(partial.join("checkpoint").exists());

    let o = tiermem(&["migrate", "rm", fam.arg(), "--id", "b2", "--force"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!partial.exists());

    // A complete one goes without --force; the FAM directory itself stays.
    let o = tiermem(&["migrate", "rm", fam.arg(), "--id", "a1"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!done.exists() && fam.0.exists());

    let o = tiermem(&["migrate", "rm", fam.arg(), "--id", "a1"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not exist"));

    // A directory holding a foreign file is left alone even with --force.
    make_migration(&fam.0, 0xd4, true);
    let odd = migration_dir(&fam.0, 0xd4);
    std::fs::write(odd.join("notes.txt"), b"mine").unwrap();
    let o = tiermem(&["migrate", "rm", fam.arg(), "--id", "d4", "--force"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a migration file"));
    assert!(odd.join("notes.txt").exists() && odd.join("checkpoint").exists());

    let o = tiermem(&["migrate", "rm", fam.arg(), "--id", "nothex"]);
    assert!(!o.status.success(), "{}", text(&o));
}
