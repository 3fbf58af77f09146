//! `tiermem vnvm scrub`: read and verify everything an instance holds — pool headers,
//! superblock, state word, committed-list words, file records, cache page records, dirty cache
//! pages, the log pages and entries of every committed list, and every checksummed page of the
//! backing files — and report per area what was checked and what is bad, with locations.
//!
//! Backing files: those the file records name, and every file with a checksum table
//! (`<file>.vnvm-crc`) in the instance directory or its parent (a clean instance has no file
//! records left).
//!
//! Read-only like [`inspect`](crate::inspect): pools mapped read-only, backing files and their
//! checksum tables opened read-only, the `lock` file never opened. Unlike recovery it does not
//! stop at the first problem.
//!
//! What cannot be verified on a crashed instance is counted as `skipped`, not bad: with a
//! format-1 checksum table, the backing-file pages of a dirty cache page (that format wrote a
//! page's entry after its data). With a format-2 table such a page (and, after a crash during
//! recovery, a page a committed log writes) must hold one of its two recorded contents: the one
//! its last write put there or the one before (see `sums`). A dirty cache page is always
//! verified: against its record as it is, or with the listed transactions' writes into it
//! applied (a kill inside a redo batch, see `check_cache_page`).

use crate::error::{Result, VnvmError};
use crate::layout::*;
use crate::recovery::*;
use crate::sums;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use tiermem_media::OpenOptions;

/// One problem found by [`scrub`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrubFinding {
    /// The file holding it (a pool, a backing file or a checksum table).
    pub file: PathBuf,
    /// Which structure or page.
    pub what: String,
    /// Byte offset: in a pool's data area, or in a backing file / table.
    pub offset: u64,
    /// What is wrong.
    pub detail: String,
}

/// What [`scrub`] did in one area.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubArea {
    /// The area: `pools`, `superblock`, `state`, `domain words`, `file records`,
    /// `cache page records`, `cache pages`, `committed logs`, `backing files`.
    pub name: &'static str,
    /// Items verified.
    pub checked: u64,
    /// Items that could not be verified (see the module docs).
    pub skipped: u64,
    /// Items that failed, with their locations.
    pub bad: Vec<ScrubFinding>,
}

/// The result of [`scrub`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// The instance directory.
    pub dir: PathBuf,
    /// The areas, in the order they were read.
    pub areas: Vec<ScrubArea>,
}

impl ScrubReport {
    /// True when nothing bad was found.
    pub fn clean(&self) -> bool {
        self.areas.iter().all(|a| a.bad.is_empty())
    }
    /// Every finding.
    pub fn findings(&self) -> impl Iterator<Item = (&'static str, &ScrubFinding)> {
        self.areas
            .iter()
            .flat_map(|a| a.bad.iter().map(move |f| (a.name, f)))
    }
}

fn finding_of(e: VnvmError) -> ScrubFinding {
    match e {
        VnvmError::Damaged {
            path,
            what,
            offset,
            detail,
        } => ScrubFinding {
            file: path,
            what,
            offset,
            detail,
        },
        e => ScrubFinding {
            file: PathBuf::new(),
            what: "instance".into(),
            offset: 0,
            detail: e.to_string(),
        },
    }
}

fn area(name: &'static str) -> ScrubArea {
    ScrubArea {
        name,
        ..Default::default()
    }
}

/// Verify everything the instance in `dir` holds without writing anything (see the module
/// docs). Damage is reported in the [`ScrubReport`], never as an error.
///
/// Errors: [`VnvmError::NoInstance`] if `dir` has no `meta.pool`.
pub fn scrub(dir: impl AsRef<Path>) -> Result<ScrubReport> {
    let dir = dir.as_ref();
    if !dir.join(META).exists() {
        return Err(VnvmError::NoInstance {
            dir: dir.to_path_buf(),
        });
    }
    let mut rep = ScrubReport {
        dir: dir.to_path_buf(),
        areas: Vec::new(),
    };
    // Pools and superblock.
    let mut pools = area("pools");
    let mut sb = area("superblock");
    let p = match open_pools_with(dir, &OpenOptions::default().writable(false)) {
        Ok(p) => {
            pools.checked = 3;
            sb.checked = 1;
            Some(p)
        }
        Err(e @ VnvmError::Damaged { .. }) => {
            let f = finding_of(e);
            if f.what == "superblock" {
                pools.checked = 1;
                sb.bad.push(f);
            } else {
                pools.bad.push(f);
            }
            None
        }
        Err(e) => {
            let mut f = finding_of(e);
            f.what = "pool".into();
            pools.bad.push(f);
            None
        }
    };
    rep.areas.push(pools);
    rep.areas.push(sb);
    let Some(p) = p else {
        return Ok(rep);
    };
    let g = p.geo;

    let mut state = area("state");
    match read_clean(&p) {
        Ok(_) => state.checked = 1,
        Err(e) => state.bad.push(finding_of(e)),
    }
    rep.areas.push(state);

    // Committed-list words.
    let mut dw = area("domain words");
    let mut good_domains = Vec::new();
    for d in 0..g.max_domains {
        dw.checked += 1;
        match load_domain_noted(&p.meta, &g, d) {
            Ok((w, note)) => {
                if let Some(n) = note {
                    dw.bad.push(ScrubFinding {
                        file: p.meta.path().to_path_buf(),
                        what: format!("committed-list word of domain {d}"),
                        offset: g.domain_off(d),
                        detail: format!("{n} (the other copy is used)"),
                    });
                }
                if w != 0 {
                    good_domains.push(d);
                }
            }
            Err(e) => dw.bad.push(finding_of(e)),
        }
    }
    rep.areas.push(dw);

    // File records.
    let mut fr = area("file records");
    let mut records = HashMap::new();
    for id in 0..g.max_files {
        let off = g.file_off(id);
        fr.checked += 1;
        match FileRecord::decode(pool_slice(&p.meta, off, FILE_REC_SIZE as usize), id) {
            Ok(Some(r)) => {
                records.insert(id, r);
            }
            Ok(None) => {}
            Err(e) => fr.bad.push(ScrubFinding {
                file: p.meta.path().to_path_buf(),
                what: format!("file record {id}"),
                offset: off,
                detail: e,
            }),
        }
    }
    rep.areas.push(fr);

    // Committed logs.
    let mut cl = area("committed logs");
    let check = |f: u32, o: u64, l: u32| check_entry(&records, f, o, l);
    let mut seen = HashSet::new();
    let mut listed = Vec::new();
    for d in good_domains {
        match committed_list(&p.meta, &g, d) {
            Ok(list) => {
                for (idx, obj) in list {
                    match tx_entries(&p.meta, &p.log, &g, idx, &obj, &mut seen, &check) {
                        Ok(es) => {
                            cl.checked += obj.npages as u64;
                            listed.extend(es);
                        }
                        Err(e) => cl.bad.push(finding_of(e)),
                    }
                }
            }
            Err(e) => cl.bad.push(finding_of(e)),
        }
    }
    rep.areas.push(cl);
    let writes = listed_writes(&p.log, &listed, g.page_size);

    // Cache page records and dirty cache pages.
    let mut cr = area("cache page records");
    let mut cp = area("cache pages");
    // Units of backing files that may be newer than their checksums: (file id, unit) — those
    // of dirty cache pages (a crash in their writeback), and, after a crash during recovery,
    // those of the committed logs too.
    let mut rewritten: HashSet<(u32, u64)> = HashSet::new();
    if load_word(&p.meta, STATE_OFF) == STATE_RECOVERING {
        for e in &listed {
            for u in sums::units_of(e.offset, e.len as u64) {
                rewritten.insert((e.file_id, u));
            }
        }
    }
    let ps = g.page_size as u64;
    for page in 0..g.cache_pages {
        cr.checked += 1;
        match load_cache_rec_noted(&p.meta, &g, page) {
            Ok((_, Some(n))) => cr.bad.push(ScrubFinding {
                file: p.meta.path().to_path_buf(),
                what: format!("cache page record {page}"),
                offset: g.cache_word_off(page),
                detail: format!("{n} (the other copy is used)"),
            }),
            Ok(_) => {}
            Err(e) => {
                cr.bad.push(finding_of(e));
                continue;
            }
        }
        match cache_obj(&p, &records, page) {
            Ok(Some((f, idx, true, rec))) => {
                for u in sums::units_of(idx * ps, ps) {
                    rewritten.insert((f, u));
                }
                match check_cache_page(&p.cache, &g, page, (f, idx), &rec, &writes) {
                    Ok(()) => cp.checked += 1,
                    Err(e) => cp.bad.push(finding_of(e)),
                }
            }
            Ok(_) => {}
            Err(e) => {
                if !cr.bad.iter().any(|b| b.offset == g.cache_word_off(page)) {
                    cr.bad.push(finding_of(e));
                }
            }
        }
    }
    rep.areas.push(cr);
    rep.areas.push(cp);

    // Backing files: those the records name, and every checksum table in the directory.
    let mut bf = area("backing files");
    let mut files: Vec<(Option<u32>, PathBuf)> = records
        .values()
        .filter(|r| r.mode != 2)
        .map(|r| (Some(r.id), resolve(dir, &r.path)))
        .collect();
    // The instance directory and its parent (tiermem-kv keeps heap.data beside its vnvm/).
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    for d in std::iter::once(dir).chain(parent) {
        let Ok(rd) = std::fs::read_dir(d) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(n) = name.to_str() else { continue };
            if let Some(base) = n.strip_suffix(sums::SUFFIX) {
                let path = d.join(base);
                if !files.iter().any(|(_, p)| *p == path) {
                    files.push((None, path));
                }
            }
        }
    }
    for (id, path) in files {
        scrub_backing(&path, id, &rewritten, &mut bf);
    }
    rep.areas.push(bf);
    Ok(rep)
}

/// Verify every checksummed unit of one backing file into `a`.
fn scrub_backing(path: &Path, id: Option<u32>, rewritten: &HashSet<(u32, u64)>, a: &mut ScrubArea) {
    use std::os::unix::fs::FileExt;
    let table = match sums::SumTable::open(path, false, false, 0) {
        Ok(Some(t)) => t,
        Ok(None) => return,
        Err(e) => {
            a.bad.push(finding_of(e));
            return;
        }
    };
    let entries = match table.read_all() {
        Ok(v) => v,
        Err(e) => {
            a.bad.push(finding_of(e));
            return;
        }
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => {
            a.bad.push(ScrubFinding {
                file: path.to_path_buf(),
                what: "backing file".into(),
                offset: 0,
                detail: format!(
                    "cannot open it ({e}) but its checksum table {} exists",
                    table.path.display()
                ),
            });
            return;
        }
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut buf = vec![0u8; sums::UNIT as usize];
    for s in entries {
        // A unit a crash may have left mid-write: either recorded contents is right (format 2;
        // format 1 cannot tell).
        let mid_write = id.is_some_and(|f| rewritten.contains(&(f, s.unit)));
        if mid_write && table.version == 1 {
            a.skipped += 1;
            continue;
        }
        let start = s.unit * sums::UNIT;
        let what = format!("backing-file page {} (4 KiB unit)", s.unit);
        if start + s.len as u64 > len {
            a.bad.push(ScrubFinding {
                file: path.to_path_buf(),
                what,
                offset: start,
                detail: format!("beyond the end of the {len}-byte file (truncated)"),
            });
            continue;
        }
        let b = &mut buf[..s.len as usize];
        if let Err(e) = file.read_exact_at(b, start) {
            a.bad.push(ScrubFinding {
                file: path.to_path_buf(),
                what,
                offset: start,
                detail: format!("read failed: {e}"),
            });
            continue;
        }
        let c = sums::unit_crc(b);
        a.checked += 1;
        if !(c == s.crc || mid_write && s.either(c)) {
            a.bad
                .push(finding_of(sums::page_damaged(path, &s, c, &table.path)));
        }
    }
}
