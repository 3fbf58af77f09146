//! The non-page checkpoint in the FAM directory (`mig-<id>/checkpoint`): the region geometry
//! and the application's opaque state blob, written and persisted by the source during the
//! freeze, validated by the target before anything else.
//!
//! Layout of the pool's data area (little-endian): magic `TMMIGCKP` (8), version u32, region
//! count u32, blob length u64, crc32 u32 (of the whole header with this field zero) + pad, then
//! at offset 64 one u64 length per region (at most [`MAX_REGIONS`]); the blob starts at 4096.

use std::path::{Path, PathBuf};
use tiermem_media::{OpenOptions, Pool, PoolKind, PoolOptions};

/// Magic of a checkpoint.
pub const CKPT_MAGIC: [u8; 8] = *b"TMMIGCKP";
/// Layout version.
pub const CKPT_VERSION: u32 = 1;
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
        let size = ((HDR + self.blob.len()).div_ceil(4096) * 4096 + 4096).max(8192) as u64;
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
        let c = crc(&h);
        h[24..28].copy_from_slice(&c.to_le_bytes());
        let media = |source| CheckpointError::Media {
            path: path.to_path_buf(),
            source,
        };
        pool.write(HDR as u64, &self.blob).map_err(media)?;
        pool.write(0, &h).map_err(media)?;
        pool.persist(0, HDR + self.blob.len()).map_err(media)?;
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
        let version = u32::from_le_bytes(h[8..12].try_into().unwrap());
        if version != CKPT_VERSION {
            return Err(bad(format!(
                "version {version} (this build reads {CKPT_VERSION})"
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
        let region_lens = (0..n)
            .map(|i| u64::from_le_bytes(h[64 + 8 * i..72 + 8 * i].try_into().unwrap()))
            .collect();
        // SAFETY: bounds checked above.
        let blob = unsafe { std::slice::from_raw_parts(pool.data_ptr().add(HDR), blob_len) };
        Ok(Checkpoint {
            region_lens,
            blob: blob.to_vec(),
        })
    }
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
        };
        c.write(&p).unwrap();
        assert_eq!(Checkpoint::read(&p).unwrap(), c);
        // Flip a byte of a region length: the checksum catches it.
        let pool = Pool::open(&p, &OpenOptions::default().writable(true)).unwrap();
        // SAFETY: inside the mapped data area.
        unsafe { *pool.data_ptr().add(64) ^= 1 };
        drop(pool);
        let e = Checkpoint::read(&p).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
    }
}
