//! Transactions: MULTI, EXEC, DISCARD, WATCH, UNWATCH (Redis 7.0's semantics and replies).
//!
//! MULTI queues a session's commands (`+QUEUED`); a command that cannot be queued (unknown,
//! wrong arity, not allowed inside a transaction) flags the transaction and EXEC then discards
//! it (`-EXECABORT`). EXEC runs the queue under the engine-wide write lock in **one heap
//! transaction**: the reads in it see its writes, and it commits once. On the vnvm engine that
//! commit is one vnvm transaction, so an EXEC is all or nothing across a crash, with no replay
//! or repair at start-up. A command's own error (WRONGTYPE, syntax) is its reply in EXEC's
//! array and the others still run, as in Redis; a heap error (full heap, a transaction too
//! large for the log, damage) aborts the whole EXEC, which then changes nothing and replies
//! that error.
//!
//! WATCH is optimistic locking, as in Redis: the service keeps, for each watched key, the
//! sessions watching it ([`Watches`]); every write command that changes something marks the
//! watchers of its key arguments (FLUSHALL: of the watched keys that existed), and EXEC of a
//! marked session, or of one whose watched key was live at WATCH and has expired since, replies
//! a null array and runs nothing. EXEC, DISCARD, UNWATCH and closing the connection unwatch.

use super::registry::Registry;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

/// Most bytes of arguments one transaction may queue (beyond: an error, and the transaction
/// is flagged).
pub const MAX_QUEUED_BYTES: usize = 256 << 20;

/// A session's open transaction (between MULTI and EXEC or DISCARD).
#[derive(Debug, Default)]
pub struct Multi {
    /// The queued commands, arguments copied.
    pub queued: Vec<Vec<Vec<u8>>>,
    /// Bytes of arguments queued.
    pub bytes: usize,
    /// A command could not be queued: EXEC discards the transaction.
    pub failed: bool,
}

/// A session's watch state.
#[derive(Debug, Default)]
pub struct WatchState {
    /// Keys watched ([`wkey`]: database and key), and whether each was live (present, not
    /// expired) when watched.
    pub keys: Vec<(Vec<u8>, bool)>,
    /// Set by a write to a watched key: the next EXEC fails.
    pub dirty: Arc<AtomicBool>,
}

/// The sessions watching each key (shared by all sessions of a service), each with the dirty
/// flag of its [`WatchState`].
#[derive(Default)]
pub struct Watches(Registry<Arc<AtomicBool>>);

impl Watches {
    /// Whether any key is watched.
    #[inline]
    pub fn active(&self) -> bool {
        self.0.active()
    }

    /// Session `id` (whose dirty flag is `dirty`) watches `key`; false if it already did.
    pub fn watch(&self, id: u64, dirty: &Arc<AtomicBool>, key: &[u8]) -> bool {
        self.0.add(id, dirty, std::iter::once(key)) == 1
    }

    /// Session `id` stops watching `keys`.
    pub fn unwatch<'k>(&self, id: u64, keys: impl Iterator<Item = &'k [u8]>) {
        self.0.remove(id, keys, |_| {});
    }

    /// Keys were changed: their watchers' next EXEC fails.
    pub fn touch<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) {
        self.0.each(keys, |v| {
            for (_, d) in v {
                d.store(true, Relaxed);
            }
        });
    }

    /// The watched keys (FLUSHALL checks which of them exist before it empties the keyspace).
    pub fn keys(&self) -> Vec<Vec<u8>> {
        self.0.keys()
    }
}

/// The key of the watch registry for `key` of database `db` (the database is part of it).
pub fn wkey(db: usize, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key.len());
    k.push(db as u8);
    k.extend_from_slice(key);
    k
}

/// The database and key of a watch registry key made by [`wkey`].
pub fn split_wkey(k: &[u8]) -> (usize, &[u8]) {
    match k.split_first() {
        Some((&db, key)) => (db as usize, key),
        None => (0, k),
    }
}

/// Whether a command may be queued inside MULTI: not when its table entry has `no-multi`
/// (Redis's, and this server's commands that take the engine lock themselves).
pub fn allowed_in_multi(id: super::table::Id) -> bool {
    use super::table::{spec, Flags};
    !spec(id).flags.contains(Flags::NO_MULTI)
}
