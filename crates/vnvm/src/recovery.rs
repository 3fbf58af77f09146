//! Opening the pools of an instance, validating every persistent structure, and recovery
//! (§2.4.6): dirty cache pages to their files, then the committed lists in order, fdatasync,
//! reset. Validation runs completely before the first byte is written.

use crate::error::{io_err, Result, VnvmError};
use crate::layout::*;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use tiermem_media::{OpenOptions, Pool, PowerDomain};

pub(crate) const META: &str = "meta.pool";
pub(crate) const LOG: &str = "log.pool";
pub(crate) const CACHE: &str = "cache.pool";
pub(crate) const LOCK: &str = "lock";

/// What [`recover`](crate::recover) did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// True when the instance had been shut down cleanly: nothing needed replaying.
    pub was_clean: bool,
    /// Dirty NVM cache pages written back to their files.
    pub dirty_pages_written: usize,
    /// Committed transactions replayed into the files.
    pub transactions_replayed: usize,
    /// Log entries replayed.
    pub entries_replayed: usize,
    /// Bytes replayed from the logs.
    pub bytes_replayed: u64,
    /// The backing files that were written and synced.
    pub files: Vec<PathBuf>,
}

/// The three pools of an instance with their validated geometry.
pub(crate) struct Pools {
    /// The instance directory (relative backing-file paths are resolved against it).
    pub dir: PathBuf,
    pub meta: Pool,
    pub log: Pool,
    pub cache: Pool,
    pub geo: Geometry,
}

pub(crate) fn damaged(
    pool: &Pool,
    what: impl Into<String>,
    offset: u64,
    detail: impl Into<String>,
) -> VnvmError {
    VnvmError::Damaged {
        path: pool.path().to_path_buf(),
        what: what.into(),
        offset,
        detail: detail.into(),
    }
}

/// Read an 8-byte word of a pool's data area atomically.
pub(crate) fn load_word(pool: &Pool, off: u64) -> u64 {
    debug_assert!(off % 8 == 0 && off + 8 <= pool.data_len() as u64);
    // SAFETY: off is 8-aligned and inside the data area (page-aligned mapping).
    unsafe { (*(pool.data_ptr().add(off as usize) as *const AtomicU64)).load(Ordering::Acquire) }
}

/// Store an 8-byte word of a pool's data area atomically and persist it (one fence).
#[track_caller]
pub(crate) fn store_word_persist(pool: &Pool, off: u64, v: u64) -> Result<()> {
    store_word(pool, off, v);
    pool.persist(off, 8)?;
    Ok(())
}

/// Store an 8-byte word atomically (not yet flushed).
pub(crate) fn store_word(pool: &Pool, off: u64, v: u64) {
    debug_assert!(off % 8 == 0 && off + 8 <= pool.data_len() as u64);
    // SAFETY: off is 8-aligned and inside the data area of a writable mapping.
    unsafe {
        (*(pool.data_ptr().add(off as usize) as *const AtomicU64)).store(v, Ordering::Release)
    }
}

/// A slice of a pool's data area. The caller guarantees nobody writes it concurrently.
pub(crate) fn pool_slice(pool: &Pool, off: u64, len: usize) -> &[u8] {
    assert!(off + len as u64 <= pool.data_len() as u64);
    // SAFETY: bounds checked above; the mapping lives as long as the pool borrow.
    unsafe { std::slice::from_raw_parts(pool.data_ptr().add(off as usize), len) }
}

/// Open and validate the three pools in `dir` (pool headers by the media layer, then the
/// superblock and the pool sizes against it).
pub(crate) fn open_pools(dir: &Path, domain: Option<&PowerDomain>) -> Result<Pools> {
    let mut oo = OpenOptions::default();
    if let Some(d) = domain {
        oo = oo.domain(d);
    }
    open_pools_with(dir, &oo)
}

/// [`open_pools`] with explicit media options (`writable(false)`: a read-only mapping, for
/// inspecting an instance without any chance of writing it).
pub(crate) fn open_pools_with(dir: &Path, oo: &OpenOptions) -> Result<Pools> {
    let meta = Pool::open(dir.join(META), oo)?;
    if meta.data_len() < 4096 {
        return Err(damaged(&meta, "superblock", 0, "meta pool too small"));
    }
    let geo = Geometry::decode(pool_slice(&meta, 0, SB_SIZE))
        .map_err(|e| damaged(&meta, "superblock", 0, e))?;
    if (meta.data_len() as u64) < geo.meta_len() {
        return Err(damaged(
            &meta,
            "superblock",
            0,
            format!(
                "meta pool data area is {} bytes, the geometry needs {}",
                meta.data_len(),
                geo.meta_len()
            ),
        ));
    }
    let log = Pool::open(dir.join(LOG), oo)?;
    if log.data_len() as u64 != geo.log_len() {
        return Err(damaged(
            &log,
            "log pool",
            0,
            format!(
                "data area is {} bytes, superblock says {}",
                log.data_len(),
                geo.log_len()
            ),
        ));
    }
    let cache = Pool::open(dir.join(CACHE), oo)?;
    if cache.data_len() as u64 != geo.cache_len() {
        return Err(damaged(
            &cache,
            "cache pool",
            0,
            format!(
                "data area is {} bytes, superblock says {}",
                cache.data_len(),
                geo.cache_len()
            ),
        ));
    }
    Ok(Pools {
        dir: dir.to_path_buf(),
        meta,
        log,
        cache,
        geo,
    })
}

/// The backing file a record names: a relative path is relative to the instance directory
/// `dir` (format 3 stores files inside or beside the instance that way, so an instance can be
/// moved).
pub(crate) fn resolve(dir: &Path, rec_path: &str) -> PathBuf {
    let p = Path::new(rec_path);
    if p.is_absolute() {
        return p.to_path_buf();
    }
    // `../NAME` (a file beside the instance, see `record_path`) resolves lexically, so the
    // path compares equal to the absolute path the file was allocated with.
    match (p.strip_prefix(".."), dir.parent()) {
        (Ok(rest), Some(parent)) => parent.join(rest),
        _ => dir.join(p),
    }
}

/// The path a file record stores for the absolute path `abs`: relative to the instance
/// directory `dir` when the file lies inside it; `../NAME` when it lies beside it (directly in
/// the parent directory, as tiermem-kv keeps `heap.data` beside `vnvm/`), so that moving the
/// directory that holds both moves the instance; else `abs` itself.
pub(crate) fn record_path(dir: &Path, abs: &Path) -> PathBuf {
    let d = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    match abs.strip_prefix(&d) {
        Ok(rel) if !rel.as_os_str().is_empty() => rel.to_path_buf(),
        _ => match (d.parent(), abs.parent(), abs.file_name()) {
            (Some(dp), Some(ap), Some(name)) if dp == ap => Path::new("..").join(name),
            _ => abs.to_path_buf(),
        },
    }
}

/// The cache page record of `page` from its two copies (see the layout docs), with a note
/// when one copy fails its check; both failing is [`VnvmError::Damaged`].
pub(crate) fn load_cache_rec_noted(
    meta: &Pool,
    geo: &Geometry,
    page: u32,
) -> Result<(CacheRec, Option<String>)> {
    let off = geo.cache_word_off(page);
    let copy = |base: u64| {
        let mut b = [0u8; CACHE_REC_SIZE as usize];
        for k in 0..4 {
            b[k * 8..k * 8 + 8]
                .copy_from_slice(&load_word(meta, base + 8 * k as u64).to_le_bytes());
        }
        CacheRec::decode(&b)
    };
    pick_copy(copy(off), copy(off + CACHE_REC_SIZE))
        .map_err(|e| damaged(meta, format!("cache page record {page}"), off, e))
}

/// The cache page record of `page` (see [`load_cache_rec_noted`]).
pub(crate) fn load_cache_rec(meta: &Pool, geo: &Geometry, page: u32) -> Result<CacheRec> {
    load_cache_rec_noted(meta, geo, page).map(|r| r.0)
}

/// Store the record of cache page `page`: copy A, then copy B (8-byte stores into one cache
/// line; not flushed: the caller flushes the line and fences).
pub(crate) fn store_cache_rec(meta: &Pool, geo: &Geometry, page: u32, r: &CacheRec) {
    let off = geo.cache_word_off(page);
    let b = r.encode();
    for copy in [0, CACHE_REC_SIZE] {
        for k in 0..4 {
            store_word(meta, off + copy + 8 * k as u64, u64_at(&b, k * 8));
        }
    }
}

/// Zero the record of cache page `page`, copy A then copy B (not flushed).
pub(crate) fn clear_cache_rec(meta: &Pool, geo: &Geometry, page: u32) {
    let off = geo.cache_word_off(page);
    for k in 0..8 {
        store_word(meta, off + 8 * k, 0);
    }
}

/// The contents checksum of cache page `page` whose valid chunks are `mask`: the XOR of the
/// [`crate::chunksum::chunk_sum`]s of its valid chunks. XOR makes it incremental: the redo worker takes a
/// chunk's old sum out and puts its new one in, hashing only the chunks a batch writes (a whole
/// 4 KiB CRC per page per batch cost more than the transactions themselves when each writes a
/// few bytes of many pages). A flip in a chunk changes its CRC, so the XOR; two flips in two
/// chunks cancel only if their CRC changes collide (2^-32).
pub(crate) fn cache_page_sum(cache: &Pool, geo: &Geometry, page: u32, mask: u64) -> u32 {
    let ps = geo.page_size as u64;
    crate::chunksum::chunks_xor(
        pool_slice(cache, page as u64 * ps, ps as usize),
        geo.chunk() as usize,
        mask,
    )
}

/// Store the committed-list word of domain `d`: copy A (word, CRC), then copy B, in one cache
/// line, persisted with one fence (see the layout docs on two-copy words).
#[track_caller]
pub(crate) fn store_domain_persist(meta: &Pool, geo: &Geometry, d: u32, word: u64) -> Result<()> {
    store_domain(meta, geo, d, word);
    meta.persist(geo.domain_off(d), 32)?;
    Ok(())
}

/// The 32 bytes [`store_domain_persist`] stores for `word` (copy A, CRC, copy B, CRC), at
/// [`Geometry::domain_off`]: what a commit-journal record carries.
pub(crate) fn domain_word_bytes(d: u32, word: u64) -> [u8; 32] {
    let c = domain_crc(d, word) as u64;
    let mut b = [0u8; 32];
    for (i, v) in [word, c, word, c].into_iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// [`store_domain_persist`] without the persist (journal mode: the journal holds it).
pub(crate) fn store_domain(meta: &Pool, geo: &Geometry, d: u32, word: u64) {
    let off = geo.domain_off(d);
    let c = domain_crc(d, word) as u64;
    store_word(meta, off, word);
    store_word(meta, off + 8, c);
    store_word(meta, off + 16, word);
    store_word(meta, off + 24, c);
}

/// The committed-list word of domain `d` from its two copies, with a note when one fails its
/// check; both failing is [`VnvmError::Damaged`].
pub(crate) fn load_domain_noted(
    meta: &Pool,
    geo: &Geometry,
    d: u32,
) -> Result<(u64, Option<String>)> {
    let off = geo.domain_off(d);
    let copy = |base: u64| {
        let (w, c) = (load_word(meta, base), load_word(meta, base + 8));
        if c == domain_crc(d, w) as u64 {
            Ok(w)
        } else {
            Err(format!(
                "checksum mismatch (word {w:#018x}, stored {c:#x}, computed {:#010x})",
                domain_crc(d, w)
            ))
        }
    };
    pick_copy(copy(off), copy(off + 16))
        .map_err(|e| damaged(meta, format!("committed-list word of domain {d}"), off, e))
}

/// The committed-list word of domain `d` (see [`load_domain_noted`]).
pub(crate) fn load_domain(meta: &Pool, geo: &Geometry, d: u32) -> Result<u64> {
    load_domain_noted(meta, geo, d).map(|r| r.0)
}

/// Check every domain's committed-list word against its CRC (also the unused ones).
pub(crate) fn check_domains(p: &Pools) -> Result<()> {
    for d in 0..p.geo.max_domains {
        load_domain(&p.meta, &p.geo, d)?;
    }
    Ok(())
}

/// The validated state word: true when clean.
pub(crate) fn read_clean(p: &Pools) -> Result<bool> {
    match load_word(&p.meta, STATE_OFF) {
        STATE_CLEAN => Ok(true),
        STATE_RUNNING | STATE_RECOVERING => Ok(false),
        w => Err(damaged(
            &p.meta,
            "state word",
            STATE_OFF,
            format!("unknown value {w:#018x}"),
        )),
    }
}

/// Everything recovery will do, decided before anything is written.
struct Plan {
    records: HashMap<u32, FileRecord>,
    /// (cache page, file id, page index, valid-chunk mask)
    dirty: Vec<(u32, u32, u64, u64)>,
    /// Committed transactions, in replay order, as their entries.
    txs: Vec<Vec<Entry>>,
}

/// The valid file records of the instance, by id; a damaged record is [`VnvmError::Damaged`].
pub(crate) fn load_records(meta: &Pool, geo: &Geometry) -> Result<HashMap<u32, FileRecord>> {
    let mut records = HashMap::new();
    for id in 0..geo.max_files {
        let off = geo.file_off(id);
        let b = pool_slice(meta, off, FILE_REC_SIZE as usize);
        match FileRecord::decode(b, id) {
            Ok(Some(r)) => {
                records.insert(id, r);
            }
            Ok(None) => {}
            Err(e) => return Err(damaged(meta, format!("file record {id}"), off, e)),
        }
    }
    Ok(records)
}

/// Walk the committed list of `domain`: the log objects from head to tail.
pub(crate) fn committed_list(
    meta: &Pool,
    geo: &Geometry,
    domain: u32,
) -> Result<Vec<(u32, LogObj)>> {
    let woff = geo.domain_off(domain);
    let (head, tail) = domain_unword(load_domain(meta, geo, domain)?);
    let what = format!("committed list of domain {domain}");
    if head == 0 && tail == 0 {
        return Ok(Vec::new());
    }
    if head == 0 || tail == 0 || head > geo.log_objs || tail > geo.log_objs {
        return Err(damaged(
            meta,
            what,
            woff,
            format!(
                "head {head} / tail {tail} out of range 1..={}",
                geo.log_objs
            ),
        ));
    }
    let mut out = Vec::new();
    let mut idx = tail - 1;
    loop {
        let off = geo.logobj_off(idx);
        let obj = LogObj::decode(pool_slice(meta, off, LOGOBJ_SIZE as usize))
            .map_err(|e| damaged(meta, format!("log object {idx}"), off, e))?;
        out.push((idx, obj));
        if idx + 1 == head {
            break;
        }
        if out.len() > geo.log_objs as usize || obj.prev == 0 || obj.prev > geo.log_objs {
            return Err(damaged(
                meta,
                format!("log object {idx}"),
                off,
                format!("predecessor {} does not lead to the head {head}", obj.prev),
            ));
        }
        idx = obj.prev - 1;
    }
    out.reverse();
    Ok(out)
}

/// The entries of one committed transaction, validated.
pub(crate) fn tx_entries(
    meta: &Pool,
    log: &Pool,
    geo: &Geometry,
    idx: u32,
    obj: &LogObj,
    seen: &mut HashSet<u32>,
    check: &dyn Fn(u32, u64, u32) -> std::result::Result<(), String>,
) -> Result<Vec<Entry>> {
    let ps = geo.page_size;
    let mut out = Vec::new();
    if obj.npages == 0 || obj.npages > geo.log_pages {
        return Err(damaged(
            meta,
            format!("log object {idx}"),
            geo.logobj_off(idx),
            format!("page count {} out of range", obj.npages),
        ));
    }
    let mut page = obj.first_page;
    for i in 0..obj.npages {
        if page >= geo.log_pages || !seen.insert(page) {
            return Err(damaged(
                meta,
                format!("log object {idx} (tid {})", obj.tid),
                geo.logobj_off(idx),
                format!("log page {page} out of range or used twice"),
            ));
        }
        let off = page as u64 * ps as u64;
        let b = pool_slice(log, off, ps as usize);
        let tid = u64_at(b, 8);
        if tid != obj.tid {
            return Err(damaged(
                log,
                format!("log page {page}"),
                off,
                format!("belongs to tid {tid}, log object says {}", obj.tid),
            ));
        }
        parse_page(b, off, ps, &mut out, check, true)
            .map_err(|e| damaged(log, format!("log page {page} (tid {tid})"), off, e))?;
        let next = u32_at(b, 4);
        if i + 1 < obj.npages {
            if next == 0 {
                return Err(damaged(
                    log,
                    format!("log page {page}"),
                    off,
                    "chain ends early",
                ));
            }
            page = next - 1;
        }
    }
    Ok(out)
}

/// The validated cache page record `page`: `None` for a page that holds no file page, else
/// (file id, page index, dirty, record). A dirty page must name a recorded file and lie inside
/// it (it will be written there).
pub(crate) fn cache_obj(
    p: &Pools,
    records: &HashMap<u32, FileRecord>,
    page: u32,
) -> Result<Option<(u32, u64, bool, CacheRec)>> {
    let ps = p.geo.page_size as u64;
    let off = p.geo.cache_word_off(page);
    let rec = load_cache_rec(&p.meta, &p.geo, page)?;
    let w = rec.word;
    let Some((f, idx, d)) = cache_unword(w) else {
        return Ok(None);
    };
    if w & !(CACHE_DIRTY | MAX_FILE_PAGE | (0xffff << 40)) != 0 {
        return Err(damaged(
            &p.meta,
            format!("cache page record {page}"),
            off,
            "reserved bits set",
        ));
    }
    if d {
        let r = records.get(&f).ok_or_else(|| {
            damaged(
                &p.meta,
                format!("cache page record {page}"),
                off,
                format!("names file id {f}, which has no record"),
            )
        })?;
        if idx * ps >= r.size.max(1) {
            return Err(damaged(
                &p.meta,
                format!("cache page record {page}"),
                off,
                format!(
                    "page index {idx} beyond the {}-byte file {}",
                    r.size, r.path
                ),
            ));
        }
    }
    Ok(Some((f, idx, d, rec)))
}

/// The bytes the listed (committed, not yet applied) transactions write into each file page
/// (file id, page index), in replay order: (offset in the page, bytes). An entry never crosses
/// a page boundary (`parse_page` checks it).
pub(crate) type ListedWrites<'a> = HashMap<(u32, u64), Vec<(usize, &'a [u8])>>;

/// The [`ListedWrites`] of `entries` (in replay order), their bytes in `log`.
pub(crate) fn listed_writes<'a, 'e>(
    log: &'a Pool,
    entries: impl IntoIterator<Item = &'e Entry>,
    page_size: u32,
) -> ListedWrites<'a> {
    let ps = page_size as u64;
    let mut m: ListedWrites<'a> = HashMap::new();
    for e in entries {
        m.entry((e.file_id, e.offset / ps)).or_default().push((
            (e.offset % ps) as usize,
            pool_slice(log, e.log_off, e.len as usize),
        ));
    }
    m
}

/// Check the contents of dirty cache page `page` (file page `key`) against its record's CRC.
///
/// The record describes the page as it is, or — while a redo batch is being applied — as the
/// listed transactions will make it: the redo worker persists the new CRC of the chunks a
/// dirty record covers *before* it stores into them (`Inner::store_staged`), so a crash
/// between leaves some of the new bytes stored and others not. Such a page is verified by
/// applying the listed writes into it (`listed`), in replay order, to a copy of the page: it
/// must match the CRC after some prefix of them. That verifies every byte recovery keeps: a
/// byte no listed transaction writes is the same in every prefix, so a flip there fails every
/// comparison (but for CRC collisions, 2⁻³² per prefix), and a byte one of them writes is
/// overwritten by the replay anyway. Nothing else is accepted: a mismatch is
/// [`VnvmError::Damaged`] naming the cache page.
pub(crate) fn check_cache_page(
    cache: &Pool,
    geo: &Geometry,
    page: u32,
    key: (u32, u64),
    rec: &CacheRec,
    listed: &ListedWrites<'_>,
) -> Result<()> {
    let computed = cache_page_sum(cache, geo, page, rec.mask);
    if computed == rec.page_crc {
        return Ok(());
    }
    let ps = geo.page_size as usize;
    let cs = geo.chunk() as usize;
    let writes = listed.get(&key).map(|w| &w[..]).unwrap_or(&[]);
    if !writes.is_empty() {
        let mut buf = pool_slice(cache, page as u64 * ps as u64, ps).to_vec();
        let mut sums = [0u32; 64];
        crate::chunksum::chunk_sums(0, &buf, cs, &mut sums);
        let mut x = computed;
        for &(off, data) in writes {
            if data.is_empty() || off + data.len() > ps {
                continue; // (cannot happen: entries are checked to lie in one page)
            }
            buf[off..off + data.len()].copy_from_slice(data);
            for ch in off / cs..=(off + data.len() - 1) / cs {
                if rec.mask & (1 << ch) != 0 {
                    let s = crate::chunksum::chunk_sum(ch as u64, &buf[ch * cs..(ch + 1) * cs]);
                    x ^= sums[ch] ^ s;
                    sums[ch] = s;
                }
            }
            if x == rec.page_crc {
                return Ok(());
            }
        }
    }
    Err(damaged(
        cache,
        format!("cache page {page} (file {} page {})", key.0, key.1),
        page as u64 * ps as u64,
        format!(
            "dirty page contents checksum mismatch (stored {:#010x}, computed {computed:#010x}{})",
            rec.page_crc,
            if writes.is_empty() {
                String::new()
            } else {
                format!(
                    ", and after each of the {} listed writes into the page",
                    writes.len()
                )
            }
        ),
    ))
}

/// The destination check of a log entry: `len` bytes at `offset` of the recorded file `file_id`.
pub(crate) fn check_entry(
    records: &HashMap<u32, FileRecord>,
    file_id: u32,
    offset: u64,
    len: u32,
) -> std::result::Result<(), String> {
    let r = records
        .get(&file_id)
        .ok_or_else(|| format!("file id {file_id} has no record"))?;
    if offset + len as u64 > r.size {
        return Err(format!(
            "range {offset}+{len} beyond the {}-byte file {}",
            r.size, r.path
        ));
    }
    Ok(())
}

fn plan(p: &Pools) -> Result<Plan> {
    let records = load_records(&p.meta, &p.geo)?;
    let mut dirty = Vec::new();
    let mut dirty_recs = Vec::new();
    for page in 0..p.geo.cache_pages {
        if let Some((f, idx, true, rec)) = cache_obj(p, &records, page)? {
            dirty.push((page, f, idx, rec.mask));
            dirty_recs.push(rec);
        }
    }
    let check = |f: u32, o: u64, l: u32| check_entry(&records, f, o, l);
    let mut txs = Vec::new();
    let mut seen = HashSet::new();
    for d in 0..p.geo.max_domains {
        for (idx, obj) in committed_list(&p.meta, &p.geo, d)? {
            txs.push(tx_entries(
                &p.meta, &p.log, &p.geo, idx, &obj, &mut seen, &check,
            )?);
        }
    }
    let listed = listed_writes(&p.log, txs.iter().flatten(), p.geo.page_size);
    for (&(page, f, idx, _), rec) in dirty.iter().zip(&dirty_recs) {
        check_cache_page(&p.cache, &p.geo, page, (f, idx), rec, &listed)?;
    }
    Ok(Plan {
        records,
        dirty,
        txs,
    })
}

/// Recover the instance whose pools the caller has exclusive use of.
pub(crate) fn recover_locked(dir: &Path) -> Result<RecoveryReport> {
    let p = open_pools(dir, None)?;
    // A disk-backed instance's commit journal first: it holds what the pools may lack.
    crate::journal::replay(dir, &p.log, &p.meta)?;
    drop(p);
    let report = recover_pools(dir)?;
    // The pools are durable and recovered: the journal's records must never be replayed over
    // them again (a new epoch invalidates them all).
    if dir.join(crate::journal::JOURNAL).exists() {
        crate::journal::Journal::create(dir)?;
    }
    Ok(report)
}

/// [`recover_locked`] after the journal's replay.
fn recover_pools(dir: &Path) -> Result<RecoveryReport> {
    let p = open_pools(dir, None)?;
    let clean = read_clean(&p)?;
    let plan = plan(&p)?;
    let mut report = RecoveryReport {
        was_clean: clean,
        ..Default::default()
    };
    if clean && plan.dirty.is_empty() && plan.txs.is_empty() {
        return Ok(report);
    }
    // A recovery that crashed may have left pages newer than their checksums.
    let prior_recovery = load_word(&p.meta, STATE_OFF) == STATE_RECOVERING;
    // Open every file that will be written before writing anything.
    let mut used: Vec<u32> = plan.dirty.iter().map(|d| d.1).collect();
    used.extend(plan.txs.iter().flatten().map(|e| e.file_id));
    used.sort_unstable();
    used.dedup();
    let mut files: HashMap<u32, (File, &FileRecord, PathBuf)> = HashMap::new();
    for id in used {
        let Some(r) = plan.records.get(&id) else {
            continue; // cannot happen: every used id passed check_entry / cache_obj
        };
        let path = resolve(&p.dir, &r.path);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io_err("open backing file for recovery", &path, e))?;
        files.insert(id, (f, r, path));
    }
    let ps = p.geo.page_size as u64;
    // What each file receives, in order: (1) the valid chunks of its dirty cache pages (the
    // rest of such a page is the file's, or a log's), (2) its committed logs, oldest first.
    let chunk = p.geo.chunk();
    let mut patches: HashMap<u32, Vec<crate::sums::Patch<'_>>> = HashMap::new();
    // Units of dirty cache pages: what a format-1 checksum table cannot vouch for.
    let mut in_dirty: HashSet<(u32, u64)> = HashSet::new();
    for &(page, f, idx, mask) in &plan.dirty {
        let r = files[&f].1;
        for (c, n) in mask_runs(mask) {
            let start = idx * ps + c as u64 * chunk;
            if start >= r.size {
                break;
            }
            let len = (n as u64 * chunk).min(r.size - start) as usize;
            let data = pool_slice(&p.cache, page as u64 * ps + c as u64 * chunk, len);
            patches.entry(f).or_default().push(crate::sums::Patch {
                offset: start,
                data,
            });
        }
        in_dirty.extend(crate::sums::units_of(idx * ps, ps).map(|u| (f, u)));
        report.dirty_pages_written += 1;
    }
    for tx in &plan.txs {
        for e in tx {
            let data = pool_slice(&p.log, e.log_off, e.len as usize);
            patches
                .entry(e.file_id)
                .or_default()
                .push(crate::sums::Patch {
                    offset: e.offset,
                    data,
                });
            report.entries_replayed += 1;
            report.bytes_replayed += e.len as u64;
        }
        report.transactions_replayed += 1;
    }
    // (3) each file rebuilt: every file verified first (damage anywhere fails recovery with
    // nothing written), then each checksummed before written and synced (see `sums`). Shared
    // regions keep no checksum table.
    let mut ids: Vec<u32> = files.keys().copied().collect();
    ids.sort_unstable();
    let mut tables: HashMap<u32, crate::sums::SumTable> = HashMap::new();
    for &id in &ids {
        let (file, r, path) = &files[&id];
        if r.mode == 2 {
            continue;
        }
        let perm = {
            use std::os::unix::fs::PermissionsExt;
            file.metadata()
                .map(|m| m.permissions().mode() & 0o660)
                .unwrap_or(0o600)
        };
        if let Some(t) = crate::sums::SumTable::open(path, true, true, perm)? {
            tables.insert(id, t);
        }
    }
    let in_dirty = &in_dirty;
    let unverifiable = |id: u32| move |u: u64| prior_recovery || in_dirty.contains(&(id, u));
    for &id in &ids {
        let (file, r, path) = &files[&id];
        let ps = patches.get(&id).map(|v| &v[..]).unwrap_or(&[]);
        crate::sums::verify_patched(path, file, r.size, tables.get(&id), ps, &unverifiable(id))?;
    }
    store_word_persist(&p.meta, STATE_OFF, STATE_RECOVERING)?;
    for &id in &ids {
        let (file, r, path) = &files[&id];
        let ps = patches.get(&id).map(|v| &v[..]).unwrap_or(&[]);
        crate::sums::rebuild(
            path,
            file,
            r.size,
            tables.get_mut(&id),
            ps,
            &unverifiable(id),
        )?;
        report.files.push(path.clone());
    }
    report.files.sort();
    // (4) reset: dirty objects first (so a crash leaves only idempotent log replay), then the
    // committed lists, then the file records, then the state word.
    reset(&p)?;
    Ok(report)
}

/// Reset the instance: every structure empty, state clean.
pub(crate) fn reset(p: &Pools) -> Result<()> {
    let g = &p.geo;
    zero_persist(
        &p.meta,
        g.cache_obj_off(),
        CACHE_OBJ_SIZE * g.cache_pages as u64,
    )?;
    zero_persist(&p.meta, DOMAIN_OFF, DOMAIN_STRIDE * g.max_domains as u64)?; // words and CRCs
    zero_persist(&p.meta, g.files_off(), FILE_REC_SIZE * g.max_files as u64)?;
    store_word_persist(&p.meta, STATE_OFF, STATE_CLEAN)?;
    Ok(())
}

pub(crate) fn zero_persist(pool: &Pool, off: u64, len: u64) -> Result<()> {
    let zeros = vec![0u8; 64 << 10];
    let mut at = off;
    while at < off + len {
        let n = (off + len - at).min(zeros.len() as u64) as usize;
        pool.write(at, &zeros[..n])?;
        at += n as u64;
    }
    pool.persist(off, len as usize)?;
    Ok(())
}

/// Open (creating) the instance's `lock` file: its flock serializes joining, leaving,
/// reaping and recovery; OFD locks on its bytes `1 + slot` mark live users (see `shm`).
pub(crate) fn open_lock_file(dir: &Path, mode: u32) -> Result<File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let path = dir.join(LOCK);
    let open = |create_new: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(create_new)
            .mode(mode)
            .open(&path)
    };
    match open(true) {
        Ok(f) => {
            // A new instance's lock file: group sharing asked for 0660 regardless of the umask.
            if mode & 0o060 != 0 {
                let _ = f.set_permissions(std::fs::Permissions::from_mode(mode));
            }
            Ok(f)
        }
        // An existing one keeps the mode its creator chose.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            open(false).map_err(|e| io_err("open lock file", &path, e))
        }
        Err(e) => Err(io_err("create lock file", &path, e)),
    }
}

/// flock the lock file exclusively; with `wait` false, return false when somebody holds it.
pub(crate) fn flock_exclusive(f: &File, wait: bool) -> bool {
    use std::os::fd::AsRawFd;
    let op = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    loop {
        // SAFETY: f is an open descriptor.
        if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
            return true;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return false;
        }
    }
}

/// Release the flock of [`flock_exclusive`].
pub(crate) fn flock_release(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: f is an open descriptor.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
}

/// The number of live users of the instance in `dir` (processes with their slot lock held).
pub(crate) fn live_users(dir: &Path, geo: &Geometry, lockf: &File) -> u32 {
    match crate::shm::Shm::open(dir, geo) {
        Ok(Some(s)) => (0..crate::shm::MAX_APPS)
            .filter(|&k| {
                s.app(k).state.load(Ordering::Acquire) == crate::shm::SLOT_LIVE
                    && crate::shm::slot_alive(lockf, k)
            })
            .count() as u32,
        _ => 0,
    }
}

/// Recover the instance in `dir` (see the crate docs): validate everything, then write dirty
/// cache pages back, replay the committed lists in order, fdatasync, and reset the instance.
///
/// Errors: [`VnvmError::NoInstance`] if `dir` has no `meta.pool`; [`VnvmError::Busy`] if a live
/// instance holds `dir`; media errors for a missing,
/// truncated, foreign or other-version pool; [`VnvmError::Damaged`] naming the structure and
/// its offset when validation fails — in every error case nothing has been written. Idempotent:
/// running it again after a crash during recovery gives the same files.
pub fn recover(dir: impl AsRef<Path>) -> Result<RecoveryReport> {
    let dir = dir.as_ref();
    if !dir.join(META).exists() {
        return Err(VnvmError::NoInstance {
            dir: dir.to_path_buf(),
        });
    }
    let lockf = open_lock_file(dir, 0o600)?;
    if !flock_exclusive(&lockf, false) {
        return Err(VnvmError::Busy(dir.to_path_buf()));
    }
    let geo = open_pools(dir, None)?.geo;
    if live_users(dir, &geo, &lockf) > 0 {
        return Err(VnvmError::Busy(dir.to_path_buf()));
    }
    let r = recover_locked(dir);
    // Any shared-memory object left by dead users is stale now.
    if let Ok(Some(s)) = crate::shm::Shm::open(dir, &geo) {
        s.unlink();
    }
    // So are the dirty bitmaps of the shared regions they used.
    for s in 0..crate::shm::MAX_SHARED {
        crate::shm::Bitmaps::unlink_name(dir, s);
    }
    r
}
