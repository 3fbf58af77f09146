//! Shared by the C-example tests: build a program of `examples/c` against the generated
//! `tiermem.h` and the freshly built `libtiermem.so`, run it with a scratch directory, and check
//! its success line. Needs a C compiler (cc).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target directory holding this test binary's profile (…/target/<profile>).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // …/target/<profile>/deps/<test>-HASH
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// Compile `examples/c/<name>.c` with `-Wall -Wextra -Werror`, run it with a fresh scratch
/// directory under `scratch_root` as its argument, and assert that it exits 0 and prints
/// `marker`. Returns its stdout.
#[allow(dead_code)] // not every test binary including this module uses it
pub fn build_and_run(name: &str, scratch_root: &Path, marker: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    build_and_run_src(
        &root.join(format!("examples/c/{name}.c")),
        name,
        scratch_root,
        marker,
        &[],
    )
}

/// [`build_and_run`] for the C source `src`, run with the extra environment `env`.
#[allow(dead_code)] // not every test binary including this module uses it
pub fn build_and_run_src(
    src: &Path,
    name: &str,
    scratch_root: &Path,
    marker: &str,
    env: &[(&str, &str)],
) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib_dir = profile_dir();
    let so = lib_dir.join("libtiermem.so");
    assert!(
        so.exists(),
        "{} is missing: build it first with cargo build --release --workspace (scripts/test.sh does; a stale one fails to link new symbols)",
        so.display()
    );
    let tag = format!("tiermem-c-{name}-{}", std::process::id());
    let out = std::env::temp_dir().join(&tag);
    let cc = Command::new("cc")
        .args([
            "-std=c11",
            "-D_GNU_SOURCE",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-O1",
            "-pthread",
        ])
        .arg(src)
        .arg("-I")
        .arg(root.join("crates/capi/include"))
        .arg("-L")
        .arg(&lib_dir)
        .args(["-ltiermem", "-o"])
        .arg(&out)
        .output()
        .expect("run cc (install build-essential)");
    assert!(
        cc.status.success(),
        "compiling {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&cc.stderr)
    );
    let dir = scratch_root.join(format!("{tag}-dir"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Output to files and a deadline: a hung program (e.g. a dead worker) fails the test with
    // its output instead of blocking the suite.
    let (so_path, se_path) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = Command::new(&out)
        .arg(&dir)
        .env("LD_LIBRARY_PATH", &lib_dir)
        .envs(env.iter().copied())
        .stdout(std::fs::File::create(&so_path).unwrap())
        .stderr(std::fs::File::create(&se_path).unwrap())
        .spawn()
        .expect("run the C example");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the C example") {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&so_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&se_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_dir_all(&dir);
    let status = match status {
        Some(s) => s,
        None => panic!(
            "{} hung (killed after 120 s):\n{stdout}\n{stderr}",
            src.display()
        ),
    };
    assert!(
        status.success(),
        "{} failed ({status}):\n{stdout}\n{stderr}",
        src.display()
    );
    assert!(stdout.contains(marker), "{stdout}");
    stdout
}
