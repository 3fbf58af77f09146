//! C ABI of tiermem-kv: run the Redis-protocol server inside a C program.

use crate::error::{cstr, fail, guard, handles};
use ::tiermem_kv::config::KvConfig;
use ::tiermem_kv::instance::{KvError, KvInstance};
use std::ffi::{c_char, c_int};

/// A running tiermem-kv server (opaque), from `tiermem_kv_start`.
#[allow(non_camel_case_types)]
pub struct tiermem_kv {
    kv: KvInstance,
}

fn kv_errno(e: &KvError) -> i32 {
    match e {
        KvError::Config(_) => libc::EINVAL,
        KvError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        KvError::Storage { .. } => libc::EIO,
    }
}

/// Start a tiermem-kv server in this process (its own event-loop threads) and store its handle
/// in `*out`.
///
/// `settings`: redis.conf-style text, one `key value` per line (`#` comments), with the keys of
/// `tiermem kv serve --config` (e.g. "engine vnvm\ndir /dev/shm/app-kv\nport 0\n"); NULL or ""
/// for the defaults (engine vnvm in $TIERMEM_DIR/kv, 127.0.0.1:6379). `port 0` picks a free
/// port: read it with `tiermem_kv_port`. The durable engine opens the instance in `dir`
/// (recovering it after a crash before it serves) and never creates one unless `new yes` is
/// set, which creates one only in an empty or nonexistent `dir`.
///
/// Errors: EINVAL a bad setting (the text names the line), EADDRINUSE and other socket errors,
/// EIO a storage error: no instance in `dir` (without `new yes`), `new yes` over a non-empty
/// `dir`, part of an instance missing or damaged (the text names the file; nothing in `dir`
/// is modified).
#[no_mangle]
pub extern "C" fn tiermem_kv_start(settings: *const c_char, out: *mut *mut tiermem_kv) -> c_int {
    guard("tiermem_kv_start", || {
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let mut cfg = KvConfig::default();
        if !settings.is_null() {
            let text = match cstr(settings, "settings") {
                Ok(t) => t,
                Err(e) => return e,
            };
            if let Err(e) = cfg.load_str(text, "settings") {
                return fail(libc::EINVAL, e);
            }
        }
        if let Err(e) = cfg.server.validate() {
            return fail(libc::EINVAL, e);
        }
        let default_dir = tiermem_media::default_dir().join("kv");
        match KvInstance::start(&cfg, &default_dir, &mut |_| {}) {
            Ok(kv) => {
                // SAFETY: out is non-NULL and points to writable storage (ABI contract).
                unsafe { *out = handles::issue(tiermem_kv { kv }) };
                0
            }
            Err(e) => fail(kv_errno(&e), e),
        }
    })
}

/// The TCP port the server listens on (the first address), or a negative errno: EINVAL for a
/// NULL handle, EBADF for a stopped or foreign one, ENOTCONN when it listens on no TCP address.
#[no_mangle]
pub extern "C" fn tiermem_kv_port(kv: *const tiermem_kv) -> c_int {
    guard("tiermem_kv_port", || {
        let kv = match handles::get(kv, "kv") {
            Ok(kv) => kv,
            Err(e) => return e,
        };
        match kv.kv.tcp_addrs().first() {
            Some(a) => a.port() as c_int,
            None => fail(libc::ENOTCONN, "the server listens on no TCP address"),
        }
    })
}

/// Stop the server (as SHUTDOWN does: replies in flight are sent), make everything durable,
/// close the engine and free the handle (also on error). 0 or a negative errno (EINVAL: NULL;
/// EBADF: a handle already stopped or not from tiermem_kv_start; EIO: the final
/// sync failed; the data stays recoverable).
#[no_mangle]
pub extern "C" fn tiermem_kv_stop(kv: *mut tiermem_kv) -> c_int {
    guard("tiermem_kv_stop", || {
        let kv = match handles::take(kv, "kv") {
            Ok(kv) => kv,
            Err(e) => return e,
        };
        match kv.kv.stop() {
            Ok(()) => 0,
            Err(e) => fail(kv_errno(&e), e),
        }
    })
}
