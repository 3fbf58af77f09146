//! NVM and FAM pools: files mapped `MAP_SHARED`, with a checksummed 4 KiB header at offset 0 and
//! a data area after it.
//!
//! On-disk layout (little-endian), version [`POOL_VERSION`]:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `TMEMPOOL` |
//! | 8 | 4 | version |
//! | 12 | 4 | kind (1 = NVM, 2 = FAM) |
//! | 16 | 8 | header size (4096) |
//! | 24 | 8 | pool size (whole file) |
//! | 32 | 8 | data offset (4096) |
//! | 40 | 8 | data size |
//! | 48 | 16 | uuid |
//! | 64 | 8 | creation time, ns since the Unix epoch |
//! | 72 | 8 | flags (bit 0: group shared) |
//! | 80 | 32 | tag, NUL-padded UTF-8 |
//! | 112 | 4 | CRC-32 of the 4096-byte header with this field zeroed |
//! | 116.. | | zero |
//!
//! Nothing in the header (or anywhere in a pool written by this crate) is a virtual address.

use crate::crash::PowerDomain;
use crate::delay::{delay_ns, DelayCell, DelayModel};
use crate::error::{parent_dir, MediaError, Result};
use crate::persist::{self, PersistMethod};
use crate::stats::DeviceStats;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::panic::Location;
use std::path::{Path, PathBuf};

/// Magic at offset 0 of every pool file.
pub const POOL_MAGIC: [u8; 8] = *b"TMEMPOOL";
/// The pool format version this build reads and writes.
pub const POOL_VERSION: u32 = 1;
/// Size of the header, which is also the offset of the data area.
pub const HEADER_SIZE: u64 = 4096;
/// Maximum length of a pool tag in bytes.
pub const TAG_MAX: usize = 32;
/// Byte offset of the checksum field in the header.
pub const CHECKSUM_OFFSET: u64 = 112;
/// Header flag: the pool was created group-shared (mode 0660).
pub const FLAG_GROUP_SHARED: u64 = 1;
/// Environment variable naming the default pool directory.
pub const DIR_ENV: &str = "TIERMEM_DIR";
/// Default pool directory when `TIERMEM_DIR` is unset.
pub const DEFAULT_DIR: &str = "/dev/shm/tiermem";

const MAP_SYNC: libc::c_int = 0x80000;
const HUGETLBFS_MAGIC: libc::c_long = 0x958458f6;

/// What a pool emulates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum PoolKind {
    /// Byte-addressable non-volatile memory local to one host.
    #[default]
    Nvm,
    /// Fabric-attached memory shared by processes and hosts.
    Fam,
}

impl PoolKind {
    /// The delay model experiments should use for this kind (`nvmm` for NVM, `pcm-fam` for FAM).
    /// Pools never apply it by default: the default delay is none.
    pub fn suggested_delay(self) -> DelayModel {
        match self {
            PoolKind::Nvm => DelayModel::NVMM,
            PoolKind::Fam => DelayModel::PCM_FAM,
        }
    }

    fn to_raw(self) -> u32 {
        match self {
            PoolKind::Nvm => 1,
            PoolKind::Fam => 2,
        }
    }

    fn from_raw(v: u32) -> Option<Self> {
        match v {
            1 => Some(PoolKind::Nvm),
            2 => Some(PoolKind::Fam),
            _ => None,
        }
    }
}

/// Parse a byte count as people write memory sizes: `4096`, `64K`, `64M`, `64MiB`, `1G`, `2GB`,
/// `1T` (K/M/G/T and their KB/KiB spellings are powers of 1024, case-insensitive). Errors on an
/// empty number, an unknown unit or a value that overflows 64 bits.
pub fn parse_size(s: &str) -> Result<u64> {
    let bad = |why: &str| MediaError::InvalidArgument(format!("'{s}' is not a size: {why}"));
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad("no number"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(bad("unknown size unit (use K, M, G, T)")),
    };
    n.checked_mul(mult).ok_or_else(|| bad("overflows 64 bits"))
}

/// The directory pools go to by default: `$TIERMEM_DIR` when set, else the shared
/// `/dev/shm/tiermem` when this user can write it (or create it), else the per-user
/// [`user_dir`] (`/dev/shm/tiermem-<uid>`) — so that a normal user is not stuck on a shared
/// directory root created. Looks only; [`ensure_default_dir`] creates it.
pub fn default_dir() -> PathBuf {
    match std::env::var_os(DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ if shared_dir_usable(Path::new(DEFAULT_DIR)) => PathBuf::from(DEFAULT_DIR),
        _ => user_dir(),
    }
}

/// The per-user fallback pool directory, `/dev/shm/tiermem-<effective uid>`.
pub fn user_dir() -> PathBuf {
    PathBuf::from(format!("{DEFAULT_DIR}-{}", euid()))
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether this process (its effective ids) may write and search `path`.
fn writable(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: faccessat with a NUL-terminated path; it only reads the path.
    unsafe {
        libc::faccessat(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::W_OK | libc::X_OK,
            libc::AT_EACCESS,
        ) == 0
    }
}

/// The shared default directory is usable: a directory this user can write, or absent with a
/// parent this user can create it in.
fn shared_dir_usable(dir: &Path) -> bool {
    match std::fs::metadata(dir) {
        Ok(m) => m.is_dir() && writable(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            dir.parent().is_some_and(|p| p.is_dir() && writable(p))
        }
        Err(_) => false,
    }
}

/// Make sure [`default_dir`] exists and return it. `$TIERMEM_DIR` is created (mode 0755,
/// parents included) if missing; otherwise the shared `/dev/shm/tiermem` is used, or created
/// (mode 0755), when this user can write it, else the per-user `/dev/shm/tiermem-<uid>` (created
/// mode 0755; an existing one must be a directory owned by this user that no one else can write).
/// Errors: the path exists but is not a directory, or [`MediaError::NoPoolDirectory`] when
/// neither default directory is usable (saying why for both).
pub fn ensure_default_dir() -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(d) = std::env::var_os(DIR_ENV).filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(d);
        if !dir.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&dir)
                .map_err(|e| MediaError::from_io("create directory", &dir, e))?;
        }
        return Ok(dir);
    }
    ensure_default_in(PathBuf::from(DEFAULT_DIR), user_dir())
}

/// [`ensure_default_dir`] without `$TIERMEM_DIR`, for a given shared and per-user directory.
fn ensure_default_in(shared: PathBuf, user: PathBuf) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let shared_why = match std::fs::DirBuilder::new().mode(0o755).create(&shared) {
        Ok(()) => return Ok(shared),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if !shared.is_dir() {
                "exists but is not a directory".to_string()
            } else if writable(&shared) {
                return Ok(shared);
            } else {
                format!("is not writable by uid {}{}", euid(), owner_mode(&shared))
            }
        }
        Err(e) => format!("cannot be created: {e}"),
    };
    let user_why = match std::fs::DirBuilder::new().mode(0o755).create(&user) {
        Ok(()) => return Ok(user),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            use std::os::unix::fs::MetadataExt;
            match std::fs::symlink_metadata(&user) {
                Ok(m) if !m.is_dir() => "exists but is not a directory".to_string(),
                Ok(m) if m.uid() != euid() => {
                    format!("exists but belongs to someone else{}", owner_mode(&user))
                }
                Ok(m) if m.mode() & 0o022 != 0 => {
                    format!("is writable by others{}: chmod go-w it", owner_mode(&user))
                }
                Ok(_) => return Ok(user),
                Err(e) => format!("cannot be inspected: {e}"),
            }
        }
        Err(e) => format!("cannot be created: {e}"),
    };
    Err(MediaError::NoPoolDirectory {
        shared,
        shared_why,
        user,
        user_why,
    })
}

/// ` (owner uid U, mode 0755)` for messages, or nothing when the path cannot be read.
fn owner_mode(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| format!(" (owner uid {}, mode {:04o})", m.uid(), m.mode() & 0o7777))
        .unwrap_or_default()
}

/// Options for [`Pool::create`].
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Total file size in bytes, header included: a multiple of the page size, at least two
    /// pages. Default 64 MiB.
    pub size: u64,
    /// What the pool emulates. Default NVM.
    pub kind: PoolKind,
    /// Create the file 0660 instead of 0600 (enforced regardless of umask).
    pub group_shared: bool,
    /// Delay model; `None` means `TIERMEM_DELAY`, else no delay.
    pub delay: Option<DelayModel>,
    /// Subsystem label stored in the header, at most 32 bytes of UTF-8.
    pub tag: String,
    /// Attach the pool to this crash-model domain.
    pub domain: Option<PowerDomain>,
    /// Allocate the file's blocks at creation (`posix_fallocate` of the whole size; the
    /// default). With `false` the data area is left sparse (no free-space check: the file
    /// takes space as it is reserved) and the owner calls [`Pool::reserve`] on each range before its first write there: a
    /// store into an unallocated page of a full file system would raise `SIGBUS` instead of an
    /// error. Allocating 400 MB of tmpfs up front costs ~110 ms here.
    pub reserve_all: bool,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            size: 64 << 20,
            kind: PoolKind::Nvm,
            group_shared: false,
            delay: None,
            tag: String::new(),
            domain: None,
            reserve_all: true,
        }
    }
}

impl PoolOptions {
    /// Default options with the given total size.
    pub fn new(size: u64) -> Self {
        PoolOptions {
            size,
            ..Self::default()
        }
    }
    /// Set the kind.
    pub fn kind(mut self, kind: PoolKind) -> Self {
        self.kind = kind;
        self
    }
    /// Set group sharing (mode 0660).
    pub fn group_shared(mut self, yes: bool) -> Self {
        self.group_shared = yes;
        self
    }
    /// Set the delay model.
    pub fn delay(mut self, d: DelayModel) -> Self {
        self.delay = Some(d);
        self
    }
    /// Set the tag.
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = tag.into();
        self
    }
    /// Attach to a crash-model domain.
    pub fn domain(mut self, d: &PowerDomain) -> Self {
        self.domain = Some(d.clone());
        self
    }
    /// Set [`PoolOptions::reserve_all`].
    pub fn reserve_all(mut self, yes: bool) -> Self {
        self.reserve_all = yes;
        self
    }
}

/// Options for [`Pool::open`].
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Delay model; `None` means `TIERMEM_DELAY`, else no delay.
    pub delay: Option<DelayModel>,
    /// Attach the pool to this crash-model domain.
    pub domain: Option<PowerDomain>,
    /// Map read-write (default) or read-only; mutating calls on a read-only pool fail with
    /// [`MediaError::ReadOnly`].
    pub writable: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            delay: None,
            domain: None,
            writable: true,
        }
    }
}

impl OpenOptions {
    /// Set the delay model.
    pub fn delay(mut self, d: DelayModel) -> Self {
        self.delay = Some(d);
        self
    }
    /// Attach to a crash-model domain.
    pub fn domain(mut self, d: &PowerDomain) -> Self {
        self.domain = Some(d.clone());
        self
    }
    /// Read-write or read-only.
    pub fn writable(mut self, yes: bool) -> Self {
        self.writable = yes;
        self
    }
}

/// A decoded pool header (a plain copy; changing it changes nothing on disk).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolHeader {
    /// Format version.
    pub version: u32,
    /// Pool kind.
    pub kind: PoolKind,
    /// Header size in bytes.
    pub header_size: u64,
    /// Whole file size in bytes.
    pub pool_size: u64,
    /// File offset of the data area.
    pub data_offset: u64,
    /// Size of the data area.
    pub data_size: u64,
    /// Random identity assigned at creation.
    pub uuid: [u8; 16],
    /// Creation time in ns since the Unix epoch.
    pub created_unix_ns: u64,
    /// Flags (`FLAG_GROUP_SHARED`).
    pub flags: u64,
    /// Subsystem label.
    pub tag: String,
    /// Stored CRC-32.
    pub checksum: u32,
}

impl PoolHeader {
    /// Encode into a full header page, computing and storing the checksum.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_SIZE as usize];
        b[0..8].copy_from_slice(&POOL_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.kind.to_raw().to_le_bytes());
        b[16..24].copy_from_slice(&self.header_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.pool_size.to_le_bytes());
        b[32..40].copy_from_slice(&self.data_offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.data_size.to_le_bytes());
        b[48..64].copy_from_slice(&self.uuid);
        b[64..72].copy_from_slice(&self.created_unix_ns.to_le_bytes());
        b[72..80].copy_from_slice(&self.flags.to_le_bytes());
        let t = self.tag.as_bytes();
        let n = t.len().min(TAG_MAX);
        b[80..80 + n].copy_from_slice(&t[..n]);
        let c = crc32fast::hash(&b);
        b[112..116].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Decode and validate a header page read from `path`: magic, version, checksum and layout.
    /// Does not compare against the file size (see [`Pool::open`]).
    pub fn decode(path: &Path, b: &[u8]) -> Result<PoolHeader> {
        let not_a_pool = |reason: &str| MediaError::NotAPool {
            path: path.to_path_buf(),
            reason: reason.into(),
        };
        if b.len() < HEADER_SIZE as usize {
            return Err(not_a_pool(&format!(
                "file is {} bytes, smaller than the {HEADER_SIZE}-byte header",
                b.len()
            )));
        }
        if b[0..8] != POOL_MAGIC {
            return Err(not_a_pool("bad magic (expected \"TMEMPOOL\" at offset 0)"));
        }
        // cannot fail: every offset below is a constant < HEADER_SIZE - 8 ≤ b.len() (checked
        // above), and a 4- (8-, 16-) byte slice converts to a 4- (8-, 16-) byte array.
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let version = u32_at(8);
        if version != POOL_VERSION {
            return Err(MediaError::VersionMismatch {
                path: path.to_path_buf(),
                found: version,
                supported: POOL_VERSION,
            });
        }
        let stored = u32_at(112);
        let mut copy = b[..HEADER_SIZE as usize].to_vec();
        copy[112..116].fill(0);
        let computed = crc32fast::hash(&copy);
        if stored != computed {
            return Err(MediaError::Corrupt {
                path: path.to_path_buf(),
                offset: CHECKSUM_OFFSET,
                stored,
                computed,
            });
        }
        let kind = PoolKind::from_raw(u32_at(12))
            .ok_or_else(|| not_a_pool(&format!("unknown pool kind {}", u32_at(12))))?;
        let tag_raw = &b[80..112];
        let tag_len = tag_raw.iter().position(|&c| c == 0).unwrap_or(TAG_MAX);
        let tag = std::str::from_utf8(&tag_raw[..tag_len])
            .map_err(|_| not_a_pool("tag is not UTF-8"))?
            .to_string();
        let h = PoolHeader {
            version,
            kind,
            header_size: u64_at(16),
            pool_size: u64_at(24),
            data_offset: u64_at(32),
            data_size: u64_at(40),
            uuid: b[48..64].try_into().expect("16 bytes"),
            created_unix_ns: u64_at(64),
            flags: u64_at(72),
            tag,
            checksum: stored,
        };
        if h.header_size != HEADER_SIZE
            || h.data_offset != HEADER_SIZE
            || h.data_offset.checked_add(h.data_size) != Some(h.pool_size)
        {
            return Err(not_a_pool(&format!(
                "inconsistent layout (header {} bytes, data at {} for {} bytes, pool {} bytes)",
                h.header_size, h.data_offset, h.data_size, h.pool_size
            )));
        }
        Ok(h)
    }
}

/// A mapped NVM or FAM pool. Send + Sync: all methods take `&self`; concurrent writers to
/// overlapping ranges race as they would on real memory (the caller must order them).
pub struct Pool {
    path: PathBuf,
    fd: OwnedFd,
    map: *mut u8,
    map_len: usize,
    header: PoolHeader,
    method: PersistMethod,
    writable: bool,
    delay: DelayCell,
    /// Bulk reads and writes paced in aggregate ([`Pool::charge_read_paced`] and write).
    read_pacer: crate::Pacer,
    write_pacer: crate::Pacer,
    stats: DeviceStats,
    domain: Option<(PowerDomain, u64, u64)>,
    /// Deferred flushes of an msync-backed pool wait for [`Pool::sync_deferred`]; the mutex
    /// makes a concurrent caller wait for an fdatasync in progress rather than return early.
    deferred: parking_lot::Mutex<()>,
    pending: std::sync::atomic::AtomicBool,
}

// SAFETY: the raw mapping pointer is owned by the Pool for its whole life and only unmapped in
// Drop; all shared-state mutation goes through atomics (stats, delay) or the domain's mutex.
// Accesses to the mapped bytes are the caller's to order, exactly like shared memory.
unsafe impl Send for Pool {}
// SAFETY: see above.
unsafe impl Sync for Pool {}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("path", &self.path)
            .field("kind", &self.header.kind)
            .field("data_len", &self.header.data_size)
            .field("method", &self.method)
            .field("writable", &self.writable)
            .finish()
    }
}

fn cpath(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        MediaError::InvalidArgument(format!("path {} contains a NUL byte", path.display()))
    })
}

fn last_err() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn getrandom16() -> [u8; 16] {
    let mut u = [0u8; 16];
    let mut got = 0;
    while got < 16 {
        // SAFETY: writing at most 16 - got bytes into the remaining part of `u`.
        let n = unsafe { libc::getrandom(u.as_mut_ptr().add(got) as *mut _, 16 - got, 0) };
        if n > 0 {
            got += n as usize;
        } else if last_err().raw_os_error() != Some(libc::EINTR) {
            // getrandom cannot fail on Linux ≥ 3.17 except EINTR; fall back to time + pid.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let x = t ^ ((std::process::id() as u128) << 64);
            return x.to_le_bytes();
        }
    }
    u
}

/// Map `len` bytes of `fd` shared, preferring a synchronous DAX mapping. Returns the mapping and
/// the persist method for it.
fn map_file(
    fd: RawFd,
    len: usize,
    writable: bool,
    path: &Path,
) -> Result<(*mut u8, PersistMethod)> {
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: mapping a file descriptor we own; the result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED_VALIDATE | MAP_SYNC,
            fd,
            0,
        )
    };
    if p != libc::MAP_FAILED {
        return Ok((p as *mut u8, PersistMethod::DaxSync));
    }
    let e = last_err();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => {}
        _ => return Err(MediaError::from_io("mmap", path, e)),
    }
    // SAFETY: as above, without MAP_SYNC.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(MediaError::from_io("mmap", path, last_err()));
    }
    // SAFETY: zeroed statfs is a valid out-buffer.
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open, sf is a valid out-pointer.
    let rc = unsafe { libc::fstatfs(fd, &mut sf) };
    let method = if rc == 0 && (sf.f_type == libc::TMPFS_MAGIC || sf.f_type == HUGETLBFS_MAGIC) {
        PersistMethod::CacheFlush
    } else {
        PersistMethod::Msync
    };
    Ok((p as *mut u8, method))
}

/// Removes a half-created file unless disarmed.
struct RemoveOnDrop<'a>(Option<&'a Path>);
impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn available_bytes(fd: RawFd) -> Option<u64> {
    // SAFETY: zeroed statvfs is a valid out-buffer.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open, sv a valid out-pointer.
    if unsafe { libc::fstatvfs(fd, &mut sv) } == 0 {
        Some(sv.f_bavail as u64 * sv.f_frsize as u64)
    } else {
        None
    }
}

impl Pool {
    /// Create a new pool file at `path` and map it.
    ///
    /// Checks, in order: tag length, size (a page multiple of at least two pages), that the
    /// directory exists ([`MediaError::MissingDirectory`]; the default directory is created only
    /// by [`ensure_default_dir`]), exclusive creation ([`MediaError::AlreadyExists`]), free space
    /// (statvfs, then posix_fallocate; [`MediaError::NoSpace`], and the partial file is removed).
    /// The file gets mode 0600 (0660 if `group_shared`) regardless of umask. The header is
    /// written and persisted (plus fsync on block-backed files) before this returns; on failure
    /// no file is left behind.
    #[track_caller]
    pub fn create(path: impl AsRef<Path>, opts: &PoolOptions) -> Result<Pool> {
        let caller = Location::caller();
        let path = path.as_ref();
        if opts.tag.len() > TAG_MAX {
            return Err(MediaError::InvalidArgument(format!(
                "pool tag {:?} is {} bytes; at most {TAG_MAX} are allowed",
                opts.tag,
                opts.tag.len()
            )));
        }
        if opts.tag.contains('\0') {
            return Err(MediaError::InvalidArgument(
                "pool tag must not contain NUL".into(),
            ));
        }
        let page = persist::page_size() as u64;
        if opts.size % page != 0 {
            return Err(MediaError::InvalidSize {
                size: opts.size,
                reason: format!("pool size must be a multiple of the {page}-byte page size"),
            });
        }
        if opts.size < 2 * page || opts.size < 2 * HEADER_SIZE {
            return Err(MediaError::InvalidSize { size: opts.size, reason: format!("pool size must be at least two pages ({} bytes): one header page and one data page", 2 * page) });
        }
        if opts.size > isize::MAX as u64 {
            return Err(MediaError::InvalidSize {
                size: opts.size,
                reason: "pool size exceeds the address space".into(),
            });
        }
        let dir = parent_dir(path);
        if !dir.is_dir() {
            return Err(MediaError::MissingDirectory { path: dir });
        }
        let delay = match opts.delay {
            Some(d) => d,
            None => DelayModel::from_env()?,
        };
        let c = cpath(path)?;
        let mode: libc::mode_t = if opts.group_shared { 0o660 } else { 0o600 };
        // SAFETY: c is a valid NUL-terminated path; the returned fd is checked.
        let raw = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if raw < 0 {
            return Err(MediaError::from_io("create", path, last_err()));
        }
        // SAFETY: raw is a freshly opened descriptor we exclusively own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut cleanup = RemoveOnDrop(Some(path));
        // SAFETY: fd is open.
        if unsafe { libc::fchmod(fd.as_raw_fd(), mode) } != 0 {
            return Err(MediaError::from_io("fchmod", path, last_err()));
        }
        let available = available_bytes(fd.as_raw_fd());
        // A sparse pool takes space as its owner reserves it: only a preallocated one must
        // fit now.
        if let Some(avail) = available.filter(|_| opts.reserve_all) {
            if opts.size > avail {
                return Err(MediaError::NoSpace {
                    path: path.to_path_buf(),
                    requested: opts.size,
                    available: avail,
                });
            }
        }
        // The header page always; the rest now or, without `reserve_all`, by `reserve`.
        let now = if opts.reserve_all {
            opts.size
        } else {
            HEADER_SIZE
        };
        // SAFETY: fd is open; posix_fallocate returns an errno value instead of setting errno.
        let rc = unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, now as libc::off_t) };
        if rc == 0 && now < opts.size {
            // SAFETY: fd is open.
            if unsafe { libc::ftruncate(fd.as_raw_fd(), opts.size as libc::off_t) } != 0 {
                return Err(MediaError::from_io("ftruncate", path, last_err()));
            }
        }
        match rc {
            0 => {}
            libc::ENOSPC | libc::EFBIG => {
                return Err(MediaError::NoSpace {
                    path: path.to_path_buf(),
                    requested: opts.size,
                    available: available_bytes(fd.as_raw_fd()).or(available).unwrap_or(0),
                })
            }
            libc::EOPNOTSUPP | libc::EINVAL => {
                // File system without fallocate: size the file sparsely instead.
                // SAFETY: fd is open.
                if unsafe { libc::ftruncate(fd.as_raw_fd(), opts.size as libc::off_t) } != 0 {
                    return Err(MediaError::from_io("ftruncate", path, last_err()));
                }
            }
            e => {
                return Err(MediaError::from_io(
                    "posix_fallocate",
                    path,
                    std::io::Error::from_raw_os_error(e),
                ))
            }
        }
        let (map, method) = map_file(fd.as_raw_fd(), opts.size as usize, true, path)?;
        let header = PoolHeader {
            version: POOL_VERSION,
            kind: opts.kind,
            header_size: HEADER_SIZE,
            pool_size: opts.size,
            data_offset: HEADER_SIZE,
            data_size: opts.size - HEADER_SIZE,
            uuid: getrandom16(),
            created_unix_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
            flags: if opts.group_shared {
                FLAG_GROUP_SHARED
            } else {
                0
            },
            tag: opts.tag.clone(),
            checksum: 0,
        };
        let mut pool = Pool {
            path: path.to_path_buf(),
            fd,
            map,
            map_len: opts.size as usize,
            header,
            method,
            writable: true,
            delay: DelayCell::new(delay),
            read_pacer: crate::Pacer::new(),
            write_pacer: crate::Pacer::new(),
            stats: DeviceStats::new(),
            deferred: parking_lot::Mutex::new(()),
            pending: std::sync::atomic::AtomicBool::new(false),
            domain: None,
        };
        if let Some(d) = &opts.domain {
            let (id, h) = d.attach(path, map, pool.map_len);
            pool.domain = Some((d.clone(), id, h));
        }
        let bytes = pool.header.encode();
        // cannot fail: `encode` returns HEADER_SIZE bytes; a 4-byte slice is a 4-byte array.
        pool.header.checksum = u32::from_le_bytes(bytes[112..116].try_into().expect("4 bytes"));
        // SAFETY: the mapping is at least HEADER_SIZE bytes long; bytes is a separate Vec.
        unsafe { persist::nt_copy_nofence(pool.map, bytes.as_ptr(), bytes.len()) };
        pool.note_stores(0, HEADER_SIZE);
        pool.persist_file_range(0, HEADER_SIZE, caller)?;
        if pool.method == PersistMethod::Msync {
            // SAFETY: fd is open.
            if unsafe { libc::fsync(pool.fd.as_raw_fd()) } != 0 {
                return Err(MediaError::from_io("fsync", path, last_err()));
            }
            if let Ok(dirf) = std::fs::File::open(&dir) {
                let _ = dirf.sync_all();
            }
        }
        cleanup.0 = None;
        Ok(pool)
    }

    /// Open and validate an existing pool, then map it.
    ///
    /// Errors: [`MediaError::NotFound`]/[`MediaError::MissingDirectory`],
    /// [`MediaError::PermissionDenied`], [`MediaError::NotAPool`] (not a regular file, smaller
    /// than the header, bad magic, bad layout), [`MediaError::VersionMismatch`],
    /// [`MediaError::Corrupt`] (checksum), [`MediaError::SizeMismatch`] (header size ≠ file
    /// size), [`MediaError::InvalidDelayModel`] (bad `TIERMEM_DELAY`).
    pub fn open(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<Pool> {
        let path = path.as_ref();
        let c = cpath(path)?;
        let flags = if opts.writable {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        };
        // SAFETY: c is a valid NUL-terminated path; the returned fd is checked.
        let raw = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
        if raw < 0 {
            let e = last_err();
            if e.raw_os_error() == Some(libc::EISDIR) {
                return Err(MediaError::NotAPool {
                    path: path.to_path_buf(),
                    reason: "it is a directory".into(),
                });
            }
            return Err(MediaError::from_io("open", path, e));
        }
        // SAFETY: raw is a freshly opened descriptor we exclusively own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let file = std::fs::File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| MediaError::from_io("fstat", path, e))?;
        if !meta.file_type().is_file() {
            return Err(MediaError::NotAPool {
                path: path.to_path_buf(),
                reason: "not a regular file".into(),
            });
        }
        let file_size = meta.len();
        if file_size < HEADER_SIZE {
            return Err(MediaError::NotAPool {
                path: path.to_path_buf(),
                reason: format!(
                    "file is {file_size} bytes, smaller than the {HEADER_SIZE}-byte header"
                ),
            });
        }
        let mut hbuf = vec![0u8; HEADER_SIZE as usize];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut hbuf, 0)
            .map_err(|e| MediaError::from_io("read header", path, e))?;
        let header = PoolHeader::decode(path, &hbuf)?;
        if header.pool_size != file_size {
            return Err(MediaError::SizeMismatch {
                path: path.to_path_buf(),
                header_size: header.pool_size,
                file_size,
            });
        }
        if header.pool_size > isize::MAX as u64 {
            return Err(MediaError::NotAPool {
                path: path.to_path_buf(),
                reason: "pool size exceeds the address space".into(),
            });
        }
        let delay = match opts.delay {
            Some(d) => d,
            None => DelayModel::from_env()?,
        };
        let fd = OwnedFd::from(file);
        let (map, method) = map_file(
            fd.as_raw_fd(),
            header.pool_size as usize,
            opts.writable,
            path,
        )?;
        let mut pool = Pool {
            path: path.to_path_buf(),
            fd,
            map,
            map_len: header.pool_size as usize,
            header,
            method,
            writable: opts.writable,
            delay: DelayCell::new(delay),
            read_pacer: crate::Pacer::new(),
            write_pacer: crate::Pacer::new(),
            stats: DeviceStats::new(),
            deferred: parking_lot::Mutex::new(()),
            pending: std::sync::atomic::AtomicBool::new(false),
            domain: None,
        };
        if let Some(d) = &opts.domain {
            let (id, h) = d.attach(path, map, pool.map_len);
            pool.domain = Some((d.clone(), id, h));
        }
        Ok(pool)
    }

    /// Remove the pool file at `path` after checking that it is a tiermem pool (regular file
    /// with the pool magic; a corrupt or version-mismatched pool can still be removed). Refuses
    /// other files with [`MediaError::NotAPool`].
    pub fn remove(path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| MediaError::from_io("open", path, e))?;
        let meta = file
            .metadata()
            .map_err(|e| MediaError::from_io("fstat", path, e))?;
        if !meta.file_type().is_file() {
            return Err(MediaError::NotAPool {
                path: path.to_path_buf(),
                reason: "not a regular file".into(),
            });
        }
        let mut magic = [0u8; 8];
        if meta.len() < 8
            || std::os::unix::fs::FileExt::read_exact_at(&file, &mut magic, 0).is_err()
            || magic != POOL_MAGIC
        {
            return Err(MediaError::NotAPool {
                path: path.to_path_buf(),
                reason: "bad magic; refusing to remove it".into(),
            });
        }
        std::fs::remove_file(path).map_err(|e| MediaError::from_io("remove", path, e))
    }

    /// Allocate the file's blocks under data range `[off, off + len)` (`posix_fallocate`), so
    /// that stores there cannot fail for lack of space; for pools created without
    /// [`PoolOptions::reserve_all`] (a no-op cost otherwise: the blocks are there). Contents
    /// are unchanged. [`MediaError::NoSpace`] when the file system is full; on a file system
    /// without fallocate, nothing is done.
    pub fn reserve(&self, off: u64, len: usize) -> Result<()> {
        self.check_writable()?;
        self.check(off, len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: fd is open; posix_fallocate returns an errno value instead of setting errno.
        let rc = unsafe {
            libc::posix_fallocate(
                self.fd.as_raw_fd(),
                (HEADER_SIZE + off) as libc::off_t,
                len as libc::off_t,
            )
        };
        match rc {
            0 | libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
            libc::ENOSPC | libc::EFBIG => Err(MediaError::NoSpace {
                path: self.path.clone(),
                requested: len as u64,
                available: available_bytes(self.fd.as_raw_fd()).unwrap_or(0),
            }),
            e => Err(MediaError::from_io(
                "posix_fallocate",
                &self.path,
                std::io::Error::from_raw_os_error(e),
            )),
        }
    }

    /// Back every page of the data area now (`MADV_POPULATE_WRITE` of the mapping, Linux ≥
    /// 5.14), so that later stores into it cost a store rather than a page allocation: on a
    /// memory file system `posix_fallocate` reserves pages without clearing them, and a VM's
    /// host may not back guest memory until its first use. Contents are unchanged. On a
    /// block-backed file this dirties the page cache: meant for memory-backed pools. Errors:
    /// a read-only pool ([`MediaError::InvalidArgument`]), the `madvise` failing (e.g. ENOMEM).
    pub fn populate(&self) -> Result<()> {
        if !self.writable {
            return Err(MediaError::InvalidArgument(format!(
                "{} is open read-only: it cannot be populated for writing",
                self.path.display()
            )));
        }
        // SAFETY: the data area is a live, writable shared mapping of data_len bytes starting at
        // a page boundary (after the 4 KiB header).
        unsafe { crate::memory::populate_write(self.data_ptr(), self.data_len()) }
            .map_err(|e| MediaError::from_io("madvise(MADV_POPULATE_WRITE)", &self.path, e))
    }

    /// [`Pool::populate`] of data range `[off, off + len)` only (page-aligned outward), on a
    /// memory-backed pool (`CacheFlush`); nothing on a block-backed one (`Msync`, where it
    /// would dirty the page cache with zeros) or a DAX mapping. A range about to be written for
    /// the first time then costs one system call instead of a page fault per page. Errors: a
    /// read-only pool, out of range, the `madvise` failing.
    pub fn populate_range(&self, off: u64, len: usize) -> Result<()> {
        self.check_writable()?;
        self.check(off, len)?;
        if len == 0 || self.method != PersistMethod::CacheFlush {
            return Ok(());
        }
        const PAGE: usize = 4096;
        let map_end = (HEADER_SIZE as usize + self.data_len()).div_ceil(PAGE) * PAGE;
        let start = (HEADER_SIZE + off) as usize / PAGE * PAGE;
        let end = ((HEADER_SIZE as usize + off as usize + len).div_ceil(PAGE) * PAGE).min(map_end);
        // SAFETY: a page-aligned range inside the live, writable shared mapping (checked
        // above; the mapping's length is a multiple of the page size).
        unsafe { crate::memory::populate_write(self.map.add(start), end - start) }
            .map_err(|e| MediaError::from_io("madvise(MADV_POPULATE_WRITE)", &self.path, e))
    }

    // ---- accessors ---------------------------------------------------------------------------

    /// Start of the data area (just after the header) in this process's mapping. Valid for
    /// [`Pool::data_len`] bytes while the pool lives; never store it persistently. Writes through
    /// it are durable only after [`Pool::persist`] (or flush + fence) of the range, and are
    /// charged no delay unless the caller uses [`Pool::charge_write`].
    pub fn data_ptr(&self) -> *mut u8 {
        // SAFETY: the mapping is at least HEADER_SIZE + one page long.
        unsafe { self.map.add(HEADER_SIZE as usize) }
    }
    /// Length of the data area in bytes.
    pub fn data_len(&self) -> usize {
        self.header.data_size as usize
    }
    /// The pool's kind (from the header).
    pub fn kind(&self) -> PoolKind {
        self.header.kind
    }
    /// The path the pool was created or opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The pool's uuid (from the header).
    pub fn uuid(&self) -> [u8; 16] {
        self.header.uuid
    }
    /// The pool's tag (from the header).
    pub fn tag(&self) -> &str {
        &self.header.tag
    }
    /// A copy of the decoded header.
    pub fn header(&self) -> PoolHeader {
        self.header.clone()
    }
    /// How this mapping persists data (detected at map time).
    pub fn medium(&self) -> PersistMethod {
        self.method
    }
    /// Same as [`Pool::medium`].
    pub fn persist_method(&self) -> PersistMethod {
        self.method
    }
    /// True when mapped read-write.
    pub fn is_writable(&self) -> bool {
        self.writable
    }
    /// The open file descriptor of the pool file (owned by the pool).
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
    /// The id of this pool in its crash-model domain, if attached.
    pub fn domain_id(&self) -> Option<u64> {
        self.domain.as_ref().map(|(_, id, _)| *id)
    }
    /// The current delay model.
    pub fn delay(&self) -> DelayModel {
        self.delay.get()
    }
    /// Replace the delay model (takes effect for subsequent accesses, from any thread).
    pub fn set_delay(&self, d: DelayModel) {
        self.delay.set(d)
    }
    /// The access counters.
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    // ---- access ------------------------------------------------------------------------------

    fn check(&self, off: u64, len: usize) -> Result<()> {
        let end = off.checked_add(len as u64);
        match end {
            Some(e) if e <= self.header.data_size => Ok(()),
            _ => Err(MediaError::OutOfBounds {
                offset: off,
                len: len as u64,
                limit: self.header.data_size,
                what: "pool data area",
            }),
        }
    }

    fn check_writable(&self) -> Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(MediaError::ReadOnly {
                path: self.path.clone(),
            })
        }
    }

    fn note_stores(&self, file_off: u64, len: u64) {
        if let Some((d, id, _)) = &self.domain {
            d.note_flush(*id, file_off, len);
        }
    }

    fn persist_file_range(
        &self,
        file_off: u64,
        len: u64,
        caller: &'static Location<'static>,
    ) -> Result<()> {
        // SAFETY: callers bounds-check [file_off, file_off + len) against the mapping.
        unsafe {
            self.method
                .persist(self.map.add(file_off as usize), len as usize)
        }
        .map_err(|e| MediaError::from_io("msync", &self.path, e))?;
        self.stats.record_persist();
        if let Some((d, id, _)) = &self.domain {
            d.note_flush(*id, file_off, len);
            d.note_fence(*id, caller);
        }
        Ok(())
    }

    /// Copy `buf.len()` bytes at data offset `off` into `buf`, then charge the read delay and
    /// count the read. Out-of-range requests fail with [`MediaError::OutOfBounds`].
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.check(off, buf.len())?;
        // SAFETY: bounds-checked range of the live mapping; buf is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.data_ptr().add(off as usize),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        self.charge_read(buf.len() as u64);
        Ok(())
    }

    /// Copy `buf.len()` bytes at data offset `off` into `buf` with `pread(2)` of the file
    /// rather than through this process's mapping: the kernel copies from the file's pages, so
    /// no page-table entry is built here for the range (a bulk read of a pool mapped but not
    /// otherwise touched by this process). Charges no delay and counts no read: the caller
    /// charges it ([`Pool::charge_read_paced`]). Errors: out of range ([`MediaError::OutOfBounds`]), the read failing or ending
    /// early.
    pub fn pread_uncharged(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.check(off, buf.len())?;
        crate::ssd::pread_exact(self.fd.as_raw_fd(), buf, HEADER_SIZE + off, &self.path)
    }

    /// Store `data` at data offset `off` with non-temporal stores (the unaligned edges with
    /// ordinary stores and a cache-line write-back), then charge the write delay and count the
    /// write. The data is **not** guaranteed durable — and the crash model does not make it
    /// durable — until a later [`Pool::fence`], [`Pool::persist`] or [`Pool::write_persist`]
    /// (for msync-backed pools, [`Pool::persist`] of the range).
    pub fn write(&self, off: u64, data: &[u8]) -> Result<()> {
        self.write_many(&[(off, data)])
    }

    /// [`Pool::write`] of several ranges, every range checked before any is written, charged
    /// and counted as one write of their total length: the non-temporal stores of a batch of
    /// small writes (a checkpoint's records) pipeline, instead of each write's count, a locked
    /// add, waiting for its own stores to drain (~0.3 µs a write here). Not fenced.
    #[track_caller]
    pub fn write_many(&self, writes: &[(u64, &[u8])]) -> Result<()> {
        self.check_writable()?;
        let mut total = 0u64;
        for &(off, data) in writes {
            self.check(off, data.len())?;
            total += data.len() as u64;
        }
        for &(off, data) in writes {
            // SAFETY: bounds-checked above; the mapping is live and writable; each data slice
            // is a distinct buffer.
            unsafe {
                persist::nt_copy_nofence(
                    self.data_ptr().add(off as usize),
                    data.as_ptr(),
                    data.len(),
                )
            };
            self.note_stores(HEADER_SIZE + off, data.len() as u64);
        }
        self.charge_write(total);
        Ok(())
    }

    /// Copies within the pool, in order: each `(src, dst, len)` copies data range
    /// `[src, src+len)` to `[dst, dst+len)` with the stores of [`Pool::write`] (non-temporal,
    /// not fenced), charged and counted as one read and one write of the total. Every range is
    /// checked before anything is copied; a copy whose source and destination overlap is
    /// refused ([`MediaError::InvalidArgument`]). Saves the bounce through a DRAM buffer of a
    /// [`Pool::read`] then [`Pool::write`] (a redo log applied to its image).
    #[track_caller]
    pub fn copy_many(&self, copies: &[(u64, u64, usize)]) -> Result<()> {
        self.check_writable()?;
        let mut total = 0u64;
        for &(src, dst, len) in copies {
            self.check(src, len)?;
            self.check(dst, len)?;
            if src < dst + len as u64 && dst < src + len as u64 && len > 0 {
                return Err(MediaError::InvalidArgument(format!(
                    "copy_many: source {src:#x}+{len} overlaps destination {dst:#x}"
                )));
            }
            total += len as u64;
        }
        for &(src, dst, len) in copies {
            // SAFETY: both ranges bounds-checked above and disjoint; the mapping is live and
            // writable.
            unsafe {
                persist::nt_copy_nofence(
                    self.data_ptr().add(dst as usize),
                    self.data_ptr().add(src as usize),
                    len,
                )
            };
            self.note_stores(HEADER_SIZE + dst, len as u64);
        }
        self.charge_read(total);
        self.charge_write(total);
        Ok(())
    }

    /// [`Pool::write`] followed by [`Pool::persist`] of the same range: durable on return.
    #[track_caller]
    pub fn write_persist(&self, off: u64, data: &[u8]) -> Result<()> {
        let caller = Location::caller();
        self.write(off, data)?;
        self.persist_file_range(HEADER_SIZE + off, data.len() as u64, caller)
    }

    /// Make data range `[off, off + len)` durable: write back its cache lines and fence
    /// (CacheFlush, DaxSync) or msync it (Msync). Covers stores made through [`Pool::data_ptr`]
    /// too.
    #[track_caller]
    pub fn persist(&self, off: u64, len: usize) -> Result<()> {
        let caller = Location::caller();
        self.check_writable()?;
        self.check(off, len)?;
        self.persist_file_range(HEADER_SIZE + off, len as u64, caller)
    }

    /// Write back the cache lines of data range `[off, off + len)` without fencing; a later
    /// [`Pool::fence`] makes them durable. On msync-backed pools this msyncs the range (durable
    /// at once, and recorded by the crash model as flush + fence).
    #[track_caller]
    pub fn flush(&self, off: u64, len: usize) -> Result<()> {
        let caller = Location::caller();
        self.check_writable()?;
        self.check(off, len)?;
        let file_off = HEADER_SIZE + off;
        if self.method == PersistMethod::Msync {
            return self.persist_file_range(file_off, len as u64, caller);
        }
        // SAFETY: bounds-checked range of the live mapping.
        unsafe { persist::flush_lines(self.map.add(file_off as usize), len) };
        self.note_stores(file_off, len as u64);
        Ok(())
    }

    /// Like [`Pool::flush`], but an msync-backed pool only notes that its file has unsynced
    /// stores; a later [`Pool::sync_deferred`] makes them durable with one `fdatasync` of the
    /// file, however many ranges were flushed this way (one device flush where one msync per
    /// range would cost one each). On cache-flush pools this is [`Pool::flush`]: the lines
    /// are written back now and the caller's own [`Pool::fence`] makes them durable (a fence
    /// orders only the flushes of the CPU that runs it).
    #[track_caller]
    pub fn flush_deferred(&self, off: u64, len: usize) -> Result<()> {
        if self.method != PersistMethod::Msync {
            return self.flush(off, len);
        }
        self.check_writable()?;
        self.check(off, len)?;
        self.pending
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.note_stores(HEADER_SIZE + off, len as u64);
        Ok(())
    }

    /// Make every range given to [`Pool::flush_deferred`] before this call durable: one
    /// `fdatasync` of the file if any is pending (msync-backed pools; a caller that arrives
    /// while another one syncs waits for it), a [`Pool::fence`] otherwise. On an fdatasync
    /// failure the ranges stay pending (a retry syncs again) and the error names the file.
    #[track_caller]
    pub fn sync_deferred(&self) -> Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.method != PersistMethod::Msync {
            self.fence();
            return Ok(());
        }
        let caller = Location::caller();
        let _g = self.deferred.lock();
        if !self.pending.swap(false, SeqCst) {
            return Ok(());
        }
        // SAFETY: fdatasync on our own open descriptor.
        if unsafe { libc::fdatasync(self.fd.as_raw_fd()) } != 0 {
            let e = std::io::Error::last_os_error();
            self.pending.store(true, SeqCst);
            return Err(MediaError::from_io("fdatasync", &self.path, e));
        }
        self.stats.record_persist();
        if let Some((d, id, _)) = &self.domain {
            d.note_fence(*id, caller);
        }
        Ok(())
    }

    /// Store fence: every earlier flush and non-temporal store (on any pool — the fence is
    /// CPU-wide) becomes durable.
    #[track_caller]
    pub fn fence(&self) {
        let caller = Location::caller();
        persist::fence();
        self.stats.record_fence();
        if let Some((d, id, _)) = &self.domain {
            d.note_fence(*id, caller);
        }
    }

    /// Charge the read delay for `bytes` bytes ([`crate::delay_ns`]: a spin, a sleep first for
    /// long ones) and count one read; for callers that access [`Pool::data_ptr`] directly.
    pub fn charge_read(&self, bytes: u64) {
        let d = self.delay.get().read_delay_ns(bytes);
        delay_ns(d);
        self.stats.record_read(bytes, d);
    }

    /// Charge the read delay for `bytes` bytes as pacing in aggregate ([`crate::Pacer`], one
    /// per pool and direction): the read that started at `since_ns` (a [`crate::now_ns`]
    /// stamp) ends no earlier than the model's `latency + bytes / bandwidth` after the pool's
    /// earlier paced reads, within one sleep margin, sleeping rather than spinning; counts one
    /// read. For bulk reads (a copy out of
    /// [`Pool::data_ptr`]) whose real copy is a sizeable part of the modelled time.
    pub fn charge_read_paced(&self, bytes: u64, since_ns: u64) {
        let d = self.delay.get().read_delay_ns(bytes);
        let waited = self.read_pacer.pace(since_ns, d);
        self.stats.record_read(bytes, waited);
    }

    /// Charge the write delay for `bytes` bytes as pacing in aggregate ([`crate::Pacer`]): as
    /// [`Pool::charge_read_paced`], for writes; counts one write. For bulk transfers whose real
    /// copy is a sizeable part of the modelled time.
    pub fn charge_write_paced(&self, bytes: u64, since_ns: u64) {
        let d = self.delay.get().write_delay_ns(bytes);
        let waited = self.write_pacer.pace(since_ns, d);
        self.stats.record_write(bytes, waited);
    }

    /// Charge the write delay for `bytes` bytes ([`crate::delay_ns`]) and count one write; for
    /// callers that access [`Pool::data_ptr`] directly.
    pub fn charge_write(&self, bytes: u64) {
        let d = self.delay.get().write_delay_ns(bytes);
        delay_ns(d);
        self.stats.record_write(bytes, d);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some((d, id, h)) = &self.domain {
            d.detach(*id, *h);
        }
        // SAFETY: unmapping exactly the mapping created in create/open; no references into it
        // outlive the Pool (data_ptr users are bound by its documented lifetime).
        unsafe { libc::munmap(self.map as *mut libc::c_void, self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A shared directory this user cannot write: root uses it anyway (it can write anything);
    /// anyone else gets the per-user directory, created 0755, and a clear error once that one is
    /// writable by others. (`scripts/test.sh` runs this binary as uid 65534 too.)
    #[test]
    fn default_dir_falls_back_to_a_per_user_directory() {
        let d = tempfile::Builder::new()
            .prefix("tiermem-defdir")
            .tempdir_in("/dev/shm")
            .unwrap();
        let shared = d.path().join("shared");
        let user = d.path().join("user");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o555)).unwrap();
        let got = ensure_default_in(shared.clone(), user.clone()).unwrap();
        if euid() == 0 {
            assert_eq!(
                got, shared,
                "root writes the shared directory whatever its mode"
            );
            return;
        }
        assert_eq!(got, user);
        assert!(user.is_dir());
        // Again: the existing per-user directory is accepted.
        assert_eq!(
            ensure_default_in(shared.clone(), user.clone()).unwrap(),
            user
        );
        // A per-user directory others can write is refused, naming both directories.
        std::fs::set_permissions(&user, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_default_in(shared.clone(), user.clone()).unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, MediaError::NoPoolDirectory { .. }), "{m}");
        assert!(
            m.contains("not writable by uid") && m.contains("writable by others"),
            "{m}"
        );
        assert!(m.contains("TIERMEM_DIR"), "{m}");
        // A shared directory that does not exist yet is created when its parent is writable.
        let fresh = d.path().join("fresh");
        assert_eq!(ensure_default_in(fresh.clone(), user).unwrap(), fresh);
        assert!(shared_dir_usable(&fresh));
        assert!(!shared_dir_usable(&shared));
    }
}
