//! Shared mode (thesis §2.4.4): regions that several processes map at once.
//!
//! * The DRAM cache is the backing file itself, `MAP_SHARED` (read-only view for the
//!   application, writable view for vnvm), so all processes see one page cache. There is no
//!   NVM write cache on this path.
//! * Each shared region has its own persistent committed list (domain `MAX_APPS + slot`) and a
//!   robust mutex in the shared-memory object. A commit, holding it: log object, fence, link
//!   (one 8-byte store + persist), apply the entries to the shared mapping, set the pages' bits
//!   in the region's dirty bitmap (the transaction's local bitmap merged into the global one).
//! * The flush (any user's redo worker, past a threshold, when a writer waits for log space,
//!   periodically, and at `nv_free`/`nv_release`): under the mutex, move the bitmap into the
//!   flush bitmap and mark the list's tail; without it, msync the marked pages (new commits
//!   proceed meanwhile); under it again, drop the logs from the head to the marked tail and
//!   clear the flush bitmap. A flusher that dies leaves its flush bitmap for the next one.
//! * A process that dies holding the region's mutex (in a commit or a flush's critical
//!   section) is repaired by the next locker: it replays the whole committed list into the
//!   page cache (pwrite of the backing file, so it need not map the region), marks those pages
//!   dirty in the bitmap and frees log pages and objects the list does not reach.

use super::*;
use crate::shm::{Bitmaps, Res, OWNER_SHARED_BASE};
use std::collections::HashSet;
use std::os::unix::fs::FileExt;

/// A region's place in the shared-memory object.
pub(crate) struct SharedRef {
    /// Shared-region slot.
    pub slot: usize,
    /// Its committed-list domain.
    pub domain: u32,
    /// Its dirty bitmaps.
    pub bm: Bitmaps,
}

/// The committed-list domain of shared slot `s`.
pub(crate) fn shared_domain(s: usize) -> u32 {
    shm::MAX_APPS as u32 + s as u32
}

impl Inner {
    /// Log pages of a region's committed list past which a commit asks for a flush.
    fn flush_threshold(&self) -> u32 {
        (self.shm.share(Res::Log) / 4).max(1)
    }

    /// Commit `tx` (all of whose writes lie in one shared region) into the region's committed
    /// list and apply it to the shared mapping. Returns the bytes applied.
    pub(crate) fn commit_shared(
        &self,
        tx: &Tx,
        tid: Tid,
        idx: u32,
        entries: &[Entry],
    ) -> Result<u64> {
        let r = &tx.regions[0];
        let sr = r.shared.as_ref().expect("a shared region");
        let ps = self.geo.page_size as u64;
        let n = tx.pages.len() as u32;
        {
            let _g = self
                .shm
                .lock_shared(sr.slot, || self.repair_shared(sr.slot));
            let woff = self.geo.domain_off(sr.domain);
            let (head, tail) = domain_unword(load_word(&self.meta, woff));
            // The pages belong to the region's list from now on: a flush, by any user, frees
            // them. (Dying between this and the link leaves them unreachable: the repair of the
            // region's mutex frees them.)
            let owner = OWNER_SHARED_BASE + sr.slot as u8;
            self.shm.transfer(Res::Log, &tx.pages, self.slot, owner);
            self.shm.transfer(Res::Obj, &[idx], self.slot, owner);
            let obj = LogObj {
                tid,
                prev: tail,
                first_page: tx.pages[0],
                npages: n,
                domain: sr.domain,
                app_id: self.slot as u32 + 1,
                start_ns: tx.start_ns,
            };
            let ooff = self.geo.logobj_off(idx);
            self.meta.write(ooff, &obj.encode())?;
            self.meta.flush(ooff, LOGOBJ_SIZE as usize)?;
            // Every log entry and the log object are durable after this fence.
            self.meta.fence();
            let head = if head == 0 { idx + 1 } else { head };
            store_domain_persist(&self.meta, &self.geo, sr.domain, domain_word(head, idx + 1))?;
            // Only now is the data visible, in every process's mapping.
            let bits = sr.bm.bits();
            let mut bytes = 0u64;
            for e in entries {
                // SAFETY: the entry lies in the log pool (parsed from our own pages) and in the
                // region (bounds-checked by nv_write); the writable view is mapped.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.log.data_ptr().add(e.log_off as usize),
                        r.dram.wview.add(e.offset as usize),
                        e.len as usize,
                    )
                };
                for pg in e.offset / ps..=(e.offset + e.len as u64 - 1) / ps {
                    bits[(pg / 64) as usize].fetch_or(1 << (pg % 64), Ordering::Relaxed);
                }
                bytes += e.len as u64;
            }
            let pending = self
                .shm
                .shared(sr.slot)
                .pending_pages
                .fetch_add(n, Ordering::Relaxed)
                + n;
            if pending >= self.flush_threshold() {
                self.flush_req.store(true, Ordering::SeqCst);
            }
            Ok(bytes)
        }
    }

    /// The log pages of a committed transaction (its chain).
    fn obj_pages(&self, obj: &LogObj, out: &mut Vec<u32>) {
        let ps = self.geo.page_size as u64;
        let mut page = obj.first_page;
        for k in 0..obj.npages {
            out.push(page);
            if k + 1 < obj.npages {
                let next = u32_at(pool_slice(&self.log, page as u64 * ps, LOG_HDR), 4);
                page = next.wrapping_sub(1);
            }
        }
    }

    /// Flush shared region `r`: msync what was committed, then drop those logs. With `wait`
    /// false, returns `Ok(false)` at once when another live process is flushing it.
    pub(crate) fn flush_shared(&self, r: &RegionInner, wait: bool) -> Result<bool> {
        let sr = r.shared.as_ref().expect("a shared region");
        let slot = self.shm.shared(sr.slot);
        let me = self.slot as u32 + 1;
        let ps = self.geo.page_size as usize;
        let woff = self.geo.domain_off(sr.domain);
        let marked = loop {
            let g = self
                .shm
                .lock_shared(sr.slot, || self.repair_shared(sr.slot));
            let f = slot.flushing.load(Ordering::Acquire);
            if f != 0 && f != me && shm::slot_alive(&self.lockf, f as usize - 1) {
                drop(g);
                if !wait {
                    return Ok(false);
                }
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            slot.flushing.store(me, Ordering::Release);
            for (b, fb) in sr.bm.bits().iter().zip(sr.bm.flushing()) {
                let v = b.swap(0, Ordering::AcqRel);
                if v != 0 {
                    fb.fetch_or(v, Ordering::AcqRel);
                }
            }
            break domain_unword(load_word(&self.meta, woff)).1;
        };
        // msync the marked pages while new commits go on.
        let fl = sr.bm.flushing();
        let mut res = Ok(());
        let mut run: Option<(usize, usize)> = None;
        let npages = r.size.div_ceil(ps as u64) as usize;
        for pg in 0..=npages {
            let set = pg < npages && fl[pg / 64].load(Ordering::Relaxed) & (1 << (pg % 64)) != 0;
            match (set, run) {
                (true, None) => run = Some((pg, pg + 1)),
                (true, Some((s, _))) => run = Some((s, pg + 1)),
                (false, Some((s, e))) => {
                    if let Err(e) = r.dram.sync_range(s * ps, (e - s) * ps) {
                        res = Err(io_err("msync shared region", &r.path, e));
                        break;
                    }
                    run = None;
                }
                (false, None) => {}
            }
        }
        let mut pages = Vec::new();
        let mut objs = Vec::new();
        {
            let _g = self
                .shm
                .lock_shared(sr.slot, || self.repair_shared(sr.slot));
            if res.is_ok() && marked != 0 {
                let list = committed_list(&self.meta, &self.geo, sr.domain)?;
                if let Some(k) = list.iter().position(|(i, _)| i + 1 == marked) {
                    let tail = domain_unword(load_word(&self.meta, woff)).1;
                    let word = if k + 1 == list.len() {
                        0
                    } else {
                        domain_word(list[k + 1].0 + 1, tail)
                    };
                    store_domain_persist(&self.meta, &self.geo, sr.domain, word)?;
                    for (i, o) in &list[..=k] {
                        objs.push(*i);
                        self.obj_pages(o, &mut pages);
                    }
                }
            }
            if res.is_ok() {
                for w in fl {
                    w.store(0, Ordering::Relaxed);
                }
            }
            slot.pending_pages.fetch_sub(
                (pages.len() as u32).min(slot.pending_pages.load(Ordering::Relaxed)),
                Ordering::Relaxed,
            );
            slot.flushing.store(0, Ordering::Release);
        }
        self.shm.free(Res::Obj, &objs);
        self.shm.free(Res::Log, &pages);
        let me = self.me();
        me.applied.fetch_add(objs.len() as u64, Ordering::Relaxed);
        me.flushes.fetch_add(1, Ordering::Relaxed);
        res.map(|()| true)
    }

    /// Flush every shared region of this process that has logs (redo worker; `force`: even
    /// below the threshold).
    pub(crate) fn flush_shared_regions(&self, force: bool) -> Result<()> {
        let shared: Vec<Arc<RegionInner>> = self
            .regions
            .read()
            .iter()
            .flatten()
            .filter(|r| r.shared.is_some())
            .cloned()
            .collect();
        for r in shared {
            let sr = r.shared.as_ref().expect("shared");
            let pending = self
                .shm
                .shared(sr.slot)
                .pending_pages
                .load(Ordering::Relaxed);
            if pending > 0 && (force || pending >= self.flush_threshold()) {
                self.flush_shared(&r, false)?;
            }
        }
        Ok(())
    }

    /// Repair shared slot `s` after its mutex's holder died (called holding the mutex).
    /// Failures are recorded as a worker error (the caller cannot propagate them from here).
    pub(crate) fn repair_shared(&self, s: usize) {
        if let Err(e) = self.replay_shared(s) {
            *self.worker_error.lock() = Some(format!("repair of shared region slot {s}: {e}"));
        }
    }

    /// Replay shared slot `s`'s committed list into the backing file's page cache (pwrite),
    /// mark the pages dirty in its bitmap, and free the log pages and objects of the slot that
    /// the list does not reach. Returns the backing file (for a final fdatasync). The caller
    /// holds the slot's mutex.
    pub(crate) fn replay_shared(&self, s: usize) -> Result<Option<File>> {
        let slot = self.shm.shared(s);
        let f = slot.file.load(Ordering::Acquire);
        if f == 0 {
            return Ok(None);
        }
        let file_id = f - 1;
        let records = load_records(&self.meta, &self.geo)?;
        let Some(rec) = records.get(&file_id) else {
            return Ok(None);
        };
        let path = resolve(&self.dir, &rec.path);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io_err("open shared region for repair", &path, e))?;
        let size = rec.size;
        let check = move |fid: u32, o: u64, l: u32| -> std::result::Result<(), String> {
            if fid != file_id || o + l as u64 > size {
                return Err(format!(
                    "entry {fid}:{o}+{l} outside shared region {file_id}"
                ));
            }
            Ok(())
        };
        let dom = shared_domain(s);
        let list = committed_list(&self.meta, &self.geo, dom)?;
        let ps = self.geo.page_size as u64;
        let bm = Bitmaps::open(
            &self.dir,
            s,
            slot.pages.load(Ordering::Relaxed),
            false,
            self.perm,
        )?;
        let mut seen = HashSet::new();
        let mut objs = HashSet::new();
        for (idx, obj) in &list {
            let es = tx_entries(
                &self.meta, &self.log, &self.geo, *idx, obj, &mut seen, &check,
            )?;
            for e in es {
                file.write_all_at(pool_slice(&self.log, e.log_off, e.len as usize), e.offset)
                    .map_err(|err| io_err("replay shared log", &path, err))?;
                for pg in e.offset / ps..=(e.offset + e.len as u64 - 1) / ps {
                    bm.bits()[(pg / 64) as usize].fetch_or(1 << (pg % 64), Ordering::Relaxed);
                }
            }
            objs.insert(*idx);
        }
        let owner = OWNER_SHARED_BASE + s as u8;
        let lost: Vec<u32> = self
            .shm
            .owned_by(Res::Log, owner)
            .into_iter()
            .filter(|p| !seen.contains(p))
            .collect();
        self.shm.free(Res::Log, &lost);
        let lost: Vec<u32> = self
            .shm
            .owned_by(Res::Obj, owner)
            .into_iter()
            .filter(|o| !objs.contains(o))
            .collect();
        self.shm.free(Res::Obj, &lost);
        slot.pending_pages
            .store(seen.len() as u32, Ordering::Relaxed);
        Ok(Some(file))
    }

    /// Stop using shared region `r` (nv_free / nv_release): flush it; the last user also
    /// empties its committed list, deletes its file record and frees its slot.
    pub(crate) fn leave_shared(&self, r: &RegionInner) -> Result<()> {
        let sr = r.shared.as_ref().expect("a shared region");
        self.flush_shared(r, true)?;
        let bit = 1u32 << self.slot;
        let slot = self.shm.shared(sr.slot);
        loop {
            let _g = self
                .shm
                .lock_shared(sr.slot, || self.repair_shared(sr.slot));
            let last = {
                let _i = self.shm.lock();
                slot.users.load(Ordering::Relaxed) == bit
            };
            if last {
                let woff = self.geo.domain_off(sr.domain);
                if load_word(&self.meta, woff) != 0 {
                    // Commits of others that left in the meantime: flush again.
                    drop(_g);
                    self.flush_shared(r, true)?;
                    continue;
                }
                store_word_persist(&self.meta, self.geo.file_off(r.file_id), 0)?;
                let _i = self.shm.lock();
                slot.users.store(0, Ordering::Relaxed);
                slot.file.store(0, Ordering::Release);
                sr.bm.unlink();
            } else {
                let _i = self.shm.lock();
                slot.users.fetch_and(!bit, Ordering::Relaxed);
            }
            return Ok(());
        }
    }

    /// Remove dead app `dead` from every shared region; a region left without users is
    /// finalized: its list replayed into the file, fdatasynced and dropped, its record deleted.
    /// The caller holds the instance flock.
    pub(crate) fn drop_dead_from_shared(&self, dead: usize) -> Result<()> {
        let bit = 1u32 << dead;
        for s in 0..shm::MAX_SHARED {
            let slot = self.shm.shared(s);
            if slot.users.load(Ordering::Acquire) & bit == 0 {
                continue;
            }
            let _g = self.shm.lock_shared(s, || self.repair_shared(s));
            let left = {
                let _i = self.shm.lock();
                slot.users.fetch_and(!bit, Ordering::Relaxed) & !bit
            };
            if left != 0 || slot.file.load(Ordering::Acquire) == 0 {
                continue;
            }
            if let Some(file) = self.replay_shared(s)? {
                let fid = slot.file.load(Ordering::Acquire) - 1;
                file.sync_data()
                    .map_err(|e| io_err("fdatasync shared region", Path::new("?"), e))?;
                store_domain_persist(&self.meta, &self.geo, shared_domain(s), 0)?;
                let owner = OWNER_SHARED_BASE + s as u8;
                self.shm.free(Res::Log, &self.shm.owned_by(Res::Log, owner));
                self.shm.free(Res::Obj, &self.shm.owned_by(Res::Obj, owner));
                store_word_persist(&self.meta, self.geo.file_off(fid), 0)?;
                Bitmaps::unlink_name(&self.dir, s);
            }
            let _i = self.shm.lock();
            slot.pending_pages.store(0, Ordering::Relaxed);
            slot.flushing.store(0, Ordering::Relaxed);
            slot.file.store(0, Ordering::Release);
        }
        Ok(())
    }
}
