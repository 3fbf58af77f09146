//! `libtiermem`: the C ABI of tiermem.
//!
//! Conventions (also in the generated `tiermem.h`):
//! - fallible functions return `0` on success or a negative errno-style code; the message of the
//!   last error on the calling thread is [`tiermem_last_error`];
//! - handles are opaque pointers, owned by the caller until the matching close/destroy call;
//! - no function panics across the ABI: every exported function runs its body in
//!   [`error::guard`], which catches a panic and reports it as `-EIO` (NULL / 0 for functions
//!   returning a pointer or a count) with "internal error (panic) in NAME: …" as the last error;
//! - handles are checked against a registry of live handles: NULL is `-EINVAL`, a closed or
//!   never-issued handle `-EBADF` (not undefined behaviour; kv handles excepted for now).
//!
//! The exported functions take raw pointers from C and are not `unsafe fn`: C cannot see Rust's
//! `unsafe`, each function documents the pointer contract its C caller must keep, and Rust code
//! uses the `tiermem-media` / `tiermem-fault` crates instead of this ABI.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

mod error;
mod fault;
mod iocache;
mod kv;
mod media;
mod migrate;
mod pager;
mod pheap;
mod prefault;
mod snapshot;
mod vnvm;
mod zread;

pub use error::*;
pub use fault::*;
pub use iocache::*;
pub use kv::*;
pub use media::*;
pub use migrate::*;
pub use pager::*;
pub use pheap::*;
pub use prefault::*;
pub use snapshot::*;
pub use vnvm::*;
pub use zread::*;

/// The library's version as a NUL-terminated string ("MAJOR.MINOR.PATCH"); static storage.
#[no_mangle]
pub extern "C" fn tiermem_version() -> *const libc::c_char {
    error::guard("tiermem_version", || {
        concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
    })
}
