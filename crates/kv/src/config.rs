//! Configuration: the server's network limits ([`ServerConfig`]) and the whole server's settings
//! ([`KvConfig`]), read from a `redis.conf`-style file and set by command-line flags through one
//! function, [`KvConfig::set`], so one place knows every key.
//!
//! # Keys
//!
//! Redis's name where Redis has the setting, a tiermem name otherwise. Sizes are written as Redis
//! accepts them: a number of bytes, or with `k`/`m`/`g` (powers of 1000) or `kb`/`mb`/`gb` (powers
//! of 1024), any case. "0 = no limit" where noted, as in Redis.
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `bind` | `127.0.0.1` | addresses to listen on, blank-separated; `*` = all IPv4, `::*` = all IPv6, a leading `-` = skip it if unavailable; empty = no TCP |
//! | `port` | `6379` | TCP port; **0 = an ephemeral port** chosen by the OS (Redis: 0 disables TCP; here use an empty `bind`) |
//! | `unixsocket` | none | path of a Unix socket to listen on too |
//! | `unixsocketperm` | umask | its permission bits, octal (e.g. `700`, `770`) |
//! | `threads` | the CPU count − 1 (at least 1) | event-loop threads |
//! | `maxclients` | `10000` | connections beyond it get `-ERR max number of clients reached` and are closed |
//! | `proto-max-bulk-len` | `64mb` | largest bulk argument; larger is rejected when its `$len` arrives |
//! | `max-multibulk-len` | `1048576` | most arguments in one request |
//! | `max-inline-len` | `64kb` | longest inline request line (and `*`/`$` header line) |
//! | `client-query-buffer-limit` | `256mb` | largest unfinished request one client may have buffered: a whole request must fit (unlike Redis, whose parsed arguments live outside the query buffer); beyond it the client is closed |
//! | `total-query-buffer-budget` | `1gb` | all clients' unfinished requests together; beyond it the client with the largest buffer is closed; 0 = no limit |
//! | `unfinished-frame-timeout` | `30` | seconds (or `500ms`) a client may sit on an unfinished request without sending a byte before it is closed; clients idle between requests are never closed; 0 = never |
//! | `client-output-buffer-limit` | `256mb` | replies pending for one client beyond which it is closed (also accepts Redis's `normal <hard> 0 0`); 0 = no limit |
//! | `engine` | `vnvm` | `vnvm` (durable) or `volatile` |
//! | `dir` | none | the engine's directory (the caller picks one when unset) |
//! | `new` | `no` | `yes`: create a new instance (vnvm), only in an empty or nonexistent `dir`; `no`: open the instance in `dir`, refusing a directory that holds none or only part of one |
//! | `durability` | `pipeline` | `pipeline` (one transaction per pipeline) or `commit` (one per write command); durable before the reply either way |
//! | `heap-size` | `1gb` | the heap's size |
//! | `log-size`, `cache-size` | engine default | vnvm's log and NVM-cache sizes; empty = engine default |
//! | `dbfilename` | `dump.tmsnap` | the `volatile` engine's snapshot file in `dir` (SAVE, BGSAVE, loaded at start) |
//! | `snapshot-method` | `wp` | how snapshots are taken: `wp` (fork-less, bounded extra memory), `fork-mdc` or `fork` |
//! | `snapshot-target` | `file` | where snapshots go: `file` (O_DIRECT) or `nvm-pool` (a media NVM pool file at `dir/dbfilename`) |
//! | `snapshot-staging-slots` | `16` | `wp`'s staging slots of 256 KiB (0–64) |
//! | `save` | `""` | save points, `seconds changes` pairs (Redis's syntax); empty = none |
//!
//! The snapshot keys and `save` also change at run time (`CONFIG SET`).
//!
//! Read-only, for clients that probe them with `CONFIG GET` (setting them to their fixed value is
//! accepted): `appendonly` (`no`), `maxmemory` (`0`), `databases` (`1`), `timeout` (`0`).

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
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
    "appendonly",
    "maxmemory",
    "requirepass",
    "protected-mode",
    "databases",
    "timeout",
];

/// The read-only keys and their fixed values.
const FIXED: &[(&str, &str)] = &[
    ("appendonly", "no"),
    ("maxmemory", "0"),
    ("databases", "16"),
    ("timeout", "0"),
];

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
    /// [`KvConfig::set`] joined by single spaces. Errors carry `file:line`.
    pub fn load_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            location: Some(path.display().to_string()),
            message: format!("cannot read the configuration file: {e}"),
        })?;
        self.load_str(&text, &path.display().to_string())
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
                s.client_output_buffer_limit = parse_output_limit(value).ok_or_else(|| {
                    bad("a size (0 = no limit), or 'normal <hard> 0 0' as in redis.conf")
                })?
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
            k => FIXED.iter().find(|(f, _)| *f == k)?.1.to_string(),
        })
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

/// A size, or Redis's `normal <hard> <soft> <seconds>` with soft and seconds 0.
fn parse_output_limit(s: &str) -> Option<u64> {
    let words: Vec<&str> = s.split_ascii_whitespace().collect();
    match words.as_slice() {
        [size] => parse_size(size),
        [class, hard, soft, secs] if class.eq_ignore_ascii_case("normal") => {
            (parse_size(soft)? == 0 && secs.parse::<u64>().ok()? == 0)
                .then(|| parse_size(hard))
                .flatten()
        }
        _ => None,
    }
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
}
