//! Connection and server commands: PING, SELECT, HELLO, CLIENT, COMMAND, CONFIG, INFO,
//! SHUTDOWN, ...

use super::data::{glob, is, parse_i64};
use super::reply::{self, array, bulk, int, null};
use super::table::{self, Id, Spec};
use super::{Held, KvService, Session};
use crate::ds::{keyspace, Mem};
use crate::runtime::Runtime;
use crate::server::Control;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{SystemTime, UNIX_EPOCH};

/// The Redis version tiermem-kv answers to (clients adapt their dialect to it).
pub const REDIS_VERSION: &str = "7.0.0";

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn human(b: u64) -> String {
    let units = ["B", "K", "M", "G", "T"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b}B")
    } else {
        format!("{v:.2}{}", units[u])
    }
}

fn command_info(out: &mut Vec<u8>, s: &Spec) {
    array(out, 10);
    bulk(out, s.name.as_bytes());
    int(out, s.arity as i64);
    let flags = s.info_flags();
    array(out, flags.len());
    for f in flags {
        reply::simple(out, f);
    }
    int(out, s.keys.0 as i64);
    int(out, s.keys.1 as i64);
    int(out, s.keys.2 as i64);
    for _ in 0..4 {
        array(out, 0);
    }
}

/// One CLIENT KILL filter.
type ClientFilter = Box<dyn Fn(&super::clients::ClientView) -> bool>;

impl KvService {
    /// PUBSUB CHANNELS [pattern] | NUMSUB [channel ...] | NUMPAT (Redis 7.0's replies).
    fn pubsub_cmd(&self, a: &[&[u8]], out: &mut Vec<u8>) {
        let sub = a[1];
        if is(sub, "CHANNELS") && a.len() <= 3 {
            let v = self.pubsub.channels(a.get(2).copied());
            array(out, v.len());
            for c in v {
                bulk(out, &c);
            }
        } else if is(sub, "NUMSUB") {
            array(out, 2 * (a.len() - 2));
            for c in &a[2..] {
                bulk(out, c);
                int(out, self.pubsub.numsub(c) as i64);
            }
        } else if is(sub, "NUMPAT") {
            if a.len() == 2 {
                int(out, self.pubsub.numpat() as i64);
            } else {
                reply::error(
                    out,
                    "ERR wrong number of arguments for 'pubsub|numpat' command",
                );
            }
        } else if !is(sub, "CHANNELS") {
            reply::error(
                out,
                &format!(
                    "ERR unknown subcommand '{}'. Try PUBSUB HELP.",
                    String::from_utf8_lossy(&sub[..sub.len().min(128)])
                ),
            );
        } else {
            reply::error(
                out,
                &format!(
                    "ERR unknown subcommand or wrong number of arguments for '{}'. Try PUBSUB HELP.",
                    String::from_utf8_lossy(sub)
                ),
            );
        }
    }
}

impl KvService {
    /// A command that touches no data (`held`: the lock this batch holds, for the few that need
    /// it exclusively).
    pub(super) fn admin<'a>(
        &'a self,
        s: &mut Session,
        spec: &Spec,
        a: &[&[u8]],
        out: &mut Vec<u8>,
        held: &mut Held<'a>,
    ) -> Control {
        match spec.id {
            Id::Ping if s.subs.count() > 0 && a.len() <= 2 => {
                // Subscribed mode over RESP2: `pong` and the argument (or "") in an array.
                array(out, 2);
                bulk(out, b"pong");
                bulk(out, a.get(1).copied().unwrap_or(b""));
            }
            Id::Ping => match a.len() {
                1 => reply::simple(out, "PONG"),
                2 => bulk(out, a[1]),
                _ => reply::error(out, "ERR wrong number of arguments for 'ping' command"),
            },
            Id::Subscribe | Id::Psubscribe => {
                let pattern = spec.id == Id::Psubscribe;
                self.pubsub
                    .subscribe(s.id, &s.conn, &mut s.subs, &a[1..], pattern, out);
            }
            Id::Unsubscribe | Id::Punsubscribe => {
                let pattern = spec.id == Id::Punsubscribe;
                self.pubsub
                    .unsubscribe(s.id, &mut s.subs, &a[1..], pattern, Some(out));
            }
            Id::Publish => int(out, self.pubsub.publish(a[1], a[2]) as i64),
            Id::Pubsub => self.pubsub_cmd(a, out),
            Id::Echo => bulk(out, a[1]),
            Id::Select => match parse_i64(a[1]) {
                None => reply::not_int(out),
                Some(d) if (0..crate::ds::DATABASES as i64).contains(&d) => {
                    s.db = d as usize;
                    reply::ok(out)
                }
                Some(_) => reply::error(out, "ERR DB index is out of range"),
            },
            Id::Quit => {
                reply::ok(out);
                return Control::Close;
            }
            Id::Shutdown => {
                let mut abort = false;
                for o in &a[1..] {
                    if is(o, "ABORT") {
                        abort = true;
                    } else if !(is(o, "NOSAVE") || is(o, "SAVE") || is(o, "NOW") || is(o, "FORCE")) {
                        reply::syntax(out);
                        return Control::Continue;
                    }
                }
                if abort {
                    reply::error(out, "ERR No shutdown in progress.");
                    return Control::Continue;
                }
                // Every acknowledged write is already committed (durable on vnvm). Unless
                // NOSAVE, make it applied to the heap file too, and refuse (as Redis does when
                // its final save fails) if that fails. Redis sends no reply on success.
                drop(std::mem::replace(held, Held::None));
                *held = Held::Write(self.lock.write());
                if a[1..].iter().any(|o| is(o, "NOSAVE")) {
                    self.nosave.store(true, std::sync::atomic::Ordering::SeqCst);
                    return Control::Shutdown;
                }
                if let Some(p) = self.persistence.get() {
                    let save = a[1..].iter().any(|o| is(o, "SAVE")) || p.saves_on_shutdown();
                    if save {
                        // The batch's write lock goes: the save takes it itself.
                        drop(std::mem::replace(held, Held::None));
                        if let Err(e) = p.save_after_running(&self.lock, &self.stats.changes) {
                            reply::error(
                                out,
                                &format!("ERR Errors trying to SHUTDOWN. Check logs. ({e})"),
                            );
                            return Control::Continue;
                        }
                        // Saved: the exit path must not save again.
                        self.nosave.store(true, std::sync::atomic::Ordering::SeqCst);
                        *held = Held::Write(self.lock.write());
                    }
                }
                if let Err(e) = self.heap.engine().sync() {
                    reply::error(
                        out,
                        &format!(
                            "ERR Errors trying to SHUTDOWN: {e}. Use SHUTDOWN NOSAVE to stop \
                             without the final flush (acknowledged writes stay in the vnvm log \
                             and cache and are recovered at the next start)"
                        ),
                    );
                    return Control::Continue;
                }
                return Control::Shutdown;
            }
            Id::Hello => return self.hello(s, a, out),
            Id::Auth if self.password.read().is_some() => {
                let ok = {
                    let pw = self.password.read();
                    let pw = pw.as_deref().unwrap_or_default().as_bytes();
                    match a.len() {
                        2 => a[1] == pw,
                        3 => a[1] == b"default" && a[2] == pw,
                        _ => {
                            reply::syntax(out);
                            return Control::Continue;
                        }
                    }
                };
                if ok {
                    s.authed = true;
                    reply::ok(out);
                } else {
                    reply::error(
                        out,
                        "WRONGPASS invalid username-password pair or user is disabled.",
                    );
                }
            }
            Id::Auth => match a.len() {
                2 => reply::error(
                    out,
                    "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
                ),
                3 if a[1] == b"default" => reply::ok(out),
                3 => reply::error(
                    out,
                    "WRONGPASS invalid username-password pair or user is disabled.",
                ),
                _ => reply::syntax(out),
            },
            Id::Client => return self.client(s, a, out),
            Id::Command => {
                let sub = a.get(1);
                match sub {
                    None => {
                        array(out, table::TABLE.len());
                        table::TABLE.iter().for_each(|c| command_info(out, c));
                    }
                    Some(x) if is(x, "COUNT") => int(out, table::TABLE.len() as i64),
                    Some(x) if is(x, "LIST") => {
                        array(out, table::TABLE.len());
                        table::TABLE.iter().for_each(|c| bulk(out, c.name.as_bytes()));
                    }
                    Some(x) if is(x, "INFO") => {
                        if a.len() == 2 {
                            array(out, table::TABLE.len());
                            table::TABLE.iter().for_each(|c| command_info(out, c));
                        } else {
                            array(out, a.len() - 2);
                            for n in &a[2..] {
                                match table::lookup(n) {
                                    Some(c) => command_info(out, c),
                                    None => reply::null_array(out),
                                }
                            }
                        }
                    }
                    // No documentation: an empty map (redis-cli then shows no hints).
                    Some(x) if is(x, "DOCS") => array(out, 0),
                    Some(x) => reply::error(
                        out,
                        &format!(
                            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
                            String::from_utf8_lossy(x)
                        ),
                    ),
                }
            }
            Id::Config => self.config_cmd(a, out),
            Id::Time => {
                let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
                array(out, 2);
                bulk(out, d.as_secs().to_string().as_bytes());
                bulk(out, d.subsec_micros().to_string().as_bytes());
            }
            Id::Save | Id::Bgsave if self.persistence.get().is_some() => {
                let p = self.persistence.get().expect("checked");
                // The batch's lock goes: the snapshot takes the write lock for its pause.
                drop(std::mem::replace(held, Held::None));
                if spec.id == Id::Save {
                    match p.save(&self.lock, &self.stats.changes) {
                        Ok(()) => reply::ok(out),
                        Err(e) => reply::error(out, &e),
                    }
                } else if a.len() == 2 && is(a[1], "SCHEDULE") && p.in_progress() {
                    // Redis's SCHEDULE: run once the current one ends; here the caller retries.
                    reply::error(
                        out,
                        "ERR Background save already in progress (SCHEDULE is not supported: \
                         retry when rdb_bgsave_in_progress is 0)",
                    );
                } else if a.len() > 2 || (a.len() == 2 && !is(a[1], "SCHEDULE")) {
                    reply::syntax(out);
                } else {
                    match p.bgsave(&self.lock, &self.stats.changes) {
                        Ok(()) => reply::simple(out, "Background saving started"),
                        Err(e) => reply::error(out, &e),
                    }
                }
            }
            Id::Save | Id::Bgsave => {
                if !self.heap.engine().info().durable {
                    reply::error(
                        out,
                        "ERR the volatile engine keeps no persistent copy (run with the vnvm engine for persistence)",
                    );
                } else {
                    drop(std::mem::replace(held, Held::None));
                    *held = Held::Write(self.lock.write());
                    match self.heap.engine().sync() {
                        Ok(()) => {
                            self.last_save.store(now_unix(), Relaxed);
                            if spec.id == Id::Save {
                                reply::ok(out);
                            } else {
                                // Already done: every write was durable at its commit.
                                reply::simple(out, "Background saving started");
                            }
                        }
                        Err(e) => reply::error(out, &format!("ERR {e}")),
                    }
                }
            }
            Id::Lastsave => int(
                out,
                self.persistence
                    .get()
                    .map_or(self.last_save.load(Relaxed), |p| p.last_save()) as i64,
            ),
            Id::Wait => int(out, 0),
            // Queued inside MULTI (Redis queues it too): EXEC unwatches everything anyway.
            Id::Unwatch => reply::ok(out),
            Id::Migrate => {
                // TIERMEM.MIGRATE <fam-dir> <listen ip:port> <migration id, hex>
                //   [fam|socket [expiration-ms [net-delay]]]
                let args: Vec<String> = a[1..]
                    .iter()
                    .map(|x| String::from_utf8_lossy(x).into_owned())
                    .collect();
                match self.migrate_hook.get() {
                    None => reply::error(
                        out,
                        "ERR this server cannot migrate (only the volatile engine migrates; a \
                         vnvm server moves with its data directory)",
                    ),
                    Some(hook) => match hook(&args) {
                        Ok(msg) => {
                            reply::simple(out, &msg);
                            return Control::Close;
                        }
                        Err(e) => reply::error(out, &format!("ERR migration refused: {e}")),
                    },
                }
            }
            _ => reply::error(out, "ERR internal: not an admin command"),
        }
        Control::Continue
    }

    /// Use `rt` as the run-time settings that CONFIG GET, SET, REWRITE and RESETSTAT work on:
    /// the settings the server runs with ([`crate::server::start_with`]), created from the
    /// configuration it started from. Once, before serving; later calls are ignored. A service
    /// given none (outside a server) has settings of its own from the defaults.
    pub fn set_runtime(&self, rt: std::sync::Arc<Runtime>) {
        let _ = self.runtime.set(rt);
    }

    /// The run-time settings (see [`KvService::set_runtime`]).
    pub fn runtime(&self) -> &std::sync::Arc<Runtime> {
        self.runtime
            .get_or_init(|| std::sync::Arc::new(Runtime::new(&crate::config::KvConfig::default())))
    }

    /// CONFIG GET | SET | RESETSTAT | REWRITE | HELP, with Redis 7.0's replies.
    fn config_cmd(&self, a: &[&[u8]], out: &mut Vec<u8>) {
        let sub = String::from_utf8_lossy(a[1]).to_ascii_lowercase();
        let arity_ok = match sub.as_str() {
            "get" => a.len() >= 3,
            "set" => a.len() >= 4,
            "resetstat" | "rewrite" | "help" => a.len() == 2,
            _ => {
                let name = String::from_utf8_lossy(&a[1][..a[1].len().min(128)]).into_owned();
                return reply::error(
                    out,
                    &format!("ERR unknown subcommand '{name}'. Try CONFIG HELP."),
                );
            }
        };
        if !arity_ok {
            return reply::error(
                out,
                &format!("ERR wrong number of arguments for 'config|{sub}' command"),
            );
        }
        match sub.as_str() {
            "get" => self.config_get(&a[2..], out),
            "set" => self.config_set(a, out),
            "resetstat" => {
                let st = &self.stats;
                for c in [
                    &st.commands,
                    &st.hits,
                    &st.misses,
                    &st.commits,
                    &st.aborts,
                    &st.too_large,
                    &st.oom,
                    &st.gc_work,
                    &st.expired,
                    &st.connections_total,
                ] {
                    c.store(0, Relaxed);
                }
                // The network front end's counters, which INFO shows in place of ours.
                if let Some(net) = self.runtime().stats() {
                    net.reset();
                }
                self.cmdstats.reset();
                reply::ok(out);
            }
            "rewrite" => {
                let rt = self.runtime();
                let Some(path) = rt.config_file() else {
                    return reply::error(out, "ERR The server is running without a config file");
                };
                match crate::config::rewrite_file(&path, &self.live_config()) {
                    Ok(()) => reply::ok(out),
                    Err(e) => reply::error(out, &format!("ERR Rewriting config file: {e}")),
                }
            }
            _ => {
                const HELP: &[&str] = &[
                    "CONFIG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                    "GET <pattern>",
                    "    Return parameters matching the glob-like <pattern> and their values.",
                    "SET <directive> <value>",
                    "    Set the configuration <directive> to <value>.",
                    "RESETSTAT",
                    "    Reset statistics reported by the INFO command.",
                    "REWRITE",
                    "    Rewrite the configuration file.",
                    "HELP",
                    "    Prints this help.",
                ];
                array(out, HELP.len());
                for l in HELP {
                    reply::simple(out, l);
                }
            }
        }
    }

    /// The configuration as it stands: the run-time settings', with the password and
    /// protected mode as this service has them (a service outside a server may have been
    /// given them apart: [`KvService::with_auth`]).
    fn live_config(&self) -> crate::config::KvConfig {
        let mut c = self.runtime().config();
        c.requirepass = self.password.read().clone().unwrap_or_default();
        c.protected_mode = self.protected.load(Relaxed);
        c
    }

    /// CONFIG GET pattern [pattern ...]: every key matching any pattern, once, with its value
    /// as it stands (the snapshot keys and `dir` as the snapshots use them); then the
    /// entries of the start table ([`KvService::with_config`]) this configuration does not
    /// know (`maxmemory-policy`).
    fn config_get(&self, patterns: &[&[u8]], out: &mut Vec<u8>) {
        let cfg = self.live_config();
        let live = self.persistence.get();
        let matches = |k: &str| {
            patterns
                .iter()
                .any(|p| glob(&p.to_ascii_lowercase(), k.as_bytes()))
        };
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (k, v) in cfg.get("*") {
            if matches(&k) {
                // The snapshot settings as the snapshots use them (`save` normalised).
                let v = live.and_then(|p| p.get(&k)).unwrap_or(v);
                pairs.push((k, v));
            }
        }
        for (k, v) in &self.config {
            if cfg.value(k).is_none() && matches(k) {
                pairs.push((k.clone(), v.clone()));
            }
        }
        array(out, 2 * pairs.len());
        for (k, v) in pairs {
            bulk(out, k.as_bytes());
            bulk(out, v.as_bytes());
        }
    }

    /// CONFIG SET key value [key value ...]: every live key (see [`crate::config`]): checked
    /// as Redis 7.0 checks it, all or nothing ([`Runtime::config_set`]), then applied — the
    /// server's limits and the thresholds by the run-time settings, the password, protected
    /// mode and the snapshot settings here.
    fn config_set(&self, a: &[&[u8]], out: &mut Vec<u8>) {
        if a.len() % 2 != 0 {
            return reply::syntax(out);
        }
        let owned: Vec<(String, String)> = a[2..]
            .chunks(2)
            .map(|c| {
                (
                    String::from_utf8_lossy(c[0]).into_owned(),
                    String::from_utf8_lossy(c[1]).into_owned(),
                )
            })
            .collect();
        let pairs: Vec<(&str, &str)> = owned
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let persistence = self.persistence.get();
        let next = match self.runtime().config_set(&pairs, persistence.is_some()) {
            Ok(next) => next,
            Err(e) => return reply::error(out, &e),
        };
        for (k, _) in &pairs {
            let k = k.to_ascii_lowercase();
            match k.as_str() {
                "requirepass" => {
                    let pw = &next.requirepass;
                    *self.password.write() = (!pw.is_empty()).then(|| pw.clone());
                }
                "protected-mode" => self.protected.store(next.protected_mode, Relaxed),
                _ => {
                    if let (Some(p), Some(v)) = (persistence, next.value(&k)) {
                        // Checked with the rest: a snapshot key's value is valid here.
                        let _ = p.set(&k, &v);
                    }
                }
            }
        }
        reply::ok(out);
    }

    fn hello(&self, s: &mut Session, a: &[&[u8]], out: &mut Vec<u8>) -> Control {
        let mut i = 1;
        if a.len() > 1 {
            match parse_i64(a[1]) {
                None => {
                    reply::error(
                        out,
                        "ERR Protocol version is not an integer or out of range",
                    );
                    return Control::Continue;
                }
                Some(2) => {}
                Some(_) => {
                    reply::error(out, "NOPROTO sorry, this protocol version is not supported");
                    return Control::Continue;
                }
            }
            i = 2;
        }
        let mut name = None;
        while i < a.len() {
            if is(a[i], "AUTH") && i + 2 < a.len() {
                if a[i + 1] != b"default" {
                    reply::error(
                        out,
                        "WRONGPASS invalid username-password pair or user is disabled.",
                    );
                    return Control::Continue;
                }
                i += 3;
            } else if is(a[i], "SETNAME") && i + 1 < a.len() {
                name = Some(a[i + 1].to_vec());
                i += 2;
            } else {
                reply::error(
                    out,
                    &format!(
                        "ERR Syntax error in HELLO option '{}'",
                        String::from_utf8_lossy(a[i])
                    ),
                );
                return Control::Continue;
            }
        }
        if name.is_some() {
            s.name = name;
        }
        array(out, 14);
        bulk(out, b"server");
        bulk(out, b"redis");
        bulk(out, b"version");
        bulk(out, REDIS_VERSION.as_bytes());
        bulk(out, b"proto");
        int(out, 2);
        bulk(out, b"id");
        int(out, s.id as i64);
        bulk(out, b"mode");
        bulk(out, b"standalone");
        bulk(out, b"role");
        bulk(out, b"master");
        bulk(out, b"modules");
        array(out, 0);
        Control::Continue
    }

    /// CLIENT KILL addr:port (old form: +OK or no such client), or filters ID, ADDR, LADDR,
    /// TYPE, USER, SKIPME, MAXAGE (Redis 7.0: the number killed). Killing this connection
    /// closes it after the reply.
    fn client_kill(&self, s: &mut Session, a: &[&[u8]], out: &mut Vec<u8>) -> Control {
        self.clients.sync(s);
        let me = s.id;
        if a.len() == 3 {
            let addr = String::from_utf8_lossy(a[2]).into_owned();
            let killed = self.clients.kill(|c| c.peer == addr);
            if killed.is_empty() {
                reply::error(out, "ERR No such client");
                return Control::Continue;
            }
            reply::ok(out);
            return if killed.contains(&me) {
                Control::Close
            } else {
                Control::Continue
            };
        }
        if a.len() % 2 != 0 {
            reply::syntax(out);
            return Control::Continue;
        }
        let mut filters: Vec<ClientFilter> = Vec::new();
        let mut skipme = true;
        for pair in a[2..].chunks(2) {
            let (k, v) = (pair[0], pair[1]);
            let text = String::from_utf8_lossy(v).into_owned();
            if is(k, "ID") {
                match parse_i64(v) {
                    Some(id) if id > 0 => filters.push(Box::new(move |c| c.id == id as u64)),
                    _ => {
                        reply::error(out, "ERR client-id should be greater than 0");
                        return Control::Continue;
                    }
                }
            } else if is(k, "ADDR") {
                filters.push(Box::new(move |c| c.peer == text));
            } else if is(k, "LADDR") {
                filters.push(Box::new(|_| false));
            } else if is(k, "TYPE") {
                match text.to_ascii_lowercase().as_str() {
                    "normal" => filters.push(Box::new(|c| c.sub + c.psub == 0)),
                    "pubsub" => filters.push(Box::new(|c| c.sub + c.psub > 0)),
                    "master" | "replica" | "slave" => filters.push(Box::new(|_| false)),
                    _ => {
                        reply::error(out, &format!("ERR Unknown client type '{text}'"));
                        return Control::Continue;
                    }
                }
            } else if is(k, "USER") {
                filters.push(Box::new(move |_| text == "default"));
            } else if is(k, "SKIPME") {
                if is(v, "YES") {
                    skipme = true;
                } else if is(v, "NO") {
                    skipme = false;
                } else {
                    reply::syntax(out);
                    return Control::Continue;
                }
            } else if is(k, "MAXAGE") {
                match parse_i64(v) {
                    Some(age) => filters.push(Box::new(move |c| {
                        c.created.elapsed().as_secs() as i64 >= age
                    })),
                    None => {
                        reply::not_int(out);
                        return Control::Continue;
                    }
                }
            } else {
                reply::syntax(out);
                return Control::Continue;
            }
        }
        let killed = self
            .clients
            .kill(|c| !(skipme && c.id == me) && filters.iter().all(|f| f(c)));
        int(out, killed.len() as i64);
        if killed.contains(&me) {
            Control::Close
        } else {
            Control::Continue
        }
    }

    fn client(&self, s: &mut Session, a: &[&[u8]], out: &mut Vec<u8>) -> Control {
        let sub = a[1];
        if is(sub, "ID") && a.len() == 2 {
            int(out, s.id as i64);
        } else if is(sub, "SETNAME") && a.len() == 3 {
            if a[2].iter().any(|&c| c <= b' ' || c > b'~') {
                reply::error(
                    out,
                    "ERR Client names cannot contain spaces, newlines or special characters.",
                );
            } else {
                s.name = (!a[2].is_empty()).then(|| a[2].to_vec());
                reply::ok(out);
            }
        } else if is(sub, "GETNAME") && a.len() == 2 {
            match &s.name {
                Some(n) => bulk(out, n),
                None => null(out),
            }
        } else if (is(sub, "SETINFO") && a.len() == 4)
            || ((is(sub, "NO-EVICT") || is(sub, "NO-TOUCH")) && a.len() == 3)
        {
            reply::ok(out);
        } else if is(sub, "INFO") && a.len() == 2 {
            bulk(out, super::clients::ClientView::of(s).line().as_bytes());
        } else if is(sub, "LIST") {
            // Redis 7.0: [TYPE normal|master|replica|pubsub] [ID id ...].
            self.clients.sync(s);
            let mut all = self.clients.list();
            if a.len() > 2 {
                if is(a[2], "TYPE") && a.len() == 4 {
                    let t = String::from_utf8_lossy(a[3]).to_ascii_lowercase();
                    match t.as_str() {
                        "normal" => all.retain(|c| c.sub + c.psub == 0),
                        "pubsub" => all.retain(|c| c.sub + c.psub > 0),
                        "master" | "replica" | "slave" => all.clear(),
                        _ => {
                            reply::error(out, &format!("ERR Unknown client type '{t}'"));
                            return Control::Continue;
                        }
                    }
                } else if is(a[2], "ID") && a.len() >= 4 {
                    let mut ids = Vec::new();
                    for x in &a[3..] {
                        match parse_i64(x) {
                            Some(v) if v > 0 => ids.push(v as u64),
                            _ => {
                                reply::error(out, "ERR Invalid client ID");
                                return Control::Continue;
                            }
                        }
                    }
                    all.retain(|c| ids.contains(&c.id));
                } else {
                    reply::syntax(out);
                    return Control::Continue;
                }
            }
            let text: String = all.iter().map(|c| c.line()).collect();
            bulk(out, text.as_bytes());
        } else if is(sub, "KILL") && a.len() >= 3 {
            return self.client_kill(s, a, out);
        } else {
            reply::error(
                out,
                &format!(
                    "ERR unknown subcommand or wrong number of arguments for '{}'. Try CLIENT HELP.",
                    String::from_utf8_lossy(sub)
                ),
            );
        }
        Control::Continue
    }

    fn section<M: Mem>(&self, m: &M, name: &str) -> Vec<(String, String)> {
        let mut f: Vec<(String, String)> = Vec::new();
        let mut add = |k: &str, v: String| f.push((k.to_string(), v));
        let st = &self.stats;
        let einfo = self.heap.engine().info();
        match name {
            "server" => {
                let up = self.started.elapsed().as_secs();
                add("redis_version", REDIS_VERSION.into());
                add("tiermem_kv_version", env!("CARGO_PKG_VERSION").into());
                add("redis_git_sha1", "00000000".into());
                add("redis_git_dirty", "0".into());
                add("redis_mode", "standalone".into());
                add("os", os_name());
                add("arch_bits", (usize::BITS).to_string());
                add("multiplexing_api", "epoll".into());
                add("process_id", std::process::id().to_string());
                add("run_id", self.run_id.clone());
                add("tcp_port", "0".into());
                add(
                    "server_time_usec",
                    SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.as_micros() as u64)
                        .to_string(),
                );
                add("uptime_in_seconds", up.to_string());
                add("uptime_in_days", (up / 86400).to_string());
                add("tiermem_engine", einfo.name.into());
                add("tiermem_durability", self.durability.name().into());
            }
            "clients" => {
                add("connected_clients", st.connected.load(Relaxed).to_string());
                add("blocked_clients", "0".into());
                add("tracking_clients", "0".into());
            }
            "memory" => {
                let used = self.store.used_bytes(m);
                let heap = einfo.heap_bytes;
                add("used_memory", used.to_string());
                add("used_memory_human", human(used));
                add("used_memory_dataset", used.to_string());
                add("maxmemory", heap.to_string());
                add("maxmemory_human", human(heap));
                add("maxmemory_policy", "noeviction".into());
                add("mem_allocator", "tiermem-txalloc".into());
                add("tiermem_engine", einfo.name.into());
                add("tiermem_location", einfo.location.clone());
                add("tiermem_heap_bytes", heap.to_string());
                add("tiermem_heap_used_bytes", used.to_string());
                add(
                    "tiermem_heap_free_bytes",
                    heap.saturating_sub(used).to_string(),
                );
                add(
                    "tiermem_garbage_records",
                    self.store.garbage_records(m).to_string(),
                );
                for (k, v) in &einfo.fields {
                    add(k, v.clone());
                }
            }
            "persistence" => {
                let durable = einfo.durable;
                add("loading", "0".into());
                add("async_loading", "0".into());
                // On a durable engine every acknowledged write is already persistent; with
                // snapshots, the writes after the last one's point in time (below).
                if self.persistence.get().is_none() {
                    add(
                        "rdb_changes_since_last_save",
                        if durable {
                            "0".into()
                        } else {
                            st.changes.load(Relaxed).to_string()
                        },
                    );
                }
                match self.persistence.get() {
                    Some(p) => p.info(st.changes.load(Relaxed), &mut add),
                    None => {
                        add("rdb_bgsave_in_progress", "0".into());
                        add(
                            "rdb_last_save_time",
                            self.last_save.load(Relaxed).to_string(),
                        );
                        add("rdb_last_bgsave_status", "ok".into());
                        add("rdb_saves", "0".into());
                    }
                }
                add("aof_enabled", "0".into());
                add("aof_rewrite_in_progress", "0".into());
                add("aof_rewrite_scheduled", "0".into());
                add("aof_last_bgrewrite_status", "ok".into());
                add("aof_last_write_status", "ok".into());
                let perr = self.persist_error();
                add(
                    "last_write_status",
                    if perr.is_some() { "err" } else { "ok" }.into(),
                );
                add("last_write_error", perr.clone().unwrap_or_default());
                add("writes_refused", (perr.is_some() as u8).to_string());
                add(
                    "writes_refused_total",
                    self.writes_refused.load(Relaxed).to_string(),
                );
                add(
                    "heap_damaged",
                    (self.damaged_at().is_some() as u8).to_string(),
                );
                add(
                    "heap_damaged_offset",
                    self.damaged_at().map_or(String::new(), |o| o.to_string()),
                );
                add("tiermem_durability", self.durability.name().into());
                add("tiermem_engine_durable", (durable as u8).to_string());
                add(
                    "tiermem_persistence",
                    if durable {
                        format!(
                            "every acknowledged write is committed to the {} engine before its reply",
                            einfo.name
                        )
                    } else if let Some(p) = self.persistence.get() {
                        format!(
                            "snapshots of the volatile heap to {} (SAVE, BGSAVE, save points)",
                            p.settings().path().display()
                        )
                    } else {
                        "none: the volatile engine keeps no copy".into()
                    },
                );
            }
            "stats" => {
                add(
                    "total_connections_received",
                    st.connections_total.load(Relaxed).to_string(),
                );
                add(
                    "total_commands_processed",
                    st.commands.load(Relaxed).to_string(),
                );
                add(
                    "latest_fork_usec",
                    self.persistence
                        .get()
                        .map_or(0, |p| p.latest_fork_usec())
                        .to_string(),
                );
                add("expired_keys", st.expired.load(Relaxed).to_string());
                add("evicted_keys", "0".into());
                add("keyspace_hits", st.hits.load(Relaxed).to_string());
                add("keyspace_misses", st.misses.load(Relaxed).to_string());
                add("tiermem_commits", st.commits.load(Relaxed).to_string());
                add("tiermem_aborts", st.aborts.load(Relaxed).to_string());
                add(
                    "tiermem_tx_too_large",
                    st.too_large.load(Relaxed).to_string(),
                );
                add("tiermem_oom_errors", st.oom.load(Relaxed).to_string());
                add("tiermem_garbage_work", st.gc_work.load(Relaxed).to_string());
            }
            "replication" => {
                add("role", "master".into());
                add("connected_slaves", "0".into());
                add("master_repl_offset", "0".into());
            }
            "cpu" => {
                // SAFETY: getrusage fills the zeroed struct it is given.
                let ru = unsafe {
                    let mut ru: libc::rusage = std::mem::zeroed();
                    libc::getrusage(libc::RUSAGE_SELF, &mut ru);
                    ru
                };
                let t = |tv: libc::timeval| format!("{}.{:06}", tv.tv_sec, tv.tv_usec);
                add("used_cpu_sys", t(ru.ru_stime));
                add("used_cpu_user", t(ru.ru_utime));
            }
            "commandstats" => f.extend(self.cmdstats.lines()),
            "keyspace" => {
                for db in 0..crate::ds::DATABASES {
                    let store = self.store.db(m, db);
                    let n = keyspace::len(m, &store);
                    if n > 0 {
                        let x = crate::ds::expire::count(m, &store);
                        let avg = if x > 0 { st.avg_ttl.load(Relaxed) } else { 0 };
                        add(
                            &format!("db{db}"),
                            format!("keys={n},expires={x},avg_ttl={avg}"),
                        );
                    }
                }
            }
            _ => {}
        }
        if let Some(src) = &self.info_source {
            let mut extra = Vec::new();
            src.info(name, &mut extra);
            for (k, v) in extra {
                match f.iter_mut().find(|(n, _)| *n == k) {
                    Some(e) => e.1 = v,
                    None => f.push((k, v)),
                }
            }
        }
        f
    }

    /// INFO [section ...].
    pub(super) fn info<M: Mem>(&self, m: &M, _s: &Session, a: &[&[u8]], out: &mut Vec<u8>) {
        const DEFAULT: &[&str] = &[
            "server",
            "clients",
            "memory",
            "persistence",
            "stats",
            "replication",
            "cpu",
            "keyspace",
        ];
        // `migration`: only a migration target has one (omitted when empty).
        const EXTRA: &[&str] = &["migration"];
        // In `all` and by name, not by default (as Redis).
        const MORE: &[&str] = &["commandstats"];
        let mut names: Vec<&str> = Vec::new();
        if a.len() == 1 {
            names.extend_from_slice(DEFAULT);
            names.extend_from_slice(EXTRA);
        }
        for x in &a[1..] {
            let l = String::from_utf8_lossy(x).to_ascii_lowercase();
            match l.as_str() {
                "default" => {
                    names.extend_from_slice(DEFAULT);
                    names.extend_from_slice(EXTRA);
                }
                "all" | "everything" => {
                    names.extend_from_slice(DEFAULT);
                    names.extend_from_slice(MORE);
                    names.extend_from_slice(EXTRA);
                }
                _ => {
                    if let Some(n) = DEFAULT.iter().chain(MORE).chain(EXTRA).find(|d| **d == l) {
                        names.push(n);
                    }
                }
            }
        }
        let mut text = String::new();
        let mut seen = Vec::new();
        for n in names {
            if seen.contains(&n) {
                continue;
            }
            seen.push(n);
            let fields = self.section(m, n);
            if fields.is_empty() && EXTRA.contains(&n) {
                continue;
            }
            if !text.is_empty() {
                text.push_str("\r\n");
            }
            let mut title = n.to_string();
            title[..1].make_ascii_uppercase();
            if title == "Cpu" {
                title = "CPU".into();
            }
            let _ = write!(text, "# {title}\r\n");
            for (k, v) in fields {
                let v: String = v
                    .chars()
                    .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
                    .collect();
                let _ = write!(text, "{k}:{v}\r\n");
            }
        }
        bulk(out, text.as_bytes());
    }
}

fn os_name() -> String {
    // SAFETY: uname fills the zeroed struct; its fields are NUL-terminated.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return "Linux".into();
        }
        let f = |p: &[libc::c_char]| {
            std::ffi::CStr::from_ptr(p.as_ptr())
                .to_string_lossy()
                .into_owned()
        };
        format!("{} {} {}", f(&u.sysname), f(&u.release), f(&u.machine))
    }
}
