//! Builds `examples/c/snapshot.c` (snapshots from C: a snapshot taken while a writer thread
//! writes, the file against the pause's image, the application state, memory that cannot be
//! freed mid-snapshot, a damaged file refused naming its check, bad arguments) against the
//! generated `tiermem.h` and `libtiermem.so`, runs it, and checks that it passes.

mod common;

#[test]
fn c_snapshot_builds_and_passes() {
    common::build_and_run(
        "snapshot",
        std::path::Path::new("/tmp"),
        "C snapshot: all checks passed",
    );
}
