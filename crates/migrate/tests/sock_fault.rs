//! End to end over a real veth: a socket page-server in the source namespace, a fault client
//! in the target namespace. Measures the round trip of one 4 KiB fault (the socket post-copy
//! baseline's per-fault cost); run with `--nocapture` to see the numbers.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use tiermem_migrate::netns::{Host, TwoHosts};
use tiermem_migrate::proto::{Conn, ProtoError, PAGE};
use tiermem_migrate::sockpage::{serve_one, FaultClient, ServerStats};

const MIG: u64 = 0x5eed_0000_0001;

fn region(seed: u8, pages: usize) -> Vec<u8> {
    (0..pages * PAGE)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i / PAGE) as u8))
        .collect()
}

/// Server in src, client connected from dst; returns the client and the server thread.
fn setup(
    h: &TwoHosts,
    regions: Arc<Vec<Vec<u8>>>,
) -> (
    FaultClient,
    std::thread::JoinHandle<tiermem_migrate::proto::Result<ServerStats>>,
) {
    let src = h.src_addr();
    let l = h
        .run_in(Host::Src, move || TcpListener::bind((src, 0)))
        .unwrap()
        .unwrap();
    let port = l.local_addr().unwrap().port();
    let srv = std::thread::spawn(move || serve_one(&l, MIG, regions, None));
    let s = h
        .run_in(Host::Dst, move || TcpStream::connect((src, port)))
        .unwrap()
        .unwrap();
    let conn = Conn::new(s, Some(Duration::from_millis(500))).unwrap();
    (FaultClient::connect(conn, MIG).unwrap(), srv)
}

#[test]
fn random_faults_over_veth_with_latency() {
    let h = TwoHosts::create("tms").unwrap();
    let regions = Arc::new(vec![region(1, 256), region(2, 64)]);
    let (mut client, srv) = setup(&h, regions.clone());
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut page = [0u8; PAGE];
    let n = 2000;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let r = rng.gen_range(0..2u32);
        let len = regions[r as usize].len() as u64;
        let off = rng.gen_range(0..len);
        let t = Instant::now();
        client.fetch(r, off, &mut page).unwrap();
        lat.push(t.elapsed());
        let p = (off as usize) & !(PAGE - 1);
        assert_eq!(&page[..], &regions[r as usize][p..p + PAGE]);
    }
    // A bad request is refused, the connection survives.
    let e = client.fetch(5, 0, &mut page).unwrap_err();
    assert!(matches!(e, ProtoError::Remote(_)), "{e}");
    client.fetch(0, 0, &mut page).unwrap();
    drop(client);
    let st = srv.join().unwrap().unwrap();
    assert_eq!(
        st,
        ServerStats {
            faults: n as u64 + 1,
            refused: 1
        }
    );
    lat.sort();
    let pct = |q: f64| lat[((n as f64 * q) as usize).min(n - 1)];
    println!(
        "4 KiB fault round trip over veth ({n} faults): p50 {:?} p90 {:?} p99 {:?} max {:?}",
        pct(0.50),
        pct(0.90),
        pct(0.99),
        lat[n - 1]
    );
    assert!(pct(0.5) < Duration::from_millis(20));
}

#[test]
fn dead_source_fails_fault_promptly() {
    let h = TwoHosts::create("tms").unwrap();
    let src = h.src_addr();
    // A "source" that completes the handshake and then goes silent, then dies.
    let l = h
        .run_in(Host::Src, move || TcpListener::bind((src, 0)))
        .unwrap()
        .unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let srv = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut c = Conn::new(s, Some(Duration::from_secs(2))).unwrap();
        c.server_handshake(MIG).unwrap();
        rx.recv().unwrap(); // silent until told to die
        drop(c);
    });
    let s = h
        .run_in(Host::Dst, move || TcpStream::connect((src, port)))
        .unwrap()
        .unwrap();
    let conn = Conn::new(s, Some(Duration::from_millis(150))).unwrap();
    let mut client = FaultClient::connect(conn, MIG).unwrap();
    let mut page = [0u8; PAGE];
    let t = Instant::now();
    let e = client.fetch(0, 0, &mut page).unwrap_err();
    assert!(matches!(e, ProtoError::Timeout(_)), "{e}");
    assert!(t.elapsed() < Duration::from_secs(1));
    tx.send(()).unwrap();
    srv.join().unwrap();
    let t = Instant::now();
    let e = client.fetch(0, 0, &mut page).unwrap_err();
    assert!(
        matches!(e, ProtoError::PeerGone { .. }),
        "expected PeerGone, got {e}"
    );
    assert!(t.elapsed() < Duration::from_secs(1));
}
