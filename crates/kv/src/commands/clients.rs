//! The registry of connected clients, for CLIENT LIST and CLIENT KILL: each session's
//! public state (address, name, database, subscriptions, transaction, blocked), refreshed after
//! each of its batches ([`Clients::sync`], under the session's own lock, not the registry's),
//! and the handle that closes its connection.

use super::Session;
use crate::server::ConnHandle;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// A session's view, shared by the session (which refreshes it) and the registry.
pub type SharedView = Arc<Mutex<ClientView>>;

/// One client as CLIENT LIST shows it.
#[derive(Clone, Debug)]
pub struct ClientView {
    /// CLIENT ID.
    pub id: u64,
    /// The peer address.
    pub peer: String,
    /// CLIENT SETNAME.
    pub name: Option<Vec<u8>>,
    /// When it connected.
    pub created: Instant,
    /// Its database.
    pub db: usize,
    /// Channel and pattern subscriptions.
    pub sub: usize,
    /// See `sub`.
    pub psub: usize,
    /// Commands queued in MULTI (`None`: not in MULTI).
    pub multi: Option<usize>,
    /// Blocked in BLPOP and the like.
    pub blocked: bool,
}

impl ClientView {
    /// A new connection's view (database 0, nothing subscribed or queued).
    pub fn new(id: u64, peer: &str, created: Instant) -> SharedView {
        Arc::new(Mutex::new(ClientView {
            id,
            peer: peer.to_string(),
            name: None,
            created,
            db: 0,
            sub: 0,
            psub: 0,
            multi: None,
            blocked: false,
        }))
    }

    /// The client's view as of now.
    pub fn of(s: &Session) -> ClientView {
        ClientView {
            id: s.id,
            peer: s.peer.clone(),
            name: s.name.clone(),
            created: s.created,
            db: s.db,
            sub: s.subs.channels.len(),
            psub: s.subs.patterns.len(),
            multi: s.multi.as_ref().map(|m| m.queued.len()),
            blocked: s.block.is_some(),
        }
    }

    /// Its CLIENT LIST line (Redis 7.0's fields; those this server does not track are 0).
    pub fn line(&self) -> String {
        let mut flags = String::new();
        if self.sub + self.psub > 0 {
            flags.push('P');
        }
        if self.multi.is_some() {
            flags.push('x');
        }
        if self.blocked {
            flags.push('b');
        }
        if flags.is_empty() {
            flags.push('N');
        }
        format!(
            "id={} addr={} laddr= fd=-1 name={} age={} idle=0 flags={flags} db={} sub={} psub={} \
             ssub=0 multi={} qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 \
             omem=0 tot-mem=0 events=r cmd=client user=default redir=-1 resp=2\n",
            self.id,
            self.peer,
            self.name
                .as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default(),
            self.created.elapsed().as_secs(),
            self.db,
            self.sub,
            self.psub,
            self.multi.map_or(-1, |n| n as i64),
        )
    }
}

/// Every connected client.
#[derive(Default)]
pub struct Clients {
    map: Mutex<BTreeMap<u64, (SharedView, ConnHandle)>>,
}

impl Clients {
    /// A client connected.
    pub fn add(&self, s: &Session) {
        self.map
            .lock()
            .insert(s.id, (s.view.clone(), s.conn.clone()));
    }

    /// Refresh what CLIENT LIST shows of `s` (after each of its batches: its own lock, no
    /// allocation unless its name changed).
    pub fn sync(&self, s: &Session) {
        {
            let mut v = s.view.lock();
            if v.name != s.name {
                v.name = s.name.clone();
            }
            v.db = s.db;
            let (sub, psub) = (s.subs.channels.len(), s.subs.patterns.len());
            if (v.sub + v.psub > 0) != (sub + psub > 0) {
                // Subscribers are exempt from the idle-client timeout.
                s.conn.set_subscriber(sub + psub > 0);
            }
            v.sub = sub;
            v.psub = psub;
            v.multi = s.multi.as_ref().map(|m| m.queued.len());
            v.blocked = s.block.is_some();
        }
    }

    /// A client left.
    pub fn remove(&self, id: u64) {
        self.map.lock().remove(&id);
    }

    /// Every client, in id order.
    pub fn list(&self) -> Vec<ClientView> {
        self.map
            .lock()
            .values()
            .map(|(v, _)| v.lock().clone())
            .collect()
    }

    /// Close the connections of the clients `pick` selects; their ids.
    pub fn kill(&self, pick: impl Fn(&ClientView) -> bool) -> Vec<u64> {
        let m = self.map.lock();
        let mut ids = Vec::new();
        for (v, c) in m.values() {
            let v = v.lock();
            if pick(&v) {
                c.close();
                ids.push(v.id);
            }
        }
        ids
    }
}
