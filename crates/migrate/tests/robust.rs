//! Fault tolerance and robustness of FAM-aware post-copy (issue #5 "Tests"): two migrations at
//! once over one FAM directory; the target killed mid-migration; the source killed after and
//! before its dump completes; a full FAM directory; corrupt and truncated lazy files; writers
//! at the target while pages still arrive. Killed peers are child processes (this test binary
//! run again with `TIERMEM_ROBUST_CHILD` set to a role).

use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tiermem_media::DelayModel;
use tiermem_migrate::fam::{migration_dir, FamSource, FamSourceConfig, FamTarget};
use tiermem_migrate::lazyfile::{Batching, LazyFile};
use tiermem_migrate::netns::{Host, TwoHosts};

const CHILD_ENV: &str = "TIERMEM_ROBUST_CHILD";
/// A hang guard (not a performance threshold).
const HANG: Duration = Duration::from_secs(20);

fn region(len: usize, seed: u64) -> Vec<u8> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = vec![0u8; len];
    r.fill(&mut v[..]);
    v
}

/// A FAM whose writes run at `bytes_per_sec` (slow enough that a migration is caught midway).
fn slow_fam(bytes_per_sec: u64) -> DelayModel {
    DelayModel {
        write_bytes_per_sec: bytes_per_sec,
        ..DelayModel::NONE
    }
}

fn cfg(fam: &Path, id: u64, delay: DelayModel) -> FamSourceConfig {
    FamSourceConfig {
        fam: fam.to_path_buf(),
        id,
        batching: Batching::PerVector,
        delay,
        skip_untouched: false,
    }
}

/// The bytes of region `i` of a restored target (every page faults in through the resolver).
fn target_bytes(t: &FamTarget, i: usize) -> &[u8] {
    let r = &t.regions()[i];
    // SAFETY: the target's registered mapping, alive as long as `t`.
    unsafe { std::slice::from_raw_parts(r.as_ptr() as *const u8, r.len()) }
}

/// Run this test binary's ignored `child_role` test as `role`, stdout piped.
fn spawn_child(role: &str, env: &[(&str, String)]) -> Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--ignored",
        "--exact",
        "child_role",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, role)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

/// Read the child's stdout until a line `ROBUST <word> ...`; returns the rest of that line.
fn wait_line(out: &mut impl BufRead, word: &str) -> String {
    let tag = format!("ROBUST {word}");
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "the child ended before saying {tag:?}");
        // (The test harness may print on the same line first.)
        if let Some(at) = line.find(&tag) {
            return line[at + tag.len()..].trim().to_string();
        }
    }
}

fn say(what: &str) {
    use std::io::Write;
    println!("ROBUST {what}");
    std::io::stdout().flush().unwrap();
}

fn kill9(c: &mut Child) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGKILL) },
        0
    );
    let st = c.wait().unwrap();
    assert_eq!(st.signal(), Some(libc::SIGKILL));
}

const CHILD_LEN: usize = 32 << 20;
const CHILD_SEED: u64 = 77;

/// The roles a child process plays (run only as a child process: see [`spawn_child`]).
#[test]
#[ignore = "helper: run only as a child process"]
fn child_role() {
    let role = std::env::var(CHILD_ENV)
        .unwrap_or_else(|_| panic!("helper only: run by spawn_child with {CHILD_ENV} set"));
    let var = |k: &str| std::env::var(k).unwrap();
    match role.as_str() {
        // A source dumping slowly; says its address, then DONE when serve returned, then waits
        // to be killed.
        "slow-source" => {
            let src = region(CHILD_LEN, CHILD_SEED);
            let c = cfg(
                Path::new(&var("ROBUST_FAM")),
                var("ROBUST_ID").parse().unwrap(),
                slow_fam(var("ROBUST_BPS").parse().unwrap()),
            );
            // SAFETY: `src` lives (unwritten) until the process is killed.
            let s = unsafe { FamSource::checkpoint(c, &[(src.as_ptr(), CHILD_LEN as u64)], b"") }
                .unwrap();
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            say(&format!("ADDR {}", l.local_addr().unwrap()));
            let rep = s.serve(l).unwrap();
            say(&format!("DONE {}", rep.requests));
            std::thread::sleep(Duration::from_secs(120));
        }
        // A target that restores, touches a page, says READY and waits to be killed.
        "target" => {
            let addr: SocketAddr = var("ROBUST_ADDR").parse().unwrap();
            let t = FamTarget::restore(
                Path::new(&var("ROBUST_FAM")),
                var("ROBUST_ID").parse().unwrap(),
                Some(addr),
                DelayModel::NONE,
                Duration::from_secs(5),
            )
            .unwrap();
            let b = target_bytes(&t, 0);
            std::hint::black_box(b[b.len() - 1]);
            say(&format!("READY {}", t.requests()));
            std::thread::sleep(Duration::from_secs(120));
        }
        // A target whose source (a grandchild) is killed before its dump completes.
        "target-of-a-killed-source" => {
            // The parent's directory: this process dies of the fault, the parent removes it.
            let fam = std::path::PathBuf::from(std::env::var("ROBUST_FAM").unwrap());
            let mut src = spawn_child(
                "slow-source",
                &[
                    ("ROBUST_FAM", fam.display().to_string()),
                    ("ROBUST_ID", "41".into()),
                    // 32 MiB at 8 MB/s: four seconds of dump, killed well before the end.
                    ("ROBUST_BPS", (8u64 << 20).to_string()),
                ],
            );
            let mut out = BufReader::new(src.stdout.take().unwrap());
            let addr: SocketAddr = wait_line(&mut out, "ADDR").parse().unwrap();
            let t = FamTarget::restore(&fam, 41, Some(addr), DelayModel::NONE, HANG).unwrap();
            let b = target_bytes(&t, 0);
            let want = region(CHILD_LEN, CHILD_SEED);
            assert_eq!(b[CHILD_LEN / 2], want[CHILD_LEN / 2], "a page on demand");
            kill9(&mut src);
            // A new target is refused at once: the dump is incomplete and the source is gone.
            let t0 = Instant::now();
            let e = FamTarget::restore(&fam, 41, Some(addr), DelayModel::NONE, HANG)
                .err()
                .expect("no restore without the source and an incomplete dump");
            say(&format!("REFUSED {:?} {e}", t0.elapsed()));
            eprintln!("child: touching a page the killed source never dumped");
            std::hint::black_box(b[CHILD_LEN - 1]);
            say("UNEXPECTED the access succeeded");
        }
        other => panic!("unknown child role {other}"),
    }
}

#[test]
fn two_migrations_at_once_over_one_fam_directory() {
    let hosts = TwoHosts::create("tmrb2").expect("network namespaces (root)");
    let fam = tempfile::tempdir_in("/dev/shm").unwrap();
    let ids = [0xa1u64, 0xb2];
    let lens = [[6usize << 20, 3 << 20], [4 << 20, 5 << 20]];
    let srcs: Vec<Vec<Vec<u8>>> = (0..2)
        .map(|m| {
            (0..2)
                .map(|r| region(lens[m][r], 100 + 2 * m as u64 + r as u64))
                .collect()
        })
        .collect();
    let mut servers = Vec::new();
    let mut addrs = Vec::new();
    for m in 0..2 {
        let l = hosts
            .run_in(Host::Src, || TcpListener::bind((hosts.src_addr(), 0)))
            .unwrap()
            .unwrap();
        addrs.push(l.local_addr().unwrap());
        let regions: Vec<(*const u8, u64)> = srcs[m]
            .iter()
            .map(|v| (v.as_ptr(), v.len() as u64))
            .collect();
        // SAFETY: `srcs` is neither written nor freed until the servers are joined below.
        let s = unsafe {
            FamSource::checkpoint(
                // 9 MiB at 64 MB/s: the targets fault while both dumps run.
                cfg(fam.path(), ids[m], slow_fam(64 << 20)),
                &regions,
                format!("migration {m}").as_bytes(),
            )
        }
        .unwrap();
        servers.push(std::thread::spawn(move || s.serve(l)));
    }
    // Both targets restore and fault concurrently.
    let targets: Vec<_> = (0..2)
        .map(|m| {
            let (fam, id, addr) = (fam.path().to_path_buf(), ids[m], addrs[m]);
            let want = srcs[m].clone();
            hosts
                .spawn_in(Host::Dst, move || {
                    let t = FamTarget::restore(
                        &fam,
                        id,
                        Some(addr),
                        DelayModel::NONE,
                        Duration::from_secs(5),
                    )
                    .unwrap();
                    assert_eq!(t.blob(), format!("migration {m}").as_bytes());
                    for (i, w) in want.iter().enumerate() {
                        // Reads from the top down (pages not yet dumped), then everything.
                        let b = target_bytes(&t, i);
                        let mut off = w.len();
                        while off >= 4096 {
                            off -= 1 << 20;
                            assert_eq!(b[off], w[off]);
                            if off < (1 << 20) {
                                break;
                            }
                        }
                    }
                    t.complete();
                    for (i, w) in want.iter().enumerate() {
                        assert!(target_bytes(&t, i) == &w[..], "migration {m} region {i}");
                    }
                    t.requests()
                })
                .unwrap()
        })
        .collect();
    for (m, t) in targets.into_iter().enumerate() {
        let requests = t.join().unwrap().unwrap();
        let rep = servers.remove(0).join().unwrap().unwrap();
        eprintln!(
            "migration {m}: {requests} requests, source answered {}",
            rep.requests
        );
        assert_eq!(rep.bytes, (lens[m][0] + lens[m][1]) as u64);
        assert!(requests >= 1, "the target faulted while its source dumped");
    }
    // An id in use is refused, and its directory left alone.
    // SAFETY: the region outlives the (failing) call.
    let e = unsafe {
        FamSource::checkpoint(
            cfg(fam.path(), ids[0], DelayModel::NONE),
            &[(srcs[0][0].as_ptr(), 4096)],
            b"",
        )
    }
    .err()
    .expect("a second migration with the same id is refused")
    .to_string();
    assert!(e.contains("already exists"), "{e}");
    // Each migration wrote only its own directory.
    let mut names: Vec<String> = std::fs::read_dir(fam.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, vec!["mig-00000000000000a1", "mig-00000000000000b2"]);
    for (m, &id) in ids.iter().enumerate() {
        let dir = migration_dir(fam.path(), id);
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        assert_eq!(files, vec!["checkpoint", "region-0.lazy", "region-1.lazy"]);
        for (r, &len) in lens[m].iter().enumerate() {
            let f =
                LazyFile::open(&dir.join(format!("region-{r}.lazy")), DelayModel::NONE).unwrap();
            assert_eq!(f.region_len(), len as u64);
            assert!(f.is_complete());
        }
    }
}

#[test]
fn a_killed_target_does_not_stop_the_source() {
    let fam = tempfile::tempdir_in("/dev/shm").unwrap();
    let len = CHILD_LEN;
    let src = region(len, 3);
    let id = 51u64;
    // 32 MiB at 32 MB/s: about a second of dump, the target is killed early in it.
    // SAFETY: `src` outlives serve (joined below) and is not written.
    let s = unsafe {
        FamSource::checkpoint(
            cfg(fam.path(), id, slow_fam(32 << 20)),
            &[(src.as_ptr(), len as u64)],
            b"",
        )
    }
    .unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || s.serve(l));
    let mut child = spawn_child(
        "target",
        &[
            ("ROBUST_FAM", fam.path().display().to_string()),
            ("ROBUST_ID", id.to_string()),
            ("ROBUST_ADDR", addr.to_string()),
        ],
    );
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let requests: u64 = wait_line(&mut out, "READY").parse().unwrap();
    assert_eq!(requests, 1, "the target asked for its last page on demand");
    assert!(
        !server.is_finished(),
        "the target is killed while the dump runs"
    );
    kill9(&mut child);
    let t0 = Instant::now();
    let rep = server
        .join()
        .unwrap()
        .expect("serve completes without its target");
    eprintln!(
        "target killed: serve returned {:?} later; {} requests answered, told done {}",
        t0.elapsed(),
        rep.requests,
        rep.told_done
    );
    assert_eq!(rep.requests, 1);
    assert_eq!(rep.bytes, len as u64);
    let f = LazyFile::open(
        &migration_dir(fam.path(), id).join("region-0.lazy"),
        DelayModel::NONE,
    )
    .unwrap();
    assert!(f.is_complete(), "the lazy file is complete");
    // A new target restores every byte from FAM alone.
    let t = FamTarget::restore(
        fam.path(),
        id,
        None,
        DelayModel::NONE,
        Duration::from_secs(1),
    )
    .unwrap();
    t.complete();
    assert!(target_bytes(&t, 0) == &src[..]);
    assert_eq!(t.requests(), 0);
}

#[test]
fn a_source_killed_after_its_dump_leaves_the_target_complete() {
    let fam = tempfile::tempdir_in("/dev/shm").unwrap();
    let id = 61u64;
    let mut child = spawn_child(
        "slow-source",
        &[
            ("ROBUST_FAM", fam.path().display().to_string()),
            ("ROBUST_ID", id.to_string()),
            // 32 MiB at 64 MB/s: half a second of dump.
            ("ROBUST_BPS", (64u64 << 20).to_string()),
        ],
    );
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addr: SocketAddr = wait_line(&mut out, "ADDR").parse().unwrap();
    let t = FamTarget::restore(fam.path(), id, Some(addr), DelayModel::NONE, HANG).unwrap();
    let want = region(CHILD_LEN, CHILD_SEED);
    let b = target_bytes(&t, 0);
    assert_eq!(b[CHILD_LEN - 1], want[CHILD_LEN - 1]);
    assert_eq!(
        t.requests(),
        1,
        "restored while the dump ran: the last page on demand"
    );
    let answered: u64 = wait_line(&mut out, "DONE").parse().unwrap();
    assert_eq!(answered, 1);
    kill9(&mut child);
    // Everything else comes from FAM; a hang guard runs the rest on a thread.
    let (tx, rx) = std::sync::mpsc::channel();
    let (base, len) = (t.regions()[0].as_ptr() as usize, t.regions()[0].len());
    std::thread::spawn(move || {
        // SAFETY: the target's registered mapping, alive until the receive below returned.
        let n = unsafe { tiermem_migrate::resolve::prefetch(base as *const u8, len) };
        let _ = tx.send(n);
    });
    let pages = rx
        .recv_timeout(HANG)
        .expect("the target completes from FAM without its source (no hang)");
    assert_eq!(pages, CHILD_LEN / 4096);
    assert!(b == &want[..], "every byte");
    assert_eq!(t.requests(), 1, "no request after the dump completed");
}

#[test]
fn a_source_killed_before_its_dump_fails_the_target_promptly() {
    let t0 = Instant::now();
    let fam = tempfile::tempdir_in("/dev/shm").unwrap();
    let child = spawn_child(
        "target-of-a-killed-source",
        &[("ROBUST_FAM", fam.path().display().to_string())],
    );
    // The hang guard: wait at most HANG for the child.
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(HANG) {
        Ok(o) => o.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("the target hung on its dead source");
        }
    };
    let took = t0.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("child stdout: {stdout}\nchild stderr: {stderr}\ntook {took:?}");
    assert!(
        stdout.contains("ROBUST REFUSED") && stdout.contains("unreachable"),
        "a new restore is refused with a clear error: {stdout}"
    );
    assert!(!stdout.contains("UNEXPECTED"), "{stdout}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "the access to a page never dumped fails (SIGBUS): {stderr}"
    );
    assert!(
        stderr.contains("page-server") || stderr.contains("source"),
        "the resolver says why: {stderr}"
    );
}

/// A private small tmpfs, unmounted on drop.
struct SmallTmpfs {
    dir: tempfile::TempDir,
}

impl SmallTmpfs {
    fn mount(size: &str) -> SmallTmpfs {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting a small tmpfs (root)");
        SmallTmpfs { dir }
    }
    fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn a_full_fam_directory_fails_the_checkpoint_and_leaves_nothing() {
    let fs = SmallTmpfs::mount("8m");
    // The first region fits, the second does not.
    let (a, b) = (region(5 << 20, 1), region(5 << 20, 2));
    let regions = [(a.as_ptr(), a.len() as u64), (b.as_ptr(), b.len() as u64)];
    // SAFETY: both regions outlive the call.
    let e = unsafe { FamSource::checkpoint(cfg(&fs.path(), 71, DelayModel::NONE), &regions, b"") }
        .err()
        .expect("no space for the second lazy file")
        .to_string();
    eprintln!("full FAM: {e}");
    assert!(
        e.contains("space") && e.contains("region-1.lazy"),
        "a clear no-space error: {e}"
    );
    let left: Vec<_> = std::fs::read_dir(fs.path()).unwrap().collect();
    assert!(left.is_empty(), "no partial migration directory: {left:?}");
    // The same migration fits once regions are smaller, with the same id.
    let small = [(a.as_ptr(), 2 << 20), (b.as_ptr(), 2 << 20)];
    // SAFETY: as above.
    let s = unsafe { FamSource::checkpoint(cfg(&fs.path(), 71, DelayModel::NONE), &small, b"") }
        .unwrap();
    s.serve(TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
}

/// A completed 4 MiB migration `id` in `fam` (no source needed to restore it).
fn completed(fam: &Path, id: u64) -> PathBuf {
    let src = region(4 << 20, 9);
    // SAFETY: `src` outlives serve.
    let s = unsafe {
        FamSource::checkpoint(
            cfg(fam, id, DelayModel::NONE),
            &[(src.as_ptr(), src.len() as u64)],
            b"",
        )
    }
    .unwrap();
    s.serve(TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
    migration_dir(fam, id).join("region-0.lazy")
}

#[test]
fn a_corrupt_or_truncated_lazy_file_is_refused_by_name() {
    use std::os::unix::fs::FileExt;
    let fam = tempfile::tempdir_in("/dev/shm").unwrap();
    let restore = |id| {
        FamTarget::restore(
            fam.path(),
            id,
            None,
            DelayModel::NONE,
            Duration::from_secs(1),
        )
        .err()
        .expect("a damaged lazy file is refused")
        .to_string()
    };
    // A flipped byte in the migrate header (its region length).
    let p = completed(fam.path(), 81);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    let at = tiermem_media::pool::HEADER_SIZE + 24;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x10], at).unwrap();
    drop(f);
    let e = restore(81);
    eprintln!("corrupt: {e}");
    assert!(e.contains(&p.display().to_string()), "names the file: {e}");
    // A truncated file (its last MiB gone).
    let p = completed(fam.path(), 82);
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    let n = f.metadata().unwrap().len();
    f.set_len(n - (1 << 20)).unwrap();
    drop(f);
    let e = restore(82);
    eprintln!("truncated: {e}");
    assert!(e.contains(&p.display().to_string()), "names the file: {e}");
}

#[test]
fn writers_at_the_target_while_pages_arrive_keep_their_writes() {
    let fam = tempfile::tempdir_in("/dev/shm").unwrap();
    let len = CHILD_LEN;
    let pages = len / 4096;
    let src = region(len, 91);
    let id = 91u64;
    // SAFETY: `src` outlives serve (joined below) and is not written.
    let s = unsafe {
        FamSource::checkpoint(
            cfg(fam.path(), id, slow_fam(64 << 20)),
            &[(src.as_ptr(), len as u64)],
            b"",
        )
    }
    .unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || s.serve(l));
    let t = FamTarget::restore(
        fam.path(),
        id,
        Some(addr),
        DelayModel::NONE,
        Duration::from_secs(5),
    )
    .unwrap();
    let base = t.regions()[0].as_ptr() as usize;
    const WRITERS: usize = 4;
    // Each writer owns the pages p with p % WRITERS == w and increments a counter word of a
    // random one of them (read-modify-write), while a prefetcher pulls every page in.
    let counts: Vec<Vec<u32>> = std::thread::scope(|sc| {
        sc.spawn(|| {
            // SAFETY: the registered mapping, alive for the whole scope.
            unsafe { tiermem_migrate::resolve::prefetch(base as *const u8, len) };
        });
        let hs: Vec<_> = (0..WRITERS)
            .map(|w| {
                sc.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
                    let mut c = vec![0u32; pages];
                    for _ in 0..20_000 {
                        let p = rng.gen_range(0..pages / WRITERS) * WRITERS + w;
                        let word = (base + p * 4096 + 8 * (p % 512)) as *mut u64;
                        // SAFETY: inside the registered mapping; only this thread writes page p.
                        unsafe { word.write_volatile(word.read_volatile().wrapping_add(1)) };
                        c[p] += 1;
                    }
                    c
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let rep = server.join().unwrap().unwrap();
    t.complete();
    let dst = target_bytes(&t, 0);
    let mut written = 0;
    for p in 0..pages {
        let n: u32 = counts.iter().map(|c| c[p]).sum();
        let o = p * 4096 + 8 * (p % 512);
        let mut want = src[p * 4096..(p + 1) * 4096].to_vec();
        let w = u64::from_ne_bytes(src[o..o + 8].try_into().unwrap()).wrapping_add(n as u64);
        want[8 * (p % 512)..8 * (p % 512) + 8].copy_from_slice(&w.to_ne_bytes());
        assert!(
            dst[p * 4096..(p + 1) * 4096] == want[..],
            "page {p} (written {n} times)"
        );
        written += (n > 0) as usize;
    }
    let (from_fam, on_demand) = t.fault_counts();
    eprintln!(
        "writers: {written} pages written at the target during the migration; faults from FAM \
         {from_fam}, on demand {on_demand}; source answered {}",
        rep.requests
    );
    assert!(on_demand >= 1, "the writers ran while pages still arrived");
}
