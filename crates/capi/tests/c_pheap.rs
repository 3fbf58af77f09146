//! Builds `examples/c/pheap.c` (the persistent heap from C: named objects, nvh_ckall /
//! nvh_ckone, close, a child that writes without checkpointing and dies, reopen and check)
//! against the generated `tiermem.h` and `libtiermem.so`, runs it on tmpfs, and checks that it
//! passes.

mod common;

#[test]
fn c_pheap_builds_and_passes() {
    common::build_and_run(
        "pheap",
        std::path::Path::new("/dev/shm"),
        "C pheap: all checks passed",
    );
}
