//! Configuration: the server's network limits ([`ServerConfig`]) and the whole server's settings
//! ([`KvConfig`]), read from a `redis.conf`-style file and set by command-line flags through one
//! function, [`KvConfig::set`], so one place knows every key; what `CONFIG SET` may change while
//! the server runs and how it checks it ([`KvConfig::config_set`], Redis 7.0's replies);
//! `CONFIG REWRITE` ([`rewrite_file`]); and Redis's encoding thresholds ([`Thresholds`],
//! [`thresholds`]).
//!
//! # Keys
//!
//! Redis's name where Redis has the setting, a tiermem name otherwise. Sizes are written as Redis
//! accepts them: a number of bytes, or with `k`/`m`/`g` (powers of 1000) or `kb`/`mb`/`gb` (powers
//! of 1024), any case. "0 = no limit" where noted, as in Redis. "Live": `CONFIG SET` changes it
//! for the running server (see [`crate::runtime`]); the others are set at start and `CONFIG SET`
//! refuses them with Redis's `can't set immutable config`.
//!
//! | key | default | live | meaning |
//! |---|---|---|---|
//! | `bind` | `127.0.0.1` | | addresses to listen on, blank-separated; `*` = all IPv4, `::*` = all IPv6, a leading `-` = skip it if unavailable; empty = no TCP |
//! | `port` | `6379` | | TCP port; **0 = an ephemeral port** chosen by the OS (Redis: 0 disables TCP; here use an empty `bind`) |
//! | `unixsocket` | none | | path of a Unix socket to listen on too |
//! | `unixsocketperm` | umask | | its permission bits, octal (e.g. `700`, `770`) |
//! | `threads` | the CPU count − 1 (at least 1) | | event-loop threads |
//! | `maxclients` | `10000` | yes | connections beyond it get `-ERR max number of clients reached` and are closed; the open-file limit is raised to fit |
//! | `timeout` | `0` | yes | seconds a client may stay idle (no input, no reply sent) before it is closed, as Redis's `timeout`: blocked clients and subscribers are left alone; 0 = never |
//! | `proto-max-bulk-len` | `64mb` | yes | largest bulk argument; larger is rejected when its `$len` arrives |
//! | `max-multibulk-len` | `1048576` | yes | most arguments in one request |
//! | `max-inline-len` | `64kb` | yes | longest inline request line (and `*`/`$` header line) |
//! | `client-query-buffer-limit` | `256mb` | yes | largest unfinished request one client may have buffered: a whole request must fit (unlike Redis, whose parsed arguments live outside the query buffer); beyond it the client is closed |
//! | `total-query-buffer-budget` | `1gb` | yes | all clients' unfinished requests together; beyond it the client with the largest buffer is closed; 0 = no limit |
//! | `unfinished-frame-timeout` | `30` | yes | seconds (or `500ms`) a client may sit on an unfinished request without sending a byte before it is closed; 0 = never |
//! | `client-output-buffer-limit` | `256mb` | yes | replies pending for one client (subscribers included) beyond which it is closed; 0 = no limit. Also Redis's `<class> <hard> <soft> <seconds>` groups: `normal`'s hard limit is this limit (its soft limit must be 0); `replica`/`slave`/`pubsub` groups are accepted and ignored (no replicas; subscribers share the one limit) |
//! | `engine` | `vnvm` | | `vnvm` (durable) or `volatile` |
//! | `dir` | none | | the engine's directory (the caller picks one when unset) |
//! | `new` | `no` | | `yes`: create a new instance (vnvm), only in an empty or nonexistent `dir`; `no`: open the instance in `dir`, refusing a directory that holds none or only part of one |
//! | `durability` | `pipeline` | | `pipeline` (one transaction per pipeline) or `commit` (one per write command); durable before the reply either way |
//! | `heap-size` | `1gb` | | the heap's size |
//! | `log-size`, `cache-size` | engine default | | vnvm's log and NVM-cache sizes; empty = engine default |
//! | `dbfilename` | `dump.tmsnap` | snapshots | the `volatile` engine's snapshot file in `dir` (SAVE, BGSAVE, loaded at start) |
//! | `snapshot-method` | `wp` | snapshots | how snapshots are taken: `wp` (fork-less, bounded extra memory), `fork-mdc` or `fork` |
//! | `snapshot-target` | `file` | snapshots | where snapshots go: `file` (O_DIRECT) or `nvm-pool` (a media NVM pool file at `dir/dbfilename`) |
//! | `snapshot-staging-slots` | `16` | snapshots | `wp`'s staging slots of 256 KiB (0–64) |
//! | `save` | `""` | snapshots | save points, `seconds changes` pairs (Redis's syntax); empty = none |
//! | `requirepass` | `""` | yes | the default user's password |
//! | `protected-mode` | `yes` | yes | Redis's protected mode |
//! | `hash-max-listpack-entries` | `512` | yes | Redis's encoding thresholds ([`Thresholds`]); the `*-ziplist-*` names are aliases, as in Redis |
//! | `hash-max-listpack-value` | `64` | yes | |
//! | `zset-max-listpack-entries` | `128` | yes | |
//! | `zset-max-listpack-value` | `64` | yes | |
//! | `set-max-intset-entries` | `512` | yes | |
//! | `list-max-listpack-size` | `-2` | yes | |
//! | `list-compress-depth` | `0` | yes | |
//!
//! "snapshots": live on a server that takes snapshots (the volatile engine).
//!
//! Read-only, for clients that probe them with `CONFIG GET` (setting them to their fixed value is
//! accepted): `appendonly` (`no`), `maxmemory` (`0`), `databases` (`16`, immutable as in Redis).
//!
//! `CONFIG SET` checks a key Redis has as Redis 7.0 does (its integer and memory syntax, its
//! bounds, its error texts), then as [`KvConfig::set`] does.

use std::fmt;
use std::io::{self, Write as _};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::time::Duration;

use crate::resp;

/// The network front end's settings (see the module documentation for each key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Addresses to listen on (`bind`): IPs, `*`, `::*`, each optionally prefixed by `-`
    /// (skipped when the address is not available). Empty: no TCP listener.
    pub bind: Vec<String>,
    /// TCP port (`port`); 0 asks the OS for an ephemeral port (the server handle reports it).
    pub port: u16,
    /// A Unix socket path to listen on as well (`unixsocket`).
    pub unix_socket: Option<PathBuf>,
    /// The Unix socket's permission bits (`unixsocketperm`), e.g. `0o700`; `None`: umask.
    pub unix_socket_perm: Option<u32>,
    /// Event-loop threads (`threads`), at least 1.
    pub threads: usize,
    /// Most simultaneous clients (`maxclients`).
    pub max_clients: usize,
    /// Largest bulk argument in bytes (`proto-max-bulk-len`).
    pub proto_max_bulk_len: u64,
    /// Most arguments in one multibulk request (`max-multibulk-len`).
    pub max_multibulk_len: u64,
    /// Longest inline line / header line in bytes (`max-inline-len`).
    pub max_inline_len: usize,
    /// Largest unfinished request one client may buffer (`client-query-buffer-limit`).
    pub client_query_buffer_limit: u64,
    /// All clients' unfinished requests together (`total-query-buffer-budget`); 0 = no limit.
    pub total_query_buffer_budget: u64,
    /// How long a client may hold an unfinished request without sending anything
    /// (`unfinished-frame-timeout`); zero = forever.
    pub unfinished_frame_timeout: Duration,
    /// Pending reply bytes beyond which a client is closed (`client-output-buffer-limit`);
    /// 0 = no limit.
    pub client_output_buffer_limit: u64,
    /// Seconds a client may stay idle before it is closed (`timeout`); 0 = never. Blocked
    /// clients and subscribers are never closed for it.
    pub idle_timeout: u64,
}

/// The default number of event-loop threads: one per CPU but one, at least one. The CPU left
/// over runs the clients that share the machine and the engine's own workers (vnvm's redo and
/// writeback). Measured on a 2-CPU VM with redis-benchmark -P 16 on the same machine: GET
/// 1.17–1.35 M/s with one event loop against 1.12–1.21 M/s with two, which took CPU time
/// from the client (YCSB with two synchronous clients gains from two loops: ~36k against
/// ~24k ops/s; set `threads` for such a load).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1))
}

impl Default for ServerConfig {
    /// The defaults of the module documentation's table.
    fn default() -> Self {
        ServerConfig {
            bind: vec!["127.0.0.1".to_string()],
            port: 6379,
            unix_socket: None,
            unix_socket_perm: None,
            threads: default_threads(),
            max_clients: 10_000,
            proto_max_bulk_len: resp::DEFAULT_MAX_BULK_LEN,
            max_multibulk_len: resp::DEFAULT_MAX_MULTIBULK_LEN,
            max_inline_len: resp::DEFAULT_MAX_INLINE_LEN,
            client_query_buffer_limit: 256 << 20,
            total_query_buffer_budget: 1 << 30,
            unfinished_frame_timeout: Duration::from_secs(30),
            client_output_buffer_limit: 256 << 20,
            idle_timeout: 0,
        }
    }
}

impl ServerConfig {
    /// The parser limits these settings imply.
    pub fn limits(&self) -> resp::Limits {
        resp::Limits {
            max_bulk_len: self.proto_max_bulk_len,
            max_multibulk_len: self.max_multibulk_len,
            max_inline_len: self.max_inline_len,
        }
    }

    /// Checks the settings together: at least one listener, `threads` and `maxclients` at least
    /// 1, non-zero parser limits, a query buffer limit that can hold the largest bulk, bind
    /// addresses that parse.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |m: String| Err(ConfigError::new(m));
        if self.threads == 0 {
            return err("threads must be at least 1".into());
        }
        if self.max_clients == 0 {
            return err("maxclients must be at least 1".into());
        }
        if self.proto_max_bulk_len == 0 || self.max_multibulk_len == 0 || self.max_inline_len == 0 {
            return err(
                "proto-max-bulk-len, max-multibulk-len and max-inline-len must be positive".into(),
            );
        }
        if self.proto_max_bulk_len > i64::MAX as u64 / 2 {
            return err("proto-max-bulk-len is too large".into());
        }
        if self.client_query_buffer_limit < self.proto_max_bulk_len {
            return err(format!(
                "client-query-buffer-limit ({}) must be at least proto-max-bulk-len ({})",
                self.client_query_buffer_limit, self.proto_max_bulk_len
            ));
        }
        for b in &self.bind {
            parse_bind(b).map_err(ConfigError::new)?;
        }
        if self.bind.is_empty() && self.unix_socket.is_none() {
            return err("nothing to listen on: bind is empty and no unixsocket is set".into());
        }
        Ok(())
    }
}

/// One `bind` entry: the address and whether it is optional (`-` prefix).
pub fn parse_bind(entry: &str) -> Result<(IpAddr, bool), String> {
    let (optional, addr) = match entry.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, entry),
    };
    let ip = match addr {
        "*" => IpAddr::from([0u8; 4]),
        "::*" => IpAddr::from([0u16; 8]),
        _ => addr
            .parse()
            .map_err(|_| format!("bind: '{entry}' is not an IP address, '*' or '::*'"))?,
    };
    Ok((ip, optional))
}

/// The whole server's settings: the network front end and the storage engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvConfig {
    /// The network front end.
    pub server: ServerConfig,
    /// `vnvm` or `volatile` (`engine`).
    pub engine: String,
    /// The engine's directory (`dir`); `None`: the caller's default.
    pub dir: Option<PathBuf>,
    /// Create a new instance (`new yes`; `--new`), only in an empty or nonexistent directory;
    /// otherwise open the existing one. Ignored by the volatile engine.
    pub new: bool,
    /// `pipeline` or `commit` (`durability`).
    pub durability: String,
    /// The heap's size in bytes (`heap-size`).
    pub heap_size: u64,
    /// vnvm's log size (`log-size`); `None`: the engine's default.
    pub log_size: Option<u64>,
    /// vnvm's NVM cache size (`cache-size`); `None`: the engine's default.
    pub cache_size: Option<u64>,
    /// Start as the target of a migration: the FAM directory holding it (`restore-from`).
    pub restore_from: Option<PathBuf>,
    /// The migration's id (`migration-id`, hex), with `restore-from`.
    pub migration_id: Option<u64>,
    /// The source's page-server address (`migration-source`, ip:port), with `restore-from`;
    /// not needed once the source's dump is complete.
    pub migration_source: Option<std::net::SocketAddr>,
    /// How the migration's pages arrive (`migration-method`): `fam` (default: restore from the
    /// FAM dump `restore-from` names, faults to the source's page-server) or `socket` (socket
    /// post-copy from the source's page-server `migration-source`; `restore-from` unused, and
    /// `heap-size` must equal the source's heap size).
    pub migration_method: String,
    /// The snapshot file's name in `dir` (`dbfilename`).
    pub dbfilename: String,
    /// How snapshots are taken (`snapshot-method`: `wp`, `fork-mdc`, `fork`).
    pub snapshot_method: String,
    /// Where snapshots go (`snapshot-target`: `file`, `nvm-pool`).
    pub snapshot_target: String,
    /// `wp`'s staging slots (`snapshot-staging-slots`).
    pub snapshot_staging_slots: usize,
    /// Save points (`save`), Redis's syntax; empty: none.
    pub save: String,
    /// The default user's password (`requirepass`); empty: none, every client is
    /// authenticated. Clients must AUTH first otherwise.
    pub requirepass: String,
    /// Redis' protected mode (`protected-mode`, default yes): with no password, only clients on
    /// the loopback interface or the Unix socket are served.
    pub protected_mode: bool,
    /// Redis's encoding thresholds (`hash-max-listpack-entries`, ...).
    pub thresholds: Thresholds,
    /// The file this configuration was read from (the last [`KvConfig::load_file`]), which
    /// `CONFIG REWRITE` rewrites; `None`: no file. Not a key.
    pub config_file: Option<PathBuf>,
}

impl Default for KvConfig {
    /// The defaults of the module documentation's table.
    fn default() -> Self {
        KvConfig {
            server: ServerConfig::default(),
            engine: "vnvm".to_string(),
            dir: None,
            new: false,
            durability: "pipeline".to_string(),
            heap_size: 1 << 30,
            log_size: None,
            cache_size: None,
            restore_from: None,
            migration_id: None,
            migration_source: None,
            migration_method: "fam".to_string(),
            dbfilename: crate::persistence::DEFAULT_DBFILENAME.to_string(),
            snapshot_method: "wp".to_string(),
            snapshot_target: "file".to_string(),
            snapshot_staging_slots: 16,
            save: String::new(),
            requirepass: String::new(),
            protected_mode: true,
            thresholds: Thresholds::default(),
            config_file: None,
        }
    }
}

/// A bad key or value, with where it came from when it came from a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// `file:line` for errors from [`KvConfig::load_file`].
    pub location: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl ConfigError {
    fn new(message: impl Into<String>) -> Self {
        ConfigError {
            location: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    /// `file:line: message`, or just the message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Some(loc) => write!(f, "{loc}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Every key [`KvConfig::get`] reports, in its order.
const KEYS: &[&str] = &[
    "bind",
    "port",
    "unixsocket",
    "unixsocketperm",
    "threads",
    "maxclients",
    "timeout",
    "proto-max-bulk-len",
    "max-multibulk-len",
    "max-inline-len",
    "client-query-buffer-limit",
    "total-query-buffer-budget",
    "unfinished-frame-timeout",
    "client-output-buffer-limit",
    "engine",
    "dir",
    "new",
    "durability",
    "heap-size",
    "log-size",
    "cache-size",
    "restore-from",
    "migration-id",
    "migration-source",
    "migration-method",
    "dbfilename",
    "snapshot-method",
    "snapshot-target",
    "snapshot-staging-slots",
    "save",
    "requirepass",
    "protected-mode",
    "hash-max-listpack-entries",
    "hash-max-listpack-value",
    "hash-max-ziplist-entries",
    "hash-max-ziplist-value",
    "zset-max-listpack-entries",
    "zset-max-listpack-value",
    "zset-max-ziplist-entries",
    "zset-max-ziplist-value",
    "set-max-intset-entries",
    "list-max-listpack-size",
    "list-max-ziplist-size",
    "list-compress-depth",
    "appendonly",
    "maxmemory",
    "databases",
];

/// The read-only keys and their fixed values.
const FIXED: &[(&str, &str)] = &[
    ("appendonly", "no"),
    ("maxmemory", "0"),
    ("databases", "16"),
];

/// Redis's old names of the encoding thresholds: (alias, key).
const ALIASES: &[(&str, &str)] = &[
    ("hash-max-ziplist-entries", "hash-max-listpack-entries"),
    ("hash-max-ziplist-value", "hash-max-listpack-value"),
    ("zset-max-ziplist-entries", "zset-max-listpack-entries"),
    ("zset-max-ziplist-value", "zset-max-listpack-value"),
    ("list-max-ziplist-size", "list-max-listpack-size"),
];

/// The key an alias names (lower case in, the key itself for non-aliases).
fn canonical(key: &str) -> &str {
    ALIASES
        .iter()
        .find(|(a, _)| *a == key)
        .map_or(key, |&(_, k)| k)
}

/// The keys `CONFIG SET` changes for the running server (aliases included). `appendonly` and
/// `maxmemory` accept only their fixed value ([`KvConfig::set`] checks it).
const LIVE: &[&str] = &[
    "maxclients",
    "timeout",
    "proto-max-bulk-len",
    "max-multibulk-len",
    "max-inline-len",
    "client-query-buffer-limit",
    "total-query-buffer-budget",
    "unfinished-frame-timeout",
    "client-output-buffer-limit",
    "requirepass",
    "protected-mode",
    "hash-max-listpack-entries",
    "hash-max-listpack-value",
    "hash-max-ziplist-entries",
    "hash-max-ziplist-value",
    "zset-max-listpack-entries",
    "zset-max-listpack-value",
    "zset-max-ziplist-entries",
    "zset-max-ziplist-value",
    "set-max-intset-entries",
    "list-max-listpack-size",
    "list-max-ziplist-size",
    "list-compress-depth",
    "appendonly",
    "maxmemory",
];

/// The snapshot keys: live on a server that takes snapshots ([`crate::persistence`]).
const SNAPSHOT_KEYS: &[&str] = &[
    "dbfilename",
    "snapshot-method",
    "snapshot-target",
    "snapshot-staging-slots",
    "save",
];

/// Keys `CONFIG REWRITE` never writes: one-shot start actions (creating an instance, restoring
/// a migration), which a restart from the rewritten file must not repeat.
const REWRITE_SKIP: &[&str] = &[
    "new",
    "restore-from",
    "migration-id",
    "migration-source",
    "migration-method",
];

/// Redis 7.0's encoding thresholds: accepted by `CONFIG SET`/`GET` and in the configuration
/// file with Redis's names, syntax and bounds, and in force process-wide through
/// [`thresholds`]. Defaults are Redis's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// `hash-max-listpack-entries` (alias `hash-max-ziplist-entries`): most fields of a
    /// compact hash. tiermem-kv's hash packs honour it up to their own ceiling
    /// ([`crate::ds::pack::MAX_ENTRIES`]): a write that leaves a hash with more fields makes
    /// it a dict.
    pub hash_max_listpack_entries: u64,
    /// `hash-max-listpack-value` (alias `hash-max-ziplist-value`): the longest field or value
    /// of a compact hash.
    pub hash_max_listpack_value: u64,
    /// `zset-max-listpack-entries` (alias `zset-max-ziplist-entries`): most members of a
    /// compact sorted set.
    pub zset_max_listpack_entries: u64,
    /// `zset-max-listpack-value` (alias `zset-max-ziplist-value`): the longest member of a
    /// compact sorted set.
    pub zset_max_listpack_value: u64,
    /// `set-max-intset-entries`: most members of an intset (a set of integers only).
    pub set_max_intset_entries: u64,
    /// `list-max-listpack-size` (alias `list-max-ziplist-size`): entries per quicklist node,
    /// or, negative (-1 to -5), its size in 4, 8, 16, 32 or 64 KiB.
    pub list_max_listpack_size: i64,
    /// `list-compress-depth`: quicklist nodes left uncompressed at each end (0: none
    /// compressed).
    pub list_compress_depth: u64,
}

impl Default for Thresholds {
    /// Redis 7.0's defaults: 512, 64, 128, 64, 512, -2, 0.
    fn default() -> Self {
        Thresholds {
            hash_max_listpack_entries: 512,
            hash_max_listpack_value: 64,
            zset_max_listpack_entries: 128,
            zset_max_listpack_value: 64,
            set_max_intset_entries: 512,
            list_max_listpack_size: -2,
            list_compress_depth: 0,
        }
    }
}

/// The thresholds in force, in [`Thresholds`]' field order.
static THRESHOLDS: [AtomicI64; 7] = [
    AtomicI64::new(512),
    AtomicI64::new(64),
    AtomicI64::new(128),
    AtomicI64::new(64),
    AtomicI64::new(512),
    AtomicI64::new(-2),
    AtomicI64::new(0),
];

/// The encoding thresholds in force in this process (what OBJECT ENCODING and the data
/// structures follow): Redis's defaults until a server starts, then its configuration's
/// ([`crate::instance::KvInstance::start`] calls [`set_thresholds`]), then what `CONFIG SET`
/// makes them. Process-wide rather than per server: a process serves one configuration (a
/// second server started in the same process shares them; the last start or `CONFIG SET`
/// wins). Seven relaxed atomic loads, no lock: cheap enough for a command's path. A change
/// is not atomic across fields: a reader racing `CONFIG SET` may see some new and some old.
pub fn thresholds() -> Thresholds {
    let t = |i: usize| THRESHOLDS[i].load(Relaxed);
    Thresholds {
        hash_max_listpack_entries: t(0) as u64,
        hash_max_listpack_value: t(1) as u64,
        zset_max_listpack_entries: t(2) as u64,
        zset_max_listpack_value: t(3) as u64,
        set_max_intset_entries: t(4) as u64,
        list_max_listpack_size: t(5),
        list_compress_depth: t(6) as u64,
    }
}

/// Makes `t` the thresholds in force ([`thresholds`]). Values are within Redis's bounds
/// (at most `i64::MAX`), so they fit the atomics.
pub fn set_thresholds(t: Thresholds) {
    let v = [
        t.hash_max_listpack_entries as i64,
        t.hash_max_listpack_value as i64,
        t.zset_max_listpack_entries as i64,
        t.zset_max_listpack_value as i64,
        t.set_max_intset_entries as i64,
        t.list_max_listpack_size,
        t.list_compress_depth as i64,
    ];
    for (a, v) in THRESHOLDS.iter().zip(v) {
        a.store(v, Relaxed);
    }
}

/// How Redis 7.0 reads one numeric setting (its `config.c` numeric configs).
#[derive(Clone, Copy, Debug)]
struct Numeric {
    /// Memory syntax (`memtoull`: `1gb`, ...) rather than a plain integer (`string2ll`).
    memory: bool,
    /// An unsigned C type: the bounds compare the value as unsigned, so -1 is out of range.
    unsigned: bool,
    min: i64,
    max: i64,
}

/// The Redis numeric setting `key` (a key, not an alias), if it is one.
fn numeric(key: &str) -> Option<Numeric> {
    let n = |memory, unsigned, min, max| {
        Some(Numeric {
            memory,
            unsigned,
            min,
            max,
        })
    };
    match key {
        "maxclients" => n(false, true, 1, u32::MAX as i64),
        "timeout" => n(false, false, 0, i32::MAX as i64),
        "proto-max-bulk-len" => n(true, false, 1 << 20, i64::MAX),
        "client-query-buffer-limit" => n(true, true, 1 << 20, i64::MAX),
        "hash-max-listpack-entries" | "zset-max-listpack-entries" | "set-max-intset-entries" => {
            n(false, true, 0, i64::MAX)
        }
        "hash-max-listpack-value" | "zset-max-listpack-value" => n(true, true, 0, i64::MAX),
        "list-max-listpack-size" => n(false, false, i32::MIN as i64, i32::MAX as i64),
        "list-compress-depth" => n(false, false, 0, i32::MAX as i64),
        _ => None,
    }
}

/// Redis's `string2ll`: an optional `-`, then digits without a leading zero (`0` alone is
/// fine), in range; nothing else (no blanks, no `+`).
fn string2ll(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b == b"0" {
        return Some(0);
    }
    let (neg, d) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    if !matches!(d.first(), Some(b'1'..=b'9')) || !d.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: u64 = 0;
    for &c in d {
        v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    if neg {
        (v <= 1 << 63).then(|| (v as i64).wrapping_neg())
    } else {
        i64::try_from(v).ok()
    }
}

/// Redis's `memtoull`: digits (none reads as 0; too many for `u64` saturate, as `strtoull`
/// does) then nothing or a unit (`b`, `k`, `kb`, `m`, `mb`, `g`, `gb`, any case); the
/// multiplication wraps as in C. `None` on anything else (a sign, blanks, a fraction).
fn memtoull(s: &str) -> Option<u64> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let mul: u64 = match s[digits..].to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1 << 10,
        "m" => 1_000_000,
        "mb" => 1 << 20,
        "g" => 1_000_000_000,
        "gb" => 1 << 30,
        _ => return None,
    };
    if digits >= 128 {
        return None;
    }
    let v = if digits == 0 {
        0
    } else {
        s[..digits].parse::<u64>().unwrap_or(u64::MAX)
    };
    Some(v.wrapping_mul(mul))
}

/// `value` read and bounded as Redis 7.0 reads the numeric setting `n`; the error is Redis's
/// text ("argument couldn't be parsed into an integer", ...).
fn parse_numeric(n: Numeric, value: &str) -> Result<i64, String> {
    let v = if n.memory {
        memtoull(value).ok_or("argument must be a memory value")? as i64
    } else {
        string2ll(value).ok_or("argument couldn't be parsed into an integer")?
    };
    let inside = if n.unsigned {
        (n.min as u64..=n.max as u64).contains(&(v as u64))
    } else {
        (n.min..=n.max).contains(&v)
    };
    if !inside {
        return Err(if n.unsigned {
            format!(
                "argument must be between {} and {} inclusive",
                n.min as u64, n.max as u64
            )
        } else {
            format!("argument must be between {} and {} inclusive", n.min, n.max)
        });
    }
    Ok(v)
}

/// A Redis `yes`/`no` (any case).
fn parse_bool(value: &str) -> Option<bool> {
    if value.eq_ignore_ascii_case("yes") {
        Some(true)
    } else if value.eq_ignore_ascii_case("no") {
        Some(false)
    } else {
        None
    }
}

/// The encoding thresholds' keys ([`Thresholds`]' fields in order; aliases in [`ALIASES`]).
const THRESHOLD_KEYS: &[&str] = &[
    "hash-max-listpack-entries",
    "hash-max-listpack-value",
    "zset-max-listpack-entries",
    "zset-max-listpack-value",
    "set-max-intset-entries",
    "list-max-listpack-size",
    "list-compress-depth",
];

/// The line that starts what `CONFIG REWRITE` appends, as Redis writes it.
pub const REWRITE_SIGNATURE: &str = "# Generated by CONFIG REWRITE";

impl KvConfig {
    /// Every key [`KvConfig::set`] and [`KvConfig::get`] know (the read-only ones last), e.g. for
    /// a command line's help or flag parser.
    pub fn keys() -> &'static [&'static str] {
        KEYS
    }

    /// The defaults, then every line of the file at `path` ([`KvConfig::load_file`]), then
    /// [`ServerConfig::validate`].
    pub fn from_file(path: &Path) -> Result<KvConfig, ConfigError> {
        let mut c = KvConfig::default();
        c.load_file(path)?;
        c.server.validate()?;
        Ok(c)
    }

    /// Applies a `redis.conf`-style file: one `key value...` per line, split like Redis
    /// (blanks; `"..."` and `'...'` quoting, so `save ""` works), `#` comment lines and blank
    /// lines ignored, keys case-insensitive; a value of several words is passed to
    /// [`KvConfig::set`] joined by single spaces. Errors carry `file:line`. Remembers the file
    /// as [`KvConfig::config_file`] (for `CONFIG REWRITE`).
    pub fn load_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            location: Some(path.display().to_string()),
            message: format!("cannot read the configuration file: {e}"),
        })?;
        self.load_str(&text, &path.display().to_string())?;
        self.config_file = Some(path.to_path_buf());
        Ok(())
    }

    /// [`KvConfig::load_file`] on text already in memory; `origin` names it in errors
    /// (`origin:line`).
    pub fn load_str(&mut self, text: &str, origin: &str) -> Result<(), ConfigError> {
        for (i, raw) in text.lines().enumerate() {
            let at = |message: String| ConfigError {
                location: Some(format!("{origin}:{}", i + 1)),
                message,
            };
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let words = resp::split_args(line.as_bytes())
                .map_err(|_| at("unbalanced quotes".to_string()))?;
            let words: Vec<String> = words
                .into_iter()
                .map(|w| String::from_utf8_lossy(&w).into_owned())
                .collect();
            let Some((key, rest)) = words.split_first() else {
                continue;
            };
            self.set(key, &rest.join(" ")).map_err(|e| at(e.message))?;
        }
        Ok(())
    }

    /// Sets one key (case-insensitive) from its text form, as written in a file or a flag.
    /// Unknown keys and bad values are errors that name the key and what it accepts. Checks that
    /// span keys are in [`ServerConfig::validate`].
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let key = key.to_ascii_lowercase();
        let bad = |what: &str| {
            ConfigError::new(format!(
                "bad value for '{key}': '{value}' (expected {what})"
            ))
        };
        // Redis's reason, for the keys checked as Redis checks them.
        let because =
            |why: String| ConfigError::new(format!("bad value for '{key}': '{value}' ({why})"));
        let s = &mut self.server;
        match key.as_str() {
            "bind" => s.bind = value.split_ascii_whitespace().map(str::to_string).collect(),
            "port" => s.port = value.parse().map_err(|_| bad("a port number, 0-65535"))?,
            "unixsocket" => {
                s.unix_socket = (!value.is_empty()).then(|| PathBuf::from(value));
            }
            "unixsocketperm" => {
                let perm = u32::from_str_radix(value, 8)
                    .ok()
                    .filter(|&p| p <= 0o777)
                    .ok_or_else(|| bad("octal permission bits, e.g. 700"))?;
                s.unix_socket_perm = (perm != 0).then_some(perm);
            }
            "threads" => {
                s.threads = value
                    .parse()
                    .ok()
                    .filter(|&n: &usize| (1..=1024).contains(&n))
                    .ok_or_else(|| bad("a thread count, 1-1024"))?
            }
            "maxclients" => {
                s.max_clients = value
                    .parse()
                    .ok()
                    .filter(|&n: &usize| n >= 1)
                    .ok_or_else(|| bad("a positive number"))?
            }
            "proto-max-bulk-len" => {
                s.proto_max_bulk_len = parse_size(value)
                    .filter(|&n| n >= 1 && n <= i64::MAX as u64 / 2)
                    .ok_or_else(|| bad("a positive size, e.g. 64mb"))?
            }
            "max-multibulk-len" => {
                s.max_multibulk_len = value
                    .parse()
                    .ok()
                    .filter(|&n: &u64| (1..=i32::MAX as u64).contains(&n))
                    .ok_or_else(|| bad("a positive argument count"))?
            }
            "max-inline-len" => {
                s.max_inline_len = parse_size(value)
                    .filter(|n| (16..=1 << 30).contains(n))
                    .map(|n| n as usize)
                    .ok_or_else(|| bad("a size between 16 and 1gb"))?
            }
            "client-query-buffer-limit" => {
                s.client_query_buffer_limit = parse_size(value)
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| bad("a positive size, e.g. 256mb"))?
            }
            "total-query-buffer-budget" => {
                s.total_query_buffer_budget =
                    parse_size(value).ok_or_else(|| bad("a size, e.g. 1gb (0 = no limit)"))?
            }
            "unfinished-frame-timeout" => {
                s.unfinished_frame_timeout = parse_duration(value)
                    .ok_or_else(|| bad("seconds, or milliseconds with 'ms' (0 = never)"))?
            }
            "client-output-buffer-limit" => {
                if let Some(limit) = parse_output_limit(value).map_err(because)? {
                    s.client_output_buffer_limit = limit;
                }
            }
            "timeout" => {
                s.idle_timeout = parse_numeric(numeric("timeout").expect("numeric"), value)
                    .map_err(because)? as u64
            }
            k if THRESHOLD_KEYS.contains(&canonical(k)) => {
                let k = canonical(k);
                let n = numeric(k).expect("every threshold is numeric");
                let v = parse_numeric(n, value).map_err(because)?;
                let t = &mut self.thresholds;
                match k {
                    "hash-max-listpack-entries" => t.hash_max_listpack_entries = v as u64,
                    "hash-max-listpack-value" => t.hash_max_listpack_value = v as u64,
                    "zset-max-listpack-entries" => t.zset_max_listpack_entries = v as u64,
                    "zset-max-listpack-value" => t.zset_max_listpack_value = v as u64,
                    "set-max-intset-entries" => t.set_max_intset_entries = v as u64,
                    "list-max-listpack-size" => t.list_max_listpack_size = v,
                    _ => t.list_compress_depth = v as u64,
                }
            }
            "engine" => match value {
                "vnvm" | "volatile" => self.engine = value.to_string(),
                _ => return Err(bad("'vnvm' or 'volatile'")),
            },
            "dir" => self.dir = (!value.is_empty()).then(|| PathBuf::from(value)),
            "requirepass" => self.requirepass = value.to_string(),
            "protected-mode" => {
                self.protected_mode = match value.to_ascii_lowercase().as_str() {
                    "yes" => true,
                    "no" => false,
                    _ => return Err(bad("'yes' or 'no'")),
                }
            }
            "new" => {
                self.new = match value.to_ascii_lowercase().as_str() {
                    "yes" => true,
                    "no" => false,
                    _ => return Err(bad("'yes' or 'no'")),
                }
            }
            "durability" => match value {
                "commit" | "pipeline" => self.durability = value.to_string(),
                // The former name of `pipeline`.
                "async" => self.durability = "pipeline".to_string(),
                _ => return Err(bad("'pipeline' or 'commit'")),
            },
            "heap-size" => {
                self.heap_size = parse_size(value)
                    .filter(|&n| n > 0)
                    .ok_or_else(|| bad("a positive size, e.g. 1gb"))?
            }
            "log-size" => {
                self.log_size = parse_optional_size(value)
                    .ok_or_else(|| bad("a size, or empty for the engine's default"))?
            }
            "restore-from" => {
                self.restore_from = (!value.is_empty()).then(|| PathBuf::from(value));
            }
            "migration-id" => {
                self.migration_id = if value.is_empty() {
                    None
                } else {
                    Some(
                        u64::from_str_radix(value.trim_start_matches("0x"), 16)
                            .map_err(|_| bad("a hexadecimal migration id"))?,
                    )
                };
            }
            "migration-source" => {
                self.migration_source = if value.is_empty() {
                    None
                } else {
                    Some(value.parse().map_err(|_| bad("an ip:port address"))?)
                };
            }
            "migration-method" => {
                let v = value.to_ascii_lowercase();
                if v != "fam" && v != "socket" {
                    return Err(bad("fam or socket"));
                }
                self.migration_method = v;
            }
            "cache-size" => {
                self.cache_size = parse_optional_size(value)
                    .ok_or_else(|| bad("a size, or empty for the engine's default"))?
            }
            "dbfilename"
            | "snapshot-method"
            | "snapshot-target"
            | "snapshot-staging-slots"
            | "save" => {
                crate::persistence::check_setting(&key, value).map_err(ConfigError::new)?;
                match key.as_str() {
                    "dbfilename" => self.dbfilename = value.to_string(),
                    "snapshot-method" => self.snapshot_method = value.to_string(),
                    "snapshot-target" => self.snapshot_target = value.to_string(),
                    "snapshot-staging-slots" => {
                        self.snapshot_staging_slots = parse_size(value).unwrap_or(16) as usize
                    }
                    _ => self.save = value.to_string(),
                }
            }
            _ => {
                if let Some(&(_, fixed)) = FIXED.iter().find(|(k, _)| *k == key) {
                    if !value.eq_ignore_ascii_case(fixed) {
                        return Err(ConfigError::new(format!(
                            "'{key}' is read-only in tiermem-kv (always '{fixed}')"
                        )));
                    }
                } else {
                    return Err(ConfigError::new(format!("unknown key '{key}'")));
                }
            }
        }
        Ok(())
    }

    /// The value of one key in the form [`KvConfig::set`] accepts, `None` for unknown keys.
    pub fn value(&self, key: &str) -> Option<String> {
        let s = &self.server;
        let size = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        Some(match key.to_ascii_lowercase().as_str() {
            "bind" => s.bind.join(" "),
            "port" => s.port.to_string(),
            "unixsocket" => s
                .unix_socket
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string()),
            "unixsocketperm" => format!("{:o}", s.unix_socket_perm.unwrap_or(0)),
            "threads" => s.threads.to_string(),
            "maxclients" => s.max_clients.to_string(),
            "proto-max-bulk-len" => s.proto_max_bulk_len.to_string(),
            "max-multibulk-len" => s.max_multibulk_len.to_string(),
            "max-inline-len" => s.max_inline_len.to_string(),
            "client-query-buffer-limit" => s.client_query_buffer_limit.to_string(),
            "total-query-buffer-budget" => s.total_query_buffer_budget.to_string(),
            "unfinished-frame-timeout" => format_duration(s.unfinished_frame_timeout),
            "client-output-buffer-limit" => s.client_output_buffer_limit.to_string(),
            "engine" => self.engine.clone(),
            "dir" => self
                .dir
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string()),
            "new" => if self.new { "yes" } else { "no" }.to_string(),
            "durability" => self.durability.clone(),
            "heap-size" => self.heap_size.to_string(),
            "log-size" => size(self.log_size),
            "cache-size" => size(self.cache_size),
            "restore-from" => self
                .restore_from
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string()),
            "migration-id" => self
                .migration_id
                .map_or(String::new(), |i| format!("{i:x}")),
            "migration-source" => self
                .migration_source
                .map_or(String::new(), |a| a.to_string()),
            "migration-method" => self.migration_method.clone(),
            "dbfilename" => self.dbfilename.clone(),
            "snapshot-method" => self.snapshot_method.clone(),
            "snapshot-target" => self.snapshot_target.clone(),
            "snapshot-staging-slots" => self.snapshot_staging_slots.to_string(),
            "save" => self.save.clone(),
            "requirepass" => self.requirepass.clone(),
            "protected-mode" => (if self.protected_mode { "yes" } else { "no" }).to_string(),
            "timeout" => s.idle_timeout.to_string(),
            k if THRESHOLD_KEYS.contains(&canonical(k)) => {
                let t = &self.thresholds;
                match canonical(k) {
                    "hash-max-listpack-entries" => t.hash_max_listpack_entries.to_string(),
                    "hash-max-listpack-value" => t.hash_max_listpack_value.to_string(),
                    "zset-max-listpack-entries" => t.zset_max_listpack_entries.to_string(),
                    "zset-max-listpack-value" => t.zset_max_listpack_value.to_string(),
                    "set-max-intset-entries" => t.set_max_intset_entries.to_string(),
                    "list-max-listpack-size" => t.list_max_listpack_size.to_string(),
                    _ => t.list_compress_depth.to_string(),
                }
            }
            k => FIXED.iter().find(|(f, _)| *f == k)?.1.to_string(),
        })
    }

    /// `CONFIG SET key value [key value ...]` as Redis 7.0 checks it, on a copy of this
    /// configuration: the new configuration, or the error reply (`ERR ...`, Redis's text).
    /// Nothing is applied here (the caller applies the result: [`crate::runtime`]), so a
    /// refused command changes nothing — all or nothing, as Redis.
    ///
    /// In Redis's order: first every key (`Unknown option ...` for a key this server does
    /// not know; `can't set immutable config` for a key set only at start, or a snapshot key
    /// when `snapshots` is false; `duplicate parameter`), naming the key as the client wrote
    /// it, the first problem winning; then every value in order, Redis's syntax and bounds for
    /// the keys Redis has, then [`KvConfig::set`]'s, naming the key in lower case; then the
    /// checks that span keys ([`ServerConfig::validate`]).
    pub fn config_set(&self, pairs: &[(&str, &str)], snapshots: bool) -> Result<KvConfig, String> {
        let failed = |k: &str, why: &str| {
            format!("ERR CONFIG SET failed (possibly related to argument '{k}') - {why}")
        };
        let mut seen: Vec<String> = Vec::with_capacity(pairs.len());
        for (k, _) in pairs {
            let lk = k.to_ascii_lowercase();
            if !KEYS.contains(&lk.as_str()) {
                return Err(format!(
                    "ERR Unknown option or number of arguments for CONFIG SET - '{k}'"
                ));
            }
            let snapshot = SNAPSHOT_KEYS.contains(&lk.as_str());
            if !LIVE.contains(&lk.as_str()) && !snapshot {
                return Err(failed(k, "can't set immutable config"));
            }
            if snapshot && !snapshots {
                return Err(failed(
                    k,
                    "this engine takes no snapshots (only the volatile engine does)",
                ));
            }
            if seen.contains(&lk) {
                return Err(failed(k, "duplicate parameter"));
            }
            seen.push(lk);
        }
        let mut next = self.clone();
        for (k, v) in pairs {
            let k = k.to_ascii_lowercase();
            if let Some(n) = numeric(canonical(&k)) {
                parse_numeric(n, v).map_err(|e| failed(&k, &e))?;
            }
            match k.as_str() {
                "protected-mode" if parse_bool(v).is_none() => {
                    return Err(failed(&k, "argument must be 'yes' or 'no'"))
                }
                "save" if crate::persistence::check_setting("save", v).is_err() => {
                    return Err(failed(&k, "Invalid save parameters"))
                }
                "client-output-buffer-limit" => {
                    parse_output_limit(v).map_err(|e| failed(&k, &e))?;
                }
                _ => {}
            }
            next.set(&k, v).map_err(|e| failed(&k, &e.message))?;
        }
        if let Err(e) = next.server.validate() {
            let k = seen
                .iter()
                .find(|k| e.message.contains(k.as_str()))
                .or(seen.first())
                .map_or("", |k| k.as_str());
            return Err(failed(k, &e.message));
        }
        Ok(next)
    }

    /// `CONFIG REWRITE`'s new text for a configuration file holding `old`, so that it gives
    /// this configuration: comments, blank lines and every other line stay as they are; the
    /// line of a key whose value here differs from what the file gives it is rewritten in
    /// place (under the name the file used; a later line of the same key, which would
    /// override it, is dropped, as Redis does); a key the file does not set and whose value
    /// differs from the default is appended, after [`REWRITE_SIGNATURE`] (once). Read-only
    /// keys, aliases and one-shot start actions (`new`, `restore-from`, the `migration-*`
    /// keys) are never written.
    pub fn rewrite(&self, old: &str) -> String {
        let defaults = KvConfig::default();
        let mut file = KvConfig::default();
        let mut lines: Vec<Option<String>> = old.lines().map(|l| Some(l.to_string())).collect();
        // Canonical key -> (name as written, the lines setting it).
        let mut at: Vec<(&'static str, String, Vec<usize>)> = Vec::new();
        for (i, raw) in old.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Ok(words) = resp::split_args(line.as_bytes()) else {
                continue;
            };
            let words: Vec<String> = words
                .into_iter()
                .map(|w| String::from_utf8_lossy(&w).into_owned())
                .collect();
            let Some((name, rest)) = words.split_first() else {
                continue;
            };
            let lower = name.to_ascii_lowercase();
            let Some(&key) = KEYS.iter().find(|k| **k == canonical(&lower)) else {
                continue;
            };
            // A line that no longer parses leaves the default: then it differs, and is fixed.
            let _ = file.set(&lower, &rest.join(" "));
            match at.iter_mut().find(|(k, _, _)| *k == key) {
                Some((_, _, v)) => v.push(i),
                None => at.push((key, name.clone(), vec![i])),
            }
        }
        let mut appended = Vec::new();
        for &key in KEYS {
            if canonical(key) != key
                || REWRITE_SKIP.contains(&key)
                || FIXED.iter().any(|(k, _)| *k == key)
            {
                continue;
            }
            let now = self.value(key).unwrap_or_default();
            match at.iter().find(|(k, _, _)| *k == key) {
                Some((_, name, idx)) if file.value(key).unwrap_or_default() != now => {
                    lines[idx[0]] = Some(config_line(name, &now));
                    for &j in &idx[1..] {
                        lines[j] = None;
                    }
                }
                Some(_) => {}
                None if defaults.value(key).unwrap_or_default() != now => {
                    appended.push(config_line(key, &now));
                }
                None => {}
            }
        }
        if !appended.is_empty() && !old.lines().any(|l| l.trim() == REWRITE_SIGNATURE) {
            lines.push(Some(REWRITE_SIGNATURE.to_string()));
        }
        let mut out = String::with_capacity(old.len() + 64 * appended.len());
        for l in lines.into_iter().flatten().chain(appended) {
            out.push_str(&l);
            out.push('\n');
        }
        out
    }

    /// `CONFIG GET pattern`: every (key, value) whose key matches the Redis glob `pattern`
    /// (`*`, `?`, `[abc]`, `[^a-z]`, `\` escapes; case-insensitive), in a fixed key order.
    pub fn get(&self, pattern: &str) -> Vec<(String, String)> {
        KEYS.iter()
            .filter(|k| glob_match(pattern.as_bytes(), k.as_bytes(), true))
            .filter_map(|k| Some((k.to_string(), self.value(k)?)))
            .collect()
    }
}

/// A size as Redis's `memtoll` reads it: digits, then nothing/`b` (bytes), `k`/`m`/`g` (×1000^n)
/// or `kb`/`mb`/`gb` (×1024^n), case-insensitive. `None` on anything else or overflow.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim().to_ascii_lowercase();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits_end == 0 {
        return None;
    }
    let n: u64 = s[..digits_end].parse().ok()?;
    let mul: u64 = match &s[digits_end..] {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1 << 10,
        "m" => 1_000_000,
        "mb" => 1 << 20,
        "g" => 1_000_000_000,
        "gb" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mul)
}

/// An optional size: empty = `None`.
fn parse_optional_size(s: &str) -> Option<Option<u64>> {
    if s.trim().is_empty() {
        Some(None)
    } else {
        parse_size(s).map(Some)
    }
}

/// Seconds (`30`, `30s`) or milliseconds (`500ms`).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim().to_ascii_lowercase();
    if let Some(ms) = s.strip_suffix("ms") {
        return ms.parse().ok().map(Duration::from_millis);
    }
    s.strip_suffix('s')
        .unwrap_or(&s)
        .parse()
        .ok()
        .map(Duration::from_secs)
}

/// The inverse of [`parse_duration`]: whole seconds as a number, else milliseconds with `ms`.
fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        d.as_secs().to_string()
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// `client-output-buffer-limit`: a size (tiermem's form), or Redis's `<class> <hard> <soft>
/// <seconds>` groups (Redis's syntax and error texts): `normal`'s hard limit is the limit (its
/// soft limit must be 0: there are none here); `replica`, `slave` and `pubsub` groups are
/// checked and ignored. `Ok(None)`: no `normal` group (nothing changes, as Redis's empty
/// value).
fn parse_output_limit(s: &str) -> Result<Option<u64>, String> {
    let words: Vec<&str> = s.split_ascii_whitespace().collect();
    if let [size] = words.as_slice() {
        return parse_size(size).map(Some).ok_or_else(|| {
            "a size, 0 = no limit, or Redis's '<class> <hard> <soft> <seconds>'".to_string()
        });
    }
    if words.len() % 4 != 0 {
        return Err("Wrong number of arguments in buffer limit configuration.".into());
    }
    let mut normal = None;
    for g in words.chunks(4) {
        let class = g[0].to_ascii_lowercase();
        if !["normal", "replica", "slave", "pubsub"].contains(&class.as_str()) {
            return Err("Invalid client class specified in buffer limit configuration.".into());
        }
        let (hard, soft) = (memtoull(g[1]), memtoull(g[2]));
        let secs = g[3].parse::<i64>().ok().filter(|&n| n >= 0);
        let (Some(hard), Some(soft), Some(secs)) = (hard, soft, secs) else {
            return Err(
                "Error in hard, soft or soft_seconds setting in buffer limit configuration.".into(),
            );
        };
        if class == "normal" {
            if soft != 0 || secs != 0 {
                return Err(
                    "tiermem-kv has no soft output buffer limit: use 'normal <hard> 0 0'".into(),
                );
            }
            normal = Some(hard);
        }
    }
    Ok(normal)
}

/// `key value` as a configuration line that [`KvConfig::load_str`] reads back as `value`:
/// bare when the value is words of plain characters one blank apart, else in double quotes
/// with Redis's escapes (`sdscatrepr`: `\\`, `\"`, `\n`, `\r`, `\t`, `\a`, `\b`, `\xHH`).
fn config_line(key: &str, value: &str) -> String {
    let plain = |c: u8| c > b' ' && c != 0x7f && c != b'"' && c != b'\'' && c != b'\\';
    let bare = !value.is_empty()
        && value
            .split(' ')
            .all(|w| !w.is_empty() && w.bytes().all(plain));
    if bare {
        return format!("{key} {value}");
    }
    let mut q = String::with_capacity(value.len() + 2);
    q.push('"');
    for &c in value.as_bytes() {
        match c {
            b'\\' => q.push_str("\\\\"),
            b'"' => q.push_str("\\\""),
            b'\n' => q.push_str("\\n"),
            b'\r' => q.push_str("\\r"),
            b'\t' => q.push_str("\\t"),
            0x07 => q.push_str("\\a"),
            0x08 => q.push_str("\\b"),
            c if (b' '..0x7f).contains(&c) => q.push(c as char),
            c => {
                q.push_str(&format!("\\x{c:02x}"));
            }
        }
    }
    q.push('"');
    format!("{key} {q}")
}

/// `CONFIG REWRITE`: rewrites the configuration file at `path` so that it gives `current`
/// ([`KvConfig::rewrite`]; a missing file is written from nothing), atomically: the new text
/// goes to a temporary file beside it (the original's permission bits), which is synced and
/// renamed over it, then the directory is synced. A symbolic link is followed: its target is
/// rewritten.
pub fn rewrite_file(path: &Path, current: &KvConfig) -> io::Result<()> {
    let target = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path)?,
        _ => path.to_path_buf(),
    };
    let (old, perm) = match std::fs::read_to_string(&target) {
        Ok(text) => (text, Some(std::fs::metadata(&target)?.permissions())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => (String::new(), None),
        Err(e) => return Err(e),
    };
    let text = current.rewrite(&old);
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = target
        .file_name()
        .map_or_else(|| "config".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.rewrite-{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        if let Some(p) = perm {
            f.set_permissions(p)?;
        }
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &target)?;
        std::fs::File::open(&dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Redis's glob match (`stringmatchlen`): `*` any run, `?` any byte, `[...]` a set with ranges
/// and `^` negation (an unterminated set ends at the pattern's end), `\` escapes the next byte;
/// `nocase` compares ASCII case-insensitively. Linear backtracking over the last `*` (no
/// exponential blow-up on patterns like `*a*a*a*b`).
pub fn glob_match(pattern: &[u8], s: &[u8], nocase: bool) -> bool {
    let fold = |c: u8| if nocase { c.to_ascii_lowercase() } else { c };
    // Matches the one-byte token at pattern[pi] (not `*`) against c: (matched, next pi).
    let one = |pi: usize, c: u8| -> (bool, usize) {
        match pattern[pi] {
            b'?' => (true, pi + 1),
            b'\\' if pi + 1 < pattern.len() => (fold(pattern[pi + 1]) == fold(c), pi + 2),
            b'[' => {
                let mut i = pi + 1;
                let not = i < pattern.len() && pattern[i] == b'^';
                if not {
                    i += 1;
                }
                let mut hit = false;
                while i < pattern.len() && pattern[i] != b']' {
                    if pattern[i] == b'\\' && i + 1 < pattern.len() {
                        hit |= fold(pattern[i + 1]) == fold(c);
                        i += 2;
                    } else if i + 2 < pattern.len() && pattern[i + 1] == b'-' {
                        let (mut lo, mut hi) = (fold(pattern[i]), fold(pattern[i + 2]));
                        if lo > hi {
                            std::mem::swap(&mut lo, &mut hi);
                        }
                        hit |= (lo..=hi).contains(&fold(c));
                        i += 3;
                    } else {
                        hit |= fold(pattern[i]) == fold(c);
                        i += 1;
                    }
                }
                (hit != not, (i + 1).min(pattern.len()))
            }
            p => (fold(p) == fold(c), pi + 1),
        }
    };
    // Indexing: `one` is called with `pi < pattern.len()` and returns `next <= pattern.len()`;
    // `s[si]` with `si < s.len()`.
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None; // (pattern index after `*`, s index)
    while si < s.len() {
        if pi < pattern.len() && pattern[pi] == b'*' {
            while pi < pattern.len() && pattern[pi] == b'*' {
                pi += 1;
            }
            star = Some((pi, si));
            continue;
        }
        if pi < pattern.len() {
            let (ok, next) = one(pi, s[si]);
            if ok {
                pi = next;
                si += 1;
                continue;
            }
        }
        match star {
            Some((sp, ss)) => {
                pi = sp;
                si = ss + 1;
                star = Some((sp, ss + 1));
            }
            None => return false,
        }
    }
    pattern[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_like_redis() {
        for (s, v) in [
            ("0", Some(0)),
            ("123", Some(123)),
            ("1k", Some(1000)),
            ("1kb", Some(1024)),
            ("64mb", Some(64 << 20)),
            ("64MB", Some(64 << 20)),
            ("2g", Some(2_000_000_000)),
            ("1gb", Some(1 << 30)),
            ("10b", Some(10)),
            ("", None),
            ("mb", None),
            ("-1", None),
            ("1tb", None),
            ("1.5gb", None),
            ("99999999999999999999gb", None),
        ] {
            assert_eq!(parse_size(s), v, "{s:?}");
        }
    }

    #[test]
    fn globs_like_redis() {
        let m = |p: &str, s: &str| glob_match(p.as_bytes(), s.as_bytes(), true);
        assert!(m("*", "anything"));
        assert!(m("*", ""));
        assert!(m("port", "PORT"));
        assert!(m("*max*", "proto-max-bulk-len"));
        assert!(m("p?rt", "port"));
        assert!(!m("p?rt", "prt"));
        assert!(m("[pq]ort", "qort"));
        assert!(!m("[^pq]ort", "port"));
        assert!(m("[a-z]ort", "port"));
        assert!(m("[z-a]ort", "port"));
        assert!(m("a\\*b", "a*b"));
        assert!(!m("a\\*b", "axb"));
        assert!(m("*a*a*a*b", "aaaaaaaaaaaaaaaaaaaab"));
        assert!(!m("*a*a*a*a*a*a*b", &"a".repeat(64)));
        assert!(m("max*", "maxclients"));
        assert!(!m("max", "maxclients"));
        assert!(m("[abc", "b"));
        assert!(!glob_match(b"PORT", b"port", false));
    }

    #[test]
    fn set_get_every_key() {
        let mut c = KvConfig::default();
        for (k, v) in [
            ("bind", "127.0.0.1 -::1"),
            ("port", "0"),
            ("unixsocket", "/tmp/kv.sock"),
            ("unixsocketperm", "770"),
            ("threads", "3"),
            ("maxclients", "50"),
            ("proto-max-bulk-len", "1048576"),
            ("max-multibulk-len", "100"),
            ("max-inline-len", "4096"),
            ("client-query-buffer-limit", "2097152"),
            ("total-query-buffer-budget", "0"),
            ("unfinished-frame-timeout", "250ms"),
            ("client-output-buffer-limit", "1048576"),
            ("engine", "volatile"),
            ("dir", "/tmp/x"),
            ("durability", "commit"),
            ("heap-size", "1073741824"),
            ("log-size", "67108864"),
            ("cache-size", ""),
            ("save", ""),
            ("appendonly", "no"),
            ("maxmemory", "0"),
            ("requirepass", "secret"),
            ("protected-mode", "no"),
            ("databases", "16"),
            ("timeout", "0"),
        ] {
            c.set(k, v).unwrap();
            assert_eq!(c.value(k).as_deref(), Some(v), "{k}");
        }
        assert_eq!(c.server.unix_socket_perm, Some(0o770));
        assert_eq!(
            c.server.unfinished_frame_timeout,
            Duration::from_millis(250)
        );
        c.set("MAXCLIENTS", "7").unwrap();
        assert_eq!(c.server.max_clients, 7);
        c.set("client-output-buffer-limit", "normal 1mb 0 0")
            .unwrap();
        assert_eq!(c.server.client_output_buffer_limit, 1 << 20);
        assert_eq!(c.get("*").len(), KEYS.len());
    }

    #[test]
    fn bad_values_and_keys() {
        let mut c = KvConfig::default();
        let e = c.set("port", "70000").unwrap_err();
        assert!(
            e.message.contains("'port'") && e.message.contains("70000"),
            "{e}"
        );
        assert!(c
            .set("nosuchkey", "1")
            .unwrap_err()
            .message
            .contains("unknown key"));
        assert!(c.set("engine", "rocks").is_err());
        assert!(c.set("threads", "0").is_err());
        c.set("save", "900 1 60 1000").unwrap();
        assert_eq!(c.value("save").unwrap(), "900 1 60 1000");
        assert!(c.set("save", "900").is_err());
        assert!(c.set("snapshot-method", "cow").is_err());
        assert!(c
            .set("appendonly", "yes")
            .unwrap_err()
            .message
            .contains("read-only"));
        assert!(c.set("unixsocketperm", "999").is_err());
        assert!(c
            .set("client-output-buffer-limit", "normal 1mb 1mb 60")
            .is_err());
        c.set("bind", "localhost").unwrap();
        assert!(c.server.validate().is_err());
        let mut c = KvConfig::default();
        c.set("proto-max-bulk-len", "512mb").unwrap();
        assert!(c
            .server
            .validate()
            .unwrap_err()
            .message
            .contains("client-query-buffer-limit"));
    }

    #[test]
    fn config_get_probes() {
        let c = KvConfig::default();
        assert_eq!(c.get("save"), vec![("save".to_string(), String::new())]);
        assert_eq!(
            c.get("APPENDONLY"),
            vec![("appendonly".to_string(), "no".to_string())]
        );
        assert_eq!(
            c.get("port"),
            vec![("port".to_string(), "6379".to_string())]
        );
        assert_eq!(c.get("bind")[0].1, "127.0.0.1");
        let names: Vec<String> = c.get("max*").into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            names,
            [
                "maxclients",
                "max-multibulk-len",
                "max-inline-len",
                "maxmemory"
            ]
        );
        assert!(c.get("nothing-like-this").is_empty());
    }

    #[test]
    fn file_with_comments_quotes_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv.conf");
        std::fs::write(
            &path,
            "# tiermem-kv\n\nport 7000\nbind 127.0.0.1 ::1\nsave \"\"\n  maxclients 100  \n\
             dir \"/tmp/with space\"\nproto-max-bulk-len 1mb\nunfinished-frame-timeout 5\n",
        )
        .unwrap();
        let c = KvConfig::from_file(&path).unwrap();
        assert_eq!(c.server.port, 7000);
        assert_eq!(c.server.bind, ["127.0.0.1", "::1"]);
        assert_eq!(c.server.max_clients, 100);
        assert_eq!(c.dir.as_deref(), Some(Path::new("/tmp/with space")));
        assert_eq!(c.server.proto_max_bulk_len, 1 << 20);
        assert_eq!(c.server.unfinished_frame_timeout, Duration::from_secs(5));

        std::fs::write(&path, "port 7000\n\nmaxclients lots\n").unwrap();
        let e = KvConfig::from_file(&path).unwrap_err();
        assert_eq!(e.location, Some(format!("{}:3", path.display())));
        assert!(
            e.to_string()
                .contains("kv.conf:3: bad value for 'maxclients': 'lots'"),
            "{e}"
        );
        std::fs::write(&path, "appendfsync always\n").unwrap();
        let e = KvConfig::from_file(&path).unwrap_err();
        assert!(
            e.to_string().ends_with(":1: unknown key 'appendfsync'"),
            "{e}"
        );
        std::fs::write(&path, "dir \"/tmp\n").unwrap();
        assert!(KvConfig::from_file(&path)
            .unwrap_err()
            .message
            .contains("quotes"));
        assert!(KvConfig::from_file(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn numbers_read_as_redis_7_0_reads_them() {
        assert_eq!(string2ll("0"), Some(0));
        assert_eq!(string2ll("-5"), Some(-5));
        assert_eq!(string2ll("9223372036854775807"), Some(i64::MAX));
        assert_eq!(string2ll("-9223372036854775808"), Some(i64::MIN));
        for bad in [
            "",
            "-",
            "01",
            "-0",
            "+5",
            " 5",
            "5 ",
            "1k",
            "0x10",
            "9223372036854775808",
        ] {
            assert_eq!(string2ll(bad), None, "{bad:?}");
        }
        assert_eq!(memtoull(""), Some(0));
        assert_eq!(memtoull("1k"), Some(1000));
        assert_eq!(memtoull("1Kb"), Some(1024));
        assert_eq!(memtoull("2gB"), Some(2 << 30));
        assert_eq!(memtoull("99999999999999999999"), Some(u64::MAX));
        for bad in ["-1", " 5", "+5", "1.5", "0x10", "5 ", "1tb"] {
            assert_eq!(memtoull(bad), None, "{bad:?}");
        }
        let n = |k: &str, v: &str| parse_numeric(numeric(k).unwrap(), v);
        assert_eq!(n("maxclients", "10"), Ok(10));
        assert_eq!(
            n("maxclients", "-1").unwrap_err(),
            "argument must be between 1 and 4294967295 inclusive"
        );
        assert_eq!(
            n("maxclients", "1k").unwrap_err(),
            "argument couldn't be parsed into an integer"
        );
        assert_eq!(
            n("proto-max-bulk-len", "-1").unwrap_err(),
            "argument must be a memory value"
        );
        assert_eq!(
            n("proto-max-bulk-len", "99999999999999999999").unwrap_err(),
            "argument must be between 1048576 and 9223372036854775807 inclusive"
        );
        assert_eq!(n("hash-max-listpack-value", "1k"), Ok(1000));
        assert_eq!(n("hash-max-listpack-value", ""), Ok(0));
        assert_eq!(
            n("hash-max-listpack-value", "18446744073709551615").unwrap_err(),
            "argument must be between 0 and 9223372036854775807 inclusive"
        );
        assert_eq!(n("list-max-listpack-size", "-2147483648"), Ok(-2147483648));
        assert_eq!(
            n("list-max-listpack-size", "2147483648").unwrap_err(),
            "argument must be between -2147483648 and 2147483647 inclusive"
        );
        assert_eq!(
            n("timeout", "-1").unwrap_err(),
            "argument must be between 0 and 2147483647 inclusive"
        );
        assert_eq!(
            n("set-max-intset-entries", "-1").unwrap_err(),
            "argument must be between 0 and 9223372036854775807 inclusive"
        );
    }

    #[test]
    fn config_set_replies_as_redis_7_0() {
        let c = KvConfig::default();
        let set = |pairs: &[(&str, &str)]| c.config_set(pairs, false);
        let failed = |k: &str, why: &str| {
            Err(format!(
                "ERR CONFIG SET failed (possibly related to argument '{k}') - {why}"
            ))
        };
        assert_eq!(
            set(&[("NoSuch", "1")]),
            Err("ERR Unknown option or number of arguments for CONFIG SET - 'NoSuch'".into())
        );
        assert_eq!(
            set(&[("PORT", "1")]),
            failed("PORT", "can't set immutable config")
        );
        assert_eq!(
            set(&[("databases", "16")]),
            failed("databases", "can't set immutable config")
        );
        // Keys first (the first problem wins), then values in order.
        assert_eq!(
            set(&[("maxclients", "x"), ("dir", "/")]),
            failed("dir", "can't set immutable config")
        );
        assert_eq!(
            set(&[("nosuch", "1"), ("port", "1")]),
            Err("ERR Unknown option or number of arguments for CONFIG SET - 'nosuch'".into())
        );
        assert_eq!(
            set(&[("maxclients", "5"), ("MAXCLIENTS", "6")]),
            failed("MAXCLIENTS", "duplicate parameter")
        );
        assert_eq!(
            set(&[("MAXCLIENTS", "x")]),
            failed("maxclients", "argument couldn't be parsed into an integer")
        );
        assert_eq!(
            set(&[("timeout", "5"), ("hash-max-ziplist-entries", "x")]),
            failed(
                "hash-max-ziplist-entries",
                "argument couldn't be parsed into an integer"
            )
        );
        assert_eq!(
            set(&[("protected-mode", "maybe")]),
            failed("protected-mode", "argument must be 'yes' or 'no'")
        );
        assert_eq!(
            set(&[("client-output-buffer-limit", "normal 1mb 0")]),
            failed(
                "client-output-buffer-limit",
                "Wrong number of arguments in buffer limit configuration."
            )
        );
        assert_eq!(
            set(&[("client-output-buffer-limit", "foo 1mb 0 0")]),
            failed(
                "client-output-buffer-limit",
                "Invalid client class specified in buffer limit configuration."
            )
        );
        assert_eq!(
            set(&[("client-output-buffer-limit", "normal x 0 0")]),
            failed(
                "client-output-buffer-limit",
                "Error in hard, soft or soft_seconds setting in buffer limit configuration."
            )
        );
        assert!(set(&[("save", "")])
            .unwrap_err()
            .contains("takes no snapshots"));
        assert_eq!(
            c.config_set(&[("save", "900")], true),
            failed("save", "Invalid save parameters")
        );
        // Checks that span keys name the key they concern.
        assert_eq!(
            set(&[("timeout", "1"), ("proto-max-bulk-len", "512mb")]),
            failed(
                "proto-max-bulk-len",
                "client-query-buffer-limit (268435456) must be at least proto-max-bulk-len \
                 (536870912)"
            )
        );
        // Read-only keys take their fixed value only.
        assert!(set(&[("appendonly", "no")]).is_ok());
        assert!(set(&[("appendonly", "yes")])
            .unwrap_err()
            .contains("read-only"));

        // Accepted: a new configuration; the old one is untouched (all or nothing).
        let next = set(&[
            ("maxclients", "20"),
            ("TIMEOUT", "3"),
            ("hash-max-ziplist-entries", "100"),
            ("zset-max-listpack-value", "1k"),
            ("list-max-ziplist-size", "-3"),
            ("proto-max-bulk-len", "1mb"),
            ("client-query-buffer-limit", "1mb"),
            (
                "client-output-buffer-limit",
                "normal 2mb 0 0 pubsub 32mb 8mb 60",
            ),
            ("unfinished-frame-timeout", "500ms"),
            ("requirepass", "pw"),
            ("protected-mode", "NO"),
        ])
        .unwrap();
        assert_eq!(next.server.max_clients, 20);
        assert_eq!(next.server.idle_timeout, 3);
        assert_eq!(next.thresholds.hash_max_listpack_entries, 100);
        assert_eq!(next.thresholds.zset_max_listpack_value, 1000);
        assert_eq!(next.thresholds.list_max_listpack_size, -3);
        assert_eq!(next.server.client_query_buffer_limit, 1 << 20);
        assert_eq!(next.server.client_output_buffer_limit, 2 << 20);
        assert_eq!(next.value("hash-max-listpack-entries").unwrap(), "100");
        assert_eq!(next.value("list-max-listpack-size").unwrap(), "-3");
        assert_eq!(
            (next.requirepass.as_str(), next.protected_mode),
            ("pw", false)
        );
        assert_eq!(c, KvConfig::default());
        // Only `normal` sets the limit; an empty value changes nothing (Redis too).
        let n = next
            .config_set(&[("client-output-buffer-limit", "pubsub 1mb 0 0")], false)
            .unwrap();
        assert_eq!(n.server.client_output_buffer_limit, 2 << 20);
        let n = n
            .config_set(&[("client-output-buffer-limit", "")], false)
            .unwrap();
        assert_eq!(n.server.client_output_buffer_limit, 2 << 20);
        assert!(set(&[("client-output-buffer-limit", "normal 1mb 1mb 10")])
            .unwrap_err()
            .contains("no soft output buffer limit"));
        // Snapshot keys are live on a server that takes snapshots.
        let n = c
            .config_set(&[("save", "900 1"), ("dbfilename", "x.snap")], true)
            .unwrap();
        assert_eq!(
            (n.save.as_str(), n.dbfilename.as_str()),
            ("900 1", "x.snap")
        );
    }

    #[test]
    fn thresholds_in_files_and_config_get() {
        let mut c = KvConfig::default();
        assert_eq!(c.thresholds, Thresholds::default());
        c.load_str(
            "hash-max-ziplist-entries 100\nzset-max-listpack-value 1kb\nlist-compress-depth 2\n\
             set-max-intset-entries 4\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.thresholds.hash_max_listpack_entries, 100);
        assert_eq!(c.thresholds.zset_max_listpack_value, 1024);
        assert_eq!(c.thresholds.list_compress_depth, 2);
        assert_eq!(c.thresholds.set_max_intset_entries, 4);
        assert_eq!(
            c.get("hash-max-*-entries"),
            [
                ("hash-max-listpack-entries".to_string(), "100".to_string()),
                ("hash-max-ziplist-entries".to_string(), "100".to_string())
            ]
        );
        assert_eq!(
            c.get("*intset*"),
            [("set-max-intset-entries".into(), "4".into())]
        );
        let e = c.load_str("list-compress-depth -1\n", "t").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t:1: bad value for 'list-compress-depth': '-1' (argument must be between 0 and \
             2147483647 inclusive)"
        );
        c.set("timeout", "300").unwrap();
        assert_eq!(c.server.idle_timeout, 300);
        assert!(c.set("timeout", "-1").is_err());
    }

    #[test]
    fn rewrite_keeps_the_file_and_changes_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv.conf");
        let text = "# tiermem-kv\n\n# clients\nmaxclients 100\nport 7000\n\
                    hash-max-ziplist-entries 64\n  timeout 5  \nsave \"\"\nunixsocketperm 700\n\
                    # twice: the last one wins\nmaxclients 200\nproto-max-bulk-len 1mb\n";
        std::fs::write(&path, text).unwrap();
        let mut c = KvConfig::from_file(&path).unwrap();
        assert_eq!(c.config_file.as_deref(), Some(path.as_path()));
        assert_eq!(c.server.max_clients, 200);
        c = c
            .config_set(
                &[
                    ("maxclients", "300"),
                    ("hash-max-listpack-entries", "32"),
                    ("requirepass", "a \"b\"\\c"),
                    ("zset-max-listpack-entries", "7"),
                    ("unfinished-frame-timeout", "250ms"),
                ],
                false,
            )
            .unwrap();
        c.new = true; // a one-shot action: never written
        c.dir = Some(PathBuf::from("/tmp/with  two blanks"));
        rewrite_file(&path, &c).unwrap();
        let got = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            got,
            "# tiermem-kv\n\n# clients\nmaxclients 300\nport 7000\n\
             hash-max-ziplist-entries 32\n  timeout 5  \nsave \"\"\nunixsocketperm 700\n\
             # twice: the last one wins\nproto-max-bulk-len 1mb\n\
             # Generated by CONFIG REWRITE\n\
             unfinished-frame-timeout 250ms\n\
             dir \"/tmp/with  two blanks\"\n\
             requirepass \"a \\\"b\\\"\\\\c\"\n\
             zset-max-listpack-entries 7\n"
        );
        // Read back, it is the same configuration; rewritten again, the same file.
        let mut back = KvConfig::from_file(&path).unwrap();
        back.new = true;
        assert_eq!(back, c);
        rewrite_file(&path, &back).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), got);
        // No temporary file is left; a missing file is written from nothing.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let fresh = dir.path().join("new.conf");
        rewrite_file(&fresh, &c).unwrap();
        let t = std::fs::read_to_string(&fresh).unwrap();
        assert!(
            t.starts_with("# Generated by CONFIG REWRITE\nport 7000\n"),
            "{t}"
        );
        assert!(
            t.contains("\nmaxclients 300\n") && !t.contains("\nnew "),
            "{t}"
        );
        // Nothing differs: the file stays as it was.
        let plain = dir.path().join("plain.conf");
        std::fs::write(&plain, "# nothing\nmaxclients 10\n").unwrap();
        let p = KvConfig::from_file(&plain).unwrap();
        rewrite_file(&plain, &p).unwrap();
        assert_eq!(
            std::fs::read_to_string(&plain).unwrap(),
            "# nothing\nmaxclients 10\n"
        );
        // A directory it cannot write to: an error, the file untouched.
        assert!(rewrite_file(Path::new("/proc/tiermem-no/kv.conf"), &c).is_err());
    }
}
