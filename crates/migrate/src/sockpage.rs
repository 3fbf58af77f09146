//! A minimal socket page-server and fault client (the socket post-copy baseline's transfer
//! path, CRIU-like): the target sends `Fault{region, offset}`, the source answers with one
//! `Pages` message holding the 4 KiB page, sent with `writev` straight from the region.
//!
//! This is the per-fault cost of the baseline; the expiration timer and the push of the
//! remaining pages are not here yet.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use crate::proto::{Conn, Msg, ProtoError, Result, PAGE};

/// What a page-server did, returned when its connection ends.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ServerStats {
    /// Faults served with a `Pages` reply.
    pub faults: u64,
    /// Faults refused with an `Error` reply (bad region or offset).
    pub refused: u64,
}

/// Accepts one connection on `listener`, checks the handshake for `migration_id`, then serves
/// `Fault` requests from `regions` (region index → contents) until the target disconnects
/// (which returns `Ok`). A fault outside a region is answered with `Error` and counted, the
/// connection stays up. `idle_timeout` bounds the wait for the next request (`None`: wait
/// forever). Blocking; run it on its own thread.
pub fn serve_one(
    listener: &TcpListener,
    migration_id: u64,
    regions: Arc<Vec<Vec<u8>>>,
    idle_timeout: Option<Duration>,
) -> Result<ServerStats> {
    let (stream, _) = listener.accept()?;
    let mut conn = Conn::new(stream, Some(Duration::from_secs(5)))?;
    conn.server_handshake(migration_id)?;
    let mut st = ServerStats::default();
    loop {
        let msg = match conn.recv_timeout(idle_timeout) {
            Ok(m) => m,
            Err(ProtoError::PeerGone { mid_message: false }) => return Ok(st),
            Err(e) => return Err(e),
        };
        match msg {
            Msg::Fault { region, offset } => {
                let page = offset & !(PAGE as u64 - 1);
                match regions.get(region as usize) {
                    Some(r) if page + PAGE as u64 <= r.len() as u64 => {
                        let p = page as usize;
                        conn.send_pages(region, page, &r[p..p + PAGE])?;
                        st.faults += 1;
                    }
                    _ => {
                        conn.send(&Msg::Error {
                            message: format!("no page at region {region} offset {offset:#x}"),
                        })?;
                        st.refused += 1;
                    }
                }
            }
            m => {
                let e = ProtoError::Unexpected {
                    expected: "Fault",
                    got: m.name(),
                };
                let _ = conn.send(&Msg::Error {
                    message: e.to_string(),
                });
                return Err(e);
            }
        }
    }
}

/// The target's side: requests pages one at a time over a [`Conn`].
#[derive(Debug)]
pub struct FaultClient {
    conn: Conn,
}

impl FaultClient {
    /// Wraps a connection and performs the handshake for `migration_id`. Every later request
    /// must be answered within the connection's timeout.
    pub fn connect(mut conn: Conn, migration_id: u64) -> Result<FaultClient> {
        conn.client_handshake(migration_id)?;
        Ok(FaultClient { conn })
    }

    /// Fetches the page holding `offset` of `region` into `dst` (one round trip). Fails with
    /// [`ProtoError::Timeout`] / [`ProtoError::PeerGone`] if the source is dead or silent,
    /// [`ProtoError::Remote`] if it refused, [`ProtoError::Unexpected`]/`Malformed` if the
    /// reply is not the requested page.
    pub fn fetch(&mut self, region: u32, offset: u64, dst: &mut [u8; PAGE]) -> Result<()> {
        let page = offset & !(PAGE as u64 - 1);
        self.conn.send(&Msg::Fault { region, offset })?;
        match self.conn.recv()? {
            Msg::Pages {
                region: r,
                offset: o,
                data,
            } => {
                if r != region || o != page || data.len() != PAGE {
                    return Err(ProtoError::Malformed(format!(
                        "asked region {region} page {page:#x}, got region {r} offset {o:#x} \
                         ({} bytes)",
                        data.len()
                    )));
                }
                dst.copy_from_slice(&data);
                Ok(())
            }
            Msg::Error { message } => Err(ProtoError::Remote(message)),
            m => Err(ProtoError::Unexpected {
                expected: "Pages",
                got: m.name(),
            }),
        }
    }

    /// The connection (timeouts, shutdown).
    pub fn conn_mut(&mut self) -> &mut Conn {
        &mut self.conn
    }
}
