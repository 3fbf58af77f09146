//! The async-signal-safe pieces a fault resolver running in a SIGBUS handler (in-thread
//! resolution) needs to talk to a peer: a spin lock, a `Fault` frame built on the stack, and
//! `send`/`recv`/`poll` loops with a deadline. No allocation, no blocking lock, no stdio. Used
//! by the FAM-aware link ([`crate::link`]) and the socket post-copy target ([`crate::socket`]).

use crate::proto::{FRAME_MARKER, HEADER_LEN, K_FAULT};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};

/// A spin lock (a signal handler cannot sleep on a mutex held by the code it interrupted).
#[derive(Default)]
pub struct SpinLock(AtomicBool);

impl SpinLock {
    /// Take the lock, spinning.
    pub fn lock(&self) {
        while self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
    }

    /// Release the lock.
    pub fn unlock(&self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The calling thread's errno.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A `Fault{region, offset}` frame of the wire protocol, on the stack.
pub fn fault_frame(region: u32, offset: u64) -> [u8; HEADER_LEN + 12] {
    let mut req = [0u8; HEADER_LEN + 12];
    req[0..2].copy_from_slice(&FRAME_MARKER.to_le_bytes());
    req[2..4].copy_from_slice(&K_FAULT.to_le_bytes());
    req[4..8].copy_from_slice(&12u32.to_le_bytes());
    req[8..12].copy_from_slice(&region.to_le_bytes());
    req[12..20].copy_from_slice(&offset.to_le_bytes());
    req
}

/// Send all of `b` on socket `fd` (`MSG_NOSIGNAL`; EINTR retried).
pub fn send_all(fd: RawFd, mut b: &[u8]) -> Result<(), &'static str> {
    while !b.is_empty() {
        // SAFETY: sending from a live buffer on a socket the caller owns.
        let n = unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return Err("the source is gone (send failed)");
        }
        b = &b[n as usize..];
    }
    Ok(())
}

/// Fill `buf` from socket `fd`, waiting at most `left_ms` milliseconds in total (decremented
/// by the time spent). A closed or reset connection and a silent peer are errors.
pub fn recv_exact(fd: RawFd, buf: &mut [u8], left_ms: &mut i32) -> Result<(), &'static str> {
    let mut got = 0;
    while got < buf.len() {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let t0 = tiermem_media::now_ns();
        // SAFETY: polling one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, *left_ms) };
        let spent = ((tiermem_media::now_ns() - t0) / 1_000_000) as i32;
        *left_ms = (*left_ms - spent).max(0);
        if r < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return Err("poll on the page-server connection failed");
        }
        if r == 0 {
            return Err("the source's page-server did not answer in time");
        }
        // SAFETY: receiving into the unfilled part of the caller's buffer.
        let n = unsafe { libc::recv(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got, 0) };
        if n == 0 {
            return Err("the source is gone (connection closed)");
        }
        if n < 0 {
            if errno() == libc::EINTR || errno() == libc::EAGAIN {
                continue;
            }
            return Err("the source is gone (connection reset)");
        }
        got += n as usize;
    }
    Ok(())
}

/// Whether `fd` has input (or EOF/error) within `ms` milliseconds (EINTR retried).
pub fn readable(fd: RawFd, ms: i32) -> std::io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: polling one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return Err(std::io::Error::last_os_error());
        }
        return Ok(r > 0);
    }
}
