//! A small blocking RESP2 client: the one every tiermem tool and test uses to talk to a
//! tiermem-kv (or Redis) server — `tiermem kv migrate`, the benchmarks and the end-to-end tests.
//!
//! It sends commands as multibulk arrays (one write per call, so a pipeline is one write) and
//! reads replies strictly: a line that does not end in CRLF, a bulk whose data is not followed by
//! CRLF, an unknown type byte or a malformed length is `InvalidData`, never a panic, so a test
//! sees a torn or malformed reply as an error. Bulk lengths above [`MAX_BULK_LEN`] and arrays
//! nested deeper than [`MAX_DEPTH`] are refused before anything is allocated for them.
//!
//! ```no_run
//! use tiermem_kv::client::{Client, Reply};
//! let addr = "127.0.0.1:6379".parse().unwrap();
//! let mut c = Client::connect(addr, std::time::Duration::from_secs(5))?;
//! assert_eq!(c.command(&["PING"])?, Reply::Simple("PONG".into()));
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The largest bulk reply the client accepts: 512 MiB, Redis's `proto-max-bulk-len` default.
pub const MAX_BULK_LEN: i64 = 512 << 20;
/// The deepest nesting of arrays the client accepts in one reply.
pub const MAX_DEPTH: usize = 16;

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+text`
    Simple(String),
    /// `-text` (the server refused the command; not an I/O error)
    Error(String),
    /// `:n`
    Int(i64),
    /// `$len` and the data, or `$-1` (`None`)
    Bulk(Option<Vec<u8>>),
    /// `*n` and its elements, or `*-1` (`None`)
    Array(Option<Vec<Reply>>),
}

/// A connection to a RESP2 server: a buffered reader and a writer over one TCP stream.
pub struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// Append `args` to `out` as one RESP2 multibulk request.
pub fn encode<A: AsRef<[u8]>>(out: &mut Vec<u8>, args: &[A]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        let a = a.as_ref();
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

impl Client {
    /// Wrap a connected stream: TCP_NODELAY, and `timeout` (when given) on every read and
    /// write. Errors if the socket options cannot be set or the stream cannot be cloned.
    pub fn new(s: TcpStream, timeout: Option<Duration>) -> io::Result<Client> {
        s.set_nodelay(true)?;
        s.set_read_timeout(timeout)?;
        s.set_write_timeout(timeout)?;
        Ok(Client {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    /// Connect to `addr` within `timeout`, which then bounds every read and write too.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Client> {
        Client::new(TcpStream::connect_timeout(&addr, timeout)?, Some(timeout))
    }

    /// Send one command without reading its reply.
    pub fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<()> {
        let mut out = Vec::new();
        encode(&mut out, args);
        self.w.write_all(&out)
    }

    /// Send bytes as they are (several encoded commands, or a deliberately malformed request).
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.w.write_all(bytes)
    }

    /// Read one reply: an I/O error (`UnexpectedEof` when the server closed the connection),
    /// or `InvalidData` for anything that is not well-formed RESP2.
    pub fn read(&mut self) -> io::Result<Reply> {
        self.read_at(0)
    }

    fn read_at(&mut self, depth: usize) -> io::Result<Reply> {
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let Some(l) = line.strip_suffix("\r\n") else {
            return Err(bad(format!("not RESP (no CRLF): {line:?}")));
        };
        if l.is_empty() {
            return Err(bad("not RESP: an empty line"));
        }
        let (t, rest) = l.split_at(1);
        let n = || {
            rest.parse::<i64>()
                .map_err(|_| bad(format!("not RESP: {l:?}")))
        };
        Ok(match t {
            "+" => Reply::Simple(rest.into()),
            "-" => Reply::Error(rest.into()),
            ":" => Reply::Int(n()?),
            "$" => {
                let len = n()?;
                if len < 0 {
                    return Ok(Reply::Bulk(None));
                }
                if len > MAX_BULK_LEN {
                    return Err(bad(format!("a bulk reply of {len} bytes")));
                }
                let len = len as usize;
                let mut b = vec![0u8; len + 2];
                self.r.read_exact(&mut b)?;
                if &b[len..] != b"\r\n" {
                    return Err(bad("bulk data not followed by CRLF"));
                }
                b.truncate(len);
                Reply::Bulk(Some(b))
            }
            "*" => {
                let len = n()?;
                if len < 0 {
                    return Ok(Reply::Array(None));
                }
                if depth >= MAX_DEPTH {
                    return Err(bad("arrays nested too deep"));
                }
                let mut v = Vec::with_capacity(len.min(1024) as usize);
                for _ in 0..len {
                    v.push(self.read_at(depth + 1)?);
                }
                Reply::Array(Some(v))
            }
            _ => return Err(bad(format!("not RESP: {l:?}"))),
        })
    }

    /// Send one command and read its reply (a server error is `Ok(Reply::Error)`).
    pub fn command<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<Reply> {
        self.send(args)?;
        self.read()
    }

    /// Send `cmds` in one write, then read every reply; the first `-ERR` reply becomes an
    /// error (after all replies are read, so the connection stays in step).
    pub fn pipeline<C: AsRef<[A]>, A: AsRef<[u8]>>(&mut self, cmds: &[C]) -> io::Result<()> {
        let mut out = Vec::new();
        for c in cmds {
            encode(&mut out, c.as_ref());
        }
        self.w.write_all(&out)?;
        let mut first_err = None;
        for _ in cmds {
            if let Reply::Error(e) = self.read()? {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(io::Error::other(e)),
            None => Ok(()),
        }
    }

    /// Read everything the server sends until it closes the connection (bytes already buffered
    /// first) into `out`; how many bytes.
    pub fn read_to_end(&mut self, out: &mut Vec<u8>) -> io::Result<usize> {
        self.r.read_to_end(out)
    }

    /// The underlying stream (for shutdown, timeouts or the peer address).
    pub fn stream(&self) -> &TcpStream {
        &self.w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server that answers every connection with `reply` once it has read anything.
    fn canned(reply: &'static [u8]) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let mut b = [0u8; 256];
                let _ = s.read(&mut b);
                let _ = s.write_all(reply);
            }
        });
        addr
    }

    fn ask(reply: &'static [u8]) -> io::Result<Reply> {
        Client::connect(canned(reply), Duration::from_secs(5))?.command(&["X"])
    }

    #[test]
    fn replies_of_every_type() {
        assert_eq!(ask(b"+OK\r\n").unwrap(), Reply::Simple("OK".into()));
        assert_eq!(ask(b"-ERR no\r\n").unwrap(), Reply::Error("ERR no".into()));
        assert_eq!(ask(b":-7\r\n").unwrap(), Reply::Int(-7));
        assert_eq!(ask(b"$-1\r\n").unwrap(), Reply::Bulk(None));
        assert_eq!(
            ask(b"*2\r\n$2\r\nab\r\n*-1\r\n").unwrap(),
            Reply::Array(Some(vec![
                Reply::Bulk(Some(b"ab".to_vec())),
                Reply::Array(None)
            ]))
        );
    }

    #[test]
    fn malformed_replies_are_errors() {
        for r in [
            &b"+OK\n"[..],
            b"?x\r\n",
            b":x\r\n",
            b"$2\r\nabc\r\n",
            b"$999999999999\r\n",
            b"\r\n",
        ] {
            let r: &'static [u8] = Box::leak(r.to_vec().into_boxed_slice());
            let e = ask(r).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{r:?}");
        }
        assert_eq!(ask(b"").unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
