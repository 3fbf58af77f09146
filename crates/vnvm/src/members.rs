//! The users of an instance (thesis §2.4.1–2.4.2): joining, the equal-share policy, leaving,
//! and reclaiming what a process that died (kill -9) held, so that it corrupts and blocks
//! nobody.
//!
//! Joining and leaving hold the instance's flock; so does reaping. A user is dead when its
//! slot's OFD lock is free (see `shm`). Reaping a dead user is recovery restricted to it:
//! write its dirty cache pages back to its private files, replay its committed list in order,
//! fdatasync, clear its page objects, list and file records, then free its log pages, log
//! objects and cache pages and drop it from the shared regions it used.

use super::*;
use crate::shm::{Res, SLOT_LIVE};
use std::collections::HashSet;

impl Inner {
    /// This process's slot in the shared-memory object.
    pub(crate) fn me(&self) -> &shm::AppSlot {
        self.shm.app(self.slot)
    }

    /// A log page for `nv_write`, within this process's equal share.
    pub(crate) fn take_log_page(&self) -> Option<u32> {
        self.shm.take_one(Res::Log, self.slot)
    }

    /// Whether [`Inner::take_log_page`] could succeed now.
    pub(crate) fn log_page_available(&self) -> bool {
        self.shm.free_count(Res::Log) > 0
            && self.me().log_held.load(Ordering::Relaxed) < self.shm.share(Res::Log)
    }

    /// Top up the redo worker's reserve of free cache pages from the shared free list, within
    /// the equal share.
    pub(crate) fn refill_cache(&self, c: &mut CacheState) {
        if c.free.is_empty() {
            self.shm.take(Res::Cache, self.slot, 64, &mut c.free);
        }
    }

    /// Cache pages held beyond the equal share (a user joined).
    pub(crate) fn over_share(&self) -> u32 {
        self.me()
            .cache_held
            .load(Ordering::Relaxed)
            .saturating_sub(self.shm.share(Res::Cache))
    }

    /// Give cache pages beyond the equal share back to the shared free list: the reserve
    /// first, then clean pages from the LRU tail (thesis: the writeback worker returns extra
    /// pages when a new user joins).
    pub(crate) fn release_over_share(&self) {
        let excess = self.over_share() as usize;
        if excess == 0 {
            return;
        }
        let mut give = Vec::new();
        {
            let mut c = self.cstate.lock();
            while give.len() < excess {
                let Some(p) = c.free.pop() else { break };
                give.push(p);
            }
            while give.len() < excess {
                let p = c.clean.tail;
                if p == NIL {
                    break;
                }
                c.unlink(p);
                if let Some(k) = c.key[p as usize].take() {
                    c.map.remove(&k);
                }
                c.state[p as usize] = PState::Free;
                give.push(p);
            }
        }
        self.shm.free(Res::Cache, self.slot as u8 + 1, &give);
    }

    /// Leave the instance (nv_release, workers stopped, instance flock held): write every
    /// dirty page back, leave the shared regions, delete this process's file records, return
    /// its pages, reap dead users, and — the last user — mark the instance cleanly shut down
    /// and remove the shared-memory object.
    pub(crate) fn leave(&self) -> Result<()> {
        self.writeback(WbTarget::All)?;
        let regions: Vec<Arc<RegionInner>> =
            self.regions.read().iter().flatten().cloned().collect();
        for r in &regions {
            if r.shared.is_some() {
                self.leave_shared(r)?;
            }
        }
        let app = self.slot as u32 + 1;
        let cache_pages = self.shm.owned_by(Res::Cache, app as u8);
        for &p in &cache_pages {
            clear_cache_rec(&self.meta, &self.geo, p);
            self.meta
                .flush(self.geo.cache_word_off(p), CACHE_OBJ_SIZE as usize)?;
        }
        self.meta.fence();
        for r in &regions {
            if r.shared.is_none() {
                store_word_persist(&self.meta, self.geo.file_off(r.file_id), 0)?;
            }
        }
        self.regions.write().iter_mut().for_each(|r| *r = None);
        {
            let _g = self.shm.lock();
            for r in [Res::Log, Res::Obj, Res::Cache] {
                let items = self.shm.owned_by(r, app as u8);
                self.shm.free_locked(r, app as u8, &items);
            }
        }
        self.shm.wake_log_waiters();
        self.reap_dead_locked()?;
        if self.shm.leave(self.slot) == 0 {
            store_word_persist(&self.meta, STATE_OFF, STATE_CLEAN)?;
            self.shm.unlink();
        }
        Ok(())
    }

    /// Reap users that died without leaving (if the instance flock is free now; otherwise a
    /// joiner or leaver holds it and will reap them).
    pub(crate) fn reap_dead(&self) -> Result<()> {
        let dead = |s: usize| {
            s != self.slot
                && self.shm.app(s).state.load(Ordering::Acquire) == SLOT_LIVE
                && !shm::slot_alive(&self.lockf, s)
        };
        if !(0..shm::MAX_APPS).any(dead) {
            return Ok(());
        }
        if !flock_exclusive(&self.lockf, false) {
            return Ok(());
        }
        let r = self.reap_dead_locked();
        flock_release(&self.lockf);
        r
    }

    /// [`Inner::reap_dead`] with the instance flock held.
    pub(crate) fn reap_dead_locked(&self) -> Result<()> {
        for s in 0..shm::MAX_APPS {
            if s != self.slot
                && self.shm.app(s).state.load(Ordering::Acquire) == SLOT_LIVE
                && !shm::slot_alive(&self.lockf, s)
            {
                self.reclaim(s)?;
            }
        }
        Ok(())
    }

    /// Reclaim everything dead user `s` held (the caller holds the instance flock).
    fn reclaim(&self, s: usize) -> Result<()> {
        let app = s as u32 + 1;
        let records = load_records(&self.meta, &self.geo)?;
        let mine: Vec<&FileRecord> = records
            .values()
            .filter(|r| r.owner == app && r.mode != Mode::Shared.to_raw())
            .collect();
        let ids: HashSet<u32> = mine.iter().map(|r| r.id).collect();
        let mut files: HashMap<u32, (File, PathBuf)> = HashMap::new();
        for r in &mine {
            let path = resolve(&self.dir, &r.path);
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| io_err("open a dead user's file", &path, e))?;
            files.insert(r.id, (f, path));
        }
        let ps = self.geo.page_size as u64;
        let chunk = self.geo.chunk();
        let cache_pages = self.shm.owned_by(Res::Cache, app as u8);
        // Validate everything before writing: its committed list (entries and their CRCs),
        // then its dirty pages against their CRCs.
        let check = |f: u32, o: u64, l: u32| -> std::result::Result<(), String> {
            match records.get(&f) {
                Some(r) if ids.contains(&f) && o + l as u64 <= r.size => Ok(()),
                _ => Err(format!(
                    "entry {f}:{o}+{l} outside app {app}'s private files"
                )),
            }
        };
        let mut seen = HashSet::new();
        let mut txs = Vec::new();
        for (idx, obj) in committed_list(&self.meta, &self.geo, s as u32)? {
            txs.push(tx_entries(
                &self.meta, &self.log, &self.geo, idx, &obj, &mut seen, &check,
            )?);
        }
        let listed = listed_writes(&self.log, txs.iter().flatten(), self.geo.page_size);
        let mut dirty = Vec::new();
        for &p in &cache_pages {
            let crec = load_cache_rec(&self.meta, &self.geo, p)?;
            let Some((f, idx, true)) = cache_unword(crec.word) else {
                continue;
            };
            check_cache_page(&self.cache, &self.geo, p, (f, idx), &crec, &listed)?;
            dirty.push((p, f, idx, crec.mask));
        }
        // What each file receives, in order: (1) the valid chunks of its dirty cache pages,
        // (2) its committed list, oldest first.
        let mut patches: HashMap<u32, Vec<crate::sums::Patch<'_>>> = HashMap::new();
        let mut in_dirty: HashSet<(u32, u64)> = HashSet::new();
        for &(p, f, idx, mask) in &dirty {
            let (Some(_), Some(rec)) = (files.get(&f), records.get(&f)) else {
                return Err(VnvmError::Damaged {
                    path: self.meta.path().to_path_buf(),
                    what: format!("cache page object {p}"),
                    offset: self.geo.cache_word_off(p),
                    detail: format!("dirty page of file {f}, not a private file of app {app}"),
                });
            };
            for (c, n) in mask_runs(mask) {
                let start = idx * ps + c as u64 * chunk;
                if start >= rec.size {
                    break;
                }
                let len = (n as u64 * chunk).min(rec.size - start) as usize;
                let data = pool_slice(&self.cache, p as u64 * ps + c as u64 * chunk, len);
                patches.entry(f).or_default().push(crate::sums::Patch {
                    offset: start,
                    data,
                });
            }
            in_dirty.extend(crate::sums::units_of(idx * ps, ps).map(|u| (f, u)));
        }
        for e in txs.iter().flatten() {
            let data = pool_slice(&self.log, e.log_off, e.len as usize);
            patches
                .entry(e.file_id)
                .or_default()
                .push(crate::sums::Patch {
                    offset: e.offset,
                    data,
                });
        }
        // (3) rebuilt as recovery does (`sums::rebuild`): every file verified first, then
        // checksummed before written, and synced.
        let mut ids_sorted: Vec<u32> = files.keys().copied().collect();
        ids_sorted.sort_unstable();
        let mut tables = HashMap::new();
        for &id in &ids_sorted {
            if let Some(t) = crate::sums::SumTable::open(&files[&id].1, true, true, self.perm)? {
                tables.insert(id, t);
            }
        }
        let in_dirty = &in_dirty;
        let unverifiable = |id: u32| move |u: u64| in_dirty.contains(&(id, u));
        for pass in [false, true] {
            for &id in &ids_sorted {
                let ((f, path), Some(rec)) = (&files[&id], records.get(&id)) else {
                    continue; // cannot happen: `files` holds records' ids
                };
                let ps = patches.get(&id).map(|v| &v[..]).unwrap_or(&[]);
                if pass {
                    let t = tables.get_mut(&id);
                    crate::sums::rebuild(path, f, rec.size, t, ps, &unverifiable(id))?;
                } else {
                    let t = tables.get(&id);
                    crate::sums::verify_patched(path, f, rec.size, t, ps, &unverifiable(id))?;
                }
            }
        }
        // (4) forget: page objects, its committed list, its file records
        for &p in &cache_pages {
            clear_cache_rec(&self.meta, &self.geo, p);
            self.meta
                .flush(self.geo.cache_word_off(p), CACHE_OBJ_SIZE as usize)?;
        }
        self.meta.fence();
        store_domain_persist(&self.meta, &self.geo, s as u32, 0)?;
        for id in &ids {
            store_word_persist(&self.meta, self.geo.file_off(*id), 0)?;
        }
        // (5) the shared regions it used
        self.drop_dead_from_shared(s)?;
        // (6) its pages and log objects, then its slot
        {
            let _g = self.shm.lock();
            for r in [Res::Log, Res::Obj, Res::Cache] {
                let items = self.shm.owned_by(r, app as u8);
                self.shm.free_locked(r, app as u8, &items);
            }
        }
        self.shm.wake_log_waiters();
        self.shm.leave(s);
        Ok(())
    }
}
