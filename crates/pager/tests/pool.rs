//! Several processes sharing one pager pool: every byte of each reads back through the shared
//! buffer and swap file, the controller runs across them, a process killed with pages out
//! gives every slot back (20 times), and a pool that is missing, not a pool, of another
//! version or whose swap file is gone is refused with the reason.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use tiermem_pager::*;

const PS: usize = 4096;

struct Dirs {
    shm: tempfile::TempDir,
    disk: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        Dirs {
            shm: tempfile::Builder::new()
                .prefix("tiermem-pool-test")
                .tempdir_in("/dev/shm")
                .unwrap(),
            disk: tempfile::Builder::new()
                .prefix("tiermem-pool-test")
                .tempdir_in("/var/tmp")
                .unwrap(),
        }
    }

    fn pool_path(&self) -> PathBuf {
        self.shm.path().join("pager.pool")
    }

    fn create(&self, nvm_pages: usize, window_ms: u64) -> PagerPool {
        let control = ControlParams {
            window: std::time::Duration::from_millis(window_ms),
            ..Default::default()
        };
        let spec = PoolSpec {
            nvm: (nvm_pages * PS) as u64,
            nvm_delay: tiermem_media::DelayModel::NONE,
            swap_path: self.disk.path().join("swap"),
            swap_size: 32 << 20,
            control,
        };
        PagerPool::create(&self.pool_path(), &spec).unwrap()
    }
}

fn word(p: usize, round: u64, who: u64) -> u64 {
    (p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ round.wrapping_mul(0xD6E8_FEB8_6659_FD93)
        ^ who.wrapping_mul(0xA076_1D64_78BD_642F)
}

fn write_page(r: &PagedRegion, p: usize, v: u64) {
    for k in [0usize, 2048, 4088] {
        // SAFETY: inside the region.
        unsafe { std::ptr::write_volatile(r.as_ptr().add(p * PS + k) as *mut u64, v) };
    }
}

fn read_page(r: &PagedRegion, p: usize) -> [u64; 3] {
    let mut out = [0u64; 3];
    for (i, k) in [0usize, 2048, 4088].into_iter().enumerate() {
        // SAFETY: inside the region.
        out[i] = unsafe { std::ptr::read_volatile(r.as_ptr().add(p * PS + k) as *const u64) };
    }
    out
}

/// A tenant process of the tests below (does nothing unless its variables are set): maps 4×
/// its budget in the pool, writes every page three times in three orders reading each back
/// first, then reports or waits to be killed.
#[test]
fn tenant_child() {
    let Some(pool) = std::env::var_os("TIERMEM_POOL_CHILD") else {
        return;
    };
    let who: u64 = std::env::var("TIERMEM_POOL_WHO").unwrap().parse().unwrap();
    let wait = std::env::var_os("TIERMEM_POOL_WAIT").is_some();
    let idle = std::env::var_os("TIERMEM_POOL_IDLE").is_some();
    let budget = 128;
    let mut o = PagerOptions::new((budget * PS) as u64, 0);
    o.pool = Some(PathBuf::from(pool));
    let pg = Pager::new(&o).unwrap();
    let pages = 4 * budget;
    let r = pg.map(pages * PS).unwrap();
    if let Ok(b) = std::env::var("TIERMEM_POOL_BOUND_US") {
        r.set_bound(0.99, b.parse::<u64>().unwrap() * 1000).unwrap();
    }
    let mut bad = 0;
    for round in 1..=3u64 {
        for i in 0..pages {
            // Round 1 in order, 2 reversed, 3 strided.
            let p = match round {
                1 => i,
                2 => pages - 1 - i,
                _ => (i * 37) % pages,
            };
            if round > 1 && read_page(&r, p) != [word(p, round - 1, who); 3] {
                bad += 1;
            }
            write_page(&r, p, word(p, round, who));
        }
    }
    for p in 0..pages {
        if read_page(&r, p) != [word(p, 3, who); 3] {
            bad += 1;
        }
    }
    pg.settle();
    let st = pg.stats();
    println!(
        "RESULT bad={bad} buffer_in={} ssd_in={} buffer_used={} swap_used={}",
        st.pageins_buffer, st.pageins_ssd, st.buffer_used, st.swap_used
    );
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    if idle {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }
    if wait {
        loop {
            for p in (0..pages).step_by(5) {
                read_page(&r, p);
            }
        }
    }
}

fn spawn(pool: &Path, who: u64, wait: bool, bound_us: Option<u64>) -> Child {
    spawn_with(pool, who, wait, bound_us, false)
}

fn spawn_with(pool: &Path, who: u64, wait: bool, bound_us: Option<u64>, idle: bool) -> Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    if idle {
        c.env("TIERMEM_POOL_IDLE", "1");
    }
    c.args(["--exact", "tenant_child", "--nocapture", "--test-threads=1"])
        .env("TIERMEM_POOL_CHILD", pool)
        .env("TIERMEM_POOL_WHO", who.to_string())
        .stdout(Stdio::piped());
    if wait {
        c.env("TIERMEM_POOL_WAIT", "1");
    }
    if let Some(b) = bound_us {
        c.env("TIERMEM_POOL_BOUND_US", b.to_string());
    }
    c.spawn().unwrap()
}

/// The child's RESULT line (blocks until it prints it).
fn result(child: &mut Child) -> String {
    let out = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut lines = std::io::BufReader::new(out).lines();
    for l in lines.by_ref().map_while(|l| l.ok()) {
        if let Some(i) = l.find("RESULT") {
            // Keep reading, so the child's later output does not meet a closed pipe.
            std::thread::spawn(move || lines.for_each(drop));
            return l[i..].to_string();
        }
        seen.push(l);
    }
    let st = child.wait();
    panic!("the child printed no RESULT: {st:?}, stdout {seen:?}")
}

fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

#[test]
fn three_processes_share_the_buffer_and_the_swap_file_and_lose_nothing() {
    let d = Dirs::new();
    let pool = d.create(256, 50);
    let mut kids: Vec<Child> = (0..3)
        .map(|w| spawn(&d.pool_path(), w, false, (w == 0).then_some(50)))
        .collect();
    let lines: Vec<String> = kids.iter_mut().map(result).collect();
    for (k, l) in kids.iter_mut().zip(&lines) {
        assert!(k.wait().unwrap().success(), "{l}");
        assert_eq!(field(l, "bad"), 0, "{l}");
        // Each process paged in from the shared swap file...
        assert!(field(l, "ssd_in") > 0, "{l}");
    }
    // ... and the shared buffer served page-ins (which process got its slots varies).
    assert!(
        lines.iter().map(|l| field(l, "buffer_in")).sum::<u64>() > 0,
        "{lines:?}"
    );
    // All gone: every slot is free again and no tenant is left.
    let st = pool.status();
    assert_eq!(
        (st.buffer_used, st.swap_used, st.tenants.len()),
        (0, 0, 0),
        "{st:?}"
    );
    // Someone led the controller.
    assert!(st.windows > 0, "{st:?}");
}

#[test]
fn a_process_killed_with_pages_out_gives_every_slot_back_20_times() {
    let d = Dirs::new();
    let pool = d.create(256, 1000);
    let (b0, s0) = {
        let st = pool.status();
        (
            st.buffer_slots - st.buffer_used,
            st.swap_slots - st.swap_used,
        )
    };
    // A live, idle neighbour keeps its pages throughout.
    let mut other = spawn_with(&d.pool_path(), 99, false, None, true);
    let lo = result(&mut other);
    assert_eq!(field(&lo, "bad"), 0);
    let held = |pool: &PagerPool| {
        let st = pool.status();
        (st.buffer_used, st.swap_used)
    };
    let other_held = held(&pool);
    for round in 0..20 {
        let mut c = spawn(&d.pool_path(), round, true, None);
        let l = result(&mut c);
        assert_eq!(field(&l, "bad"), 0, "round {round}: {l}");
        let st = pool.status();
        let t = st
            .tenants
            .iter()
            .find(|t| t.pid == c.id())
            .expect("the child is a tenant");
        assert!(t.buffer_pages + t.swap_pages > 0, "round {round}: {t:?}");
        c.kill().unwrap();
        c.wait().unwrap();
        let r = pool.gc();
        assert_eq!(r.tenants, 1, "round {round}: {r:?}");
        assert!(r.buffer_slots + r.swap_slots > 0, "round {round}: {r:?}");
        assert_eq!(
            held(&pool),
            other_held,
            "round {round}: the neighbour's slots only"
        );
    }
    other.kill().unwrap();
    other.wait().unwrap();
    pool.gc();
    let st = pool.status();
    assert_eq!(
        (
            st.buffer_slots - st.buffer_used,
            st.swap_slots - st.swap_used
        ),
        (b0, s0),
        "free slots back to the start count"
    );
    assert!(st.tenants.is_empty(), "{st:?}");
}

#[test]
fn set_bound_reaches_the_process_and_status_shows_it() {
    let d = Dirs::new();
    let pool = d.create(128, 30);
    let mut c = spawn(&d.pool_path(), 1, true, None);
    result(&mut c);
    let pid = c.id();
    assert!(pool
        .status()
        .tenants
        .iter()
        .any(|t| t.pid == pid && t.bound.is_none()));
    pool.set_bound(pid, Some((0.99, 250_000))).unwrap();
    let st = pool.status();
    let t = st.tenants.iter().find(|t| t.pid == pid).unwrap();
    assert_eq!(t.bound, Some((0.99, 250_000)));
    assert_eq!(pool.bounds_ns(), vec![250_000]);
    assert!(
        pool.set_bound(1, Some((0.99, 1000))).is_err(),
        "pid 1 is no tenant"
    );
    assert!(pool.set_bound(pid, Some((1.5, 1000))).is_err());
    c.kill().unwrap();
    c.wait().unwrap();
    assert!(
        pool.bounds_ns().is_empty(),
        "a dead tenant's bound is not admitted"
    );
}

#[test]
fn bad_pools_are_refused_with_the_reason() {
    let d = Dirs::new();
    let missing = PagerPool::open(&d.shm.path().join("nothing"))
        .err()
        .unwrap();
    assert!(
        missing.to_string().contains("tiermem pager daemon"),
        "{missing}"
    );
    // A media pool that is not a pager pool.
    let other = d.shm.path().join("other.pool");
    drop(tiermem_media::Pool::create(&other, &tiermem_media::PoolOptions::new(1 << 20)).unwrap());
    let e = PagerPool::open(&other).err().unwrap();
    assert!(e.to_string().contains("not a pager pool"), "{e}");
    // Another layout version: the version word follows the magic in the data area.
    let pool = d.create(64, 1000);
    drop(pool);
    let p = d.pool_path();
    let data = find_magic(&p);
    patch(&p, data + 8, &99u32.to_le_bytes());
    let e = PagerPool::open(&p).err().unwrap();
    assert!(e.to_string().contains("version 99"), "{e}");
    // A torn creation (no magic).
    patch(&p, data, &[0u8; 8]);
    let e = PagerPool::open(&p).err().unwrap();
    assert!(e.to_string().contains("not a pager pool"), "{e}");
    // The swap file gone.
    let d2 = Dirs::new();
    drop(d2.create(64, 1000));
    std::fs::remove_file(d2.disk.path().join("swap")).unwrap();
    let e = PagerPool::open(&d2.pool_path()).err().unwrap();
    assert!(e.to_string().contains("swap file"), "{e}");
    // A swap file on tmpfs, and one that exists.
    let spec = |swap: PathBuf| PoolSpec {
        nvm: 1 << 20,
        nvm_delay: tiermem_media::DelayModel::NONE,
        swap_path: swap,
        swap_size: 1 << 20,
        control: ControlParams::default(),
    };
    let e = PagerPool::create(&d.shm.path().join("x.pool"), &spec(d.shm.path().join("s")))
        .err()
        .unwrap();
    assert!(e.to_string().contains("tmpfs"), "{e}");
    let e = PagerPool::create(&d.shm.path().join("y.pool"), &spec(d2.pool_path()))
        .err()
        .unwrap();
    assert!(e.to_string().contains("exists"), "{e}");
}

fn find_magic(p: &Path) -> u64 {
    let b = std::fs::read(p).unwrap();
    let pos = b
        .windows(8)
        .position(|w| w == b"TMPAGERP")
        .expect("the magic");
    pos as u64
}

fn patch(p: &Path, off: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.write_all_at(bytes, off).unwrap();
}
