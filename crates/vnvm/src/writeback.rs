//! The writeback worker: picks dirty cache pages from the LRU tail, writes them from the DRAM
//! cache to their backing files (checksum table entries first, see `sums`), fdatasyncs, and marks
//! the pages clean; retries while a device fails.

use super::*;

/// How often a failing writeback is retried (a full device may get space back).
pub(crate) const WB_RETRY: Duration = Duration::from_secs(1);

/// pwrite `len` bytes at `ptr` to `file` at `off`, retrying short writes and EINTR.
///
/// # Safety
/// `ptr..ptr + len` must be mapped and readable for the duration of the call.
pub(crate) unsafe fn pwrite_all(
    file: &File,
    ptr: *const u8,
    len: usize,
    off: u64,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut done = 0usize;
    while done < len {
        // SAFETY: the caller guarantees the source range is mapped.
        let n = unsafe {
            libc::pwrite(
                file.as_raw_fd(),
                ptr.add(done) as *const libc::c_void,
                len - done,
                (off + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        done += n as usize;
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum WbTarget {
    /// Until the dirty ratio is below the stop threshold (or space is found for redo).
    Threshold,
    /// Every dirty page.
    All,
    /// Every dirty page of one file.
    File(u32),
}

impl Inner {
    pub(crate) fn wb_loop(self: &Arc<Self>) {
        // Background work: yield the CPU to the application and the redo worker. SCHED_IDLE
        // runs it only on an otherwise idle CPU (nice 10 still took a share of a CPU the
        // application and the redo worker wanted); when the redo worker waits for space it is
        // idle itself, so the writeback worker then gets its CPU. Fallback: nice 19.
        // SAFETY: sched_setscheduler / setpriority on this thread's own id; failure is harmless.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::pid_t;
            let param = libc::sched_param { sched_priority: 0 };
            if libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) != 0 {
                libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
            }
        }
        loop {
            if self.wb_failing.load(Ordering::SeqCst) {
                // The last writeback failed (full or failing device): retry everything every
                // WB_RETRY until it succeeds (or the instance stops).
                {
                    let mut c = self.cstate.lock();
                    if self.kill.load(Ordering::SeqCst) || self.stop_wb.load(Ordering::SeqCst) {
                        c.wb_idle = true;
                        self.wb_idle_cv.notify_all();
                        return;
                    }
                    self.wb_cv.wait_for(&mut c, WB_RETRY);
                    if self.kill.load(Ordering::SeqCst) || self.stop_wb.load(Ordering::SeqCst) {
                        c.wb_idle = true;
                        self.wb_idle_cv.notify_all();
                        return;
                    }
                }
                match self.writeback(WbTarget::All) {
                    Ok(()) => {
                        *self.wb_error.lock() = None;
                        self.wb_failing.store(false, Ordering::SeqCst);
                    }
                    Err(e @ VnvmError::Io { .. }) => *self.wb_error.lock() = Some(e.to_string()),
                    Err(e) => {
                        *self.worker_error.lock() = Some(e.to_string());
                        return;
                    }
                }
                let c = self.cstate.lock();
                self.space_cv.notify_all();
                self.wb_idle_cv.notify_all();
                drop(c);
                continue;
            }
            // Pages beyond the equal share (a user joined) go back to the shared free list.
            self.release_over_share();
            let mut write = false;
            {
                let mut c = self.cstate.lock();
                loop {
                    if self.kill.load(Ordering::SeqCst) || self.stop_wb.load(Ordering::SeqCst) {
                        c.wb_idle = true;
                        self.wb_idle_cv.notify_all();
                        return;
                    }
                    if self.over_share() > 0 && (c.clean.len > 0 || !c.free.is_empty()) {
                        break; // give pages back first (top of the loop)
                    }
                    // Thresholds are fractions of this user's cache share (thesis §2.4.3).
                    let total = self.shm.share(shm::Res::Cache) as u64;
                    if c.need_space
                        || c.ndirty as u64 * 100 > self.cfg.writeback_start_pct as u64 * total
                        || (self.over_share() > 0 && c.clean.len == 0 && c.free.is_empty())
                    {
                        c.wb_idle = false;
                        write = true;
                        break;
                    }
                    if !c.wb_idle {
                        c.wb_idle = true;
                        self.wb_idle_cv.notify_all();
                    }
                    self.wb_cv.wait_for(&mut c, Duration::from_millis(200));
                }
            }
            if !write {
                continue;
            }
            if let Err(e) = self.writeback(WbTarget::Threshold) {
                if matches!(e, VnvmError::Io { .. }) {
                    // An I/O error (full device...): the pages stay dirty; retry later.
                    *self.wb_error.lock() = Some(e.to_string());
                    self.wb_failing.store(true, Ordering::SeqCst);
                    let mut c = self.cstate.lock();
                    c.wb_idle = true;
                    self.wb_idle_cv.notify_all();
                    self.space_cv.notify_all();
                    drop(c);
                    let _d = self.domains[0].lock();
                    self.applied_cv.notify_all();
                    continue;
                }
                *self.worker_error.lock() = Some(e.to_string());
                let mut c = self.cstate.lock();
                c.wb_idle = true;
                self.wb_idle_cv.notify_all();
                self.space_cv.notify_all();
                return;
            }
        }
    }

    /// Write dirty pages back (pwrite + fdatasync), then clear their dirty flags (persisted) and
    /// move them to the clean list.
    pub(crate) fn writeback(&self, target: WbTarget) -> Result<()> {
        const BATCH: usize = 64;
        // The copy of a run of pages being written (reused: a fresh one per batch was up to
        // 256 KiB, above malloc's mmap threshold, so every batch mapped, faulted in and
        // unmapped it).
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let total = self.shm.share(shm::Res::Cache) as u64;
            // Pick a batch from the LRU tail of the dirty list.
            let mut batch: Vec<(u32, (u32, u64), u64)> = Vec::new();
            {
                let mut c = self.cstate.lock();
                let enough = match target {
                    WbTarget::Threshold => {
                        c.ndirty as u64 * 100 <= self.cfg.writeback_stop_pct as u64 * total
                            && (!c.need_space || !c.free.is_empty() || c.clean.len > 0)
                            && (self.over_share() == 0 || c.clean.len > 0)
                    }
                    _ => false,
                };
                if enough {
                    c.need_space = false;
                    self.space_cv.notify_all();
                    return Ok(());
                }
                let mut p = c.dirty.tail;
                while p != NIL && batch.len() < BATCH {
                    let prev = c.prev[p as usize];
                    // cannot fail: a page is keyed before it becomes dirty, and unkeyed only
                    // when clean.
                    let key = c.key[p as usize].expect("dirty pages are mapped");
                    if match target {
                        WbTarget::File(f) => key.0 == f,
                        _ => true,
                    } {
                        batch.push((p, key, c.gen[p as usize]));
                    }
                    p = prev;
                }
                for &(p, _, _) in &batch {
                    c.unlink(p);
                    c.state[p as usize] = PState::Writing;
                }
                if batch.is_empty() {
                    let writing = |c: &CacheState| {
                        (0..c.state.len()).any(|p| {
                            c.state[p] == PState::Writing
                                && match (target, c.key[p]) {
                                    (WbTarget::File(f), Some(k)) => k.0 == f,
                                    (WbTarget::All, _) => true,
                                    _ => false,
                                }
                        })
                    };
                    if writing(&c) {
                        // Another writer has pages of this target in flight: wait for it.
                        self.space_cv.wait_for(&mut c, Duration::from_millis(20));
                        continue;
                    }
                    c.need_space = false;
                    self.space_cv.notify_all();
                    return Ok(());
                }
                // Sorted by (file, page) so that neighbours go out in one pwrite.
                batch.sort_unstable_by_key(|b| b.1);
            }
            // Write outside the lock.
            let res = self.write_batch(&batch, &mut buf);
            let mut c = self.cstate.lock();
            let mut cleaned = 0;
            let mut runs: Vec<(u64, u64)> = Vec::new();
            for &(p, (f, idx), gen) in &batch {
                if res.is_ok() && c.gen[p as usize] == gen {
                    let off = self.geo.cache_word_off(p);
                    // The record as published (mask, contents CRC) with the dirty bit cleared.
                    let mut rec = load_cache_rec(&self.meta, &self.geo, p)?;
                    rec.word = cache_word(f, idx, false);
                    store_cache_rec(&self.meta, &self.geo, p, &rec);
                    add_run(&mut runs, off, CACHE_OBJ_SIZE);
                    cleaned += 1;
                } else {
                    c.push_head(p, PState::Dirty);
                }
            }
            self.flush_meta_runs(&mut runs)?;
            if cleaned > 0 {
                self.meta.sync_deferred()?;
            }
            for &(p, _, gen) in &batch {
                if res.is_ok() && c.gen[p as usize] == gen {
                    c.push_head(p, PState::Clean);
                    c.ndirty -= 1;
                }
            }
            self.me()
                .pages_written_back
                .fetch_add(cleaned, Ordering::Relaxed);
            self.space_cv.notify_all();
            drop(c);
            res?;
        }
    }

    /// Write one writeback batch's pages (sorted by (file, page)) to their backing files and
    /// sync them. Runs of neighbouring pages go out with one `pwrite`. A private region's pages
    /// are copied first (`buf`, reused), so that the checksums are of exactly the bytes
    /// written (commits may change the DRAM page meanwhile), and the checksum table gets
    /// `{new, prev}` for each unit and is synced *before* the data are written (see `sums`: a
    /// crash anywhere leaves each unit at one of its two recorded contents).
    pub(crate) fn write_batch(
        &self,
        batch: &[(u32, (u32, u64), u64)],
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        let ps = self.geo.page_size as u64;
        // (region, first byte, bytes, where the copy is in `buf` if copied)
        let mut runs: Vec<(Arc<RegionInner>, u64, usize, Option<usize>)> = Vec::new();
        buf.clear();
        let mut k = 0;
        while k < batch.len() {
            let (f, idx) = batch[k].1;
            let mut run = 1;
            while k + run < batch.len() && batch[k + run].1 == (f, idx + run as u64) {
                run += 1;
            }
            let Some(r) = self.regions.read().get(f as usize).cloned().flatten() else {
                return Err(VnvmError::Inconsistent(format!(
                    "dirty cache page of file {f}, which this process has not allocated"
                )));
            };
            let start = idx * ps;
            let n = (ps * run as u64).min(r.size - start) as usize;
            // The pages go out from the DRAM cache: it holds every byte the NVM pages hold
            // (commit fills DRAM before the redo worker sees a transaction), plus possibly
            // newer committed data whose logs are still in the committed list.
            let at = r.sums.is_some().then(|| {
                let at = buf.len();
                // SAFETY: start + n lies within the region's DRAM mapping, which `r` keeps
                // alive (concurrent commits may change it: harmless, the copy is what is
                // written and checksummed). One copy, no zero-fill first.
                buf.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(r.dram.wview.add(start as usize), n)
                });
                at
            });
            runs.push((r, start, n, at));
            k += run;
        }
        // The copies may hold bytes of transactions staged but not linked yet (a commit copies
        // its data into DRAM before `sync_to` links it): link them before any copy reaches the
        // file, or a kill right after the write would leave part of a transaction that never
        // committed there (atomicity). The ticket is read under the domain lock, which a commit
        // holds while it copies into DRAM: every transaction whose bytes a copy can hold has
        // one at most this. (Shared regions' commits are linked before their data reaches the
        // mapping: nothing to do for their runs.)
        if runs.iter().any(|r| r.3.is_some()) {
            let staged = self.domains[0].lock().staged_ticket;
            self.sync_to(staged)?;
        }
        // The checksum tables first: `{crc of the copy, prev = crc of what the file holds}`.
        let mut tables: Vec<&RegionInner> = Vec::new();
        for (r, start, n, at) in &runs {
            let (Some(t), Some(at)) = (r.sums.as_ref(), at) else {
                continue;
            };
            let res = (|| {
                let data = &buf[*at..*at + *n];
                let first = start / sums::UNIT;
                let nunits = data.len().div_ceil(sums::UNIT as usize);
                let old = t.read_run(first, nunits)?;
                let unsure = r.sums_unsure.load(Ordering::Relaxed);
                let mut entries = Vec::with_capacity(nunits);
                let mut fb = [0u8; sums::UNIT as usize];
                for (u, b) in data.chunks(sums::UNIT as usize).enumerate() {
                    // What the file holds: the last entry's crc, which its writer synced (a
                    // unit is written back by one writer at a time) — unless a write failed
                    // since, or vnvm never wrote the unit: then read it.
                    let prev = match old[u] {
                        Some(s) if !unsure && s.len as usize == b.len() => s.crc,
                        _ => {
                            let fb = &mut fb[..b.len()];
                            let off = start + (u as u64) * sums::UNIT;
                            std::os::unix::fs::FileExt::read_exact_at(&r.file, fb, off)
                                .map_err(|e| io_err("read backing file", &r.path, e))?;
                            sums::unit_crc(fb)
                        }
                    };
                    entries.push((sums::unit_crc(b), b.len() as u32, Some(prev)));
                }
                t.put_run(first, &entries)
            })();
            if let Err(e) = res {
                r.sums_unsure.store(true, Ordering::Relaxed);
                return Err(e);
            }
            if !tables.iter().any(|x| x.file_id == r.file_id) {
                tables.push(r);
            }
        }
        for r in &tables {
            if let Some(t) = &r.sums {
                if let Err(e) = t.sync() {
                    r.sums_unsure.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        // Then the data, then fdatasync.
        let mut files: Vec<&RegionInner> = Vec::new();
        let mut res = Ok(());
        for (r, start, n, at) in &runs {
            let src: *const u8 = match at {
                Some(at) => buf[*at..].as_ptr(),
                // SAFETY: start lies within the region's DRAM mapping.
                None => unsafe { r.dram.wview.add(*start as usize) },
            };
            let wr = match self.cfg.writeback_fault {
                Some(errno) => Err(std::io::Error::from_raw_os_error(errno)),
                // SAFETY: src..src + n is mapped: the copy in `buf`, or the region's DRAM
                // mapping (which `r` keeps alive; the kernel reads it while commits may change
                // it: harmless).
                None => unsafe { pwrite_all(&r.file, src, *n, *start) },
            };
            if let Err(e) = wr {
                res = Err(io_err("write back cache pages", &r.path, e));
                break;
            }
            if !files.iter().any(|x| x.file_id == r.file_id) {
                files.push(r);
            }
        }
        if res.is_ok() {
            for r in &files {
                if let Err(e) = r.file.sync_data() {
                    res = Err(io_err("fdatasync", &r.path, e));
                    break;
                }
            }
        }
        if res.is_err() {
            // The file may hold either contents, or a mix across a run: the next writeback
            // of this region reads what the file holds instead of trusting the table.
            for (r, ..) in &runs {
                r.sums_unsure.store(true, Ordering::Relaxed);
            }
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writeback that runs between a commit's staging and its link writes a DRAM page that
    /// holds the staged transaction's bytes. A crash right after must not leave part of that
    /// transaction in the file: here its write into page 0 (dirty in the NVM cache, so
    /// written back) and its write into page 5 (not cached, not written back) come back
    /// together or not at all. Found by the multi-process soak: a worker's counter (page 0)
    /// of a transaction that never linked, without its data.
    #[test]
    fn a_writeback_never_leaves_part_of_a_staged_transaction_in_the_file() {
        let (_d, cfg, file) = crate::tests::small_disk_instance("tiermem-vnvm-wbstaged", false);
        let vn = nv_init(&cfg).unwrap();
        let r = vn.nv_allocate(&file, 8 * 4096, Mode::Private).unwrap();
        let write = |tid: Tid, off: usize, byte: u8| {
            crate::tests::write_fill(&vn, &r, tid, off, byte, 64);
        };
        // Page 0 becomes dirty in the NVM cache.
        let t1 = vn.nv_txbegin();
        write(t1, 0, 1);
        vn.nv_commit(t1).unwrap();
        vn.drain().unwrap();
        // Staged, not linked: page 0 (in DRAM now) and page 5.
        let t2 = vn.nv_txbegin();
        write(t2, 1024, 2);
        write(t2, 5 * 4096, 2);
        let ticket = vn.nv_commit_staged(t2).unwrap();
        assert!(ticket > vn.nv_durable_ticket(), "staged, not durable yet");
        vn.inner.writeback(WbTarget::All).unwrap();
        drop(r);
        vn.abandon();

        recover(&cfg.dir).unwrap();
        let got = std::fs::read(&file).unwrap();
        assert_eq!(got[..64], [1u8; 64], "the committed transaction");
        let (p0, p5) = (got[1024], got[5 * 4096]);
        assert!(
            (p0, p5) == (2, 2) || (p0, p5) == (0, 0),
            "the staged transaction is there in part: page 0 {p0:#x}, page 5 {p5:#x}"
        );
    }
}
