//! MIGRATE, as Redis 7.0 has it: keys sent to another server (tiermem-kv or Redis) as
//! RESTORE commands carrying DUMP payloads, over one connection opened for the command, then
//! deleted here unless COPY. The command holds the keyspace while it talks to the target, as
//! Redis's does (bounded by its timeout).

use super::data::{is, parse_i64};
use super::rdb;
use super::reply::{self, not_int, syntax};
use super::value;
use crate::client::{encode, Client, Reply};
use crate::ds::keyspace as ks;
use crate::ds::{expire, Store, Wtx};
use crate::heap::HeapError;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// MIGRATE host port key|"" destination-db timeout [COPY] [REPLACE] [AUTH password]
/// [AUTH2 username password] [KEYS key ...]. Replies OK, NOKEY when none of the keys exists,
/// an IOERR when the target cannot be reached or stops answering within the timeout, or the
/// target's error (the keys it refused stay here).
pub fn migrate(st: &Store, w: &mut Wtx, a: &[&[u8]], out: &mut Vec<u8>) -> Result<(), HeapError> {
    let (mut copy, mut replace) = (false, false);
    let mut auth: Vec<&[u8]> = Vec::new();
    let mut keys: Vec<&[u8]> = vec![a[3]];
    let mut j = 6;
    while j < a.len() {
        let more = a.len() - j - 1;
        if is(a[j], "copy") {
            copy = true;
        } else if is(a[j], "replace") {
            replace = true;
        } else if is(a[j], "auth") && more >= 1 {
            auth = vec![a[j + 1]];
            j += 1;
        } else if is(a[j], "auth2") && more >= 2 {
            auth = vec![a[j + 1], a[j + 2]];
            j += 2;
        } else if is(a[j], "keys") {
            if !a[3].is_empty() {
                reply::error(
                    out,
                    "ERR When using MIGRATE KEYS option, the key argument must be set to the empty string",
                );
                return Ok(());
            }
            keys = a[j + 1..].to_vec();
            break;
        } else {
            syntax(out);
            return Ok(());
        }
        j += 1;
    }
    let (Some(timeout), Some(db)) = (parse_i64(a[5]), parse_i64(a[4])) else {
        not_int(out);
        return Ok(());
    };
    let timeout = Duration::from_millis(if timeout <= 0 { 1000 } else { timeout as u64 });
    // The keys that exist, with their payloads and remaining TTLs.
    let mut send = Vec::new();
    for k in keys {
        if let Some(e) = ks::lookup(w, st, k) {
            let ttl = expire::deadline(w, st, &e)
                .map_or(0, |t| t.saturating_sub(expire::now_ms()).max(1));
            send.push((k, ttl, rdb::encode(&value::read(w, &e)?)));
        }
    }
    if send.is_empty() {
        reply::simple(out, "NOKEY");
        return Ok(());
    }
    let host = String::from_utf8_lossy(a[1]).into_owned();
    let port = String::from_utf8_lossy(a[2]).into_owned();
    let addr = format!("{host}:{port}")
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next());
    let sock = match addr.map(|a| TcpStream::connect_timeout(&a, timeout)) {
        Some(Ok(s)) => s,
        // Redis connects without blocking and learns of a refusal when it writes.
        Some(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            reply::error(out, "IOERR error or timeout writing to target instance");
            return Ok(());
        }
        _ => {
            reply::error(out, "IOERR error or timeout connecting to the client");
            return Ok(());
        }
    };
    // The project's RESP2 client: TCP_NODELAY, the timeout on every read and write.
    let Ok(mut c) = Client::new(sock, Some(timeout)) else {
        reply::error(out, "IOERR error or timeout connecting to the client");
        return Ok(());
    };
    let mut o = Vec::new();
    if !auth.is_empty() {
        let mut cmd: Vec<&[u8]> = vec![b"AUTH"];
        cmd.extend(&auth);
        encode(&mut o, &cmd);
    }
    let dbs = db.to_string();
    encode(&mut o, &[b"SELECT".as_slice(), dbs.as_bytes()]);
    let ttls: Vec<String> = send.iter().map(|s| s.1.to_string()).collect();
    for ((k, _, p), t) in send.iter().zip(&ttls) {
        let mut cmd: Vec<&[u8]> = vec![b"RESTORE", k, t.as_bytes(), p];
        if replace {
            cmd.push(b"REPLACE");
        }
        encode(&mut o, &cmd);
    }
    if c.send_raw(&o).is_err() {
        reply::error(out, "IOERR error or timeout writing to target instance");
        return Ok(());
    }
    let mut first_err = None;
    let mut pre_failed = false;
    let pre = usize::from(!auth.is_empty()) + 1;
    for i in 0..pre + send.len() {
        match c.read() {
            Err(_) => {
                reply::error(out, "IOERR error or timeout reading to target instance");
                return Ok(());
            }
            Ok(Reply::Error(err)) => {
                pre_failed |= i < pre;
                first_err.get_or_insert(err);
            }
            Ok(_) => {
                // After a refused AUTH or SELECT nothing counts as moved (Redis's rule).
                if i >= pre && !copy && !pre_failed {
                    let k = send[i - pre].0;
                    if let Some(e) = ks::lookup(w, st, k) {
                        ks::delete(w, st, &e)?;
                    }
                }
            }
        }
    }
    match first_err {
        Some(e) => reply::error(out, &format!("ERR Target instance replied with error: {e}")),
        None => reply::ok(out),
    }
    Ok(())
}
