//! Builds `examples/c/zread.c` (z-READ from C: zero-copy views, `tiermem_zread_into` with the
//! loss model off and on, a forked writer and a truncation under held views and buffers,
//! exclusive writes, bad input) against the generated `tiermem.h` and `libtiermem.so`, runs it
//! on a block file system (`/var/tmp`), and checks that it passes.

mod common;

#[test]
fn c_zread_builds_and_passes() {
    let out = common::build_and_run(
        "zread",
        std::path::Path::new("/var/tmp"),
        "C zread: all checks passed",
    );
    assert!(!out.contains("SKIPPED"), "{out}");
}
