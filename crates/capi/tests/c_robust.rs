//! Builds `tests/data/robust.c` against `tiermem.h` and `libtiermem.so` and runs it with
//! `TIERMEM_CAPI_TEST_PANIC` naming four exported functions: each returns its error value with
//! "internal error (panic) in NAME" as the last error instead of aborting the C program, and
//! NULL / closed / foreign handles, bad offsets and non-UTF-8 paths are errors (issue #13).

mod common;

#[test]
fn c_abi_contains_panics_and_rejects_bad_handles() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/robust.c");
    common::build_and_run_src(
        &src,
        "robust",
        std::path::Path::new("/dev/shm"),
        "C robust: all checks passed",
        &[(
            "TIERMEM_CAPI_TEST_PANIC",
            "nvh_open,nvh_malloc,nv_txbegin,tiermem_pool_size",
        )],
    );
}
