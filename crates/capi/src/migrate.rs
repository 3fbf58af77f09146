//! C ABI of tiermem-migrate: FAM-aware post-copy migration of memory regions through a FAM
//! directory shared by the source and target hosts (`docs/migrate.md`).
//!
//! Source: `tiermem_migrate_source_checkpoint` (application frozen) then
//! `tiermem_migrate_source_serve` (dump + page-server until every page is in FAM).
//! Target: `tiermem_migrate_target_restore`, run at once on the restored regions (pages arrive
//! on first touch), `tiermem_migrate_target_complete` to fetch the rest, then
//! `tiermem_migrate_target_free`.

use crate::error::{cstr, fail, guard, handles};
use crate::fault::fault_errno;
use ::tiermem_migrate::checkpoint::{CheckpointError, MAX_REGIONS};
use ::tiermem_migrate::fam::{FamError, FamSource, FamSourceConfig, FamTarget};
use ::tiermem_migrate::lazyfile::{Batching, LazyError};
use std::ffi::{c_char, c_int, c_void};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;
use tiermem_media::DelayModel;

/// One region to migrate: `len` bytes at `base` (a positive multiple of the page size).
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct tiermem_migrate_region {
    /// Start of the region (page aligned memory of this process).
    pub base: *const c_void,
    /// Length in bytes (a positive multiple of the page size).
    pub len: usize,
}

/// What the source did, filled by `tiermem_migrate_source_serve`.
#[repr(C)]
#[derive(Default)]
#[allow(non_camel_case_types)]
pub struct tiermem_migrate_source_report {
    /// Checkpoint (blob + lazy files created and reserved), ns.
    pub checkpoint_ns: u64,
    /// From the checkpoint's start until every page was dumped and persisted, ns (busy time).
    pub busy_ns: u64,
    /// Page-server requests answered.
    pub requests: u64,
    /// 2 MiB vectors dumped on the target's demand.
    pub on_demand_vectors: u64,
    /// Bytes dumped to FAM.
    pub bytes: u64,
    /// 1 when a connected target was told the dump is done, else 0.
    pub told_done: c_int,
}

/// The source side of a migration (opaque), from `tiermem_migrate_source_checkpoint`.
#[allow(non_camel_case_types)]
pub struct tiermem_migrate_source {
    src: FamSource,
}

/// The target side of a migration (opaque), from `tiermem_migrate_target_restore`.
#[allow(non_camel_case_types)]
pub struct tiermem_migrate_target {
    t: FamTarget,
}

/// The errno a C caller sees for a migration error.
fn fam_errno(e: &FamError) -> i32 {
    match e {
        FamError::Checkpoint(CheckpointError::Media { source, .. }) => source.errno(),
        FamError::Checkpoint(CheckpointError::Invalid { .. }) => libc::EBADMSG,
        FamError::Lazy(l) => match l {
            LazyError::Media(m) => m.errno(),
            LazyError::NotLazyFile { .. }
            | LazyError::Version { .. }
            | LazyError::Checksum { .. }
            | LazyError::Field { .. } => libc::EBADMSG,
            LazyError::InvalidArgument(_) | LazyError::OutOfRange { .. } => libc::EINVAL,
            LazyError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EIO,
        },
        FamError::Proto(_) => libc::EPROTO,
        FamError::InUse { .. } => libc::EEXIST,
        FamError::Fault(f) => fault_errno(f),
        _ => libc::EIO,
    }
}

fn fam_fail(e: FamError) -> i32 {
    fail(fam_errno(&e), e)
}

/// Resolve an `ip:port` (or `host:port`) argument to its first address.
fn socket_addr(p: *const c_char, what: &str) -> Result<SocketAddr, i32> {
    let s = cstr(p, what)?;
    match s.to_socket_addrs() {
        Ok(mut it) => it
            .next()
            .ok_or_else(|| fail(libc::EINVAL, format!("{what} {s:?} resolves to no address"))),
        Err(e) => Err(fail(
            libc::EINVAL,
            format!("{what} {s:?} is not an ip:port address: {e}"),
        )),
    }
}

/// Checkpoint migration `id` of the `n` regions at `regions` (1 to 256) with the application
/// state `blob` (`blob_len` bytes; `blob` may be NULL when `blob_len` is 0) into
/// `fam_dir/mig-<id as 16 hex digits>/` and store the source handle in `*out`: the blob and
/// region lengths are written and persisted, and one lazy-page file per region is created with
/// its whole space reserved, so a full FAM directory fails here, before the target is told
/// anything.
///
/// `delay`: the delay model charged on the dump writes (NULL or "none" for none, "pcm-fam",
/// or any model `TIERMEM_DELAY` accepts). `batched`: nonzero to dump with one `pwritev` per
/// batch of vectors (up to 2 GiB), 0 for one write per 2 MiB vector.
///
/// The regions must stay mapped and frozen (nothing writes them) until
/// `tiermem_migrate_source_serve` returns or `tiermem_migrate_source_free` is called.
///
/// Errors: EINVAL a NULL or bad argument (region count, a length that is not a positive page
/// multiple, an unknown delay model), ENOSPC no room in the FAM directory, EEXIST the migration
/// already exists, other media errors from creating the files.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn tiermem_migrate_source_checkpoint(
    fam_dir: *const c_char,
    id: u64,
    regions: *const tiermem_migrate_region,
    n: usize,
    blob: *const c_void,
    blob_len: usize,
    delay: *const c_char,
    batched: c_int,
    out: *mut *mut tiermem_migrate_source,
) -> c_int {
    guard("tiermem_migrate_source_checkpoint", || {
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let fam = match cstr(fam_dir, "fam_dir") {
            Ok(s) => PathBuf::from(s),
            Err(e) => return e,
        };
        if regions.is_null() {
            return fail(libc::EINVAL, "regions is NULL");
        }
        if n == 0 || n > MAX_REGIONS {
            return fail(
                libc::EINVAL,
                format!("{n} regions: a migration carries 1 to {MAX_REGIONS}"),
            );
        }
        if blob.is_null() && blob_len != 0 {
            return fail(
                libc::EINVAL,
                format!("blob is NULL but blob_len is {blob_len}"),
            );
        }
        let delay = if delay.is_null() {
            DelayModel::NONE
        } else {
            let text = match cstr(delay, "delay") {
                Ok(t) => t,
                Err(e) => return e,
            };
            match text.parse::<DelayModel>() {
                Ok(d) => d,
                Err(e) => return fail(libc::EINVAL, format!("delay: {e}")),
            }
        };
        // SAFETY: `regions` points to `n` region descriptors (ABI contract; checked non-NULL).
        let descs = unsafe { std::slice::from_raw_parts(regions, n) };
        let mut spans = Vec::with_capacity(n);
        for (i, r) in descs.iter().enumerate() {
            if r.base.is_null() {
                return fail(libc::EINVAL, format!("regions[{i}].base is NULL"));
            }
            spans.push((r.base as *const u8, r.len as u64));
        }
        let blob = if blob_len == 0 {
            &[][..]
        } else {
            // SAFETY: `blob` is non-NULL and points to `blob_len` readable bytes (ABI contract).
            unsafe { std::slice::from_raw_parts(blob as *const u8, blob_len) }
        };
        let cfg = FamSourceConfig {
            fam,
            id,
            batching: if batched != 0 {
                Batching::MAX
            } else {
                Batching::PerVector
            },
            delay,
            skip_untouched: false,
        };
        // SAFETY: the caller keeps each region mapped and frozen until serve returns or the
        // handle is freed (ABI contract, documented above).
        match unsafe { FamSource::checkpoint(cfg, &spans, blob) } {
            Ok(src) => {
                // SAFETY: out is non-NULL and points to writable storage (ABI contract).
                unsafe { *out = handles::issue(tiermem_migrate_source { src }) };
                0
            }
            Err(e) => fam_fail(e),
        }
    })
}

/// Serve the migration: listen on `listen_addr` ("ip:port"), dump every region to FAM in the
/// background and answer the target's page-server requests until every page is dumped and
/// persisted, then tell a connected target and return (the end of the source's busy time: the
/// regions may then be written or unmapped). A target that never connects does not delay the
/// end. `*out` receives the report.
///
/// Consumes the handle (it must not be used again), also when this fails — except when it
/// returns EINVAL for a NULL argument or an unparsable address, or EBADF for a handle that is
/// not open, which leave everything untouched.
///
/// Errors: EINVAL a NULL argument or a bad address, EADDRINUSE and other socket errors, EIO a
/// dump error (the text says which).
#[no_mangle]
pub extern "C" fn tiermem_migrate_source_serve(
    source: *mut tiermem_migrate_source,
    listen_addr: *const c_char,
    out: *mut tiermem_migrate_source_report,
) -> c_int {
    guard("tiermem_migrate_source_serve", || {
        if let Err(e) = handles::get(source, "source") {
            return e;
        }
        if out.is_null() {
            return fail(libc::EINVAL, "out (the report) is NULL");
        }
        let addr = match socket_addr(listen_addr, "listen_addr") {
            Ok(a) => a,
            Err(e) => return e,
        };
        // Consumed from here on (the handle is closed whatever serve returns).
        let s = match handles::take(source, "source") {
            Ok(s) => s,
            Err(e) => return e,
        };
        let listener = match TcpListener::bind(addr) {
            Ok(l) => l,
            Err(e) => {
                return fail(
                    e.raw_os_error().unwrap_or(libc::EIO),
                    format!("listening on {addr}: {e}"),
                )
            }
        };
        match s.src.serve(listener) {
            Ok(r) => {
                let report = tiermem_migrate_source_report {
                    checkpoint_ns: r.checkpoint_ns,
                    busy_ns: r.busy_ns,
                    requests: r.requests,
                    on_demand_vectors: r.on_demand_vectors,
                    bytes: r.bytes,
                    told_done: c_int::from(r.told_done),
                };
                // SAFETY: out is non-NULL and points to a writable report (ABI contract).
                unsafe { *out = report };
                0
            }
            Err(e) => fam_fail(e),
        }
    })
}

/// Free a source handle that was never served (the migration is abandoned: its files stay in
/// the FAM directory, incomplete). NULL is a no-op.
#[no_mangle]
pub extern "C" fn tiermem_migrate_source_free(source: *mut tiermem_migrate_source) {
    if source.is_null() {
        return;
    }
    guard("tiermem_migrate_source_free", || {
        let _ = handles::take(source, "source").map(drop);
    });
}

/// Restore migration `id` from `fam_dir` and store the target handle in `*out`: validate the
/// checkpoint and the lazy-page files, connect to the source's page-server at `source_addr`
/// ("ip:port"; NULL when the dump is already complete), map each region and register it with
/// the fault engine (in-thread resolution: the kernel must not read a region's unfetched pages,
/// e.g. with write(2), before `tiermem_migrate_target_complete`). The application may run as
/// soon as this returns; pages arrive on first touch, from FAM when dumped, else on demand
/// from the source. Requests to the source time out after `timeout_ms` (0: 5000). Page reads
/// from FAM are charged the `TIERMEM_DELAY` model.
///
/// Errors: EINVAL a NULL or bad argument, ENOENT no such migration, EBADMSG a corrupt or
/// truncated checkpoint or lazy-page file, EIO the dump is incomplete and the source is
/// unreachable or `source_addr` is NULL (the text says which), EPROTO a bad handshake,
/// ENOSYS no userfaultfd.
#[no_mangle]
pub extern "C" fn tiermem_migrate_target_restore(
    fam_dir: *const c_char,
    id: u64,
    source_addr: *const c_char,
    timeout_ms: u32,
    out: *mut *mut tiermem_migrate_target,
) -> c_int {
    guard("tiermem_migrate_target_restore", || {
        if out.is_null() {
            return fail(libc::EINVAL, "out is NULL");
        }
        let fam = match cstr(fam_dir, "fam_dir") {
            Ok(s) => PathBuf::from(s),
            Err(e) => return e,
        };
        let source = if source_addr.is_null() {
            None
        } else {
            match socket_addr(source_addr, "source_addr") {
                Ok(a) => Some(a),
                Err(e) => return e,
            }
        };
        let delay = match DelayModel::from_env() {
            Ok(d) => d,
            Err(e) => return fail(libc::EINVAL, e),
        };
        let timeout = Duration::from_millis(if timeout_ms == 0 {
            5000
        } else {
            u64::from(timeout_ms)
        });
        match FamTarget::restore(&fam, id, source, delay, timeout) {
            Ok(t) => {
                // SAFETY: out is non-NULL and points to writable storage (ABI contract).
                unsafe { *out = handles::issue(tiermem_migrate_target { t }) };
                0
            }
            Err(e) => fam_fail(e),
        }
    })
}

/// Borrow the target behind a handle, or fail with -EINVAL.
fn target_ref<'a>(t: *const tiermem_migrate_target) -> Result<&'a FamTarget, i32> {
    handles::get(t, "target").map(|h| &h.t)
}

/// The number of restored regions, or a negative errno (EINVAL for a NULL handle).
#[no_mangle]
pub extern "C" fn tiermem_migrate_target_region_count(
    target: *const tiermem_migrate_target,
) -> c_int {
    guard("tiermem_migrate_target_region_count", || {
        match target_ref(target) {
            Ok(t) => t.regions().len() as c_int,
            Err(e) => e,
        }
    })
}

/// Store the start and length of restored region `index` (checkpoint order) in `*base` and
/// `*len`. The memory stays valid until `tiermem_migrate_target_free`.
/// Errors: EINVAL a NULL argument, ERANGE no region `index`.
#[no_mangle]
pub extern "C" fn tiermem_migrate_target_region(
    target: *const tiermem_migrate_target,
    index: usize,
    base: *mut *mut c_void,
    len: *mut usize,
) -> c_int {
    guard("tiermem_migrate_target_region", || {
        let t = match target_ref(target) {
            Ok(t) => t,
            Err(e) => return e,
        };
        if base.is_null() || len.is_null() {
            return fail(libc::EINVAL, "base or len is NULL");
        }
        let Some(r) = t.regions().get(index) else {
            return fail(
                libc::ERANGE,
                format!(
                    "no region {index}: the migration has {} region(s)",
                    t.regions().len()
                ),
            );
        };
        // SAFETY: both pointers are non-NULL and writable (ABI contract).
        unsafe {
            *base = r.as_ptr().cast();
            *len = r.len();
        }
        0
    })
}

/// Store the application state blob (from the checkpoint) in `*p` and `*len`; `*p` stays valid
/// until `tiermem_migrate_target_free` (non-NULL even for an empty blob).
/// Errors: EINVAL a NULL argument.
#[no_mangle]
pub extern "C" fn tiermem_migrate_target_blob(
    target: *const tiermem_migrate_target,
    p: *mut *const c_void,
    len: *mut usize,
) -> c_int {
    guard("tiermem_migrate_target_blob", || {
        let t = match target_ref(target) {
            Ok(t) => t,
            Err(e) => return e,
        };
        if p.is_null() || len.is_null() {
            return fail(libc::EINVAL, "p or len is NULL");
        }
        let b = t.blob();
        // SAFETY: both pointers are non-NULL and writable (ABI contract).
        unsafe {
            *p = b.as_ptr().cast();
            *len = b.len();
        }
        0
    })
}

/// Fetch every page that has not arrived yet (a prefetch through the fault resolver), so the
/// migration is complete and the source no longer needed; `*resume_ns` receives the time from
/// restore to completion (the resume time).
/// Errors: EINVAL a NULL argument. A page that cannot be fetched (the source died before the
/// dump completed) fails the access itself, as any fault would (the process gets SIGBUS).
#[no_mangle]
pub extern "C" fn tiermem_migrate_target_complete(
    target: *const tiermem_migrate_target,
    resume_ns: *mut u64,
) -> c_int {
    guard("tiermem_migrate_target_complete", || {
        let t = match target_ref(target) {
            Ok(t) => t,
            Err(e) => return e,
        };
        if resume_ns.is_null() {
            return fail(libc::EINVAL, "resume_ns is NULL");
        }
        let ns = t.complete();
        // SAFETY: non-NULL and writable (ABI contract).
        unsafe { *resume_ns = ns };
        0
    })
}

/// Store the faults resolved so far over all regions: `*from_fam` read straight from the FAM
/// directory with no message, `*on_demand` requested from the source's page-server.
/// Errors: EINVAL a NULL argument.
#[no_mangle]
pub extern "C" fn tiermem_migrate_target_faults(
    target: *const tiermem_migrate_target,
    from_fam: *mut u64,
    on_demand: *mut u64,
) -> c_int {
    guard("tiermem_migrate_target_faults", || {
        let t = match target_ref(target) {
            Ok(t) => t,
            Err(e) => return e,
        };
        if from_fam.is_null() || on_demand.is_null() {
            return fail(libc::EINVAL, "from_fam or on_demand is NULL");
        }
        let (f, d) = t.fault_counts();
        // SAFETY: both pointers are non-NULL and writable (ABI contract).
        unsafe {
            *from_fam = f;
            *on_demand = d;
        }
        0
    })
}

/// Unregister and unmap the restored regions and close the connection to the source; the
/// region pointers and the blob become invalid. NULL is a no-op. The migration's files stay in
/// the FAM directory (`tiermem migrate rm` removes them).
#[no_mangle]
pub extern "C" fn tiermem_migrate_target_free(target: *mut tiermem_migrate_target) {
    if target.is_null() {
        return;
    }
    guard("tiermem_migrate_target_free", || {
        let _ = handles::take(target, "target").map(drop);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{alloc, dealloc, Layout};
    use std::ffi::{CStr, CString};

    fn last_error() -> String {
        // SAFETY: tiermem_last_error returns a valid NUL-terminated string.
        unsafe { CStr::from_ptr(crate::tiermem_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    /// Checkpoint and serve (nobody connects), restore without a source and read the bytes
    /// back; then a damaged checkpoint is refused with EBADMSG, a second checkpoint of the
    /// same id with EEXIST.
    #[test]
    fn round_trip_and_errors_through_the_abi() {
        let dir = std::path::PathBuf::from(format!(
            "/dev/shm/tiermem-capi-migrate-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fam = CString::new(dir.to_str().unwrap()).unwrap();
        let layout = Layout::from_size_align(8192, 4096).unwrap();
        // SAFETY: non-zero size.
        let mem = unsafe { alloc(layout) };
        for i in 0..8192 {
            // SAFETY: inside the allocation.
            unsafe { *mem.add(i) = (i % 251) as u8 };
        }
        let region = tiermem_migrate_region {
            base: mem.cast(),
            len: 8192,
        };
        let blob = b"state";
        let mut src = std::ptr::null_mut();
        let rc = tiermem_migrate_source_checkpoint(
            fam.as_ptr(),
            7,
            &region,
            1,
            blob.as_ptr().cast(),
            blob.len(),
            std::ptr::null(),
            0,
            &mut src,
        );
        assert_eq!(rc, 0, "{}", last_error());
        let mut again = std::ptr::null_mut();
        let rc = tiermem_migrate_source_checkpoint(
            fam.as_ptr(),
            7,
            &region,
            1,
            std::ptr::null(),
            0,
            std::ptr::null(),
            0,
            &mut again,
        );
        assert_eq!(rc, -libc::EEXIST, "{}", last_error());
        let mut report = tiermem_migrate_source_report::default();
        let addr = CString::new("127.0.0.1:0").unwrap();
        let rc = tiermem_migrate_source_serve(src, addr.as_ptr(), &mut report);
        assert_eq!(rc, 0, "{}", last_error());
        assert_eq!((report.bytes, report.told_done), (8192, 0));
        // SAFETY: serve returned: the region may go.
        unsafe { dealloc(mem, layout) };

        let mut t = std::ptr::null_mut();
        let rc = tiermem_migrate_target_restore(fam.as_ptr(), 7, std::ptr::null(), 0, &mut t);
        assert_eq!(rc, 0, "{}", last_error());
        assert_eq!(tiermem_migrate_target_region_count(t), 1);
        let (mut base, mut len) = (std::ptr::null_mut(), 0usize);
        assert_eq!(tiermem_migrate_target_region(t, 0, &mut base, &mut len), 0);
        assert_eq!(len, 8192);
        // SAFETY: the restored region is `len` readable bytes until the target is freed.
        let got = unsafe { std::slice::from_raw_parts(base as *const u8, len) };
        assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        let (mut p, mut n) = (std::ptr::null(), 0usize);
        assert_eq!(tiermem_migrate_target_blob(t, &mut p, &mut n), 0);
        // SAFETY: the blob is `n` bytes until the target is freed.
        assert_eq!(
            unsafe { std::slice::from_raw_parts(p as *const u8, n) },
            blob
        );
        assert_eq!(
            tiermem_migrate_target_region(t, 1, &mut base, &mut len),
            -libc::ERANGE
        );
        tiermem_migrate_target_free(t);

        // Flip a byte of the checkpoint's region length (after the 4 KiB pool header).
        let ck = dir.join("mig-0000000000000007/checkpoint");
        let mut bytes = std::fs::read(&ck).unwrap();
        bytes[4096 + 64] ^= 1;
        std::fs::write(&ck, &bytes).unwrap();
        let rc = tiermem_migrate_target_restore(fam.as_ptr(), 7, std::ptr::null(), 0, &mut t);
        assert_eq!(rc, -libc::EBADMSG, "{}", last_error());
        assert!(last_error().contains("checksum"), "{}", last_error());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
