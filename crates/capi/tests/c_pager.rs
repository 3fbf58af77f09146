//! Builds `examples/c/pager.c` (the pager from C: a region four times the DRAM budget written
//! and read back through the NVM buffer and a swap file, a bound, bad input) against the
//! generated `tiermem.h` and `libtiermem.so`, runs it with a scratch directory on the target
//! disk, and checks that it passes.

mod common;

#[test]
fn c_pager_builds_and_passes() {
    let out = common::build_and_run(
        "pager",
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        "C pager: all checks passed",
    );
    assert!(out.contains("page-outs to the buffer"), "{out}");
}
