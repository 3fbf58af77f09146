//! How this process obtains a userfaultfd: the three ways Linux offers, tried in a fixed order,
//! the one that worked remembered for the life of the process, and a probe of all three (for
//! `tiermem doctor`) that says what each missing one would need.
//!
//! | way ([`UffdAccess`]) | who may use it | faults delivered |
//! |---|---|---|
//! | `userfaultfd(2)` | root / CAP_SYS_PTRACE, anyone with `vm.unprivileged_userfaultfd=1` | user and kernel mode |
//! | `/dev/userfaultfd` + `USERFAULTFD_IOC_NEW` (Linux ≥ 6.1) | whoever may open the node read-write | user and kernel mode |
//! | `userfaultfd(2)` with `UFFD_USER_MODE_ONLY` (Linux ≥ 5.11) | anyone, whatever the sysctl says | user mode only |
//!
//! With user-mode-only descriptors a *kernel* access to a missing or write-protected page (a
//! `read(2)` into it, a futex on it) fails with EFAULT instead of waiting for the handler. The
//! in-thread mode loses nothing (its SIGBUS contexts turn kernel accesses into EFAULT anyway),
//! nor does WP_ASYNC write tracking (the kernel resolves those faults itself); the handler-thread
//! mode then serves user-mode faults only. Independently of the way, `UFFD_FEATURE_EVENT_FORK`
//! needs CAP_SYS_PTRACE; see [`crate::UffdFeatures::event_fork_denied`].

use crate::error::{Error, Result};
use crate::sys::{UFFD_USER_MODE_ONLY, USERFAULTFD_IOC_NEW};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering};

/// The way a userfaultfd was obtained (see the module documentation for who may use which).
/// The default (for an all-false [`crate::UffdFeatures`]) is the plain syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum UffdAccess {
    /// The plain `userfaultfd(2)` syscall: root, CAP_SYS_PTRACE or
    /// `vm.unprivileged_userfaultfd=1`. User- and kernel-mode faults.
    #[default]
    Syscall,
    /// `/dev/userfaultfd` with `USERFAULTFD_IOC_NEW` (Linux ≥ 6.1), allowed by the node's mode.
    /// User- and kernel-mode faults.
    DevUserfaultfd,
    /// `userfaultfd(2)` with `UFFD_USER_MODE_ONLY` (Linux ≥ 5.11), allowed to everyone. User-mode
    /// faults only: a kernel access to a missing page fails with EFAULT.
    UserModeOnly,
}

impl UffdAccess {
    /// Every way, in the order [`open`] tries them.
    pub const ALL: [UffdAccess; 3] = [
        UffdAccess::Syscall,
        UffdAccess::DevUserfaultfd,
        UffdAccess::UserModeOnly,
    ];

    /// A stable name for reports and JSON: `syscall`, `dev_userfaultfd`, `user_mode_only`.
    pub fn name(self) -> &'static str {
        match self {
            UffdAccess::Syscall => "syscall",
            UffdAccess::DevUserfaultfd => "dev_userfaultfd",
            UffdAccess::UserModeOnly => "user_mode_only",
        }
    }

    /// One line saying what the way is, for people.
    pub fn describe(self) -> &'static str {
        match self {
            UffdAccess::Syscall => "userfaultfd(2) (user- and kernel-mode faults)",
            UffdAccess::DevUserfaultfd => {
                "/dev/userfaultfd + USERFAULTFD_IOC_NEW (user- and kernel-mode faults)"
            }
            UffdAccess::UserModeOnly => {
                "userfaultfd(2) with UFFD_USER_MODE_ONLY (user-mode faults only: kernel accesses \
                 to a missing page fail with EFAULT)"
            }
        }
    }

    /// Whether descriptors obtained this way also deliver faults the kernel takes on the
    /// process's behalf (`read(2)` into a missing page...).
    pub fn kernel_faults(self) -> bool {
        self != UffdAccess::UserModeOnly
    }

    fn code(self) -> u8 {
        match self {
            UffdAccess::Syscall => 1,
            UffdAccess::DevUserfaultfd => 2,
            UffdAccess::UserModeOnly => 3,
        }
    }

    fn from_code(c: u8) -> Option<UffdAccess> {
        match c {
            1 => Some(UffdAccess::Syscall),
            2 => Some(UffdAccess::DevUserfaultfd),
            3 => Some(UffdAccess::UserModeOnly),
            _ => None,
        }
    }
}

impl std::fmt::Display for UffdAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The way the last successful [`open`] used (0: none yet).
static REMEMBERED: AtomicU8 = AtomicU8::new(0);

/// The way this process obtained its userfaultfds so far, if it opened one.
pub fn remembered() -> Option<UffdAccess> {
    UffdAccess::from_code(REMEMBERED.load(Ordering::Relaxed))
}

/// One attempt to open a userfaultfd with `flags` (`O_CLOEXEC`, `O_NONBLOCK`) the way `access`
/// says. Returns the raw fd, or the errno. Async-signal-safe (raw syscalls only, no allocation),
/// so a forked child may call it.
pub fn open_raw(access: UffdAccess, flags: i32) -> std::result::Result<i32, i32> {
    let fd = match access {
        // SAFETY: plain syscall with integer arguments.
        UffdAccess::Syscall => unsafe { libc::syscall(libc::SYS_userfaultfd, flags) as i32 },
        UffdAccess::UserModeOnly => {
            // SAFETY: plain syscall with integer arguments.
            unsafe { libc::syscall(libc::SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY) as i32 }
        }
        UffdAccess::DevUserfaultfd => {
            // SAFETY: open of a NUL-terminated literal path.
            let dev =
                unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
            if dev < 0 {
                return Err(crate::sys::errno());
            }
            // SAFETY: dev is an open /dev/userfaultfd; USERFAULTFD_IOC_NEW takes the flags by
            // value.
            let fd = unsafe {
                libc::ioctl(
                    dev,
                    USERFAULTFD_IOC_NEW as libc::c_ulong,
                    flags as libc::c_long,
                )
            };
            let e = crate::sys::errno();
            // SAFETY: closing the descriptor opened above (the new userfaultfd stays open).
            unsafe { libc::close(dev) };
            if fd < 0 {
                return Err(e);
            }
            fd
        }
    };
    if fd < 0 {
        Err(crate::sys::errno())
    } else {
        Ok(fd)
    }
}

fn open_owned(access: UffdAccess, flags: i32) -> std::result::Result<OwnedFd, i32> {
    // SAFETY: the fd was just returned by the kernel and is owned by nobody else.
    open_raw(access, flags).map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens a userfaultfd with `flags`: the way remembered from an earlier call first, else
/// `userfaultfd(2)`, `/dev/userfaultfd`, then `userfaultfd(2)` with `UFFD_USER_MODE_ONLY`, and
/// remembers the way that worked. [`Error::UffdUnavailable`] says why each way failed and what it
/// would need.
pub fn open(flags: i32) -> Result<(OwnedFd, UffdAccess)> {
    if let Some(a) = remembered() {
        if let Ok(fd) = open_owned(a, flags) {
            return Ok((fd, a));
        }
    }
    let mut failed = Vec::new();
    for a in UffdAccess::ALL {
        match open_owned(a, flags) {
            Ok(fd) => {
                REMEMBERED.store(a.code(), Ordering::Relaxed);
                return Ok((fd, a));
            }
            Err(e) => failed.push((a, e)),
        }
    }
    let detail = failed
        .iter()
        .map(|&(a, e)| {
            format!(
                "{}: {} (needs {})",
                a,
                io::Error::from_raw_os_error(e),
                needs(a, e)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    Err(Error::UffdUnavailable {
        source: io::Error::from_raw_os_error(failed[0].1),
        detail,
    })
}

/// The outcome of trying one way, from [`probe`].
#[derive(Debug, Clone)]
pub struct AccessAttempt {
    /// The way tried.
    pub access: UffdAccess,
    /// `None` when it worked, else the errno it failed with.
    pub errno: Option<i32>,
    /// When it failed: what it would need on this machine (a command or a kernel version).
    pub needs: Option<String>,
}

/// Tries each of the three ways once (each descriptor is closed at once) and reports which work
/// and, for the others, what they would need. Does not change the remembered way.
pub fn probe() -> Vec<AccessAttempt> {
    UffdAccess::ALL
        .iter()
        .map(
            |&a| match open_owned(a, libc::O_CLOEXEC | libc::O_NONBLOCK) {
                Ok(_fd) => AccessAttempt {
                    access: a,
                    errno: None,
                    needs: None,
                },
                Err(e) => AccessAttempt {
                    access: a,
                    errno: Some(e),
                    needs: Some(needs(a, e)),
                },
            },
        )
        .collect()
}

/// The first way that works for this process, without remembering it: what [`open`] would use.
pub fn usable() -> Option<UffdAccess> {
    probe()
        .into_iter()
        .find(|a| a.errno.is_none())
        .map(|a| a.access)
}

/// What `access`, which failed with `errno`, would need to work here.
pub fn needs(access: UffdAccess, errno: i32) -> String {
    let no_uffd = "a kernel built with CONFIG_USERFAULTFD (and no seccomp filter refusing \
                   userfaultfd)";
    match (access, errno) {
        (_, libc::ENOSYS) => no_uffd.to_string(),
        (UffdAccess::Syscall, libc::EPERM) => format!(
            "root (or CAP_SYS_PTRACE), or `sysctl vm.unprivileged_userfaultfd=1` (it is {} now)",
            std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unreadable".into())
        ),
        (UffdAccess::DevUserfaultfd, libc::ENOENT) => {
            "Linux ≥ 6.1 with CONFIG_USERFAULTFD (there is no /dev/userfaultfd)".to_string()
        }
        (UffdAccess::DevUserfaultfd, libc::EACCES | libc::EPERM) => format!(
            "read-write access to /dev/userfaultfd ({}): `chmod 0666 /dev/userfaultfd`, or give \
             its group read-write access and add the user to that group",
            node_owner("/dev/userfaultfd")
        ),
        (UffdAccess::DevUserfaultfd, libc::ENOTTY | libc::EINVAL) => {
            "Linux ≥ 6.1 (USERFAULTFD_IOC_NEW on /dev/userfaultfd)".to_string()
        }
        (UffdAccess::UserModeOnly, libc::EINVAL) => {
            "Linux ≥ 5.11 (UFFD_USER_MODE_ONLY)".to_string()
        }
        (_, libc::EMFILE | libc::ENFILE | libc::ENOMEM) => {
            "free descriptors or memory (the limit was hit)".to_string()
        }
        (_, e) => format!(
            "whatever refused it ({}; a seccomp filter or security module?)",
            io::Error::from_raw_os_error(e)
        ),
    }
}

/// `mode 0600, owner uid 0, group gid 0` for a device node, or why it could not be read.
fn node_owner(path: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(m) => format!(
            "mode {:04o}, owner uid {}, group gid {}",
            m.mode() & 0o7777,
            m.uid(),
            m.gid()
        ),
        Err(e) => format!("cannot stat it: {e}"),
    }
}
