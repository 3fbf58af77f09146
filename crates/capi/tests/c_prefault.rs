//! Builds `examples/c/prefault.c` (the prefault service from C: register, touch ascending while
//! the service populates ahead, the learned order, every byte checked, bad input refused, the
//! registration ended before munmap) against the generated `tiermem.h` and `libtiermem.so`,
//! runs it, and checks that it passes.

mod common;

#[test]
fn c_prefault_builds_and_passes() {
    common::build_and_run(
        "prefault",
        std::path::Path::new("/dev/shm"),
        "C prefault: all checks passed",
    );
}
