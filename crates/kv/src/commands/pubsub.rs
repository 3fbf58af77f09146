//! Pub/sub: SUBSCRIBE, UNSUBSCRIBE, PSUBSCRIBE, PUNSUBSCRIBE, PUBLISH, PUBSUB CHANNELS /
//! NUMSUB / NUMPAT, as Redis 7.0 over RESP2. Not stored in the heap: subscriptions live in
//! DRAM ([`Registry`]) and end with their connection, as in Redis.
//!
//! PUBLISH formats each message once and hands it to each receiving connection's event-loop
//! thread through its [`ConnHandle`] (the server appends it to that connection's output and
//! wakes the thread); the reply is the number of receivers, channel subscribers and pattern
//! matches counted as Redis counts them. A subscriber that does not read its messages is closed
//! by `client-output-buffer-limit`.
//!
//! A connection with a subscription is in subscribed mode: only (P)SUBSCRIBE,
//! (P)UNSUBSCRIBE, PING (answered `pong` in an array) and QUIT are allowed, as Redis 7.0 does
//! over RESP2.

use super::reply::{array, bulk, int};
use crate::server::ConnHandle;
use parking_lot::Mutex;
use std::collections::HashMap;

/// A subscriber: session id and where to push.
type Sub = (u64, ConnHandle);

/// Who listens to what (shared by all sessions of a service).
#[derive(Default)]
pub struct Registry {
    channels: Mutex<HashMap<Vec<u8>, Vec<Sub>>>,
    patterns: Mutex<HashMap<Vec<u8>, Vec<Sub>>>,
}

/// A session's subscriptions, in the order made.
#[derive(Debug, Default)]
pub struct Subs {
    /// Channels.
    pub channels: Vec<Vec<u8>>,
    /// Patterns.
    pub patterns: Vec<Vec<u8>>,
}

impl Subs {
    /// Subscriptions of both kinds (the count in (un)subscribe replies).
    pub fn count(&self) -> usize {
        self.channels.len() + self.patterns.len()
    }
}

/// `*3 <kind> <name> :<count>`: one (un)subscribe confirmation; `None` name: a nil bulk.
fn confirm(out: &mut Vec<u8>, kind: &str, name: Option<&[u8]>, count: usize) {
    array(out, 3);
    bulk(out, kind.as_bytes());
    match name {
        Some(n) => bulk(out, n),
        None => out.extend_from_slice(b"$-1\r\n"),
    }
    int(out, count as i64);
}

impl Registry {
    /// SUBSCRIBE (`pattern` false) or PSUBSCRIBE `names` for session `id`.
    pub fn subscribe(
        &self,
        id: u64,
        conn: &ConnHandle,
        subs: &mut Subs,
        names: &[&[u8]],
        pattern: bool,
        out: &mut Vec<u8>,
    ) {
        let (map, kind) = if pattern {
            (&self.patterns, "psubscribe")
        } else {
            (&self.channels, "subscribe")
        };
        for n in names {
            let mine = if pattern {
                &mut subs.patterns
            } else {
                &mut subs.channels
            };
            if !mine.iter().any(|c| c == n) {
                mine.push(n.to_vec());
                map.lock()
                    .entry(n.to_vec())
                    .or_default()
                    .push((id, conn.clone()));
            }
            confirm(out, kind, Some(n), subs.count());
        }
    }

    /// UNSUBSCRIBE (`pattern` false) or PUNSUBSCRIBE `names` (none: all of that kind), with
    /// one confirmation each (one with a nil name when there was nothing to leave).
    pub fn unsubscribe(
        &self,
        id: u64,
        subs: &mut Subs,
        names: &[&[u8]],
        pattern: bool,
        out: Option<&mut Vec<u8>>,
    ) {
        let (map, kind) = if pattern {
            (&self.patterns, "punsubscribe")
        } else {
            (&self.channels, "unsubscribe")
        };
        let targets: Vec<Vec<u8>> = if names.is_empty() {
            if pattern {
                subs.patterns.clone()
            } else {
                subs.channels.clone()
            }
        } else {
            names.iter().map(|n| n.to_vec()).collect()
        };
        let mut out = out;
        if targets.is_empty() {
            if let Some(o) = out.as_deref_mut() {
                confirm(o, kind, None, subs.count());
            }
            return;
        }
        for n in targets {
            let mine = if pattern {
                &mut subs.patterns
            } else {
                &mut subs.channels
            };
            if let Some(i) = mine.iter().position(|c| *c == n) {
                mine.remove(i);
                let mut m = map.lock();
                if let Some(v) = m.get_mut(&n) {
                    v.retain(|(s, _)| *s != id);
                    if v.is_empty() {
                        m.remove(&n);
                    }
                }
            }
            if let Some(o) = out.as_deref_mut() {
                confirm(o, kind, Some(&n), subs.count());
            }
        }
    }

    /// Every subscription of session `id` ends (its connection closed).
    pub fn drop_session(&self, id: u64, subs: &mut Subs) {
        self.unsubscribe(id, subs, &[], false, None);
        self.unsubscribe(id, subs, &[], true, None);
    }

    /// PUBLISH: push `message` to the subscribers of `channel` and of the patterns matching it;
    /// the number of receivers.
    pub fn publish(&self, channel: &[u8], message: &[u8]) -> usize {
        let mut n = 0;
        {
            let m = self.channels.lock();
            if let Some(v) = m.get(channel) {
                let mut msg = Vec::with_capacity(32 + channel.len() + message.len());
                array(&mut msg, 3);
                bulk(&mut msg, b"message");
                bulk(&mut msg, channel);
                bulk(&mut msg, message);
                for (_, c) in v {
                    c.push(msg.clone());
                    n += 1;
                }
            }
        }
        let m = self.patterns.lock();
        for (pat, v) in m.iter() {
            if !super::glob(pat, channel) {
                continue;
            }
            let mut msg = Vec::with_capacity(48 + pat.len() + channel.len() + message.len());
            array(&mut msg, 4);
            bulk(&mut msg, b"pmessage");
            bulk(&mut msg, pat);
            bulk(&mut msg, channel);
            bulk(&mut msg, message);
            for (_, c) in v {
                c.push(msg.clone());
                n += 1;
            }
        }
        n
    }

    /// PUBSUB CHANNELS [pattern]: active channels (with a subscriber), sorted.
    pub fn channels(&self, pattern: Option<&[u8]>) -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = self
            .channels
            .lock()
            .keys()
            .filter(|c| pattern.map_or(true, |p| super::glob(p, c)))
            .cloned()
            .collect();
        v.sort();
        v
    }

    /// PUBSUB NUMSUB: subscribers of `channel` (patterns not counted, as Redis).
    pub fn numsub(&self, channel: &[u8]) -> usize {
        self.channels.lock().get(channel).map_or(0, |v| v.len())
    }

    /// PUBSUB NUMPAT: patterns subscribed to (each counted once, as Redis 7.0).
    pub fn numpat(&self) -> usize {
        self.patterns.lock().len()
    }
}
