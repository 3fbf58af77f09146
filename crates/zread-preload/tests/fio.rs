//! The unmodified `fio` under `LD_PRELOAD=libtiermem_zread_preload.so`: a 64 MiB file written
//! by plain fio with crc32c verify headers in every 4 KiB block is read back and verified by
//! read-only fio jobs whose reads the library serves through z-READ:
//!
//! * loss model off (`TIERMEM_ZREAD_MODEL=0`), page-aligned buffers (`--iomem_align=4096`, in
//!   glibc's main-arena heap of fio's job process): `psync` (`pread64`) and `sync` (`lseek` +
//!   `read`), 4 KiB and 16 KiB blocks, random and sequential — every run verifies and every
//!   page of the file was remapped into fio's buffer (`into_remapped_pages` = 16384), none
//!   copied; a corrupted copy of the file fails fio's verify under the library (the bytes fio
//!   checks are the ones z-READ served);
//! * loss model on: verifies (the model copies or remaps as it sees fit);
//! * buffers the default policy excludes (fio's unaligned default buffers; `--thread`, whose
//!   buffers come from a glibc thread arena) go to the real call, and verify; `--mem=mmap`
//!   buffers are remapped with `TIERMEM_ZREAD_BUFFERS=any`.
//!
//! fio opens the file read-only (`--readonly`), so the read lease z-READ needs can be taken.
//! Needs `fio` (`scripts/setup.sh` installs it); without it the tests print why and pass.

mod common;

use common::{command, have, n, preloaded, reports, run, scratch, Outcome};
use std::path::Path;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(180);
const FILE_PAGES: u64 = (64 << 20) / 4096;

fn fio_or_skip(test: &str) -> bool {
    if have("fio") {
        return true;
    }
    eprintln!("SKIPPED {test}: fio is not installed (scripts/setup.sh installs it)");
    false
}

/// Writes the 64 MiB file `f` with plain fio: a crc32c verify header in every 4 KiB block.
fn write_file(dir: &Path, f: &str) {
    let mut c = command("fio");
    c.current_dir(dir).args([
        "--name=w",
        &format!("--filename={f}"),
        "--rw=write",
        "--bs=4k",
        "--size=64m",
        "--verify=crc32c",
        "--do_verify=0",
    ]);
    let o = run(c, DEADLINE);
    assert_eq!(o.code, Some(0), "writing {f}:\n{}\n{}", o.text(), o.stderr);
}

/// A read-only fio job verifying `f` (`--verify_interval=4k` for blocks larger than the 4 KiB
/// the headers were written at).
fn verify_job(f: &str, engine: &str, rw: &str, bs: &str, extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        "--name=r".to_string(),
        format!("--filename={f}"),
        "--readonly".into(),
        "--size=64m".into(),
        "--verify=crc32c".into(),
        "--verify_fatal=1".into(),
        format!("--ioengine={engine}"),
        format!("--rw={rw}"),
        format!("--bs={bs}"),
    ];
    if bs != "4k" {
        a.push("--verify_interval=4k".into());
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Runs fio with `args` in `dir` under the library serving `dir/f`; returns the outcome and the
/// one exit report (or `None` when no process wrote one).
fn fio_preloaded(
    dir: &Path,
    f: &str,
    args: &[String],
    env: &[(&str, &str)],
) -> (Outcome, Option<serde_json::Value>) {
    let stats = dir.join("stats.jsonl");
    let _ = std::fs::remove_file(&stats);
    let mut c = command("fio");
    c.current_dir(dir).args(args);
    let c = preloaded(c, &dir.join(f), &stats, env);
    let o = run(c, DEADLINE);
    let r = reports(&stats);
    assert!(
        r.len() <= 1,
        "one fio job process reads the file, yet {} reports: {r:?}",
        r.len()
    );
    (o, r.into_iter().next())
}

/// fio exited 0 and reported no verify error (with `--verify_interval` fio can print a
/// failure yet exit 0, so the text is checked too).
fn assert_verified(o: &Outcome, what: &str) {
    let out = format!("{}\n{}", o.text(), o.stderr);
    assert_eq!(o.code, Some(0), "{what}: fio failed:\n{out}");
    for bad in ["verify failed", "bad magic", "bad header", "verify: "] {
        assert!(!out.contains(bad), "{what}: fio reported {bad:?}:\n{out}");
    }
    assert!(
        out.contains("err= 0"),
        "{what}: no err= 0 in fio's output:\n{out}"
    );
    assert!(
        !o.stderr.contains("tiermem-zread-preload"),
        "{what}: the library complained:\n{}",
        o.stderr
    );
}

fn reads_of(bs: &str) -> u64 {
    match bs {
        "4k" => FILE_PAGES,
        "16k" => FILE_PAGES / 4,
        _ => unreachable!(),
    }
}

#[test]
fn fio_verifies_reads_served_by_remapping_every_page() {
    if !fio_or_skip("fio_verifies_reads_served_by_remapping_every_page") {
        return;
    }
    let dir = scratch("fio-remap");
    write_file(dir.path(), "F");
    let env = [("TIERMEM_ZREAD_MODEL", "0")];
    for engine in ["psync", "sync"] {
        for bs in ["4k", "16k"] {
            for rw in ["randread", "read"] {
                let what = format!("{engine} {rw} bs={bs}, model off");
                let args = verify_job("F", engine, rw, bs, &["--iomem_align=4096"]);
                let (o, r) = fio_preloaded(dir.path(), "F", &args, &env);
                assert_verified(&o, &what);
                let r = r.unwrap_or_else(|| panic!("{what}: no exit report"));
                println!(
                    "{what}: routed {} passed {} into_calls {} into_remapped_pages {} \
                     into_copied_bytes {} model_copies {} lease_breaks {} fallbacks {}",
                    n(&r, "routed"),
                    n(&r, "passed"),
                    n(&r, "into_calls"),
                    n(&r, "into_remapped_pages"),
                    n(&r, "into_copied_bytes"),
                    n(&r, "model_copies"),
                    n(&r, "lease_breaks"),
                    n(&r, "fallbacks"),
                );
                assert_eq!(n(&r, "files"), 1, "{what}: {r}");
                assert_eq!(n(&r, "routed"), reads_of(bs), "{what}: {r}");
                assert_eq!(n(&r, "into_calls"), reads_of(bs), "{what}: {r}");
                assert_eq!(n(&r, "passed"), 0, "{what}: {r}");
                assert_eq!(n(&r, "fallbacks"), 0, "{what}: {r}");
                assert_eq!(n(&r, "into_remapped_pages"), FILE_PAGES, "{what}: {r}");
                assert_eq!(n(&r, "into_copied_bytes"), 0, "{what}: {r}");
                assert_eq!(n(&r, "lease_breaks"), 0, "{what}: {r}");
            }
        }
    }
    // A corrupted copy fails fio's verify under the library: fio checks the served bytes.
    let mut bytes = std::fs::read(dir.path().join("F")).unwrap();
    bytes[9 * 16384 + 5000] ^= 0x5a;
    std::fs::write(dir.path().join("G"), bytes).unwrap();
    let args = verify_job("G", "psync", "read", "4k", &["--iomem_align=4096"]);
    let (o, r) = fio_preloaded(dir.path(), "G", &args, &env);
    assert_ne!(
        o.code,
        Some(0),
        "fio verified a corrupted file:\n{}",
        o.text()
    );
    assert!(
        o.text().contains("verify failed") || o.stderr.contains("verify failed"),
        "{}\n{}",
        o.text(),
        o.stderr
    );
    let r = r.expect("exit report of the corrupted run");
    assert!(n(&r, "into_remapped_pages") > 0, "{r}");
}

#[test]
fn fio_verifies_with_the_loss_model_on() {
    if !fio_or_skip("fio_verifies_with_the_loss_model_on") {
        return;
    }
    let dir = scratch("fio-model");
    write_file(dir.path(), "F");
    for (engine, bs) in [("psync", "4k"), ("psync", "16k"), ("sync", "16k")] {
        let what = format!("{engine} randread bs={bs}, model on");
        let args = verify_job("F", engine, "randread", bs, &["--iomem_align=4096"]);
        let (o, r) = fio_preloaded(dir.path(), "F", &args, &[]);
        assert_verified(&o, &what);
        let r = r.unwrap_or_else(|| panic!("{what}: no exit report"));
        println!(
            "{what}: routed {} into_remapped_pages {} into_copied_bytes {} model_copies {} \
             fallbacks {}",
            n(&r, "routed"),
            n(&r, "into_remapped_pages"),
            n(&r, "into_copied_bytes"),
            n(&r, "model_copies"),
            n(&r, "fallbacks"),
        );
        // Reads the model would copy go to fio's own pread (passed); the others are served.
        assert_eq!(
            n(&r, "routed") + n(&r, "passed"),
            reads_of(bs),
            "{what}: {r}"
        );
        assert_eq!(n(&r, "fallbacks"), 0, "{what}: {r}");
        // Every page remapped, copied by z-READ, or read by the program itself.
        let bs_bytes = if bs == "4k" { 4096 } else { 16384 };
        assert_eq!(
            n(&r, "into_remapped_pages") * 4096
                + n(&r, "into_copied_bytes")
                + n(&r, "passed") * bs_bytes,
            64 << 20,
            "{what}: {r}"
        );
    }
}

#[test]
fn buffers_the_policy_excludes_go_to_the_real_call() {
    if !fio_or_skip("buffers_the_policy_excludes_go_to_the_real_call") {
        return;
    }
    let dir = scratch("fio-policy");
    write_file(dir.path(), "F");
    let env = [("TIERMEM_ZREAD_MODEL", "0")];
    // fio's default buffers are not page-aligned; --thread's come from a glibc thread arena.
    for (what, extra) in [
        ("unaligned buffers", &[][..]),
        (
            "thread-arena buffers",
            &["--thread", "--iomem_align=4096"][..],
        ),
        ("mmap buffers", &["--mem=mmap"][..]),
    ] {
        let args = verify_job("F", "psync", "randread", "4k", extra);
        let (o, r) = fio_preloaded(dir.path(), "F", &args, &env);
        assert_verified(&o, what);
        let r = r.unwrap_or_else(|| panic!("{what}: no exit report"));
        println!(
            "{what}: routed {} passed {} files {}",
            n(&r, "routed"),
            n(&r, "passed"),
            n(&r, "files")
        );
        assert_eq!(n(&r, "passed"), FILE_PAGES, "{what}: {r}");
        assert_eq!(n(&r, "routed"), 0, "{what}: {r}");
        assert_eq!(n(&r, "into_remapped_pages"), 0, "{what}: {r}");
    }
    // The program vouches for its own mappings: TIERMEM_ZREAD_BUFFERS=any.
    let args = verify_job("F", "psync", "randread", "4k", &["--mem=mmap"]);
    let env = [
        ("TIERMEM_ZREAD_MODEL", "0"),
        ("TIERMEM_ZREAD_BUFFERS", "any"),
    ];
    let (o, r) = fio_preloaded(dir.path(), "F", &args, &env);
    assert_verified(&o, "mmap buffers, any");
    let r = r.expect("exit report");
    assert_eq!(n(&r, "routed"), FILE_PAGES, "{r}");
    assert_eq!(n(&r, "into_remapped_pages"), FILE_PAGES, "{r}");
}
