//! The page-server wire protocol (source ↔ target), over a byte stream (TCP).
//!
//! # Wire format
//!
//! Every message is one frame, all integers little-endian:
//!
//! ```text
//! frame  = marker:u16 = 0x4D47 ("GM" on the wire) | kind:u16 | len:u32 | payload[len]
//! kind 1 Hello      = magic:u64 = "TMMIGRAT" | version:u32 | migration_id:u64       (len 20)
//! kind 2 HelloAck   = version:u32 | migration_id:u64                                 (len 12)
//! kind 3 Fault      = region:u32 | offset:u64                                        (len 12)
//! kind 4 FaultReply = region:u32 | ack:u8 (0|1) | progress:u64 | vec_start:u64 | vec_len:u64
//!                                                                                    (len 29)
//! kind 5 Done       = region_count:u32                                               (len 4)
//! kind 6 Pages      = region:u32 | offset:u64 | data[len - 12]
//!                     offset % 4096 == 0, data length a non-zero multiple of 4096, <= 2 MiB
//! kind 7 Error      = message: UTF-8, <= 4096 bytes
//! ```
//!
//! The connection starts with `Hello` (target → source: the target connects to the
//! page-server) answered by `HelloAck` with the same version and id. Decoding is strict: a bad
//! marker, an unknown kind, a payload length that does not match the kind (or exceeds
//! [`MAX_PAYLOAD`]: the largest allocation a peer can cause), a bad magic or version, an ack
//! byte other than 0/1, misaligned pages or invalid UTF-8 are all refused with a
//! [`ProtoError`] naming the problem.
//!
//! [`Conn`] wraps a `TcpStream` with deadlines: a receive that does not complete within the
//! timeout yields [`ProtoError::Timeout`], a peer that closes or resets the connection yields
//! [`ProtoError::PeerGone`] (also in the middle of a message), so the target never hangs on
//! a dead source. `Pages` are sent with `writev` straight from the caller's memory.

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Frame marker, the first two bytes of every frame (`"GM"` on the wire).
pub const FRAME_MARKER: u16 = 0x4D47;
/// Magic in `Hello`.
pub const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"TMMIGRAT");
/// Protocol version; a peer with another version is refused.
pub const VERSION: u32 = 1;
/// Frame header length.
pub const HEADER_LEN: usize = 8;
/// Page size the protocol transfers in.
pub const PAGE: usize = 4096;
/// Maximum data bytes in one `Pages` message.
pub const MAX_PAGES_DATA: usize = 2 << 20;
/// Fixed part of a `Pages` payload (region, offset).
pub const PAGES_FIXED: usize = 12;
/// Maximum payload length of any frame (a `Pages` message with 2 MiB of data).
pub const MAX_PAYLOAD: usize = PAGES_FIXED + MAX_PAGES_DATA;
/// Maximum length of an `Error` message text.
pub const MAX_ERROR_LEN: usize = 4096;

// Message kinds on the wire (`kind` of the frame header).
const K_HELLO: u16 = 1;
const K_HELLO_ACK: u16 = 2;
pub(crate) const K_FAULT: u16 = 3;
pub(crate) const K_FAULT_REPLY: u16 = 4;
pub(crate) const K_DONE: u16 = 5;
pub(crate) const K_PAGES: u16 = 6;
pub(crate) const K_ERROR: u16 = 7;

/// One protocol message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Target → source, first message: which migration, which protocol version.
    Hello {
        /// The migration id (`mig-<id>` directory).
        migration_id: u64,
        /// The sender's protocol version.
        version: u32,
    },
    /// Source → target: handshake accepted (same version and id).
    HelloAck {
        /// The protocol version.
        version: u32,
        /// The migration id, echoed.
        migration_id: u64,
    },
    /// Target → source: the page at `offset` of `region` is needed.
    Fault {
        /// Region index in the checkpoint.
        region: u32,
        /// Region offset of the faulting page (any offset inside the page).
        offset: u64,
    },
    /// Source → target, FAM-aware post-copy: the vector holding the fault is dumped.
    FaultReply {
        /// Region index.
        region: u32,
        /// `true` if the vector is dumped and persisted in the lazy file.
        ack: bool,
        /// The dump progress watermark: every page below it is dumped and persisted.
        progress: u64,
        /// Start offset of the vector dumped for this fault.
        vec_start: u64,
        /// Length of that vector, bytes.
        vec_len: u64,
    },
    /// Source → target: every page of `region_count` regions is dumped and persisted; the
    /// source may exit.
    Done {
        /// Number of regions completed (all of them).
        region_count: u32,
    },
    /// Source → target, socket post-copy baseline: raw page contents.
    Pages {
        /// Region index.
        region: u32,
        /// Page-aligned region offset of `data[0]`.
        offset: u64,
        /// Page contents, a non-zero multiple of 4096 bytes, at most 2 MiB.
        data: Vec<u8>,
    },
    /// Either direction: the peer gives up, with a reason.
    Error {
        /// Human-readable reason (at most 4096 bytes).
        message: String,
    },
}

/// Protocol and transport errors.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// The peer closed or reset the connection (`mid_message`: inside a frame).
    #[error("peer gone (connection closed{})", if *.mid_message { " in the middle of a message" } else { "" })]
    PeerGone {
        /// The connection ended inside a frame (not at a message boundary).
        mid_message: bool,
    },
    /// No complete message within the deadline.
    #[error("timed out after {0:?} waiting for the peer")]
    Timeout(Duration),
    /// The frame does not start with the marker (stream out of sync or not our protocol).
    #[error("bad frame marker {0:#06x} (not a tiermem-migrate peer, or stream out of sync)")]
    BadMarker(u16),
    /// Unknown message kind.
    #[error("unknown message type {0}")]
    UnknownType(u16),
    /// Payload length out of range for the kind.
    #[error("bad payload length {len} for message type {kind} (allowed {min}..={max})")]
    BadLength {
        /// Message kind.
        kind: u16,
        /// Length announced.
        len: u32,
        /// Minimum allowed.
        min: usize,
        /// Maximum allowed.
        max: usize,
    },
    /// `Hello` with a wrong magic.
    #[error("bad hello magic {0:#018x}")]
    BadMagic(u64),
    /// Protocol version mismatch.
    #[error("protocol version {got} not supported (this side speaks {VERSION})")]
    BadVersion {
        /// The peer's version.
        got: u32,
    },
    /// A field has an invalid value.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The peer sent an unexpected message (handshake, reply matching).
    #[error("unexpected message: expected {expected}, got {got}")]
    Unexpected {
        /// What was expected.
        expected: &'static str,
        /// What arrived (kind name).
        got: &'static str,
    },
    /// The peer reported an error.
    #[error("peer error: {0}")]
    Remote(String),
    /// Other I/O error.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
}

/// Result of the protocol layer.
pub type Result<T> = std::result::Result<T, ProtoError>;

impl Msg {
    /// The message kind's name (for errors and logs).
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Hello { .. } => "Hello",
            Msg::HelloAck { .. } => "HelloAck",
            Msg::Fault { .. } => "Fault",
            Msg::FaultReply { .. } => "FaultReply",
            Msg::Done { .. } => "Done",
            Msg::Pages { .. } => "Pages",
            Msg::Error { .. } => "Error",
        }
    }
}

fn header(kind: u16, len: usize) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..2].copy_from_slice(&FRAME_MARKER.to_le_bytes());
    h[2..4].copy_from_slice(&kind.to_le_bytes());
    h[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// Checks `Pages` parameters (shared by encoder and decoder).
fn check_pages(offset: u64, len: usize) -> Result<()> {
    if offset % PAGE as u64 != 0 {
        return Err(ProtoError::Malformed(format!(
            "Pages offset {offset:#x} not page aligned"
        )));
    }
    if len == 0 || len % PAGE != 0 || len > MAX_PAGES_DATA {
        return Err(ProtoError::Malformed(format!(
            "Pages data length {len} not a non-zero multiple of {PAGE} up to {MAX_PAGES_DATA}"
        )));
    }
    Ok(())
}

/// Encodes `msg` as one frame (header + payload) into a new buffer. Fails on values the
/// decoder would refuse (misaligned or oversized pages, an over-long error text).
pub fn encode(msg: &Msg) -> Result<Vec<u8>> {
    let mut p = Vec::with_capacity(32);
    let kind = match msg {
        Msg::Hello {
            migration_id,
            version,
        } => {
            p.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
            p.extend_from_slice(&version.to_le_bytes());
            p.extend_from_slice(&migration_id.to_le_bytes());
            K_HELLO
        }
        Msg::HelloAck {
            version,
            migration_id,
        } => {
            p.extend_from_slice(&version.to_le_bytes());
            p.extend_from_slice(&migration_id.to_le_bytes());
            K_HELLO_ACK
        }
        Msg::Fault { region, offset } => {
            p.extend_from_slice(&region.to_le_bytes());
            p.extend_from_slice(&offset.to_le_bytes());
            K_FAULT
        }
        Msg::FaultReply {
            region,
            ack,
            progress,
            vec_start,
            vec_len,
        } => {
            p.extend_from_slice(&region.to_le_bytes());
            p.push(*ack as u8);
            p.extend_from_slice(&progress.to_le_bytes());
            p.extend_from_slice(&vec_start.to_le_bytes());
            p.extend_from_slice(&vec_len.to_le_bytes());
            K_FAULT_REPLY
        }
        Msg::Done { region_count } => {
            p.extend_from_slice(&region_count.to_le_bytes());
            K_DONE
        }
        Msg::Pages {
            region,
            offset,
            data,
        } => {
            check_pages(*offset, data.len())?;
            p.reserve(PAGES_FIXED + data.len());
            p.extend_from_slice(&region.to_le_bytes());
            p.extend_from_slice(&offset.to_le_bytes());
            p.extend_from_slice(data);
            K_PAGES
        }
        Msg::Error { message } => {
            if message.len() > MAX_ERROR_LEN {
                return Err(ProtoError::Malformed(format!(
                    "Error text of {} bytes (max {MAX_ERROR_LEN})",
                    message.len()
                )));
            }
            p.extend_from_slice(message.as_bytes());
            K_ERROR
        }
    };
    let mut f = Vec::with_capacity(HEADER_LEN + p.len());
    f.extend_from_slice(&header(kind, p.len()));
    f.extend_from_slice(&p);
    Ok(f)
}

/// Writes `msg` as one frame (one `write_all` of the encoded frame).
pub fn write_msg<W: Write>(w: &mut W, msg: &Msg) -> Result<()> {
    if let Msg::Pages {
        region,
        offset,
        data,
    } = msg
    {
        return write_pages(w, *region, *offset, data);
    }
    w.write_all(&encode(msg)?).map_err(map_write_err)
}

/// Writes a `Pages` frame without copying `data`: the 20-byte header and the data slice go
/// out with vectored writes (`writev` on sockets).
pub fn write_pages<W: Write>(w: &mut W, region: u32, offset: u64, data: &[u8]) -> Result<()> {
    check_pages(offset, data.len())?;
    let mut hdr = [0u8; HEADER_LEN + PAGES_FIXED];
    hdr[..HEADER_LEN].copy_from_slice(&header(K_PAGES, PAGES_FIXED + data.len()));
    hdr[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&region.to_le_bytes());
    hdr[HEADER_LEN + 4..].copy_from_slice(&offset.to_le_bytes());
    let (mut h, mut d) = (0usize, 0usize);
    while h < hdr.len() || d < data.len() {
        let bufs = [IoSlice::new(&hdr[h..]), IoSlice::new(&data[d..])];
        let n = match w.write_vectored(&bufs) {
            Ok(0) => return Err(ProtoError::PeerGone { mid_message: true }),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(map_write_err(e)),
        };
        let hn = n.min(hdr.len() - h);
        h += hn;
        d += n - hn;
    }
    Ok(())
}

fn map_write_err(e: io::Error) -> ProtoError {
    match e.kind() {
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::NotConnected => ProtoError::PeerGone { mid_message: false },
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ProtoError::Timeout(Duration::ZERO),
        _ => ProtoError::Io(e),
    }
}

/// Reads as much of `buf` as arrives; returns the count (less than `buf.len()` only at EOF).
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut pos = 0;
    while pos < buf.len() {
        match r.read(&mut buf[pos..]) {
            Ok(0) => break,
            Ok(n) => pos += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(pos)
}

fn map_read_err(e: io::Error, mid_message: bool) -> ProtoError {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => ProtoError::PeerGone { mid_message },
        // The deadline reader reports its timeout as TimedOut; the Conn fills in the duration.
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ProtoError::Timeout(Duration::ZERO),
        _ => ProtoError::Io(e),
    }
}

/// Field of a payload whose length `read_msg` checked against its kind's fixed layout before
/// decoding: every `at + 4` used is within it, and a 4-byte slice always converts.
fn u32_at(p: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(p[at..at + 4].try_into().unwrap())
}

/// As [`u32_at`], 8 bytes.
fn u64_at(p: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(p[at..at + 8].try_into().unwrap())
}

/// Reads one frame and decodes it. A clean end of stream before the first byte is
/// [`ProtoError::PeerGone`] with `mid_message: false`; anywhere later, `mid_message: true`.
/// The payload length is checked against the kind before anything is allocated.
pub fn read_msg<R: Read>(r: &mut R) -> Result<Msg> {
    let mut h = [0u8; HEADER_LEN];
    let n = read_full(r, &mut h).map_err(|e| map_read_err(e, false))?;
    if n < HEADER_LEN {
        return Err(ProtoError::PeerGone { mid_message: n > 0 });
    }
    let marker = u16::from_le_bytes([h[0], h[1]]);
    if marker != FRAME_MARKER {
        return Err(ProtoError::BadMarker(marker));
    }
    let kind = u16::from_le_bytes([h[2], h[3]]);
    let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    let (min, max) = match kind {
        K_HELLO => (20, 20),
        K_HELLO_ACK => (12, 12),
        K_FAULT => (12, 12),
        K_FAULT_REPLY => (29, 29),
        K_DONE => (4, 4),
        K_PAGES => (PAGES_FIXED + PAGE, MAX_PAYLOAD),
        K_ERROR => (0, MAX_ERROR_LEN),
        _ => return Err(ProtoError::UnknownType(kind)),
    };
    if (len as usize) < min || len as usize > max {
        return Err(ProtoError::BadLength {
            kind,
            len,
            min,
            max,
        });
    }
    let mut p = vec![0u8; len as usize];
    let n = read_full(r, &mut p).map_err(|e| map_read_err(e, true))?;
    if n < p.len() {
        return Err(ProtoError::PeerGone { mid_message: true });
    }
    Ok(match kind {
        K_HELLO => {
            let magic = u64_at(&p, 0);
            if magic != HELLO_MAGIC {
                return Err(ProtoError::BadMagic(magic));
            }
            Msg::Hello {
                version: u32_at(&p, 8),
                migration_id: u64_at(&p, 12),
            }
        }
        K_HELLO_ACK => Msg::HelloAck {
            version: u32_at(&p, 0),
            migration_id: u64_at(&p, 4),
        },
        K_FAULT => Msg::Fault {
            region: u32_at(&p, 0),
            offset: u64_at(&p, 4),
        },
        K_FAULT_REPLY => Msg::FaultReply {
            region: u32_at(&p, 0),
            ack: match p[4] {
                0 => false,
                1 => true,
                b => return Err(ProtoError::Malformed(format!("FaultReply ack byte {b}"))),
            },
            progress: u64_at(&p, 5),
            vec_start: u64_at(&p, 13),
            vec_len: u64_at(&p, 21),
        },
        K_DONE => Msg::Done {
            region_count: u32_at(&p, 0),
        },
        K_PAGES => {
            let region = u32_at(&p, 0);
            let offset = u64_at(&p, 4);
            check_pages(offset, p.len() - PAGES_FIXED)?;
            p.drain(..PAGES_FIXED);
            Msg::Pages {
                region,
                offset,
                data: p,
            }
        }
        K_ERROR => Msg::Error {
            message: String::from_utf8(p)
                .map_err(|_| ProtoError::Malformed("Error text is not UTF-8".into()))?,
        },
        // Every other kind returned UnknownType in the length match above.
        _ => unreachable!("kind checked above"),
    })
}

/// A reader that enforces an absolute deadline on a `TcpStream` (each `read` gets the
/// remaining time as `SO_RCVTIMEO`; set only when it changed meaningfully).
struct DeadlineReader<'a> {
    stream: &'a TcpStream,
    deadline: Option<Instant>,
    first: bool,
    narrowed: bool,
    /// Bytes of the message read so far (a timeout after any leaves the stream mid-frame).
    consumed: usize,
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(d) = self.deadline {
            let now = Instant::now();
            if now >= d {
                return Err(io::ErrorKind::TimedOut.into());
            }
            // The first read of a message uses the timeout set by `Conn::recv` (one
            // setsockopt per message); later reads of the same message narrow it.
            if !self.first {
                self.stream.set_read_timeout(Some(d - now))?;
                self.narrowed = true;
            }
        }
        self.first = false;
        let mut s = self.stream;
        let n = s.read(buf)?;
        self.consumed += n;
        Ok(n)
    }
}

/// A protocol connection over TCP with deadlines: receives fail with
/// [`ProtoError::Timeout`] instead of hanging, sends fail instead of blocking forever on a
/// peer that stopped reading. `TCP_NODELAY` is set (one fault = one small message).
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    timeout: Option<Duration>,
    /// The read timeout currently set on the socket (avoids a setsockopt per message).
    cur_rcvtimeo: Option<Option<Duration>>,
    /// A receive timed out in the middle of a frame: the byte stream is out of step, every
    /// later receive fails.
    desynced: bool,
}

impl Conn {
    /// Wraps a connected stream; `timeout` bounds every [`Conn::recv`] (whole message) and
    /// every send (`None`: wait forever — for a server waiting for the next request).
    pub fn new(stream: TcpStream, timeout: Option<Duration>) -> Result<Conn> {
        stream.set_nodelay(true)?;
        stream.set_write_timeout(timeout)?;
        Ok(Conn {
            stream,
            timeout,
            cur_rcvtimeo: None,
            desynced: false,
        })
    }

    /// Changes the default timeout (receives and sends).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> Result<()> {
        self.stream.set_write_timeout(timeout)?;
        self.timeout = timeout;
        Ok(())
    }

    /// The underlying stream (addresses, shutdown).
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Sends one message.
    pub fn send(&mut self, msg: &Msg) -> Result<()> {
        write_msg(&mut self.stream, msg).map_err(|e| self.fill_timeout(e))
    }

    /// Sends a `Pages` message straight from `data` (`writev`, no copy).
    pub fn send_pages(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<()> {
        write_pages(&mut self.stream, region, offset, data).map_err(|e| self.fill_timeout(e))
    }

    /// Receives one message within the default timeout.
    pub fn recv(&mut self) -> Result<Msg> {
        self.recv_timeout(self.timeout)
    }

    /// Receives one message; the whole message must arrive within `timeout` (`None`: wait
    /// forever). A peer-sent `Error` is returned as a message, not as an error. A timeout
    /// before any byte of a message arrived leaves the connection usable; a timeout in the
    /// middle of one does not (later receives fail with `PeerGone { mid_message: true }`).
    pub fn recv_timeout(&mut self, timeout: Option<Duration>) -> Result<Msg> {
        if self.desynced {
            return Err(ProtoError::PeerGone { mid_message: true });
        }
        if self.cur_rcvtimeo != Some(timeout) {
            self.stream.set_read_timeout(timeout)?;
            self.cur_rcvtimeo = Some(timeout);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut r = DeadlineReader {
            stream: &self.stream,
            deadline,
            first: true,
            narrowed: false,
            consumed: 0,
        };
        let res = read_msg(&mut r);
        if matches!(res, Err(ProtoError::Timeout(_))) && r.consumed > 0 {
            // Part of a frame was read: the next bytes are not a frame start any more.
            self.desynced = true;
        }
        if r.narrowed {
            // A later read narrowed the socket's timeout: reset on the next receive.
            self.cur_rcvtimeo = None;
        }
        res.map_err(|e| match e {
            ProtoError::Timeout(_) => ProtoError::Timeout(timeout.unwrap_or_default()),
            e => e,
        })
    }

    fn fill_timeout(&self, e: ProtoError) -> ProtoError {
        match e {
            ProtoError::Timeout(_) => ProtoError::Timeout(self.timeout.unwrap_or_default()),
            e => e,
        }
    }

    /// Target side of the handshake: sends `Hello`, expects a matching `HelloAck`.
    pub fn client_handshake(&mut self, migration_id: u64) -> Result<()> {
        self.send(&Msg::Hello {
            migration_id,
            version: VERSION,
        })?;
        match self.recv()? {
            Msg::HelloAck {
                version,
                migration_id: id,
            } => {
                if version != VERSION {
                    return Err(ProtoError::BadVersion { got: version });
                }
                if id != migration_id {
                    return Err(ProtoError::Malformed(format!(
                        "HelloAck for migration {id:x}, expected {migration_id:x}"
                    )));
                }
                Ok(())
            }
            Msg::Error { message } => Err(ProtoError::Remote(message)),
            m => Err(ProtoError::Unexpected {
                expected: "HelloAck",
                got: m.name(),
            }),
        }
    }

    /// Source side of the handshake: expects `Hello` for `migration_id` with our version and
    /// answers `HelloAck`; on a mismatch it sends `Error` (best effort) and fails.
    pub fn server_handshake(&mut self, migration_id: u64) -> Result<()> {
        let err = match self.recv()? {
            Msg::Hello {
                migration_id: id,
                version,
            } => {
                if version != VERSION {
                    ProtoError::BadVersion { got: version }
                } else if id != migration_id {
                    ProtoError::Malformed(format!(
                        "Hello for migration {id:x}, this page-server serves {migration_id:x}"
                    ))
                } else {
                    return self.send(&Msg::HelloAck {
                        version: VERSION,
                        migration_id,
                    });
                }
            }
            m => ProtoError::Unexpected {
                expected: "Hello",
                got: m.name(),
            },
        };
        let _ = self.send(&Msg::Error {
            message: err.to_string(),
        });
        Err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use std::net::TcpListener;

    fn all_msgs() -> Vec<Msg> {
        vec![
            Msg::Hello {
                migration_id: 0xdead_beef_0123,
                version: VERSION,
            },
            Msg::HelloAck {
                version: VERSION,
                migration_id: 7,
            },
            Msg::Fault {
                region: 3,
                offset: 0x1234_5678,
            },
            Msg::FaultReply {
                region: 1,
                ack: true,
                progress: 1 << 30,
                vec_start: 2 << 20,
                vec_len: 2 << 20,
            },
            Msg::Done { region_count: 2 },
            Msg::Pages {
                region: 0,
                offset: 8192,
                data: (0..2 * PAGE).map(|i| i as u8).collect(),
            },
            Msg::Pages {
                region: 9,
                offset: 0,
                data: vec![0xAB; MAX_PAGES_DATA],
            },
            Msg::Error {
                message: "nope ✗".into(),
            },
            Msg::Error {
                message: String::new(),
            },
        ]
    }

    #[test]
    fn roundtrip_every_message() {
        let mut buf = Vec::new();
        for m in all_msgs() {
            write_msg(&mut buf, &m).unwrap();
        }
        let mut c = Cursor::new(buf);
        for m in all_msgs() {
            assert_eq!(read_msg(&mut c).unwrap(), m);
        }
        assert!(matches!(
            read_msg(&mut c),
            Err(ProtoError::PeerGone { mid_message: false })
        ));
    }

    #[test]
    fn wire_layout_is_stable() {
        let f = encode(&Msg::Fault {
            region: 2,
            offset: 0x1000,
        })
        .unwrap();
        assert_eq!(
            f,
            [0x47, 0x4D, 3, 0, 12, 0, 0, 0, 2, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0]
        );
        let h = encode(&Msg::Hello {
            migration_id: 1,
            version: 1,
        })
        .unwrap();
        assert_eq!(&h[8..16], b"TMMIGRAT");
    }

    fn frame(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = header(kind, payload.len()).to_vec();
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn strict_decoding() {
        let dec = |b: Vec<u8>| read_msg(&mut Cursor::new(b));
        // Unknown type.
        assert!(matches!(
            dec(frame(99, &[])),
            Err(ProtoError::UnknownType(99))
        ));
        // Bad marker.
        let mut f = frame(K_DONE, &[1, 0, 0, 0]);
        f[0] = 0;
        assert!(matches!(dec(f), Err(ProtoError::BadMarker(_))));
        // A huge announced length is refused before any allocation or read.
        let mut f = header(K_PAGES, 0).to_vec();
        f[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(dec(f), Err(ProtoError::BadLength { .. })));
        let f = header(K_PAGES, MAX_PAYLOAD + PAGE).to_vec();
        assert!(matches!(dec(f), Err(ProtoError::BadLength { .. })));
        // Wrong fixed length.
        assert!(matches!(
            dec(frame(K_FAULT, &[0; 11])),
            Err(ProtoError::BadLength { .. })
        ));
        // Bad magic, bad version (handshake).
        let mut p = encode(&Msg::Hello {
            migration_id: 1,
            version: VERSION,
        })
        .unwrap();
        p[8] ^= 1;
        assert!(matches!(dec(p), Err(ProtoError::BadMagic(_))));
        // Misaligned pages, partial page.
        let mut p = vec![0u8; PAGES_FIXED + PAGE];
        p[4] = 1;
        assert!(matches!(
            dec(frame(K_PAGES, &p)),
            Err(ProtoError::Malformed(_))
        ));
        let p = vec![0u8; PAGES_FIXED + PAGE + 1];
        assert!(matches!(
            dec(frame(K_PAGES, &p)),
            Err(ProtoError::Malformed(_))
        ));
        // Ack byte, UTF-8.
        let mut p = vec![0u8; 29];
        p[4] = 2;
        assert!(matches!(
            dec(frame(K_FAULT_REPLY, &p)),
            Err(ProtoError::Malformed(_))
        ));
        assert!(matches!(
            dec(frame(K_ERROR, &[0xff, 0xfe])),
            Err(ProtoError::Malformed(_))
        ));
        // Truncated in the header and in the payload.
        let f = encode(&Msg::Done { region_count: 1 }).unwrap();
        assert!(matches!(
            dec(f[..5].to_vec()),
            Err(ProtoError::PeerGone { mid_message: true })
        ));
        assert!(matches!(
            dec(f[..10].to_vec()),
            Err(ProtoError::PeerGone { mid_message: true })
        ));
        // The encoder refuses what the decoder would refuse.
        assert!(encode(&Msg::Pages {
            region: 0,
            offset: 0,
            data: vec![0; MAX_PAGES_DATA + PAGE]
        })
        .is_err());
        assert!(encode(&Msg::Error {
            message: "x".repeat(MAX_ERROR_LEN + 1)
        })
        .is_err());
    }

    /// A writer that accepts at most 7 bytes per call: exercises partial vectored writes.
    struct Dribble(Vec<u8>);
    impl Write for Dribble {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let n = b.len().min(7);
            self.0.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn pages_survive_partial_writes() {
        let data: Vec<u8> = (0..PAGE).map(|i| (i * 7) as u8).collect();
        let mut w = Dribble(Vec::new());
        write_pages(&mut w, 4, 4096 * 5, &data).unwrap();
        let m = read_msg(&mut Cursor::new(w.0)).unwrap();
        assert_eq!(
            m,
            Msg::Pages {
                region: 4,
                offset: 4096 * 5,
                data
            }
        );
    }

    fn pair() -> (Conn, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (Conn::new(c, Some(Duration::from_millis(200))).unwrap(), s)
    }

    #[test]
    fn handshake_and_mismatch() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = std::thread::spawn(move || {
            let mut res = Vec::new();
            for _ in 0..2 {
                let (s, _) = l.accept().unwrap();
                let mut c = Conn::new(s, Some(Duration::from_secs(2))).unwrap();
                res.push(c.server_handshake(42).is_ok());
            }
            res
        });
        let mut c = Conn::new(
            TcpStream::connect(addr).unwrap(),
            Some(Duration::from_secs(2)),
        )
        .unwrap();
        c.client_handshake(42).unwrap();
        let mut c = Conn::new(
            TcpStream::connect(addr).unwrap(),
            Some(Duration::from_secs(2)),
        )
        .unwrap();
        let e = c.client_handshake(43).unwrap_err();
        assert!(
            matches!(e, ProtoError::Remote(ref m) if m.contains("2b")),
            "{e}"
        );
        assert_eq!(srv.join().unwrap(), vec![true, false]);
    }

    #[test]
    fn silent_peer_times_out() {
        let (mut c, _peer) = pair();
        let t = Instant::now();
        let e = c.recv().unwrap_err();
        assert!(matches!(e, ProtoError::Timeout(_)), "{e}");
        let el = t.elapsed();
        assert!(
            el >= Duration::from_millis(190) && el < Duration::from_secs(1),
            "{el:?}"
        );
    }

    #[test]
    fn peer_stalls_mid_message_times_out() {
        // A peer that sends part of a frame and then dribbles a byte every 50 ms must not
        // extend the deadline: the whole message is bounded.
        let (mut c, mut peer) = pair();
        let f = encode(&Msg::Fault {
            region: 0,
            offset: 0,
        })
        .unwrap();
        // Detached: it stops at its first failed write once `c` is dropped.
        std::thread::spawn(move || {
            for b in &f[..f.len() - 1] {
                if peer.write_all(&[*b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let start = Instant::now();
        let e = c.recv().unwrap_err();
        assert!(matches!(e, ProtoError::Timeout(_)), "{e}");
        assert!(start.elapsed() < Duration::from_millis(400));
    }

    #[test]
    fn peer_closes_mid_message() {
        let (mut c, mut peer) = pair();
        let f = encode(&Msg::Pages {
            region: 0,
            offset: 0,
            data: vec![1; PAGE],
        })
        .unwrap();
        peer.write_all(&f[..100]).unwrap();
        drop(peer);
        let e = c.recv().unwrap_err();
        assert!(
            matches!(e, ProtoError::PeerGone { mid_message: true }),
            "{e}"
        );
    }

    #[test]
    fn peer_closes_between_messages_and_send_fails() {
        let (mut c, peer) = pair();
        drop(peer);
        let e = c.recv().unwrap_err();
        assert!(
            matches!(e, ProtoError::PeerGone { mid_message: false }),
            "{e}"
        );
        // Writing to a closed peer: the first send may succeed (buffered), then RST → error.
        let mut failed = false;
        for _ in 0..50 {
            if let Err(e) = c.send_pages(0, 0, &[0u8; PAGE]) {
                assert!(matches!(e, ProtoError::PeerGone { .. }), "{e}");
                failed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(failed);
    }

    #[test]
    fn peer_reset_is_peer_gone() {
        let (mut c, peer) = pair();
        // SO_LINGER 0 + close = RST.
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        use std::os::fd::AsRawFd;
        // SAFETY: valid socket fd and a correctly sized, initialised linger struct.
        let rc = unsafe {
            libc::setsockopt(
                peer.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                &l as *const libc::linger as *const libc::c_void,
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        drop(peer);
        let e = c.recv().unwrap_err();
        assert!(matches!(e, ProtoError::PeerGone { .. }), "{e}");
    }

    #[test]
    fn a_timeout_mid_frame_desyncs_one_between_frames_does_not() {
        use std::io::Write;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let mut c = Conn::new(s, Some(Duration::from_secs(2))).unwrap();
        // No byte: a benign timeout, then a whole frame is read fine.
        let e = c.recv_timeout(Some(Duration::from_millis(30))).unwrap_err();
        assert!(matches!(e, ProtoError::Timeout(_)), "{e}");
        let frame = encode(&Msg::Fault {
            region: 1,
            offset: 8192,
        })
        .unwrap();
        peer.write_all(&frame).unwrap();
        assert_eq!(
            c.recv().unwrap(),
            Msg::Fault {
                region: 1,
                offset: 8192
            }
        );
        // Half a frame, a timeout, the other half: the connection is out of step now.
        peer.write_all(&frame[..5]).unwrap();
        let e = c.recv_timeout(Some(Duration::from_millis(30))).unwrap_err();
        assert!(matches!(e, ProtoError::Timeout(_)), "{e}");
        peer.write_all(&frame[5..]).unwrap();
        let e = c.recv().unwrap_err();
        assert!(
            matches!(e, ProtoError::PeerGone { mid_message: true }),
            "{e}"
        );
    }
}
