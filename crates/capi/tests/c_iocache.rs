//! Builds `examples/c/iocache.c` (the DBIO buffer pool from C: writes through an 8-frame pool,
//! page-cache hits on the way back, sync, a direct reopen that checks every byte, bad input)
//! against the generated `tiermem.h` and `libtiermem.so`, runs it on a block file system, and
//! checks that it passes.

mod common;

#[test]
fn c_iocache_builds_and_passes() {
    let out = common::build_and_run(
        "iocache",
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        "C iocache: all checks passed",
    );
    assert!(!out.contains("SKIPPED"), "{out}");
}
