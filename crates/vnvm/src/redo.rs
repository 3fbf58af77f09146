//! The redo worker: takes batches of committed transactions, verifies their logs, applies their
//! entries to the NVM cache (whole lines streamed, edges with ordinary stores and their chunk
//! CRCs), publishes the cache page records, unlinks the batch from the committed list and frees
//! its logs; also `drain`, the abort of over-age transactions and the workers' panic guard.

use super::*;

/// The destination of a log entry in the NVM cache: cache page `page`, holding page `pidx` of
/// file `file_id`.
#[derive(Clone, Copy)]
struct Dst {
    page: u32,
    pidx: u64,
    file_id: u32,
}

impl Inner {
    pub(crate) fn drain(&self) -> Result<()> {
        // Staged commits first: they reach the queue when linked.
        self.sync_all()?;
        self.drain_wanted.store(true, Ordering::SeqCst);
        let r = self.drain_queues();
        self.drain_wanted.store(false, Ordering::SeqCst);
        r?;
        // Journal mode: the applied transactions' log space comes back with a barrier.
        if self.journal.is_some() {
            self.sync_all()?;
        }
        Ok(())
    }

    fn drain_queues(&self) -> Result<()> {
        for d in &self.domains {
            let mut g = d.lock();
            // Until every applied transaction's log pages are back (`pop` frees them after it
            // unlinks them): a caller that drains and then takes its share of the log must find
            // it free.
            while !g.queue.is_empty() || self.freeing.load(Ordering::SeqCst) > 0 {
                if let Some(e) = self.worker_error.lock().clone() {
                    return Err(VnvmError::CacheFull(format!("redo worker failed: {e}")));
                }
                if let Some(e) = self.wb_error.lock().clone() {
                    return Err(VnvmError::CacheFull(format!("the writeback fails: {e}")));
                }
                if self.stop_redo.load(Ordering::SeqCst) && self.kill.load(Ordering::SeqCst) {
                    return Err(VnvmError::CacheFull("instance abandoned".into()));
                }
                if let Some(t) = self.redo_thread.get() {
                    t.unpark();
                }
                self.applied_cv.wait_for(&mut g, Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Store bytes into a cache page and note what needs a write-back in `lines` (merged with
    /// the previous range when they touch) for one write-back pass before the fence. With
    /// `stream`, whole cache lines go out with non-temporal stores: the destination lines are
    /// not read first (a cache page is rarely in the CPU cache) and need no write-back, only
    /// the fence of `publish`; partial lines (and everything without `stream`: an edge chunk,
    /// which later entries of a batch often write again) use ordinary stores and are noted.
    /// (With a crash-model domain attached, the streamed lines are noted too, so that the
    /// model sees the stores.)
    pub(crate) fn cache_store(
        &self,
        at: u64,
        data: &[u8],
        stream: bool,
        lines: &mut Vec<(u64, u64)>,
    ) {
        const LINE: usize = 64;
        // cannot fail: callers store within one cache page (< cache_pages) of the pool.
        assert!(at as usize + data.len() <= self.cache.data_len());
        let dst = self.cache.data_ptr() as usize + at as usize;
        let len = data.len();
        let head = ((LINE - dst % LINE) % LINE).min(len);
        let body = if stream {
            (len - head) / LINE * LINE
        } else {
            0
        };
        let mut note = |from: usize, to: usize| {
            if from == to {
                return;
            }
            let (from, to) = (at + from as u64, at + to as u64);
            match lines.last_mut() {
                Some((s, e)) if from <= *e && to >= *s => {
                    *s = (*s).min(from);
                    *e = (*e).max(to);
                }
                _ => lines.push((from, to)),
            }
        };
        // SAFETY: bounds checked above (dst..dst + len lies in the cache pool's data area); the
        // page is owned by the redo worker under the cache lock; the body destination is
        // 64-byte aligned by construction of `head`; the source is a live slice.
        unsafe {
            let (d, src) = (dst as *mut u8, data.as_ptr());
            std::ptr::copy_nonoverlapping(src, d, head);
            if body > 0 {
                stream_lines(d.add(head), src.add(head), body);
            }
            std::ptr::copy_nonoverlapping(
                src.add(head + body),
                d.add(head + body),
                len - head - body,
            );
        }
        note(0, head);
        // Streamed lines need no write-back on a cache-flush pool, only the fence; on an
        // msync-backed one they are dirty file pages like the rest, for its fdatasync.
        if self.cache.domain_id().is_some() || self.cache.persist_method().is_msync() {
            note(head, head + body);
        }
        note(head + body, len);
    }

    /// Run a worker's loop; if it panics, record why in `worker_error` and wake every waiter, so
    /// `drain`, `quiesce` and committers report the failure instead of waiting forever.
    pub(crate) fn run_worker(self: &Arc<Self>, name: &str, body: impl FnOnce(&Arc<Self>)) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(self)));
        if let Err(p) = r {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            *self.worker_error.lock() = Some(format!("{name} worker panicked: {msg}"));
            self.applied_cv.notify_all();
            self.space_cv.notify_all();
            self.wb_idle_cv.notify_all();
        }
    }

    // ---- redo worker -------------------------------------------------------------------------

    pub(crate) fn redo_loop(self: &Arc<Self>) {
        let period =
            (self.cfg.max_tx_age / 4).clamp(Duration::from_millis(1), Duration::from_millis(200));
        let period_ns = period.as_nanos() as u64;
        let mut last_scan = tiermem_media::now_ns();
        let mut last_work = last_scan;
        let idle_after_ns = REDO_IDLE_AFTER.as_nanos() as u64;
        let mut entries = Vec::new();
        let mut jobs: Vec<(u32, Vec<u32>)> = Vec::new();
        // The last staged ticket seen and since when; the last batch's start.
        let mut staged_seen = (0, 0);
        let mut last_batch = 0;
        let msync = self.cache.persist_method().is_msync();
        let poll = if msync { REDO_POLL_MSYNC } else { REDO_POLL };
        let poll_ns = poll.as_nanos() as u64;
        loop {
            if self.kill.load(Ordering::SeqCst) {
                return;
            }
            // Commits staged and left unsynced for a whole poll (their committer syncs them
            // at once as a rule): link them, so that they become durable and their log space
            // comes back. A failure leaves them staged; the next committer's sync reports it.
            let staged = self.staged_ticket();
            let now = tiermem_media::now_ns();
            if staged != staged_seen.0 {
                staged_seen = (staged, now);
            } else if now.saturating_sub(staged_seen.1) >= poll_ns
                && staged > self.durable_seq.load(Ordering::SeqCst)
                && !self.cfg.redo_paused
            {
                let _ = self.sync_to(staged);
            }
            // Journal mode: log space unlinked a poll ago and not released by a barrier since.
            if self.journal.is_some()
                && now.saturating_sub(last_batch) >= poll_ns
                && !self.domains[0].lock().pending_free.is_empty()
            {
                let _ = self.sync_all();
            }
            // On msync-backed pools a batch costs a few device flushes whatever its size: take
            // one only when it is full, a poll after the last, or when someone waits (log
            // space, drain, release).
            if msync && !self.cfg.redo_paused {
                let queued = self.domains[0].lock().queue.len();
                let since = now.saturating_sub(last_batch);
                let urgent = self.flush_req.load(Ordering::SeqCst)
                    || self.stop_redo.load(Ordering::SeqCst)
                    || self.drain_wanted.load(Ordering::SeqCst);
                if queued > 0 && queued < self.redo_batch() && since < poll_ns && !urgent {
                    std::thread::park_timeout(Duration::from_nanos(poll_ns - since));
                    continue;
                }
            }
            // A batch: every committed transaction queued now (up to the batch size), applied
            // with one publish (fence, masks, dirty words) and unlinked with one store.
            jobs.clear();
            if !self.cfg.redo_paused {
                let d = self.domains[0].lock();
                jobs.extend(
                    d.queue
                        .iter()
                        .take(self.redo_batch())
                        .map(|c| (c.idx, c.pages.clone())),
                );
            }
            if !jobs.is_empty() {
                last_work = tiermem_media::now_ns();
                last_batch = last_work;
                entries.clear();
                // Checked at commit (entries of the transaction's regions); parsed again here.
                let any = |_: u32, _: u64, _: u32| Ok(());
                let parsed = jobs.iter().try_for_each(|(_, pages)| {
                    // cannot fail: a committed transaction has at least one page, in range.
                    let first = pool_slice(
                        &self.log,
                        pages[0] as u64 * self.geo.page_size as u64,
                        LOG_HDR,
                    );
                    // Verified: a damaged committed log stops the worker (recovery refuses it).
                    self.entries_of(u64_at(first, 8), pages, &mut entries, &any, true)
                });
                // cannot fail: `jobs` is not empty here.
                let last = jobs.last().map_or(0, |j| j.0);
                if let Err(e) = parsed
                    .and_then(|()| self.apply(&entries))
                    .and_then(|()| self.pop(jobs.len(), last))
                {
                    if !self.kill.load(Ordering::SeqCst) {
                        // Keep the first cause (a writeback failure explains this one).
                        self.worker_error.lock().get_or_insert(e.to_string());
                    }
                    let _g = self.domains[0].lock();
                    self.applied_cv.notify_all();
                    return;
                }
            } else {
                if self.stop_redo.load(Ordering::SeqCst) {
                    if self.cfg.redo_paused {
                        *self.worker_error.lock() =
                            Some("redo worker paused (test configuration)".into());
                        let _g = self.domains[0].lock();
                        self.applied_cv.notify_all();
                    }
                    return;
                }
                if tiermem_media::now_ns().saturating_sub(last_work) < idle_after_ns {
                    // Commits are coming: poll, so that they need not wake us.
                    std::thread::park_timeout(poll.min(period));
                } else {
                    // Idle: the long sleep (a full batch, a writer short of log space, drain
                    // or release wake it).
                    std::thread::park_timeout(period);
                }
            }
            let now = tiermem_media::now_ns();
            let periodic = now.saturating_sub(last_scan) >= period_ns;
            let wanted =
                self.flush_req.swap(false, Ordering::AcqRel) | self.shm.take_flush_wanted();
            if periodic || wanted {
                // Shared regions: flush past the threshold, or whatever is pending when a
                // writer waits for log space or a period has passed.
                if let Err(e) = self.flush_shared_regions(true) {
                    *self.worker_error.lock() = Some(e.to_string());
                    return;
                }
            }
            if periodic {
                last_scan = now;
                self.abort_old();
                if let Err(e) = self.reap_dead() {
                    *self.worker_error.lock() = Some(format!("reaping a dead user: {e}"));
                }
            }
        }
    }

    pub(crate) fn abort_old(&self) {
        let max = self.cfg.max_tx_age.as_nanos().min(u64::MAX as u128) as u64;
        let now = tiermem_media::now_ns();
        for ol in &self.open {
            let mut g = ol.lock();
            let mut freed = Vec::new();
            for tx in g.txs.values_mut() {
                if !tx.aborted_by_age && now.saturating_sub(tx.start_ns) > max {
                    tx.aborted_by_age = true;
                    freed.append(&mut tx.pages);
                    for r in tx.regions.drain(..) {
                        r.open_writers.fetch_sub(1, Ordering::SeqCst);
                    }
                    self.me().age_aborts.fetch_add(1, Ordering::Relaxed);
                }
            }
            // Freed before the open list is unlocked: whoever sees the abort sees the pages free.
            self.free_log_pages(&freed);
            drop(g);
        }
    }

    /// Apply committed transactions' entries (in commit order) to the NVM cache, then mark the
    /// touched pages dirty (data fenced first).
    ///
    /// The loop only stores: the cache lines it wrote are collected (adjacent ranges merged)
    /// and written back in one pass before the single fence of `publish`. A locked instruction
    /// (an `Arc` count, a lock) right after a line write-back waits for it to complete, so
    /// nothing between the stores and the fence takes a lock or touches a shared counter
    /// except a page miss that has to wait for space (which publishes first).
    pub(crate) fn apply(&self, entries: &[Entry]) -> Result<()> {
        let ps = self.geo.page_size as u64;
        let cs = self.geo.chunk();
        // Page and chunk sizes are powers of two (4 or 8 KiB; a 64th of that): shifts, not
        // divisions, per entry.
        let (ps_shift, cs_shift) = (ps.trailing_zeros(), cs.trailing_zeros());
        debug_assert!(ps.is_power_of_two() && cs.is_power_of_two());
        // Pages that become dirty with this batch, and every page it writes (their records
        // get a new mask and contents CRC).
        let mut touched: Vec<u32> = Vec::new();
        let mut grown: Vec<u32> = Vec::new();
        // Cache-pool ranges stored into and not yet written back.
        let mut dirty_lines: Vec<(u64, u64)> = Vec::new();
        // Regions whose DRAM caches fill edge chunks, looked up once per batch.
        let mut regions: Vec<Arc<RegionInner>> = Vec::new();
        for e in entries {
            if !regions.iter().any(|r| r.file_id == e.file_id) {
                let r = self
                    .regions
                    .read()
                    .get(e.file_id as usize)
                    .cloned()
                    .flatten();
                regions.push(r.ok_or_else(|| {
                    VnvmError::Inconsistent(format!(
                        "a committed log entry names file {}, which this process has not \
                         allocated",
                        e.file_id
                    ))
                })?);
            }
        }
        let mut written = 0u64;
        let mut c = self.cstate.lock();
        for (i, e) in entries.iter().enumerate() {
            // Ask for what entry i + AHEAD will touch now, so that its cache misses overlap
            // this entry's work: the first and last cache line it stores into (an edge chunk's
            // line is read) and its chunk sums. Entries mostly write cache pages that are not
            // in the CPU cache, and a read of one stalls the worker for a memory round trip.
            const AHEAD: usize = 8;
            if let Some(n) = entries.get(i + AHEAD) {
                if let Some(&p) = c.map.get(&(n.file_id, n.offset >> ps_shift)) {
                    let at = p as u64 * ps + (n.offset & (ps - 1));
                    let last = at + n.len.max(1) as u64 - 1;
                    let row = (p as usize * 64 + ((n.offset & (ps - 1)) >> cs_shift) as usize)
                        .min(c.sums.len().saturating_sub(1));
                    if last < self.cache.data_len() as u64 {
                        prefetch(self.cache.data_ptr().wrapping_add(at as usize));
                        prefetch(self.cache.data_ptr().wrapping_add(last as usize));
                    }
                    prefetch(c.sums.as_ptr().wrapping_add(row) as *const u8);
                }
            }
            let pidx = e.offset >> ps_shift;
            let key = (e.file_id, pidx);
            let page = loop {
                if let Some(&p) = c.map.get(&key) {
                    match c.state[p as usize] {
                        PState::Dirty => {
                            if c.dirty.head != p {
                                c.unlink(p);
                                c.push_head(p, PState::Dirty);
                            }
                        }
                        PState::Clean => {
                            c.unlink(p);
                            c.state[p as usize] = PState::Pinned;
                            touched.push(p);
                        }
                        PState::Pinned | PState::Writing => {}
                        PState::Free => {
                            return Err(VnvmError::Inconsistent(format!(
                                "cache page {p} is mapped but free"
                            )))
                        }
                    }
                    break p;
                }
                self.refill_cache(&mut c);
                if let Some(p) = c.take() {
                    // No fill: only the chunks the entries touch become valid.
                    c.key[p as usize] = Some(key);
                    c.map.insert(key, p);
                    c.state[p as usize] = PState::Pinned;
                    c.gen[p as usize] += 1;
                    touched.push(p);
                    break p;
                }
                // No page: publish this batch's pages so that they can be written back, then
                // wait for the writeback worker.
                self.store_staged(&mut c, &mut dirty_lines)?;
                self.flush_ranges(&mut dirty_lines)?;
                self.publish(&mut c, &mut touched, &mut grown)?;
                if self.kill.load(Ordering::SeqCst) {
                    return Err(VnvmError::CacheFull("instance abandoned".into()));
                }
                let wb = if self.stop_redo.load(Ordering::SeqCst) {
                    self.wb_error.lock().clone()
                } else {
                    None // (still failing: wait, the writeback worker retries)
                };
                if let Some(e) = self.worker_error.lock().clone().or(wb) {
                    // The writeback cannot make room (a failing or full device) and the
                    // instance is being released: stop here; the committed logs stay in the
                    // committed list for recovery.
                    return Err(VnvmError::CacheFull(format!(
                        "no free cache page and the writeback cannot make room: {e}"
                    )));
                }
                c.need_space = true;
                self.wb_cv.notify_all();
                self.space_cv.wait_for(&mut c, Duration::from_millis(100));
            };
            let in_page = e.offset & (ps - 1);
            let end = in_page + e.len as u64;
            let pu = page as usize;
            let (first, last) = (in_page >> cs_shift, (end - 1) >> cs_shift);
            // A page joins `grown` (the records to publish) with its first write of the batch:
            // its `open` mask is empty until then (a flag, not a search: a batch writes up to
            // thousands of pages, and `Vec::contains` per entry made the redo worker quadratic).
            // Its record's CRC covers its valid chunks if the record says dirty: those are held.
            if c.open[pu] == 0 {
                grown.push(page);
                c.held[pu] = match c.state[pu] {
                    PState::Dirty | PState::Writing => c.mask[pu],
                    _ => 0,
                };
            }
            let range = mask_range(first, last);
            c.open[pu] |= range;
            let valid = c.mask[pu];
            c.mask[pu] |= range;
            let data = pool_slice(&self.log, e.log_off, e.len as usize);
            let held = c.held[pu] & range;
            if held != 0 && c.stage.full_for(page) {
                // (Stored early: the stage's records are written again at the publish.)
                self.store_staged(&mut c, &mut dirty_lines)?;
            }
            let dst = Dst {
                page,
                pidx,
                file_id: e.file_id,
            };
            if held == 0 {
                written += self.put(
                    &mut c,
                    dst,
                    in_page,
                    data,
                    valid,
                    &regions,
                    &mut dirty_lines,
                );
            } else {
                // Runs of chunks that are all held (staged) or all not (stored now).
                let mut lo = in_page;
                while lo < end {
                    let ch = lo >> cs_shift;
                    let is_held = held >> ch & 1 != 0;
                    let mut to = ch;
                    while to < last && (held >> (to + 1) & 1 != 0) == is_held {
                        to += 1;
                    }
                    let hi = end.min((to + 1) << cs_shift);
                    let part = &data[(lo - in_page) as usize..(hi - in_page) as usize];
                    written += if is_held {
                        self.stage_run(&mut c, page, lo, part)
                    } else {
                        self.put(&mut c, dst, lo, part, valid, &regions, &mut dirty_lines)
                    };
                    lo = hi;
                }
            }
            c.gen[page as usize] += 1;
        }
        self.store_staged(&mut c, &mut dirty_lines)?;
        self.flush_ranges(&mut dirty_lines)?;
        self.publish(&mut c, &mut touched, &mut grown)?;
        drop(c);
        self.cache.charge_write(written);
        self.log
            .charge_read(entries.iter().map(|e| e.len as u64).sum());
        let total = self.shm.share(shm::Res::Cache) as u64;
        let ndirty = self.cstate.lock().ndirty as u64;
        if ndirty * 100 > self.cfg.writeback_start_pct as u64 * total {
            self.wb_cv.notify_all();
        }
        Ok(())
    }

    /// Store `data` at `lo` of cache page `dst.page` (within the page; chunks that are not
    /// held: their record's CRC does not cover them, or the record is clean) and set their
    /// chunk sums. `valid` is the page's valid mask before this entry. Returns the bytes
    /// stored.
    ///
    /// The chunks covered whole: one store of the log bytes, and their sums hashed from those
    /// bytes (warm: just read). An edge chunk (covered in part): a valid one gets the bytes
    /// with ordinary stores and is hashed from the cache page (its lines are in the CPU cache
    /// now, as the stores read them); an invalid one is put together from the DRAM cache's
    /// bytes, which hold exactly the committed data (possibly newer committed data too,
    /// harmless: see docs/vnvm.md), with the entry's bytes over them, and stored whole.
    #[allow(clippy::too_many_arguments)]
    fn put(
        &self,
        c: &mut CacheState,
        dst: Dst,
        lo: u64,
        data: &[u8],
        valid: u64,
        regions: &[Arc<RegionInner>],
        dirty_lines: &mut Vec<(u64, u64)>,
    ) -> u64 {
        let ps = self.geo.page_size as u64;
        let cs = self.geo.chunk();
        let cs_shift = cs.trailing_zeros();
        let hi = lo + data.len() as u64;
        let (first, last) = (lo >> cs_shift, (hi - 1) >> cs_shift);
        let base = dst.page as u64 * ps;
        let row = dst.page as usize * 64;
        let mut written = 0;
        let (whole_from, whole_to) = ((lo + cs - 1) >> cs_shift, hi >> cs_shift);
        if whole_from < whole_to {
            let bytes = &data[(whole_from * cs - lo) as usize..(whole_to * cs - lo) as usize];
            self.cache_store(base + whole_from * cs, bytes, true, dirty_lines);
            chunksum::chunk_sums(
                whole_from,
                bytes,
                cs as usize,
                &mut c.sums[row + whole_from as usize..row + whole_to as usize],
            );
            written += bytes.len() as u64;
        }
        let edges = [first, last];
        let edges = if first == last {
            &edges[..1]
        } else {
            &edges[..]
        };
        for &ch in edges {
            let (cstart, cend) = (ch * cs, (ch + 1) * cs);
            if lo <= cstart && hi >= cend {
                continue; // covered whole: stored and hashed above
            }
            let (a, b) = (lo.max(cstart), hi.min(cend));
            let part = &data[(a - lo) as usize..(b - lo) as usize];
            if valid & (1 << ch) != 0 {
                self.cache_store(base + a, part, false, dirty_lines);
                c.sums[row + ch as usize] =
                    chunksum::chunk_sum(ch, pool_slice(&self.cache, base + cstart, cs as usize));
                written += part.len() as u64;
                continue;
            }
            let region = regions
                .iter()
                .find(|r| r.file_id == dst.file_id)
                // cannot fail: every entry's region was looked up by `apply`.
                .expect("looked up above");
            // An edge chunk being put together (a chunk is at most 128 bytes: 8 KiB pages).
            let mut chunk_buf = [0u8; 128];
            let buf = &mut chunk_buf[..cs as usize];
            // SAFETY: the chunk lies within the region's DRAM cache (page-rounded mapping);
            // concurrent commits may change it (harmless, see docs).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    region.dram.wview.add((dst.pidx * ps + cstart) as usize),
                    buf.as_mut_ptr(),
                    cs as usize,
                )
            };
            buf[(a - cstart) as usize..(b - cstart) as usize].copy_from_slice(part);
            c.dram_filled = true;
            self.cache_store(base + cstart, buf, false, dirty_lines);
            c.sums[row + ch as usize] = chunksum::chunk_sum(ch, buf);
            written += cs;
        }
        written
    }

    /// Put `data` for `lo` of cache page `page` (held chunks only: its dirty record's CRC
    /// covers them) together in the stage instead of the cache page, and set their chunk sums
    /// from the staged bytes. A chunk's first staging copies it from the cache page unless
    /// `data` covers it whole. Returns the bytes staged.
    fn stage_run(&self, c: &mut CacheState, page: u32, lo: u64, data: &[u8]) -> u64 {
        let ps = self.geo.page_size as usize;
        let cs = self.geo.chunk() as usize;
        let (lo, hi) = (lo as usize, lo as usize + data.len());
        let (first, last) = (lo / cs, (hi - 1) / cs);
        let b = c.stage.block_of(page, ps);
        let base = b * ps;
        let mut have = c.stage.pages[b].1;
        for ch in first..=last {
            let (cstart, cend) = (ch * cs, (ch + 1) * cs);
            if have & (1 << ch) == 0 && !(lo <= cstart && hi >= cend) {
                c.stage.bytes[base + cstart..base + cend].copy_from_slice(pool_slice(
                    &self.cache,
                    (page as usize * ps + cstart) as u64,
                    cs,
                ));
            }
            have |= 1 << ch;
        }
        c.stage.pages[b].1 = have;
        c.stage.bytes[base + lo..base + hi].copy_from_slice(data);
        let row = page as usize * 64;
        chunksum::chunk_sums(
            first as u64,
            &c.stage.bytes[base + first * cs..base + (last + 1) * cs],
            cs,
            &mut c.sums[row + first..=row + last],
        );
        data.len() as u64
    }

    /// Store the staged chunks (see [`Stage`]), write-ahead: first each staged page's record
    /// gets the CRC of its held chunks *as staged* (word and mask unchanged) and is persisted;
    /// only then are the chunks stored (streamed; their lines join `dirty_lines` for the
    /// publish). A crash before that fence leaves the old record and the old page; after it,
    /// the new record over a page some of whose staged chunks are stored: recovery verifies
    /// such a page by applying the listed transactions' writes to it (`check_cache_page`),
    /// which puts exactly the staged bytes back.
    pub(crate) fn store_staged(
        &self,
        c: &mut CacheState,
        dirty_lines: &mut Vec<(u64, u64)>,
    ) -> Result<()> {
        if c.stage.pages.is_empty() {
            return Ok(());
        }
        let ps = self.geo.page_size as u64;
        let cs = self.geo.chunk();
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &(p, _) in &c.stage.pages {
            let Some((f, idx)) = c.key[p as usize] else {
                continue; // cannot happen: a staged page is mapped
            };
            let row = p as usize * 64;
            let held = c.held[p as usize];
            let rec = CacheRec {
                word: cache_word(f, idx, true),
                mask: held,
                page_crc: chunksum::xor_masked(&c.sums[row..row + 64], held),
            };
            store_cache_rec(&self.meta, &self.geo, p, &rec);
            add_run(&mut runs, self.geo.cache_word_off(p), CACHE_OBJ_SIZE);
        }
        self.flush_meta_runs(&mut runs)?;
        self.meta.sync_deferred()?;
        for (b, &(p, have)) in c.stage.pages.iter().enumerate() {
            for (ch, n) in mask_runs(have) {
                let (from, len) = (ch as u64 * cs, n as u64 * cs);
                let src = &c.stage.bytes[b * ps as usize + from as usize..][..len as usize];
                self.cache_store(p as u64 * ps + from, src, true, dirty_lines);
            }
        }
        c.stage.clear();
        Ok(())
    }

    /// Write back the lines of the collected cache-pool ranges `(start, end)` (no fence; on
    /// an msync-backed pool they wait for the `sync_deferred` that stands for the fence).
    pub(crate) fn flush_ranges(&self, ranges: &mut Vec<(u64, u64)>) -> Result<()> {
        for (start, end) in ranges.drain(..) {
            self.cache.flush_deferred(start, (end - start) as usize)?;
        }
        Ok(())
    }

    /// Make the applied data durable, then the records of every page the batch wrote: dirty
    /// word, valid mask and the CRC32C of the page's contents, each record rewritten whole in
    /// its cache line (a line is written back as a unit, so a record never tears; a page object
    /// never says dirty with a mask or a CRC that is not its own). Chunks the page's previous
    /// dirty record covered were stored after their new CRC was persisted (`store_staged`);
    /// the other chunks the batch stored are not covered by any persisted record until this
    /// one. So at every crash point a dirty record matches its page as it is or as the listed
    /// transactions make it (recovery checks both: `check_cache_page`).
    pub(crate) fn publish(
        &self,
        c: &mut CacheState,
        touched: &mut Vec<u32>,
        grown: &mut Vec<u32>,
    ) -> Result<()> {
        self.cache.sync_deferred()?;
        if touched.is_empty() && grown.is_empty() {
            return Ok(());
        }
        if std::mem::take(&mut c.dram_filled) {
            // An edge chunk came from the DRAM cache, which may hold bytes of transactions
            // staged but not linked yet: link them first, or a crash after this publish would
            // leave their bytes in a chunk recovery writes to the file (atomicity). The ticket
            // is read under the domain lock, which a commit holds while it copies into DRAM:
            // every transaction whose bytes the chunk can hold has one at most this.
            let staged = self.domains[0].lock().staged_ticket;
            self.sync_to(staged)?;
        }
        // Stores first, then one write-back per run of neighbouring records (a cache line
        // holds two; a write-back right after each store would write a line twice).
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for p in grown.drain(..) {
            let Some((f, idx)) = c.key[p as usize] else {
                continue; // cannot happen: a page written by this batch is mapped
            };
            c.open[p as usize] = 0;
            let row = p as usize * 64;
            let rec = CacheRec {
                word: cache_word(f, idx, true),
                mask: c.mask[p as usize],
                page_crc: chunksum::xor_masked(&c.sums[row..row + 64], c.mask[p as usize]),
            };
            let off = self.geo.cache_word_off(p);
            store_cache_rec(&self.meta, &self.geo, p, &rec);
            add_run(&mut runs, off, CACHE_OBJ_SIZE);
        }
        self.flush_meta_runs(&mut runs)?;
        self.meta.sync_deferred()?;
        for p in touched.drain(..) {
            c.push_head(p, PState::Dirty);
            c.ndirty += 1;
        }
        Ok(())
    }

    /// Write back the meta-pool runs `(start, end)` (no fence: the caller's
    /// `meta.sync_deferred()` stands for it, one fdatasync on an msync-backed pool).
    pub(crate) fn flush_meta_runs(&self, runs: &mut Vec<(u64, u64)>) -> Result<()> {
        for (start, end) in runs.drain(..) {
            self.meta.flush_deferred(start, (end - start) as usize)?;
        }
        Ok(())
    }

    /// Unlink the first `n` transactions of the committed list (they have been applied, the
    /// last of them is log object `last`) with one persisted store, and free their log pages.
    pub(crate) fn pop(&self, n: usize, last: u32) -> Result<()> {
        let mut pages = Vec::new();
        let mut idxs = Vec::with_capacity(n);
        {
            let mut d = self.domains[0].lock();
            debug_assert!(d.queue.len() >= n && d.queue[n - 1].idx == last);
            let (head, tail) = if d.queue.len() == n {
                (0, 0)
            } else {
                (d.queue[n].idx + 1, d.tail)
            };
            if self.journal.is_none() {
                store_domain_persist(&self.meta, &self.geo, d.id, domain_word(head, tail))?;
            }
            d.head = head;
            d.tail = tail;
            for c in d.queue.drain(..n) {
                idxs.push(c.idx);
                pages.extend_from_slice(&c.pages);
            }
            self.me().applied.fetch_add(n as u64, Ordering::Relaxed);
            if self.journal.is_some() {
                // Journal mode: the last journaled word still reaches these; the unlink (and
                // the reuse of their log space) waits for the next barrier's record.
                let tag = d.barriers;
                d.pending_free.push((tag, idxs, pages));
                drop(d);
                let _g = self.domains[0].lock();
                self.applied_cv.notify_all();
                return Ok(());
            }
            // Drain waiters are woken once the pages are back, below.
            self.freeing.fetch_add(1, Ordering::SeqCst);
        }
        self.shm.free(shm::Res::Obj, self.slot as u8 + 1, &idxs);
        self.free_log_pages(&pages);
        self.freeing.fetch_sub(1, Ordering::SeqCst);
        // Under the lock `drain` checks its condition with: no lost wake-up.
        drop(self.domains[0].lock());
        self.applied_cv.notify_all();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The redo worker puts an edge chunk together from the DRAM cache, which can hold bytes
    /// of a transaction staged but not linked. A crash after that publish must not leave part
    /// of the staged transaction in the file: here its write into the chunk (brought along by
    /// the edge fill of an earlier, linked transaction) and its write into page 5 come back
    /// together or not at all. The redo worker is paused; the test applies the linked
    /// transaction itself, as the worker's batch does.
    #[test]
    fn an_edge_fill_from_dram_never_leaves_part_of_a_staged_transaction_in_the_file() {
        let (_d, cfg, file) = crate::tests::small_disk_instance("tiermem-vnvm-edgestaged", true);
        let vn = nv_init(&cfg).unwrap();
        let r = vn.nv_allocate(&file, 8 * 4096, Mode::Private).unwrap();
        let write = |tid: Tid, off: usize, byte: u8| {
            crate::tests::write_fill(&vn, &r, tid, off, byte, 10);
        };
        // Linked: 10 bytes at the start of chunk 1 of page 1 (an edge: the chunk's other
        // bytes come from DRAM when it is applied).
        let t1 = vn.nv_txbegin();
        write(t1, 4096 + 64, 1);
        vn.nv_commit(t1).unwrap();
        // Staged, not linked: later in the same chunk, and page 5.
        let t2 = vn.nv_txbegin();
        write(t2, 4096 + 64 + 30, 2);
        write(t2, 5 * 4096, 2);
        let ticket = vn.nv_commit_staged(t2).unwrap();
        assert!(ticket > vn.nv_durable_ticket(), "staged, not durable yet");
        // Apply the linked transaction as the redo worker does.
        let i = &vn.inner;
        let jobs: Vec<(u32, Vec<u32>)> = i.domains[0]
            .lock()
            .queue
            .iter()
            .map(|c| (c.idx, c.pages.clone()))
            .collect();
        assert_eq!(jobs.len(), 1, "the linked transaction only");
        let mut entries = Vec::new();
        let pages = &jobs[0].1;
        let first = pool_slice(&i.log, pages[0] as u64 * i.geo.page_size as u64, LOG_HDR);
        let any = |_: u32, _: u64, _: u32| Ok(());
        i.entries_of(u64_at(first, 8), pages, &mut entries, &any, true)
            .unwrap();
        i.apply(&entries).unwrap();
        drop(r);
        vn.abandon();

        recover(&cfg.dir).unwrap();
        let got = std::fs::read(&file).unwrap();
        assert_eq!(
            got[4096 + 64..4096 + 74],
            [1u8; 10],
            "the linked transaction"
        );
        let (p1, p5) = (got[4096 + 64 + 30], got[5 * 4096]);
        assert!(
            (p1, p5) == (2, 2) || (p1, p5) == (0, 0),
            "the staged transaction is there in part: page 1 {p1:#x}, page 5 {p5:#x}"
        );
    }
}
