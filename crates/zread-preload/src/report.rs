//! The exit report (`TIERMEM_ZREAD_STATS=<path>`): one JSON line appended by each process that
//! read a served fd, at `exit` (an `atexit` handler) or at `_exit`/`_Exit`
//! (hooked here: fio's job processes end that way). The library's counters and every
//! [`tiermem_iocache::ZStats`] counter summed over the process's files; see the crate docs.
//! Only tries the library's locks (a report is skipped rather than risk a deadlock).

use crate::table::{self, CREATED, FALLBACKS, OPEN_FAILURES, PASSED, ROUTED};
use crate::{config, real, Inside};
use serde_json::Value;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed, Ordering::SeqCst};

/// The pid that wrote the report (once per process; a vfork child shares this memory).
static WRITTEN_BY: AtomicU32 = AtomicU32::new(0);

fn write_all(fd: c_int, b: &[u8]) -> bool {
    let mut done = 0;
    while done < b.len() {
        // SAFETY: writing our buffer's bytes to our descriptor.
        let n = unsafe { libc::write(fd, b[done..].as_ptr().cast(), b.len() - done) };
        if n <= 0 {
            return false;
        }
        done += n as usize;
    }
    true
}

/// Appends this process's report if it read a served fd and a path is set, once.
fn write_report() {
    let seen = CREATED.load(Relaxed) + PASSED.load(Relaxed) + FALLBACKS.load(Relaxed);
    if !crate::active() || seen == 0 {
        return;
    }
    let Some(path) = config().and_then(|c| c.stats.as_deref()) else {
        return;
    };
    let pid = std::process::id();
    if WRITTEN_BY.swap(pid, SeqCst) == pid {
        return;
    }
    let _inside = Inside::enter();
    let e = real::errno();
    let _ = std::panic::catch_unwind(|| {
        let Some((mut m, live)) = table::summed() else {
            return;
        };
        for (k, v) in [
            ("pid", u64::from(pid)),
            ("files", CREATED.load(Relaxed)),
            ("live_files", live as u64),
            ("routed", ROUTED.load(Relaxed)),
            ("passed", PASSED.load(Relaxed)),
            ("fallbacks", FALLBACKS.load(Relaxed)),
            ("open_failures", OPEN_FAILURES.load(Relaxed)),
        ] {
            m.insert(k.into(), Value::from(v));
        }
        let mut line = Value::Object(m).to_string().into_bytes();
        line.push(b'\n');
        let mut name = path.replace("%p", &pid.to_string()).into_bytes();
        name.push(0);
        // SAFETY: a NUL-terminated path; the real open (this is the library's own file).
        let fd = unsafe {
            (real::open())(
                name.as_ptr().cast(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC,
                0o644,
            )
        };
        if fd < 0 {
            let msg = format!(
                "tiermem-zread-preload: cannot write the stats file {}: errno {}\n",
                String::from_utf8_lossy(&name[..name.len() - 1]),
                real::errno()
            );
            write_all(2, msg.as_bytes());
            return;
        }
        // One write of the whole line: O_APPEND keeps lines of several processes whole.
        write_all(fd, &line);
        // SAFETY: closing our own descriptor (the real close: it was never recorded).
        unsafe { (real::close())(fd) };
    });
    real::set_errno(e);
}

/// The `atexit` handler: writes the report.
pub extern "C" fn at_exit() {
    write_report();
}

/// `_exit(2)`: writes the exit report first.
///
/// # Safety
/// As `_exit(2)`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    write_report();
    real::exit_with(&real::REAL_EXIT, status)
}

/// `_Exit(2)`: as [`_exit`].
///
/// # Safety
/// As `_Exit(2)`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    write_report();
    real::exit_with(&real::REAL_UNDERSCORE_EXIT, status)
}
