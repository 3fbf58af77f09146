//! Tour step `iocache`: the DBIO buffer pool on a disk file. A 32 MiB data file under
//! `/var/tmp` (direct I/O needs a block file system) is read and written at random through a
//! 2 MiB pool twice, once with `O_DIRECT` (direct mode) and once with the page cache as the
//! pool's victim cache (dbio mode, 8 MiB budget): every page read must hold what was last
//! written to it, and dbio must serve misses from the page cache that direct mode reads from
//! the device.

use super::{Ctx, Outcome};
use anyhow::{ensure, Context, Result};
use std::os::unix::fs::FileExt;
use tiermem_iocache::{Access, ColdRead, Mode, Options, Pool};

const PAGE: usize = 4096;
const PAGES: u64 = 8192;

/// Run the step; its file is removed at the end.
pub fn run(_ctx: &Ctx) -> Result<Outcome> {
    let dir = std::path::PathBuf::from(format!("/var/tmp/tiermem-tour-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _gone = super::RemoveOnDrop::dir(&dir);
    let path = dir.join("data");
    {
        let f = std::fs::File::create(&path)?;
        let mut page = vec![0u8; PAGE];
        for p in 0..PAGES {
            page[..8].copy_from_slice(&p.to_le_bytes());
            f.write_all_at(&page, p * PAGE as u64)?;
        }
        f.sync_all()?;
    }
    let mut figures = Vec::new();
    // What each page last had written to it, across both runs (the second reads the first's).
    let mut last = vec![0u8; PAGES as usize];
    for mode in [Mode::Direct, Mode::Dbio] {
        let pool = match Pool::open(
            &path,
            Options {
                mode,
                pool_bytes: 2 << 20,
                budget: 8 << 20,
                lock: false,
                // DBIO's own path (Auto would read cold pages through the cache here: the pool
                // is a quarter of the budget).
                cold_read: ColdRead::Direct,
                ..Options::default()
            },
        ) {
            Ok(p) => p,
            Err(e @ tiermem_iocache::Error::NoDirectIo { .. }) => {
                return Ok(Outcome::Skipped(e.to_string()))
            }
            Err(e) => return Err(e.into()),
        };
        pool.file().drop_cached(0, 0)?;
        // Skewed random accesses: 90 % of them to the first 1536 pages (6 MiB), which fit the
        // budget but not the pool.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in 0..40_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let p = if x % 10 < 9 {
                (x >> 8) % 1536
            } else {
                (x >> 8) % PAGES
            };
            if i % 4 == 0 {
                let mut g = pool.get_page(p, Access::Write)?;
                let v = (i % 251) as u8 + 1;
                if let Some(d) = g.as_mut_slice() {
                    d[100] = v;
                }
                last[p as usize] = v;
            } else {
                let g = pool.get_page(p, Access::Read)?;
                ensure!(
                    g[..8] == p.to_le_bytes() && g[100] == last[p as usize],
                    "{mode:?}: page {p} does not hold what was last written to it"
                );
            }
        }
        pool.sync()?;
        let s = pool.stats();
        say!(
            "{mode:?}: 40000 accesses, {} pool misses: {} read from the device (O_DIRECT), {} from the page cache",
            s.pool_misses,
            s.direct_reads,
            s.cache_hits
        );
        figures.push(s);
    }
    let (direct, dbio) = (figures[0], figures[1]);
    ensure!(
        dbio.cache_hits > 0 && dbio.direct_reads * 2 < direct.direct_reads,
        "dbio read {} pages from the device against direct mode's {}",
        dbio.direct_reads,
        direct.direct_reads
    );
    Ok(Outcome::Ok(format!(
        "every read held the last write; with the page cache as victim cache the pool read {} pages from the device where O_DIRECT alone read {}",
        dbio.direct_reads, direct.direct_reads
    )))
}
