//! Integration tests that run the real `tiermem` binary the way a user would.

use serde_json::Value;
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::process::{Command, Output};

fn tiermem(args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(args)
        .env("TIERMEM_DIR", dir)
        .output()
        .expect("run tiermem")
}

fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "tiermem failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn scratch(name: &str) -> PathBuf {
    let d =
        PathBuf::from("/dev/shm").join(format!("tiermem-clitest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn finite_positive(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{what} = {x}");
    x
}

#[test]
fn doctor_json_reports_every_key() {
    let dir = scratch("doctor");
    let v = json(&tiermem(&["doctor", "--json", "--quick"], &dir));
    assert!(v["kernel"].as_str().is_some_and(|k| !k.is_empty()));
    let features = v["features"].as_object().expect("features object");
    for k in [
        "userfaultfd",
        "pagemap_scan",
        "io_uring",
        "dax_mount",
        "clwb",
        "clflushopt",
        "memcg_v1",
        "swap_enabled",
    ] {
        assert!(
            features.get(k).is_some_and(Value::is_boolean),
            "feature {k} missing"
        );
    }
    assert_eq!(
        features["userfaultfd"], true,
        "the suite runs as root on a kernel with userfaultfd"
    );
    for k in [
        "first_touch",
        "mprotect_fault",
        "uffd_in_thread",
        "uffd_handler_thread",
        "memcpy_4k",
    ] {
        let c = &v["costs_us"][k];
        let p50 = finite_positive(&c["p50"], &format!("{k}.p50"));
        let p99 = finite_positive(&c["p99"], &format!("{k}.p99"));
        assert!(p99 >= p50, "{k}: p99 {p99} < p50 {p50}");
    }
    finite_positive(&v["copy_gbps"], "copy_gbps");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pool_create_info_rm_round_trip() {
    let dir = scratch("pool");
    let out = tiermem(
        &[
            "pool", "create", "p1", "--size", "8MiB", "--kind", "fam", "--tag", "t1",
        ],
        &dir,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("p1");
    let meta = std::fs::metadata(&path).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.len(), 8 << 20);
    let v = json(&tiermem(&["pool", "info", "p1", "--json"], &dir));
    assert_eq!(v["kind"], "fam");
    assert_eq!(v["tag"], "t1");
    assert_eq!(v["pool_size"], 8u64 << 20);
    // Creating it again must fail and leave it intact.
    let again = tiermem(&["pool", "create", "p1", "--size", "4MiB"], &dir);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 << 20);
    let rm = tiermem(&["pool", "rm", "p1"], &dir);
    assert!(rm.status.success());
    assert!(!path.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pool_commands_give_clear_errors_on_bad_input() {
    let dir = scratch("bad");
    let junk = dir.join("junk");
    std::fs::write(&junk, vec![0x5au8; 16384]).unwrap();
    for args in [
        vec!["pool", "info", junk.to_str().unwrap()],
        vec!["pool", "rm", junk.to_str().unwrap()],
    ] {
        let out = tiermem(&args, &dir);
        assert!(!out.status.success(), "{args:?} succeeded on a random file");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("not a tiermem pool"), "{args:?}: {err}");
    }
    assert!(
        junk.exists(),
        "rm must not delete a file that is not a pool"
    );
    let missing = tiermem(
        &[
            "pool",
            "create",
            "/nonexistent-dir-tiermem/p",
            "--size",
            "4MiB",
        ],
        &dir,
    );
    assert!(String::from_utf8_lossy(&missing.stderr).contains("does not exist"));
    let bad_size = tiermem(&["pool", "create", "p2", "--size", "12Q"], &dir);
    assert!(!bad_size.status.success());
    assert!(String::from_utf8_lossy(&bad_size.stderr).contains("unknown size unit"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_media_quick_json_has_the_headline_key() {
    let dir = scratch("bmedia");
    let v = json(&tiermem(&["bench", "media", "--quick", "--json"], &dir));
    finite_positive(&v["delay_model_error_pct"], "delay_model_error_pct");
    let acc = v["accuracy"].as_array().unwrap();
    assert_eq!(acc.len(), 6, "3 presets × 2 sizes");
    assert_eq!(v["bandwidth"].as_array().unwrap().len(), 4);
    // Bandwidth per second of the copying thread's CPU beside the wall-clock one.
    for b in v["bandwidth"].as_array().unwrap() {
        finite_positive(&b["cpu_gbps"], "cpu_gbps");
        finite_positive(&b["ratio_vs_none_per_cpu"], "ratio_vs_none_per_cpu");
    }
    // The directory holds no leftover benchmark pool.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_fault_quick_json_reports_scan_1gib_ms() {
    let dir = scratch("bfault");
    let v = json(&tiermem(&["bench", "fault", "--quick", "--json"], &dir));
    finite_positive(&v["scan_1gib_ms"], "scan_1gib_ms");
    finite_positive(
        &v["mprotect_over_pagemap_scan"],
        "mprotect_over_pagemap_scan",
    );
    assert_eq!(v["faults"].as_array().unwrap().len(), 6);
    // CPU per fault beside each latency, and its ratio to the kernel fault's.
    for f in v["faults"].as_array().unwrap() {
        finite_positive(&f["cpu_us_per_fault"], "cpu_us_per_fault");
        finite_positive(
            &f["cpu_over_kernel_first_touch"],
            "cpu_over_kernel_first_touch",
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tour's steps, in order (`tiermem tour --only` accepts these).
const TOUR_STEPS: [&str; 12] = [
    "doctor", "media", "fault", "vnvm", "kv", "migrate", "pheap", "prefault", "snapshot",
    "iocache", "pager", "zread",
];

/// The rows of the tour's closing table: (step, result).
fn tour_table(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .skip_while(|l| !l.contains("== what ran =="))
        .skip(2)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.to_string(), f.next()?.to_string()))
        })
        .collect()
}

/// The whole tour: every step reports ok (a step skipped for a missing prerequisite is a note,
/// or a failure under `TIERMEM_REQUIRE_CLIENTS=1`), and nothing is left behind: no file in its
/// directory, no server running on it, no network namespace.
#[test]
fn tour_runs_and_cleans_up() {
    let dir = scratch("tour");
    let t = std::time::Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(["tour", "--dir", dir.to_str().unwrap()])
        .env("TIERMEM_DIR", &dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run tiermem tour");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for tiermem tour");
    let took = t.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("tour finished"), "{stdout}");
    let rows = tour_table(&stdout);
    let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(names, TOUR_STEPS, "the table lists other steps:\n{stdout}");
    let required = std::env::var("TIERMEM_REQUIRE_CLIENTS").as_deref() == Ok("1");
    for (step, result) in &rows {
        match result.as_str() {
            "ok" => {}
            "skipped" if !required => {
                eprintln!(
                    "note: tour step {step} was skipped (scripts/setup.sh installs what it needs)"
                )
            }
            _ => {
                panic!("tour step {step}: {result} (TIERMEM_REQUIRE_CLIENTS={required})\n{stdout}")
            }
        }
        if result == "skipped" {
            assert!(stdout.contains(&format!("=> {step} skipped: ")), "{stdout}");
        } else {
            assert!(stdout.contains(&format!("=> {step} ok: ")), "{stdout}");
        }
    }
    assert!(
        took.as_secs() < 120,
        "the tour took {took:?} (must be under 2 minutes)"
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "the tour left files behind"
    );
    // No process still runs on the tour's directory (the kv servers were killed and reaped).
    let needle = dir.to_str().unwrap().as_bytes();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) {
            let mine = e.file_name() == std::ffi::OsStr::new(&std::process::id().to_string());
            assert!(
                mine || !cmdline.windows(needle.len()).any(|w| w == needle),
                "process {:?} still runs on the tour's directory: {}",
                e.file_name(),
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            );
        }
    }
    // Its network namespaces (tmtour-<pid>-...) are gone.
    if let Ok(ns) = Command::new("ip").args(["netns", "list"]).output() {
        let ns = String::from_utf8_lossy(&ns.stdout);
        assert!(
            !ns.contains(&format!("tmtour-{pid}-")),
            "the tour left network namespaces: {ns}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--only` runs the named steps in the tour's order; an unknown name is refused with the list
/// of valid ones, before anything runs.
#[test]
fn tour_only_runs_a_subset_and_refuses_unknown_steps() {
    let dir = scratch("touronly");
    let out = tiermem(
        &[
            "tour",
            "--dir",
            dir.to_str().unwrap(),
            "--only",
            "vnvm,media",
        ],
        &dir,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = tour_table(&stdout);
    assert_eq!(
        rows,
        [("media".into(), "ok".into()), ("vnvm".into(), "ok".into())],
        "{stdout}"
    );
    assert!(!stdout.contains("doctor"), "{stdout}");

    let out = tiermem(
        &[
            "tour",
            "--dir",
            dir.to_str().unwrap(),
            "--only",
            "kv,nosuch",
        ],
        &dir,
    );
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "a step ran: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nosuch"), "{err}");
    for step in TOUR_STEPS {
        assert!(err.contains(step), "the error does not list {step}: {err}");
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs tiermem with stdout a pipe whose reader is already gone.
fn tiermem_into_closed_pipe(args: &[&str], dir: &std::path::Path) -> Output {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just created and are owned here; the read end is closed at
    // once, the write end is handed to the child (Stdio takes ownership).
    let write_end = unsafe {
        libc::close(fds[0]);
        std::process::Stdio::from(std::os::fd::OwnedFd::from_raw_fd(fds[1]))
    };
    Command::new(env!("CARGO_BIN_EXE_tiermem"))
        .args(args)
        .env("TIERMEM_DIR", dir)
        .stdout(write_end)
        .output()
        .expect("run tiermem")
}

#[test]
fn a_reader_that_goes_away_ends_output_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = scratch("closedpipe");
    // A printing command stops as a SIGPIPE-killed one would (status 141), without a panic.
    let out = tiermem_into_closed_pipe(&["doctor", "--quick"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        out.status.code(),
        Some(141),
        "{:?} {err}",
        out.status.signal()
    );
    // The tour runs its steps to the end, cleans up and succeeds; only its lines are lost.
    let out = tiermem_into_closed_pipe(
        &[
            "tour",
            "--dir",
            dir.to_str().unwrap(),
            "--only",
            "media,vnvm",
        ],
        &dir,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{} {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn vnvm_recover_refuses_a_directory_without_an_instance() {
    let dir = scratch("vnvmrec");
    let out = tiermem(&["vnvm", "recover", dir.to_str().unwrap()], &dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds no vnvm instance"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The keys of a JSON object, sorted.
fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect();
    k.sort_unstable();
    k
}

/// A crashed vnvm instance in `dir/vnvm` (the default directory when TIERMEM_DIR is `dir`):
/// one 16 KiB region and two committed transactions that the (paused) redo worker never
/// applied.
fn crashed_vnvm_instance(dir: &std::path::Path) -> PathBuf {
    use tiermem_vnvm::{nv_init, Mode, VnvmConfig};
    let cfg = VnvmConfig {
        dir: dir.join("vnvm"),
        log_size: 16 * 4096,
        cache_size: 8 * 4096,
        max_files: 16,
        redo_paused: true,
        ..VnvmConfig::default()
    };
    let vn = nv_init(&cfg).unwrap();
    let r = vn
        .nv_allocate(dir.join("data"), 4 * 4096, Mode::Private)
        .unwrap();
    for off in [0usize, 5000] {
        let tid = vn.nv_txbegin();
        // SAFETY: inside the 16 KiB region.
        vn.nv_write(tid, unsafe { r.as_ptr().add(off) }, &[9u8; 64])
            .unwrap();
        vn.nv_commit(tid).unwrap();
    }
    vn.abandon();
    cfg.dir
}

#[test]
fn vnvm_info_and_stats_describe_an_instance() {
    let dir = scratch("vnvminfo");
    let inst = crashed_vnvm_instance(&dir);
    let is = inst.to_str().unwrap();

    let v = json(&tiermem(&["vnvm", "info", is, "--json"], &dir));
    assert_eq!(keys(&v), ["dir", "files", "geometry", "pools", "state"]);
    assert_eq!(v["dir"], is);
    assert_eq!(v["state"], "running_or_crashed");
    let g = &v["geometry"];
    assert_eq!(
        keys(g),
        [
            "cache_pages",
            "format_version",
            "log_objects",
            "log_pages",
            "max_domains",
            "max_files",
            "page_size"
        ]
    );
    assert_eq!(g["page_size"], 4096);
    assert_eq!(g["log_pages"], 16);
    assert_eq!(g["cache_pages"], 8);
    assert_eq!(g["max_files"], 16);
    let pools = v["pools"].as_array().unwrap();
    assert_eq!(pools.len(), 3);
    for (p, name) in pools.iter().zip(["meta.pool", "log.pool", "cache.pool"]) {
        assert_eq!(keys(p), ["bytes", "name", "path"]);
        assert_eq!(p["name"], name);
        let path = inst.join(name);
        assert_eq!(p["path"], path.to_str().unwrap());
        assert_eq!(p["bytes"], std::fs::metadata(&path).unwrap().len());
    }
    let files = v["files"].as_array().unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(
        keys(&files[0]),
        ["checksum_table", "id", "mode", "path", "relative", "size"]
    );
    assert_eq!(g["format_version"], 3);
    // The file lies beside the instance directory: stored as `../data`, so both move together.
    assert_eq!(files[0]["relative"], true);
    assert_eq!(files[0]["id"], 0);
    assert_eq!(files[0]["mode"], "private");
    assert_eq!(files[0]["size"], 4 * 4096);
    assert_eq!(files[0]["path"], dir.join("data").to_str().unwrap());

    // No DIR: the default instance directory, $TIERMEM_DIR/vnvm.
    let v = json(&tiermem(&["vnvm", "stats", "--json"], &dir));
    assert_eq!(
        keys(&v),
        ["cache", "dir", "domains", "live", "log", "state"]
    );
    assert_eq!(v["dir"], is);
    assert_eq!(v["state"], "running_or_crashed");
    assert_eq!(
        keys(&v["log"]),
        [
            "committed_pages",
            "committed_pct",
            "committed_transactions",
            "pages"
        ]
    );
    assert_eq!(v["log"]["pages"], 16);
    assert_eq!(v["log"]["committed_pages"], 2);
    assert_eq!(v["log"]["committed_transactions"], 2);
    assert_eq!(v["log"]["committed_pct"], 12.5);
    let domains = v["domains"].as_array().unwrap();
    assert_eq!(domains.len(), 1);
    assert_eq!(keys(&domains[0]), ["domain", "log_pages", "transactions"]);
    assert_eq!(domains[0]["domain"], 0);
    assert_eq!(domains[0]["transactions"], 2);
    assert_eq!(domains[0]["log_pages"], 2);
    assert_eq!(
        keys(&v["cache"]),
        ["dirty", "dirty_pct", "mapped", "pages", "valid_bytes"]
    );
    assert_eq!(v["cache"]["pages"], 8);
    assert_eq!(v["cache"]["mapped"], 0);
    assert_eq!(v["cache"]["dirty"], 0);
    assert_eq!(v["cache"]["valid_bytes"], 0);
    assert_eq!(v["cache"]["dirty_pct"], 0.0);
    assert!(v["live"].is_null());

    // Human output.
    let out = tiermem(&["vnvm", "stats", is], &dir);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("2 of 16 pages in committed lists"), "{text}");
    assert!(
        text.contains("no live users (counters are kept per running process)"),
        "{text}"
    );
    let out = tiermem(&["vnvm", "info", is], &dir);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(dir.join("data").to_str().unwrap()), "{text}");

    // After recovery: clean and empty.
    assert!(tiermem(&["vnvm", "recover", is], &dir).status.success());
    let v = json(&tiermem(&["vnvm", "stats", is, "--json"], &dir));
    assert_eq!(v["state"], "clean");
    assert_eq!(v["log"]["committed_transactions"], 0);
    assert_eq!(v["domains"].as_array().unwrap().len(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn vnvm_scrub_reports_damage_with_exit_codes() {
    let dir = scratch("vnvmscrub");
    let inst = crashed_vnvm_instance(&dir);
    let is = inst.to_str().unwrap();
    let v = json(&tiermem(&["vnvm", "scrub", is, "--json"], &dir));
    assert_eq!(keys(&v), ["areas", "clean", "dir"]);
    assert_eq!(v["clean"], true);
    // A flip in the first committed entry's payload (log page 0: header 24 + entry header 24).
    let log = inst.join("log.pool");
    let mut b = std::fs::read(&log).unwrap();
    b[4096 + 48 + 10] ^= 1;
    std::fs::write(&log, &b).unwrap();
    let out = tiermem(&["vnvm", "scrub", is, "--json"], &dir);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["clean"], false);
    let bad: Vec<&Value> = v["areas"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|a| a["bad"].as_array().unwrap().iter())
        .collect();
    assert_eq!(bad.len(), 1, "{v}");
    assert_eq!(bad[0]["file"], log.to_str().unwrap());
    assert!(
        bad[0]["what"].as_str().unwrap().contains("log page 0"),
        "{v}"
    );
    let out = tiermem(&["vnvm", "scrub", is], &dir);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("BAD committed logs"));
    // No instance: 2.
    let out = tiermem(&["vnvm", "scrub", dir.to_str().unwrap()], &dir);
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn vnvm_info_and_stats_give_clear_errors() {
    let dir = scratch("vnvminfoerr");
    // No instance: the explicit directory and the default one ($TIERMEM_DIR/vnvm).
    let missing = dir.join("nothing-here");
    for args in [
        vec!["vnvm", "info", missing.to_str().unwrap()],
        vec!["vnvm", "stats", missing.to_str().unwrap(), "--json"],
        vec!["vnvm", "stats"],
    ] {
        let out = tiermem(&args, &dir);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(out.stdout.is_empty(), "{args:?} printed to stdout");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("holds no vnvm instance"), "{args:?}: {err}");
        let path = if args.len() == 2 {
            dir.join("vnvm")
        } else {
            missing.clone()
        };
        assert!(err.contains(path.to_str().unwrap()), "{args:?}: {err}");
    }
    // Damaged: a bit flip in file record 0 (data offset 8192, after the 4 KiB pool header).
    let inst = crashed_vnvm_instance(&dir);
    let meta = inst.join("meta.pool");
    let mut bytes = std::fs::read(&meta).unwrap();
    bytes[4096 + 8192 + 40] ^= 0x04;
    std::fs::write(&meta, &bytes).unwrap();
    for cmd in ["info", "stats"] {
        let out = tiermem(&["vnvm", cmd, inst.to_str().unwrap()], &dir);
        assert!(!out.status.success(), "{cmd} accepted a damaged instance");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("damaged file record 0")
                && err.contains(meta.to_str().unwrap())
                && err.contains("at offset 8192"),
            "{cmd}: {err}"
        );
    }
    assert_eq!(std::fs::read(&meta).unwrap(), bytes, "inspect wrote");
    let _ = std::fs::remove_dir_all(&dir);
}
