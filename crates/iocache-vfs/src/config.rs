//! The VFS's configuration: the pool mode, pool size and budget of a database file, from URI
//! parameters of the database name (`file:db?iocache_mode=direct&iocache_pool=8M`), else the
//! `TIERMEM_IOCACHE_*` environment variables, else the defaults; and the size parser they share.

use tiermem_iocache::Mode;

/// Environment variable: `buffered`, `direct` or `dbio` (default `dbio`).
pub const ENV_MODE: &str = "TIERMEM_IOCACHE_MODE";
/// Environment variable: the pool's bytes (`16M`, `1G`, `65536`; default 16 MiB).
pub const ENV_POOL: &str = "TIERMEM_IOCACHE_POOL";
/// Environment variable: the budget of pool and page cache together (default 4 × the pool).
pub const ENV_BUDGET: &str = "TIERMEM_IOCACHE_BUDGET";
/// Environment variable: `0` leaves the budget to a memory cgroup (no trimming of the page
/// cache by the pool); anything else or unset: the pool trims (see `Options::enforce_budget`).
pub const ENV_ENFORCE: &str = "TIERMEM_IOCACHE_ENFORCE";
/// Default pool size: 16 MiB.
pub const DEFAULT_POOL: u64 = 16 << 20;

/// What the VFS gives one database file's pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// The pool's I/O mode.
    pub mode: Mode,
    /// Pool bytes.
    pub pool_bytes: u64,
    /// Pool and page cache together, bytes (≥ `pool_bytes`).
    pub budget: u64,
    /// Whether the pool trims the page cache to `budget − pool_bytes` itself.
    pub enforce_budget: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::Dbio,
            pool_bytes: DEFAULT_POOL,
            budget: 4 * DEFAULT_POOL,
            enforce_budget: true,
        }
    }
}

/// Parses a mode name: `buffered`, `direct` or `dbio` (ASCII case ignored).
pub fn parse_mode(s: &str) -> Result<Mode, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "buffered" => Ok(Mode::Buffered),
        "direct" => Ok(Mode::Direct),
        "dbio" => Ok(Mode::Dbio),
        other => Err(format!("mode {other:?} is not buffered, direct or dbio")),
    }
}

/// The name of a mode as [`parse_mode`] reads it.
pub fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Buffered => "buffered",
        Mode::Direct => "direct",
        Mode::Dbio => "dbio",
    }
}

/// Parses a byte count: digits with an optional `K`, `M`, `G` or `T` suffix (powers of 1024,
/// either case, an optional trailing `B` or `iB`). Refuses zero, garbage and overflow.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, shift) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 10),
        Some('m') => (&body[..body.len() - 1], 20),
        Some('g') => (&body[..body.len() - 1], 30),
        Some('t') => (&body[..body.len() - 1], 40),
        _ => (body, 0),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("{t:?} is not a size (digits with an optional K, M or G)"))?;
    let v = n
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{t:?} is too large"))?;
    if v == 0 {
        return Err(format!("{t:?}: a size of zero"));
    }
    Ok(v)
}

/// Builds a configuration from a lookup of its three settings (`mode`, `pool`, `budget`,
/// `enforce`: `None` when not given); the budget defaults to 4 × the pool. Errors name the
/// setting (`what` says where it came from, e.g. the variable's name).
pub fn from_lookup(
    mut get: impl FnMut(&str) -> Option<(String, String)>,
) -> Result<Config, String> {
    let mut c = Config::default();
    if let Some((what, v)) = get("mode") {
        c.mode = parse_mode(&v).map_err(|e| format!("{what}={v}: {e}"))?;
    }
    if let Some((what, v)) = get("pool") {
        c.pool_bytes = parse_size(&v).map_err(|e| format!("{what}={v}: {e}"))?;
    }
    c.budget = c.pool_bytes.saturating_mul(4);
    if let Some((what, v)) = get("budget") {
        c.budget = parse_size(&v).map_err(|e| format!("{what}={v}: {e}"))?;
        if c.budget < c.pool_bytes {
            return Err(format!(
                "{what}={v}: the budget is smaller than the pool ({} bytes)",
                c.pool_bytes
            ));
        }
    }
    if let Some((_, v)) = get("enforce") {
        c.enforce_budget = v.trim() != "0";
    }
    Ok(c)
}

/// The configuration from the `TIERMEM_IOCACHE_*` environment variables alone.
pub fn from_env() -> Result<Config, String> {
    from_lookup(|k| {
        let var = match k {
            "mode" => ENV_MODE,
            "pool" => ENV_POOL,
            "budget" => ENV_BUDGET,
            _ => ENV_ENFORCE,
        };
        std::env::var(var).ok().map(|v| (var.to_string(), v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_modes_parse() {
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("0").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(parse_mode("DBIO"), Ok(Mode::Dbio));
        assert!(parse_mode("mmap").is_err());
    }

    #[test]
    fn the_budget_defaults_to_four_pools_and_is_checked() {
        let c = from_lookup(|k| (k == "pool").then(|| ("P".into(), "1M".into()))).unwrap();
        assert_eq!(
            (c.pool_bytes, c.budget, c.mode),
            (1 << 20, 4 << 20, Mode::Dbio)
        );
        let e = from_lookup(|k| match k {
            "pool" => Some(("P".into(), "8M".into())),
            "budget" => Some(("B".into(), "4M".into())),
            _ => None,
        })
        .unwrap_err();
        assert!(e.contains("B=4M"), "{e}");
    }
}
