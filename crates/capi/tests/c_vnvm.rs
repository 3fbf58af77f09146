//! Builds `examples/c/vnvm.c` (vnvm through the C ABI: transactions, an abort, the allocator
//! and its root, release and re-init, bad tids, out-of-region writes, a faulting direct store)
//! against the generated `tiermem.h` and `libtiermem.so`, runs it on tmpfs, and checks that it
//! passes.

mod common;

#[test]
fn c_vnvm_builds_and_passes() {
    common::build_and_run(
        "vnvm",
        std::path::Path::new("/dev/shm"),
        "C vnvm: all checks passed",
    );
}
