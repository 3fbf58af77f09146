//! Builds `examples/c/tour.c` against the generated `tiermem.h` and the freshly built
//! `libtiermem.so`, runs it, and checks that it passes. Needs a C compiler (cc) and root
//! (userfaultfd).

mod common;

#[test]
fn c_tour_builds_and_passes() {
    common::build_and_run("tour", &std::env::temp_dir(), "C tour: all checks passed");
}
