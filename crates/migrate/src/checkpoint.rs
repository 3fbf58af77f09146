//! The non-page checkpoint in the FAM directory (`mig-<id>/checkpoint`): the region geometry
//! and the application's opaque state blob, written and persisted by the source during the
//! freeze, validated by the target before anything else.
//!
//! Layout of the pool's data area (little-endian): magic `TMMIGCKP` (8), version u32, region
//! count u32, blob length u64, crc32 u32 (of the whole header with this field zero) + pad, then
//! at offset 64 one u64 length per region (at most [`MAX_REGIONS`]); the blob starts at 4096.
//!
//! Version 2 adds the hot-page manifest (the pages each region had written most recently
//! before the freeze, which the source dumps first and the target prefetches first): the total
//! count of hot offsets u64 at 32, the crc32 of the hot section u32 at 40, one u32 count per
//! region at [`OFF_HOT_COUNTS`]; the section itself (u64 region offsets, page aligned,
//! ascending, region after region) starts at the first 8-aligned offset after the blob. The
//! header's checksum covers the counts and the section's checksum. Version 1 files (no
//! manifest) are still read, with an empty manifest.

use std::path::{Path, PathBuf};
use tiermem_media::{OpenOptions, Pool, PoolKind, PoolOptions};

/// Magic of a checkpoint.
pub const CKPT_MAGIC: [u8; 8] = *b"TMMIGCKP";
/// Layout version.
pub const CKPT_VERSION: u32 = 2;
/// The oldest version this build still reads (no hot-page manifest).
pub const CKPT_VERSION_MIN: u32 = 1;
/// Most hot-page offsets one region may carry in the manifest.
pub const MAX_HOT_PAGES: usize = 64 << 10;
/// Header offset of the per-region u32 hot-page counts (after the region lengths).
pub const OFF_HOT_COUNTS: usize = 64 + 8 * MAX_REGIONS;
/// Pool tag of a checkpoint.
pub const CKPT_TAG: &str = "mig-ckpt";
/// Most regions one migration carries.
pub const MAX_REGIONS: usize = 256;
const HDR: usize = 4096;

/// Errors of the checkpoint file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The media layer refused (no space, bad pool header, ...).
    #[error("{}: {source}", path.display())]
    Media {
        /// The file.
        path: PathBuf,
        /// Why.
        source: tiermem_media::MediaError,
    },
    /// The file is not a valid checkpoint.
    #[error("{}: not a valid migration checkpoint: {what}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What failed validation.
        what: String,
    },
}

/// A validated checkpoint: the regions' lengths and the blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// Length of each region, in migration order.
    pub region_lens: Vec<u64>,
    /// The application's state blob.
    pub blob: Vec<u8>,
    /// Per region (empty, or one entry per region): the hot pages' region offsets (page
    /// aligned, ascending, inside the region, at most [`MAX_HOT_PAGES`]).
    pub hot: Vec<Vec<u64>>,
}

fn hot_start(blob_len: usize) -> usize {
    (HDR + blob_len).div_ceil(8) * 8
}

fn crc(h: &[u8]) -> u32 {
    let mut c = crc32fast::Hasher::new();
    c.update(&h[..24]);
    c.update(&[0u8; 4]);
    c.update(&h[28..HDR]);
    c.finalize()
}

impl Checkpoint {
    /// Write the checkpoint to `path` (a new FAM pool) and persist it.
    pub fn write(&self, path: &Path) -> Result<(), CheckpointError> {
        let bad = |what: &str| CheckpointError::Invalid {
            path: path.to_path_buf(),
            what: what.to_string(),
        };
        if self.region_lens.len() > MAX_REGIONS || self.region_lens.is_empty() {
            return Err(bad("1 to 256 regions"));
        }
        if !self.hot.is_empty() && self.hot.len() != self.region_lens.len() {
            return Err(bad("a hot-page list per region, or none"));
        }
        for (h, &len) in self.hot.iter().zip(&self.region_lens) {
            validate_hot(h, len).map_err(|w| bad(&w))?;
        }
        let mut section = Vec::new();
        for o in self.hot.iter().flatten() {
            section.extend_from_slice(&o.to_le_bytes());
        }
        let hot_at = hot_start(self.blob.len());
        let size = ((hot_at + section.len()).div_ceil(4096) * 4096 + 4096).max(8192) as u64;
        let pool = Pool::create(
            path,
            &PoolOptions::new(size)
                .kind(PoolKind::Fam)
                .tag(CKPT_TAG)
                .delay(tiermem_media::DelayModel::NONE),
        )
        .map_err(|source| CheckpointError::Media {
            path: path.to_path_buf(),
            source,
        })?;
        let mut h = vec![0u8; HDR];
        h[0..8].copy_from_slice(&CKPT_MAGIC);
        h[8..12].copy_from_slice(&CKPT_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(self.region_lens.len() as u32).to_le_bytes());
        h[16..24].copy_from_slice(&(self.blob.len() as u64).to_le_bytes());
        for (i, l) in self.region_lens.iter().enumerate() {
            h[64 + 8 * i..72 + 8 * i].copy_from_slice(&l.to_le_bytes());
        }
        h[32..40].copy_from_slice(&((section.len() / 8) as u64).to_le_bytes());
        h[40..44].copy_from_slice(&crc32fast::hash(&section).to_le_bytes());
        for (i, r) in self.hot.iter().enumerate() {
            h[OFF_HOT_COUNTS + 4 * i..OFF_HOT_COUNTS + 4 * i + 4]
                .copy_from_slice(&(r.len() as u32).to_le_bytes());
        }
        let c = crc(&h);
        h[24..28].copy_from_slice(&c.to_le_bytes());
        let media = |source| CheckpointError::Media {
            path: path.to_path_buf(),
            source,
        };
        pool.write(HDR as u64, &self.blob).map_err(media)?;
        pool.write(hot_at as u64, &section).map_err(media)?;
        pool.write(0, &h).map_err(media)?;
        pool.persist(0, hot_at + section.len()).map_err(media)?;
        Ok(())
    }

    /// Read and validate the checkpoint at `path`.
    pub fn read(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let pool =
            Pool::open(path, &OpenOptions::default()).map_err(|source| CheckpointError::Media {
                path: path.to_path_buf(),
                source,
            })?;
        let bad = |what: String| CheckpointError::Invalid {
            path: path.to_path_buf(),
            what,
        };
        if pool.tag() != CKPT_TAG {
            return Err(bad(format!(
                "pool tag {:?} (expected {CKPT_TAG:?})",
                pool.tag()
            )));
        }
        if pool.data_len() < HDR {
            return Err(bad(format!("data area of {} bytes", pool.data_len())));
        }
        // SAFETY: the pool's data area is mapped for data_len() ≥ HDR bytes.
        let h = unsafe { std::slice::from_raw_parts(pool.data_ptr(), HDR) };
        if h[0..8] != CKPT_MAGIC {
            return Err(bad("magic".into()));
        }
        // h is HDR = 4096 bytes: every fixed field below (at most OFF_HOT_COUNTS +
        // 4 * MAX_REGIONS = 3136, regions at 64 + 8 * n with n <= MAX_REGIONS checked) is in it.
        let version = u32::from_le_bytes(h[8..12].try_into().unwrap());
        if !(CKPT_VERSION_MIN..=CKPT_VERSION).contains(&version) {
            return Err(bad(format!(
                "version {version} (this build reads {CKPT_VERSION_MIN} to {CKPT_VERSION})"
            )));
        }
        let stored = u32::from_le_bytes(h[24..28].try_into().unwrap());
        if stored != crc(h) {
            return Err(bad("header checksum".into()));
        }
        let n = u32::from_le_bytes(h[12..16].try_into().unwrap()) as usize;
        let blob_len = u64::from_le_bytes(h[16..24].try_into().unwrap()) as usize;
        if n == 0 || n > MAX_REGIONS {
            return Err(bad(format!("region count {n}")));
        }
        if HDR
            .checked_add(blob_len)
            .map_or(true, |e| e > pool.data_len())
        {
            return Err(bad(format!(
                "blob of {blob_len} bytes past the end of the file"
            )));
        }
        let region_lens: Vec<u64> = (0..n)
            .map(|i| u64::from_le_bytes(h[64 + 8 * i..72 + 8 * i].try_into().unwrap()))
            .collect();
        // SAFETY: bounds checked above.
        let blob = unsafe { std::slice::from_raw_parts(pool.data_ptr().add(HDR), blob_len) };
        let hot = if version >= 2 {
            Self::read_hot(&pool, h, n, &region_lens, blob_len).map_err(bad)?
        } else {
            Vec::new()
        };
        Ok(Checkpoint {
            region_lens,
            blob: blob.to_vec(),
            hot,
        })
    }

    /// The manifest of a version-2 header `h` (see the module documentation).
    fn read_hot(
        pool: &Pool,
        h: &[u8],
        n: usize,
        region_lens: &[u64],
        blob_len: usize,
    ) -> Result<Vec<Vec<u64>>, String> {
        let total = u64::from_le_bytes(h[32..40].try_into().unwrap());
        let counts: Vec<usize> = (0..n)
            .map(|i| {
                u32::from_le_bytes(
                    h[OFF_HOT_COUNTS + 4 * i..OFF_HOT_COUNTS + 4 * i + 4]
                        .try_into()
                        .unwrap(),
                ) as usize
            })
            .collect();
        if counts.iter().map(|&c| c as u64).sum::<u64>() != total {
            return Err(format!("hot-page counts do not add up to {total}"));
        }
        if total == 0 {
            return Ok(Vec::new());
        }
        let at = hot_start(blob_len);
        let bytes = (total as usize)
            .checked_mul(8)
            .filter(|b| at.checked_add(*b).map_or(false, |e| e <= pool.data_len()))
            .ok_or_else(|| format!("{total} hot pages past the end of the file"))?;
        // SAFETY: `at..at + bytes` is inside the mapped data area (checked above).
        let section = unsafe { std::slice::from_raw_parts(pool.data_ptr().add(at), bytes) };
        let stored = u32::from_le_bytes(h[40..44].try_into().unwrap());
        if crc32fast::hash(section) != stored {
            return Err("hot-page section checksum".into());
        }
        // chunks_exact(8): 8-byte slices only.
        let mut words = section
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()));
        let mut hot = Vec::with_capacity(n);
        for (&c, &len) in counts.iter().zip(region_lens) {
            let v: Vec<u64> = words.by_ref().take(c).collect();
            validate_hot(&v, len)?;
            hot.push(v);
        }
        Ok(hot)
    }
}

/// Hot offsets must be page aligned, strictly ascending, inside the region, and few enough.
fn validate_hot(h: &[u64], region_len: u64) -> Result<(), String> {
    if h.len() > MAX_HOT_PAGES {
        return Err(format!(
            "{} hot pages in a region (at most {MAX_HOT_PAGES})",
            h.len()
        ));
    }
    let mut prev: Option<u64> = None;
    for &o in h {
        if o % 4096 != 0 || o >= region_len || prev.map_or(false, |p| o <= p) {
            return Err(format!(
                "hot page offset {o:#x} (page aligned, ascending, below {region_len:#x})"
            ));
        }
        prev = Some(o);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let d = tempfile::tempdir_in("/dev/shm").unwrap();
        let p = d.path().join("checkpoint");
        let c = Checkpoint {
            region_lens: vec![1 << 20, 64 << 20],
            blob: b"engine volatile\nroot 4096\n".to_vec(),
            hot: vec![vec![0, 8192], vec![4096 * 7, 4096 * 9, 60 << 20]],
        };
        c.write(&p).unwrap();
        assert_eq!(Checkpoint::read(&p).unwrap(), c);
        // A damaged hot-page section is refused.
        let pool = Pool::open(&p, &OpenOptions::default().writable(true)).unwrap();
        let at = hot_start(c.blob.len());
        // SAFETY: inside the mapped data area (the section's third offset).
        unsafe { *pool.data_ptr().add(at + 17) ^= 1 };
        drop(pool);
        let e = Checkpoint::read(&p).unwrap_err().to_string();
        assert!(e.contains("hot-page section checksum"), "{e}");
        // Unsorted or misaligned hot pages are refused at write.
        let mut bad = c.clone();
        bad.hot[0] = vec![8192, 0];
        assert!(bad.write(&d.path().join("bad")).is_err());
        bad.hot[0] = vec![5];
        assert!(bad.write(&d.path().join("bad2")).is_err());
        // A version-1 file (no manifest) still reads, with an empty manifest.
        let v1 = Checkpoint {
            hot: Vec::new(),
            ..c.clone()
        };
        let p1 = d.path().join("v1");
        v1.write(&p1).unwrap();
        let pool = Pool::open(&p1, &OpenOptions::default().writable(true)).unwrap();
        let mut h = vec![0u8; HDR];
        // SAFETY: the header inside the mapped data area.
        unsafe { std::ptr::copy_nonoverlapping(pool.data_ptr(), h.as_mut_ptr(), HDR) };
        h[8..12].copy_from_slice(&1u32.to_le_bytes());
        let cr = crc(&h);
        h[24..28].copy_from_slice(&cr.to_le_bytes());
        pool.write(0, &h).unwrap();
        drop(pool);
        assert_eq!(Checkpoint::read(&p1).unwrap(), v1);
        // Write the original again for the length-damage check below.
        c.write(&d.path().join("again")).unwrap();
        let p = d.path().join("again");
        // Flip a byte of a region length: the checksum catches it.
        let pool = Pool::open(&p, &OpenOptions::default().writable(true)).unwrap();
        // SAFETY: inside the mapped data area.
        unsafe { *pool.data_ptr().add(64) ^= 1 };
        drop(pool);
        let e = Checkpoint::read(&p).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
    }
}
