//! Running a command under one of the project's `LD_PRELOAD` libraries (`tiermem prefault run`,
//! `tiermem pager run`): finding the library (an override variable, else next to the `tiermem`
//! binary) and `exec`ing the command with it first in `LD_PRELOAD`, so the exit status is the
//! command's own.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// The library `file`: `$var` when set, else next to this executable. The error names the
/// cargo `package` that builds it.
pub fn find(file: &str, var: &str, package: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        let p = PathBuf::from(p);
        if !p.exists() {
            bail!("{var}={} does not exist", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("locating the tiermem executable")?;
    let p = exe.with_file_name(file);
    if !p.exists() {
        bail!(
            "{} is missing (build it with `cargo build --release -p {package}`, or set {var})",
            p.display()
        );
    }
    Ok(p)
}

/// Replaces this process with `cmd` (program and arguments) with `lib` prepended to
/// `LD_PRELOAD` and `env` set; returns only when the exec fails, by exiting 127 (not found) or
/// 126 (any other error), as a shell does.
pub fn exec(lib: &std::path::Path, cmd: &[OsString], env: &[(&str, String)]) -> ! {
    let mut preload = OsString::from(lib);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut c = std::process::Command::new(&cmd[0]);
    c.args(&cmd[1..]).env("LD_PRELOAD", preload);
    for (k, v) in env {
        c.env(k, v);
    }
    let e = c.exec();
    eprintln!(
        "tiermem: error: cannot run {}: {e}",
        cmd[0].to_string_lossy()
    );
    std::process::exit(if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    });
}
