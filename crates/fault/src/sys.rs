//! Raw userfaultfd and PAGEMAP_SCAN: uapi definitions and thin, safe wrappers.
//!
//! Debian 12's headers and the `libc` crate lack most of these definitions, so they are written
//! here from `include/uapi/linux/userfaultfd.h` and `include/uapi/linux/fs.h` (Linux 6.7+), with
//! size asserts. The constants were checked against the running 6.18 kernel by the tests in
//! `tests/sys.rs`.
//!
//! Everything in [`Uffd`] that resolves faults is async-signal-safe (one ioctl, no allocation, no
//! locks), because in-thread resolution calls it from a SIGBUS handler.

pub use crate::access::UffdAccess;
use crate::error::{Error, ResolveError, Result};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Page size this crate works with (x86-64 base pages). Checked against `sysconf` at engine start.
pub const PAGE_SIZE: usize = 4096;

// ---------------------------------------------------------------------------------------------
// ioctl number encoding (asm-generic/ioctl.h, used by x86-64).
// ---------------------------------------------------------------------------------------------

const IOC_NONE: u64 = 0;
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;

const fn ioc(dir: u64, ty: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (ty << 8) | nr
}

const UFFDIO: u64 = 0xAA;

// ---------------------------------------------------------------------------------------------
// include/uapi/linux/userfaultfd.h
// ---------------------------------------------------------------------------------------------

/// `UFFD_API`.
pub const UFFD_API: u64 = 0xAA;

/// `UFFD_USER_MODE_ONLY`: flag for userfaultfd(2) — only user-mode faults are delivered.
pub const UFFD_USER_MODE_ONLY: i32 = 1;

/// `UFFD_EVENT_PAGEFAULT`.
pub const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
/// `UFFD_EVENT_FORK`.
pub const UFFD_EVENT_FORK: u8 = 0x13;
/// `UFFD_EVENT_REMAP`.
pub const UFFD_EVENT_REMAP: u8 = 0x14;
/// `UFFD_EVENT_REMOVE`.
pub const UFFD_EVENT_REMOVE: u8 = 0x15;
/// `UFFD_EVENT_UNMAP`.
pub const UFFD_EVENT_UNMAP: u8 = 0x16;

/// `UFFD_PAGEFAULT_FLAG_WRITE`: the fault was a write.
pub const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
/// `UFFD_PAGEFAULT_FLAG_WP`: the fault is a write-protect fault.
pub const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;
/// `UFFD_PAGEFAULT_FLAG_MINOR`: the fault is a minor fault.
pub const UFFD_PAGEFAULT_FLAG_MINOR: u64 = 1 << 2;

/// `UFFD_FEATURE_PAGEFAULT_FLAG_WP`.
pub const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
/// `UFFD_FEATURE_EVENT_FORK`.
pub const UFFD_FEATURE_EVENT_FORK: u64 = 1 << 1;
/// `UFFD_FEATURE_EVENT_REMAP`.
pub const UFFD_FEATURE_EVENT_REMAP: u64 = 1 << 2;
/// `UFFD_FEATURE_EVENT_REMOVE`.
pub const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;
/// `UFFD_FEATURE_MISSING_HUGETLBFS`.
pub const UFFD_FEATURE_MISSING_HUGETLBFS: u64 = 1 << 4;
/// `UFFD_FEATURE_MISSING_SHMEM`.
pub const UFFD_FEATURE_MISSING_SHMEM: u64 = 1 << 5;
/// `UFFD_FEATURE_EVENT_UNMAP`.
pub const UFFD_FEATURE_EVENT_UNMAP: u64 = 1 << 6;
/// `UFFD_FEATURE_SIGBUS`.
pub const UFFD_FEATURE_SIGBUS: u64 = 1 << 7;
/// `UFFD_FEATURE_THREAD_ID`.
pub const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
/// `UFFD_FEATURE_MINOR_HUGETLBFS`.
pub const UFFD_FEATURE_MINOR_HUGETLBFS: u64 = 1 << 9;
/// `UFFD_FEATURE_MINOR_SHMEM`.
pub const UFFD_FEATURE_MINOR_SHMEM: u64 = 1 << 10;
/// `UFFD_FEATURE_EXACT_ADDRESS`.
pub const UFFD_FEATURE_EXACT_ADDRESS: u64 = 1 << 11;
/// `UFFD_FEATURE_WP_HUGETLBFS_SHMEM`.
pub const UFFD_FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
/// `UFFD_FEATURE_WP_UNPOPULATED`.
pub const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
/// `UFFD_FEATURE_POISON`.
pub const UFFD_FEATURE_POISON: u64 = 1 << 14;
/// `UFFD_FEATURE_WP_ASYNC`.
pub const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
/// `UFFD_FEATURE_MOVE`.
pub const UFFD_FEATURE_MOVE: u64 = 1 << 16;

/// `UFFDIO_REGISTER_MODE_MISSING`.
pub const UFFDIO_REGISTER_MODE_MISSING: u64 = 1 << 0;
/// `UFFDIO_REGISTER_MODE_WP`.
pub const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
/// `UFFDIO_REGISTER_MODE_MINOR`.
pub const UFFDIO_REGISTER_MODE_MINOR: u64 = 1 << 2;

/// `UFFDIO_COPY_MODE_DONTWAKE`.
pub const UFFDIO_COPY_MODE_DONTWAKE: u64 = 1 << 0;
/// `UFFDIO_COPY_MODE_WP`.
pub const UFFDIO_COPY_MODE_WP: u64 = 1 << 1;
/// `UFFDIO_ZEROPAGE_MODE_DONTWAKE`.
pub const UFFDIO_ZEROPAGE_MODE_DONTWAKE: u64 = 1 << 0;
/// `UFFDIO_WRITEPROTECT_MODE_WP`.
pub const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
/// `UFFDIO_WRITEPROTECT_MODE_DONTWAKE`.
pub const UFFDIO_WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;
/// `UFFDIO_CONTINUE_MODE_DONTWAKE`.
pub const UFFDIO_CONTINUE_MODE_DONTWAKE: u64 = 1 << 0;
/// `UFFDIO_CONTINUE_MODE_WP`.
pub const UFFDIO_CONTINUE_MODE_WP: u64 = 1 << 1;
/// `UFFDIO_MOVE_MODE_DONTWAKE`.
pub const UFFDIO_MOVE_MODE_DONTWAKE: u64 = 1 << 0;
/// `UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES`.
pub const UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES: u64 = 1 << 1;
/// `UFFDIO_POISON_MODE_DONTWAKE`.
pub const UFFDIO_POISON_MODE_DONTWAKE: u64 = 1 << 0;

/// `_UFFDIO_*` ioctl numbers (bit positions in the `ioctls` masks).
pub const _UFFDIO_REGISTER: u64 = 0x00;
/// `_UFFDIO_UNREGISTER`.
pub const _UFFDIO_UNREGISTER: u64 = 0x01;
/// `_UFFDIO_WAKE`.
pub const _UFFDIO_WAKE: u64 = 0x02;
/// `_UFFDIO_COPY`.
pub const _UFFDIO_COPY: u64 = 0x03;
/// `_UFFDIO_ZEROPAGE`.
pub const _UFFDIO_ZEROPAGE: u64 = 0x04;
/// `_UFFDIO_MOVE`.
pub const _UFFDIO_MOVE: u64 = 0x05;
/// `_UFFDIO_WRITEPROTECT`.
pub const _UFFDIO_WRITEPROTECT: u64 = 0x06;
/// `_UFFDIO_CONTINUE`.
pub const _UFFDIO_CONTINUE: u64 = 0x07;
/// `_UFFDIO_POISON`.
pub const _UFFDIO_POISON: u64 = 0x08;
/// `_UFFDIO_API`.
pub const _UFFDIO_API: u64 = 0x3F;

/// `struct uffdio_api`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioApi {
    /// Must be [`UFFD_API`].
    pub api: u64,
    /// In: requested features; out: granted features.
    pub features: u64,
    /// Out: available ioctls bitmask.
    pub ioctls: u64,
}

/// `struct uffdio_range`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioRange {
    /// Start address.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioRegister {
    /// Range to register.
    pub range: UffdioRange,
    /// `UFFDIO_REGISTER_MODE_*`.
    pub mode: u64,
    /// Out: ioctls allowed on the range.
    pub ioctls: u64,
}

/// `struct uffdio_copy`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioCopy {
    /// Destination (registered range).
    pub dst: u64,
    /// Source buffer.
    pub src: u64,
    /// Length in bytes.
    pub len: u64,
    /// `UFFDIO_COPY_MODE_*`.
    pub mode: u64,
    /// Out: bytes copied or negative errno.
    pub copy: i64,
}

/// `struct uffdio_zeropage`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioZeropage {
    /// Range.
    pub range: UffdioRange,
    /// `UFFDIO_ZEROPAGE_MODE_*`.
    pub mode: u64,
    /// Out: bytes zeroed or negative errno.
    pub zeropage: i64,
}

/// `struct uffdio_writeprotect`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioWriteprotect {
    /// Range.
    pub range: UffdioRange,
    /// `UFFDIO_WRITEPROTECT_MODE_*`.
    pub mode: u64,
}

/// `struct uffdio_continue`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioContinue {
    /// Range.
    pub range: UffdioRange,
    /// `UFFDIO_CONTINUE_MODE_*`.
    pub mode: u64,
    /// Out: bytes mapped or negative errno.
    pub mapped: i64,
}

/// `struct uffdio_move`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioMove {
    /// Destination (registered range).
    pub dst: u64,
    /// Source (anonymous private memory of the same mm).
    pub src: u64,
    /// Length in bytes.
    pub len: u64,
    /// `UFFDIO_MOVE_MODE_*`.
    pub mode: u64,
    /// Out: bytes moved or negative errno.
    pub moved: i64,
}

/// `struct uffdio_poison`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdioPoison {
    /// Range.
    pub range: UffdioRange,
    /// `UFFDIO_POISON_MODE_*`.
    pub mode: u64,
    /// Out: bytes poisoned or negative errno.
    pub updated: i64,
}

/// `struct uffd_msg` (packed, 32 bytes). The union is kept as raw words; use the accessors.
#[repr(C, packed)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UffdMsg {
    /// `UFFD_EVENT_*`.
    pub event: u8,
    /// Reserved.
    pub reserved1: u8,
    /// Reserved.
    pub reserved2: u16,
    /// Reserved.
    pub reserved3: u32,
    /// The union `arg`, as three 64-bit words.
    pub arg: [u64; 3],
}

impl UffdMsg {
    /// PAGEFAULT: `UFFD_PAGEFAULT_FLAG_*`.
    pub fn pf_flags(&self) -> u64 {
        self.arg[0]
    }
    /// PAGEFAULT: faulting address (page aligned unless EXACT_ADDRESS).
    pub fn pf_address(&self) -> u64 {
        self.arg[1]
    }
    /// PAGEFAULT: thread id (needs UFFD_FEATURE_THREAD_ID).
    pub fn pf_ptid(&self) -> u32 {
        self.arg[2] as u32
    }
    /// FORK: the child's new userfaultfd, installed in the reader's fd table.
    pub fn fork_ufd(&self) -> u32 {
        self.arg[0] as u32
    }
    /// REMAP: (from, to, len).
    pub fn remap(&self) -> (u64, u64, u64) {
        (self.arg[0], self.arg[1], self.arg[2])
    }
    /// REMOVE / UNMAP: (start, end).
    pub fn remove(&self) -> (u64, u64) {
        (self.arg[0], self.arg[1])
    }
}

const _: () = assert!(std::mem::size_of::<UffdioApi>() == 24);
const _: () = assert!(std::mem::size_of::<UffdioRange>() == 16);
const _: () = assert!(std::mem::size_of::<UffdioRegister>() == 32);
const _: () = assert!(std::mem::size_of::<UffdioCopy>() == 40);
const _: () = assert!(std::mem::size_of::<UffdioZeropage>() == 32);
const _: () = assert!(std::mem::size_of::<UffdioWriteprotect>() == 24);
const _: () = assert!(std::mem::size_of::<UffdioContinue>() == 32);
const _: () = assert!(std::mem::size_of::<UffdioMove>() == 40);
const _: () = assert!(std::mem::size_of::<UffdioPoison>() == 32);
const _: () = assert!(std::mem::size_of::<UffdMsg>() == 32);

/// `UFFDIO_API` = `_IOWR(0xAA, 0x3F, struct uffdio_api)`.
pub const UFFDIO_API: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, _UFFDIO_API, 24);
/// `UFFDIO_REGISTER`.
pub const UFFDIO_REGISTER: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, _UFFDIO_REGISTER, 32);
/// `UFFDIO_UNREGISTER` = `_IOR(0xAA, 1, struct uffdio_range)`.
pub const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, UFFDIO, _UFFDIO_UNREGISTER, 16);
/// `UFFDIO_WAKE` = `_IOR(0xAA, 2, struct uffdio_range)`.
pub const UFFDIO_WAKE: u64 = ioc(IOC_READ, UFFDIO, _UFFDIO_WAKE, 16);
/// `UFFDIO_COPY`.
pub const UFFDIO_COPY: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, _UFFDIO_COPY, 40);
/// `UFFDIO_ZEROPAGE`.
pub const UFFDIO_ZEROPAGE: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, _UFFDIO_ZEROPAGE, 32);
/// `UFFDIO_MOVE`.
pub const UFFDIO_MOVE: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, _UFFDIO_MOVE, 40);
/// `UFFDIO_WRITEPROTECT`.
pub const UFFDIO_WRITEPROTECT: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, _UFFDIO_WRITEPROTECT, 24);
/// `UFFDIO_CONTINUE`.
pub const UFFDIO_CONTINUE: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, _UFFDIO_CONTINUE, 32);
/// `UFFDIO_POISON`.
pub const UFFDIO_POISON: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, _UFFDIO_POISON, 32);
/// `USERFAULTFD_IOC_NEW` = `_IO(0xAA, 0x00)` on /dev/userfaultfd.
pub const USERFAULTFD_IOC_NEW: u64 = ioc(IOC_NONE, UFFDIO, 0x00, 0);

const _: () = assert!(UFFDIO_API == 0xc018_aa3f);
const _: () = assert!(UFFDIO_REGISTER == 0xc020_aa00);
const _: () = assert!(UFFDIO_UNREGISTER == 0x8010_aa01);
const _: () = assert!(UFFDIO_COPY == 0xc028_aa03);
const _: () = assert!(UFFDIO_WRITEPROTECT == 0xc018_aa06);

// ---------------------------------------------------------------------------------------------
// include/uapi/linux/fs.h: PAGEMAP_SCAN (Linux 6.7)
// ---------------------------------------------------------------------------------------------

/// `PAGE_IS_WPALLOWED`: the page is in a uffd-wp (async) registered range.
pub const PAGE_IS_WPALLOWED: u64 = 1 << 0;
/// `PAGE_IS_WRITTEN`: the page is not uffd-write-protected (written since protection).
pub const PAGE_IS_WRITTEN: u64 = 1 << 1;
/// `PAGE_IS_FILE`.
pub const PAGE_IS_FILE: u64 = 1 << 2;
/// `PAGE_IS_PRESENT`.
pub const PAGE_IS_PRESENT: u64 = 1 << 3;
/// `PAGE_IS_SWAPPED`.
pub const PAGE_IS_SWAPPED: u64 = 1 << 4;
/// `PAGE_IS_PFNZERO`.
pub const PAGE_IS_PFNZERO: u64 = 1 << 5;
/// `PAGE_IS_HUGE`.
pub const PAGE_IS_HUGE: u64 = 1 << 6;
/// `PAGE_IS_SOFT_DIRTY`.
pub const PAGE_IS_SOFT_DIRTY: u64 = 1 << 7;

/// `PM_SCAN_WP_MATCHING`: write-protect the matching pages as they are reported.
pub const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
/// `PM_SCAN_CHECK_WPASYNC`: fail unless the range is uffd WP_ASYNC registered.
pub const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

/// `struct page_region`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PageRegion {
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// `PAGE_IS_*` categories (masked by `return_mask`).
    pub categories: u64,
}

/// `struct pm_scan_arg`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct PmScanArg {
    /// `size_of::<PmScanArg>()`.
    pub size: u64,
    /// `PM_SCAN_*`.
    pub flags: u64,
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Out: where the walk stopped.
    pub walk_end: u64,
    /// Output vector of [`PageRegion`].
    pub vec: u64,
    /// Capacity of `vec`.
    pub vec_len: u64,
    /// Maximum pages to report (0 = unlimited).
    pub max_pages: u64,
    /// Categories to invert before matching.
    pub category_inverted: u64,
    /// All of these must be set.
    pub category_mask: u64,
    /// At least one of these must be set.
    pub category_anyof_mask: u64,
    /// Categories reported in `PageRegion::categories`.
    pub return_mask: u64,
}

const _: () = assert!(std::mem::size_of::<PageRegion>() == 24);
const _: () = assert!(std::mem::size_of::<PmScanArg>() == 96);

/// `PAGEMAP_SCAN` = `_IOWR('f', 16, struct pm_scan_arg)`.
pub const PAGEMAP_SCAN: u64 = ioc(IOC_READ | IOC_WRITE, b'f' as u64, 16, 96);
const _: () = assert!(PAGEMAP_SCAN == 0xc060_6610);

// ---------------------------------------------------------------------------------------------
// errno helpers (async-signal-safe)
// ---------------------------------------------------------------------------------------------

#[inline]
pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location returns a valid pointer to the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

#[inline]
pub(crate) fn set_errno(v: i32) {
    // SAFETY: __errno_location returns a valid pointer to the calling thread's errno.
    unsafe { *libc::__errno_location() = v }
}

// ---------------------------------------------------------------------------------------------
// Feature probe
// ---------------------------------------------------------------------------------------------

/// The userfaultfd features offered by the running kernel (from an `UFFDIO_API` handshake).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UffdFeatures {
    /// Raw `UFFD_FEATURE_*` bitmask.
    pub raw: u64,
    /// The fd had to be opened with `UFFD_USER_MODE_ONLY` (no permission for kernel faults):
    /// `access == UffdAccess::UserModeOnly`.
    pub user_mode_only: bool,
    /// How the descriptor was obtained.
    pub access: UffdAccess,
    /// The kernel offers `UFFD_FEATURE_EVENT_FORK` but refuses it to this process (it needs
    /// CAP_SYS_PTRACE); `event_fork` is then false. Set by [`probe_features`] only.
    pub event_fork_denied: bool,
    /// `UFFD_FEATURE_SIGBUS`: faults raise SIGBUS in the faulting thread (in-thread mode).
    pub sigbus: bool,
    /// `UFFD_FEATURE_PAGEFAULT_FLAG_WP`: synchronous write-protect faults.
    pub wp: bool,
    /// `UFFD_FEATURE_WP_ASYNC`: the kernel resolves WP faults itself (written-page tracking).
    pub wp_async: bool,
    /// `UFFD_FEATURE_WP_UNPOPULATED`: WP also covers unpopulated anonymous PTEs.
    pub wp_unpopulated: bool,
    /// `UFFD_FEATURE_WP_HUGETLBFS_SHMEM`: WP on shmem and hugetlbfs.
    pub wp_hugetlbfs_shmem: bool,
    /// `UFFD_FEATURE_MISSING_SHMEM`: MISSING faults on shmem.
    pub missing_shmem: bool,
    /// `UFFD_FEATURE_MISSING_HUGETLBFS`.
    pub missing_hugetlbfs: bool,
    /// `UFFD_FEATURE_MINOR_SHMEM`: MINOR faults on shmem (UFFDIO_CONTINUE).
    pub minor_shmem: bool,
    /// `UFFD_FEATURE_MINOR_HUGETLBFS`.
    pub minor_hugetlbfs: bool,
    /// `UFFD_FEATURE_MOVE`: UFFDIO_MOVE.
    pub move_: bool,
    /// `UFFD_FEATURE_POISON`: UFFDIO_POISON.
    pub poison: bool,
    /// `UFFD_FEATURE_EVENT_FORK`.
    pub event_fork: bool,
    /// `UFFD_FEATURE_EVENT_REMAP`.
    pub event_remap: bool,
    /// `UFFD_FEATURE_EVENT_REMOVE`.
    pub event_remove: bool,
    /// `UFFD_FEATURE_EVENT_UNMAP`.
    pub event_unmap: bool,
    /// `UFFD_FEATURE_THREAD_ID`.
    pub thread_id: bool,
    /// `UFFD_FEATURE_EXACT_ADDRESS`.
    pub exact_address: bool,
}

impl UffdFeatures {
    /// Decodes a raw `UFFD_FEATURE_*` mask of a descriptor obtained the way `access` says.
    pub fn from_raw(raw: u64, access: UffdAccess) -> Self {
        let has = |f: u64| raw & f != 0;
        UffdFeatures {
            raw,
            user_mode_only: access == UffdAccess::UserModeOnly,
            access,
            event_fork_denied: false,
            sigbus: has(UFFD_FEATURE_SIGBUS),
            wp: has(UFFD_FEATURE_PAGEFAULT_FLAG_WP),
            wp_async: has(UFFD_FEATURE_WP_ASYNC),
            wp_unpopulated: has(UFFD_FEATURE_WP_UNPOPULATED),
            wp_hugetlbfs_shmem: has(UFFD_FEATURE_WP_HUGETLBFS_SHMEM),
            missing_shmem: has(UFFD_FEATURE_MISSING_SHMEM),
            missing_hugetlbfs: has(UFFD_FEATURE_MISSING_HUGETLBFS),
            minor_shmem: has(UFFD_FEATURE_MINOR_SHMEM),
            minor_hugetlbfs: has(UFFD_FEATURE_MINOR_HUGETLBFS),
            move_: has(UFFD_FEATURE_MOVE),
            poison: has(UFFD_FEATURE_POISON),
            event_fork: has(UFFD_FEATURE_EVENT_FORK),
            event_remap: has(UFFD_FEATURE_EVENT_REMAP),
            event_remove: has(UFFD_FEATURE_EVENT_REMOVE),
            event_unmap: has(UFFD_FEATURE_EVENT_UNMAP),
            thread_id: has(UFFD_FEATURE_THREAD_ID),
            exact_address: has(UFFD_FEATURE_EXACT_ADDRESS),
        }
    }
}

/// Names of `UFFD_FEATURE_*` bits, for error messages.
pub fn feature_name(bit: u64) -> &'static str {
    match bit {
        UFFD_FEATURE_PAGEFAULT_FLAG_WP => "UFFD_FEATURE_PAGEFAULT_FLAG_WP",
        UFFD_FEATURE_EVENT_FORK => "UFFD_FEATURE_EVENT_FORK",
        UFFD_FEATURE_EVENT_REMAP => "UFFD_FEATURE_EVENT_REMAP",
        UFFD_FEATURE_EVENT_REMOVE => "UFFD_FEATURE_EVENT_REMOVE",
        UFFD_FEATURE_MISSING_HUGETLBFS => "UFFD_FEATURE_MISSING_HUGETLBFS",
        UFFD_FEATURE_MISSING_SHMEM => "UFFD_FEATURE_MISSING_SHMEM",
        UFFD_FEATURE_EVENT_UNMAP => "UFFD_FEATURE_EVENT_UNMAP",
        UFFD_FEATURE_SIGBUS => "UFFD_FEATURE_SIGBUS",
        UFFD_FEATURE_THREAD_ID => "UFFD_FEATURE_THREAD_ID",
        UFFD_FEATURE_MINOR_HUGETLBFS => "UFFD_FEATURE_MINOR_HUGETLBFS",
        UFFD_FEATURE_MINOR_SHMEM => "UFFD_FEATURE_MINOR_SHMEM",
        UFFD_FEATURE_EXACT_ADDRESS => "UFFD_FEATURE_EXACT_ADDRESS",
        UFFD_FEATURE_WP_HUGETLBFS_SHMEM => "UFFD_FEATURE_WP_HUGETLBFS_SHMEM",
        UFFD_FEATURE_WP_UNPOPULATED => "UFFD_FEATURE_WP_UNPOPULATED",
        UFFD_FEATURE_POISON => "UFFD_FEATURE_POISON",
        UFFD_FEATURE_WP_ASYNC => "UFFD_FEATURE_WP_ASYNC",
        UFFD_FEATURE_MOVE => "UFFD_FEATURE_MOVE",
        _ => "UFFD_FEATURE_(unknown)",
    }
}

/// Opens a fresh userfaultfd, performs the `UFFDIO_API` handshake with no feature requested and
/// reports what the kernel offers to this process, and the way the descriptor was obtained. The
/// fd is closed again (the API handshake can run only once per fd). `event_fork` is reported
/// only when this process may use it (a second handshake checks; see
/// [`UffdFeatures::event_fork_denied`]).
pub fn probe_features() -> Result<UffdFeatures> {
    let (fd, access) = open_raw_uffd()?;
    let mut api = UffdioApi {
        api: UFFD_API,
        features: 0,
        ioctls: 0,
    };
    // SAFETY: fd is a valid userfaultfd; api is a properly sized uffdio_api.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as libc::c_ulong, &mut api) };
    if r < 0 {
        return Err(Error::last("UFFDIO_API"));
    }
    let mut f = UffdFeatures::from_raw(api.features, access);
    if f.event_fork && !event_fork_permitted() {
        f.event_fork = false;
        f.event_fork_denied = true;
    }
    Ok(f)
}

/// Opens a userfaultfd (`O_CLOEXEC | O_NONBLOCK`) the first way that works (see
/// [`crate::access::open`]). Returns the fd and the way.
fn open_raw_uffd() -> Result<(OwnedFd, UffdAccess)> {
    crate::access::open(libc::O_CLOEXEC | libc::O_NONBLOCK)
}

/// Whether this process may request `UFFD_FEATURE_EVENT_FORK` (the kernel grants it only with
/// CAP_SYS_PTRACE in the initial user namespace): one handshake on a fresh descriptor.
fn event_fork_permitted() -> bool {
    let Ok((fd, _)) = open_raw_uffd() else {
        return false;
    };
    let mut api = UffdioApi {
        api: UFFD_API,
        features: UFFD_FEATURE_EVENT_FORK,
        ioctls: 0,
    };
    // SAFETY: fd is a valid userfaultfd; api is a properly sized uffdio_api.
    unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as libc::c_ulong, &mut api) == 0 }
}

// ---------------------------------------------------------------------------------------------
// Uffd
// ---------------------------------------------------------------------------------------------

/// An initialised userfaultfd (API handshake done). Non-blocking, close-on-exec.
///
/// The resolution ioctls ([`Uffd::copy`], [`Uffd::zeropage`], ...) take raw addresses, are
/// async-signal-safe and follow one errno policy: `EEXIST` (a page already there — another thread
/// or a prefetch won the race) counts as success for that page and the operation continues after
/// it; `EAGAIN` (the address space is changing under a non-cooperative event that has not been
/// read yet) is retried after `sched_yield`, unless disabled with [`Uffd::set_eagain_retry`].
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    features: u64,
    ioctls: u64,
    access: UffdAccess,
    retry_eagain: bool,
}

/// Returns `true` when `e` is the failed ioctl's errno and the call should be retried.
#[inline]
fn retry_eagain(e: i32, spins: &mut u32) -> bool {
    if e == libc::EINTR {
        return true;
    }
    if e == libc::EAGAIN {
        *spins += 1;
        if *spins > 64 {
            // SAFETY: sched_yield has no preconditions and is async-signal-safe.
            unsafe { libc::sched_yield() };
        }
        true
    } else {
        false
    }
}

impl Uffd {
    /// Opens a userfaultfd and requests `features` (all must be offered by the kernel, else
    /// [`Error::MissingFeature`] names the first absent one, with `needed_for` as context).
    pub fn open(features: u64, needed_for: &'static str) -> Result<Uffd> {
        let (fd, access) = open_raw_uffd()?;
        let mut api = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        // SAFETY: fd is a valid userfaultfd; api is a properly sized uffdio_api.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as libc::c_ulong, &mut api) };
        if r < 0 {
            let e = errno();
            if e == libc::EPERM && features & UFFD_FEATURE_EVENT_FORK != 0 {
                return Err(Error::Unsupported(format!(
                    "{needed_for} needs UFFD_FEATURE_EVENT_FORK, which the kernel grants only to \
                     a process with CAP_SYS_PTRACE (run as root)"
                )));
            }
            if e == libc::EINVAL {
                // Find which requested feature is missing, for a precise message.
                let offered = probe_features().map(|f| f.raw).unwrap_or(0);
                let missing = features & !offered;
                if missing != 0 {
                    let bit = 1u64 << missing.trailing_zeros();
                    return Err(Error::MissingFeature {
                        feature: feature_name(bit),
                        needed_for,
                    });
                }
            }
            return Err(Error::errno("UFFDIO_API", e));
        }
        Ok(Uffd {
            fd,
            features: api.features,
            ioctls: api.ioctls,
            access,
            retry_eagain: true,
        })
    }

    /// Wraps an fd received from a `UFFD_EVENT_FORK` message (already initialised by the kernel
    /// with the parent context's features). Takes ownership of `fd`.
    ///
    /// # Safety
    /// `fd` must be an open userfaultfd not owned by anything else.
    pub unsafe fn from_fork_fd(fd: RawFd, features: u64) -> Uffd {
        // Make sure the child's fd does not block the runtime loop. The kernel created it with
        // the parent context's f_flags, so it is normally already O_NONBLOCK | O_CLOEXEC.
        // SAFETY: fcntl on an fd we own.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            if fl >= 0 && fl & libc::O_NONBLOCK == 0 {
                libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            }
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
        Uffd {
            // SAFETY: the caller transfers ownership of fd.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            features,
            ioctls: 0,
            // The kernel copies the parent context, so the child's descriptor came the same way.
            access: crate::access::remembered().unwrap_or(UffdAccess::Syscall),
            retry_eagain: false,
        }
    }

    /// Whether resolution ioctls retry `EAGAIN` internally (default: yes). The engine's runtime
    /// thread turns this off for its contexts: EAGAIN there means a non-cooperative event is
    /// pending that only the runtime thread itself can read, so it must defer the fault and read
    /// the event instead of spinning (it would spin forever).
    pub fn set_eagain_retry(&mut self, on: bool) {
        self.retry_eagain = on;
    }

    /// The raw fd (for poll).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The features granted at the handshake.
    pub fn features(&self) -> UffdFeatures {
        UffdFeatures::from_raw(self.features, self.access)
    }

    /// How this descriptor was obtained.
    pub fn access(&self) -> UffdAccess {
        self.access
    }

    /// The `ioctls` mask returned by the handshake.
    pub fn api_ioctls(&self) -> u64 {
        self.ioctls
    }

    /// Registers `[start, start+len)` with `UFFDIO_REGISTER_MODE_*` `modes`; returns the mask of
    /// ioctls (`1 << _UFFDIO_*`) the kernel allows on the range.
    pub fn register(&self, start: usize, len: usize, modes: u64) -> Result<u64, i32> {
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: modes,
            ioctls: 0,
        };
        // SAFETY: valid fd and a properly sized uffdio_register.
        let r = unsafe { libc::ioctl(self.fd(), UFFDIO_REGISTER as libc::c_ulong, &mut reg) };
        if r < 0 {
            return Err(errno());
        }
        Ok(reg.ioctls)
    }

    /// Unregisters `[start, start+len)`; pending faults in the range are woken.
    pub fn unregister(&self, start: usize, len: usize) -> Result<(), i32> {
        let mut range = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        // SAFETY: valid fd and a properly sized uffdio_range.
        let r = unsafe { libc::ioctl(self.fd(), UFFDIO_UNREGISTER as libc::c_ulong, &mut range) };
        if r < 0 {
            return Err(errno());
        }
        Ok(())
    }

    /// The loop shared by the range-filling ioctls (COPY, ZEROPAGE, CONTINUE, MOVE).
    ///
    /// `op(done)` issues the ioctl for the remaining range `[done, len)` and returns the ioctl's
    /// result, the progress the kernel reported in the struct (bytes done by this call, or a
    /// negative errno) and `errno` read right after the call. On partial progress the loop
    /// continues after it; `EEXIST` on the first remaining page skips that page (a page that is
    /// already present is success, but not counted as filled); `EAGAIN` is retried unless this
    /// context defers it to its caller; any other error is returned. Returns the bytes the
    /// kernel filled. Async-signal-safe (no allocation, no locks).
    #[inline]
    fn fill_range(
        &self,
        len: usize,
        mut op: impl FnMut(usize) -> (libc::c_int, i64, i32),
    ) -> Result<usize, i32> {
        let mut done = 0usize;
        let mut filled = 0usize;
        let mut spins = 0;
        while done < len {
            let (r, progress, e) = op(done);
            if r >= 0 {
                return Ok(filled + (len - done));
            }
            if progress > 0 {
                done += progress as usize;
                filled += progress as usize;
                continue;
            }
            if e == libc::EEXIST {
                // The first page of the remaining range exists: skip it.
                done += PAGE_SIZE;
                continue;
            }
            if (e != libc::EAGAIN || self.retry_eagain) && retry_eagain(e, &mut spins) {
                continue;
            }
            return Err(e);
        }
        Ok(filled)
    }

    /// `UFFDIO_COPY` of `len` bytes from `src` to `dst`. Returns the bytes actually copied (pages
    /// that already existed are skipped and not counted). `mode`: `UFFDIO_COPY_MODE_*`.
    /// Async-signal-safe.
    pub fn copy(&self, dst: usize, src: usize, len: usize, mode: u64) -> Result<usize, i32> {
        self.fill_range(len, |done| {
            let mut c = UffdioCopy {
                dst: (dst + done) as u64,
                src: (src + done) as u64,
                len: (len - done) as u64,
                mode,
                copy: 0,
            };
            // SAFETY: valid fd and a properly sized uffdio_copy; the kernel validates addresses.
            let r = unsafe { libc::ioctl(self.fd(), UFFDIO_COPY as libc::c_ulong, &mut c) };
            (r, c.copy, if r < 0 { errno() } else { 0 })
        })
    }

    /// `UFFDIO_ZEROPAGE` over `[start, start+len)`; returns bytes zero-mapped (existing pages
    /// skipped). Async-signal-safe.
    pub fn zeropage(&self, start: usize, len: usize, mode: u64) -> Result<usize, i32> {
        self.fill_range(len, |done| {
            let mut z = UffdioZeropage {
                range: UffdioRange {
                    start: (start + done) as u64,
                    len: (len - done) as u64,
                },
                mode,
                zeropage: 0,
            };
            // SAFETY: valid fd and a properly sized uffdio_zeropage.
            let r = unsafe { libc::ioctl(self.fd(), UFFDIO_ZEROPAGE as libc::c_ulong, &mut z) };
            (r, z.zeropage, if r < 0 { errno() } else { 0 })
        })
    }

    /// `UFFDIO_CONTINUE` over `[start, start+len)` (minor faults: map the page-cache page);
    /// returns bytes mapped (already-mapped pages skipped). Async-signal-safe.
    pub fn cont(&self, start: usize, len: usize, mode: u64) -> Result<usize, i32> {
        self.fill_range(len, |done| {
            let mut c = UffdioContinue {
                range: UffdioRange {
                    start: (start + done) as u64,
                    len: (len - done) as u64,
                },
                mode,
                mapped: 0,
            };
            // SAFETY: valid fd and a properly sized uffdio_continue.
            let r = unsafe { libc::ioctl(self.fd(), UFFDIO_CONTINUE as libc::c_ulong, &mut c) };
            (r, c.mapped, if r < 0 { errno() } else { 0 })
        })
    }

    /// `UFFDIO_MOVE` of `len` bytes of anonymous private memory from `src` (same address space)
    /// to `dst`; returns bytes moved (destination pages that already existed are skipped, their
    /// source stays in place). Async-signal-safe.
    pub fn move_pages(&self, dst: usize, src: usize, len: usize, mode: u64) -> Result<usize, i32> {
        self.fill_range(len, |done| {
            let mut m = UffdioMove {
                dst: (dst + done) as u64,
                src: (src + done) as u64,
                len: (len - done) as u64,
                mode,
                moved: 0,
            };
            // SAFETY: valid fd and a properly sized uffdio_move.
            let r = unsafe { libc::ioctl(self.fd(), UFFDIO_MOVE as libc::c_ulong, &mut m) };
            (r, m.moved, if r < 0 { errno() } else { 0 })
        })
    }

    /// `UFFDIO_WRITEPROTECT`: `protect` sets (true) or clears (false) uffd write protection on the
    /// range; clearing wakes threads blocked on it unless `dont_wake` (ignored when protecting).
    /// Async-signal-safe.
    pub fn writeprotect(
        &self,
        start: usize,
        len: usize,
        protect: bool,
        dont_wake: bool,
    ) -> Result<(), i32> {
        let mut mode = 0;
        if protect {
            mode |= UFFDIO_WRITEPROTECT_MODE_WP;
        }
        // The kernel rejects WP|DONTWAKE with EINVAL (protecting never wakes anyone anyway).
        if dont_wake && !protect {
            mode |= UFFDIO_WRITEPROTECT_MODE_DONTWAKE;
        }
        let mut wp = UffdioWriteprotect {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode,
        };
        let mut spins = 0;
        loop {
            // SAFETY: valid fd and a properly sized uffdio_writeprotect.
            let r =
                unsafe { libc::ioctl(self.fd(), UFFDIO_WRITEPROTECT as libc::c_ulong, &mut wp) };
            if r >= 0 {
                return Ok(());
            }
            let e = errno();
            if (e == libc::EAGAIN && !self.retry_eagain) || !retry_eagain(e, &mut spins) {
                return Err(e);
            }
        }
    }

    /// `UFFDIO_WAKE`: wakes threads blocked on faults in the range. Async-signal-safe.
    pub fn wake(&self, start: usize, len: usize) -> Result<(), i32> {
        let mut range = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        // SAFETY: valid fd and a properly sized uffdio_range.
        let r = unsafe { libc::ioctl(self.fd(), UFFDIO_WAKE as libc::c_ulong, &mut range) };
        if r < 0 {
            return Err(errno());
        }
        Ok(())
    }

    /// `UFFDIO_POISON`: later accesses to the range raise SIGBUS (used to fail a fault loudly when
    /// its resolver failed). Async-signal-safe.
    pub fn poison(&self, start: usize, len: usize) -> Result<(), i32> {
        let mut p = UffdioPoison {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: 0,
            updated: 0,
        };
        // SAFETY: valid fd and a properly sized uffdio_poison.
        let r = unsafe { libc::ioctl(self.fd(), UFFDIO_POISON as libc::c_ulong, &mut p) };
        if r < 0 {
            return Err(errno());
        }
        Ok(())
    }

    /// Reads up to `buf.len()` messages without blocking; returns how many were read (0 when
    /// none is pending).
    pub fn read_msgs(&self, buf: &mut [UffdMsg]) -> Result<usize, i32> {
        loop {
            // SAFETY: buf is a writable buffer of buf.len() 32-byte messages.
            let n = unsafe {
                libc::read(
                    self.fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    std::mem::size_of_val(buf),
                )
            };
            if n >= 0 {
                return Ok(n as usize / std::mem::size_of::<UffdMsg>());
            }
            match errno() {
                libc::EAGAIN => return Ok(0),
                libc::EINTR => continue,
                e => return Err(e),
            }
        }
    }
}

/// Converts an errno from a resolution ioctl into a [`ResolveError`].
pub(crate) fn resolve_err(op: &'static str, offset: usize, len: usize, e: i32) -> ResolveError {
    if e == libc::ESRCH {
        ResolveError::ProcessGone
    } else {
        ResolveError::Ioctl {
            op,
            offset,
            len,
            errno: e,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// PAGEMAP_SCAN
// ---------------------------------------------------------------------------------------------

/// An open `/proc/self/pagemap`, kept open for repeated `PAGEMAP_SCAN` ioctls.
#[derive(Debug)]
pub struct Pagemap {
    file: File,
}

impl Pagemap {
    /// Opens `/proc/self/pagemap`.
    pub fn open() -> Result<Pagemap> {
        let file = File::open("/proc/self/pagemap").map_err(|source| Error::Syscall {
            op: "open(/proc/self/pagemap)",
            source,
        })?;
        Ok(Pagemap { file })
    }

    /// As [`Pagemap::open`] without allocating: async-signal-safe, for a forked child of a
    /// threaded process (its own `/proc/self/pagemap`: a descriptor opened before the fork
    /// reads the parent's page tables). Errors are the errno.
    pub fn open_signal_safe() -> Result<Pagemap, i32> {
        // SAFETY: a NUL-terminated path; the result is checked.
        let fd = unsafe {
            libc::open(
                c"/proc/self/pagemap".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: a descriptor just opened and owned by nothing else.
        Ok(Pagemap {
            file: unsafe { File::from_raw_fd(fd) },
        })
    }

    /// Runs one `PAGEMAP_SCAN` ioctl. `arg.size` is filled in. Returns the number of
    /// [`PageRegion`]s written to `arg.vec`; `arg.walk_end` tells where the walk stopped.
    pub fn scan(&self, arg: &mut PmScanArg) -> Result<usize, i32> {
        arg.size = std::mem::size_of::<PmScanArg>() as u64;
        loop {
            // SAFETY: valid pagemap fd; arg is a properly sized pm_scan_arg whose vec points to
            // vec_len writable page_region entries (the caller's contract).
            let r = unsafe {
                libc::ioctl(
                    self.file.as_raw_fd(),
                    PAGEMAP_SCAN as libc::c_ulong,
                    arg as *mut PmScanArg,
                )
            };
            if r >= 0 {
                return Ok(r as usize);
            }
            match errno() {
                libc::EINTR => continue,
                e => return Err(e),
            }
        }
    }
}
