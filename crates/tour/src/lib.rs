//! tiermem-tour: the two commands a newcomer runs first, `tiermem doctor` (module `doctor`: what
//! this machine can do and what the basic operations cost) and `tiermem tour` (this file: the
//! quick-start job). The tour walks through every built subsystem on the embedded
//! default devices (emulated pools under $TIERMEM_DIR), one step each — `doctor`, `media`,
//! `fault`, `vnvm`, `kv`, `migrate`, `pheap`, `prefault`, `snapshot`, `iocache`, `pager`, `zread` (one module per step in this crate) — checking
//! every result it prints. A step whose prerequisite is missing (root, network namespaces,
//! redis-tools, sqlite3, the preload library) is skipped with the reason; a failing step does not
//! stop the others. The tour ends with a table (step, result, time, where to go next) and fails
//! when a step failed. Every step removes what it created (files, servers, namespaces) however
//! it ends.

/// Prints one line of the tour to stdout, like `println!`, but a reader that went away (`tiermem
/// tour | head`) does not stop the tour: the steps still run to the end and remove what they
/// created; their lines are dropped.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

pub mod doctor;
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

use anyhow::{bail, Context, Result};
use std::io::IsTerminal;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What a step that did not fail reports.
pub enum Outcome {
    /// It ran and every check passed: one line saying what happened and what it proved.
    Ok(String),
    /// A prerequisite is missing: why.
    Skipped(String),
}

/// What every step gets.
pub struct Ctx {
    /// The directory for the tour's files.
    dir: PathBuf,
    /// This process' id, in every file name (concurrent tours do not collide).
    tag: u32,
    /// The `tiermem` binary running the tour (steps start it again as servers and tools).
    exe: PathBuf,
}

impl Ctx {
    /// `dir/tour-<pid>-<name>`: a path for a step's file or directory.
    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(format!("tour-{}-{name}", self.tag))
    }
}

/// One step of the tour.
struct Step {
    name: &'static str,
    title: &'static str,
    /// Where to go next after this step.
    next: &'static str,
    run: fn(&Ctx) -> Result<Outcome>,
}

const STEPS: [Step; 12] = [
    Step {
        name: "doctor",
        title: "this machine (tiermem doctor --quick)",
        next: "tiermem doctor",
        run: doctor_step,
    },
    Step {
        name: "media",
        title: "an emulated NVM pool and the crash model",
        next: "tiermem pool --help; tiermem bench media",
        run: media::run,
    },
    Step {
        name: "fault",
        title: "a region filled lazily from the pool; written-page tracking",
        next: "tiermem bench fault",
        run: fault::run,
    },
    Step {
        name: "vnvm",
        title: "transactions over virtual NVM, a crash and its recovery",
        next: "tiermem vnvm --help; tiermem bench vnvm",
        run: vnvm::run,
    },
    Step {
        name: "kv",
        title: "tiermem-kv (vnvm engine) under redis-cli and redis-benchmark, then kill -9",
        next: "tiermem kv serve --help; tiermem bench kv",
        run: kv::run,
    },
    Step {
        name: "migrate",
        title: "post-copy migration of a running region through FAM between two namespaces",
        next: "tiermem migrate --help; tiermem bench migrate",
        run: migrate::run,
    },
    Step {
        name: "pheap",
        title: "sqlite3 :memory: on a persistent heap (LD_PRELOAD), checkpoints verified",
        next: "tiermem pheap --help; tiermem bench pheap",
        run: pheap::run,
    },
    Step {
        name: "prefault",
        title: "first touches that do not fault: a service populating ahead (POE)",
        next: "tiermem prefault run --help; tiermem bench prefault",
        run: prefault::run,
    },
    Step {
        name: "snapshot",
        title: "a point-in-time snapshot of live memory without fork, a writer at work",
        next: "tiermem snapshot --help",
        run: snapshot::run,
    },
    Step {
        name: "iocache",
        title: "a database buffer pool with the page cache as its victim cache (DBIO)",
        next: "tiermem bench iocache --quick",
        run: iocache::run,
    },
    Step {
        name: "pager",
        title: "paging past a DRAM budget through an NVM buffer and a swap file (NVSwap)",
        next: "tiermem bench pager --quick",
        run: pager::run,
    },
    Step {
        name: "zread",
        title: "zero-copy reads from the page cache that a writer cannot change (z-READ)",
        next: "tiermem bench iocache --quick --only zread",
        run: zread::run,
    },
];

/// The step names, in the order the tour runs them (the values `--only` accepts).
pub const STEP_NAMES: [&str; STEPS.len()] = {
    let mut names = [""; STEPS.len()];
    let mut i = 0;
    while i < STEPS.len() {
        names[i] = STEPS[i].name;
        i += 1;
    }
    names
};

/// The result of one step, for the table.
enum Verdict {
    Ok,
    Skipped,
    Failed,
}

/// Run the tour in `dir` (default: $TIERMEM_DIR or /dev/shm/tiermem): every step, or only those
/// named in `only` (in the tour's order). Fails on an unknown step name, or after the table
/// when a step failed.
pub fn run(dir: Option<PathBuf>, only: &[String]) -> Result<()> {
    if let Some(bad) = only.iter().find(|n| !STEP_NAMES.contains(&n.as_str())) {
        bail!(
            "unknown tour step {bad:?}; the steps are: {}",
            STEP_NAMES.join(", ")
        );
    }
    let dir = match dir {
        Some(d) => {
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            d
        }
        None => tiermem_media::ensure_default_dir()?,
    };
    if !on_tmpfs(&dir) {
        say!(
            "note: {} is not on tmpfs: the emulated NVM of the durable steps (vnvm, kv) is synced \
             to the disk there, which makes them much slower (kv: minutes); the default \
             /dev/shm/tiermem is tmpfs",
            dir.display()
        );
    }
    let ctx = Ctx {
        dir,
        tag: std::process::id(),
        exe: std::env::current_exe().context("finding the tiermem binary (current_exe)")?,
    };
    let tty = std::io::stdout().is_terminal();
    let bold = |s: &str| {
        if tty {
            format!("\x1b[1m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    };
    let start = Instant::now();
    let mut rows: Vec<(&Step, Verdict, Duration)> = Vec::new();
    let chosen = STEPS
        .iter()
        .filter(|s| only.is_empty() || only.iter().any(|n| n == s.name));
    for (i, step) in chosen.enumerate() {
        say!(
            "\n{}",
            bold(&format!("== {}. {}: {} ==", i + 1, step.name, step.title))
        );
        let t = Instant::now();
        // A panic in a step is that step's failure; its guards have cleaned up while unwinding.
        let r = catch_unwind(AssertUnwindSafe(|| (step.run)(&ctx)));
        let took = t.elapsed();
        let (result, line) = match r {
            Ok(Ok(Outcome::Ok(what))) => (Verdict::Ok, format!("{} ok: {what}", step.name)),
            Ok(Ok(Outcome::Skipped(why))) => {
                (Verdict::Skipped, format!("{} skipped: {why}", step.name))
            }
            Ok(Err(e)) => (
                Verdict::Failed,
                format!("{} FAILED: {}", step.name, tiermem_bench::error_chain(&e)),
            ),
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| p.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                (
                    Verdict::Failed,
                    format!("{} FAILED: panicked: {msg}", step.name),
                )
            }
        };
        say!("{}", bold(&format!("=> {line}")));
        rows.push((step, result, took));
    }

    say!("\n{}", bold("== what ran =="));
    say!("{:<9} {:<8} {:>8}   next", "step", "result", "time");
    for (step, result, took) in &rows {
        let r = match result {
            Verdict::Ok => "ok",
            Verdict::Skipped => "skipped",
            Verdict::Failed => "FAILED",
        };
        say!(
            "{:<9} {:<8} {:>6.1} s   {}",
            step.name,
            r,
            took.as_secs_f64(),
            step.next
        );
    }
    let count = |f: fn(&Verdict) -> bool| rows.iter().filter(|r| f(&r.1)).count();
    let ok = count(|r| matches!(r, Verdict::Ok));
    let skipped = count(|r| matches!(r, Verdict::Skipped));
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| matches!(r.1, Verdict::Failed))
        .map(|r| r.0.name)
        .collect();
    let verdict = if failed.is_empty() {
        "every result above was checked"
    } else {
        "see the FAILED lines above"
    };
    say!(
        "\ntour finished in {:.1} s: {ok} ok, {skipped} skipped, {} failed; {verdict}. More: \
         `tiermem --help` and the docs/ directory of the repository.",
        start.elapsed().as_secs_f64(),
        failed.len()
    );
    if !failed.is_empty() {
        bail!("tour step(s) failed: {}", failed.join(", "));
    }
    Ok(())
}

fn doctor_step(_ctx: &Ctx) -> Result<Outcome> {
    let report = doctor::report(true);
    doctor::print(&report, false)?;
    Ok(Outcome::Ok(
        "the kernel features tiermem uses and this machine's fault/copy costs, listed above".into(),
    ))
}

/// A program on $PATH, or `None`.
fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|f| f.is_file())
}

/// True when `dir` is on a tmpfs (memory-backed: syncs cost nothing), or when that is unknown.
fn on_tmpfs(dir: &Path) -> bool {
    tiermem_media::on_tmpfs(dir).unwrap_or(true)
}

/// True when running as root (network namespaces, userfaultfd for everyone).
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Removes files or a directory tree when dropped, however a step ends.
struct RemoveOnDrop {
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

impl RemoveOnDrop {
    /// These files (missing ones are fine).
    fn files(files: &[&Path]) -> RemoveOnDrop {
        RemoveOnDrop {
            files: files.iter().map(|p| p.to_path_buf()).collect(),
            dirs: Vec::new(),
        }
    }

    /// This directory and everything in it.
    fn dir(dir: &Path) -> RemoveOnDrop {
        RemoveOnDrop {
            files: Vec::new(),
            dirs: vec![dir.to_path_buf()],
        }
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}
