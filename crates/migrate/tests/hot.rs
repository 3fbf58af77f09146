//! The hot-page manifest end to end: a writer updates a hot set (2 % of the pages, skewed)
//! before the freeze; the source records it ([`HotPageRecorder`]), dumps its vectors first, and
//! the target prefetches them at resume: its workload over the hot set then needs fewer
//! requests to the source than without a manifest, and every byte arrives either way.

use rand::{Rng, SeedableRng};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;
use tiermem_media::DelayModel;
use tiermem_migrate::fam::{FamSource, FamSourceConfig, FamTarget};
use tiermem_migrate::hot::{budget_vectors, select, HotPageRecorder};
use tiermem_migrate::lazyfile::Batching;
use tiermem_migrate::netns::{Host, TwoHosts};

const PAGE: usize = 4096;

struct Map(*mut u8, usize);
impl Map {
    fn new(len: usize) -> Map {
        // SAFETY: a fresh private anonymous mapping; checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Map(p as *mut u8, len)
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: the live mapping.
        unsafe { std::slice::from_raw_parts(self.0, self.1) }
    }
}
impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: our mapping.
        unsafe { libc::munmap(self.0 as *mut libc::c_void, self.1) };
    }
}

struct Run {
    sent_pages: u64,
    on_demand: u64,
    requests: u64,
    prefetched: u64,
    hot_vectors: u64,
}

fn migrate(hosts: &TwoHosts, src: &Map, hot: &[u64], manifest: bool, id: u64) -> Run {
    let fam = tempfile::tempdir_in("/dev/shm").unwrap();
    let listener = hosts
        .run_in(Host::Src, || TcpListener::bind((hosts.src_addr(), 0)))
        .unwrap()
        .unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let cfg = FamSourceConfig {
        fam: fam.path().to_path_buf(),
        id,
        batching: Batching::PerVector,
        delay: DelayModel::preset("pcm-fam").unwrap(),
        skip_untouched: false,
    };
    let manifest_v: Vec<Vec<u64>> = if manifest {
        vec![hot.to_vec()]
    } else {
        Vec::new()
    };
    // The source keeps what the medium delivers in its first milliseconds.
    let sent: Vec<Vec<u64>> = manifest_v
        .iter()
        .map(|h| select(h, budget_vectors(&cfg.delay), src.1 as u64))
        .collect();
    // SAFETY: `src` is not written until serve returns (joined below).
    let source = unsafe {
        FamSource::checkpoint_with_hot(cfg, &[(src.0, src.1 as u64)], b"hot", &manifest_v)
    }
    .unwrap();
    let server = std::thread::spawn(move || source.serve(listener));
    let fam_path = fam.path().to_path_buf();
    let target = hosts
        .run_in(Host::Dst, move || {
            FamTarget::restore(
                &fam_path,
                id,
                Some(addr),
                DelayModel::NONE,
                Duration::from_secs(5),
            )
        })
        .unwrap()
        .unwrap();
    assert_eq!(target.hot_pages(), &sent[..]);
    let sent_pages = sent.iter().map(Vec::len).sum::<usize>() as u64;
    let prefetched = if manifest {
        target.prefetch_hot().pages
    } else {
        0
    };
    // The resumed application works on its hot set first.
    let r = &target.regions()[0];
    // SAFETY: the registered region; pages fault in on first touch.
    let dst = unsafe { std::slice::from_raw_parts(r.as_ptr() as *const u8, src.1) };
    let s = src.bytes();
    for &o in hot {
        let o = o as usize;
        assert!(dst[o..o + PAGE] == s[o..o + PAGE], "hot page {o:#x}");
    }
    let (_, on_demand) = target.fault_counts();
    let requests = target.requests();
    let report = server.join().unwrap().unwrap();
    target.complete();
    assert!(dst == s, "every byte arrived");
    Run {
        sent_pages,
        on_demand,
        requests,
        prefetched,
        hot_vectors: report.hot_vectors,
    }
}

#[test]
fn a_hot_page_manifest_cuts_the_early_on_demand_faults() {
    let hosts = TwoHosts::create("tmhot").expect("network namespaces (root)");
    let len: usize = 128 << 20;
    let pages = len / PAGE;
    let src = Map::new(len);
    let mut rng = rand::rngs::StdRng::seed_from_u64(51);
    // SAFETY: the mapping, exclusively ours here.
    rng.fill(unsafe { std::slice::from_raw_parts_mut(src.0, len) });
    // The hot set: 2 % of the pages, in the last eighth of the region (the sweep reaches it
    // last), updated with a skewed (zipf-like) frequency.
    let mut hot_set: Vec<usize> = Vec::new();
    while hot_set.len() < pages / 50 {
        let p = pages - 1 - rng.gen_range(0..pages / 8);
        if !hot_set.contains(&p) {
            hot_set.push(p);
        }
    }
    let mut rec = HotPageRecorder::start(src.0, len, 64 << 10).unwrap();
    let write = |p: usize, v: u64| {
        // SAFETY: inside the mapping (a counter word of page `p`).
        unsafe { (src.0.add(p * PAGE + 8 * (v as usize % 512)) as *mut u64).write_volatile(v) };
    };
    for (i, &p) in hot_set.iter().enumerate() {
        write(p, i as u64);
    }
    for v in 0..200_000u64 {
        let u: f64 = rng.gen();
        let rank = ((hot_set.len() as f64) * u * u * u) as usize;
        write(hot_set[rank.min(hot_set.len() - 1)], v);
    }
    let hot = rec.take().unwrap();
    drop(rec);
    let mut want: Vec<u64> = hot_set.iter().map(|&p| (p * PAGE) as u64).collect();
    want.sort_unstable();
    assert_eq!(hot, want, "the recorder saw exactly the written pages");

    let without = migrate(&hosts, &src, &hot, false, 0x4070_0001);
    let with = migrate(&hosts, &src, &hot, true, 0x4070_0002);
    eprintln!(
        "128 MiB pcm-fam, {} hot pages: on-demand faults without manifest {} ({} requests), \
         with {} ({} requests; {} hot pages prefetched, {} hot vectors dumped first)",
        hot.len(),
        without.on_demand,
        without.requests,
        with.on_demand,
        with.requests,
        with.prefetched,
        with.hot_vectors
    );
    assert!(with.sent_pages > 0 && with.sent_pages <= hot.len() as u64);
    assert_eq!(with.prefetched, with.sent_pages);
    assert!(with.hot_vectors >= 1 && without.hot_vectors == 0);
    assert!(
        with.requests < without.requests && with.on_demand < without.on_demand,
        "the manifest cut the requests to the source"
    );
}
