//! The library's configuration, read once from the environment by the constructor: which files
//! to serve (`TIERMEM_ZREAD`, canonicalised), the loss model switch, which buffers may be
//! remapped, where the exit report goes.

use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// Which caller buffers `zread_into` may remap onto the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffers {
    /// Only buffers inside glibc's main-arena heap (`[heap]`, between the initial and the
    /// current program break) while glibc's malloc is the program's: that allocator gives such
    /// memory back with `brk` (which unmaps the remapped pages) and never assumes that memory it
    /// purged with `MADV_DONTNEED` reads as zeros, so a remapped buffer cannot leak file bytes
    /// into a later `calloc`. Any other buffer is read with the real call.
    Heap,
    /// Any page-aligned buffer: the program promises its read buffers are never handed to an
    /// allocator that assumes `MADV_DONTNEED` zero-fills (glibc's thread arenas, jemalloc,
    /// tcmalloc do), e.g. buffers it maps itself (`fio --mem=mmap`).
    Any,
}

/// What the environment asked for.
#[derive(Clone, Debug)]
pub struct Config {
    /// Canonical absolute paths of the files and directories whose files are served.
    pub entries: Vec<Vec<u8>>,
    /// `TIERMEM_ZREAD_MODEL`: ask the loss model (default) or remap whenever aligned (`0`).
    pub model: bool,
    /// `TIERMEM_ZREAD_BUFFERS`: `heap` (default) or `any`.
    pub buffers: Buffers,
    /// `TIERMEM_ZREAD_STATS`: the exit report's path (`%p`: the pid).
    pub stats: Option<String>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The canonical form of `entry`: `realpath` of it, or of its parent joined with its name when
/// it does not exist yet, else the path made absolute as given.
fn canonical(entry: &str) -> PathBuf {
    let p = Path::new(entry);
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    if let (Some(parent), Some(name)) = (p.parent(), p.file_name()) {
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        if let Ok(c) = std::fs::canonicalize(parent) {
            return c.join(name);
        }
    }
    std::env::current_dir()
        .map(|d| d.join(p))
        .unwrap_or_else(|_| p.to_path_buf())
}

/// Reads the configuration. `Ok(None)`: `TIERMEM_ZREAD` is unset or empty (the library does
/// nothing); `Err`: a malformed variable, named in the message.
pub fn from_env() -> Result<Option<Config>, String> {
    let Some(list) = env("TIERMEM_ZREAD") else {
        return Ok(None);
    };
    let entries: Vec<Vec<u8>> = list
        .split(':')
        .filter(|e| !e.is_empty())
        .map(|e| {
            let mut b = canonical(e).into_os_string().into_vec();
            while b.len() > 1 && b.ends_with(b"/") {
                b.pop();
            }
            b
        })
        .collect();
    if entries.is_empty() {
        return Ok(None);
    }
    let model = match env("TIERMEM_ZREAD_MODEL").as_deref() {
        None | Some("1") => true,
        Some("0") => false,
        Some(v) => return Err(format!("TIERMEM_ZREAD_MODEL={v:?} is not 0 or 1")),
    };
    let buffers = match env("TIERMEM_ZREAD_BUFFERS").as_deref() {
        None | Some("heap") => Buffers::Heap,
        Some("any") => Buffers::Any,
        Some(v) => return Err(format!("TIERMEM_ZREAD_BUFFERS={v:?} is not heap or any")),
    };
    Ok(Some(Config {
        entries,
        model,
        buffers,
        stats: env("TIERMEM_ZREAD_STATS"),
    }))
}

impl Config {
    /// Whether the canonical `path` is one of the entries or lies under one (a whole path
    /// component prefix: `/a/b` covers `/a/b` and `/a/b/c`, not `/a/bc`).
    pub fn matches(&self, path: &[u8]) -> bool {
        self.entries.iter().any(|e| {
            path.starts_with(e)
                && (path.len() == e.len() || e.ends_with(b"/") || path[e.len()] == b'/')
        })
    }
}
