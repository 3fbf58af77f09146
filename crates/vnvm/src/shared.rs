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
//! * Invariant the repair and the finalization of a region rely on: whenever nobody holds the
//!   region's mutex, the log pages and objects the region owns (owner byte) are exactly those
//!   its committed list reaches. So a flush returns what it drops *before* it unlocks, and
//!   frees only what the region still owns.
//! * Joining (`nv_allocate`, under the instance mutex) and the last user's leaving are atomic
//!   with respect to each other: the leaver decides it is the last and finalizes the region
//!   (record, slot, bitmaps) in one section of the instance mutex, so a joiner either is seen
//!   (and the leaver only leaves) or finds no record (and creates the region afresh).
//! * Within a process, flushes of one region are serialized (`SharedRef::flush_mx`), and none
//!   runs after the process left the region (`SharedRef::left`).

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
    /// Serializes this process's flushes of the region (the redo worker's and `nv_free`'s).
    flush_mx: parking_lot::Mutex<()>,
    /// This process has left the region: its flushes are over.
    left: AtomicBool,
}

impl SharedRef {
    /// The region in shared slot `slot` with its bitmaps.
    pub(crate) fn new(slot: usize, bm: Bitmaps) -> SharedRef {
        SharedRef {
            slot,
            domain: shared_domain(slot),
            bm,
            flush_mx: parking_lot::Mutex::new(()),
            left: AtomicBool::new(false),
        }
    }
}

/// Test hooks: a closure registered for a named point of an instance (its directory) runs
/// once when the code passes that point for that instance.
#[cfg(test)]
pub(crate) mod hooks {
    use std::path::{Path, PathBuf};
    type Hook = Box<dyn FnOnce() + Send>;
    static HOOKS: parking_lot::Mutex<Vec<(&'static str, PathBuf, Hook)>> =
        parking_lot::Mutex::new(Vec::new());

    /// Run `f` the next time the code passes `point` for the instance in `dir`.
    pub(crate) fn set(point: &'static str, dir: &Path, f: impl FnOnce() + Send + 'static) {
        HOOKS.lock().push((point, dir.to_path_buf(), Box::new(f)));
    }

    pub(crate) fn run(point: &'static str, dir: &Path) {
        let h = {
            let mut g = HOOKS.lock();
            g.iter()
                .position(|(p, d, _)| *p == point && d == dir)
                .map(|k| g.remove(k).2)
        };
        if let Some(h) = h {
            h()
        }
    }
}

#[cfg(not(test))]
mod hooks {
    #[inline(always)]
    pub(crate) fn run(_point: &'static str, _dir: &std::path::Path) {}
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
    ///
    /// Errors: [`CommitFail::NotLinked`] when it failed before the transaction was linked (its
    /// pages and log object are still this process's: the caller frees them);
    /// [`CommitFail::Linked`] when the link's persist failed after the store (the transaction
    /// is in the region's list and applied, like a committed one).
    pub(crate) fn commit_shared(
        &self,
        tx: &Tx,
        tid: Tid,
        idx: u32,
        entries: &[Entry],
    ) -> std::result::Result<u64, CommitFail> {
        let r = &tx.regions[0];
        let Some(sr) = r.shared.as_ref() else {
            return Err(CommitFail::NotLinked(VnvmError::Inconsistent(format!(
                "commit_shared of transaction {tid} into private region {}",
                r.path.display()
            ))));
        };
        let ps = self.geo.page_size as u64;
        let n = tx.pages.len() as u32;
        let _g = self
            .shm
            .lock_shared(sr.slot, || self.repair_shared(sr.slot));
        let woff = self.geo.domain_off(sr.domain);
        let (head, tail) = domain_unword(load_word(&self.meta, woff));
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
        self.meta
            .write(ooff, &obj.encode())
            .and_then(|()| self.meta.flush(ooff, LOGOBJ_SIZE as usize))
            .map_err(|e| CommitFail::NotLinked(e.into()))?;
        // Every log entry and the log object are durable after this fence.
        self.meta.fence();
        // The pages belong to the region's list from now on: a flush, by any user, frees
        // them. (Dying between this and the link leaves them unreachable: the repair of the
        // region's mutex frees them.)
        let owner = OWNER_SHARED_BASE + sr.slot as u8;
        self.shm.transfer(Res::Log, &tx.pages, self.slot, owner);
        self.shm.transfer(Res::Obj, &[idx], self.slot, owner);
        let head = if head == 0 { idx + 1 } else { head };
        // The store links it whether or not the persist then fails: apply it either way.
        let linked =
            store_domain_persist(&self.meta, &self.geo, sr.domain, domain_word(head, idx + 1));
        // Only now is the data visible, in every process's mapping.
        let bits = sr.bm.bits();
        let mut bytes = 0u64;
        for e in entries {
            // SAFETY: the entry lies in the log pool (parsed from our own pages) and in the
            // region (checked against it by `entries_of`); the writable view is mapped.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.log.data_ptr().add(e.log_off as usize),
                    r.dram.wview.add(e.offset as usize),
                    e.len as usize,
                )
            };
            for pg in e.offset / ps..=(e.offset + e.len as u64 - 1) / ps {
                // cannot fail: pg is a page of the region (entries are checked against its
                // size) and the bitmap has a bit per region page.
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
        linked.map_err(CommitFail::Linked)?;
        Ok(bytes)
    }

    /// The log pages of committed transaction `idx` (its chain), validated: each in range and
    /// stamped with the transaction's tid (a page handed to another transaction is never
    /// taken for this one's).
    fn obj_pages(&self, idx: u32, obj: &LogObj, out: &mut Vec<u32>) -> Result<()> {
        let ps = self.geo.page_size as u64;
        let bad = |detail: String| {
            damaged(
                &self.meta,
                format!("log object {idx} (tid {})", obj.tid),
                self.geo.logobj_off(idx),
                detail,
            )
        };
        if obj.npages == 0 || obj.npages > self.geo.log_pages {
            return Err(bad(format!("page count {} out of range", obj.npages)));
        }
        let mut page = obj.first_page;
        for k in 0..obj.npages {
            if page >= self.geo.log_pages {
                return Err(bad(format!("log page {page} out of range")));
            }
            let hdr = pool_slice(&self.log, page as u64 * ps, LOG_HDR);
            if u64_at(hdr, 8) != obj.tid {
                return Err(bad(format!(
                    "log page {page} belongs to tid {}",
                    u64_at(hdr, 8)
                )));
            }
            out.push(page);
            if k + 1 < obj.npages {
                page = u32_at(hdr, 4).wrapping_sub(1);
            }
        }
        Ok(())
    }

    /// Flush shared region `r`: msync what was committed, then drop those logs. With `wait`
    /// false, returns `Ok(false)` at once when another live process (or another thread of
    /// this one) is flushing it. A region this process has left is not flushed (`Ok(true)`).
    pub(crate) fn flush_shared(&self, r: &RegionInner, wait: bool) -> Result<bool> {
        let Some(sr) = r.shared.as_ref() else {
            return Ok(true);
        };
        let _f = if wait {
            sr.flush_mx.lock()
        } else {
            match sr.flush_mx.try_lock() {
                Some(g) => g,
                None => return Ok(false),
            }
        };
        if sr.left.load(Ordering::Acquire) {
            return Ok(true);
        }
        self.flush_shared_locked(r, sr, wait)
    }

    /// [`Inner::flush_shared`] holding `sr.flush_mx`.
    fn flush_shared_locked(&self, r: &RegionInner, sr: &SharedRef, wait: bool) -> Result<bool> {
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
        let npages = (r.size.div_ceil(ps as u64) as usize).min(fl.len() * 64);
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
        let _g = self
            .shm
            .lock_shared(sr.slot, || self.repair_shared(sr.slot));
        let popped = if res.is_ok() && marked != 0 {
            self.pop_shared(sr, marked, &mut objs, &mut pages)
        } else {
            Ok(())
        };
        hooks::run("flush:popped", &self.dir);
        if res.is_ok() && popped.is_ok() {
            for w in fl {
                w.store(0, Ordering::Relaxed);
            }
        }
        slot.pending_pages.fetch_sub(
            (pages.len() as u32).min(slot.pending_pages.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        slot.flushing.store(0, Ordering::Release);
        // Returned before the region's mutex is unlocked (see the module docs): a repair or a
        // finalization that follows sees only what the list still reaches.
        let owner = OWNER_SHARED_BASE + sr.slot as u8;
        self.shm.free(Res::Obj, owner, &objs);
        self.shm.free(Res::Log, owner, &pages);
        drop(_g);
        let me = self.me();
        me.applied.fetch_add(objs.len() as u64, Ordering::Relaxed);
        me.flushes.fetch_add(1, Ordering::Relaxed);
        res.and(popped).map(|()| true)
    }

    /// Drop the region's committed list from its head to log object `marked - 1` (holding the
    /// region's mutex): the dropped objects and their pages go to `objs` and `pages`, to be
    /// freed by the caller before it unlocks. Nothing is dropped if a structure fails
    /// validation.
    fn pop_shared(
        &self,
        sr: &SharedRef,
        marked: u32,
        objs: &mut Vec<u32>,
        pages: &mut Vec<u32>,
    ) -> Result<()> {
        let woff = self.geo.domain_off(sr.domain);
        let list = committed_list(&self.meta, &self.geo, sr.domain)?;
        let Some(k) = list.iter().position(|(i, _)| i + 1 == marked) else {
            return Ok(());
        };
        let mut chain = Vec::new();
        for (i, o) in &list[..=k] {
            self.obj_pages(*i, o, &mut chain)?;
        }
        let tail = domain_unword(load_word(&self.meta, woff)).1;
        let word = match list.get(k + 1) {
            Some((next, _)) => domain_word(next + 1, tail),
            None => 0,
        };
        // The store drops them even if its persist fails: they are to be freed either way.
        let st = store_domain_persist(&self.meta, &self.geo, sr.domain, word);
        objs.extend(list[..=k].iter().map(|(i, _)| *i));
        pages.append(&mut chain);
        st
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
            let Some(sr) = r.shared.as_ref() else {
                continue;
            };
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
                    if let Some(w) = bm.bits().get((pg / 64) as usize) {
                        w.fetch_or(1 << (pg % 64), Ordering::Relaxed);
                    }
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
        self.shm.free(Res::Log, owner, &lost);
        let lost: Vec<u32> = self
            .shm
            .owned_by(Res::Obj, owner)
            .into_iter()
            .filter(|o| !objs.contains(o))
            .collect();
        self.shm.free(Res::Obj, owner, &lost);
        slot.pending_pages
            .store(seen.len() as u32, Ordering::Relaxed);
        Ok(Some(file))
    }

    /// Stop using shared region `r` (nv_free / nv_release): flush it; the last user also
    /// empties its committed list, deletes its file record and frees its slot. No flush of
    /// this process runs on the region afterwards.
    pub(crate) fn leave_shared(&self, r: &RegionInner) -> Result<()> {
        let Some(sr) = r.shared.as_ref() else {
            return Ok(());
        };
        // This process's other flushes of the region (its redo worker) wait, then find it left.
        let _f = sr.flush_mx.lock();
        if sr.left.load(Ordering::Acquire) {
            return Ok(());
        }
        self.flush_shared_locked(r, sr, true)?;
        let bit = 1u32 << self.slot;
        let slot = self.shm.shared(sr.slot);
        loop {
            let g = self
                .shm
                .lock_shared(sr.slot, || self.repair_shared(sr.slot));
            // One section of the instance mutex decides and finalizes: `nv_allocate` joins
            // under it, so no process can join between "I am the last" and the slot's release.
            let i = self.shm.lock();
            if slot.users.load(Ordering::Relaxed) != bit {
                slot.users.fetch_and(!bit, Ordering::Relaxed);
                break;
            }
            let woff = self.geo.domain_off(sr.domain);
            if load_word(&self.meta, woff) != 0 {
                // Commits of others that left in the meantime: flush again.
                drop(i);
                drop(g);
                self.flush_shared_locked(r, sr, true)?;
                continue;
            }
            hooks::run("leave:last", &self.dir);
            store_word_persist(&self.meta, self.geo.file_off(r.file_id), 0)?;
            slot.users.store(0, Ordering::Relaxed);
            slot.pending_pages.store(0, Ordering::Relaxed);
            slot.flushing.store(0, Ordering::Relaxed);
            slot.file.store(0, Ordering::Release);
            sr.bm.unlink();
            break;
        }
        sr.left.store(true, Ordering::Release);
        Ok(())
    }

    /// Remove dead app `dead` from every shared region; a region left without users is
    /// finalized: its list replayed into the file, fdatasynced and dropped, its record deleted.
    /// A process that joins the region meanwhile keeps it (replayed, its list intact). The
    /// caller holds the instance flock.
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
            // A flush it died in is over (its flush bitmap stays for the next flusher): the
            // mark must not outlive it, or a process that takes its user slot would look like
            // a live flusher forever and every other flush (and leave) would wait for it.
            let _ = slot.flushing.compare_exchange(
                dead as u32 + 1,
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
            if left != 0 || slot.file.load(Ordering::Acquire) == 0 {
                continue;
            }
            let Some(file) = self.replay_shared(s)? else {
                let _i = self.shm.lock();
                if slot.users.load(Ordering::Relaxed) == 0 {
                    slot.pending_pages.store(0, Ordering::Relaxed);
                    slot.flushing.store(0, Ordering::Relaxed);
                    slot.file.store(0, Ordering::Release);
                }
                continue;
            };
            let fid = slot.file.load(Ordering::Acquire) - 1;
            file.sync_data()
                .map_err(|e| io_err("fdatasync shared region", Path::new("?"), e))?;
            hooks::run("reap:replayed", &self.dir);
            // Finalize in one section of the instance mutex, unless somebody joined while the
            // list was replayed (then the region and its list live on: replaying is idempotent).
            let _i = self.shm.lock();
            if slot.users.load(Ordering::Relaxed) != 0 {
                continue;
            }
            store_domain_persist(&self.meta, &self.geo, shared_domain(s), 0)?;
            let owner = OWNER_SHARED_BASE + s as u8;
            for r in [Res::Log, Res::Obj] {
                self.shm.free_locked(r, owner, &self.shm.owned_by(r, owner));
            }
            store_word_persist(&self.meta, self.geo.file_off(fid), 0)?;
            Bitmaps::unlink_name(&self.dir, s);
            slot.pending_pages.store(0, Ordering::Relaxed);
            slot.flushing.store(0, Ordering::Relaxed);
            slot.file.store(0, Ordering::Release);
            drop(_i);
            self.shm.wake_log_waiters();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn cfg(dir: &Path) -> VnvmConfig {
        VnvmConfig {
            dir: dir.join("inst"),
            log_size: 64 * 4096,
            cache_size: 32 * 4096,
            max_tx_age: Duration::from_secs(600),
            max_files: 16,
            ..VnvmConfig::default()
        }
    }

    fn tmp() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("tiermem-vnvm-sharedtest")
            .tempdir_in("/dev/shm")
            .unwrap()
    }

    fn commit(vn: &Vnvm, r: &Region, off: usize, data: &[u8]) {
        let t = vn.nv_txbegin();
        // SAFETY: the tests keep off + data.len() inside the region.
        assert_eq!(
            vn.nv_write(t, unsafe { r.as_ptr().add(off) }, data)
                .unwrap(),
            data.len()
        );
        vn.nv_commit(t).unwrap();
    }

    /// A flush drops logs from the region's list and returns their pages and objects before
    /// it unlocks the region: a repair (after a process died holding the region's mutex) or a
    /// finalization that runs right after it must not find them owned-but-unlisted, free them
    /// and let them be taken again — the flush would then free them a second time, from their
    /// new holder.
    #[test]
    fn a_flush_returns_what_it_drops_before_unlocking_the_region() {
        let d = tmp();
        let c = cfg(d.path());
        let a = nv_init(&c).unwrap();
        let b = Arc::new(nv_init(&c).unwrap());
        let path = d.path().join("shared");
        let ra = a.nv_allocate(&path, 8192, Mode::Shared).unwrap();
        let rb = b.nv_allocate(&path, 8192, Mode::Shared).unwrap();
        let s = ra.0.shared.as_ref().unwrap().slot;
        let bslot = b.inner.slot as u8 + 1;
        let mut checked = false;
        // The redo workers flush periodically too: retry until a's flush is the one that
        // drops b's transaction.
        for _ in 0..50 {
            commit(&b, &rb, 0, b"one transaction");
            let (tx, rx) = mpsc::channel();
            let bi = b.inner.clone();
            hooks::set("flush:popped", &c.dir, move || {
                // Another user repairs the region (what the next locker does after a holder
                // died) and then takes every free log object, as committers would.
                let h = std::thread::spawn(move || {
                    let _g = bi.shm.lock_shared(s, || {});
                    bi.replay_shared(s).unwrap();
                    let mut got = Vec::new();
                    bi.shm.take(Res::Obj, bi.slot, u32::MAX, &mut got);
                    got
                });
                // Give it the time to run (it does at once if the region is unlocked).
                std::thread::sleep(Duration::from_millis(200));
                tx.send(h).unwrap();
            });
            let before = a.inner.me().applied.load(Ordering::Relaxed);
            a.inner.flush_shared(&ra.0, true).unwrap();
            let got = rx.recv().unwrap().join().unwrap();
            let popped = a.inner.me().applied.load(Ordering::Relaxed) > before;
            for &o in &got {
                assert_eq!(
                    a.inner.shm.owner(Res::Obj, o),
                    bslot,
                    "log object {o}, taken by b, was freed behind its back"
                );
            }
            b.inner.shm.free(Res::Obj, bslot, &got);
            if popped {
                checked = true;
                break;
            }
        }
        assert!(checked, "a's flush never dropped a transaction");
        a.nv_free(ra).unwrap();
        b.nv_free(rb).unwrap();
        a.nv_release().unwrap();
        Arc::try_unwrap(b).unwrap().nv_release().unwrap();
    }

    /// A process that joins a shared region while its last user leaves either joins before
    /// the leaver decides (which then only leaves) or after it finalized the region (and
    /// creates it afresh): never into a region whose record and slot the leaver then drops.
    #[test]
    fn joining_while_the_last_user_leaves_keeps_a_registered_region() {
        let d = tmp();
        let c = cfg(d.path());
        let a = nv_init(&c).unwrap();
        let b = Arc::new(nv_init(&c).unwrap());
        let path = d.path().join("shared");
        let ra = a.nv_allocate(&path, 8192, Mode::Shared).unwrap();
        commit(&a, &ra, 0, b"from a");
        let (tx, rx) = mpsc::channel();
        let (b2, p2) = (b.clone(), path.clone());
        hooks::set("leave:last", &c.dir, move || {
            let h = std::thread::spawn(move || b2.nv_allocate(&p2, 8192, Mode::Shared));
            // Give the join the time to run (at once if nothing holds the instance mutex).
            std::thread::sleep(Duration::from_millis(200));
            tx.send(h).unwrap();
        });
        a.nv_free(ra).unwrap();
        let rb = rx.recv().unwrap().join().unwrap().unwrap();
        assert_eq!(&region_bytes(&rb)[..6], b"from a");
        // b's region is registered: its record, and a slot naming it with b as a user.
        let recs = load_records(&b.inner.meta, &b.inner.geo).unwrap();
        assert!(
            recs.get(&rb.file_id())
                .is_some_and(|r| Path::new(&r.path).file_name() == path.file_name()),
            "b's region has no file record"
        );
        let sl = b.inner.shm.shared(rb.0.shared.as_ref().unwrap().slot);
        assert_eq!(sl.file.load(Ordering::Relaxed), rb.file_id() + 1);
        assert_ne!(sl.users.load(Ordering::Relaxed) & (1 << b.inner.slot), 0);
        // b commits and crashes: recovery finds its region and replays the commit.
        commit(&b, &rb, 100, b"from b");
        a.nv_release().unwrap();
        drop(rb);
        Arc::try_unwrap(b).unwrap().abandon();
        recover(&c.dir).unwrap();
        let f = std::fs::read(&path).unwrap();
        assert_eq!(&f[..6], b"from a");
        assert_eq!(&f[100..106], b"from b");
    }

    /// A process that joins a shared region while a survivor reaps its dead last user (and
    /// replays its list into the file) keeps the region: the reaper does not drop the record
    /// and slot under it.
    #[test]
    fn joining_while_a_dead_last_user_is_reaped_keeps_a_registered_region() {
        let d = tmp();
        let c = cfg(d.path());
        let a = nv_init(&c).unwrap();
        let b = nv_init(&c).unwrap();
        let joiner = Arc::new(nv_init(&c).unwrap());
        let path = d.path().join("shared");
        let ra = a.nv_allocate(&path, 8192, Mode::Shared).unwrap();
        commit(&a, &ra, 0, b"from a");
        let (tx, rx) = mpsc::channel();
        let (j2, p2) = (joiner.clone(), path.clone());
        hooks::set("reap:replayed", &c.dir, move || {
            let h = std::thread::spawn(move || j2.nv_allocate(&p2, 8192, Mode::Shared));
            std::thread::sleep(Duration::from_millis(200));
            tx.send(h).unwrap();
        });
        drop(ra);
        a.abandon();
        // b's or the joiner's redo worker reaps a within a period.
        let rj = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a was not reaped")
            .join()
            .unwrap()
            .unwrap();
        let t0 = std::time::Instant::now();
        while b.stats().users != 2 {
            assert!(t0.elapsed() < Duration::from_secs(20), "a was not reaped");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(&region_bytes(&rj)[..6], b"from a");
        let recs = load_records(&b.inner.meta, &b.inner.geo).unwrap();
        assert!(
            recs.get(&rj.file_id())
                .is_some_and(|r| Path::new(&r.path).file_name() == path.file_name()),
            "the joiner's region has no file record"
        );
        let sl = b.inner.shm.shared(rj.0.shared.as_ref().unwrap().slot);
        assert_eq!(sl.file.load(Ordering::Relaxed), rj.file_id() + 1);
        commit(&joiner, &rj, 100, b"joined");
        joiner.nv_free(rj).unwrap();
        b.nv_release().unwrap();
        Arc::try_unwrap(joiner).unwrap().nv_release().unwrap();
        let f = std::fs::read(&path).unwrap();
        assert_eq!(&f[..6], b"from a");
        assert_eq!(&f[100..106], b"joined");
    }

    /// A user that dies while flushing a shared region leaves its flusher mark; once it is
    /// reaped, a new process that takes its user slot must not look like that flusher: the
    /// others' flushes and leaves would wait for it forever.
    #[test]
    fn a_dead_flushers_mark_does_not_outlive_its_reaping() {
        let d = tmp();
        let c = cfg(d.path());
        let a = nv_init(&c).unwrap();
        let b = Arc::new(nv_init(&c).unwrap());
        let path = d.path().join("shared");
        let ra = a.nv_allocate(&path, 8192, Mode::Shared).unwrap();
        let rb = b.nv_allocate(&path, 8192, Mode::Shared).unwrap();
        commit(&b, &rb, 0, b"before");
        let s = rb.0.shared.as_ref().unwrap().slot;
        let aslot = a.inner.slot;
        // a dies in the middle of a flush (its mark set, as the first section leaves it), and
        // no periodic flush of b's takes it over before a is reaped (none is pending).
        let sl = b.inner.shm.shared(s);
        sl.flushing.store(aslot as u32 + 1, Ordering::Release);
        sl.pending_pages.store(0, Ordering::Relaxed);
        drop(ra);
        a.abandon();
        let t0 = std::time::Instant::now();
        while b.stats().users != 1 {
            assert!(t0.elapsed() < Duration::from_secs(20), "a was not reaped");
            std::thread::sleep(Duration::from_millis(10));
        }
        // A new process takes a's user slot (the lowest free one).
        let newcomer = nv_init(&c).unwrap();
        assert_eq!(newcomer.inner.slot, aslot);
        // b can still flush and leave.
        let b2 = b.clone();
        let h = std::thread::spawn(move || b2.nv_free(rb));
        let t0 = std::time::Instant::now();
        while !h.is_finished() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "b's leave waits for a flusher that is not there"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        h.join().unwrap().unwrap();
        assert_eq!(&std::fs::read(&path).unwrap()[..6], b"before");
        newcomer.nv_release().unwrap();
        Arc::try_unwrap(b).unwrap().nv_release().unwrap();
    }

    fn region_bytes(r: &Region) -> Vec<u8> {
        let mut v = vec![0u8; r.len()];
        r.read(0, &mut v);
        v
    }
}
