//! Two "hosts" on one machine: two network namespaces joined by a veth pair (tests, benchmarks).
//!
//! [`TwoHosts::create`] makes `<prefix>-<pid>-<n>-src` and `<prefix>-<pid>-<n>-dst` (`ip netns
//! add`), a veth pair created directly inside them (`eth0` in each, so nothing ever appears in
//! the caller's namespace), addresses `10.213.x.y/30` (`y` and `y + 1`, derived from the pid and
//! the counter so concurrent users get different subnets, although each pair lives in its own
//! namespaces anyway), the links and both loopbacks up. Dropping it deletes both namespaces,
//! which destroys the veth pair; a partially created pair is cleaned up too.
//!
//! Sockets belong to the namespace of the thread that *created* them, not of the thread that
//! uses them: create a listener or a connected stream with [`TwoHosts::run_in`] and use it from
//! any thread afterwards. Requires root (CAP_SYS_ADMIN + CAP_NET_ADMIN) and iproute2.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Errors of the two-host harness.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// Running a command (normally `ip`) failed to start.
    #[error("cannot run `{cmd}`: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A command exited unsuccessfully.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// Opening the namespace file or `setns(2)` failed.
    #[error("cannot enter network namespace {name}: {source}")]
    Enter {
        /// The namespace name.
        name: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// `ip netns add` was refused for lack of privilege (not a name clash).
    #[error(
        "creating network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), running as \
         uid {uid}: `{cmd}`: {stderr}"
    )]
    NeedsRoot {
        /// The effective uid.
        uid: u32,
        /// The refused command line.
        cmd: String,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// No free namespace name was found (stale namespaces from crashed runs?).
    #[error("no free namespace name for prefix {0} (stale namespaces? see `ip netns list`)")]
    NoFreeName(String),
}

/// Result of the two-host harness.
pub type Result<T> = std::result::Result<T, NetnsError>;

/// Which of the two hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    /// The migration source.
    Src,
    /// The migration target.
    Dst,
}

/// Two network namespaces joined by a veth pair; both are deleted on drop.
#[derive(Debug)]
pub struct TwoHosts {
    /// Namespace names; `None` while not (or no longer) created.
    src: Option<String>,
    dst: Option<String>,
    src_addr: Ipv4Addr,
    dst_addr: Ipv4Addr,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Runs `ip <args>`; an error carries the command line and its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let cmd = format!("ip {}", args.join(" "));
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|source| NetnsError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetnsError::Command {
            cmd,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

impl TwoHosts {
    /// Creates the two namespaces, the veth pair between them, the addresses, and brings every
    /// link (loopbacks included) up. `name_prefix` should be short (it is only used in the
    /// namespace names). On error everything created so far is removed.
    pub fn create(name_prefix: &str) -> Result<TwoHosts> {
        let pid = std::process::id();
        remove_stale(name_prefix);
        let mut hosts = TwoHosts {
            src: None,
            dst: None,
            src_addr: Ipv4Addr::UNSPECIFIED,
            dst_addr: Ipv4Addr::UNSPECIFIED,
        };
        // Find a free pair of names (a stale pair from a crashed process with the same pid
        // makes `ip netns add` fail: skip to the next counter value).
        let mut n = 0;
        for _ in 0..64 {
            n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let src = format!("{name_prefix}-{pid}-{n}-src");
            let dst = format!("{name_prefix}-{pid}-{n}-dst");
            match ip(&["netns", "add", &src]) {
                Ok(()) => {}
                // Refused for lack of privilege: every other name would be refused too.
                Err(NetnsError::Command { cmd, stderr, .. })
                    if stderr.contains("not permitted") || stderr.contains("Permission denied") =>
                {
                    return Err(NetnsError::NeedsRoot {
                        // SAFETY: geteuid has no preconditions.
                        uid: unsafe { libc::geteuid() },
                        cmd,
                        stderr,
                    });
                }
                Err(_) => continue,
            }
            hosts.src = Some(src);
            if ip(&["netns", "add", &dst]).is_err() {
                // Drop the src name and try another pair.
                let _ = ip(&["netns", "del", hosts.src.as_deref().unwrap_or_default()]);
                hosts.src = None;
                continue;
            }
            hosts.dst = Some(dst);
            break;
        }
        let (Some(src), Some(dst)) = (hosts.src.clone(), hosts.dst.clone()) else {
            return Err(NetnsError::NoFreeName(name_prefix.to_string()));
        };
        // A /30 inside 10.213.0.0/16 derived from pid and counter: 16384 subnets.
        let k = (pid.wrapping_mul(131).wrapping_add(n)) & 0x3fff;
        let base = u32::from(Ipv4Addr::new(10, 213, 0, 0)) | (k << 2);
        hosts.src_addr = Ipv4Addr::from(base | 1);
        hosts.dst_addr = Ipv4Addr::from(base | 2);
        let src_cidr = format!("{}/30", hosts.src_addr);
        let dst_cidr = format!("{}/30", hosts.dst_addr);
        ip(&[
            "link", "add", "eth0", "netns", &src, "type", "veth", "peer", "name", "eth0", "netns",
            &dst,
        ])?;
        for (ns, cidr) in [(&src, &src_cidr), (&dst, &dst_cidr)] {
            ip(&["-n", ns, "addr", "add", cidr, "dev", "eth0"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        Ok(hosts)
    }

    /// The namespace name of `which` (for `ip netns exec`, diagnostics).
    pub fn name(&self, which: Host) -> &str {
        let n = match which {
            Host::Src => &self.src,
            Host::Dst => &self.dst,
        };
        n.as_deref().expect("namespaces exist while TwoHosts lives")
    }

    /// The source host's address on the veth.
    pub fn src_addr(&self) -> Ipv4Addr {
        self.src_addr
    }

    /// The target host's address on the veth.
    pub fn dst_addr(&self) -> Ipv4Addr {
        self.dst_addr
    }

    /// The address of `which` on the veth.
    pub fn addr(&self, which: Host) -> Ipv4Addr {
        match which {
            Host::Src => self.src_addr,
            Host::Dst => self.dst_addr,
        }
    }

    /// Runs `f` on a new thread that has entered `which`'s network namespace, waits for it and
    /// returns its result. Sockets created by `f` belong to that namespace for their whole
    /// life, whichever thread uses them later. A panic in `f` is propagated to the caller.
    pub fn run_in<T, F>(&self, which: Host, f: F) -> Result<T>
    where
        T: Send,
        F: FnOnce() -> T + Send,
    {
        run_in_named(self.name(which), f)
    }

    /// Like [`TwoHosts::run_in`] but does not wait: returns the thread's handle. The thread
    /// stays in the namespace until it ends; the namespace name may disappear (drop) while it
    /// runs, the namespace itself lives as long as the thread or its sockets do.
    pub fn spawn_in<T, F>(&self, which: Host, f: F) -> Result<std::thread::JoinHandle<Result<T>>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let name = self.name(which).to_string();
        let file = open_ns(&name)?;
        Ok(std::thread::spawn(move || {
            enter_ns(&file, &name)?;
            Ok(f())
        }))
    }

    /// A command that runs `program` inside `which`'s namespace (`ip netns exec <name>
    /// <program>`); add arguments with [`Command::arg`].
    pub fn command(&self, which: Host, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", self.name(which), program]);
        c
    }
}

/// Deletes namespaces `<prefix>-<pid>-<n>-{src,dst}` left behind by processes that no longer
/// exist (killed before their `Drop` ran, e.g. by a test-harness timeout). Namespaces of live
/// processes are never touched. Best effort: errors are ignored. Returns how many were removed.
pub fn remove_stale(name_prefix: &str) -> usize {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return 0;
    };
    let mut removed = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name
            .strip_prefix(name_prefix)
            .and_then(|r| r.strip_prefix('-'))
        else {
            continue;
        };
        let Some(rest) = rest
            .strip_suffix("-src")
            .or_else(|| rest.strip_suffix("-dst"))
        else {
            continue;
        };
        let mut parts = rest.split('-');
        let (Some(pid), Some(n), None) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), n.parse::<u32>()) else {
            continue;
        };
        if pid != std::process::id()
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            && ip(&["netns", "del", name]).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// Runs `f` on a new thread that has entered the named network namespace (`ip netns`'s
/// `/run/netns/<name>`), waits for it and returns its result: the one way every tiermem tool
/// enters a namespace. Sockets created by `f` belong to that namespace for their whole life,
/// whichever thread uses them later. A panic in `f` is propagated to the caller; failing to
/// open or enter the namespace is [`NetnsError::Enter`].
pub fn run_in_named<T, F>(name: &str, f: F) -> Result<T>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    let file = open_ns(name)?;
    std::thread::scope(|s| {
        let h = s.spawn(move || -> Result<T> {
            enter_ns(&file, name)?;
            Ok(f())
        });
        match h.join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        }
    })
}

fn open_ns(name: &str) -> Result<File> {
    File::open(format!("/run/netns/{name}")).map_err(|source| NetnsError::Enter {
        name: name.to_string(),
        source,
    })
}

/// Moves the calling thread into the network namespace `file` refers to.
fn enter_ns(file: &File, name: &str) -> Result<()> {
    // SAFETY: `file` is an open namespace file descriptor owned for the duration of the call;
    // setns(CLONE_NEWNET) only changes the calling thread's network namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(NetnsError::Enter {
            name: name.to_string(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for n in [self.src.take(), self.dst.take()].into_iter().flatten() {
            if let Err(e) = ip(&["netns", "del", &n]) {
                eprintln!("tiermem-migrate: cannot delete network namespace {n}: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    fn listed(name: &str) -> bool {
        let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.split_whitespace().next() == Some(name))
    }

    #[test]
    fn tcp_between_hosts_and_cleanup() {
        let (src_name, dst_name);
        {
            let h = TwoHosts::create("tmt").unwrap();
            src_name = h.name(Host::Src).to_string();
            dst_name = h.name(Host::Dst).to_string();
            assert!(listed(&src_name) && listed(&dst_name));
            let dst = h.dst_addr();
            let l = h
                .run_in(Host::Dst, move || TcpListener::bind((dst, 0)))
                .unwrap()
                .unwrap();
            let port = l.local_addr().unwrap().port();
            let server = std::thread::spawn(move || {
                let (mut s, peer) = l.accept().unwrap();
                let mut b = [0u8; 5];
                s.read_exact(&mut b).unwrap();
                s.write_all(&b.map(|c| c.to_ascii_uppercase())).unwrap();
                peer
            });
            let mut c = h
                .run_in(Host::Src, move || TcpStream::connect((dst, port)))
                .unwrap()
                .unwrap();
            c.write_all(b"hello").unwrap();
            let mut b = [0u8; 5];
            c.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"HELLO");
            let peer = server.join().unwrap();
            assert_eq!(peer.ip(), std::net::IpAddr::V4(h.src_addr()));
            // The destination address is not reachable from the caller's namespace.
            let outside = TcpStream::connect_timeout(
                &(dst, port).into(),
                std::time::Duration::from_millis(100),
            );
            assert!(outside.is_err());
            // command() runs inside the namespace.
            let out = h
                .command(Host::Src, "ip")
                .args(["-4", "-o", "addr", "show", "dev", "eth0"])
                .output()
                .unwrap();
            assert!(String::from_utf8_lossy(&out.stdout).contains(&h.src_addr().to_string()));
        }
        assert!(!listed(&src_name) && !listed(&dst_name));
    }

    #[test]
    fn two_pairs_at_once() {
        let a = TwoHosts::create("tmt").unwrap();
        let b = TwoHosts::create("tmt").unwrap();
        assert_ne!(a.name(Host::Src), b.name(Host::Src));
        assert_ne!(a.src_addr(), b.src_addr());
        for h in [&a, &b] {
            let dst = h.dst_addr();
            let l = h
                .run_in(Host::Dst, move || TcpListener::bind((dst, 0)))
                .unwrap()
                .unwrap();
            let port = l.local_addr().unwrap().port();
            let t = h
                .spawn_in(Host::Src, move || {
                    let mut c = TcpStream::connect((dst, port)).unwrap();
                    c.write_all(b"x").unwrap();
                })
                .unwrap();
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"x");
            t.join().unwrap().unwrap();
        }
    }

    #[test]
    fn stale_namespaces_of_dead_processes_are_removed() {
        // A pid that cannot be alive (above the kernel's PID_MAX_LIMIT of 2^22).
        let stale = "tmstale-4999999-0-src";
        ip(&["netns", "add", stale]).unwrap();
        let live = format!("tmstale-{}-999-dst", std::process::id());
        ip(&["netns", "add", &live]).unwrap();
        let removed = remove_stale("tmstale");
        let stale_left = listed(stale);
        let live_left = listed(&live);
        let _ = ip(&["netns", "del", stale]);
        let _ = ip(&["netns", "del", &live]);
        assert_eq!(removed, 1);
        assert!(!stale_left && live_left);
    }

    #[test]
    fn panic_in_run_in_still_cleans_up() {
        let name;
        {
            let h = TwoHosts::create("tmt").unwrap();
            name = h.name(Host::Dst).to_string();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                h.run_in(Host::Dst, || panic!("boom")).unwrap();
            }));
            assert!(r.is_err());
        }
        assert!(!listed(&name));
    }
}
