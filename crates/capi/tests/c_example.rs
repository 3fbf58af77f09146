//! Builds `examples/c/tour.c` against the generated `tiermem.h` and the freshly built
//! `libtiermem.so`, runs it, and checks that it passes. Needs a C compiler (cc) and root
//! (userfaultfd).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target directory holding this test binary's profile (…/target/<profile>).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // …/target/<profile>/deps/c_example-HASH
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

#[test]
fn c_tour_builds_and_passes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib_dir = profile_dir();
    let so = lib_dir.join("libtiermem.so");
    assert!(
        so.exists(),
        "{} is missing: cargo builds the cdylib alongside the tests (cargo test -p tiermem-capi)",
        so.display()
    );
    let out = std::env::temp_dir().join(format!("tiermem-c-tour-{}", std::process::id()));
    let cc = Command::new("cc")
        .args([
            "-std=c11",
            "-D_GNU_SOURCE",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-O1",
        ])
        .arg(root.join("examples/c/tour.c"))
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
        "compiling examples/c/tour.c failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let dir = std::env::temp_dir().join(format!("tiermem-c-pools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = Command::new(&out)
        .arg(&dir)
        .env("LD_LIBRARY_PATH", &lib_dir)
        .output()
        .expect("run the C tour");
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "C tour failed ({}):\n{}\n{}",
        run.status,
        stdout,
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("C tour: all checks passed"), "{stdout}");
}
