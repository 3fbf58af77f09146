//! A TPC-C-like workload on libsqlite3: the nine tables, a loader, the five transactions in the
//! standard mix (45 % NewOrder, 43 % Payment, 4 % each OrderStatus, Delivery, StockLevel) with
//! NURand key skew, and the consistency conditions — run through the `tiermem` VFS so that the
//! iocache pool, not SQLite's own page cache (kept at 256 KiB), is the database's buffer pool.
//!
//! Schema shape follows TPC-C (column sets trimmed, row sizes kept: a customer row ~650 bytes,
//! a stock row ~310). Tables with composite keys are rowid tables keyed by a packed integer
//! (`d_key = w·100 + d`, `c_key = d_key·100000 + c`, `s_key = w·1000000 + i`,
//! `o_key = d_key << 32 | o`, `ol_key = d_key << 36 | o << 4 | number`): a clustered primary
//! key with compact interior pages, as InnoDB's. Money is integer cents, so the consistency
//! conditions are exact. One warehouse at full scale (100 000 items, 3 000 customers per
//! district) is ~85 MB; `scale` shrinks items, customers and orders for quick tests.
//!
//! Not TPC-C proper: no terminals, keying or think times (a closed loop as fast as it goes),
//! no 60-day purge, simplified columns; "tpmC" here is committed NewOrders per minute of that
//! loop, comparable between modes of this driver only.

use crate::config;
use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};
use tiermem_iocache::Mode;

/// Districts per warehouse (fixed by TPC-C).
pub const DISTRICTS: u32 = 10;
/// Items at full scale.
pub const FULL_ITEMS: u32 = 100_000;
/// Customers per district at full scale.
pub const FULL_CUSTOMERS: u32 = 3_000;

const SCHEMA: &str = "
CREATE TABLE tpcc_meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE warehouse(
  w_id INTEGER PRIMARY KEY, w_name TEXT, w_street_1 TEXT, w_street_2 TEXT, w_city TEXT,
  w_state TEXT, w_zip TEXT, w_tax INTEGER, w_ytd INTEGER);
CREATE TABLE district(
  d_key INTEGER PRIMARY KEY, d_w_id INTEGER, d_id INTEGER, d_name TEXT, d_street_1 TEXT,
  d_street_2 TEXT, d_city TEXT, d_state TEXT, d_zip TEXT, d_tax INTEGER, d_ytd INTEGER,
  d_next_o_id INTEGER);
CREATE TABLE customer(
  c_key INTEGER PRIMARY KEY, c_w_id INTEGER, c_d_id INTEGER, c_id INTEGER, c_first TEXT,
  c_middle TEXT, c_last TEXT, c_street_1 TEXT, c_street_2 TEXT, c_city TEXT, c_state TEXT,
  c_zip TEXT, c_phone TEXT, c_since INTEGER, c_credit TEXT, c_credit_lim INTEGER,
  c_discount INTEGER, c_balance INTEGER, c_ytd_payment INTEGER, c_payment_cnt INTEGER,
  c_delivery_cnt INTEGER, c_data TEXT);
CREATE INDEX customer_last ON customer(c_w_id, c_d_id, c_last, c_first);
CREATE TABLE history(
  h_c_id INTEGER, h_c_d_id INTEGER, h_c_w_id INTEGER, h_d_id INTEGER, h_w_id INTEGER,
  h_date INTEGER, h_amount INTEGER, h_data TEXT);
CREATE TABLE new_order(no_key INTEGER PRIMARY KEY, no_w_id INTEGER, no_d_id INTEGER,
  no_o_id INTEGER);
CREATE TABLE orders(
  o_key INTEGER PRIMARY KEY, o_w_id INTEGER, o_d_id INTEGER, o_id INTEGER, o_c_id INTEGER,
  o_entry_d INTEGER, o_carrier_id INTEGER, o_ol_cnt INTEGER, o_all_local INTEGER);
CREATE INDEX orders_customer ON orders(o_w_id, o_d_id, o_c_id, o_id);
CREATE TABLE order_line(
  ol_key INTEGER PRIMARY KEY, ol_w_id INTEGER, ol_d_id INTEGER, ol_o_id INTEGER,
  ol_number INTEGER, ol_i_id INTEGER, ol_supply_w_id INTEGER, ol_delivery_d INTEGER,
  ol_quantity INTEGER, ol_amount INTEGER, ol_dist_info TEXT);
CREATE TABLE item(i_id INTEGER PRIMARY KEY, i_im_id INTEGER, i_name TEXT, i_price INTEGER,
  i_data TEXT);
CREATE TABLE stock(
  s_key INTEGER PRIMARY KEY, s_w_id INTEGER, s_i_id INTEGER, s_quantity INTEGER,
  s_dist_01 TEXT, s_dist_02 TEXT, s_dist_03 TEXT, s_dist_04 TEXT, s_dist_05 TEXT,
  s_dist_06 TEXT, s_dist_07 TEXT, s_dist_08 TEXT, s_dist_09 TEXT, s_dist_10 TEXT,
  s_ytd INTEGER, s_order_cnt INTEGER, s_remote_cnt INTEGER, s_data TEXT);
";

fn d_key(w: u32, d: u32) -> i64 {
    w as i64 * 100 + d as i64
}
fn c_key(w: u32, d: u32, c: u32) -> i64 {
    d_key(w, d) * 100_000 + c as i64
}
fn s_key(w: u32, i: u32) -> i64 {
    w as i64 * 1_000_000 + i as i64
}
fn o_key(w: u32, d: u32, o: u32) -> i64 {
    (d_key(w, d) << 32) | o as i64
}
fn ol_key(w: u32, d: u32, o: u32, n: u32) -> i64 {
    (d_key(w, d) << 36) | ((o as i64) << 4) | n as i64
}

const SYLLABLES: [&str; 10] = [
    "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
];

/// TPC-C's customer last name for `n` in 0..=999.
fn last_name(n: u32) -> String {
    let n = n % 1000;
    format!(
        "{}{}{}",
        SYLLABLES[(n / 100) as usize],
        SYLLABLES[(n / 10 % 10) as usize],
        SYLLABLES[(n % 10) as usize]
    )
}

const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

fn astring(rng: &mut StdRng, lo: usize, hi: usize) -> String {
    let n = rng.gen_range(lo..=hi);
    (0..n)
        .map(|_| ALNUM[rng.gen_range(0..ALNUM.len())] as char)
        .collect()
}

fn nstring(rng: &mut StdRng, n: usize) -> String {
    (0..n)
        .map(|_| char::from(b'0' + rng.gen_range(0..10u8)))
        .collect()
}

/// `i_data`/`s_data`: 26–50 characters, 10 % containing "ORIGINAL".
fn data_string(rng: &mut StdRng) -> String {
    let mut s = astring(rng, 26, 50);
    if rng.gen_range(0..10) == 0 {
        let at = rng.gen_range(0..=s.len() - 8);
        s.replace_range(at..at + 8, "ORIGINAL");
    }
    s
}

/// The sizes a database was loaded with (kept in its `tpcc_meta` table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Scale {
    /// Warehouses.
    pub warehouses: u32,
    /// Items (and stock rows per warehouse).
    pub items: u32,
    /// Customers per district (also initial orders per district).
    pub customers: u32,
    /// NURand's run-time constant for last names (C_LAST).
    pub c_last: u32,
    /// NURand's constant for customer ids.
    pub c_id: u32,
    /// NURand's constant for item ids.
    pub c_item: u32,
}

impl Scale {
    /// Initial undelivered orders per district (the last 30 %, 900 of 3 000 at full scale).
    pub fn new_orders(&self) -> u32 {
        (self.customers * 3 / 10).max(1)
    }

    /// Last names in use: TPC-C's 1 000, fewer with fewer customers.
    fn names(&self) -> u32 {
        self.customers.min(1000)
    }

    fn read(conn: &Connection) -> Result<Scale> {
        let get = |k: &str| -> Result<u32> {
            conn.query_row("SELECT value FROM tpcc_meta WHERE key = ?", [k], |r| {
                r.get::<_, i64>(0)
            })
            .with_context(|| format!("tpcc_meta has no {k:?}: not a database `load` made"))
            .map(|v| v as u32)
        };
        Ok(Scale {
            warehouses: get("warehouses")?,
            items: get("items")?,
            customers: get("customers")?,
            c_last: get("c_last")?,
            c_id: get("c_id")?,
            c_item: get("c_item")?,
        })
    }
}

/// NURand's A for a range of `n` values, scaled from TPC-C's (A = 255 for 1 000 names,
/// 1023 for 3 000 customers, 8191 for 100 000 items): the nearest power of two less one, at
/// least 1.
fn nurand_a(full_a: u32, full_n: u32, n: u32) -> u32 {
    let a = (full_a as f64 + 1.0) * n as f64 / full_n as f64;
    let k = a.log2().round().clamp(1.0, 31.0) as u32;
    (1u32 << k) - 1
}

/// NURand(A, x, y) with constant `c`.
fn nurand(rng: &mut StdRng, a: u32, c: u32, x: u32, y: u32) -> u32 {
    (((rng.gen_range(0..=a) | rng.gen_range(x..=y)) + c) % (y - x + 1)) + x
}

/// What [`load`] is to build.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Warehouses (≥ 1).
    pub warehouses: u32,
    /// Random seed (the same seed builds the same database).
    pub seed: u64,
    /// Fraction of TPC-C's items and customers, in (0, 1]: 1.0 is full scale (~85 MB per
    /// warehouse); 0.02 builds ~2 MB per warehouse for tests.
    pub scale: f64,
    /// Print progress to stderr.
    pub progress: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            warehouses: 1,
            seed: 1,
            scale: 1.0,
            progress: false,
        }
    }
}

/// What [`load`] built.
#[derive(Clone, Debug, Serialize)]
pub struct LoadSummary {
    /// The sizes.
    pub scale: Scale,
    /// The file's size, bytes.
    pub bytes: u64,
    /// Seconds the load took.
    pub seconds: f64,
}

/// Builds a full-scale TPC-C-like database of `warehouses` warehouses at `path` (replacing any
/// file there, with its journal), page size 4096, rollback journal. See [`load_with`].
pub fn load(path: &Path, warehouses: u32, seed: u64) -> Result<LoadSummary> {
    load_with(
        path,
        &LoadOptions {
            warehouses,
            seed,
            ..LoadOptions::default()
        },
    )
}

/// Builds the database `opts` describes at `path`, replacing any file there. The load goes
/// through the plain unix VFS with a large SQLite cache and no journal (a crash leaves a
/// half-built file; load again), then the file is synced.
pub fn load_with(path: &Path, opts: &LoadOptions) -> Result<LoadSummary> {
    if opts.warehouses == 0 || opts.warehouses > 9_999 {
        bail!("warehouses must be 1..=9999, not {}", opts.warehouses);
    }
    if !(opts.scale > 0.0 && opts.scale <= 1.0) {
        bail!("scale must be in (0, 1], not {}", opts.scale);
    }
    let t0 = Instant::now();
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", p.to_string_lossy())),
        }
    }
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let items = ((FULL_ITEMS as f64 * opts.scale).round() as u32).max(100);
    let customers = ((FULL_CUSTOMERS as f64 * opts.scale).round() as u32).max(30);
    let sc = Scale {
        warehouses: opts.warehouses,
        items,
        customers,
        c_last: rng.gen_range(0..=255),
        c_id: rng.gen_range(0..=1023),
        c_item: rng.gen_range(0..=8191),
    };
    let conn = Connection::open_with_flags_and_vfs(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        "unix",
    )
    .with_context(|| format!("creating {}", path.display()))?;
    conn.execute_batch(
        "PRAGMA page_size=4096; PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;
         PRAGMA cache_size=-65536;",
    )?;
    conn.execute_batch(SCHEMA)?;
    let note = |what: &str| {
        if opts.progress {
            eprintln!("tpcc load: {:6.1} s  {what}", t0.elapsed().as_secs_f64());
        }
    };
    conn.execute_batch("BEGIN")?;
    {
        let mut m = conn.prepare("INSERT INTO tpcc_meta VALUES(?, ?)")?;
        for (k, v) in [
            ("warehouses", sc.warehouses),
            ("items", sc.items),
            ("customers", sc.customers),
            ("c_last", sc.c_last),
            ("c_id", sc.c_id),
            ("c_item", sc.c_item),
        ] {
            m.execute(params![k, v])?;
        }
        let mut ins = conn.prepare("INSERT INTO item VALUES(?, ?, ?, ?, ?)")?;
        for i in 1..=sc.items {
            ins.execute(params![
                i,
                rng.gen_range(1..=10_000),
                astring(&mut rng, 14, 24),
                rng.gen_range(100..=10_000),
                data_string(&mut rng)
            ])?;
        }
    }
    conn.execute_batch("COMMIT")?;
    note(&format!("{} items", sc.items));
    let now = unix_now();
    for w in 1..=sc.warehouses {
        conn.execute_batch("BEGIN")?;
        load_warehouse(&conn, &mut rng, &sc, w, now)?;
        conn.execute_batch("COMMIT")?;
        note(&format!("warehouse {w} of {}", sc.warehouses));
    }
    drop(conn);
    let f = std::fs::File::open(path)?;
    f.sync_all()
        .with_context(|| format!("syncing {}", path.display()))?;
    let bytes = f.metadata()?.len();
    note(&format!("done: {:.1} MB", bytes as f64 / 1e6));
    Ok(LoadSummary {
        scale: sc,
        bytes,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn load_warehouse(conn: &Connection, rng: &mut StdRng, sc: &Scale, w: u32, now: i64) -> Result<()> {
    conn.execute(
        "INSERT INTO warehouse VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
        params![
            w,
            astring(rng, 6, 10),
            astring(rng, 10, 20),
            astring(rng, 10, 20),
            astring(rng, 10, 20),
            astring(rng, 2, 2),
            format!("{}11111", nstring(rng, 4)),
            rng.gen_range(0..=2000),
            30_000_000i64
        ],
    )?;
    let mut stock = conn.prepare(
        "INSERT INTO stock VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, 0, ?)",
    )?;
    for i in 1..=sc.items {
        let dist: Vec<String> = (0..10).map(|_| astring(rng, 24, 24)).collect();
        stock.execute(params![
            s_key(w, i),
            w,
            i,
            rng.gen_range(10..=100),
            dist[0],
            dist[1],
            dist[2],
            dist[3],
            dist[4],
            dist[5],
            dist[6],
            dist[7],
            dist[8],
            dist[9],
            data_string(rng)
        ])?;
    }
    let mut district =
        conn.prepare("INSERT INTO district VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")?;
    let mut customer = conn.prepare(
        "INSERT INTO customer VALUES(?, ?, ?, ?, ?, 'OE', ?, ?, ?, ?, ?, ?, ?, ?, ?, 5000000, ?,
         -1000, 1000, 1, 0, ?)",
    )?;
    let mut history = conn.prepare("INSERT INTO history VALUES(?, ?, ?, ?, ?, ?, 1000, ?)")?;
    let mut orders = conn.prepare("INSERT INTO orders VALUES(?, ?, ?, ?, ?, ?, ?, ?, 1)")?;
    let mut new_order = conn.prepare("INSERT INTO new_order VALUES(?, ?, ?, ?)")?;
    let mut line =
        conn.prepare("INSERT INTO order_line VALUES(?, ?, ?, ?, ?, ?, ?, ?, 5, ?, ?)")?;
    let a_name = nurand_a(255, 1000, sc.names());
    let first_new = sc.customers - sc.new_orders() + 1;
    for d in 1..=DISTRICTS {
        district.execute(params![
            d_key(w, d),
            w,
            d,
            astring(rng, 6, 10),
            astring(rng, 10, 20),
            astring(rng, 10, 20),
            astring(rng, 10, 20),
            astring(rng, 2, 2),
            format!("{}11111", nstring(rng, 4)),
            rng.gen_range(0..=2000),
            3_000_000i64,
            sc.customers + 1
        ])?;
        for c in 1..=sc.customers {
            let last = if c <= sc.names() {
                last_name(c - 1)
            } else {
                last_name(nurand(rng, a_name, sc.c_last, 0, sc.names() - 1))
            };
            let credit = if rng.gen_range(0..10) == 0 {
                "BC"
            } else {
                "GC"
            };
            customer.execute(params![
                c_key(w, d, c),
                w,
                d,
                c,
                astring(rng, 8, 16),
                last,
                astring(rng, 10, 20),
                astring(rng, 10, 20),
                astring(rng, 10, 20),
                astring(rng, 2, 2),
                format!("{}11111", nstring(rng, 4)),
                nstring(rng, 16),
                now,
                credit,
                rng.gen_range(0..=5000),
                astring(rng, 300, 500)
            ])?;
            history.execute(params![c, d, w, d, w, now, astring(rng, 12, 24)])?;
        }
        // Orders: customers in a random permutation.
        let mut perm: Vec<u32> = (1..=sc.customers).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.gen_range(0..=i));
        }
        for o in 1..=sc.customers {
            let delivered = o < first_new;
            let cnt = rng.gen_range(5..=15u32);
            let carrier: Option<u32> = delivered.then(|| rng.gen_range(1..=10));
            orders.execute(params![
                o_key(w, d, o),
                w,
                d,
                o,
                perm[(o - 1) as usize],
                now,
                carrier,
                cnt
            ])?;
            if !delivered {
                new_order.execute(params![o_key(w, d, o), w, d, o])?;
            }
            for n in 1..=cnt {
                let amount: i64 = if delivered {
                    0
                } else {
                    rng.gen_range(1..=999_999)
                };
                line.execute(params![
                    ol_key(w, d, o, n),
                    w,
                    d,
                    o,
                    n,
                    rng.gen_range(1..=sc.items),
                    w,
                    delivered.then_some(now),
                    amount,
                    astring(rng, 24, 24)
                ])?;
            }
        }
    }
    Ok(())
}

/// SQLite's `synchronous` setting for the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Synchronous {
    /// No syncs (not crash-safe).
    Off,
    /// Journal and database synced once per commit (rollback journal: crash-safe).
    Normal,
    /// As `Normal`, plus the journal header synced separately.
    Full,
}

impl Synchronous {
    /// Parses `off`, `normal` or `full`.
    pub fn parse(s: &str) -> Result<Synchronous> {
        match s.to_ascii_lowercase().as_str() {
            "off" => Ok(Synchronous::Off),
            "normal" => Ok(Synchronous::Normal),
            "full" => Ok(Synchronous::Full),
            _ => bail!("synchronous {s:?} is not off, normal or full"),
        }
    }
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Off => "OFF",
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }
}

/// How [`run`] runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Stop after this long (with `txns`, whichever comes first; neither: 60 s).
    pub duration: Option<Duration>,
    /// Stop after this many transactions (committed or not) per thread.
    pub txns: Option<u64>,
    /// Random seed (thread `i` uses `seed + i`).
    pub seed: u64,
    /// The VFS: `tiermem` (default; registered in process) or e.g. `unix` for a baseline.
    pub vfs: String,
    /// Pool mode; `None`: `TIERMEM_IOCACHE_MODE` (default dbio).
    pub mode: Option<Mode>,
    /// Pool bytes; `None`: `TIERMEM_IOCACHE_POOL` (default 16 MiB).
    pub pool_bytes: Option<u64>,
    /// Budget bytes; `None`: `TIERMEM_IOCACHE_BUDGET` (default 4 × pool).
    pub budget: Option<u64>,
    /// SQLite's own page cache, KiB (`PRAGMA cache_size=-N`); small so the pool is the cache.
    pub sqlite_cache_kib: u32,
    /// `PRAGMA synchronous`.
    pub synchronous: Synchronous,
    /// `PRAGMA journal_mode` (`delete`, `truncate`, `persist`, `wal`...).
    pub journal_mode: String,
    /// Connections (one thread each); more than one contend on SQLite's database lock.
    pub threads: u32,
    /// `PRAGMA locking_mode=EXCLUSIVE`: the connection keeps its lock, so the VFS neither
    /// writes the pool back at unlock nor revalidates it (with `synchronous=OFF`, dirty pages
    /// then stay in the pool between transactions). One thread only.
    pub exclusive: bool,
    /// Progress lines to stderr every 5 s.
    pub progress: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            duration: None,
            txns: None,
            seed: 1,
            vfs: crate::VFS_NAME.to_string(),
            mode: None,
            pool_bytes: None,
            budget: None,
            sqlite_cache_kib: 256,
            synchronous: Synchronous::Normal,
            journal_mode: "delete".into(),
            threads: 1,
            exclusive: false,
            progress: false,
        }
    }
}

/// Committed transactions of each type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ByType {
    /// NewOrder.
    pub new_order: u64,
    /// Payment.
    pub payment: u64,
    /// OrderStatus.
    pub order_status: u64,
    /// Delivery.
    pub delivery: u64,
    /// StockLevel.
    pub stock_level: u64,
}

impl ByType {
    fn add(&mut self, o: &ByType) {
        self.new_order += o.new_order;
        self.payment += o.payment;
        self.order_status += o.order_status;
        self.delivery += o.delivery;
        self.stock_level += o.stock_level;
    }
    fn total(&self) -> u64 {
        self.new_order + self.payment + self.order_status + self.delivery + self.stock_level
    }
}

/// What [`run`] measured.
#[derive(Clone, Debug, Serialize)]
pub struct TpccResult {
    /// Committed transactions.
    pub txns: u64,
    /// Committed NewOrders.
    pub new_orders: u64,
    /// Committed NewOrders per minute.
    pub tpmc: f64,
    /// Committed transactions per second.
    pub tps: f64,
    /// Committed transactions by type.
    pub by_type: ByType,
    /// NewOrders rolled back on purpose (TPC-C's 1 % with an unused item number).
    pub aborted: u64,
    /// Transactions that failed (an SQLite error such as `SQLITE_BUSY`; rolled back).
    pub errors: u64,
    /// The first error's text, if any.
    pub first_error: Option<String>,
    /// Seconds of the measured loop.
    pub elapsed_s: f64,
    /// The VFS used.
    pub vfs: String,
    /// The pool's configuration and counters at the end (the `tiermem` VFS only).
    pub pool: Option<crate::PoolReport>,
    /// The database's sizes.
    pub scale: Scale,
}

/// The URI naming `path` with the pool settings `opts` overrides (percent-escaping what a URI
/// path cannot hold).
fn uri_for(path: &Path, opts: &RunOptions) -> Result<String> {
    let abs = std::path::absolute(path).with_context(|| format!("{}", path.display()))?;
    let mut s = String::from("file:");
    for &b in abs.as_os_str().as_encoded_bytes() {
        match b {
            b'%' | b'?' | b'#' | b'&' | b'=' | b' ' | 0x80..=0xff | 0..=0x1f => {
                s.push_str(&format!("%{b:02X}"))
            }
            _ => s.push(b as char),
        }
    }
    let mut q = vec![format!("vfs={}", opts.vfs)];
    if let Some(m) = opts.mode {
        q.push(format!("iocache_mode={}", config::mode_name(m)));
    }
    if let Some(p) = opts.pool_bytes {
        q.push(format!("iocache_pool={p}"));
    }
    if let Some(b) = opts.budget {
        q.push(format!("iocache_budget={b}"));
    }
    s.push('?');
    s.push_str(&q.join("&"));
    Ok(s)
}

/// Opens `path` for the workload the way `opts` says (registering the `tiermem` VFS when it is
/// the one asked for): small SQLite cache, the journal mode and synchronous setting, a busy
/// timeout.
pub fn open(path: &Path, opts: &RunOptions) -> Result<Connection> {
    if opts.vfs == crate::VFS_NAME {
        crate::register(false).map_err(anyhow::Error::msg)?;
    }
    if !path.exists() {
        bail!("{}: no such database (run `load` first)", path.display());
    }
    let uri = uri_for(path, opts)?;
    let conn = Connection::open_with_flags(
        &uri,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_URI,
    )
    .with_context(|| format!("opening {uri}"))?;
    conn.busy_timeout(Duration::from_secs(30))?;
    conn.execute_batch(&format!(
        "PRAGMA cache_size=-{}; PRAGMA synchronous={}; PRAGMA mmap_size=0;",
        opts.sqlite_cache_kib.max(64),
        opts.synchronous.pragma()
    ))?;
    let jm: String = conn.query_row(
        &format!("PRAGMA journal_mode={}", opts.journal_mode),
        [],
        |r| r.get(0),
    )?;
    if !jm.eq_ignore_ascii_case(&opts.journal_mode) {
        bail!("journal_mode {} was refused (got {jm})", opts.journal_mode);
    }
    if opts.exclusive {
        conn.execute_batch("PRAGMA locking_mode=EXCLUSIVE")?;
    }
    Ok(conn)
}

/// Runs the mix on the database at `path` (made by [`load`]) as `opts` says and returns what
/// it measured. Errors: the database cannot be opened or is not a TPC-C one; failures of single
/// transactions are counted in [`TpccResult::errors`], not returned.
pub fn run(path: &Path, opts: &RunOptions) -> Result<TpccResult> {
    let threads = opts.threads.max(1);
    if opts.exclusive && threads > 1 {
        bail!("exclusive locking takes one connection, not {threads}");
    }
    let limit = match (opts.duration, opts.txns) {
        (None, None) => Some(Duration::from_secs(60)),
        (d, _) => d,
    };
    // Open every connection (and the pool) before the clock starts.
    let mut conns = Vec::new();
    for _ in 0..threads {
        conns.push(open(path, opts)?);
    }
    let sc = Scale::read(&conns[0])?;
    let t0 = Instant::now();
    let deadline = limit.map(|d| t0 + d);
    let progress = AtomicU64::new(0);
    type Tally = (ByType, u64, u64, Option<String>);
    let results: Vec<Result<(Tally, Connection)>> = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(i, conn)| {
                let progress = &progress;
                s.spawn(move || {
                    let mut w = Worker::new(&conn, sc, opts.seed.wrapping_add(i as u64));
                    let mut last_note = Instant::now();
                    let mut n = 0u64;
                    loop {
                        if opts.txns.is_some_and(|t| n >= t)
                            || deadline.is_some_and(|d| Instant::now() >= d)
                        {
                            break;
                        }
                        w.one();
                        n += 1;
                        let total = progress.fetch_add(1, AtomicOrdering::Relaxed) + 1;
                        if opts.progress && i == 0 && last_note.elapsed() >= Duration::from_secs(5)
                        {
                            last_note = Instant::now();
                            let el = t0.elapsed().as_secs_f64();
                            eprintln!(
                                "tpcc run: {el:6.1} s  {total} txns  ~{:.0} txn/s",
                                total as f64 / el
                            );
                        }
                    }
                    let tally = (w.done, w.aborted, w.errors, w.first_error.take());
                    drop(w);
                    Ok((tally, conn))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a worker thread panicked"))
            })
            .collect()
    });
    let elapsed_s = t0.elapsed().as_secs_f64();
    let mut by_type = ByType::default();
    let (mut aborted, mut errors, mut first_error) = (0, 0, None);
    let mut conns = Vec::new();
    for r in results {
        let ((done, a, e, first), conn) = r?;
        by_type.add(&done);
        aborted += a;
        errors += e;
        if first_error.is_none() {
            first_error = first;
        }
        conns.push(conn);
    }
    let pool = (opts.vfs == crate::VFS_NAME)
        .then(|| crate::pool_report(path))
        .flatten();
    drop(conns);
    let txns = by_type.total();
    Ok(TpccResult {
        txns,
        new_orders: by_type.new_order,
        tpmc: by_type.new_order as f64 * 60.0 / elapsed_s.max(1e-9),
        tps: txns as f64 / elapsed_s.max(1e-9),
        by_type,
        aborted,
        errors,
        first_error,
        elapsed_s,
        vfs: opts.vfs.clone(),
        pool,
        scale: sc,
    })
}

enum Outcome {
    Committed,
    RolledBack,
}

/// One connection's transaction generator.
struct Worker<'c> {
    conn: &'c Connection,
    rng: StdRng,
    sc: Scale,
    a_name: u32,
    a_cust: u32,
    a_item: u32,
    done: ByType,
    aborted: u64,
    errors: u64,
    first_error: Option<String>,
}

impl<'c> Worker<'c> {
    fn new(conn: &'c Connection, sc: Scale, seed: u64) -> Worker<'c> {
        Worker {
            conn,
            rng: StdRng::seed_from_u64(seed),
            a_name: nurand_a(255, 1000, sc.names()),
            a_cust: nurand_a(1023, FULL_CUSTOMERS, sc.customers),
            a_item: nurand_a(8191, FULL_ITEMS, sc.items),
            sc,
            done: ByType::default(),
            aborted: 0,
            errors: 0,
            first_error: None,
        }
    }

    /// One transaction of the mix.
    fn one(&mut self) {
        let r = self.rng.gen_range(0..100);
        let res = match r {
            0..=44 => self.new_order().map(|o| (o, 0)),
            45..=87 => self.payment().map(|o| (o, 1)),
            88..=91 => self.order_status().map(|o| (o, 2)),
            92..=95 => self.delivery().map(|o| (o, 3)),
            _ => self.stock_level().map(|o| (o, 4)),
        };
        match res {
            Ok((Outcome::Committed, k)) => match k {
                0 => self.done.new_order += 1,
                1 => self.done.payment += 1,
                2 => self.done.order_status += 1,
                3 => self.done.delivery += 1,
                _ => self.done.stock_level += 1,
            },
            Ok((Outcome::RolledBack, _)) => self.aborted += 1,
            Err(e) => {
                if !self.conn.is_autocommit() {
                    let _ = self.conn.execute_batch("ROLLBACK");
                }
                self.errors += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(e.to_string());
                }
            }
        }
    }

    fn w(&mut self) -> u32 {
        self.rng.gen_range(1..=self.sc.warehouses)
    }
    fn other_w(&mut self, w: u32) -> u32 {
        if self.sc.warehouses == 1 {
            return w;
        }
        let o = self.rng.gen_range(1..self.sc.warehouses);
        if o >= w {
            o + 1
        } else {
            o
        }
    }
    fn cust_id(&mut self) -> u32 {
        nurand(
            &mut self.rng,
            self.a_cust,
            self.sc.c_id,
            1,
            self.sc.customers,
        )
    }

    /// A customer: 60 % by last name (the middle one of those with that name, by first
    /// name), else by NURand id. Returns its key and id.
    fn customer(&mut self, w: u32, d: u32) -> rusqlite::Result<(i64, u32)> {
        if self.rng.gen_range(0..100) < 60 {
            let name = last_name(nurand(
                &mut self.rng,
                self.a_name,
                self.sc.c_last,
                0,
                self.sc.names() - 1,
            ));
            let mut st = self.conn.prepare_cached(
                "SELECT c_key, c_id FROM customer WHERE c_w_id = ? AND c_d_id = ? AND c_last = ?
                 ORDER BY c_first",
            )?;
            let found: Vec<(i64, u32)> = st
                .query_map(params![w, d, name], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            if !found.is_empty() {
                return Ok(found[(found.len() - 1) / 2]);
            }
        }
        let c = self.cust_id();
        Ok((c_key(w, d, c), c))
    }

    fn new_order(&mut self) -> rusqlite::Result<Outcome> {
        let w = self.w();
        let d = self.rng.gen_range(1..=DISTRICTS);
        let c = self.cust_id();
        let cnt = self.rng.gen_range(5..=15u32);
        let rollback = self.rng.gen_range(0..100) == 0;
        let lines: Vec<(u32, u32, u32)> = (0..cnt)
            .map(|n| {
                let i = if rollback && n == cnt - 1 {
                    self.sc.items + 1
                } else {
                    nurand(&mut self.rng, self.a_item, self.sc.c_item, 1, self.sc.items)
                };
                let sw = if self.rng.gen_range(0..100) == 0 {
                    self.other_w(w)
                } else {
                    w
                };
                (i, sw, self.rng.gen_range(1..=10))
            })
            .collect();
        let all_local = lines.iter().all(|l| l.1 == w) as i64;
        let conn = self.conn;
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let _w_tax: i64 = conn
            .prepare_cached("SELECT w_tax FROM warehouse WHERE w_id = ?")?
            .query_row([w], |r| r.get(0))?;
        let (_d_tax, o): (i64, u32) = conn
            .prepare_cached("SELECT d_tax, d_next_o_id FROM district WHERE d_key = ?")?
            .query_row([d_key(w, d)], |r| Ok((r.get(0)?, r.get(1)?)))?;
        conn.prepare_cached("UPDATE district SET d_next_o_id = ? WHERE d_key = ?")?
            .execute(params![o + 1, d_key(w, d)])?;
        let (_disc, _last, _credit): (i64, String, String) = conn
            .prepare_cached("SELECT c_discount, c_last, c_credit FROM customer WHERE c_key = ?")?
            .query_row([c_key(w, d, c)], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        let now = unix_now();
        conn.prepare_cached("INSERT INTO orders VALUES(?, ?, ?, ?, ?, ?, NULL, ?, ?)")?
            .execute(params![o_key(w, d, o), w, d, o, c, now, cnt, all_local])?;
        conn.prepare_cached("INSERT INTO new_order VALUES(?, ?, ?, ?)")?
            .execute(params![o_key(w, d, o), w, d, o])?;
        let stock_sql =
            format!("SELECT s_quantity, s_data, s_dist_{d:02} FROM stock WHERE s_key = ?");
        for (n, &(i, sw, qty)) in lines.iter().enumerate() {
            let item: Option<(i64, String, String)> = conn
                .prepare_cached("SELECT i_price, i_name, i_data FROM item WHERE i_id = ?")?
                .query_row([i], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()?;
            let Some((price, _name, _data)) = item else {
                conn.execute_batch("ROLLBACK")?;
                return Ok(Outcome::RolledBack);
            };
            let (s_q, _s_data, dist): (u32, String, String) = conn
                .prepare_cached(&stock_sql)?
                .query_row([s_key(sw, i)], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            let new_q = if s_q >= qty + 10 {
                s_q - qty
            } else {
                s_q + 91 - qty
            };
            conn.prepare_cached(
                "UPDATE stock SET s_quantity = ?, s_ytd = s_ytd + ?, s_order_cnt = s_order_cnt + 1,
                 s_remote_cnt = s_remote_cnt + ? WHERE s_key = ?",
            )?
            .execute(params![new_q, qty, (sw != w) as i64, s_key(sw, i)])?;
            conn.prepare_cached(
                "INSERT INTO order_line VALUES(?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)",
            )?
            .execute(params![
                ol_key(w, d, o, n as u32 + 1),
                w,
                d,
                o,
                n as u32 + 1,
                i,
                sw,
                qty,
                qty as i64 * price,
                dist
            ])?;
        }
        conn.execute_batch("COMMIT")?;
        Ok(Outcome::Committed)
    }

    fn payment(&mut self) -> rusqlite::Result<Outcome> {
        let w = self.w();
        let d = self.rng.gen_range(1..=DISTRICTS);
        let (cw, cd) = if self.rng.gen_range(0..100) < 85 {
            (w, d)
        } else {
            (self.other_w(w), self.rng.gen_range(1..=DISTRICTS))
        };
        let amount: i64 = self.rng.gen_range(100..=500_000);
        let conn = self.conn;
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let (ck, c) = self.customer(cw, cd)?;
        conn.prepare_cached("UPDATE warehouse SET w_ytd = w_ytd + ? WHERE w_id = ?")?
            .execute(params![amount, w])?;
        let w_name: String = conn
            .prepare_cached("SELECT w_name FROM warehouse WHERE w_id = ?")?
            .query_row([w], |r| r.get(0))?;
        conn.prepare_cached("UPDATE district SET d_ytd = d_ytd + ? WHERE d_key = ?")?
            .execute(params![amount, d_key(w, d)])?;
        let d_name: String = conn
            .prepare_cached("SELECT d_name FROM district WHERE d_key = ?")?
            .query_row([d_key(w, d)], |r| r.get(0))?;
        let credit: String = conn
            .prepare_cached("SELECT c_credit FROM customer WHERE c_key = ?")?
            .query_row([ck], |r| r.get(0))?;
        if credit == "BC" {
            let note = format!("{c} {cd} {cw} {d} {w} {amount} |");
            conn.prepare_cached(
                "UPDATE customer SET c_balance = c_balance - ?, c_ytd_payment = c_ytd_payment + ?,
                 c_payment_cnt = c_payment_cnt + 1, c_data = substr(? || c_data, 1, 500)
                 WHERE c_key = ?",
            )?
            .execute(params![amount, amount, note, ck])?;
        } else {
            conn.prepare_cached(
                "UPDATE customer SET c_balance = c_balance - ?, c_ytd_payment = c_ytd_payment + ?,
                 c_payment_cnt = c_payment_cnt + 1 WHERE c_key = ?",
            )?
            .execute(params![amount, amount, ck])?;
        }
        conn.prepare_cached("INSERT INTO history VALUES(?, ?, ?, ?, ?, ?, ?, ?)")?
            .execute(params![
                c,
                cd,
                cw,
                d,
                w,
                unix_now(),
                amount,
                format!("{w_name}    {d_name}")
            ])?;
        conn.execute_batch("COMMIT")?;
        Ok(Outcome::Committed)
    }

    fn order_status(&mut self) -> rusqlite::Result<Outcome> {
        let w = self.w();
        let d = self.rng.gen_range(1..=DISTRICTS);
        let conn = self.conn;
        conn.execute_batch("BEGIN")?;
        let (ck, c) = self.customer(w, d)?;
        let _bal: i64 = conn
            .prepare_cached("SELECT c_balance FROM customer WHERE c_key = ?")?
            .query_row([ck], |r| r.get(0))?;
        let last: Option<u32> = conn
            .prepare_cached(
                "SELECT o_id FROM orders WHERE o_w_id = ? AND o_d_id = ? AND o_c_id = ?
                 ORDER BY o_id DESC LIMIT 1",
            )?
            .query_row(params![w, d, c], |r| r.get(0))
            .optional()?;
        if let Some(o) = last {
            let mut st = conn.prepare_cached(
                "SELECT ol_i_id, ol_supply_w_id, ol_quantity, ol_amount, ol_delivery_d
                 FROM order_line WHERE ol_key BETWEEN ? AND ?",
            )?;
            let n = st
                .query_map(params![ol_key(w, d, o, 0), ol_key(w, d, o, 15)], |r| {
                    r.get::<_, i64>(0)
                })?
                .count();
            debug_assert!(n > 0);
        }
        conn.execute_batch("COMMIT")?;
        Ok(Outcome::Committed)
    }

    fn delivery(&mut self) -> rusqlite::Result<Outcome> {
        let w = self.w();
        let carrier = self.rng.gen_range(1..=10u32);
        let now = unix_now();
        let conn = self.conn;
        conn.execute_batch("BEGIN IMMEDIATE")?;
        for d in 1..=DISTRICTS {
            let oldest: Option<u32> = conn
                .prepare_cached(
                    "SELECT no_o_id FROM new_order WHERE no_key BETWEEN ? AND ?
                     ORDER BY no_key LIMIT 1",
                )?
                .query_row(params![o_key(w, d, 0), o_key(w, d, u32::MAX)], |r| r.get(0))
                .optional()?;
            let Some(o) = oldest else { continue };
            conn.prepare_cached("DELETE FROM new_order WHERE no_key = ?")?
                .execute([o_key(w, d, o)])?;
            let c: u32 = conn
                .prepare_cached("SELECT o_c_id FROM orders WHERE o_key = ?")?
                .query_row([o_key(w, d, o)], |r| r.get(0))?;
            conn.prepare_cached("UPDATE orders SET o_carrier_id = ? WHERE o_key = ?")?
                .execute(params![carrier, o_key(w, d, o)])?;
            let (lo, hi) = (ol_key(w, d, o, 0), ol_key(w, d, o, 15));
            conn.prepare_cached(
                "UPDATE order_line SET ol_delivery_d = ? WHERE ol_key BETWEEN ? AND ?",
            )?
            .execute(params![now, lo, hi])?;
            let total: i64 = conn
                .prepare_cached(
                    "SELECT coalesce(sum(ol_amount), 0) FROM order_line
                     WHERE ol_key BETWEEN ? AND ?",
                )?
                .query_row(params![lo, hi], |r| r.get(0))?;
            conn.prepare_cached(
                "UPDATE customer SET c_balance = c_balance + ?, c_delivery_cnt = c_delivery_cnt + 1
                 WHERE c_key = ?",
            )?
            .execute(params![total, c_key(w, d, c)])?;
        }
        conn.execute_batch("COMMIT")?;
        Ok(Outcome::Committed)
    }

    fn stock_level(&mut self) -> rusqlite::Result<Outcome> {
        let w = self.w();
        let d = self.rng.gen_range(1..=DISTRICTS);
        let threshold = self.rng.gen_range(10..=20u32);
        let conn = self.conn;
        conn.execute_batch("BEGIN")?;
        let next: u32 = conn
            .prepare_cached("SELECT d_next_o_id FROM district WHERE d_key = ?")?
            .query_row([d_key(w, d)], |r| r.get(0))?;
        let lo = ol_key(w, d, next.saturating_sub(20), 0);
        let hi = ol_key(w, d, next, 0);
        let _low: i64 = conn
            .prepare_cached(
                "SELECT count(DISTINCT ol_i_id) FROM order_line CROSS JOIN stock
                 ON s_key = ? * 1000000 + ol_i_id
                 WHERE ol_key >= ? AND ol_key < ? AND s_quantity < ?",
            )?
            .query_row(params![w, lo, hi, threshold], |r| r.get(0))?;
        conn.execute_batch("COMMIT")?;
        Ok(Outcome::Committed)
    }
}

/// The outcome of [`check`]: TPC-C's consistency conditions 1–4 and `PRAGMA integrity_check`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Consistency {
    /// `PRAGMA integrity_check`'s rows (`["ok"]` when sound).
    pub integrity: Vec<String>,
    /// Each violated condition, described.
    pub violations: Vec<String>,
    /// Orders in the database.
    pub orders: u64,
}

impl Consistency {
    /// Whether the database is sound and every condition holds.
    pub fn ok(&self) -> bool {
        self.integrity == ["ok"] && self.violations.is_empty()
    }
}

/// Checks the database `conn` has open: integrity, then (1) W_YTD = Σ D_YTD per warehouse;
/// (2) D_NEXT_O_ID − 1 = max(O_ID) = max(NO_O_ID) per district; (3) the new orders of a
/// district are a contiguous range; (4) Σ O_OL_CNT = count of order lines per district.
pub fn check_conn(conn: &Connection) -> Result<Consistency> {
    let mut out = Consistency::default();
    let mut st = conn.prepare("PRAGMA integrity_check")?;
    out.integrity = st
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut v = Vec::new();
    let mut q = conn.prepare(
        "SELECT w_id, w_ytd, (SELECT sum(d_ytd) FROM district WHERE d_w_id = w_id) FROM warehouse",
    )?;
    for r in q.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })? {
        let (w, a, b) = r?;
        if a != b {
            v.push(format!("1: warehouse {w}: w_ytd {a} != sum(d_ytd) {b}"));
        }
    }
    let mut q = conn.prepare(
        "SELECT d_w_id, d_id, d_next_o_id,
           (SELECT max(o_id) FROM orders WHERE o_key BETWEEN d_key << 32 AND (d_key << 32) + 4294967295),
           (SELECT max(no_o_id) FROM new_order WHERE no_key BETWEEN d_key << 32 AND (d_key << 32) + 4294967295),
           (SELECT min(no_o_id) FROM new_order WHERE no_key BETWEEN d_key << 32 AND (d_key << 32) + 4294967295),
           (SELECT count(*) FROM new_order WHERE no_key BETWEEN d_key << 32 AND (d_key << 32) + 4294967295),
           (SELECT coalesce(sum(o_ol_cnt), 0) FROM orders WHERE o_key BETWEEN d_key << 32 AND (d_key << 32) + 4294967295),
           (SELECT count(*) FROM order_line WHERE ol_key BETWEEN d_key << 36 AND (d_key << 36) + 68719476735)
         FROM district",
    )?;
    type Row = (
        i64,
        i64,
        i64,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        i64,
        i64,
        i64,
    );
    let rows = q.query_map([], |r| {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
            r.get(7)?,
            r.get(8)?,
        ))
    })?;
    for r in rows {
        let (w, d, next, max_o, max_no, min_no, n_no, ol_cnt, lines): Row = r?;
        if Some(next - 1) != max_o {
            v.push(format!(
                "2: district {w}/{d}: d_next_o_id-1 {} != max(o_id) {max_o:?}",
                next - 1
            ));
        }
        if max_no.is_some() && max_no != Some(next - 1) {
            v.push(format!(
                "2: district {w}/{d}: d_next_o_id-1 {} != max(no_o_id) {max_no:?}",
                next - 1
            ));
        }
        if let (Some(a), Some(b)) = (max_no, min_no) {
            if a - b + 1 != n_no {
                v.push(format!(
                    "3: district {w}/{d}: new orders {b}..={a} but {n_no} rows"
                ));
            }
        }
        if ol_cnt != lines {
            v.push(format!(
                "4: district {w}/{d}: sum(o_ol_cnt) {ol_cnt} != order lines {lines}"
            ));
        }
    }
    out.orders = conn.query_row("SELECT count(*) FROM orders", [], |r| r.get::<_, i64>(0))? as u64;
    out.violations = v;
    Ok(out)
}

/// [`check_conn`] on the database at `path`, opened with `vfs` (`None`: the default VFS).
pub fn check(path: &Path, vfs: Option<&str>) -> Result<Consistency> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE;
    let conn = match vfs {
        Some(v) => {
            if v == crate::VFS_NAME {
                crate::register(false).map_err(anyhow::Error::msg)?;
            }
            Connection::open_with_flags_and_vfs(path, flags, v)
        }
        None => Connection::open_with_flags(path, flags),
    }
    .with_context(|| format!("opening {}", path.display()))?;
    conn.execute_batch("PRAGMA cache_size=-256")?;
    check_conn(&conn)
}

/// The default database location for the binary: `/var/tmp/tiermem-tpcc/tpcc.db` (a block
/// device: `direct` and `dbio` need one).
pub fn default_db() -> PathBuf {
    PathBuf::from("/var/tmp/tiermem-tpcc/tpcc.db")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_do_not_collide_and_nurand_stays_in_range() {
        assert!(ol_key(1, 10, u32::MAX >> 4, 15) < ol_key(2, 1, 0, 0));
        assert!(o_key(1, 10, u32::MAX) < o_key(2, 1, 0));
        assert!(c_key(1, 10, 99_999) < c_key(2, 1, 0));
        assert_eq!(nurand_a(8191, 100_000, 100_000), 8191);
        assert_eq!(nurand_a(1023, 3000, 3000), 1023);
        assert_eq!(nurand_a(255, 1000, 60), 15);
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..10_000 {
            let v = nurand(&mut rng, 15, 7, 1, 60);
            assert!((1..=60).contains(&v));
        }
        assert_eq!(last_name(371), "PRICALLYOUGHT");
    }
}
