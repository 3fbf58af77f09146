//! Connection input buffers whose big allocations go back to the kernel the moment they are
//! freed.
//!
//! A buffer below [`BIG`] bytes of capacity is a plain `Vec<u8>`. At or above it, it is an
//! anonymous mapping of its own: freeing or shrinking it unmaps pages at once, whatever the
//! allocator's thresholds. glibc serves 1 MiB buffers from a thread's arena once its mmap
//! threshold has risen past them, and what is freed at the top of a thread's arena stays
//! resident until its trim threshold: `malloc_trim` does not return it. After a flood of 200
//! unfinished 1 MiB requests, two event-loop arenas kept 51 MiB of 191 MiB resident (one run in
//! a dozen). Changing glibc's thresholds (`mallopt`) would change the allocator of a program
//! that embeds the server; this changes only the server's own buffers.

use std::ops::{Deref, DerefMut};

/// Capacities from which a buffer is a mapping of its own.
pub const BIG: usize = 1 << 20;

enum Store {
    Heap(Vec<u8>),
    Map {
        ptr: *mut u8,
        cap: usize,
        len: usize,
    },
}

/// A growable byte buffer (the subset of `Vec<u8>` the event loop uses).
pub struct IoBuf {
    store: Store,
}

// SAFETY: the mapping is owned by the buffer alone; it is plain memory.
unsafe impl Send for IoBuf {}

impl Default for IoBuf {
    fn default() -> Self {
        IoBuf::new()
    }
}

fn map(cap: usize) -> *mut u8 {
    // SAFETY: a fresh private anonymous mapping; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            cap,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        // As Vec does when the allocator fails.
        std::alloc::handle_alloc_error(
            std::alloc::Layout::from_size_align(cap, 4096).expect("a page-aligned layout"),
        );
    }
    p.cast()
}

impl IoBuf {
    /// An empty buffer (no allocation).
    pub fn new() -> IoBuf {
        IoBuf {
            store: Store::Heap(Vec::new()),
        }
    }

    /// An empty buffer of at least `cap` bytes of capacity.
    pub fn with_capacity(cap: usize) -> IoBuf {
        let mut b = IoBuf::new();
        b.reserve(cap);
        b
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        match &self.store {
            Store::Heap(v) => v.len(),
            Store::Map { len, .. } => *len,
        }
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes it can hold without growing.
    pub fn capacity(&self) -> usize {
        match &self.store {
            Store::Heap(v) => v.capacity(),
            Store::Map { cap, .. } => *cap,
        }
    }

    /// Empties it (the capacity stays).
    pub fn clear(&mut self) {
        match &mut self.store {
            Store::Heap(v) => v.clear(),
            Store::Map { len, .. } => *len = 0,
        }
    }

    /// Replaces the storage with one of `cap` bytes holding the current contents.
    fn resize_storage(&mut self, cap: usize) {
        let len = self.len();
        debug_assert!(cap >= len);
        let new = if cap >= BIG {
            let cap = cap.next_multiple_of(4096);
            let ptr = map(cap);
            // SAFETY: `len` bytes from the old storage into the new mapping (≥ len bytes).
            unsafe { std::ptr::copy_nonoverlapping(self.as_ptr(), ptr, len) };
            Store::Map { ptr, cap, len }
        } else {
            let mut v = Vec::with_capacity(cap);
            v.extend_from_slice(self);
            Store::Heap(v)
        };
        // The old storage is freed (unmapped) when replaced.
        self.store = new;
    }

    /// Makes room for at least `additional` more bytes (amortised: at least doubling).
    pub fn reserve(&mut self, additional: usize) {
        let need = self
            .len()
            .checked_add(additional)
            .expect("capacity overflow");
        if need <= self.capacity() {
            return;
        }
        let cap = need.max(2 * self.capacity());
        match &mut self.store {
            Store::Heap(v) if cap < BIG => v.reserve(need - v.len()),
            _ => self.resize_storage(cap),
        }
    }

    /// Appends `s`.
    pub fn extend_from_slice(&mut self, s: &[u8]) {
        self.reserve(s.len());
        let len = self.len();
        // SAFETY: `reserve` made room for s.len() bytes after `len`.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), self.spare_ptr(), s.len());
            self.set_len(len + s.len());
        }
    }

    /// Removes the first `n` bytes (the rest moves to the front).
    pub fn consume_front(&mut self, n: usize) {
        let len = self.len();
        assert!(n <= len, "consume_front({n}) of {len} bytes");
        match &mut self.store {
            Store::Heap(v) => {
                v.drain(..n);
            }
            Store::Map { ptr, len, .. } => {
                // SAFETY: both ranges lie inside the mapping's first `len` bytes.
                unsafe { std::ptr::copy(ptr.add(n), *ptr, *len - n) };
                *len -= n;
            }
        }
    }

    /// Shrinks the capacity to about `min` bytes (at least the length).
    pub fn shrink_to(&mut self, min: usize) {
        let target = min.max(self.len());
        if target >= self.capacity() {
            return;
        }
        match &mut self.store {
            Store::Heap(v) => v.shrink_to(target),
            Store::Map { .. } => self.resize_storage(target),
        }
    }

    /// First byte of the spare capacity.
    pub fn spare_ptr(&mut self) -> *mut u8 {
        let len = self.len();
        // SAFETY: `len` ≤ capacity: one past the contents at most.
        unsafe { self.as_mut_ptr().add(len) }
    }

    /// Sets the length.
    ///
    /// # Safety
    /// `len` ≤ capacity, and the bytes up to it are initialised.
    pub unsafe fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity());
        match &mut self.store {
            // SAFETY: the caller's contract.
            Store::Heap(v) => unsafe { v.set_len(len) },
            Store::Map { len: l, .. } => *l = len,
        }
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.store {
            Store::Heap(v) => v,
            // SAFETY: the first `len` bytes of the live mapping are initialised.
            Store::Map { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.store {
            Store::Heap(v) => v,
            // SAFETY: as above, borrowed exclusively.
            Store::Map { ptr, len, .. } => unsafe { std::slice::from_raw_parts_mut(*ptr, *len) },
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Store::Map { ptr, cap, .. } = *self {
            // SAFETY: the mapping this store owns, no longer referenced.
            unsafe { libc::munmap(ptr.cast(), cap) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_into_a_mapping_and_back_keeping_the_bytes() {
        let mut b = IoBuf::new();
        let data: Vec<u8> = (0..3 * BIG).map(|i| (i * 7 % 251) as u8).collect();
        for c in data.chunks(40_000) {
            b.extend_from_slice(c);
        }
        assert_eq!(&b[..], &data[..]);
        assert!(b.capacity() >= BIG && matches!(b.store, Store::Map { .. }));
        b.consume_front(BIG + 5);
        assert_eq!(&b[..], &data[BIG + 5..]);
        b.consume_front(b.len() - 100);
        b.shrink_to(4096);
        assert_eq!(&b[..], &data[data.len() - 100..]);
        assert!(b.capacity() < BIG && matches!(b.store, Store::Heap(_)));
        b.clear();
        assert!(b.is_empty());
        let mut s = IoBuf::with_capacity(2 * BIG);
        // SAFETY: writing inside the reserved capacity, then declaring it initialised.
        unsafe {
            s.spare_ptr().write_bytes(9, 10);
            s.set_len(10);
        }
        assert_eq!(&s[..], &[9u8; 10]);
    }
}
