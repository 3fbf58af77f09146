//! Transactions and their logs: the open lists, `nv_write` (entries copied into the transaction's
//! log pages, CRC computed while copying), `nv_commit` (log write-back, one fence, linking the log
//! object into the committed list, then the DRAM caches), aborts, and the log objects and pages a
//! transaction takes and gives back.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Committed,
    Aborted { by_age: bool },
}

pub(crate) struct Tx {
    pub(crate) start_ns: u64,
    /// Log pages, in order.
    pub(crate) pages: Vec<u32>,
    /// Bytes used in the last page.
    pub(crate) used: u32,
    /// Regions written (pins them).
    pub(crate) regions: Vec<Arc<RegionInner>>,
    pub(crate) aborted_by_age: bool,
}

#[derive(Default)]
pub(crate) struct OpenList {
    /// Open transactions by tid: FxHash (tids are ours, not an attacker's; SipHash was ~570
    /// instructions of every kv SET, four lookups a transaction, callgrind).
    pub(crate) txs: rustc_hash::FxHashMap<Tid, Tx>,
    pub(crate) recent: VecDeque<(Tid, Outcome)>,
}

pub(crate) const RECENT: usize = 128;

impl OpenList {
    pub(crate) fn finish(&mut self, tid: Tid, o: Outcome) {
        if self.recent.len() >= RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((tid, o));
    }
}

pub(crate) struct Committed {
    pub(crate) idx: u32,
    pub(crate) pages: Vec<u32>,
}

/// [`COMMIT_WAIT`] (unit tests may shorten it).
pub(crate) fn commit_wait() -> Duration {
    #[cfg(test)]
    {
        let ms = tests::COMMIT_WAIT_MS.load(Ordering::Relaxed);
        if ms > 0 {
            return Duration::from_millis(ms);
        }
    }
    COMMIT_WAIT
}

/// Why a commit into a shared region failed.
pub(crate) enum CommitFail {
    /// Before the link: the transaction's pages and log object are still the committer's.
    NotLinked(VnvmError),
    /// The link's persist failed after its store: the transaction is in the list (and
    /// applied), as if committed.
    Linked(VnvmError),
}

/// A log domain: one persistent committed list (private regions of a process; later one per
/// shared region).
pub(crate) struct CommitDomain {
    pub(crate) id: u32,
    /// The persistent list's head and tail (log object index + 1; 0: empty), as stored.
    pub(crate) head: u32,
    pub(crate) tail: u32,
    /// Linked (durable) transactions waiting for the redo worker, in commit order.
    pub(crate) queue: VecDeque<Committed>,
    /// Staged transactions: committed and visible, their logs written, not yet linked into
    /// the persistent list (`Inner::sync_to` links them), in commit order.
    pub(crate) staged: Vec<Committed>,
    /// The last staged transaction's log object + 1 while one is staged or being linked (the
    /// `prev` of the next one); 0 when every staged transaction is linked.
    pub(crate) staged_tail: u32,
    /// The ticket of the last staged transaction.
    pub(crate) staged_ticket: u64,
    /// Journal mode: log objects and pages the redo worker unlinked, not yet reusable (a
    /// journaled word may still reach them), each tagged with `barriers` at the unlink.
    pub(crate) pending_free: Vec<(u64, Vec<u32>, Vec<u32>)>,
    /// Journal mode: barrier snapshots taken so far.
    pub(crate) barriers: u64,
}

impl Inner {
    pub(crate) fn take_tx(&self, ol: &mut OpenList, tid: Tid) -> Result<Tx> {
        match ol.txs.remove(&tid) {
            Some(tx) if tx.aborted_by_age => {
                ol.finish(tid, Outcome::Aborted { by_age: true });
                Err(VnvmError::TxAborted { tid, by_age: true })
            }
            Some(tx) => Ok(tx),
            None => Err(self.tid_error(ol, tid)),
        }
    }

    pub(crate) fn tid_error(&self, ol: &OpenList, tid: Tid) -> VnvmError {
        if tid == 0 || tid >= self.shm.next_tid().load(Ordering::Relaxed) {
            return VnvmError::UnknownTx(tid);
        }
        match ol.recent.iter().rev().find(|(t, _)| *t == tid) {
            Some((_, Outcome::Committed)) => VnvmError::TxCommitted(tid),
            Some((_, Outcome::Aborted { by_age })) => VnvmError::TxAborted {
                tid,
                by_age: *by_age,
            },
            None => VnvmError::TxNotOpen(tid),
        }
    }

    /// Free an uncommitted transaction's log pages and unpin its regions.
    pub(crate) fn discard(&self, tx: Tx) {
        self.free_log_pages(&tx.pages);
        for r in &tx.regions {
            r.open_writers.fetch_sub(1, Ordering::SeqCst);
        }
    }

    pub(crate) fn free_log_pages(&self, pages: &[u32]) {
        if pages.is_empty() {
            return;
        }
        self.shm.free(shm::Res::Log, self.slot as u8 + 1, pages);
    }

    pub(crate) fn find_region(&self, addr: usize, len: usize) -> Option<Arc<RegionInner>> {
        let regions = self.regions.read();
        regions
            .iter()
            .flatten()
            .find(|r| addr >= r.base() && addr + len <= r.base() + r.size as usize)
            .cloned()
    }

    pub(crate) fn write(&self, tid: Tid, dst: usize, src: &[u8]) -> Result<usize> {
        let ps = self.geo.page_size as usize;
        let mut ol = self.open[tid as usize % OPEN_LISTS].lock();
        let ol = &mut *ol;
        let tx = match ol.txs.get_mut(&tid) {
            Some(t) if t.aborted_by_age => return Err(VnvmError::TxAborted { tid, by_age: true }),
            Some(t) => t,
            None => return Err(self.tid_error(ol, tid)),
        };
        if src.is_empty() {
            return Ok(0);
        }
        let end = dst.checked_add(src.len()).ok_or(VnvmError::OutOfRegion {
            addr: dst,
            len: src.len(),
        })?;
        // The region: the transaction's most recent one, else a lookup.
        let region = match tx
            .regions
            .iter()
            .rev()
            .find(|r| dst >= r.base() && end <= r.base() + r.size as usize)
        {
            Some(r) => r.clone(),
            None => {
                let r = self
                    .find_region(dst, src.len())
                    .ok_or(VnvmError::OutOfRegion {
                        addr: dst,
                        len: src.len(),
                    })?;
                if tx
                    .regions
                    .first()
                    .is_some_and(|f| f.shared.is_some() || r.shared.is_some())
                {
                    return Err(VnvmError::CrossRegion {
                        tid,
                        path: r.path.clone(),
                    });
                }
                r.open_writers.fetch_add(1, Ordering::SeqCst);
                if r.closing.load(Ordering::SeqCst) {
                    r.open_writers.fetch_sub(1, Ordering::SeqCst);
                    return Err(VnvmError::RegionFreed(r.path.clone()));
                }
                tx.regions.push(r.clone());
                r
            }
        };
        let mut off = (dst - region.base()) as u64;
        let mut done = 0usize;
        while done < src.len() {
            // A new page when this one cannot take the rest or at least 64 bytes of it (a
            // small write is never split into crumbs).
            let want = (src.len() - done).min(64);
            if tx.pages.is_empty() || tx.used as usize + ENTRY_HDR + want > ps {
                let Some(np) = self.take_log_page() else {
                    break;
                };
                if let Some(&last) = tx.pages.last() {
                    self.log_store(last as u64 * ps as u64, &log_hdr(tx.used, np + 1, tid));
                }
                tx.pages.push(np);
                tx.used = LOG_HDR as u32;
            }
            // cannot fail: the branch above pushed a page or left the loop.
            let page = *tx.pages.last().expect("a page");
            let room = ps - tx.used as usize - ENTRY_HDR;
            let to_boundary = ps - (off % ps as u64) as usize;
            let n = (src.len() - done).min(room).min(to_boundary);
            let at = page as u64 * ps as u64 + tx.used as u64;
            let data = &src[done..done + n];
            // The entry's CRC32C is computed here, while its bytes are hot (one pass).
            self.log_store(at, &entry_hdr(region.file_id, off, data));
            self.log_store(at + ENTRY_HDR as u64, data);
            tx.used += (ENTRY_HDR + pad8(n)) as u32;
            done += n;
            off += n as u64;
        }
        if done == 0 {
            return Err(VnvmError::LogFull { logged: 0 });
        }
        Ok(done)
    }

    /// Store bytes into the log pool's data area (ordinary stores; `commit` writes the lines
    /// back and fences). `at..at + data.len()` must lie in a log page the caller owns.
    #[inline]
    pub(crate) fn log_store(&self, at: u64, data: &[u8]) {
        debug_assert!(at as usize + data.len() <= self.log.data_len());
        // SAFETY: in bounds of the log pool's data area (checked by the callers' page
        // arithmetic); the page belongs to the calling transaction alone.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.log.data_ptr().add(at as usize),
                data.len(),
            )
        }
    }

    /// The entries of transaction `tid`'s log pages, each checked by `check(file, offset,
    /// len)`; with `verify` (the redo worker) their CRC32Cs are checked too. Errors:
    /// [`VnvmError::Damaged`] when a page does not parse, is stamped with another tid, an entry
    /// fails `check` or (with `verify`) its checksum (never for pages written by this
    /// process's `nv_write`, unless something else wrote into them).
    pub(crate) fn entries_of(
        &self,
        tid: Tid,
        pages: &[u32],
        out: &mut Vec<Entry>,
        check: &dyn Fn(u32, u64, u32) -> std::result::Result<(), String>,
        verify: bool,
    ) -> Result<()> {
        let ps = self.geo.page_size;
        for &p in pages {
            let off = p as u64 * ps as u64;
            if p >= self.geo.log_pages {
                return Err(damaged(
                    &self.log,
                    format!("log page {p}"),
                    off,
                    "out of range",
                ));
            }
            let b = pool_slice(&self.log, off, ps as usize);
            let owner = u64_at(b, 8);
            if owner != tid {
                return Err(damaged(
                    &self.log,
                    format!("log page {p}"),
                    off,
                    format!("belongs to tid {owner}, not to tid {tid}"),
                ));
            }
            parse_page(b, off, ps, out, check, verify)
                .map_err(|e| damaged(&self.log, format!("log page {p} (tid {tid})"), off, e))?;
        }
        Ok(())
    }

    /// A free log object for transaction `tid`'s commit, waiting (up to [`COMMIT_WAIT`]) as
    /// `nv_wait_log_space` waits for log pages: redo workers and shared-region flushes free
    /// them. Errors: [`VnvmError::NoLogObject`] after the wait; the failure of a worker.
    pub(crate) fn take_log_obj(&self, tid: Tid) -> Result<u32> {
        let t0 = Instant::now();
        loop {
            let seen = self.shm.log_seq();
            if let Some(i) = self.shm.take_one(shm::Res::Obj, self.slot) {
                return Ok(i);
            }
            if let Some(e) = self.worker_error.lock().clone() {
                return Err(VnvmError::CacheFull(format!(
                    "no free log object and a worker failed: {e}"
                )));
            }
            let waited = t0.elapsed();
            let limit = commit_wait();
            if waited >= limit {
                return Err(VnvmError::NoLogObject {
                    tid,
                    waited_ms: waited.as_millis() as u64,
                });
            }
            // Our own staged commits hold log objects until they are linked and applied.
            self.sync_all()?;
            // Ask every user's workers to apply and flush (as a writer short of log space).
            self.flush_req.store(true, Ordering::SeqCst);
            if let Some(t) = self.redo_thread.get() {
                t.unpark();
            }
            self.shm
                .wait_log(seen, (limit - waited).min(Duration::from_millis(50)));
        }
    }

    /// Give back a transaction whose commit failed before it was linked: its log object, and
    /// the transaction itself, aborted (pages freed, regions unpinned, outcome recorded).
    pub(crate) fn unwind_commit(&self, tid: Tid, tx: Tx, idx: u32) {
        self.shm.free(shm::Res::Obj, self.slot as u8 + 1, &[idx]);
        self.open[tid as usize % OPEN_LISTS]
            .lock()
            .finish(tid, Outcome::Aborted { by_age: false });
        self.discard(tx);
    }

    /// Commit `tid`, durable on return: [`Inner::commit_staged`] then [`Inner::sync_to`] its
    /// ticket (which links every transaction staged before it too).
    pub(crate) fn commit(&self, tid: Tid) -> Result<()> {
        let t = self.commit_staged(tid)?;
        self.sync_to(t)
    }

    /// Commit `tid` without waiting for durability: its log pages and log object are written
    /// (written back and fenced on cache-flush pools; noted for one fdatasync on msync-backed
    /// ones) and its data is visible in the DRAM views on return, but it is linked into the
    /// persistent committed list only by the [`Inner::sync_to`] of the returned ticket or a
    /// later one, which links every transaction staged so far with one store (group commit).
    /// A crash before that loses it, and every transaction staged after it; never a part of
    /// one. Tickets grow with commit order; 0 means durable already (a shared region's commit,
    /// or one with nothing logged).
    pub(crate) fn commit_staged(&self, tid: Tid) -> Result<u64> {
        let ps = self.geo.page_size as u64;
        // A transaction with logs needs a log object: take one first (waiting if need be), so
        // that a commit that cannot get one leaves the transaction open.
        let logged_any = self.open[tid as usize % OPEN_LISTS]
            .lock()
            .txs
            .get(&tid)
            .is_some_and(|t| !t.pages.is_empty() && !t.aborted_by_age);
        let mut idx = if logged_any {
            Some(self.take_log_obj(tid)?)
        } else {
            None
        };
        let tx = {
            let mut ol = self.open[tid as usize % OPEN_LISTS].lock();
            let tx = match self.take_tx(&mut ol, tid) {
                Ok(tx) => tx,
                Err(e) => {
                    drop(ol);
                    if let Some(i) = idx {
                        self.shm.free(shm::Res::Obj, self.slot as u8 + 1, &[i]);
                    }
                    return Err(e);
                }
            };
            if idx.is_none() && !tx.pages.is_empty() {
                // Another thread logged into it since we looked: take one without waiting.
                idx = self.shm.take_one(shm::Res::Obj, self.slot);
                if idx.is_none() {
                    ol.txs.insert(tid, tx);
                    return Err(VnvmError::NoLogObject { tid, waited_ms: 0 });
                }
            }
            ol.finish(tid, Outcome::Committed);
            tx
        };
        let (Some(&last), Some(idx)) = (tx.pages.last(), idx) else {
            if let Some(i) = idx {
                self.shm.free(shm::Res::Obj, self.slot as u8 + 1, &[i]);
            }
            self.discard(tx);
            return Ok(0);
        };
        self.log_store(last as u64 * ps, &log_hdr(tx.used, 0, tid));
        let mut logged = 0u64;
        for &p in &tx.pages {
            let used = if p == last {
                tx.used
            } else {
                u32_at(pool_slice(&self.log, p as u64 * ps, LOG_HDR), 0)
            };
            if let Err(e) = self.log.flush_deferred(p as u64 * ps, used as usize) {
                self.unwind_commit(tid, tx, idx);
                return Err(e.into());
            }
            logged += used as u64;
        }
        // Every entry must land in a region the transaction pinned (so the copies below stay
        // in bounds whatever the log pages hold).
        let regions: Vec<(u32, u64)> = tx.regions.iter().map(|r| (r.file_id, r.size)).collect();
        let check = |f: u32, o: u64, l: u32| -> std::result::Result<(), String> {
            match regions.iter().find(|(id, _)| *id == f) {
                Some((_, size)) if o.checked_add(l as u64).is_some_and(|e| e <= *size) => Ok(()),
                _ => Err(format!(
                    "entry {f}:{o}+{l} outside the transaction's regions"
                )),
            }
        };
        let mut entries = Vec::new();
        // Our own pages, just written: parsed, not re-verified (the redo worker verifies).
        if let Err(e) = self.entries_of(tid, &tx.pages, &mut entries, &check, false) {
            self.unwind_commit(tid, tx, idx);
            return Err(e);
        }
        let mut bytes = 0u64;
        let mut ticket = 0;
        let mut linked_err = None;
        if tx.regions.first().is_some_and(|r| r.shared.is_some()) {
            match self.commit_shared(&tx, tid, idx, &entries) {
                Ok(b) => bytes = b,
                Err(CommitFail::NotLinked(e)) => {
                    self.unwind_commit(tid, tx, idx);
                    return Err(e);
                }
                Err(CommitFail::Linked(e)) => linked_err = Some(e),
            }
        } else {
            let mut d = self.domains[0].lock();
            let obj = LogObj {
                tid,
                prev: if d.staged_tail != 0 {
                    d.staged_tail
                } else {
                    d.tail
                },
                first_page: tx.pages[0],
                npages: tx.pages.len() as u32,
                domain: d.id,
                app_id: self.slot as u32 + 1,
                start_ns: tx.start_ns,
            };
            let ooff = self.geo.logobj_off(idx);
            let ob = obj.encode();
            // SAFETY: the log-object slot lies in the meta data area and is ours (popped from
            // the free list).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    ob.as_ptr(),
                    self.meta.data_ptr().add(ooff as usize),
                    ob.len(),
                )
            };
            if let Err(e) = self.meta.flush_deferred(ooff, ob.len()) {
                drop(d);
                self.unwind_commit(tid, tx, idx);
                return Err(e.into());
            }
            // (1)+(2): on cache-flush pools every log entry and the log object are durable
            // after this fence (ours: a fence orders only this CPU's write-backs); on
            // msync-backed pools after `sync_to`'s fdatasyncs. (3), the link, is `sync_to`'s.
            self.meta.fence();
            // (4): the data is visible in DRAM now; a reply that depends on it must wait for
            // `sync_to` (see the contract of `commit_staged`).
            for e in &entries {
                // cannot fail: `check` accepted only entries of the transaction's regions.
                let Some(r) = tx.regions.iter().find(|r| r.file_id == e.file_id) else {
                    continue;
                };
                // SAFETY: the entry lies in the log pool (parsed from our own pages) and in the
                // region (checked above); the DRAM writable view is mapped.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.log.data_ptr().add(e.log_off as usize),
                        r.dram.wview.add(e.offset as usize),
                        e.len as usize,
                    )
                };
                bytes += e.len as u64;
            }
            d.staged.push(Committed {
                idx,
                pages: tx.pages,
            });
            d.staged_tail = idx + 1;
            ticket = self.staged_seq.fetch_add(1, Ordering::SeqCst) + 1;
            d.staged_ticket = ticket;
        }
        self.log.charge_write(logged);
        self.log.charge_read(bytes);
        self.me().commits.fetch_add(1, Ordering::Relaxed);
        for r in &tx.regions {
            r.open_writers.fetch_sub(1, Ordering::SeqCst);
        }
        match linked_err {
            Some(e) => Err(e),
            None => Ok(ticket),
        }
    }

    /// The most transactions the redo worker applies in one batch: [`REDO_BATCH`], or
    /// [`REDO_BATCH_MSYNC`] when the pools are msync-backed (a disk file system), where each
    /// batch pays a few fdatasyncs whatever its size.
    pub(crate) fn redo_batch(&self) -> usize {
        if self.cache.persist_method().is_msync() {
            REDO_BATCH_MSYNC
        } else {
            REDO_BATCH
        }
    }

    /// The ticket of the last transaction staged so far (0: none yet).
    pub(crate) fn staged_ticket(&self) -> u64 {
        self.staged_seq.load(Ordering::SeqCst)
    }

    /// Make every transaction staged up to `ticket` durable (and every one staged before this
    /// call, which it links too): one write-back of the logs (an fdatasync of the log and meta
    /// files when they are msync-backed, nothing more on cache-flush pools, whose committers
    /// fenced), then one persisted store of the committed-list word linking all of them,
    /// then they go to the redo worker's queue. One caller at a time does that work; a caller
    /// whose ticket a sync in progress covers waits for it and does none.
    ///
    /// Errors: the write-back or the link's persist failing ([`VnvmError::Media`], naming the
    /// file). The transactions stay staged (visible, not durable) and a later call retries.
    pub(crate) fn sync_to(&self, ticket: u64) -> Result<()> {
        if ticket == 0 || self.durable_seq.load(Ordering::SeqCst) >= ticket {
            return Ok(());
        }
        let _one = self.sync_lock.lock();
        if self.durable_seq.load(Ordering::SeqCst) >= ticket {
            return Ok(());
        }
        if let Some(j) = &self.journal {
            return self.barrier_journal(j);
        }
        let (n, last, last_ticket) = {
            let d = self.domains[0].lock();
            match d.staged.last() {
                Some(c) => (d.staged.len(), c.idx, d.staged_ticket),
                None => return Ok(()),
            }
        };
        // (1)+(2) for everything staged so far (cache-flush pools: the committers fenced
        // their own write-backs; msync-backed pools take the journal path above): commits
        // staged meanwhile may ride along, harmless (they stay staged until a later call
        // links them).
        self.log.sync_deferred()?;
        self.meta.sync_deferred()?;
        let queued = {
            let mut d = self.domains[0].lock();
            // cannot fail: only this function (under `sync_lock`) removes staged entries.
            debug_assert!(d.staged.len() >= n && d.staged[n - 1].idx == last);
            let first = d.staged[0].idx;
            let head = if d.head == 0 { first + 1 } else { d.head };
            let tail = last + 1;
            // (3): link the whole batch with one 8-byte atomic store, persisted. If the
            // persist fails the batch stays staged (a retry stores the word again, or a
            // longer one): the callers hear of the failure, nothing claims it durable.
            let r = store_domain_persist(&self.meta, &self.geo, d.id, domain_word(head, tail));
            d.head = head;
            d.tail = tail;
            r?;
            let batch: Vec<Committed> = d.staged.drain(..n).collect();
            d.queue.extend(batch);
            if d.staged.is_empty() {
                d.staged_tail = 0;
            }
            d.queue.len()
        };
        self.durable_seq.store(last_ticket, Ordering::SeqCst);
        // Wake the redo worker only for a full batch: while commits keep coming it polls and
        // finds these within REDO_POLL; after an idle spell, within its periodic interval.
        // Nothing waits for it: the logs are durable already.
        if queued >= self.redo_batch() {
            if let Some(t) = self.redo_thread.get() {
                t.unpark();
            }
        }
        Ok(())
    }

    /// [`Inner::sync_to`] of everything staged so far; in journal mode also a barrier that
    /// only carries the word when unlinked log space waits for one (see `pop`).
    pub(crate) fn sync_all(&self) -> Result<()> {
        self.sync_to(self.staged_ticket())?;
        if let Some(j) = &self.journal {
            if !self.domains[0].lock().pending_free.is_empty() {
                let _one = self.sync_lock.lock();
                return self.barrier_journal(j);
            }
        }
        Ok(())
    }

    /// [`Inner::sync_to`] in journal mode (caller holds `sync_lock`): one journal record with
    /// every staged transaction's used log bytes and log object and the new committed-list
    /// word, appended and fdatasynced; then the word is stored into the meta pool's mapping
    /// (not persisted: the journal holds it), the batch goes to the redo worker, and the log
    /// space the redo worker unlinked before this barrier's snapshot becomes reusable. A
    /// checkpoint (the pools fdatasynced, the journal started over) comes first when the
    /// record does not fit. Errors: the journal's or a checkpoint's I/O; the batch then stays
    /// staged.
    fn barrier_journal(&self, j: &Mutex<crate::journal::Journal>) -> Result<()> {
        use crate::journal::{Journal, Target};
        let ps = self.geo.page_size as u64;
        let (n, last_ticket, head, tail, tag, items, domain) = {
            let mut d = self.domains[0].lock();
            d.barriers += 1;
            let (head, tail) = match (d.staged.first(), d.staged.last()) {
                (Some(f), Some(l)) => (if d.head == 0 { f.idx + 1 } else { d.head }, l.idx + 1),
                _ => (d.head, d.tail),
            };
            let items: Vec<(u32, Vec<u32>)> =
                d.staged.iter().map(|c| (c.idx, c.pages.clone())).collect();
            (
                d.staged.len(),
                d.staged_ticket,
                head,
                tail,
                d.barriers,
                items,
                d.id,
            )
        };
        let word = domain_word_bytes(domain, domain_word(head, tail));
        let mut ranges: Vec<(Target, u64, &[u8])> = Vec::with_capacity(items.len() * 2 + 1);
        for (idx, pages) in &items {
            for &p in pages {
                let at = p as u64 * ps;
                // A page's used bytes, header included (the last page's header was written at
                // commit); cannot exceed the page: `nv_write` fills pages up to their size.
                let used = (u32_at(pool_slice(&self.log, at, LOG_HDR), 0) as u64).min(ps);
                ranges.push((Target::Log, at, pool_slice(&self.log, at, used as usize)));
            }
            let ooff = self.geo.logobj_off(*idx);
            ranges.push((
                Target::Meta,
                ooff,
                pool_slice(&self.meta, ooff, LOGOBJ_SIZE as usize),
            ));
        }
        ranges.push((Target::Meta, self.geo.domain_off(domain), &word));
        {
            let mut jg = j.lock();
            let len = Journal::record_len(ranges.iter().map(|r| r.2.len()));
            if !jg.fits(len) {
                // Checkpoint: the pools as mapped now hold everything journaled so far.
                self.log.persist(0, self.log.data_len())?;
                self.meta.persist(0, self.meta.data_len())?;
                jg.restart()?;
            }
            jg.append(&ranges)?;
        }
        #[cfg(test)]
        if let Some(hook) = &*self.after_journal_append.lock() {
            hook(self);
        }
        let (released, queued) = {
            let mut d = self.domains[0].lock();
            store_domain(&self.meta, &self.geo, domain, domain_word(head, tail));
            if n > 0 {
                if d.head == 0 {
                    // The queue was empty at the snapshot, or the redo worker emptied it
                    // during the append (then the snapshot's head names a popped entry): the
                    // list now starts at this batch.
                    d.head = items[0].0 + 1;
                }
                d.tail = tail;
                let batch: Vec<Committed> = d.staged.drain(..n).collect();
                d.queue.extend(batch);
                if d.staged.is_empty() {
                    d.staged_tail = 0;
                }
            }
            let (free, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut d.pending_free)
                .into_iter()
                .partition(|e| e.0 < tag);
            d.pending_free = keep;
            (free, d.queue.len())
        };
        self.durable_seq.fetch_max(last_ticket, Ordering::SeqCst);
        for (_, idxs, pages) in released {
            self.shm.free(shm::Res::Obj, self.slot as u8 + 1, &idxs);
            self.free_log_pages(&pages);
        }
        if queued >= self.redo_batch() {
            if let Some(t) = self.redo_thread.get() {
                t.unpark();
            }
        }
        Ok(())
    }
}
