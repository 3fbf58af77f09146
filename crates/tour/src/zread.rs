//! Tour step `zread`: zero-copy reads from the page cache (z-READ) on a disk file. Views of a
//! 16 MiB file under `/var/tmp` are returned without a copy and must hold the file's bytes; a
//! buffer is filled by remapping its pages onto the page cache; then another process (`dd`)
//! overwrites the file while a view and the buffer are held: the lease makes both private
//! before the write proceeds, so they keep their bytes, and a read begun after the write sees
//! it whole.

use super::{Ctx, Outcome};
use anyhow::{ensure, Context, Result};
use std::os::unix::fs::FileExt;
use tiermem_iocache::{ZFile, ZOptions};

const PAGE: usize = 4096;
const PAGES: u64 = 4096;

/// Run the step; its file is removed at the end.
pub fn run(_ctx: &Ctx) -> Result<Outcome> {
    let dir = std::path::PathBuf::from(format!("/var/tmp/tiermem-tour-z-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _gone = super::RemoveOnDrop::dir(&dir);
    let path = dir.join("data");
    {
        let f = std::fs::File::create(&path)?;
        let mut page = vec![0u8; PAGE];
        for p in 0..PAGES {
            page[..8].copy_from_slice(&p.to_le_bytes());
            page[8..].fill((p % 251) as u8);
            f.write_all_at(&page, p * PAGE as u64)?;
        }
        f.sync_all()?;
    }
    let z = ZFile::open(
        &path,
        ZOptions {
            // Remap whenever aligned, to show it (the loss model would copy where remapping
            // costs more; `tiermem bench iocache` measures both).
            model: false,
            ..ZOptions::default()
        },
    )?;
    if let Some(why) = z.zero_copy_reason() {
        return Ok(Outcome::Skipped(format!("no zero copy here: {why}")));
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let p = x % (PAGES - 4);
        let v = z.zread(p * PAGE as u64, 4 * PAGE)?;
        ensure!(v.is_zero_copy(), "a view was copied");
        for k in 0..4u64 {
            let pg = &v[(k as usize) * PAGE..(k as usize + 1) * PAGE];
            ensure!(
                pg[..8] == (p + k).to_le_bytes()
                    && pg[8..].iter().all(|&b| b == ((p + k) % 251) as u8),
                "view of page {} does not hold the file's bytes",
                p + k
            );
        }
    }
    let s = z.stats();
    say!(
        "20000 zero-copy views of 16 KiB: {} populate calls mapped {} pages; no copy",
        s.populate_calls,
        s.populated_pages
    );
    let held = z.zread(0, 64 * PAGE)?;
    let before = held.to_vec();
    let buf = tiermem_iocache::sys::AnonMap::new(64 * PAGE)?;
    // SAFETY: the mapping is 64 pages, owned by this step.
    let b = unsafe { std::slice::from_raw_parts_mut(buf.as_ptr(), 64 * PAGE) };
    z.zread_into(0, b)?;
    ensure!(
        b == &before[..],
        "the remapped buffer does not hold the file's bytes"
    );
    say!(
        "zread_into: {} buffer pages remapped onto the page cache (copy-on-write)",
        z.stats().into_remapped_pages
    );
    let st = std::process::Command::new("dd")
        .args([
            "if=/dev/zero",
            "bs=4096",
            "count=64",
            "conv=notrunc",
            "status=none",
        ])
        .arg(format!("of={}", path.display()))
        .status()
        .context("running dd")?;
    ensure!(st.success(), "dd failed");
    ensure!(
        held[..] == before[..],
        "the held view changed under a writer"
    );
    ensure!(
        b == &before[..],
        "the remapped buffer changed under a writer"
    );
    let s = z.stats();
    ensure!(s.lease_breaks >= 1, "dd did not break the lease");
    let after = z.zread(0, 64 * PAGE)?;
    ensure!(
        after.iter().all(|&x| x == 0),
        "a read after the write does not see it"
    );
    say!(
        "dd overwrote the file: the lease broke, {} view pages and {} buffer mapping(s) were made private first; both kept their bytes, a new read sees the zeros",
        s.privatised_pages,
        s.privatised_buffers
    );
    Ok(Outcome::Ok(format!(
        "20000 views without a copy; a held view and a remapped buffer kept their bytes through another process's write ({} lease break)",
        s.lease_breaks
    )))
}
