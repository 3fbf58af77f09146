//! The kv half of the corruption sweep (issue #13, "What it must show"): a kv instance with a
//! known dataset of every type, a clean copy (SHUTDOWN) and a crashed copy (kill -9 under write
//! load), the reference content of each after a clean recovery, then a seeded set of cases
//! that flip random bits at random offsets of, or truncate, one file of the instance (every
//! file in turn) and start the real `tiermem kv serve` on it. Each case must end in a refusal
//! to start that names the file, or in a server whose every reply is complete and either the
//! reference's or an error; never a panic, never a wrong reply.
//!
//! `TIERMEM_KV_SWEEP_CASES` cases (default 60), `TIERMEM_KV_SWEEP_SEED`.
//!
//! It relies on vnvm's checksums of log entries, cache page records, cache pages and backing
//! file pages (issue #13, defect 3): without them a flip in a value's bytes in `heap.data` or
//! in a cache page is served as data (a wrong reply). `--nocapture` prints every case; the
//! failing ones are listed at the end.

mod kv_common;

use kv_common::{try_start_server, Conn, Reply};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SIZES: &[&str] = &[
    "--set",
    "heap-size=32mb",
    "--set",
    "log-size=4mb",
    "--set",
    "cache-size=4mb",
];

fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from("/dev/shm").join(format!("tiermem-sweep-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn copy_dir(src: &Path, dst: &Path) {
    let _ = std::fs::remove_dir_all(dst);
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
}

/// Every regular file under `dir`, relative to it, sorted.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(dir.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                stack.push(r);
            } else {
                v.push(r);
            }
        }
    }
    v.sort();
    v
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Send every command, then read every reply (pipelined).
fn pipeline(c: &mut Conn, cmds: &[Vec<String>]) -> std::io::Result<Vec<Reply>> {
    for chunk in cmds.chunks(256) {
        for cmd in chunk {
            let args: Vec<&str> = cmd.iter().map(|s| s.as_str()).collect();
            c.send(&args)?;
        }
    }
    cmds.iter().map(|_| c.read()).collect()
}

fn cmd(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| s.to_string()).collect()
}

/// A few thousand keys of every type, small and big encodings.
fn dataset() -> Vec<Vec<String>> {
    let mut v = Vec::new();
    for i in 0..1200 {
        let val = format!("{i}:{}", "s".repeat(i * 37 % 3000));
        v.push(cmd(&["SET", &format!("s:{i}"), &val]));
    }
    for i in 0..2 {
        v.push(cmd(&["SET", &format!("blob:{i}"), &"B".repeat(70_000 + i)]));
    }
    for i in 0..60 {
        let mut c = cmd(&["RPUSH", &format!("l:{i}")]);
        c.extend((0..1 + i * 7 % 200).map(|j| format!("e{j}")));
        v.push(c);
    }
    let mut big = cmd(&["RPUSH", "l:big"]);
    big.extend((0..3000).map(|j| format!("element-{j}")));
    v.push(big);
    for i in 0..62 {
        let mut h = cmd(&["HSET", &format!("h:{i}")]);
        for j in 0..(if i >= 60 { 300 } else { 1 + i % 20 }) {
            h.push(format!("f{j}"));
            h.push(format!("value-{i}-{j}"));
        }
        v.push(h);
        let mut s = cmd(&["SADD", &format!("set:{i}")]);
        s.extend((0..(if i >= 60 { 300 } else { 1 + i % 30 })).map(|j| format!("m{j}")));
        v.push(s);
        let mut z = cmd(&["ZADD", &format!("z:{i}")]);
        for j in 0..(if i >= 60 { 400 } else { 1 + i % 30 }) {
            z.push(format!("{}", (j * 7919) % 1000));
            z.push(format!("m{j}"));
        }
        v.push(z);
    }
    v
}

/// The content of a server: key → (type, canonical value). `Err` when a reply is torn,
/// malformed or missing (the connection failed); error replies are kept as values.
type Dump = BTreeMap<String, (Reply, Reply)>;

fn read_cmd(key: &str, ty: &Reply) -> Vec<String> {
    match ty {
        Reply::Simple(t) if t == "string" => cmd(&["GET", key]),
        Reply::Simple(t) if t == "list" => cmd(&["LRANGE", key, "0", "-1"]),
        Reply::Simple(t) if t == "hash" => cmd(&["HGETALL", key]),
        Reply::Simple(t) if t == "set" => cmd(&["SMEMBERS", key]),
        Reply::Simple(t) if t == "zset" => cmd(&["ZRANGE", key, "0", "-1", "WITHSCORES"]),
        _ => cmd(&["EXISTS", key]),
    }
}

/// Sets and hashes in a canonical order.
fn canonical(ty: &Reply, r: Reply) -> Reply {
    match (ty, r) {
        (Reply::Simple(t), Reply::Array(Some(mut v))) if t == "set" => {
            v.sort_by_key(|x| format!("{x:?}"));
            Reply::Array(Some(v))
        }
        (Reply::Simple(t), Reply::Array(Some(v))) if t == "hash" => {
            let mut pairs: Vec<Vec<Reply>> = v.chunks(2).map(|c| c.to_vec()).collect();
            pairs.sort_by_key(|x| format!("{x:?}"));
            Reply::Array(Some(pairs.concat()))
        }
        (_, r) => r,
    }
}

/// Read `keys` (type, then the whole value) from the server.
fn read_keys(c: &mut Conn, keys: &[String]) -> std::io::Result<Dump> {
    let types = pipeline(
        c,
        &keys.iter().map(|k| cmd(&["TYPE", k])).collect::<Vec<_>>(),
    )?;
    let reads: Vec<Vec<String>> = keys
        .iter()
        .zip(&types)
        .map(|(k, t)| read_cmd(k, t))
        .collect();
    let vals = pipeline(c, &reads)?;
    Ok(keys
        .iter()
        .zip(types)
        .zip(vals)
        .map(|((k, t), v)| (k.clone(), (t.clone(), canonical(&t, v))))
        .collect())
}

/// Every key, by SCAN (`Ok(Err(e))`: an error reply).
fn scan_keys(c: &mut Conn) -> std::io::Result<Result<BTreeSet<String>, String>> {
    let mut keys = BTreeSet::new();
    let mut cursor = "0".to_string();
    for _ in 0..100_000 {
        match c.try_cmd(&["SCAN", &cursor, "COUNT", "500"])? {
            Reply::Array(Some(v)) if v.len() == 2 => {
                let (Reply::Bulk(Some(cur)), Reply::Array(Some(ks))) = (&v[0], &v[1]) else {
                    return Err(std::io::ErrorKind::InvalidData.into());
                };
                for k in ks {
                    let Reply::Bulk(Some(k)) = k else {
                        return Err(std::io::ErrorKind::InvalidData.into());
                    };
                    keys.insert(String::from_utf8_lossy(k).into_owned());
                }
                cursor = String::from_utf8_lossy(cur).into_owned();
                if cursor == "0" {
                    return Ok(Ok(keys));
                }
            }
            Reply::Error(e) => return Ok(Err(e)),
            _ => return Err(std::io::ErrorKind::InvalidData.into()),
        }
    }
    Ok(Err("SCAN did not end".into()))
}

fn dump(c: &mut Conn) -> Dump {
    let keys = scan_keys(c)
        .unwrap()
        .expect("SCAN of an undamaged instance");
    read_keys(c, &keys.into_iter().collect::<Vec<_>>()).unwrap()
}

/// Stop a server: SHUTDOWN, then SHUTDOWN NOSAVE, then SIGKILL; its output.
fn stop(mut s: kv_common::Server) -> String {
    for how in [&["SHUTDOWN"][..], &["SHUTDOWN", "NOSAVE"][..]] {
        if let Ok(mut c) = Conn::connect(s.port) {
            let _ = c.send(how);
            let _ = c.read();
        }
        if s.wait_exit(20).is_some() {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    s.log()
}

/// Writers that log their acknowledged SETs until `stop`.
fn load_writers(port: u16, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<Vec<String>>> {
    (0..3)
        .map(|w| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                let Ok(mut c) = Conn::connect(port) else {
                    return acked;
                };
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let k = format!("crash:{w}:{i}");
                    match c.try_cmd(&["SET", &k, &format!("v{i}")]) {
                        Ok(Reply::Simple(_)) => {}
                        _ => return acked,
                    }
                    let _ = c.try_cmd(&["RPUSH", &format!("l:{}", i % 60), &k]);
                    acked.push(k);
                    i += 1;
                }
                acked
            })
        })
        .collect()
}

/// One case's outcome: `Ok(summary)` or `Err(what went wrong)`.
fn run_case(dir: &Path, reference: &Dump, file: &Path) -> Result<String, String> {
    let s = match try_start_server(dir, SIZES) {
        Err(log) => {
            if log.contains("panicked") {
                return Err(format!("start panicked:\n{log}"));
            }
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            if !log.contains(&name) && !log.contains(&dir.display().to_string()) {
                return Err(format!("refused without naming {name}:\n{log}"));
            }
            return Ok("refused to start".into());
        }
        Ok(s) => s,
    };
    let mut c = Conn::connect(s.port).map_err(|e| e.to_string())?;
    let keys: Vec<String> = reference.keys().cloned().collect();
    let mut errors = 0;
    let mut wrong = Vec::new();
    match c.try_cmd(&["DBSIZE"]) {
        Ok(Reply::Int(n)) if n as usize == keys.len() => {}
        Ok(Reply::Error(_)) => errors += 1,
        r => wrong.push(format!("DBSIZE {r:?}, reference {}", keys.len())),
    }
    match scan_keys(&mut c) {
        Ok(Ok(got)) => {
            if got.iter().ne(reference.keys()) {
                let missing = reference.keys().filter(|k| !got.contains(*k)).count();
                let extra = got.iter().filter(|k| !reference.contains_key(*k)).count();
                wrong.push(format!("SCAN: {missing} keys missing, {extra} extra"));
            }
        }
        Ok(Err(_)) => errors += 1,
        Err(e) => wrong.push(format!("SCAN: torn or no reply ({e})")),
    }
    match read_keys(&mut c, &keys) {
        Ok(got) => {
            for (k, (ty, v)) in &got {
                let (rt, rv) = &reference[k];
                let is_err = |r: &Reply| matches!(r, Reply::Error(_));
                if is_err(ty) || is_err(v) {
                    errors += 1;
                } else if ty != rt {
                    wrong.push(format!("{k}: type {ty:?}, reference {rt:?}"));
                } else if v != rv {
                    let (a, b) = (format!("{v:?}"), format!("{rv:?}"));
                    let at = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
                    wrong.push(format!(
                        "{k}: value differs from the reference at char {at} of {} (reference {})",
                        a.len(),
                        b.len()
                    ));
                }
            }
        }
        Err(e) => wrong.push(format!("reads: torn or no reply ({e})")),
    }
    let log = stop(s);
    if log.contains("panicked") {
        wrong.push(format!("panicked:\n{log}"));
    }
    if wrong.is_empty() {
        Ok(format!(
            "served: {errors} error replies, the rest as the reference"
        ))
    } else {
        let n = wrong.len();
        wrong.truncate(5);
        Err(format!("{n} wrong: {}", wrong.join("; ")))
    }
}

#[test]
fn corruption_sweep_of_clean_and_crashed_instances() {
    let cases: u64 = std::env::var("TIERMEM_KV_SWEEP_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let seed: u64 = std::env::var("TIERMEM_KV_SWEEP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_5eed);
    let root = scratch("sweep");
    // Every server runs on the same directory `work` (a vnvm instance records its backing
    // file's path; until it is relative, a copy elsewhere would write back into the
    // original): the clean and crashed instances are kept as archives and copied back there.
    let work = root.join("work");
    let clean = root.join("clean");
    let crashed = root.join("crashed");
    // The dataset, then a clean shutdown.
    {
        let s = kv_common::create_server(&work, SIZES);
        let mut c = Conn::connect(s.port).unwrap();
        for r in pipeline(&mut c, &dataset()).unwrap() {
            assert!(!matches!(r, Reply::Error(_)), "{r:?}");
        }
        let log = stop(s);
        assert!(!log.contains("panicked"), "{log}");
    }
    copy_dir(&work, &clean);
    // A crashed instance: kill -9 under write load.
    let acked: Vec<String> = {
        let mut s = kv_common::start_server(&work, SIZES);
        let halt = Arc::new(AtomicBool::new(false));
        let ws = load_writers(s.port, halt.clone());
        std::thread::sleep(Duration::from_millis(300));
        let _ = s.child.kill();
        let _ = s.child.wait();
        halt.store(true, Ordering::Relaxed);
        ws.into_iter().flat_map(|h| h.join().unwrap()).collect()
    };
    assert!(!acked.is_empty(), "no write acknowledged before the kill");
    copy_dir(&work, &crashed);
    // References: each instance's content after a clean recovery.
    let mut refs = Vec::new();
    for base in [&clean, &crashed] {
        copy_dir(base, &work);
        let s = kv_common::start_server(&work, SIZES);
        let mut c = Conn::connect(s.port).unwrap();
        let d = dump(&mut c);
        drop(c);
        stop(s);
        refs.push(d);
    }
    let bases = [&clean, &crashed];
    let names = ["clean", "crashed"];
    // The pages of heap.data that were dirty in the NVM cache at the crash: recovery rebuilds
    // them from the cache's valid chunks and must verify the file's other bytes against the
    // checksum table's two recorded contents of the page (docs/vnvm.md, "Checksums"). Two in
    // three flip cases of the crashed copy's heap.data aim at them, and 8 more cases follow the
    // schedule.
    let info = tiermem_vnvm::inspect(crashed.join("vnvm")).expect("inspect the crashed copy");
    let heap = info
        .files
        .iter()
        .find(|f| f.path.file_name().is_some_and(|n| n == "heap.data"))
        .map(|f| f.id);
    let dirty: Vec<u64> = info
        .cache
        .dirty_pages
        .iter()
        .filter(|(f, _)| Some(*f) == heap)
        .map(|&(_, idx)| idx)
        .collect();
    eprintln!(
        "crashed copy: {} pages of heap.data dirty in the NVM cache",
        dirty.len()
    );
    // The NVM cache pages of those: recovery writes their valid chunks into heap.data after
    // checking them against their records' contents checksums. Those that transactions still
    // in the committed list write are where a checksum mismatch could pass for a redo batch
    // cut by the kill (docs/vnvm.md, "Checksums"); EXTRA more cases flip bits in them (or, if
    // there are none, in any dirty cache page).
    let cache_targets: Vec<u64> = {
        let dirty_cache: Vec<((u32, u64), u32)> = info
            .cache
            .dirty_pages
            .iter()
            .copied()
            .zip(info.cache.dirty_cache_pages.iter().copied())
            .collect();
        let listed: Vec<u64> = dirty_cache
            .iter()
            .filter(|(k, _)| info.listed_pages.binary_search(k).is_ok())
            .map(|&(_, p)| p as u64)
            .collect();
        eprintln!(
            "crashed copy: {} dirty NVM cache pages, {} of them written by the {} listed \
             transactions",
            dirty_cache.len(),
            listed.len(),
            info.committed_transactions
        );
        if listed.is_empty() {
            dirty_cache.iter().map(|&(_, p)| p as u64).collect()
        } else {
            listed
        }
    };
    let (mut heap_flips, mut aimed) = (0u64, 0u64);
    let mut rng = Rng(seed);
    let mut failures = Vec::new();
    // After the schedule, EXTRA cases of bit flips in the crashed copy's dirty heap.data pages,
    // then EXTRA in its dirty NVM cache pages.
    const EXTRA: u64 = 8;
    let extra_heap = if dirty.is_empty() { 0 } else { EXTRA };
    let extra = extra_heap + if cache_targets.is_empty() { 0 } else { EXTRA };
    let (mut cache_aimed, cache_pool) = (0u64, Path::new("vnvm").join("cache.pool"));
    for case in 0..cases + extra {
        let forced = case >= cases;
        let in_cache = case >= cases + extra_heap;
        let b = if forced { 1 } else { (case % 2) as usize };
        let fl = files(bases[b]);
        let file = if forced {
            let want = if in_cache {
                cache_pool.as_path()
            } else {
                Path::new("heap.data")
            };
            fl.iter()
                .find(|f| f.as_path() == want)
                .expect("heap.data and vnvm/cache.pool")
        } else {
            &fl[(case as usize / 2) % fl.len()]
        };
        let dir = work.clone();
        copy_dir(bases[b], &dir);
        let path = dir.join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        let used = bytes.iter().rposition(|&x| x != 0).map_or(1, |p| p + 1) as u64;
        let what = if bytes.is_empty() {
            // (An empty file: the only damage is its loss.)
            std::fs::remove_file(&path).unwrap();
            "removed (empty)".to_string()
        } else if !forced && rng.below(10) < 3 {
            let (to, len) = (rng.below(bytes.len() as u64), bytes.len());
            bytes.truncate(to as usize);
            format!("truncated to {to} of {len} bytes")
        } else {
            let mut offs = Vec::new();
            let crashed_heap = b == 1 && file.as_path() == Path::new("heap.data");
            let aim =
                !in_cache && (forced || crashed_heap && !dirty.is_empty() && heap_flips % 3 != 0);
            heap_flips += crashed_heap as u64;
            aimed += aim as u64;
            cache_aimed += in_cache as u64;
            for _ in 0..1 + rng.below(3) {
                let o = if in_cache {
                    // (The pool's data area starts after its 4 KiB header.)
                    let page = cache_targets[rng.below(cache_targets.len() as u64) as usize];
                    (4096 + page * 4096 + rng.below(4096)).min(bytes.len() as u64 - 1) as usize
                } else if aim {
                    let page = dirty[rng.below(dirty.len() as u64) as usize];
                    (page * 4096 + rng.below(4096)).min(bytes.len() as u64 - 1) as usize
                } else {
                    rng.below(used) as usize
                };
                bytes[o] ^= 1 << rng.below(8);
                offs.push(o);
            }
            let at = if aim || in_cache {
                " in dirty pages"
            } else {
                ""
            };
            format!("bit flips at {offs:?}{at} (used extent {used})")
        };
        if path.exists() {
            std::fs::write(&path, &bytes).unwrap();
        }
        drop(bytes);
        let out = run_case(&dir, &refs[b], file);
        let line = format!("case {case}: {} {}: {what}: ", names[b], file.display());
        match out {
            Ok(o) => eprintln!("{line}{o}"),
            Err(e) => {
                eprintln!("{line}FAILED: {e}");
                failures.push(format!("{line}{e}"));
            }
        }
    }
    eprintln!(
        "{aimed} case(s) flipped bits in heap.data pages dirty at the crash, {cache_aimed} in \
         dirty NVM cache pages"
    );
    let _ = std::fs::remove_dir_all(&root);
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases + extra,
        failures.join("\n")
    );
    if !dirty.is_empty() {
        assert!(
            aimed >= EXTRA,
            "too few cases flipped a dirty page of the crashed heap.data"
        );
    }
}
