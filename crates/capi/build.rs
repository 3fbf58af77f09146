//! Generates `include/tiermem.h` from the C ABI with cbindgen, so the header never drifts from the
//! code. The header is committed (it is the C manual); the build rewrites it only when it changes.

use std::path::PathBuf;

fn main() {
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets this"));
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("crates/capi/cbindgen.toml is valid");
    let bindings = match cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
    {
        Ok(b) => b,
        Err(e) => {
            // A syntax error in src/ is reported by rustc with better context; don't fail here.
            println!("cargo:warning=cbindgen could not generate tiermem.h: {e}");
            return;
        }
    };
    let out = crate_dir.join("include").join("tiermem.h");
    std::fs::create_dir_all(out.parent().unwrap()).expect("create include/");
    // write_to_file only touches the file when the contents differ.
    bindings.write_to_file(&out);
}
