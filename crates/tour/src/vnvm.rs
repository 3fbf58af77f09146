//! Tour step `vnvm`: transactions over virtual NVM. A region four times larger than the NVM log
//! and cache together is written in transactions (one aborted) and read back from its backing
//! file after release; then a few transactions are committed into the NVM log only, the process
//! "crashes" (the instance is abandoned with its logs unapplied), and recovery replays exactly
//! the committed ones into the file while a transaction that never committed leaves no trace.

use super::{Ctx, Outcome};
use anyhow::{ensure, Context, Result};
use std::path::Path;
use std::time::Instant;
use tiermem_fault::PAGE_SIZE;
use tiermem_vnvm::{nv_init, recover, Mode, VnvmConfig};

/// Run the step in a directory of its own under `ctx`'s, removed before it returns.
pub fn run(ctx: &Ctx) -> Result<Outcome> {
    let vdir = ctx.file("vnvm");
    let _cleanup = super::RemoveOnDrop::dir(&vdir);
    let (txs, rate) = bulk(&vdir)?;
    let (committed, replayed) = crash(&vdir.join("crash"))?;
    Ok(Outcome::Ok(format!(
        "{txs} transactions ({rate:.0} tx/s) over a region 4x the NVM, all in the file after release; \
         a crash with {committed} committed transactions only in the NVM log: recovery replayed {replayed}, data checked, the uncommitted one absent"
    )))
}

/// A region four times larger than the NVM log + cache, written in transactions, one of them
/// aborted; then released, re-opened, and read back from the backing file.
fn bulk(vdir: &Path) -> Result<(usize, f64)> {
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
    say!(
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
    say!("released: all {pages} pages of the backing file hold their committed values; the aborted write never appeared");
    Ok((txs, txs as f64 / el.as_secs_f64()))
}

/// Transactions committed into the NVM log and kept there (the redo worker is held, as the
/// recovery tests do), one more begun and never committed, then the instance is abandoned as a
/// crash leaves it. [`recover`] must replay the committed ones into the backing file; the open
/// one must leave no trace. Returns (committed, replayed).
fn crash(cdir: &Path) -> Result<(usize, usize)> {
    std::fs::create_dir_all(cdir)?;
    let cfg = VnvmConfig {
        dir: cdir.join("instance"),
        log_size: 1 << 20,
        cache_size: 1 << 20,
        redo_paused: true,
        ..VnvmConfig::default()
    };
    let data = cdir.join("data.bin");
    let size = 64 * PAGE_SIZE;
    std::fs::write(&data, vec![0u8; size]).context("creating the backing file")?;
    let committed = 8usize;
    let value = |tx: usize| format!("committed transaction {tx} of the crash demo").into_bytes();
    {
        let vn = nv_init(&cfg)?;
        let region = vn.nv_allocate(&data, size, Mode::Private)?;
        for tx in 0..committed {
            let tid = vn.nv_txbegin();
            let v = value(tx);
            // Each transaction writes two pages: both or neither may appear.
            for p in [tx, tx + 32] {
                let dst = region.as_ptr().wrapping_add(p * PAGE_SIZE);
                let n = vn.nv_write(tid, dst, &v)?;
                ensure!(n == v.len(), "the NVM log is full after {n} bytes");
            }
            vn.nv_commit(tid)?;
        }
        let open = vn.nv_txbegin();
        vn.nv_write(
            open,
            region.as_ptr().wrapping_add(63 * PAGE_SIZE),
            b"never committed",
        )?;
        drop(region);
        vn.abandon();
    }
    say!(
        "{committed} transactions of 2 page writes each committed into the NVM log (not yet applied to the file), a 9th begun, then the process state dropped as a crash would"
    );
    let before = std::fs::read(&data)?;
    ensure!(
        before.iter().all(|&b| b == 0),
        "the backing file changed before recovery: the committed logs were applied already"
    );
    let t = Instant::now();
    let report = recover(&cfg.dir).context("vnvm recovery")?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let again = recover(&cfg.dir).context("vnvm recovery, second run")?;
    ensure!(
        again.was_clean,
        "a second recovery found work to do: it is not idempotent"
    );
    let bytes = std::fs::read(&data)?;
    for tx in 0..committed {
        let v = value(tx);
        for p in [tx, tx + 32] {
            ensure!(
                bytes[p * PAGE_SIZE..p * PAGE_SIZE + v.len()] == v[..],
                "page {p}: committed transaction {tx} is missing after recovery"
            );
        }
    }
    ensure!(
        bytes[63 * PAGE_SIZE..64 * PAGE_SIZE]
            .iter()
            .all(|&b| b == 0),
        "the never-committed transaction shows in the file after recovery"
    );
    say!(
        "recovery ({ms:.1} ms) replayed {} transactions ({} bytes), wrote back {} dirty cache pages; every committed page is in the file, the open transaction is absent; a second recovery had nothing to do",
        report.transactions_replayed, report.bytes_replayed, report.dirty_pages_written
    );
    ensure!(
        report.transactions_replayed == committed,
        "recovery replayed {} transactions, {committed} were committed",
        report.transactions_replayed
    );
    Ok((committed, report.transactions_replayed))
}
