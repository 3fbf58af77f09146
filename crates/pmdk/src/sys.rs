//! Raw declarations of the libpmemobj functions tiermem uses, and of the C shim.
//!
//! The transaction functions are declared for completeness; **do not call them from Rust**.
//! libpmemobj reports a failure inside a transaction by aborting it and `longjmp`ing to the
//! `jmp_buf` given to `pmemobj_tx_begin`, which must never unwind Rust frames. Use
//! [`tm_pmdk_tx_write`] (through [`crate::Pool::transaction`]), which runs the whole transaction
//! in C.

#![allow(non_camel_case_types)]

use libc::{c_char, c_int, c_void, mode_t, size_t};

/// An opaque libpmemobj pool handle.
#[repr(C)]
#[derive(Debug)]
pub struct PMEMobjpool {
    _private: [u8; 0],
}

/// A persistent object id: the pool's uuid (low bits) and the object's offset in the pool.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PMEMoid {
    /// Low 64 bits of the pool's uuid.
    pub pool_uuid_lo: u64,
    /// Offset of the object from the start of the pool (0 = OID_NULL).
    pub off: u64,
}

/// One write for [`tm_pmdk_tx_write`] (`struct tm_pmdk_write` in `shim.c`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TmWrite {
    /// Destination offset inside the object.
    pub off: u64,
    /// Source bytes.
    pub src: *const c_void,
    /// Number of bytes.
    pub len: size_t,
}

/// `TX_PARAM_NONE`: terminates the variadic parameter list of `pmemobj_tx_begin`.
pub const TX_PARAM_NONE: c_int = 0;
/// `TX_STAGE_NONE`: no transaction in progress on this thread.
pub const TX_STAGE_NONE: c_int = 0;
/// `TX_STAGE_WORK`: inside a transaction.
pub const TX_STAGE_WORK: c_int = 1;
/// `TX_STAGE_ONCOMMIT`: committed, not yet ended.
pub const TX_STAGE_ONCOMMIT: c_int = 2;
/// `TX_STAGE_ONABORT`: aborted (or failed to begin), not yet ended.
pub const TX_STAGE_ONABORT: c_int = 3;
/// `TX_STAGE_FINALLY`: ending.
pub const TX_STAGE_FINALLY: c_int = 4;

extern "C" {
    /// Create a pool file (`poolsize` 0: use an existing file's size).
    pub fn pmemobj_create(
        path: *const c_char,
        layout: *const c_char,
        poolsize: size_t,
        mode: mode_t,
    ) -> *mut PMEMobjpool;
    /// Open a pool file, checking its layout name.
    pub fn pmemobj_open(path: *const c_char, layout: *const c_char) -> *mut PMEMobjpool;
    /// Close a pool.
    pub fn pmemobj_close(pop: *mut PMEMobjpool);
    /// The root object, allocated (zeroed) or grown to `size` bytes if needed.
    pub fn pmemobj_root(pop: *mut PMEMobjpool, size: size_t) -> PMEMoid;
    /// Size of the root object (0 when none).
    pub fn pmemobj_root_size(pop: *mut PMEMobjpool) -> size_t;
    /// The address of an object of an open pool (the exported, non-inline version).
    pub fn pmemobj_direct(oid: PMEMoid) -> *mut c_void;
    /// libpmemobj's message for this thread's last error.
    pub fn pmemobj_errormsg() -> *const c_char;
    /// Allocate an object of `size` bytes and store its id at `oidp` (atomic API).
    pub fn pmemobj_alloc(
        pop: *mut PMEMobjpool,
        oidp: *mut PMEMoid,
        size: size_t,
        type_num: u64,
        constructor: Option<
            unsafe extern "C" fn(*mut PMEMobjpool, *mut c_void, *mut c_void) -> c_int,
        >,
        arg: *mut c_void,
    ) -> c_int;
    /// Free an object allocated with `pmemobj_alloc` and set `*oidp` to OID_NULL.
    pub fn pmemobj_free(oidp: *mut PMEMoid);

    /// Begin a transaction; `env` is a `jmp_buf` to longjmp to on abort (or NULL). Variadic
    /// parameters end with [`TX_PARAM_NONE`]. See the module documentation: not for Rust callers.
    pub fn pmemobj_tx_begin(pop: *mut PMEMobjpool, env: *mut c_void, ...) -> c_int;
    /// Snapshot `size` bytes at `hoff` of object `oid` into the undo log.
    pub fn pmemobj_tx_add_range(oid: PMEMoid, hoff: u64, size: size_t) -> c_int;
    /// Snapshot `size` bytes at `ptr` (inside the pool) into the undo log.
    pub fn pmemobj_tx_add_range_direct(ptr: *const c_void, size: size_t) -> c_int;
    /// Commit the current transaction.
    pub fn pmemobj_tx_commit();
    /// Abort the current transaction with error number `errnum` (longjmps when an env was given).
    pub fn pmemobj_tx_abort(errnum: c_int);
    /// End the current transaction; returns its error number (0 after a commit).
    pub fn pmemobj_tx_end() -> c_int;
    /// The current transaction's stage (`TX_STAGE_*`).
    pub fn pmemobj_tx_stage() -> c_int;
    /// The current transaction's error number.
    pub fn pmemobj_tx_errno() -> c_int;

    /// The shim (`src/shim.c`): one whole transaction of `n` writes into object `oid`; commits,
    /// or aborts when `abort_at_end` is non-zero. Returns 0 after a commit, else the error number.
    pub fn tm_pmdk_tx_write(
        pop: *mut PMEMobjpool,
        oid: PMEMoid,
        writes: *const TmWrite,
        n: size_t,
        abort_at_end: c_int,
    ) -> c_int;
    /// The shim's `pmemobj_tx_stage()`.
    pub fn tm_pmdk_tx_stage() -> c_int;
}
