//! Programs under `LD_PRELOAD=libtiermem_zread_preload.so` whose reads are not (or cannot be)
//! served are left alone, and served `read(2)` paths keep their semantics:
//!
//! * `cat` of a file that `TIERMEM_ZREAD` does not name prints it unchanged and the library
//!   writes no report (it never saw a served fd);
//! * `cat` and `dd` of the served file print it unchanged: `cat`'s buffer is not in the main
//!   heap (the default policy passes its reads on), with `TIERMEM_ZREAD_BUFFERS=any` they are
//!   remapped; `dd` reopens its input as fd 0 with `dup2`, whose copy is served too — `read`'s
//!   offset advances as it should in both;
//! * a malformed variable: one line on stderr, and the program runs plain.

mod common;

use common::{command, n, preloaded, reports, run, scratch};
use std::path::Path;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

/// 4 MiB of bytes that differ page to page.
fn contents(seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..4 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn cat(file: &Path, served: &Path, stats: &Path, env: &[(&str, &str)]) -> Vec<u8> {
    let mut c = command("cat");
    c.arg(file);
    let o = run(preloaded(c, served, stats, env), DEADLINE);
    assert_eq!(o.code, Some(0), "cat {}: {}", file.display(), o.stderr);
    assert!(o.stderr.is_empty(), "cat {}: {}", file.display(), o.stderr);
    o.stdout
}

#[test]
fn unnamed_files_are_untouched_and_served_reads_keep_their_bytes() {
    let dir = scratch("untouched");
    let (served, other) = (dir.path().join("served"), dir.path().join("other"));
    let (a, b) = (contents(7), contents(11));
    std::fs::write(&served, &a).unwrap();
    std::fs::write(&other, &b).unwrap();
    let stats = dir.path().join("stats.jsonl");

    // Not named: the same bytes, no report at all.
    assert!(
        cat(&other, &served, &stats, &[]) == b,
        "cat of an unnamed file changed"
    );
    assert!(
        !stats.exists(),
        "a report for a program that read no served file"
    );

    // Named, default policy: cat's 128 KiB buffer is glibc mmap memory, not the main heap.
    assert!(
        cat(&served, &served, &stats, &[]) == a,
        "cat of the served file changed"
    );
    let r = reports(&stats);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(n(&r[0], "routed"), 0, "{}", r[0]);
    assert!(n(&r[0], "passed") > 0, "{}", r[0]);

    // Named, any buffer, model off: every page remapped into cat's buffer, in order.
    std::fs::remove_file(&stats).unwrap();
    let env = [
        ("TIERMEM_ZREAD_BUFFERS", "any"),
        ("TIERMEM_ZREAD_MODEL", "0"),
    ];
    assert!(
        cat(&served, &served, &stats, &env) == a,
        "cat (remapped) changed"
    );
    let r = reports(&stats);
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(n(&r[0], "routed") > 0, "{}", r[0]);
    assert_eq!(n(&r[0], "into_remapped_pages"), 1024, "{}", r[0]);

    // dd reads fd 0, a dup2 of the fd it opened, from a main-heap buffer.
    std::fs::remove_file(&stats).unwrap();
    let mut c = command("dd");
    c.arg(format!("if={}", served.display())).arg("bs=64k");
    let o = run(
        preloaded(c, &served, &stats, &[("TIERMEM_ZREAD_MODEL", "0")]),
        DEADLINE,
    );
    assert_eq!(o.code, Some(0), "dd: {}", o.stderr);
    assert!(o.stdout == a, "dd of the served file changed");
    let r = reports(&stats);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(n(&r[0], "into_remapped_pages"), 1024, "{}", r[0]);

    // A malformed variable: one line naming it, the program runs plain.
    std::fs::remove_file(&stats).unwrap();
    let mut c = command("cat");
    c.arg(&served);
    let o = run(
        preloaded(c, &served, &stats, &[("TIERMEM_ZREAD_MODEL", "2")]),
        DEADLINE,
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stdout == a);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert!(o.stderr.contains("TIERMEM_ZREAD_MODEL"), "{}", o.stderr);
    assert!(!stats.exists(), "a report from a library that was off");
}
