//! Builds `examples/c/migrate.c` (FAM-aware post-copy through the C ABI: a forked child is the
//! source — checkpoint, dump and page-server on 127.0.0.1 —, the parent restores with its
//! address, verifies every byte and the blob, completes, restores again without a source;
//! argument errors) against the generated `tiermem.h` and `libtiermem.so`, runs it with a FAM
//! directory on tmpfs, and checks that it passes. Needs a C compiler (cc) and userfaultfd.

mod common;

#[test]
fn c_migrate_builds_and_passes() {
    let out = common::build_and_run(
        "migrate",
        std::path::Path::new("/dev/shm"),
        "C migrate: all checks passed",
    );
    print!("{out}");
}
