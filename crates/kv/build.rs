//! Builds `csrc/ldfloat.c`: Redis's `long double` arithmetic of INCRBYFLOAT and HINCRBYFLOAT.

fn main() {
    println!("cargo:rerun-if-changed=csrc/ldfloat.c");
    cc::Build::new()
        .file("csrc/ldfloat.c")
        .warnings(true)
        .compile("tiermem_kv_ldfloat");
}
