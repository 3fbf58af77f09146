//! Per-key registries of sessions: who waits on a key (blocking pops, `blocking::Waiters`) and
//! who watches one (WATCH, `multi::Watches`). One mechanism for both: for each key the
//! sessions in arrival order, each with its handle (a connection to wake, a dirty flag), and a
//! count of (key, session) pairs so that writers skip the lock when nobody is registered.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The sessions registered on one key, in arrival order: (session id, its `T`).
type Sessions<T> = Vec<(u64, T)>;

/// Sessions per key, in arrival order, each with a `T`.
pub struct Registry<T> {
    map: Mutex<HashMap<Vec<u8>, Sessions<T>>>,
    /// Registered (key, session) pairs: 0 lets writers skip the map.
    n: AtomicUsize,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Registry {
            map: Mutex::new(HashMap::new()),
            n: AtomicUsize::new(0),
        }
    }
}

impl<T: Clone> Registry<T> {
    /// Whether any session is registered on any key (one atomic load).
    #[inline]
    pub fn active(&self) -> bool {
        self.n.load(Relaxed) > 0
    }

    /// Session `id` registers on each of `keys`, behind those already there; a key it is
    /// registered on already keeps its place. Returns how many keys were new for it.
    pub fn add<'k>(&self, id: u64, t: &T, keys: impl Iterator<Item = &'k [u8]>) -> usize {
        let mut m = self.map.lock();
        let mut added = 0;
        for k in keys {
            let v = m.entry(k.to_vec()).or_default();
            if !v.iter().any(|(s, _)| *s == id) {
                v.push((id, t.clone()));
                added += 1;
            }
        }
        self.n.fetch_add(added, Relaxed);
        added
    }

    /// Session `id` leaves each of `keys`; `next` is called with the first session left on a
    /// key it was removed from (its turn may have come).
    pub fn remove<'k>(
        &self,
        id: u64,
        keys: impl Iterator<Item = &'k [u8]>,
        mut next: impl FnMut(&T),
    ) {
        let mut m = self.map.lock();
        for k in keys {
            if let Some(v) = m.get_mut(k) {
                let before = v.len();
                v.retain(|(s, _)| *s != id);
                self.n.fetch_sub(before - v.len(), Relaxed);
                match v.first() {
                    None => {
                        m.remove(k);
                    }
                    Some((_, t)) if before != v.len() => next(t),
                    Some(_) => {}
                }
            }
        }
    }

    /// `f` with the sessions registered on each of `keys` that has any, in arrival order.
    pub fn each<'k>(&self, keys: impl Iterator<Item = &'k [u8]>, mut f: impl FnMut(&[(u64, T)])) {
        if !self.active() {
            return;
        }
        let m = self.map.lock();
        for k in keys {
            if let Some(v) = m.get(k) {
                f(v);
            }
        }
    }

    /// The keys with sessions registered.
    pub fn keys(&self) -> Vec<Vec<u8>> {
        self.map.lock().keys().cloned().collect()
    }
}
