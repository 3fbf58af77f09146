//! Test fixtures: a heap on either engine, reopenable (vnvm).

#![allow(dead_code)]

use tiermem_kv::heap::vnvm::{VnvmEngine, VnvmEngineConfig};
use tiermem_kv::heap::volatile::VolatileEngine;
use tiermem_kv::heap::Heap;

/// Which engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eng {
    Volatile,
    Vnvm,
}

pub const ENGINES: [Eng; 2] = [Eng::Volatile, Eng::Vnvm];

/// A heap and how to reopen it.
pub struct Fixture {
    pub eng: Eng,
    dir: Option<tempfile::TempDir>,
    heap: Option<Heap>,
    size: u64,
    log: u64,
}

impl Fixture {
    /// A 32 MiB heap (vnvm: 8 MiB log and cache, in /dev/shm).
    pub fn new(eng: Eng) -> Fixture {
        Fixture::sized(eng, 32 << 20, 8 << 20)
    }

    pub fn sized(eng: Eng, size: u64, log: u64) -> Fixture {
        let mut f = Fixture {
            eng,
            dir: None,
            heap: None,
            size,
            log,
        };
        if eng == Eng::Vnvm {
            f.dir = Some(tempfile::tempdir_in("/dev/shm").expect("tempdir in /dev/shm"));
        }
        f.open();
        f
    }

    fn cfg(&self) -> VnvmEngineConfig {
        VnvmEngineConfig {
            dir: self.dir.as_ref().unwrap().path().to_path_buf(),
            heap_size: self.size,
            log_size: self.log,
            cache_size: self.log,
        }
    }

    fn open(&mut self) {
        let heap = match self.eng {
            Eng::Volatile => {
                Heap::open(Box::new(VolatileEngine::new(self.size, true).unwrap())).unwrap()
            }
            Eng::Vnvm => {
                // The first open creates the instance in the (empty) temporary directory.
                let cfg = self.cfg();
                let fresh = std::fs::read_dir(&cfg.dir).unwrap().next().is_none();
                let e = if fresh {
                    VnvmEngine::create(&cfg)
                } else {
                    VnvmEngine::open(&cfg)
                };
                Heap::open(Box::new(e.unwrap())).unwrap()
            }
        };
        self.heap = Some(heap);
    }

    pub fn heap(&self) -> &Heap {
        self.heap.as_ref().unwrap()
    }

    /// Take the heap out (to give it to a service); `put` it back before `reopen`.
    pub fn take(&mut self) -> Heap {
        self.heap.take().unwrap()
    }

    /// vnvm: close and open the heap again (everything must come back from the root).
    /// Volatile: nothing (its memory is the only copy).
    pub fn reopen(&mut self) -> bool {
        if self.eng != Eng::Vnvm {
            return false;
        }
        self.heap = None;
        self.open();
        true
    }

    /// vnvm: drop a heap taken with `take` and open it again.
    pub fn reopen_from(&mut self, h: Heap) -> bool {
        drop(h);
        if self.eng != Eng::Vnvm {
            return false;
        }
        self.open();
        true
    }
}

/// A small deterministic PRNG (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
    /// Bytes of a random length in 0..max (mostly short), from a small alphabet.
    pub fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = if self.chance(90) {
            self.below(24.min(max as u64).max(1)) as usize
        } else {
            self.below(max as u64) as usize
        };
        (0..n).map(|_| b'a' + self.below(26) as u8).collect()
    }
}
