//! Unmodified programs under `LD_PRELOAD=libtiermem_pheap_preload.so`: Tokyo Cabinet's
//! on-memory database tools (Debian tokyocabinet-bin) and sqlite3 on `:memory:` must print the
//! same output as without the library, while checkpoints are taken (stats file). A small C
//! program checks every allocator entry point. FGCK (2 views) against PGCK (1 view) bytes
//! copied are printed for each program (no threshold).
//!
//! Needs the cdylib built in the same target directory (cargo builds it for this test), the
//! programs (`scripts/setup.sh` installs them) and a C compiler. Without the programs the
//! program test is skipped with a message unless `TIERMEM_REQUIRE_CLIENTS` is set.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The target directory holding this test binary's profile (…/target/<profile>).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // …/target/<profile>/deps/<test>-HASH
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

fn preload_lib() -> PathBuf {
    let so = profile_dir().join("libtiermem_pheap_preload.so");
    assert!(
        so.exists(),
        "{} is missing: build it with cargo build --release -p tiermem-pheap-preload",
        so.display()
    );
    so
}

fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Drops the lines whose content depends on timing or process state (Tokyo Cabinet's test
/// tools end with `sys_*` resource figures and `time:`).
fn filter(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .filter(|l| !l.starts_with("sys_") && !l.starts_with("time:"))
        .map(|l| format!("{l}\n"))
        .collect()
}

struct Prog {
    name: &'static str,
    argv: Vec<String>,
    stdin: Option<PathBuf>,
}

#[derive(Debug)]
struct Stats {
    views: u64,
    checkpoints: u64,
    bytes_copied: u64,
    objects_copied: u64,
    pages_written: u64,
    allocs: u64,
    frees: u64,
    fallback_allocs: u64,
}

/// Runs `p` with `env` (plus a deterministic Tokyo Cabinet seed); returns filtered stdout.
fn run(p: &Prog, env: &[(&str, String)]) -> String {
    let mut c = Command::new(&p.argv[0]);
    c.args(&p.argv[1..]).env("TCRNDSEED", "42");
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdin(match &p.stdin {
        Some(f) => Stdio::from(std::fs::File::open(f).expect("open stdin file")),
        None => Stdio::null(),
    });
    let out = c.output().unwrap_or_else(|e| panic!("run {}: {e}", p.name));
    assert!(
        out.status.success(),
        "{} {:?} failed ({}):\n{}",
        p.name,
        env,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    filter(&out.stdout)
}

fn read_stats(path: &Path) -> Stats {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("stats file {}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).expect("stats JSON");
    let n = |k: &str| {
        v[k].as_u64()
            .unwrap_or_else(|| panic!("stats key {k} missing in {text}"))
    };
    assert!(v["heap_path"].is_string(), "heap_path missing in {text}");
    assert!(
        v["ckpt_ns_total"].is_u64(),
        "ckpt_ns_total missing in {text}"
    );
    Stats {
        views: n("views"),
        checkpoints: n("checkpoints"),
        bytes_copied: n("bytes_copied"),
        objects_copied: n("objects_copied"),
        pages_written: n("pages_written"),
        allocs: n("allocs"),
        frees: n("frees"),
        fallback_allocs: n("fallback_allocs"),
    }
}

/// The environment of a run under the preload library: its heap at `heap` (64 MiB), `views`
/// views, statistics into `stats`.
fn preload_env<'a>(heap: &Path, stats: &Path, views: usize) -> Vec<(&'a str, String)> {
    vec![
        ("LD_PRELOAD", preload_lib().display().to_string()),
        ("TIERMEM_PHEAP_PATH", heap.display().to_string()),
        ("TIERMEM_PHEAP_VIEWS", views.to_string()),
        ("TIERMEM_PHEAP_CAPACITY", "64M".to_string()),
        ("TIERMEM_PHEAP_STATS", stats.display().to_string()),
        // A loaded machine may take long to stop the threads; a timeout would skip a
        // checkpoint (or let a fork copy a moving heap) and fail the test for no fault.
        ("TIERMEM_SAFEPOINT_TIMEOUT_MS", "5000".to_string()),
    ]
}

/// Runs `p` under the preload library with `views` and the checkpoint trigger `trigger`
/// (an environment variable and value), checks its output against `expected`, returns stats.
fn run_preloaded(
    p: &Prog,
    dir: &Path,
    views: usize,
    trigger: (&str, &str),
    expected: &str,
) -> Stats {
    let tag = format!("{}-v{views}-{}", p.name, trigger.0);
    let heap = dir.join(format!("{tag}.heap"));
    let stats = dir.join(format!("{tag}.json"));
    let mut env = preload_env(&heap, &stats, views);
    env.push((trigger.0, trigger.1.to_string()));
    let out = run(p, &env);
    assert_eq!(
        out, expected,
        "{} with the preload library (views={views}, {}={}) printed something else",
        p.name, trigger.0, trigger.1
    );
    let s = read_stats(&stats);
    assert_eq!(s.views, views as u64, "{tag}: {s:?}");
    assert!(s.allocs > 0 && s.frees > 0, "{tag}: heap not used: {s:?}");
    assert!(
        s.checkpoints >= 1 && s.bytes_copied > 0,
        "{tag}: no checkpoint: {s:?}"
    );
    assert_eq!(s.fallback_allocs, 0, "{tag}: heap too small: {s:?}");
    // The heap's pool file is the checkpoint; the next run of the same path replaces it.
    assert!(heap.exists(), "{tag}: heap file {} missing", heap.display());
    std::fs::remove_file(&heap).unwrap();
    s
}

fn programs() -> Vec<Prog> {
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        Prog {
            name: "tcatest-misc-mdb",
            argv: v(&["tcatest", "misc", "*", "20000"]),
            stdin: None,
        },
        Prog {
            name: "tcatest-misc-ndb",
            argv: v(&["tcatest", "misc", "+", "20000"]),
            stdin: None,
        },
        Prog {
            name: "tcutest-mdb-rnd",
            argv: v(&["tcutest", "mdb", "-rnd", "50000"]),
            stdin: None,
        },
        Prog {
            name: "sqlite3-memory",
            argv: v(&["sqlite3", ":memory:"]),
            stdin: Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sqlite_mem.sql")),
        },
    ]
}

#[test]
fn unmodified_programs_same_output_with_checkpoints() {
    let missing: Vec<&str> = ["tcatest", "tcutest", "sqlite3"]
        .into_iter()
        .filter(|p| !have(p))
        .collect();
    if !missing.is_empty() {
        if std::env::var_os("TIERMEM_REQUIRE_CLIENTS").is_some() {
            panic!("programs missing: {missing:?} (install with scripts/setup.sh: tokyocabinet-bin sqlite3)");
        }
        eprintln!(
            "SKIPPED: programs missing: {missing:?} (apt-get install tokyocabinet-bin sqlite3; \
             set TIERMEM_REQUIRE_CLIENTS to make this a failure)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for p in programs() {
        let expected = run(&p, &[]);
        assert!(
            expected.lines().count() > 5,
            "{}: suspiciously short output:\n{expected}",
            p.name
        );
        // Time-driven checkpoints, as a user would run it.
        for views in [2, 1] {
            let s = run_preloaded(&p, dir.path(), views, ("TIERMEM_CKPT_MS", "100"), &expected);
            println!(
                "{:<18} views={views} CKPT_MS=100: {} checkpoints, {} bytes, {} objects, {} view pages written, {} allocs",
                p.name, s.checkpoints, s.bytes_copied, s.objects_copied, s.pages_written, s.allocs
            );
        }
        // Checkpoints every 2000 allocator calls: the same program points in both modes, so
        // the bytes copied compare FGCK against PGCK on equal terms.
        let fg = run_preloaded(&p, dir.path(), 2, ("TIERMEM_CKPT_CALLS", "2000"), &expected);
        let pg = run_preloaded(&p, dir.path(), 1, ("TIERMEM_CKPT_CALLS", "2000"), &expected);
        assert!(
            fg.checkpoints >= 2 && fg.checkpoints == pg.checkpoints,
            "{}: call-driven checkpoints differ: FGCK {fg:?} PGCK {pg:?}",
            p.name
        );
        println!(
            "{:<18} every 2000 calls, {} checkpoints: PGCK {} bytes, FGCK {} bytes ({:+.1} %)",
            p.name,
            fg.checkpoints,
            pg.bytes_copied,
            fg.bytes_copied,
            (fg.bytes_copied as f64 / pg.bytes_copied as f64 - 1.0) * 100.0
        );
    }
}

#[test]
fn allocator_entry_points() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "api");
    let p = Prog {
        name: "api",
        argv: vec![exe.display().to_string()],
        stdin: None,
    };
    assert_eq!(run(&p, &[]), "api ok\n");
    for views in [1, 2, 4, 8] {
        // A checkpoint every 50 allocator calls: many safe points in the middle of the run.
        let heap = dir.path().join(format!("api-{views}.heap"));
        let stats = dir.path().join(format!("api-{views}.json"));
        let mut env = preload_env(&heap, &stats, views);
        env.push(("TIERMEM_CKPT_CALLS", "50".to_string()));
        let out = run(&p, &env);
        assert_eq!(out, "api ok\n", "views={views}");
        let s = read_stats(&stats);
        assert!(s.allocs >= 2000 && s.frees >= 1000, "views={views}: {s:?}");
        assert!(s.checkpoints > 10, "views={views}: {s:?}");
        // Alignments above a page (8 KiB, 64 KiB; three calls each) are glibc's.
        assert_eq!(s.fallback_allocs, 6, "views={views}: {s:?}");
    }
    // A heap too small for the program: allocations fall back to glibc and are counted.
    let stats = dir.path().join("api-small.json");
    let out = run(
        &p,
        &[
            ("LD_PRELOAD", preload_lib().display().to_string()),
            (
                "TIERMEM_PHEAP_PATH",
                dir.path().join("api-small.heap").display().to_string(),
            ),
            ("TIERMEM_PHEAP_CAPACITY", "256K".to_string()),
            ("TIERMEM_PHEAP_STATS", stats.display().to_string()),
        ],
    );
    assert_eq!(out, "api ok\n");
    let s = read_stats(&stats);
    assert!(s.fallback_allocs > 100 && s.allocs > 0, "{s:?}");
}

/// Runs `echo ok` under the library with the heap at `heap`; returns (exit ok, stdout,
/// stderr).
fn echo_with_heap(heap: &Path) -> (bool, String, String) {
    let out = Command::new("echo")
        .arg("ok")
        .env("LD_PRELOAD", preload_lib())
        .env("TIERMEM_PHEAP_PATH", heap)
        .env("TIERMEM_PHEAP_CAPACITY", "1M")
        .output()
        .expect("run echo");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue #13 defect 5: the library used to delete whatever was at `TIERMEM_PHEAP_PATH` (a text
/// file was replaced by a heap, exit 0, no message). Now only a previous run's heap of this
/// format is replaced; anything else is left byte for byte as it was, the program runs on
/// glibc malloc (its output unchanged, exit 0) and one message on stderr says why.
#[test]
fn never_replaces_what_is_not_its_own_heap() {
    use std::os::unix::fs::PermissionsExt;
    const DATA: u64 = 4096; // the media pool header
    let dir = tempfile::tempdir().unwrap();
    let refused = |path: &Path, why: &str| {
        let before = std::fs::read(path).ok();
        let (ok, out, err) = echo_with_heap(path);
        assert!(ok && out == "ok\n", "{}: {out} {err}", path.display());
        assert!(
            err.contains("the program runs on glibc malloc") && err.contains(why),
            "{}: expected {why:?} in stderr: {err}",
            path.display()
        );
        assert!(err.contains("left untouched"), "{err}");
        assert_eq!(
            std::fs::read(path).ok(),
            before,
            "{} changed",
            path.display()
        );
    };

    // A user's text file.
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "my precious data\n").unwrap();
    refused(&text, "is not a tiermem persistent heap");
    assert_eq!(
        std::fs::read_to_string(&text).unwrap(),
        "my precious data\n"
    );

    // A directory.
    let d = dir.path().join("adir");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("inside"), "x").unwrap();
    let (ok, _, err) = echo_with_heap(&d);
    assert!(ok && err.contains("is a directory"), "{err}");
    assert!(d.join("inside").exists());

    // A previous run's heap is replaced silently (the documented fresh heap per run).
    let heap = dir.path().join("h.heap");
    let (ok, _, err) = echo_with_heap(&heap);
    assert!(ok && err.is_empty(), "{err}");
    assert!(heap.exists());
    let (ok, _, err) = echo_with_heap(&heap);
    assert!(
        ok && err.is_empty(),
        "a heap of ours must be replaced quietly: {err}"
    );

    let header = |p: &Path, copy: u64| {
        let f = std::fs::File::open(p).unwrap();
        let mut b = [0u8; 256];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, DATA + copy * 4096).unwrap();
        b
    };
    let put = |p: &Path, copy: u64, b: &[u8]| {
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b, DATA + copy * 4096).unwrap();
    };

    // A damaged heap of ours (both header copies bad).
    let damaged = dir.path().join("damaged.heap");
    std::fs::copy(&heap, &damaged).unwrap();
    for c in 0..2 {
        let mut b = header(&damaged, c);
        b[40] ^= 0xff;
        put(&damaged, c, &b);
    }
    refused(&damaged, "no valid heap header");

    // A heap of another format version (valid CRC).
    let other = dir.path().join("v1.heap");
    std::fs::copy(&heap, &other).unwrap();
    for c in 0..2 {
        let mut h = tiermem_pheap::format::Header::decode(&header(&other, c)).unwrap();
        h.version = 1;
        put(&other, c, &h.encode());
    }
    refused(&other, "format version 1");

    // A heap the user made read-only.
    let ro = dir.path().join("ro.heap");
    std::fs::copy(&heap, &ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
    refused(&ro, "is read-only");
}

/// Compiles `tests/data/<name>.c` (with pthreads) into `dir`.
fn compile(dir: &Path, name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/{name}.c"));
    let exe = dir.join(name);
    let cc = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-pthread"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc (install build-essential)");
    assert!(
        cc.status.success(),
        "compiling {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&cc.stderr)
    );
    exe
}

/// Issue #21 part 4: a multi-threaded program is checkpointed at safepoints. Four threads
/// allocate and write without pause, one sleeps, one is blocked in read(2); a checkpoint every
/// 5 ms stops all others, and each checkpoint is compared with the heap while they are stopped
/// (`TIERMEM_PHEAP_VERIFY_EACH`): a thread left running would make some differ.
#[test]
fn multi_threaded_program_checkpoints_at_safepoints() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "threads");
    let p = Prog {
        name: "threads",
        argv: vec![exe.display().to_string(), "60000".into()],
        stdin: None,
    };
    assert_eq!(run(&p, &[]), "threads ok\n");
    for views in [2, 1] {
        let heap = dir.path().join(format!("threads-{views}.heap"));
        let stats = dir.path().join(format!("threads-{views}.json"));
        let mut env = preload_env(&heap, &stats, views);
        env.push(("TIERMEM_CKPT_MS", "5".to_string()));
        env.push(("TIERMEM_PHEAP_VERIFY_EACH", "1".to_string()));
        let out = run(&p, &env);
        assert_eq!(out, "threads ok\n", "views={views}");
        let text = std::fs::read_to_string(&stats).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {text}"));
        assert!(n("checkpoints") >= 3, "views={views}: {text}");
        assert_eq!(n("skipped"), 0, "views={views}: {text}");
        assert_eq!(n("verify_failed"), 0, "views={views}: {text}");
        assert_eq!(n("verified"), n("checkpoints"), "views={views}: {text}");
        // 3 other workers, the sleeper, the reader and main (in pthread_join) at least once.
        assert!(n("safepoint_threads_max") >= 6, "views={views}: {text}");
        assert!(
            v["safepoint_pause_us"]["n"].as_u64().unwrap() >= 1,
            "views={views}: {text}"
        );
        let r = tiermem_pheap::inspect::inspect(&heap).unwrap();
        assert!(r.problems.is_empty(), "{:?}", r.problems);
    }
}

/// Issue #21 part 4: kill -9 of a multi-threaded program at random moments while it writes and
/// checkpoints every 10 ms (150–450 ms in): each time the heap verifies (`tiermem pheap verify`'s checks) and
/// reopens.
#[test]
fn multi_threaded_program_killed_heap_verifies_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "threads");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    eprintln!("kill delays from seed {seed}");
    let mut rng = seed | 1;
    for round in 0..5 {
        rng ^= rng << 13;
        rng ^= rng >> 17;
        rng ^= rng << 5;
        let delay = 150 + (rng % 300) as u64;
        let heap = dir.path().join(format!("k{round}.heap"));
        let mut child = Command::new(&exe)
            .arg("0")
            .env("LD_PRELOAD", preload_lib())
            .env("TIERMEM_PHEAP_PATH", &heap)
            .env("TIERMEM_PHEAP_CAPACITY", "64M")
            .env("TIERMEM_CKPT_MS", "10")
            // As in the other runs: a loaded machine must not make the stops time out.
            .env("TIERMEM_SAFEPOINT_TIMEOUT_MS", "5000")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay));
        child.kill().unwrap(); // SIGKILL
        let st = child.wait().unwrap();
        assert!(!st.success(), "round {round}: the program ended by itself");
        let r = tiermem_pheap::inspect::inspect(&heap)
            .unwrap_or_else(|e| panic!("round {round} (killed after {delay} ms): {e}"));
        assert!(
            r.problems.is_empty(),
            "round {round} (killed after {delay} ms): {:?}",
            r.problems
        );
        let epoch = r.header.as_ref().map_or(0, |h| h.epoch);
        assert!(epoch >= 1, "round {round}: no checkpoint in {delay} ms");
        let h = tiermem_pheap::Heap::open(&heap)
            .unwrap_or_else(|e| panic!("round {round}: reopen: {e}"));
        assert_eq!(
            h.len(),
            r.objects.len(),
            "round {round}: reopened object count"
        );
        drop(h);
    }
}

/// A fork copies the heap into the child's own memfd; the parent's threads used to run on
/// meanwhile, so redis-server's BGSAVE child read a half-updated heap and crashed. The main
/// thread of `threads.c` forks 20 children while the others write (checkpoints every 5 ms);
/// each child checks every rewriter object not being rewritten at the fork. Before the fork
/// stopped the threads, 14–18 of 20 children found a torn heap.
#[test]
fn forked_children_get_the_heap_of_the_instant_of_the_fork() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "threads");
    let p = Prog {
        name: "threads",
        argv: vec![exe.display().to_string(), "100000".into(), "20".into()],
        stdin: None,
    };
    assert_eq!(run(&p, &[]), "threads ok\n");
    let heap = dir.path().join("fork.heap");
    let stats = dir.path().join("fork.json");
    let mut env = preload_env(&heap, &stats, 2);
    env.push(("TIERMEM_CKPT_MS", "5".to_string()));
    assert_eq!(run(&p, &env), "threads ok\n");
}

/// A program whose allocator calls are slow (one every 10 ms) still gets its checkpoint every
/// 50 ms: a thread reads the clock on every call while its calls are slow (a fixed stride of 32
/// calls between reads gave memcached 3 checkpoints instead of 16 under load).
#[test]
fn slow_callers_are_checkpointed_on_time() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(dir.path(), "slow");
    let p = Prog {
        name: "slow",
        argv: vec![exe.display().to_string()],
        stdin: None,
    };
    let heap = dir.path().join("slow.heap");
    let stats = dir.path().join("slow.json");
    let mut env = preload_env(&heap, &stats, 2);
    env.push(("TIERMEM_CKPT_MS", "50".to_string()));
    assert_eq!(run(&p, &env), "slow ok\n");
    let s = read_stats(&stats);
    // 0.6 s of calls: about 12 checkpoints due, and the one at exit.
    assert!(s.checkpoints >= 6, "{s:?}");
}
