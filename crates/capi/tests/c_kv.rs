//! Builds `examples/c/kv.c` (tiermem-kv inside a C program: both engines, RESP over a socket,
//! a restart of the durable engine, bad settings) against the generated `tiermem.h` and
//! `libtiermem.so`, runs it on tmpfs, and checks that it passes.

mod common;

#[test]
fn c_kv_builds_and_passes() {
    common::build_and_run(
        "kv",
        std::path::Path::new("/dev/shm"),
        "C kv: all checks passed",
    );
}
