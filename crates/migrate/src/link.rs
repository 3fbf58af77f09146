//! The target's connection to the source's page-server, usable from a fault resolver that runs
//! in a signal handler (in-thread resolution): a spin lock, a fixed stack buffer, and only
//! async-signal-safe system calls (`send`, `recv`, `poll`). Never blocks past its timeout: a dead
//! source (EOF, reset) or a silent one fails the request with a static reason.

use crate::proto::{FRAME_MARKER, HEADER_LEN, K_DONE, K_ERROR, K_FAULT_REPLY};
use crate::resolve::{DumpReply, PageServerLink};
use crate::sigsafe::{fault_frame, recv_exact, send_all, SpinLock};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const FAULT_REPLY_LEN: usize = 29;
const DONE_LEN: usize = 4;

/// A signal-safe page-server link over a TCP connection that has completed the handshake
/// ([`crate::proto::Conn::client_handshake`]).
pub struct SignalSafeLink {
    stream: TcpStream,
    lock: SpinLock,
    timeout_ms: i32,
    done: AtomicBool,
    requests: AtomicU64,
}

impl SignalSafeLink {
    /// Wrap `stream`; every request waits at most `timeout` for its reply.
    pub fn new(stream: TcpStream, timeout: Duration) -> SignalSafeLink {
        SignalSafeLink {
            stream,
            lock: SpinLock::default(),
            timeout_ms: timeout.as_millis().clamp(1, i32::MAX as u128) as i32,
            done: AtomicBool::new(false),
            requests: AtomicU64::new(0),
        }
    }

    /// The source announced that every page is dumped (seen while waiting for a reply).
    pub fn saw_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Requests sent.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn exchange(&self, region: u32, off: u64) -> Result<DumpReply, &'static str> {
        let fd = self.stream.as_raw_fd();
        send_all(fd, &fault_frame(region, off))?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut left = self.timeout_ms;
        loop {
            let mut h = [0u8; HEADER_LEN];
            recv_exact(fd, &mut h, &mut left)?;
            let marker = u16::from_le_bytes([h[0], h[1]]);
            let kind = u16::from_le_bytes([h[2], h[3]]);
            let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
            if marker != FRAME_MARKER {
                return Err("protocol error: bad frame marker from the page-server");
            }
            match (kind, len) {
                (K_FAULT_REPLY, FAULT_REPLY_LEN) => {
                    let mut b = [0u8; FAULT_REPLY_LEN];
                    recv_exact(fd, &mut b, &mut left)?;
                    // b is FAULT_REPLY_LEN = 29 bytes; fields at 0, 5, 13, 21 fit.
                    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
                    let r_region = u32::from_le_bytes(b[0..4].try_into().unwrap());
                    if b[4] != 1 {
                        return Err("the page-server could not dump the vector (nack)");
                    }
                    if r_region != region {
                        return Err("protocol error: reply for another region");
                    }
                    return Ok(DumpReply {
                        progress: u64_at(5),
                        vec_start: u64_at(13),
                        vec_len: u64_at(21),
                    });
                }
                (K_DONE, DONE_LEN) => {
                    let mut b = [0u8; DONE_LEN];
                    recv_exact(fd, &mut b, &mut left)?;
                    self.done.store(true, Ordering::Release);
                }
                (K_ERROR, _) => return Err("the page-server reported an error"),
                _ => return Err("protocol error: unexpected message from the page-server"),
            }
        }
    }
}

impl PageServerLink for SignalSafeLink {
    fn request(&self, region: u32, off: u64) -> Result<DumpReply, &'static str> {
        self.lock.lock();
        let r = self.exchange(region, off);
        self.lock.unlock();
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Conn, Msg};
    use std::net::TcpListener;

    #[test]
    fn replies_done_and_a_dead_source() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut c = Conn::new(s, Some(Duration::from_secs(5))).unwrap();
            c.server_handshake(7).unwrap();
            // First fault: a Done arrives before the reply (the link must skip it).
            let Msg::Fault { region, offset } = c.recv().unwrap() else {
                panic!()
            };
            c.send(&Msg::Done { region_count: 1 }).unwrap();
            c.send(&Msg::FaultReply {
                region,
                ack: true,
                progress: 1 << 20,
                vec_start: offset & !((2 << 20) - 1),
                vec_len: 2 << 20,
            })
            .unwrap();
            // Second fault: the source dies without answering.
            let _ = c.recv().unwrap();
        });
        let s = TcpStream::connect(addr).unwrap();
        let mut c = Conn::new(s.try_clone().unwrap(), Some(Duration::from_secs(5))).unwrap();
        c.client_handshake(7).unwrap();
        let link = SignalSafeLink::new(s, Duration::from_millis(500));
        let r = link.request(0, (5 << 20) + 123).unwrap();
        assert_eq!(
            r,
            DumpReply {
                progress: 1 << 20,
                vec_start: 4 << 20,
                vec_len: 2 << 20
            }
        );
        assert!(link.saw_done());
        let t0 = std::time::Instant::now();
        let e = link.request(0, 0).unwrap_err();
        assert!(e.contains("gone"), "{e}");
        assert!(
            t0.elapsed() < Duration::from_millis(400),
            "a dead source fails fast"
        );
        server.join().unwrap();
    }

    #[test]
    fn a_silent_source_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_peer, _) = l.accept().unwrap(); // accepts, never answers
        let link = SignalSafeLink::new(s, Duration::from_millis(150));
        let t0 = std::time::Instant::now();
        let e = link.request(0, 0).unwrap_err();
        assert!(e.contains("in time"), "{e}");
        let t = t0.elapsed();
        assert!(
            t >= Duration::from_millis(140) && t < Duration::from_secs(2),
            "{t:?}"
        );
    }
}
