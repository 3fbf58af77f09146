//! Tour step `media`: an emulated NVM pool (create, persist, reopen and validate, the delay
//! model, a corrupted header refused) and the persistence-domain crash model (power cut after
//! every fence of a small commit protocol: never a torn record).

use super::fault::fill_page;
use super::{Ctx, Outcome};
use anyhow::{bail, ensure, Result};
use std::path::Path;
use std::time::Instant;
use tiermem_fault::PAGE_SIZE;
use tiermem_media::{
    CrashPolicy, DelayModel, OpenOptions, Pool, PoolKind, PoolOptions, PowerDomain,
};

/// Run the step in `ctx`'s directory; every file it creates is removed before it returns.
pub fn run(ctx: &Ctx) -> Result<Outcome> {
    let nvm = ctx.file("media.nvm");
    let bad = ctx.file("media-corrupt.nvm");
    let crash = ctx.file("media-crash.nvm");
    let image = ctx.file("media-crash-image.nvm");
    let _cleanup = super::RemoveOnDrop::files(&[&nvm, &bad, &crash, &image]);
    let pool = media_tour(&nvm, &bad)?;
    drop(pool);
    let (fences, images) = crash_tour(&crash, &image)?;
    Ok(Outcome::Ok(format!(
        "a 64 MiB NVM pool written, persisted, reopened and read back; a flipped header bit refused; \
         power cut after each of {fences} fences gave {images} images, none with a torn record"
    )))
}

fn media_tour(nvm: &Path, bad: &Path) -> Result<Pool> {
    let size = 64u64 << 20;
    let pool = Pool::create(nvm, &PoolOptions::new(size).kind(PoolKind::Nvm).tag("tour"))?;
    say!(
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
    say!(
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
    say!("reopened: header validated (magic, version, size, CRC32) and data read back intact");

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
        say!(
            "2 MiB write with delay {name:<8} {us:>8.1} µs (the model adds {:.1} µs)",
            *model_ns as f64 / 1e3
        );
    }
    // Bad input: a copy of the pool with one header byte flipped.
    std::fs::copy(nvm, bad)?;
    let mut bytes = std::fs::read(bad)?;
    bytes[40] ^= 0x10;
    std::fs::write(bad, &bytes)?;
    match Pool::open(bad, &OpenOptions::default()) {
        Ok(_) => bail!("a pool with a flipped header byte was accepted"),
        Err(e) => say!("a copy with one flipped header bit is refused:\n    {e}"),
    }
    Ok(pool)
}

/// A two-step commit (data, then a count that makes it visible), with the power cut after every
/// fence: each crash image must show either the old or the new state, never a torn one.
/// Returns the fence count and the number of crash images checked.
fn crash_tour(path: &Path, image: &Path) -> Result<(u64, usize)> {
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
    say!("persistence-domain model: the 3-record commit issues {fences} fences; cutting power after each:");
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
    say!("    fence:records-visible  {}", seen.join("  "));
    say!("    every image held only whole, committed records");
    Ok((fences, seen.len()))
}
