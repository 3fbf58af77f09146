//! `tiermem tour`: the quick-start job. It runs `doctor` (quick), then walks through the media and
//! fault layers on the embedded default devices (emulated pools under $TIERMEM_DIR), checking every
//! result it prints, and removes what it created.

use crate::doctor;
use anyhow::{bail, ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tiermem_fault::{
    Engine, Fault, FaultOps, RegionSpec, ResolveError, Resolver, TrackerOptions, WriteTracker,
    PAGE_SIZE,
};
use tiermem_media::{
    CrashPolicy, DelayModel, OpenOptions, Pool, PoolKind, PoolOptions, PowerDomain,
};

fn section(title: &str) {
    println!("\n\x1b[1m== {title} ==\x1b[0m");
}

/// Removes the tour's files however the tour ends.
struct Cleanup(Vec<PathBuf>);
impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Run the tour in `dir` (default: $TIERMEM_DIR or /dev/shm/tiermem).
pub fn run(dir: Option<PathBuf>) -> Result<()> {
    let dir = match dir {
        Some(d) => {
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            d
        }
        None => tiermem_media::ensure_default_dir()?,
    };
    let tag = std::process::id();
    let nvm = dir.join(format!("tour-{tag}.nvm"));
    let bad = dir.join(format!("tour-{tag}-corrupt.nvm"));
    let crash = dir.join(format!("tour-{tag}-crash.nvm"));
    let image = dir.join(format!("tour-{tag}-crash-image.nvm"));
    let _cleanup = Cleanup(vec![nvm.clone(), bad.clone(), crash.clone(), image.clone()]);

    section("1. this machine (tiermem doctor --quick)");
    let report = doctor::report(true);
    doctor::print(&report, false)?;

    section("2. media: an emulated NVM pool");
    let pool = Arc::new(media_tour(&nvm, &bad)?);
    crash_tour(&crash, &image)?;

    section("3. fault: a region filled lazily from the pool, in the faulting thread");
    fault_tour(&pool)?;

    section("4. fault: written-page tracking (WP_ASYNC + PAGEMAP_SCAN)");
    tracking_tour()?;

    section("5. vnvm: transactions over virtual NVM larger than the NVM");
    let vdir = dir.join(format!("tour-{tag}-vnvm"));
    let result = vnvm_tour(&vdir);
    let _ = std::fs::remove_dir_all(&vdir);
    result?;

    println!("\ntour finished: every result above was checked. Next: `tiermem bench media`, `tiermem bench fault`, `tiermem bench vnvm`.");
    Ok(())
}

fn media_tour(nvm: &Path, bad: &Path) -> Result<Pool> {
    let size = 64u64 << 20;
    let pool = Pool::create(nvm, &PoolOptions::new(size).kind(PoolKind::Nvm).tag("tour"))?;
    println!(
        "created {} ({} MiB, mode 0600), persistence method {:?}",
        nvm.display(),
        size >> 20,
        pool.persist_method()
    );
    // Fill the data area with a recognisable pattern: page i holds bytes derived from i.
    let data_len = pool.data_len();
    let mut page = vec![0u8; PAGE_SIZE];
    for i in 0..data_len / PAGE_SIZE {
        fill_page(&mut page, i);
        pool.write((i * PAGE_SIZE) as u64, &page)?;
    }
    pool.persist(0, data_len)?;
    let s = pool.stats().snapshot();
    println!(
        "wrote {} MiB with non-temporal stores and persisted it ({} persists, {} fences)",
        s.bytes_written >> 20,
        s.persists,
        s.fences
    );

    let reopened = Pool::open(nvm, &OpenOptions::default())?;
    let mut back = vec![0u8; PAGE_SIZE];
    for i in [0usize, 1, data_len / PAGE_SIZE - 1] {
        reopened.read((i * PAGE_SIZE) as u64, &mut back)?;
        fill_page(&mut page, i);
        ensure!(back == page, "page {i} read back wrong after reopen");
    }
    println!("reopened: header validated (magic, version, size, CRC32) and data read back intact");

    // The delay model: the same 2 MiB write, without and with the FAM preset.
    let chunk = vec![7u8; 2 << 20];
    reopened.write(0, &chunk)?; // map the pages in, so both runs below time the same work
    tiermem_media::tsc_ghz(); // calibrate the busy-wait clock outside the timed part
    let mut timings = Vec::new();
    for name in ["none", "pcm-fam"] {
        let model: DelayModel = name.parse()?;
        reopened.set_delay(model);
        let t = Instant::now();
        reopened.write(0, &chunk)?;
        timings.push((
            name,
            t.elapsed().as_secs_f64() * 1e6,
            model.write_delay_ns(chunk.len() as u64),
        ));
    }
    reopened.set_delay(DelayModel::default());
    for (name, us, model_ns) in &timings {
        println!(
            "2 MiB write with delay {name:<8} {us:>8.1} µs (the model adds {:.1} µs)",
            *model_ns as f64 / 1e3
        );
    }
    // Restore the pattern the fault tour reads.
    for i in 0..chunk.len() / PAGE_SIZE {
        fill_page(&mut page, i);
        reopened.write_persist((i * PAGE_SIZE) as u64, &page)?;
    }

    // Bad input: a copy of the pool with one header byte flipped.
    std::fs::copy(nvm, bad)?;
    let mut bytes = std::fs::read(bad)?;
    bytes[40] ^= 0x10;
    std::fs::write(bad, &bytes)?;
    match Pool::open(bad, &OpenOptions::default()) {
        Ok(_) => bail!("a pool with a flipped header byte was accepted"),
        Err(e) => println!("a copy with one flipped header bit is refused:\n    {e}"),
    }
    Ok(pool)
}

/// A two-step commit (data, then a count that makes it visible), with the power cut after every
/// fence: each crash image must show either the old or the new state, never a torn one.
fn crash_tour(path: &Path, image: &Path) -> Result<()> {
    let run = |cut: Option<u64>| -> Result<PowerDomain> {
        let _ = std::fs::remove_file(path);
        let domain = PowerDomain::new();
        if let Some(n) = cut {
            domain.cut_power_after(n)?;
        }
        let p = Pool::create(
            path,
            &PoolOptions::new(1 << 20).domain(&domain).tag("crash-demo"),
        )?;
        for rec in 1..=3u64 {
            let off = 64 + rec * 64;
            p.write(off, &rec.to_le_bytes().repeat(8))?; // the record
            p.persist(off, 64)?;
            p.write(0, &rec.to_le_bytes())?; // the commit: count = rec
            p.persist(0, 8)?;
        }
        Ok(domain)
    };
    let fences = run(None)?.fence_count();
    println!("persistence-domain model: the 3-record commit issues {fences} fences; cutting power after each:");
    let mut seen = Vec::new();
    for n in 0..=fences {
        let domain = run(Some(n))?;
        let _ = std::fs::remove_file(image);
        match domain.write_image(path, CrashPolicy::Strict, image) {
            Ok(()) => {}
            Err(e) => {
                seen.push(format!("{n}:no pool"));
                let _ = e;
                continue;
            }
        }
        let p = match Pool::open(image, &OpenOptions::default()) {
            Ok(p) => p,
            Err(_) => {
                seen.push(format!("{n}:no pool"));
                continue;
            }
        };
        let mut c = [0u8; 8];
        p.read(0, &mut c)?;
        let count = u64::from_le_bytes(c);
        for rec in 1..=count {
            let mut r = [0u8; 8];
            p.read(64 + rec * 64, &mut r)?;
            ensure!(
                u64::from_le_bytes(r) == rec,
                "fence {n}: committed record {rec} is torn"
            );
        }
        seen.push(format!("{n}:{count}"));
    }
    println!("    fence:records-visible  {}", seen.join("  "));
    println!("    every image held only whole, committed records");
    Ok(())
}

/// Serves missing pages of an anonymous region from the pool (async-signal-safe: one copy).
struct PoolBacked {
    pool: Arc<Pool>,
}

impl Resolver for PoolBacked {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        // SAFETY: the region is no larger than the pool's data area (checked at registration
        // below), so [offset, offset + PAGE_SIZE) is inside the mapping, which outlives the region.
        let src =
            unsafe { std::slice::from_raw_parts(self.pool.data_ptr().add(f.offset), PAGE_SIZE) };
        self.pool.charge_read(PAGE_SIZE as u64);
        ops.copy(f.offset, src, false).map(|_| ())
    }
}

fn fault_tour(pool: &Arc<Pool>) -> Result<()> {
    let len = (pool.data_len() / PAGE_SIZE) * PAGE_SIZE;
    let region = AnonMap::new(len)?;
    let handle = Engine::global().register(
        RegionSpec::new(region.ptr, len).in_thread(),
        Arc::new(PoolBacked { pool: pool.clone() }),
    )?;
    println!(
        "registered {} MiB of anonymous memory (MISSING, {:?}); nothing is copied yet",
        len >> 20,
        handle.resolution()
    );
    let t = Instant::now();
    let mut expect = vec![0u8; PAGE_SIZE];
    let pages = len / PAGE_SIZE;
    for i in 0..pages {
        // SAFETY: i * PAGE_SIZE < len, inside the mapping; reading it triggers the fault.
        let got = unsafe { std::slice::from_raw_parts(region.ptr.add(i * PAGE_SIZE), PAGE_SIZE) };
        if i < 512 || i % 97 == 0 {
            fill_page(&mut expect, i);
            ensure!(
                got == &expect[..],
                "page {i} of the lazily filled region is wrong"
            );
        } else {
            std::hint::black_box(got[0]);
        }
    }
    let el = t.elapsed();
    println!(
        "touched all {pages} pages: {} faults resolved in-thread, {:.2} µs per page including the 4 KiB copy; contents verified",
        handle.faults(),
        el.as_secs_f64() * 1e6 / pages as f64
    );
    ensure!(
        handle.faults() as usize >= pages,
        "fewer faults than pages: the region was not lazy"
    );
    handle.unregister()?;
    Ok(())
}

fn tracking_tour() -> Result<()> {
    let len = 256usize << 20;
    let region = AnonMap::new(len)?;
    // Populate it first, as a working set would be.
    for i in (0..len).step_by(PAGE_SIZE) {
        // SAFETY: i < len, inside our mapping.
        unsafe { region.ptr.add(i).write_volatile(1) };
    }
    let mut tracker = WriteTracker::new(region.ptr, len, TrackerOptions::default())?;
    let mut out = Vec::new();
    tracker.scan(&mut out)?;
    let pages = len / PAGE_SIZE;
    let written: Vec<usize> = (0..pages).filter(|p| p % 100 == 37).collect();
    for &p in &written {
        // SAFETY: p < pages, inside our mapping.
        unsafe { region.ptr.add(p * PAGE_SIZE + 8).write_volatile(2) };
    }
    let t = Instant::now();
    let n = tracker.scan(&mut out)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let mut got: Vec<usize> = out
        .iter()
        .flat_map(|r| (r.offset / PAGE_SIZE)..((r.offset + r.len) / PAGE_SIZE))
        .collect();
    got.sort_unstable();
    ensure!(
        got == written,
        "scan returned {} pages, {} were written",
        got.len(),
        written.len()
    );
    println!(
        "{} MiB populated, {} pages (1 %) written: one scan ({:?}) returned exactly those {n} pages in {ms:.3} ms and re-protected them",
        len >> 20,
        written.len(),
        tracker.method()
    );
    let n2 = tracker.scan(&mut out)?;
    ensure!(n2 == 0, "a second scan with no writes returned {n2} pages");
    println!("a second scan with no writes in between returned 0 pages");
    Ok(())
}

/// A region four times larger than the NVM log + cache, written in transactions, one of them
/// aborted; then released, re-opened, and read back from the backing file.
fn vnvm_tour(vdir: &Path) -> Result<()> {
    use tiermem_vnvm::{nv_init, Mode, VnvmConfig};
    std::fs::create_dir_all(vdir)?;
    let cfg = VnvmConfig {
        dir: vdir.join("instance"),
        log_size: 2 << 20,
        cache_size: 2 << 20,
        ..VnvmConfig::default()
    };
    let data = vdir.join("data.bin");
    let size = 16usize << 20;
    let vn = nv_init(&cfg)?;
    let region = vn.nv_allocate(&data, size, Mode::Private)?;
    let pages = size / PAGE_SIZE;
    let t = Instant::now();
    let mut txs = 0;
    for chunk in (0..pages).collect::<Vec<_>>().chunks(32) {
        let tid = vn.nv_txbegin();
        for &p in chunk {
            let value = (p as u64 * 7 + 1).to_le_bytes();
            let dst = region.as_ptr().wrapping_add(p * PAGE_SIZE);
            let mut done = 0;
            while done < value.len() {
                match vn.nv_write(tid, dst.wrapping_add(done), &value[done..]) {
                    Ok(n) => done += n,
                    Err(tiermem_vnvm::VnvmError::LogFull { logged }) => {
                        done += logged;
                        ensure!(
                            vn.nv_wait_log_space(std::time::Duration::from_secs(10)),
                            "the vnvm log stayed full"
                        );
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        vn.nv_commit(tid)?;
        txs += 1;
    }
    vn.drain()?;
    let el = t.elapsed();
    // One more transaction, aborted: none of it may ever show.
    let tid = vn.nv_txbegin();
    vn.nv_write(tid, region.as_ptr(), &u64::MAX.to_le_bytes())?;
    vn.nv_abort(tid)?;
    let st = vn.stats();
    println!(
        "{} MiB region over {} MiB of NVM log + {} MiB of NVM cache: {txs} transactions of 32 page writes in {:.1} ms ({:.0} tx/s, drained); {} pages already written back to the file (the write set is 8x the NVM cache, so writeback bounds the rate here)",
        size >> 20,
        cfg.log_size >> 20,
        cfg.cache_size >> 20,
        el.as_secs_f64() * 1e3,
        txs as f64 / el.as_secs_f64(),
        st.pages_written_back
    );
    let mut word = [0u8; 8];
    for p in [0usize, 1, pages / 2, pages - 1] {
        region.read(p * PAGE_SIZE, &mut word);
        ensure!(
            u64::from_le_bytes(word) == p as u64 * 7 + 1,
            "page {p}: wrong committed value in DRAM"
        );
    }
    drop(region);
    vn.nv_release()?;
    // The backing file alone now holds every committed byte, and nothing of the aborted one.
    let bytes = std::fs::read(&data)?;
    for p in 0..pages {
        let got = u64::from_le_bytes(bytes[p * PAGE_SIZE..p * PAGE_SIZE + 8].try_into().unwrap());
        ensure!(
            got == p as u64 * 7 + 1,
            "page {p} of {} holds {got:#x} after release",
            data.display()
        );
    }
    println!("released: all {pages} pages of the backing file hold their committed values; the aborted write never appeared");
    Ok(())
}

/// Page `i` of the demo pattern.
fn fill_page(buf: &mut [u8], i: usize) {
    for (j, b) in buf.iter_mut().enumerate() {
        *b = (i.wrapping_mul(131) ^ j.wrapping_mul(7)) as u8;
    }
}

/// An anonymous private mapping, unmapped on drop.
struct AnonMap {
    ptr: *mut u8,
    len: usize,
}

impl AnonMap {
    fn new(len: usize) -> Result<AnonMap> {
        // SAFETY: a fresh anonymous mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!(
                "mmap of {len} bytes failed: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(AnonMap { ptr: p.cast(), len })
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        // SAFETY: we own this mapping.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
